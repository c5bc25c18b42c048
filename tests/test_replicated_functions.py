"""Fixed-point functions on replicated shares (protocols/replicated.py: maximum, exp, reciprocal, softmax and the
softmax cross-entropy gradient) against plain integer and float64 arithmetic, at their bounds and ties, within
the error bounds their docstrings state."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.protocols import replicated as rs

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

F = 20


@pytest.fixture(scope="module")
def holders():
    return rs.in_process_holders()


def _shared(x: np.ndarray):
    x = np.ascontiguousarray(x, dtype=np.int64)
    parts = rs.share(x.view(np.uint64))
    return lambda h: rs.Rss(rs.expand(parts[h.i][0], x.shape), rs.expand(parts[h.i][1], x.shape))


def _open(outs) -> np.ndarray:
    return rs.open_pairs([(o.a, o.b) for o in outs]).view(np.int64)


def test_maximum_is_exact_at_the_bounds_and_ties(holders):
    big = (1 << 61) - 1
    x = np.array([0, 0, 5, -5, big, -big, big, 3, -(1 << 40)], dtype=np.int64)
    y = np.array([0, 1, 5, -6, -big, big, big, -3, -(1 << 40) - 1], dtype=np.int64)
    X, Y = _shared(x), _shared(y)
    assert np.array_equal(_open(rs.in_process(lambda h: rs.maximum(h, X(h), Y(h)), holders)), np.maximum(x, y))
    rng = np.random.default_rng(0)
    for k in (1, 2, 3, 9):          # odd widths compare an entry with itself
        m = rng.integers(-1000, 1000, (7, k))
        m[0] = 4                    # all tied
        M = _shared(m)
        got = _open(rs.in_process(lambda h: rs.max_last(h, M(h)), holders))
        assert np.array_equal(got, m.max(-1, keepdims=True))


@pytest.mark.parametrize("n", [4, 8])
def test_exp_lies_within_its_bound_at_zero_the_clamp_and_below(holders, n):
    lim = float(2 ** n)
    x = np.concatenate([[0.0, -2.0 ** -F, -1.0, -2.0, -lim, -lim - 1.0, -3 * lim, -1e5],
                        np.random.default_rng(n).uniform(-lim, 0, 300)])
    X = _shared(rs.encode(x, F))
    got = rs.decode(_open(rs.in_process(lambda h: rs.exp_nonpos(h, X(h), F, n), holders)).view(np.uint64), F)
    err = np.abs(got - np.exp(x))
    assert got[0] == 1.0                                   # e^0 exactly: softmax's sum is >= 1
    assert np.all(got <= 1.0) and np.all(got >= 0.0)
    assert float(err.max()) <= rs.exp_error(F, n), float(err.max())
    assert np.all(got[x < -lim] == 0.0)                    # clamped: (1 - 1)^(2^n)
    # the bound is not slack by orders of magnitude: the limit's own error shows at x = -2
    assert float(err.max()) >= 0.5 * rs.EXP_APPROX * 2.0 ** -n


@pytest.mark.parametrize("lo,hi", [(1.0, 2.0), (1.0, 9.0), (0.5, 100.0)])
def test_reciprocal_lies_within_its_bound_over_its_range(holders, lo, hi):
    x = np.concatenate([[lo, hi, (lo + hi) / 2, lo + 2.0 ** -F], np.random.default_rng(1).uniform(lo, hi, 200)])
    X = _shared(rs.encode(x, F))
    before = holders[0].rounds
    got = rs.decode(_open(rs.in_process(lambda h: rs.reciprocal(h, X(h), F, lo, hi), holders)).view(np.uint64), F)
    assert holders[0].rounds - before == 22 * rs.newton_iterations(lo, hi, F)
    assert float(np.abs(got - 1.0 / x).max()) <= rs.reciprocal_error(lo, hi, F)


@pytest.mark.parametrize("k", [2, 3, 9])
def test_softmax_and_its_cross_entropy_gradient_lie_within_the_bound(holders, k):
    rng = np.random.default_rng(k)
    x = rng.normal(0, 4, (40, k))
    x[0] = 0.0                       # all tied
    x[1, :] = -300.0                 # all tied, far below zero
    x[1, 0] = 300.0                  # one far above the others: the rest under the clamp
    x[2, :2] = 7.5                   # a tie at the maximum
    y = rng.integers(0, k, 40)
    Y = np.eye(k, dtype=np.int64)[y] << F
    X, Ys = _shared(rs.encode(x, F)), _shared(Y)
    outs = rs.in_process(lambda h: rs.softmax_ce_grad(h, X(h), Ys(h), F), holders)
    g = rs.decode(_open([o for o, _ in outs]).view(np.uint64), F)
    p = rs.decode(_open([o for _, o in outs]).view(np.uint64), F)
    xt = torch.tensor(x, requires_grad=True)
    torch.nn.functional.cross_entropy(xt, torch.tensor(y), reduction="sum").backward()
    bound = rs.softmax_error(k, F, 8)
    assert float(np.abs(p - torch.softmax(torch.tensor(x), -1).numpy()).max()) <= bound
    assert float(np.abs(g - xt.grad.numpy()).max()) <= bound
    assert np.allclose(p[0], 1.0 / k, atol=bound) and abs(p[1, 0] - 1.0) <= bound
    assert bound < 0.02                                    # a bound that says something at these settings


def test_reciprocal_and_exp_refuse_ranges_they_cannot_serve(holders):
    X = _shared(np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="0 < lo < hi"):
        rs.in_process(lambda h: rs.reciprocal(h, X(h), F, 0.0, 1.0), holders)
    with pytest.raises(ValueError, match="n < f - 1"):
        rs.in_process(lambda h: rs.exp_nonpos(h, X(h), 8, 8), holders)
