import pytest
import torch

from fedhet.algorithms.f3 import models as fm

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def test_local_lstm_shapes():
    torch.manual_seed(0)
    m = fm.LocalLSTM(9, hidden=16)
    x = torch.randn(5, 29, 1)
    assert m(x, lengths=[7, 29, 10, 3, 20]).shape == (5, 9)
    assert m.represent(x).shape == (5, 16)


def test_icdf_in_unit_interval_and_gradients_flow():
    torch.manual_seed(0)
    th = torch.full((4, 4), 0.3, requires_grad=True)
    z = fm.icdf_sample(th, 0.1)
    assert ((z > 0) & (z < 1)).all()
    z.sum().backward()
    assert th.grad is not None and th.grad.abs().sum() > 0
    hi = fm.icdf_sample(torch.full((2000,), 0.9), 0.1)
    assert 0.85 < (hi > 0.5).float().mean() < 0.95


def _reference_normalise(a):
    """D^-1/2 (S + I) D^-1/2 with S = (A + Aᵀ)/2, written out as in the paper's reference code."""
    s = 0.5 * (a + a.transpose(-1, -2)) + torch.eye(a.shape[-1], dtype=a.dtype)
    d = s.sum(-1).rsqrt()
    return d.unsqueeze(-1) * s * d.unsqueeze(-2)


def test_normalise_adj_matches_the_written_out_formula_with_and_without_autograd():
    torch.manual_seed(1)
    for shape in [(7, 7), (3, 7, 7)]:
        a = torch.rand(shape, dtype=torch.float64, requires_grad=True)
        ref = _reference_normalise(a)
        got = fm.normalise_adj(a)
        assert torch.allclose(got, ref, atol=1e-12)
        w = torch.randn(shape, dtype=torch.float64)
        g_ref, = torch.autograd.grad((ref * w).sum(), a)
        g_got, = torch.autograd.grad((got * w).sum(), a)
        assert torch.allclose(g_got, g_ref, atol=1e-12)
        with torch.no_grad():                      # the in-place path
            assert torch.allclose(fm.normalise_adj(a), ref, atol=1e-12)
    for dtype in (torch.float32, torch.float64):   # exactly symmetric: its upper triangle is all the holders get
        a = torch.rand(20, 31, 31, dtype=dtype, requires_grad=True)
        out = fm.normalise_adj(fm.icdf_sample(a, 0.1, batch=None))
        assert torch.equal(out, out.transpose(-1, -2))
        with torch.no_grad():
            out = fm.normalise_adj(a)
            assert torch.equal(out, out.transpose(-1, -2))


def test_batched_graph_draws_equal_drawing_from_expanded_theta():
    """``batch=b`` broadcasts Φ⁻¹(θ) / logit θ instead of expanding θ: same draws, same gradients."""
    n, b = 6, 4
    for sample in (fm.icdf_sample, fm.gumbel_sample):
        th = torch.rand(n, n, dtype=torch.float64, requires_grad=True)
        ref = sample(th.expand(b, n, n), 0.1, torch.Generator().manual_seed(9))
        got = sample(th, 0.1, torch.Generator().manual_seed(9), batch=b)
        assert got.shape == (b, n, n) and torch.allclose(got, ref, atol=1e-12)
        w = torch.randn(b, n, n, dtype=torch.float64)
        g_ref, = torch.autograd.grad((ref * w).sum(), th)
        g_got, = torch.autograd.grad((got * w).sum(), th)
        assert torch.allclose(g_got, g_ref, atol=1e-10)


def test_sinkhorn_doubly_stochastic():
    p = fm.sinkhorn(torch.randn(6, 6) * 3, iters=10)
    assert torch.allclose(p.sum(0), torch.ones(6), atol=1e-4)
    assert torch.allclose(p.sum(1), torch.ones(6), atol=0.05)


def test_gcn_learns_tiny_problem():
    torch.manual_seed(0)
    n, d, N = 5, 4, 400
    y = torch.randint(0, 2, (N,))
    hs = [torch.randn(N, d) * 0.5 + (y[:, None].float() * 2 - 1) * (1.0 if i == 0 else 0.0) for i in range(n)]
    for align, graph in [("soft", "icdf"), ("hard", "none"), ("none", "given")]:
        g = fm.GlobalGCN(n, [d] * n, d, 8, 2, align=align, graph=graph, given=torch.ones(n, n))
        opt = torch.optim.Adam(g.parameters(), 0.05)
        for _ in range(60):
            opt.zero_grad()
            loss = torch.nn.functional.nll_loss(torch.log(g(hs) + 1e-9), y)
            loss.backward()
            opt.step()
        g.eval()
        acc = (g(hs).argmax(1) == y).float().mean()
        assert acc > 0.85, (align, graph, acc)
