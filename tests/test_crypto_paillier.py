"""Paillier wrapper: fixed point, packing, headroom checks, workers, pool, wire format.

The fixed point is crypto.fixedpoint's exact integer encoder (quantize / dequantize), tested here first.

Keys are 1024 bits (512 for the hypothesis sweeps) for speed; the library default is 2048.
"""

from fractions import Fraction

import gmpy2
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedhet.crypto.paillier import (
    DEFAULT_KEY_BITS,
    UNPACKED,
    EncryptedArray,
    ObfuscatorPool,
    PackingOverflowError,
    PackingSpec,
    PaillierContext,
    ciphertexts_from_bytes,
    ciphertexts_to_bytes,
    generate_keypair,
    packed_matmul,
    public_key_from_bytes,
    public_key_to_bytes,
)
from fedhet.crypto.fixedpoint import dequantize, quantize
from fedhet.crypto.paillier_keys import key_view, obfuscator

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def err(frac_bits):
    return 2.0 ** -(frac_bits + 1)


@pytest.fixture(scope="module")
def ctx():
    c = PaillierContext.generate(1024)
    yield c
    c.close()


@pytest.fixture(scope="module")
def small_ctx():
    c = PaillierContext.generate(512)
    yield c
    c.close()


@settings(max_examples=200, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30),
       f=st.integers(0, 70))
def test_quantize_is_exact_round_half_even(x, f):
    """round(x * 2**f) exactly (ties to even), as Python ints of any size, like the packed slots."""
    (got,) = quantize(np.array([x]), f)
    assert type(got) is int and got == round(Fraction(x) * 2 ** f)


def test_quantize_ties_and_errors():
    assert quantize(np.array([0.5, 1.5, 2.5, -0.5, -2.5]), 0).tolist() == [0, 2, 2, 0, -2]
    assert quantize(np.array([[2.0 ** 70]]), 16).tolist() == [[2 ** 86]]
    with pytest.raises(ValueError, match="W: contains NaN"):
        quantize(np.array([1.0, np.nan]), 16, "W")
    with pytest.raises(OverflowError, match="overflows"):
        quantize(np.array([1e308]), 40)


@settings(max_examples=100, deadline=None)
@given(v=st.integers(-2 ** 300, 2 ** 300), f=st.integers(0, 120))
def test_dequantize_is_the_correctly_rounded_quotient(v, f):
    (got,) = dequantize(np.array([v], dtype=object), f)
    assert got == float(Fraction(v, 2 ** f))


def test_default_key_length_is_2048():
    assert DEFAULT_KEY_BITS == 2048
    assert PaillierContext.generate.__defaults__[0] == 2048
    assert generate_keypair.__defaults__[0] == 2048


def test_spec_validation():
    with pytest.raises(ValueError, match="headroom"):
        PackingSpec(frac_bits=16, int_bits=8, slot_bits=25)
    with pytest.raises(ValueError, match="frac_bits"):
        PackingSpec(frac_bits=-1)
    with pytest.raises(ValueError, match="> 62"):
        PackingSpec(frac_bits=40, int_bits=30, slot_bits=128)
    with pytest.raises(ValueError, match="does not fit"):
        PackingSpec(slot_bits=600).layout(512)
    spec = PackingSpec(frac_bits=16, int_bits=8, slot_bits=64)
    assert spec.layout(2048) == (64, 31)
    assert spec.headroom_bits(2048) == 39
    assert UNPACKED.layout(1024) == (1023, 1)


def test_encryption_is_standard_paillier(ctx):
    """Same r, same plaintext -> same ciphertext as phe's raw_encrypt; phe decrypts ours."""
    pk, sk = ctx.public_key, ctx.private_key
    x = np.array([1.25, -3.5, 0.0])
    enc = ctx.encrypt(x, UNPACKED)
    for c, v in zip(enc.ciphertexts.ravel(), x):
        m = sk.raw_decrypt(int(c))
        assert m == int(round(v * 2 ** 16)) % pk.n
    r = 123456789
    k = key_view(pk.n)
    assert int(obfuscator(k, gmpy2.mpz(r))) == pow(r, pk.n, pk.n ** 2)
    m = 987654321
    mine = (1 + m * pk.n) * pow(r, pk.n, pk.n ** 2) % pk.n ** 2
    assert mine == pk.raw_encrypt(m, r_value=r)


