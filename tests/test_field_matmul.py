"""crypto.field_matmul against Python-int reference products mod p (object dtype, exact)."""
import numpy as np
import pytest

from fedhet.crypto import field_matmul as fm
from fedhet.crypto.field import F61, P61, PrimeField

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def ref_mm(a, b, p):
    """(a @ b) mod p with Python ints; a (R, K), b (K, N), any integer dtypes."""
    A = np.asarray(a).astype(object).reshape(-1, np.shape(a)[-1])
    B = np.asarray(b).astype(object)
    return np.asarray((A @ B) % p, dtype=np.uint64)


def extreme_shares(rng, R, K, p=P61):
    """Random shares with whole rows at the adversarial values p - 1, p // 2, p // 2 + 1, 0, 1."""
    a = rng.integers(0, p, size=(R, K), dtype=np.uint64)
    for i, v in enumerate([p - 1, p // 2, p // 2 + 1, 0, 1]):
        if i < R:
            a[i] = v
    return a


@pytest.mark.parametrize("K,N,top", [(1, 1, 1), (16, 8, 1 << 17), (16, 16, 1 << 20), (50, 3, 1 << 30),
                                     (7, 5, 1 << 45), (9, 4, 1 << 52), (9, 4, P61 // 2)])
def test_matmul_random_and_extremes(K, N, top):
    rng = np.random.default_rng(K * 1000 + N)
    a = extreme_shares(rng, 8, K)
    b = rng.integers(-top, top, size=(K, N), dtype=np.int64, endpoint=True)
    b[0, 0] = -top
    b[-1, -1] = top
    got = fm.matmul(a, b)
    assert np.array_equal(got, ref_mm(a, b, P61))
    # field elements as the public operand give the same result
    assert np.array_equal(fm.matmul(a, F61.from_int(b)), got)


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("halves", [True, False])
def test_worst_case_sums_reach_the_exactness_limit(sign, halves):
    # every digit at its bound and the public column sums at the largest value one block allows:
    # the float64 partial sums reach the limit of the conversion trick
    K, N = 16, 3
    limit = fm._HALVES_LIMIT if halves else fm.EXACT >> 30
    top = limit // K
    b = np.full((K, N), sign * top, dtype=np.int64)
    b[:, 1] = -sign * top
    b[0, 2] = sign * (limit - (K - 1) * top)            # column sum exactly at the limit
    pl = fm.plan(np.abs(b))
    assert (pl.halves, pl.limbs, pl.blocks) == (halves, 2, 1)
    for a_val in (P61 - 1, P61 // 2, P61 // 2 + 1, (1 << 60) + (1 << 30), (1 << 30) - 1, 1 << 31,
                  (1 << 32) - 1, ((1 << 29) - 1) << 32, 0):
        a = np.full((4, K), a_val, dtype=np.uint64)
        assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61)), a_val
        assert np.array_equal(fm.lmatmul(b.T, a.T), ref_mm(b.T, a.T, P61)), a_val


@pytest.mark.parametrize("K,top,digits", [(2000, 1 << 14, 2), (3312, 80000, 3), (300, 1 << 25, 3),
                                          (600, 1 << 30, 4)])
def test_blocking_beyond_exactness_limit(K, top, digits):
    rng = np.random.default_rng(K)
    a = extreme_shares(rng, 7, K)
    b = np.full((K, 3), -top, dtype=np.int64)
    b[:, 1] = top
    b[:, 2] = rng.integers(-top, top + 1, size=K)
    pl = fm.plan(np.abs(b))
    assert pl is not None
    # the column sums exceed one exact block: the plan cuts K or uses more digits
    assert pl.blocks > 1 or pl.limbs > 2
    assert pl.limbs == digits
    assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61))
    # the transposed product takes the column-stacked path with the same plan
    assert np.array_equal(fm.lmatmul(b.T, a.T), ref_mm(b.T, a.T, P61))


def test_plans_with_more_digits_and_the_generic_fallback():
    rng = np.random.default_rng(11)
    K = 40
    a = extreme_shares(rng, 6, K)
    seen = set()
    for top in (1 << 12, 1 << 24, 1 << 33, 1 << 36, (1 << 51) - 1, 1 << 51, 1 << 53):
        b = rng.integers(-top, top + 1, size=(K, 5))
        b[0] = top
        pl = fm.plan(np.abs(b))
        seen.add(None if pl is None else (pl.limbs, pl.blocks > 1))
        assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61)), top
        assert np.array_equal(fm.lmatmul(b.T, a.T), ref_mm(b.T, a.T, P61)), top
    assert None in seen                                   # |M| too large: generic product
    assert {L for L, _ in seen - {None}} >= {2, 3}        # two and more digits were planned


