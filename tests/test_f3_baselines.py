"""F³ baselines (algorithms/f3/baselines.py) and the additions to f3/models / f3/training: the grouped local
training equals training each owner alone, the κ-NN graph keeps κ neighbours, the Set Transformer ignores the
owners' order, the Gumbel graph option, end-to-end gradients, and owner_data equals f3.load_data."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from fedhet.algorithms.f3 import baselines as B
from fedhet.algorithms.f3 import models as FM
from fedhet.algorithms.f3 import training as T

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def _series(G=2, N=60, T_=7, seed=0, classes=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, N)
    x = rng.normal(size=(G, N, T_, 1)) + y[None, :, None, None] * 0.5 * (np.arange(G) + 1)[:, None, None, None]
    return x, y


def test_grouped_lstm_equals_local_lstms_forward():
    torch.manual_seed(0)
    locs = [FM.LocalLSTM(4, hidden=5) for _ in range(3)]
    g = B.GroupedLSTM.from_locals(locs)
    x = torch.randn(3, 6, 9, 1)
    lengths = torch.tensor([9, 3, 5, 1, 9, 7])
    out = g(x, lengths.expand(3, -1))
    assert out.shape == (3, 6, 4)
    for i, m in enumerate(locs):
        assert torch.allclose(out[i], m(x[i], lengths.tolist()), atol=1e-6)
        assert torch.allclose(g.represent(x)[i], m.represent(x[i]), atol=1e-6)
    back = g.to_locals()
    for a, b in zip(back, locs):
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
            assert ka == kb and torch.equal(va, vb)


@pytest.mark.parametrize("lengths", [False, True])
def test_grouped_training_equals_one_by_one(lengths):
    x, y = _series(2, 60, 7, seed=1)
    xv, yv = _series(2, 20, 7, seed=2)
    ln = np.random.default_rng(3).integers(3, 8, 60) if lengths else None
    lv = np.random.default_rng(4).integers(3, 8, 20) if lengths else None
    # patience 2 with a high lr: at least one owner stops early, so the per-owner stopping is exercised
    cfgs = [T.LocalConfig(hidden=6, epochs=8, patience=2, lr=2e-2, batch=16, seed=s) for s in (11, 12)]
    grouped, infos = B.train_locals(x, ln, y, xv, lv, yv, 3, cfgs)
    for g, cfg in enumerate(cfgs):
        alone, info = T.train_local(x[g], ln, y, xv[g], lv, yv, 3, cfg)
        assert infos[g]["epochs"] == info["epochs"]
        assert abs(infos[g]["val_loss"] - info["val_loss"]) < 1e-5
        mine = grouped.to_locals()[g]
        for (k, a), (_, b) in zip(alone.state_dict().items(), mine.state_dict().items()):
            assert torch.allclose(a, b, atol=2e-4), (k, float((a - b).abs().max()))
        h, p = B.grouped_outputs(grouped, xv, lv)
        assert np.allclose(h[g], T.represent(alone, xv[g], lv), atol=1e-5)
        assert np.allclose(p[g], T.local_probabilities(alone, xv[g], lv), atol=1e-5)


def test_grouped_owners_are_independent():
    """Changing one owner's data leaves the other owner's trained model unchanged."""
    x, y = _series(2, 40, 5, seed=5)
    cfgs = [T.LocalConfig(hidden=4, epochs=3, patience=3, batch=16, seed=s) for s in (1, 2)]
    a, _ = B.train_locals(x, None, y, x, None, y, 3, cfgs)
    x2 = x.copy()
    x2[1] = np.random.default_rng(9).normal(size=x2[1].shape)
    b, _ = B.train_locals(x2, None, y, x2, None, y, 3, cfgs)
    assert torch.allclose(a.w_hh[0], b.w_hh[0]) and not torch.allclose(a.w_hh[1], b.w_hh[1])


def test_knn_graph_keeps_kappa_neighbours():
    torch.manual_seed(0)
    feats = torch.rand(4, 15, 6) + 0.1          # positive: every cosine similarity > 0
    A = B.knn_graph(feats, kappa=10)
    assert A.shape == (4, 15, 15)
    assert ((A > 0).sum(-1) == 10).all()
    assert (torch.diagonal(A, dim1=-2, dim2=-1) == 0).all()
    f = torch.nn.functional.normalize(feats, dim=-1)
    sim = (f @ f.transpose(-1, -2)).masked_fill(torch.eye(15, dtype=torch.bool), -2)
    kth = sim.topk(10, -1).values[..., -1:]
    assert ((A > 0) == (sim >= kth)).all()      # exactly the 10 most similar others
    assert ((B.knn_graph(feats, kappa=50) > 0).sum(-1) == 14).all()    # κ capped at n - 1


def test_set_transformer_is_permutation_invariant():
    torch.manual_seed(0)
    st = B.SetTransformer(5, 3, d=16, heads=4, layers=2).eval()
    hs = [torch.randn(7, 5) for _ in range(6)]
    p = st(hs)
    assert p.shape == (7, 3) and torch.allclose(p.sum(1), torch.ones(7))
    perm = [3, 0, 5, 1, 4, 2]
    assert torch.allclose(st([hs[i] for i in perm]), p, atol=1e-5)
    assert not torch.allclose(st([hs[0] * 3] + hs[1:]), p, atol=1e-4)


def test_gumbel_graph_option():
    th = torch.full((5, 5), 0.3, requires_grad=True)
    z = FM.gumbel_sample(th, 0.1, torch.Generator().manual_seed(0))
    assert ((z > 0) & (z < 1)).all()
    z.sum().backward()
    assert th.grad.abs().sum() > 0
    hi = FM.gumbel_sample(torch.full((4000,), 0.8), 0.1, torch.Generator().manual_seed(1))
    assert 0.76 < float((hi > 0.5).float().mean()) < 0.84
    g = FM.GlobalGCN(4, [3] * 4, 3, 5, 2, align="soft", graph="gumbel")
    hs = [torch.randn(6, 3) for _ in range(4)]
    p = g(hs)
    assert p.shape == (6, 2) and torch.allclose(p.sum(1), torch.ones(6))
    g.eval()
    assert torch.allclose(g(hs).sum(1), torch.ones(6))


def test_knn_gcn_and_end_to_end_gradients():
    torch.manual_seed(0)
    n, C = 12, 3
    m = B.KnnGCN(n, [4] * n, 4, 5, C, align="soft", kappa=10)
    p = m([torch.randn(8, 4) for _ in range(n)])
    assert p.shape == (8, C) and torch.allclose(p.sum(1), torch.ones(8))
    p[:, 0].sum().backward()
    assert m.mlp[0].weight.grad.abs().sum() > 0          # the graph learner is trained

    local = B.GroupedLSTM.from_locals([FM.LocalLSTM(C, hidden=4) for _ in range(3)])
    vfl = B.EndToEndVFL(local, FM.GlobalGCN(3, [4] * 3, 4, 5, C, align="soft", graph="icdf"))
    out = vfl(torch.randn(3, 8, 6, 1))
    assert out.shape == (8, C)
    out[:, 1].sum().backward()
    assert local.w_hh.grad is not None and local.w_hh.grad.abs().sum() > 0


def test_votes_and_best_local():
    probs = np.array([[[.9, .1], [.2, .8], [.6, .4]],
                      [[.8, .2], [.3, .7], [.1, .9]],
                      [[.4, .6], [.4, .6], [.2, .8]]])          # (owners 3, rows 3, classes 2)
    v = B.majority_vote(probs, 2)
    assert np.allclose(v, [[2 / 3, 1 / 3], [0, 1], [1 / 3, 2 / 3]])
    sc, thr = B.threshold_vote(probs, probs, np.array([0, 1, 1]))
    assert (sc.argmax(1) == [0, 1, 1]).all() and 1 / 3 <= thr < 2 / 3
    assert B.best_local(probs, np.array([0, 1, 1]), 2) == 1


def test_fedavg_returns_one_shared_model():
    x, y = _series(3, 40, 5, seed=7)
    m, hist = B.fedavg_locals(x, None, y, x, None, y, 3, T.LocalConfig(hidden=4, batch=16), rounds=2,
                              local_epochs=1)
    assert isinstance(m, FM.LocalLSTM) and len(hist) == 2
    assert T.local_probabilities(m, x[0], None).shape == (40, 3)


@pytest.mark.data   # Japanese Vowels
def test_owner_data_equals_f3_load_data():
    from fedhet.algorithms import f3
    from fedhet.parties.settings import parse_settings
    s = parse_settings(f3.Settings, {}, "f3")
    data = f3.owner_data("vowels")
    assert data.n_owners == 12 and data.adj is None
    for c in (0, 7):
        ld = f3.load_data(s, types.SimpleNamespace(role="owner", n_of_role=12, index=c, data_dir=None))
        for k in ("train", "val", "test"):
            x, ln, y = ld["splits"][k]
            assert np.allclose(data.splits[k][0][c], x, atol=1e-12)
            assert (data.splits[k][1] == ln).all() and (data.splits[k][2] == y).all()
    y = data.labels()
    pos = data.positions()
    assert (y[pos["test"]] == data.splits["test"][2]).all()
