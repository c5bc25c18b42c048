"""crypto.field_matmul against Python-int reference products mod p."""
import numpy as np
import pytest

from fedhet.crypto import field_matmul as fm
from fedhet.crypto.field import F61, P61, PrimeField


def ref_mm(a, b, p):
    A = [[int(v) for v in row] for row in np.asarray(a, dtype=object).reshape(-1, np.shape(a)[-1])]
    B = [[int(v) for v in row] for row in np.asarray(b, dtype=object)]
    K, N = len(B), len(B[0])
    return np.array([[sum(r[k] * B[k][n] for k in range(K)) % p for n in range(N)] for r in A], dtype=np.uint64)


@pytest.mark.parametrize("K,N,top", [(1, 1, 1), (16, 8, 1 << 17), (50, 3, 1 << 30), (7, 5, 1 << 52), (9, 4, P61 // 2)])
def test_matmul_random(K, N, top):
    rng = np.random.default_rng(K * 1000 + N)
    a = rng.integers(0, P61, size=(6, K), dtype=np.uint64)
    a[0] = P61 - 1
    a[1] = 0
    a[2] = P61 // 2
    b = [[int(rng.integers(-top, top + 1)) if top < 2**62 else 0 for _ in range(N)] for _ in range(K)]
    b = np.array(b, dtype=np.int64)
    b[0, 0] = -top
    got = fm.matmul(a, b)
    assert np.array_equal(got, ref_mm(a, b, P61))
    # field elements as the public operand give the same result
    assert np.array_equal(fm.matmul(a, F61.from_int(b)), got)


def test_blocking_beyond_exactness_limit():
    rng = np.random.default_rng(3)
    K = 600
    a = np.full((3, K), P61 - 1, dtype=np.uint64)
    a[1] = rng.integers(0, P61, size=K, dtype=np.uint64)
    b = np.full((K, 2), -(1 << 40), dtype=np.int64)
    pl = fm.plan(60, 41, K, int(np.abs(b).sum(axis=0).max()))
    assert pl.kblock < K or pl.lb > 1 or pl.la > 2
    assert np.array_equal(fm.matmul(a, b), ref_mm(a, b, P61))


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
    assert np.array_equal(fm.matmul(a, np.eye(3, dtype=np.int64)), a)


def test_agrees_with_field_matmul_and_small_prime():
    rng = np.random.default_rng(8)
    a = rng.integers(0, P61, size=(20, 30), dtype=np.uint64)
    b = rng.integers(-(1 << 16), 1 << 16, size=(30, 7))
    assert np.array_equal(fm.matmul(a, b), F61.matmul(a, F61.from_int(b)))
    f = PrimeField(2**31 - 1)
    a2 = rng.integers(0, f.p, size=(4, 10), dtype=np.uint64)
    assert np.array_equal(fm.matmul(a2, b[:10], field=f), ref_mm(a2, b[:10], f.p))


def test_bad_input():
    with pytest.raises(ValueError, match="shares"):
        fm.matmul(np.array([[P61]], dtype=np.uint64), np.array([[1]]))
    with pytest.raises(TypeError, match="integer"):
        fm.matmul(np.zeros((2, 2), dtype=np.uint64), np.ones((2, 2)))
    with pytest.raises(ValueError, match="matmul needs"):
        fm.matmul(np.zeros((2, 3), dtype=np.uint64), np.ones((2, 2), dtype=np.int64))