def test_crt_obfuscator_matches_public_formula(ctx):
    pk, sk = ctx.public_key, ctx.private_key
    kpub, kpriv = key_view(pk.n), key_view(pk.n, sk.p, sk.q)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = gmpy2.mpz(int(rng.integers(2, 2 ** 62)) * int(rng.integers(2, 2 ** 62)) + 1)
        assert obfuscator(kpriv, x) == obfuscator(kpub, x)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    x=arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(0, 40)),
             elements=st.floats(-255.9, 255.9, allow_nan=False)),
    slot_bits=st.sampled_from([None, "tightest", 40, 64, 100]),
    frac_bits=st.integers(0, 16),
)
def test_roundtrip_hypothesis(small_ctx, x, slot_bits, frac_bits):
    if slot_bits == "tightest":  # one bit of headroom
        slot_bits = 8 + frac_bits + 2
    spec = PackingSpec(frac_bits=frac_bits, int_bits=8, slot_bits=slot_bits)
    enc = small_ctx.encrypt(x, spec)
    out = small_ctx.decrypt(enc)
    assert out.shape == x.shape
    assert np.all(np.abs(out - x) <= err(frac_bits))
    # 1-D arrays too
    out1 = small_ctx.decrypt(small_ctx.encrypt(x[0], spec))
    assert out1.shape == x[0].shape and np.all(np.abs(out1 - x[0]) <= err(frac_bits))


def test_packing_saves_ciphertexts(ctx):
    x = np.linspace(-1, 1, 100)
    enc = ctx.encrypt(x, PackingSpec(slot_bits=64))
    assert enc.slots == (1024 - 2) // 64 == 15
    assert enc.n_ciphertexts == 7
    assert ctx.encrypt(x, UNPACKED).n_ciphertexts == 100


def test_encrypt_rejects_bad_input(ctx):
    spec = PackingSpec(frac_bits=8, int_bits=4, slot_bits=32)
    with pytest.raises(ValueError, match="2\\*\\*int_bits"):
        ctx.encrypt(np.array([1.0, 16.0]), spec)
    with pytest.raises(ValueError, match="NaN"):
        ctx.encrypt(np.array([1.0, np.nan]), spec)
    with pytest.raises(ValueError, match="1-D or 2-D"):
        ctx.encrypt(np.zeros((2, 2, 2)), spec)
    with pytest.raises(ValueError, match="no private key"):
        ctx.public().decrypt(ctx.encrypt(np.ones(3), spec))


def test_packed_add_sub_neg_plain(ctx):
    rng = np.random.default_rng(2)
    spec = PackingSpec(frac_bits=16, int_bits=6, slot_bits=48)
    a, b = rng.uniform(-60, 60, (3, 37)), rng.uniform(-60, 60, (3, 37))
    c = rng.uniform(-10, 10, 37)  # broadcast over rows
    ea, eb = ctx.encrypt(a, spec), ctx.encrypt(b, spec)
    assert np.all(np.abs(ctx.decrypt(ea + eb) - (a + b)) <= 2 * err(16))
    assert np.all(np.abs(ctx.decrypt(ea - eb) - (a - b)) <= 2 * err(16))
    assert np.all(np.abs(ctx.decrypt(-ea) + a) <= err(16))
    assert np.all(np.abs(ctx.decrypt(ea + c) - (a + c)) <= 2 * err(16))
    assert np.all(np.abs(ctx.decrypt(c - ea) - (c - a)) <= 2 * err(16))
    total = sum([ea, eb, ea])
    assert np.all(np.abs(ctx.decrypt(total) - (2 * a + b)) <= 3 * err(16))


def test_packed_scalar_mult(ctx):
    rng = np.random.default_rng(3)
    spec = PackingSpec(frac_bits=12, int_bits=6, slot_bits=56)
    x = rng.uniform(-63, 63, 50)
    ex = ctx.encrypt(x, spec)
    for w in [2.75, -1.3, 0.0, -0.001]:
        out = ctx.decrypt(ex * w)
        wq = np.round(w * 2 ** 16) / 2 ** 16
        # error: rounding of x (times |w|) plus rounding of w (times |x|)
        assert np.all(np.abs(out - x * w) <= abs(wq) * err(12) + np.abs(x) * err(16) + 1e-12)
    for w in [3, -7, np.int64(-2)]:  # ints are exact
        assert np.all(np.abs(ctx.decrypt(ex * w) - x * int(w)) <= abs(int(w)) * err(12))
    mixed = ex * -0.5 + ex  # different scales are aligned before adding
    assert mixed.frac_bits == 12 + 16
    assert np.all(np.abs(ctx.decrypt(mixed) - 0.5 * x) <= 2 * err(12) + np.abs(x) * err(16))