def test_plan_is_exact_by_construction():
    rng = np.random.default_rng(2)
    for _ in range(50):
        K = int(rng.integers(1, 400))
        top = int(2 ** rng.uniform(0, 40))
        am = rng.integers(0, top + 1, size=(K, 4))
        pl = fm.plan(am)
        if pl is None:      # not even the most digits (bound 2**15) fit in MAX_BLOCKS blocks
            limit = fm.EXACT >> 15
            assert top > limit or -(-K // (limit // top)) > fm.MAX_BLOCKS
            continue
        assert pl.cuts[0] == 0 and pl.cuts[-1] == K and pl.blocks <= fm.MAX_BLOCKS
        for k0, k1 in zip(pl.cuts[:-1], pl.cuts[1:]):
            assert int(am[k0:k1].sum(axis=0).max()) * pl.digit_bound <= fm.EXACT


def test_many_row_chunks_and_shapes(monkeypatch):
    monkeypatch.setattr(fm, "CHUNK_ELEMENTS", 1024)
    monkeypatch.setattr(fm, "MIN_GEMM_ROWS", 8)
    rng = np.random.default_rng(5)
    K, N = 24, 20
    R = 3 * fm._chunk(2, K, N, 10**9, 13) + 7    # several chunks and a ragged last one
    a = extreme_shares(rng, R, K)
    b = rng.integers(-(1 << 18), 1 << 18, size=(K, N))
    assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61))
    a3 = a.reshape(R, 2, 12)[:, :, :3]               # non-contiguous batch of shares
    b3 = rng.integers(-(1 << 18), 1 << 18, size=(3, 5))
    assert np.array_equal(fm.matmul(a3, b3), ref_mm(a3.reshape(-1, 3), b3, P61).reshape(R, 2, 5))
    C = 3 * fm._chunk(2, 30, 6, 10**9) + 5
    s = extreme_shares(rng, 30, C)
    m = rng.integers(-(1 << 18), 1 << 18, size=(6, 30))
    assert np.array_equal(fm.lmatmul(m, s), ref_mm(m, s, P61))


def test_lmatmul_and_shapes():
    rng = np.random.default_rng(5)
    a = rng.integers(0, P61, size=(9, 4, 3), dtype=np.uint64)
    b = rng.integers(-(1 << 20), 1 << 20, size=(5, 9))
    got = fm.lmatmul(b, a)
    assert got.shape == (5, 4, 3)
    want = ref_mm(b, a.reshape(9, -1), P61).reshape(5, 4, 3)
    assert np.array_equal(got, want)
    v = fm.matmul(a.reshape(-1, 3)[:, :3], np.array([1, -2, 3]))
    assert v.shape == (36,)
    assert np.array_equal(v, ref_mm(a.reshape(-1, 3), np.array([[1], [-2], [3]]), P61)[:, 0])
    assert np.array_equal(fm.matmul(a, np.eye(3, dtype=np.int64)), a)
    zero = np.zeros((3, 2), dtype=np.int64)
    assert np.array_equal(fm.matmul(np.full((4, 3), P61 - 1, dtype=np.uint64), zero), np.zeros((4, 2), np.uint64))
    assert np.array_equal(fm.lmatmul(zero.T, np.full((3, 4), P61 - 1, dtype=np.uint64)), np.zeros((2, 4), np.uint64))
    assert fm.matmul(np.zeros((0, 3), dtype=np.uint64), np.ones((3, 2), dtype=np.int64)).shape == (0, 2)
    assert np.array_equal(fm.matmul(np.ones((2, 0), dtype=np.uint64), np.ones((0, 2), dtype=np.int64)),
                          np.zeros((2, 2), dtype=np.uint64))


