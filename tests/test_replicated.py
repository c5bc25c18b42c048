"""Three-party replicated sharing (protocols/replicated.py) against plain integer arithmetic, and F³'s mpc fusion
(algorithms/f3/mpc.py) against plain autograd."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms import f3
from fedhet.algorithms.f3 import mpc
from fedhet.algorithms.f3 import training as T
from fedhet.parties.settings import parse_settings
from fedhet.protocols import replicated as rs

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

EDGES = np.array([0, 1, -1, 2, -2, (1 << 62), -(1 << 62), (1 << 63) - 1, -(1 << 63)], dtype=np.int64)


def _shared(x: np.ndarray):
    parts = rs.share(x.view(np.uint64))
    return lambda h: rs.Rss(rs.expand(parts[h.i][0], x.shape), rs.expand(parts[h.i][1], x.shape))


def _open(outs) -> np.ndarray:
    return rs.open_pairs([(o.a, o.b) for o in outs]).view(np.int64)


@pytest.fixture(scope="module")
def holders():
    return rs.in_process_holders()


def _values(rng, n=400, bits=62):
    x = rng.integers(-(1 << bits), 1 << bits, size=n, dtype=np.int64)
    return np.concatenate([EDGES, x])


def test_products_are_exact_mod_2_64(holders):
    rng = np.random.default_rng(1)
    x, y = _values(rng), _values(rng)
    X, Y = _shared(x), _shared(y)
    got = _open(rs.in_process(lambda h: rs.mul(h, X(h), Y(h)), holders))
    assert np.array_equal(got, x * y)      # numpy int64 products wrap mod 2^64 too
    A, B = rng.integers(-1000, 1000, (3, 5, 4)), rng.integers(-1000, 1000, (3, 4, 6))
    SA, SB = _shared(A.astype(np.int64)), _shared(B.astype(np.int64))
    got = _open(rs.in_process(lambda h: rs.bilinear(h, SA(h), SB(h), torch.bmm), holders))
    assert np.array_equal(got, A @ B)


def test_comparison_is_exact_at_zero_the_bounds_and_ties(holders):
    rng = np.random.default_rng(2)
    x = _values(rng)
    X = _shared(x)
    before = holders[0].rounds
    ltz = _open(rs.in_process(lambda h: rs.ltz(h, X(h)), holders))
    assert holders[0].rounds - before == rs.ROUNDS["ltz"]
    assert np.array_equal(ltz, (x < 0).astype(np.int64))
    relu_x = x[np.abs(x) < (1 << 40)]      # ReLU multiplies by the bit: keep the product's value meaningful
    relu_x = np.concatenate([relu_x, [0, 0, 1, -1]])   # ties: ReLU(0) = 0, its bit [x >= 0] = 1
    R = _shared(relu_x)
    out = rs.in_process(lambda h: rs.relu(h, R(h)), holders)
    assert np.array_equal(_open([o for o, _ in out]), np.maximum(relu_x, 0))
    assert np.array_equal(_open([b for _, b in out]), (relu_x >= 0).astype(np.int64))


@pytest.mark.parametrize("d", [1, 14, 40, 62])
def test_truncation_is_the_exact_floor(holders, d):
    rng = np.random.default_rng(3)
    x = _values(rng)
    X = _shared(x)
    got = _open(rs.in_process(lambda h: rs.trunc(h, X(h), d), holders))
    assert np.array_equal(got, x >> d)     # arithmetic shift: floor(x / 2^d), also for negatives


def test_fixed_point_products_stay_within_their_rounding_bound(holders):
    """A value with 14 fractional bits times one with 12: the product's error is that of the two encodings."""
    rng = np.random.default_rng(4)
    a, b = rng.uniform(-1, 1, 200), rng.uniform(-8, 8, 200)
    A, B = _shared(rs.encode(a, 14)), _shared(rs.encode(b, 12))
    got = rs.decode(_open(rs.in_process(lambda h: rs.mul(h, A(h), B(h)), holders)).view(np.uint64), 26)
    bound = 2.0 ** -15 * np.abs(b) + 2.0 ** -13 * (np.abs(a) + 2.0 ** -15)
    assert np.all(np.abs(got - a * b) <= bound)


def test_one_holders_pair_is_the_same_for_any_secret():
    seeds = (bytes(32), bytes([1]) * 32)
    x, y = np.arange(10, dtype=np.uint64), np.full(10, 7, dtype=np.uint64)
    px, py = rs.share(x, seeds), rs.share(y, seeds)
    assert px[0] == py[0]                  # holder 0: two seeds, nothing of x
    # holders 1 and 2 get x_2 = x - x_0 - x_1: uniform while x_0 or x_1 (a seed they lack) is unknown
    assert not np.array_equal(px[1][1], py[1][1])