def _matmul_bound(A, W, fa, fw):
    Aq = np.round(A * 2 ** fa) / 2 ** fa
    return (np.abs(Aq) @ np.full_like(W, err(fw))) + (np.full_like(A, err(fa)) @ np.abs(W)) + 1e-9


def test_packed_matmul_vs_numpy_signed(ctx):
    rng = np.random.default_rng(4)
    batch, d, K = 33, 9, 4  # batch not a multiple of the 15 slots
    A = rng.uniform(-7.9, 7.9, (batch, d))
    W = rng.normal(0, 2, (d, K))
    W[0, 0], W[1, 1] = 0.0, -5.0
    spec = PackingSpec(frac_bits=16, int_bits=3, slot_bits=64)
    encT = ctx.encrypt(A.T, spec)
    Z = packed_matmul(encT, W, w_frac_bits=14)
    assert Z.shape == (K, batch) and Z.frac_bits == 30
    out = ctx.decrypt(Z).T
    assert np.all(np.abs(out - A @ W) <= _matmul_bound(A, W, 16, 14))
    # noise masking as the split layer does it: Enc(AW + eps), then subtract eps
    eps = rng.uniform(-100, 100, (K, batch))
    masked = ctx.rerandomize(Z.add_plain(eps, bound=int(100 * 2 ** 30) + 1))
    assert np.all(np.abs(ctx.decrypt(masked).T - eps.T - A @ W) <= _matmul_bound(A, W, 16, 14) + 1e-6)


def test_headroom_overflow_is_caught(ctx):
    spec = PackingSpec(frac_bits=8, int_bits=4, slot_bits=16)  # headroom 3 bits
    assert spec.headroom_bits(1024) == 3
    x = np.array([15.99, -15.99, 3.0])
    ex = ctx.encrypt(x, spec)
    acc = ex
    for _ in range(6):  # 7 * bound < 2**15: allowed, and correct
        acc = acc + ex
    assert np.all(np.abs(ctx.decrypt(acc) - 7 * x) <= 7 * err(8))
    with pytest.raises(PackingOverflowError, match="16-bit slot"):
        acc + ex
    assert np.all(np.abs(ctx.decrypt(ex * -7) + 7 * x) <= 7 * err(8))
    with pytest.raises(PackingOverflowError):
        ex * 8
    with pytest.raises(PackingOverflowError):
        ex * 1.0  # 1.0 with 16 fractional weight bits is 2**16
    with pytest.raises(PackingOverflowError):
        packed_matmul(ctx.encrypt(np.ones((2, 3)), spec), np.array([[4], [-4]]), w_frac_bits=0)
    with pytest.raises(PackingOverflowError):
        ex.add_plain(np.full(3, 127.0))


def test_decoder_detects_overflow_that_bypasses_the_check(ctx):
    """If a slot did overflow, decoding fails loudly instead of returning garbage."""
    spec = PackingSpec(frac_bits=8, int_bits=4, slot_bits=16)
    slots = spec.layout(1024)[1]
    full = ctx.encrypt(np.full(slots, 15.0), spec)  # every slot used
    full.bound = 0  # lie about the bound so the check lets the overflow through
    with pytest.raises(ValueError, match="does not decode"):
        ctx.decrypt(full.mul_scalar(2 ** 12))  # the top slot carries out of the plaintext
    part = ctx.encrypt(np.full(slots - 1, 15.0), spec)
    part.bound = 0
    with pytest.raises(ValueError, match="padding"):
        ctx.decrypt(part.mul_scalar(2 ** 12))  # the last used slot carries into the padding


def test_multiprocess_equals_single_process():
    pk, sk = generate_keypair(1024)
    rng = np.random.default_rng(5)
    A = rng.uniform(-3, 3, (20, 5))
    W = rng.normal(size=(5, 3))
    with PaillierContext(pk, sk, workers=1) as one, PaillierContext(pk, sk, workers=2) as two:
        e1, e2 = one.encrypt(A.T), two.encrypt(A.T)
        # decryption is exact integer arithmetic, so both paths give identical floats
        assert np.array_equal(one.decrypt(e2), two.decrypt(e1))
        assert np.array_equal(one.decrypt(e1), two.decrypt(e2))
        assert np.array_equal(one.decrypt(one.matmul(e1, W)), two.decrypt(two.matmul(e1, W)))
        assert two.pool.generated >= e2.n_ciphertexts  # obfuscators came from the workers
        assert np.all(np.abs(two.decrypt(e2) - A.T) <= err(16))
        # background filling through the worker processes, then encryption uses the pool only
        need = e1.n_ciphertexts
        two.start_background_pool(need)
        assert two.pool.wait_ready(need, timeout=60)
        misses = two.pool.misses
        e3 = two.encrypt(A.T)
        assert two.pool.misses == misses
        assert np.array_equal(one.decrypt(e3), one.decrypt(e1))