def test_agrees_with_field_matmul_and_small_prime():
    rng = np.random.default_rng(8)
    a = rng.integers(0, P61, size=(20, 30), dtype=np.uint64)
    b = rng.integers(-(1 << 16), 1 << 16, size=(30, 7))
    assert np.array_equal(fm.matmul(a, b), F61.matmul(a, F61.from_int(b)))
    for p in (2**31 - 1, 65521, 4294967291):
        f = PrimeField(p)
        a2 = extreme_shares(rng, 6, 10, p)
        assert np.array_equal(fm.matmul(a2, b[:10], field=f), ref_mm(a2, b[:10], p))
        assert np.array_equal(fm.lmatmul(b[:10].T, a2.T, field=f), ref_mm(b[:10].T, a2.T, p))


def test_bad_input():
    with pytest.raises(ValueError, match="shares"):
        fm.matmul(np.array([[P61]], dtype=np.uint64), np.array([[1]]))
    with pytest.raises(TypeError, match="integer"):
        fm.matmul(np.zeros((2, 2), dtype=np.uint64), np.ones((2, 2)))
    with pytest.raises(ValueError, match="matmul needs"):
        fm.matmul(np.zeros((2, 3), dtype=np.uint64), np.ones((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="lmatmul needs"):
        fm.lmatmul(np.ones((2, 2), dtype=np.int64), np.zeros((3, 2), dtype=np.uint64))


@pytest.mark.parametrize("sign", [1, -1])
def test_most_blocks_at_their_limit(sign):
    # 64 blocks, each at its exact limit, all of one sign: the int64 sums reach their range
    rows = 4
    K = fm.MAX_BLOCKS * rows
    limit = fm.EXACT >> 30
    b = np.full((K, 2), sign * (limit // rows), dtype=np.int64)
    b[:, 1] = -b[:, 1]
    pl = fm.plan(np.abs(b))
    assert (pl.limbs, pl.blocks) == (2, fm.MAX_BLOCKS)
    rng = np.random.default_rng(4)
    a = extreme_shares(rng, 9, K)
    a[5] = 1 << 31          # low digit at -2**30
    a[6] = (1 << 61) - 2 - (1 << 31)
    assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61))
    assert np.array_equal(fm.lmatmul(b.T, a.T), ref_mm(b.T, a.T, P61))


def test_random_shapes_and_magnitudes():
    rng = np.random.default_rng(99)
    for _ in range(40):
        R, K, N = (int(x) for x in rng.integers(1, 40, size=3))
        top = int(2 ** rng.uniform(0, 45))
        a = extreme_shares(rng, R, K)
        b = rng.integers(-top, top + 1, size=(K, N))
        assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61)), (R, K, N, top)
        assert np.array_equal(fm.lmatmul(b.T, a.T), ref_mm(b.T, a.T, P61)), (R, K, N, top)


def test_shared_array_public_matmul_uses_the_exact_kernel():
    from fedhet.protocols import shared_array as sa
    rng = np.random.default_rng(17)
    x = extreme_shares(rng, 30, 12)                                  # (K, N) contiguous shares
    w = rng.normal(0, 0.3, size=(30, 7))
    pub = sa.encode_public(w, None, F61, "test")
    assert np.array_equal(sa.public_matmul(x.T, pub, F61), ref_mm(x.T, pub.signed, P61))   # transposed view
    assert np.array_equal(sa.public_matmul(x[:, :7].T.copy(), pub, F61), ref_mm(x[:, :7].T, pub.signed, P61))
    batch = extreme_shares(rng, 5 * 4, 30).reshape(5, 4, 30)
    assert np.array_equal(sa.public_matmul(batch, pub, F61),
                          ref_mm(batch.reshape(-1, 30), pub.signed, P61).reshape(5, 4, 7))