def test_an_opening_with_one_inconsistent_holder_names_the_two_that_disagree(holders):
    X = _shared(np.arange(6, dtype=np.int64))
    pairs = [(o.a, o.b.copy()) for o in rs.in_process(lambda h: X(h), holders)]
    pairs[1][1][2] += np.uint64(1)          # holder 1 lies about component 2
    with pytest.raises(rs.OpenError, match="holders 1 and 2 disagree on component 2"):
        rs.open_pairs(pairs)


@pytest.mark.parametrize("graph", ["none", "given"])
@pytest.mark.parametrize("align", ["soft", "tied", "none"])
def test_mpc_gradients_and_probabilities_equal_plain_autograd(graph, align):
    """The holders' ReLU pattern differs from the plain one only where |U| is within the fixed-point error of
    the encoded operands (a kink); with their pattern, plain autograd gives mpc's probabilities and gradients."""
    rng = np.random.default_rng(5)
    n, N, d = 5, 40, 16
    reps = [np.tanh(rng.normal(size=(N, d))) for _ in range(n)]
    y = torch.as_tensor(rng.integers(0, 3, N))
    cfg = T.GlobalConfig(d=16, hidden=8, align=align, graph=graph, epochs=1, batch=20)
    given = (rng.random((n, n)) > 0.5).astype(float)
    plain, shared = (T.build_global(n, [d] * n, 3, cfg, given=given) for _ in range(2))
    shared.load_state_dict(plain.state_dict())
    rows = np.arange(20)
    link = mpc.InProcessMpc(reps)
    shared.train()
    pr_mpc = shared.fuse(mpc.SharedLogits(shared, link, [d] * n)(rows), len(rows))
    T.nll(pr_mpc, y[rows]).backward()
    bits = torch.as_tensor(_open([k["pos"] for k in link._kept]).astype(np.float32))   # the test may look
    U = None

    def logits(A):
        nonlocal U
        U = T.plain_first_layer(plain, reps)(rows)(A)
        return plain.W1((A.mean(-2, keepdim=True) @ (U * bits)).squeeze(-2))
    logits.logits = True
    plain.train()
    pr = plain.fuse(logits, len(rows))
    T.nll(pr, y[rows]).backward()
    flips = (U.detach() >= 0).float() != bits
    assert not bool(flips.any()) or float(U.detach().abs()[flips].max()) < 1e-3    # only at kinks
    assert float((pr.detach() - pr_mpc.detach()).abs().max()) < 1e-4
    for (name, a), b in zip(plain.named_parameters(), shared.parameters()):
        if a.grad is not None:
            assert float((a.grad - b.grad).abs().max()) <= 1e-3 * float(a.grad.abs().max()) + 1e-7, name


def test_mpc_settings_errors_name_the_problem():
    with pytest.raises(ValueError, match="renamed|now called 'shamir_linear'"):
        parse_settings(f3.Settings, {"fusion": "shamir"}, "f3")
    with pytest.raises(ValueError, match="exactly three holders"):
        parse_settings(f3.Settings, {"fusion": "mpc", "t": 3, "graph": "none"}, "f3")
    with pytest.raises(ValueError, match="graph 'given' or 'none'"):
        parse_settings(f3.Settings, {"fusion": "mpc", "graph": "icdf"}, "f3")


def test_the_mpc_coordinator_receives_only_logits_and_summed_gradients():
    s = parse_settings(f3.Settings, {"fusion": "mpc", "graph": "none"}, "f3")
    to_coord = {d.kind for d in f3.declarations(s) if f3.COORDINATOR in d.receiver}
    assert to_coord == {f3.Kind.LABELS, f3.Kind.EPOCH_DONE, f3.Kind.MPC_LOGITS, f3.Kind.MPC_GRAD}


@pytest.mark.parametrize("coef", [1 << 12, 1 << 40])
def test_public_products_through_float64_limbs_equal_int64_arithmetic(coef):
    rng = np.random.default_rng(6)
    M = rng.integers(-coef, coef, (30, 30), dtype=np.int64)
    x = rs.Rss(*(rng.integers(0, 1 << 63, (4, 30, 5), dtype=np.int64).view(np.uint64) * np.uint64(3) for _ in range(2)))
    fast = rs.lin_public(x, M, torch.matmul, float(np.abs(M).sum(1).max()))
    slow = rs.lin(x, lambda t: torch.matmul(torch.from_numpy(M), t))
    assert np.array_equal(fast.a, slow.a) and np.array_equal(fast.b, slow.b)