def test_obfuscator_pool(ctx):
    pool = ObfuscatorPool(ctx.public_key)
    pool.fill(3)
    assert len(pool) == 3
    got = pool.take(5)
    assert len(got) == 5 and len(pool) == 0 and pool.misses == 2
    # every obfuscator is an n-th residue: it decrypts to 0
    assert all(ctx.private_key.raw_decrypt(int(o)) == 0 for o in got)
    assert len({int(o) for o in got}) == 5
    pool.start_background(4, batch=2)
    try:
        assert pool.wait_ready(4, timeout=30)
        assert len(pool.take(4)) == 4 and pool.misses == 2
        assert pool.wait_ready(4, timeout=30)  # refilled after taking
    finally:
        pool.stop_background()


def test_prefilled_pool_is_used(ctx):
    ctx.prefill(4)
    misses = ctx.pool.misses
    enc = ctx.encrypt(np.arange(30) / 7.0)  # 2 ciphertexts
    assert ctx.pool.misses == misses and len(ctx.pool) == 2
    assert np.all(np.abs(ctx.decrypt(enc) - np.arange(30) / 7.0) <= err(16))


def test_rerandomize_changes_ciphertexts_not_plaintexts(ctx):
    x = np.array([0.5, -2.0, 3.25])
    enc = ctx.encrypt(x)
    re = ctx.rerandomize(enc)
    assert int(re.ciphertexts[0, 0]) != int(enc.ciphertexts[0, 0])
    assert np.array_equal(ctx.decrypt(re), ctx.decrypt(enc))


def test_wire_roundtrip(ctx):
    rng = np.random.default_rng(6)
    A = rng.uniform(-2, 2, (4, 20))
    enc = ctx.encrypt(A)
    meta, data = enc.to_wire()
    assert data.dtype == np.uint8 and data.shape == (enc.n_ciphertexts, 2 * 1024 // 8)
    assert enc.nbytes == data.size
    pk2 = public_key_from_bytes(public_key_to_bytes(ctx.public_key))
    back = EncryptedArray.from_wire(pk2, meta, data)
    assert back.bound == enc.bound and back.frac_bits == enc.frac_bits
    assert np.array_equal(ctx.decrypt(back), ctx.decrypt(enc))
    # without the bound: still decrypts, but allows no further arithmetic
    hidden = EncryptedArray.from_wire(pk2, *enc.to_wire(include_bound=False))
    assert np.array_equal(ctx.decrypt(hidden), ctx.decrypt(enc))
    with pytest.raises(PackingOverflowError):
        hidden + hidden
    cts = ciphertexts_from_bytes(ciphertexts_to_bytes(enc.ciphertexts, ctx.public_key), ctx.public_key)
    assert cts == list(enc.ciphertexts.ravel())


def test_wire_rejects_malformed(ctx):
    enc = ctx.encrypt(np.ones(5))
    meta, data = enc.to_wire()
    with pytest.raises(ValueError, match="shape"):
        EncryptedArray.from_wire(ctx.public_key, meta, data[:, 1:])
    bad = data.copy()
    bad[0, :] = 255  # >= n**2
    with pytest.raises(ValueError, match="not in"):
        EncryptedArray.from_wire(ctx.public_key, meta, bad)
    with pytest.raises(ValueError, match="expected"):
        EncryptedArray.from_wire(ctx.public_key, dict(meta, shape=[100]), data)
    with pytest.raises(ValueError, match="metadata"):
        EncryptedArray.from_wire(ctx.public_key, {"shape": [5]}, data)
    with pytest.raises(ValueError, match="does not fit"):
        EncryptedArray.from_wire(ctx.public_key, dict(meta, bound=str(2 ** 63)), data)


def test_wrong_key_and_mismatched_operands(ctx, small_ctx):
    enc = ctx.encrypt(np.ones(4))
    with pytest.raises(ValueError, match="different key"):
        small_ctx.decrypt(enc)
    with pytest.raises(ValueError, match="different public keys"):
        enc + small_ctx.encrypt(np.ones(4))
    with pytest.raises(ValueError, match="shapes differ"):
        enc + ctx.encrypt(np.ones(5))
    with pytest.raises(ValueError, match="W must have shape"):
        packed_matmul(ctx.encrypt(np.ones((2, 4))), np.ones((3, 1)))
    with pytest.raises(TypeError):
        enc * enc
