"""Prime-field arithmetic against Python integers, and fixed-point encoding."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedhet.crypto.field import F61, P61, PrimeField, is_prime
from fedhet.crypto.fixedpoint import FixedPoint, decode, encode
from fedhet.crypto.prg import PRG

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

P = P61
elems = st.integers(0, P - 1)
# Values near the top and bottom of the field exercise the carries.
edge = st.sampled_from([0, 1, 2, P - 1, P - 2, (1 << 32) - 1, 1 << 32, (1 << 60), (1 << 61) - 2, P // 2, P // 2 + 1])
field_vals = st.one_of(elems, edge)
pairs = st.lists(st.tuples(field_vals, field_vals), min_size=1, max_size=60)


def arr(xs):
    return np.array(xs, dtype=np.uint64)


def ints(a):
    return [int(v) for v in np.asarray(a).ravel()]


@settings(max_examples=200, deadline=None)
@given(pairs)
def test_ops_match_python_ints(ps):
    a, b = arr([x for x, _ in ps]), arr([y for _, y in ps])
    assert ints(F61.add(a, b)) == [(x + y) % P for x, y in ps]
    assert ints(F61.sub(a, b)) == [(x - y) % P for x, y in ps]
    assert ints(F61.neg(a)) == [(-x) % P for x, _ in ps]
    assert ints(F61.mul(a, b)) == [x * y % P for x, y in ps]


@settings(max_examples=50, deadline=None)
@given(st.lists(field_vals, min_size=1, max_size=20), st.integers(0, 200))
def test_pow_and_rotation(xs, k):
    a = arr(xs)
    assert ints(F61.pow(a, 5)) == [pow(x, 5, P) for x in xs]
    assert ints(F61.pow(a, 0)) == [1] * len(xs)
    assert ints(F61.mul_pow2(a, k)) == [x * pow(2, k, P) % P for x in xs]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, P - 1), min_size=1, max_size=20))
def test_inverse(xs):
    a = arr(xs)
    inv = F61.inv(a)
    assert ints(inv) == [pow(x, -1, P) for x in xs]
    assert ints(F61.mul(a, inv)) == [1] * len(xs)


def test_scalar_operands():
    x = P - 3
    assert int(F61.add(x, 5)) == (x + 5) % P
    assert int(F61.sub(2, x)) == (2 - x) % P
    assert int(F61.mul(x, x)) == x * x % P
    assert int(F61.neg(0)) == 0
    assert ints(F61.mul(arr([x, 2]), x)) == [x * x % P, 2 * x % P]
    assert int(F61.inv(np.uint64(x))) == pow(x, -1, P)


def test_inverse_of_zero_raises():
    with pytest.raises(ValueError, match="zero has no inverse"):
        F61.inv(arr([3, 0]))


def test_outputs_are_canonical_even_for_worst_cases():
    a = arr([P - 1] * 4 + [0] * 4)
    b = arr([P - 1, 1, 0, P - 1, 0, P - 1, 1, 0])
    for r in (F61.add(a, b), F61.sub(a, b), F61.mul(a, b), F61.neg(b)):
        assert r.dtype == np.uint64 and int(r.max()) < P


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.integers(1, 5), st.integers(0, 2**32))
def test_matmul_matches_python_ints(m, k, n, seed):
    prg = PRG(seed.to_bytes(32, "little"))
    a, b = F61.random((m, k), prg), F61.random((k, n), prg)
    a[0, 0] = P - 1
    b[0, 0] = P - 1  # the largest limbs everywhere in one product
    got = F61.matmul(a, b)
    ref = [[sum(int(a[i, j]) * int(b[j, c]) for j in range(k)) % P for c in range(n)] for i in range(m)]
    assert got.tolist() == ref
    # batch leading dims and vector right-hand side
    batch = F61.random((2, 3, k), prg)
    assert np.array_equal(F61.matmul(batch, b), F61.matmul(batch.reshape(6, k), b).reshape(2, 3, n))
    assert np.array_equal(F61.matmul(a, b[:, 0]), got[:, 0])


def test_matmul_long_inner_dimension_is_exact():
    # K above the 2**17 block size: limb sums would exceed 2**53 without blocking.
    K = (1 << 17) + 5
    a = np.full((1, K), P - 1, dtype=np.uint64)
    b = np.full((K, 1), P - 1, dtype=np.uint64)
    assert int(F61.matmul(a, b)[0, 0]) == K * (P - 1) ** 2 % P


def test_matmul_shape_errors():
    with pytest.raises(ValueError, match="shape mismatch"):
        F61.matmul(F61.zeros((2, 3)), F61.zeros((4, 1)))


def test_sum_matches_python():
    prg = PRG(bytes(32))
    a = F61.random((50, 7), prg)
    a[:, 0] = P - 1
    assert ints(F61.sum(a, axis=0)) == [sum(int(v) for v in a[:, j]) % P for j in range(7)]
    assert int(F61.sum(a)) == sum(ints(a)) % P


def test_from_int_and_signed():
    xs = [-1, -P, 0, 5, P, P + 3, -(2**100), 2**100]
    assert ints(F61.from_int(np.array(xs, dtype=object))) == [x % P for x in xs]
    assert ints(F61.from_int(np.array([-3, 4], dtype=np.int32))) == [P - 3, 4]
    assert ints(F61.from_int(np.array([2**64 - 1], dtype=np.uint64))) == [(2**64 - 1) % P]
    assert int(F61.from_int(-7)) == P - 7
    assert ints(F61.to_signed(arr([0, 1, P - 1, P // 2, P // 2 + 1]))) == [0, 1, -1, P // 2, -(P // 2)]
    with pytest.raises(TypeError, match="fixedpoint"):
        F61.from_int(np.array([1.5]))
    with pytest.raises(TypeError):
        F61.add(np.array([True]), 1)


def test_asarray_rejects_non_elements():
    with pytest.raises(ValueError, match=f"shares: value {P} is not a field element"):
        F61.asarray(arr([1, P]), "shares")
    with pytest.raises(ValueError, match="-1"):
        F61.asarray(np.array([-1, 2]), "x")
    with pytest.raises(TypeError, match="integer array"):
        F61.asarray(np.array([0.5]))
    assert F61.asarray(np.array([1, 2], dtype=np.int8)).dtype == np.uint64


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=0, max_size=80))
def test_bytes_roundtrip(data):
    el = F61.bytes_to_elements(data)
    assert el.size == math.ceil(len(data) / 7) and int(el.max(initial=0)) < P
    assert F61.elements_to_bytes(el, len(data)) == data


def test_bytes_decoding_rejects_garbage():
    el = F61.bytes_to_elements(b"x" * 32)
    el[0] = P - 1  # more than 56 bits
    with pytest.raises(ValueError, match="too large"):
        F61.elements_to_bytes(el, 32)
    with pytest.raises(ValueError, match="cannot hold"):
        F61.elements_to_bytes(F61.bytes_to_elements(b"x" * 32), 40)


def test_small_prime_field():
    f = PrimeField(13)
    a, b = np.arange(13, dtype=np.uint64), np.arange(13, dtype=np.uint64)[::-1].copy()
    assert ints(f.mul(a, b)) == [x * y % 13 for x, y in zip(range(13), range(12, -1, -1))]
    assert ints(f.sub(a, b)) == [(x - y) % 13 for x, y in zip(range(13), range(12, -1, -1))]
    assert ints(f.inv(a[1:])) == [pow(x, -1, 13) for x in range(1, 13)]
    m = f.random((3, 4), PRG(bytes(32)))
    w = f.random((4, 2), PRG(bytes(32), 1))
    assert f.matmul(m, w).tolist() == (m.astype(np.int64) @ w.astype(np.int64) % 13).tolist()
    big = PrimeField((1 << 32) - 5)
    x = arr([(1 << 32) - 6, 123456789])
    assert ints(big.mul(x, x)) == [v * v % ((1 << 32) - 5) for v in ints(x)]


def test_field_modulus_validation():
    with pytest.raises(ValueError, match="not prime"):
        PrimeField(15)
    with pytest.raises(ValueError, match="2\\*\\*61 - 1 or a prime below 2\\*\\*32"):
        PrimeField((1 << 61) + 15)
    assert is_prime(P) and is_prime((1 << 64) - 59) and not is_prime((1 << 64) - 1)


# -- fixed point -----------------------------------------------------------------
floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(floats, min_size=1, max_size=50), st.sampled_from([0, 8, 16, 24, 30]))
def test_fixedpoint_roundtrip_within_half_step(xs, f):
    codec = FixedPoint(frac_bits=f)
    x = np.array(xs)
    enc = codec.encode(x)
    assert enc.dtype == np.uint64 and int(enc.max()) < P
    assert np.all(np.abs(codec.decode(enc) - x) <= 2.0 ** -(f + 1))


def test_negative_values_are_p_minus_magnitude():
    codec = FixedPoint(frac_bits=4)
    assert ints(codec.encode([-1.0, 1.0, -0.0625, 0.0])) == [P - 16, 16, P - 1, 0]
    assert ints(encode([-2.5], frac_bits=1)) == [P - 5]
    assert decode(arr([P - 5]), frac_bits=1).tolist() == [-2.5]


def test_fixedpoint_range_is_enforced_not_wrapped():
    codec = FixedPoint(frac_bits=16)
    top = (2**60 - 1) / 2**16
    assert math.isclose(codec.max_abs, top, rel_tol=1e-15)
    ok = np.array([codec.max_abs, -codec.max_abs])
    assert np.allclose(codec.decode(codec.encode(ok)), ok, rtol=1e-15)
    for bad in ([2.0**44], [-(2.0**44)], [1.0, 2.0**45]):
        with pytest.raises(ValueError, match="outside the representable range"):
            codec.encode(bad)
    with pytest.raises(ValueError, match="NaN or inf"):
        codec.encode([0.0, np.nan])
    with pytest.raises(ValueError, match="NaN or inf"):
        codec.encode([np.inf])
    with pytest.raises(ValueError, match="must be in"):
        codec.decode(arr([P]))


@pytest.mark.parametrize("bits", [32, 64])
def test_ring_encodings_and_summand_headroom(bits):
    n = 10
    codec = FixedPoint(frac_bits=12, modulus=1 << bits, summands=n)
    # Stay where float64 sums are exact to the grid; the range limit is checked below.
    span = min(codec.max_abs, 1000.0)
    x = PRG(bytes(32)).uint32((n, 100)).astype(np.float64) / 2**32 * 2 * span - span
    enc = codec.encode(x)
    assert enc.dtype == (np.uint32 if bits == 32 else np.uint64)
    # Sum of n encodings in the ring (wrapping arithmetic) decodes to the true sum.
    total = enc.sum(axis=0, dtype=enc.dtype)
    assert np.all(np.abs(codec.decode(total) - x.sum(axis=0)) <= n * 2.0**-13)
    assert np.all(codec.decode(codec.encode([-1.0])) == [-1.0])
    with pytest.raises(ValueError, match="outside the representable range"):
        codec.encode([codec.max_abs * 1.01])
    if bits == 32:
        assert math.isclose(codec.max_abs, (2**31 - 1) // n / 2**12)


def test_field_sum_of_encodings_with_summands():
    codec = FixedPoint(frac_bits=16, summands=4)
    x = np.array([[codec.max_abs, -codec.max_abs, 1.5]] * 4)
    s = F61.sum(codec.encode(x), axis=0)
    assert np.allclose(codec.decode(s), x.sum(axis=0), rtol=1e-12)


def test_product_with_public_fixedpoint_matrix_decodes_with_double_frac_bits():
    f = 16
    codec = FixedPoint(frac_bits=f)
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(5, 4)), rng.normal(size=(4, 3))
    prod = F61.matmul(codec.encode(x), codec.encode(w))
    err = np.abs(codec.decode(prod, frac_bits=2 * f) - x @ w)
    assert err.max() < 4 * 2.0 ** -f * (np.abs(x).max() + np.abs(w).max())


def test_fixedpoint_argument_errors():
    with pytest.raises(ValueError, match="odd prime"):
        FixedPoint(modulus=100)
    with pytest.raises(ValueError, match="frac_bits"):
        FixedPoint(frac_bits=-1)
    with pytest.raises(TypeError, match="real numeric"):
        FixedPoint().encode(np.array(["a"]))


def test_fixed_point_handles_zero_dimensional_values():
    from fedhet.crypto.fixedpoint import FixedPoint
    for ring in (2**61 - 1, 2**32, 2**64):
        fp = FixedPoint(frac_bits=8, modulus=ring)
        e = fp.encode(np.full((), -1.5))
        assert e.shape == () and fp.decode(e).shape == () and float(fp.decode(e)) == -1.5