HALVES_ROW_SUM = ((1 << 51) - (1 << 32)) // ((1 << 32) - 1)   # the docstring's exactness bound of the halves


@pytest.mark.parametrize("top", [1 << 16, HALVES_ROW_SUM // 11, HALVES_ROW_SUM // 11 + 1, (1 << 31) // 11,
                                 (1 << 36) // 11, 1 << 40])
def test_batched_lmatmul_equals_the_products_one_by_one(top, monkeypatch):
    """A public matrix per batch element (F³'s graph per sample): 2, 3 and 4 digits and the per-element fallback."""
    rng = np.random.default_rng(top % 1000)
    B, J, K, N = 5, 9, 11, 4
    a = np.stack([extreme_shares(rng, K, N) for _ in range(B)])
    m = rng.integers(-top, top, size=(B, J, K), dtype=np.int64, endpoint=True)
    m[0] = top                     # every row sum of element 0 at the largest the bound allows
    m[1] = -top
    got = fm.batched_lmatmul_trusted(m, a)
    for b in range(B):
        assert np.array_equal(got[b], ref_mm(m[b], a[b], P61)), b
    # the encoded integers as float64 (how shared_array passes them; exact, all below 2**53)
    assert np.array_equal(fm.batched_lmatmul_trusted(m.astype(np.float64), a), got)
    monkeypatch.setattr(fm, "BATCH_BELOW", 1)     # the per-element path for the same products
    monkeypatch.setattr(fm, "BATCH_NARROW", 0)
    assert np.array_equal(fm.batched_lmatmul_trusted(m, a), got)
    assert np.array_equal(fm.batched_lmatmul_trusted(m.astype(np.float64), a, rowmax=int(np.abs(m).sum(-1).max())),
                          got)


@pytest.mark.parametrize("B,J,K,N", [(7, 5, 6, 3), (3, 1, 9, 40), (5, 12, 2, 1)])
def test_batched_halves_over_batch_chunks(B, J, K, N, monkeypatch):
    """The halves path cut into batch chunks (a short last one), int64 and float64 operands, a transposed view."""
    rng = np.random.default_rng(B * 100 + N)
    a = np.stack([extreme_shares(rng, K, N) for _ in range(B)])
    top = HALVES_ROW_SUM // K
    m = rng.integers(-top, top, size=(B, J, K), dtype=np.int64, endpoint=True)
    m[0, 0] = top
    want = np.stack([ref_mm(m[b], a[b], P61) for b in range(B)])
    for chunk in (1, (J * N + K * N) * 2, 1 << 17):          # one element, two elements, all at once
        monkeypatch.setattr(fm, "CHUNK_ELEMENTS", chunk)
        assert np.array_equal(fm.batched_lmatmul_trusted(m, a), want), chunk
        assert np.array_equal(fm.batched_lmatmul_trusted(m.astype(np.float64), a), want), chunk
    at = np.ascontiguousarray(a.transpose(0, 2, 1)).transpose(0, 2, 1)   # same values, not C-contiguous
    assert np.array_equal(fm.batched_lmatmul_trusted(m, at), want)


def test_batched_lmatmul_small_prime_and_shapes():
    fld = PrimeField(2_147_483_647)
    rng = np.random.default_rng(3)
    a = rng.integers(0, fld.p, size=(3, 6, 2), dtype=np.uint64)
    m = rng.integers(-100, 100, size=(3, 4, 6), dtype=np.int64)
    got = fm.batched_lmatmul_trusted(m, a, fld)
    assert all(np.array_equal(got[b], ref_mm(m[b], a[b], fld.p)) for b in range(3))
    with pytest.raises(ValueError, match="do not match"):
        fm.batched_lmatmul_trusted(m, a[:, :5], fld)
    assert fm.batched_lmatmul_trusted(m[:0], a[:0], fld).shape == (0, 4, 2)
