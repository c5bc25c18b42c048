"""Shamir sharing: any t shares reconstruct, fewer reveal nothing, linearity, floats and bytes."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedhet.crypto import shamir
from fedhet.crypto.field import F61, P61, PrimeField
from fedhet.crypto.fixedpoint import FixedPoint
from fedhet.crypto.prg import PRG
from fedhet.crypto.shamir import (lagrange_coefficients, reconstruct, reconstruct_bytes, reconstruct_float,
                                  share, share_at, share_bytes, share_float)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

ALPHA = 1e-4


def prg(i: int = 0) -> PRG:
    return PRG(i.to_bytes(32, "little"))


@st.composite
def sharing_case(draw):
    n = draw(st.integers(1, 8))
    t = draw(st.integers(1, n))
    k = draw(st.integers(t, n))
    subset = draw(st.permutations(range(1, n + 1)))[:k]
    shape = draw(st.sampled_from([(), (1,), (7,), (3, 4)]))
    seed = draw(st.integers(0, 2**32))
    return n, t, subset, shape, seed


@settings(max_examples=150, deadline=None)
@given(sharing_case())
def test_any_t_of_n_shares_reconstruct(case):
    n, t, subset, shape, seed = case
    secret = F61.random(shape, prg(seed))
    sh = share(secret, n, t, prg(seed + 1))
    assert sh.shape == (n, *shape) and sh.dtype == np.uint64 and int(sh.max(initial=0)) < P61
    rows = np.stack([sh[x - 1] for x in subset])
    assert np.array_equal(reconstruct(rows, subset), secret)
    assert np.array_equal(reconstruct(rows, subset, t=t), secret)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 7), st.integers(0, 2**32))
def test_shares_lie_on_one_polynomial_of_degree_below_t(n, seed):
    # Interpolating any t shares predicts every other share: the degree is < t,
    # and f(0) is the secret (checked by interpolating at 0).
    t = max(1, n - 2)
    secret = F61.random(50, prg(seed))
    sh = share(secret, n, t, prg(seed + 7))
    base = list(range(1, t + 1))
    for x in range(1, n + 1):
        lam = lagrange_coefficients(base, at=x)
        pred = F61.zeros(50)
        for li, xi in zip(lam, base):
            pred = F61.add(pred, F61.mul(sh[xi - 1], li))
        assert np.array_equal(pred, sh[x - 1])


def test_lagrange_coefficients_match_plain_formula():
    xs = [2, 5, 7]
    lam = lagrange_coefficients(xs)
    for i, xi in enumerate(xs):
        num = den = 1
        for xj in xs:
            if xj != xi:
                num, den = num * -xj, den * (xi - xj)
        assert lam[i] * den % P61 == num % P61


def test_large_array_crosses_chunks():
    N = 3 * shamir._CHUNK + 5
    secret = F61.random(N, prg(1))
    sh = share(secret, 5, 3, prg(2))
    assert np.array_equal(reconstruct(sh[[4, 0, 2]], [5, 1, 3]), secret)
    out = np.empty_like(sh)
    again = share(secret, 5, 3, prg(2), out=out)
    assert again is not None and np.array_equal(out, sh)


class FixedRandomness:
    """Stands in for the PRG: hands share() the given polynomial randomness."""

    def __init__(self, values: np.ndarray):
        self.values = values

    def fill_mod(self, out, modulus):
        assert out.shape == self.values.shape
        out[...] = self.values


@pytest.mark.parametrize("p,n,t", [(7, 5, 3), (11, 6, 4), (5, 4, 2), (13, 3, 3)])
def test_fewer_than_t_shares_are_exactly_uniform_for_every_secret(p, n, t):
    # Exhaustive: run share() over *all* p**(t-1) values of its randomness.
    # For every secret and every set of t-1 parties, each tuple of share values
    # occurs exactly once, so the view of t-1 parties is the same uniform
    # distribution whatever the secret is.
    field = PrimeField(p)
    combos = np.array(list(itertools.product(range(p), repeat=t - 1)), dtype=np.uint64).T.copy()
    m = combos.shape[1]
    assert m <= shamir._CHUNK
    for s in range(p):
        secret = np.full(m, s, dtype=np.uint64)
        sh = share(secret, n, t, FixedRandomness(combos), field=field)
        for subset in itertools.combinations(range(n), t - 1):
            code = np.zeros(m, dtype=np.int64)
            for i in subset:
                code = code * p + sh[i].astype(np.int64)
            assert np.array_equal(np.sort(code), np.arange(m)), (s, subset)
        # ...while t shares determine the secret.
        assert np.all(reconstruct(sh[:t], list(range(1, t + 1)), field=field) == s)


def _pair_histogram(field, secret_value, n, t, parties, count, seed):
    p = field.p
    sh = share(np.full(count, secret_value, dtype=np.uint64), n, t, prg(seed), field=field)
    code = sh[parties[0]].astype(np.int64) * p + sh[parties[1]].astype(np.int64)
    return np.bincount(code, minlength=p * p)


def test_t_minus_one_shares_look_the_same_for_two_secrets_statistically():
    # Real PRG path in GF(11), t = 3: the joint histogram of two parties' shares
    # is uniform and does not depend on the secret (0 vs 7).
    field = PrimeField(11)
    h0 = _pair_histogram(field, 0, 5, 3, (1, 4), 30_000, 10)
    h1 = _pair_histogram(field, 7, 5, 3, (1, 4), 30_000, 11)
    assert stats.chisquare(h0).pvalue > ALPHA
    assert stats.chisquare(h1).pvalue > ALPHA
    assert stats.chi2_contingency(np.stack([h0, h1])).pvalue > ALPHA


def test_the_statistic_does_detect_a_leak():
    # Control: with t = 2 two shares reveal the secret and the same test fails.
    field = PrimeField(11)
    h0 = _pair_histogram(field, 0, 5, 2, (1, 4), 30_000, 10)
    h1 = _pair_histogram(field, 7, 5, 2, (1, 4), 30_000, 11)
    assert stats.chi2_contingency(np.stack([h0 + 1, h1 + 1])).pvalue < ALPHA


def test_seeded_sharing_is_deterministic():
    secret = F61.random(100, prg(3))
    assert np.array_equal(share(secret, 5, 3, prg(4)), share(secret, 5, 3, prg(4)))
    assert not np.array_equal(share(secret, 5, 3, prg(4)), share(secret, 5, 3, prg(5)))
    # Default randomness is fresh each call.
    assert not np.array_equal(share(secret, 5, 3), share(secret, 5, 3))


def test_t_equals_one_and_t_equals_n():
    secret = F61.random(10, prg(0))
    sh1 = share(secret, 4, 1)
    assert all(np.array_equal(row, secret) for row in sh1)
    shn = share(secret, 4, 4, prg(1))
    assert np.array_equal(reconstruct(shn, [1, 2, 3, 4]), secret)
    # n - 1 shares of an n-of-n sharing give something else.
    assert not np.array_equal(reconstruct(shn[:3], [1, 2, 3]), secret)


def test_linearity_sum_and_public_matrix():
    x = F61.random((6, 4), prg(1))
    y = F61.random((6, 4), prg(2))
    w = F61.random((4, 3), prg(3))
    sx, sy = share(x, 5, 3, prg(4)), share(y, 5, 3, prg(5))
    summed = np.stack([F61.add(a, b) for a, b in zip(sx, sy)])
    assert np.array_equal(reconstruct(summed[[0, 1, 4]], [1, 2, 5]), F61.add(x, y))
    # Each holder multiplies its own share by the public matrix.
    prod = np.stack([F61.matmul(s, w) for s in sx])
    assert np.array_equal(reconstruct(prod[[2, 3, 4]], [3, 4, 5]), F61.matmul(x, w))


def test_float_sharing_and_public_fixedpoint_matrix():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 5)) * 100
    codec = FixedPoint(frac_bits=20)
    sh = share_float(x, 4, 2, codec=codec, prg=prg(1))
    back = reconstruct_float(sh[[3, 1]], [4, 2], codec=codec)
    assert np.all(np.abs(back - x) <= 2.0**-21)
    w = rng.normal(size=(5, 2))
    prod = np.stack([F61.matmul(s, codec.encode(w)) for s in sh])
    y = reconstruct_float(prod[:2], [1, 2], codec=codec, frac_bits=40)
    assert np.allclose(y, x @ w, atol=1e-3)
    with pytest.raises(ValueError, match="representable range"):
        share_float([1e300], 3, 2)


def test_bytes_sharing_of_a_seed():
    seed = bytes(range(200, 232))
    sh = share_bytes(seed, 5, 3, prg(9))
    assert sh.shape == (5, 5)  # 32 bytes at 7 bytes per element
    for subset in itertools.combinations(range(1, 6), 3):
        assert reconstruct_bytes(sh[[x - 1 for x in subset]], subset, 32) == seed
    # Two shares give garbage, which the decoder notices (with overwhelming probability).
    with pytest.raises(ValueError):
        reconstruct_bytes(sh[:2], [1, 2], 32)


def test_bad_inputs_are_named():
    secret = F61.random(5, prg(0))
    with pytest.raises(ValueError, match="1 <= t <= n"):
        share(secret, 3, 4)
    with pytest.raises(ValueError, match="1 <= t <= n"):
        share(secret, 3, 0)
    with pytest.raises(ValueError, match="too small"):
        share(np.zeros(2, dtype=np.uint64), 7, 2, field=PrimeField(7))
    with pytest.raises(ValueError, match="secret: value"):
        share(np.array([P61], dtype=np.uint64), 3, 2)
    with pytest.raises(TypeError, match="integer array"):
        share(np.array([0.5]), 3, 2)
    sh = share(secret, 5, 3, prg(1))
    with pytest.raises(ValueError, match="distinct"):
        reconstruct(sh[:3], [1, 1, 2])
    with pytest.raises(ValueError, match=r"\[1, p\)"):
        reconstruct(sh[:3], [0, 1, 2])
    with pytest.raises(ValueError, match="3 shares for 2 points"):
        reconstruct(sh[:3], [1, 2])
    with pytest.raises(ValueError, match="at least t=3"):
        reconstruct(sh[:2], [1, 2], t=3)
    bad = sh[:3].copy()
    bad[0, 0] = P61
    with pytest.raises(ValueError, match="shares: value"):
        reconstruct(bad, [1, 2, 3])
    with pytest.raises(ValueError, match="out must be"):
        share(secret, 5, 3, out=np.empty((4, 5), dtype=np.uint64))
    with pytest.raises(ValueError, match="modulus"):
        share_float([1.0], 3, 2, codec=FixedPoint(modulus=2**32))


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 8, 9, 13])
def test_interpolation_matches_python_ints_at_the_limb_bounds(k):
    # reconstruct() is sum_i l_i y_i mod p for any values y (consistent or not):
    # compare with Python ints on values at the edges of its 31-bit limbs and
    # its reduction, with more shares than one group of four.
    extremes = [0, 1, P61 - 1, P61 - 2, (1 << 31) - 1, 1 << 31, P61 - (1 << 31), 1 << 60, (1 << 30) - 1]
    rng = np.random.default_rng(k)
    pts = [int(x) for x in rng.choice(np.arange(1, 5000), size=k, replace=False)]
    vals = np.array(extremes * 3 + [int(v) for v in F61.random(20, prg(k))], dtype=np.uint64)
    rows = np.stack([rng.permutation(vals) for _ in range(k)])
    rows[:, 0] = P61 - 1
    lam = lagrange_coefficients(pts)
    want = [sum(int(li) * int(v) for li, v in zip(lam, rows[:, j])) % P61 for j in range(rows.shape[1])]
    assert [int(v) for v in reconstruct(rows, pts)] == want
    big = np.tile(rows, (1, shamir._RCHUNK // rows.shape[1] + 2))  # several chunks, a ragged last one
    assert np.array_equal(reconstruct(big, pts), np.tile(reconstruct(rows, pts), shamir._RCHUNK // rows.shape[1] + 2))


def test_out_of_range_share_in_a_later_chunk_is_named():
    sh = share(F61.random(3 * shamir._RCHUNK, prg(0)), 5, 3, prg(1))
    bad = sh[:3].copy()
    bad[1, -1] = P61 + 5
    with pytest.raises(ValueError, match=f"shares: value {P61 + 5} is not a field element"):
        reconstruct(bad, [1, 2, 3])
    with pytest.raises(ValueError, match="secret: value"):
        share(np.concatenate([F61.random(2 * shamir._CHUNK, prg(2)), np.array([P61], dtype=np.uint64)]), 5, 3)


@pytest.mark.parametrize("n,t,xs", [(50, 6, [1, 7, 50]), (1000, 50, [3, 512, 999, 1000]), (9, 1, [2, 9]),
                                    (4, 4, [1, 2, 3, 4])])
def test_shares_at_chosen_points_are_the_full_sharings_rows(n, t, xs):
    """share_at (a SecAgg+ client's k + 1 holders of n) computes exactly the rows share() would, from the
    same randomness, and any t of them reconstruct the secret."""
    s = F61.asarray(np.arange(40, dtype=np.uint64) * 977, "s")
    full = share(s, n, t, PRG(b"\x05" * 32))
    at = share_at(s, xs, t, PRG(b"\x05" * 32))
    assert at.shape == (len(xs), s.size)
    assert np.array_equal(at, full[[x - 1 for x in xs]])
    if len(xs) >= t:
        assert np.array_equal(reconstruct(at[:t], xs[:t]), s)
    other = share_at(s, xs, t)  # fresh randomness: other rows (unless t = 1), the same secret
    assert t == 1 or not np.array_equal(other, at)


def test_shares_at_chosen_points_cross_chunks_and_check_their_points():
    s = F61.asarray(np.arange((1 << 15) + 11, dtype=np.uint64), "s")
    assert np.array_equal(share_at(s, [2, 30], 5, PRG(b"\x07" * 32)), share(s, 30, 5, PRG(b"\x07" * 32))[[1, 29]])
    with pytest.raises(ValueError, match="distinct"):
        share_at(s[:4], [3, 3], 2)
    with pytest.raises(ValueError, match="at least one"):
        share_at(s[:4], [], 2)
