"""HyFEM's models and steps (Algorithm 1) on a small synthetic hybrid problem.

The round loop below lives in the test only: the library has one implementation of the steps,
which the federated roles call."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dataclasses import replace

from fedhet.algorithms.hyfem import core as H
from fedhet.algorithms.hyfem.matching import forward
from fedhet.algorithms.hyfem.models import (ExtractorSpec, HyFEMModelSpec, InferenceMLP,
                                            build_extractor, concat_embeddings, get_flat, get_layers,
                                            init_extractor, init_inference, set_flat)
from fedhet.algorithms.partition import hybrid_partition

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

N_VIEWS, DIM, N_CLASSES = 3, 6, 4


def synthetic(n: int, seed: int):
    """Each view: a class-dependent mean plus noise, so every view helps and all views help most."""
    means = np.random.default_rng(100).normal(size=(N_VIEWS, N_CLASSES, DIM)) * 0.9
    rng = np.random.default_rng(seed)
    y = rng.integers(0, N_CLASSES, size=n)
    x = {d: (means[d, y] + rng.normal(size=(n, DIM))).astype(np.float32) for d in range(N_VIEWS)}
    return x, y


def small_spec(hidden=(16,)):
    return HyFEMModelSpec(tuple(ExtractorSpec("mlp", DIM, embed_dim=8, hidden=(16,))
                                for _ in range(N_VIEWS)), N_CLASSES, hidden)


def hybrid_clients(x, y, seed=0):
    """3 clients, 2 of the 3 views each, 3 of the 4 classes each, disjoint rows."""
    split = hybrid_partition(y, 3, N_VIEWS, 2, 3, seed=seed)
    data = {m: H.ClientData({d: x[d][split.rows[m]] for d in split.views[m]}, y[split.rows[m]])
            for m in range(3)}
    return split, data


def run_rounds(spec, cfg, data, client_views, rounds, x_test, y_test):
    """Algorithm 1 driven step by step (test-only loop)."""
    state = H.init_server(spec, client_views, cfg)
    acc = [H.evaluate_global(state, spec, x_test, y_test)["accuracy"]]
    for t in range(rounds):
        updates = {m: H.local_update(H.message_for_client(state, spec, m), data[m], spec, cfg, t, m)[0]
                   for m in data}
        sums, totals = H.sum_view_shares(updates)
        state = H.update_extractors(state, H.view_means(sums, totals))
        state, _ = H.match_inference(state, spec, {m: u.inference for m, u in updates.items()}, cfg, t)
        acc.append(H.evaluate_global(state, spec, x_test, y_test)["accuracy"])
    return state, acc


# ------------------------------------------------------------------------------ models

def test_inference_model_matches_the_numpy_layers():
    """The torch model and matching.forward compute the same function of the same layers, so
    what the matching proves about layers holds for the trained models."""
    layers = init_inference([10, 7, 3], seed=1)
    model = InferenceMLP.from_layers(layers)
    x = np.random.default_rng(0).normal(size=(20, 10)).astype(np.float32)
    with torch.no_grad():
        out = model(torch.as_tensor(x)).numpy()
    np.testing.assert_allclose(out, forward(layers, x), rtol=1e-5, atol=1e-5)
    back = get_layers(model)
    for (W, b), (W2, b2) in zip(layers, back):
        np.testing.assert_array_equal(W, W2)
        np.testing.assert_array_equal(b, b2)


@pytest.mark.parametrize("spec", [ExtractorSpec("mlp", 12, embed_dim=5, hidden=(9, 7)),
                                  ExtractorSpec("cnn", 64, embed_dim=5, image_shape=(1, 8, 8),
                                                channels=(4, 6))])
def test_extractor_flat_round_trip_and_seeded_init(spec):
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = init_extractor(spec, seed=7)
    after = torch.rand(3)
    assert torch.equal(before, after)          # the caller's RNG stream is untouched
    np.testing.assert_array_equal(a, init_extractor(spec, seed=7))
    assert not np.array_equal(a, init_extractor(spec, seed=8))
    net = build_extractor(spec)
    set_flat(net, a)
    np.testing.assert_array_equal(get_flat(net), a)
    x = torch.rand(4, spec.in_dim)
    assert net(x).shape == (4, spec.embed_dim)
    with pytest.raises(ValueError, match="parameters"):
        set_flat(net, a[:-1])


def test_concat_embeddings_fills_missing_views_with_zeros():
    e0, e2 = torch.ones(3, 2), 2 * torch.ones(3, 4)
    z = concat_embeddings([e0, None, e2], [2, 3, 4])
    assert z.shape == (3, 9)
    assert (z[:, 2:5] == 0).all() and (z[:, :2] == 1).all() and (z[:, 5:] == 2).all()


def test_spec_input_columns():
    spec = HyFEMModelSpec((ExtractorSpec("mlp", 3, embed_dim=2), ExtractorSpec("mlp", 3, embed_dim=3),
                           ExtractorSpec("mlp", 3, embed_dim=4)), 2)
    np.testing.assert_array_equal(spec.input_columns((0, 2)), [0, 1, 5, 6, 7, 8])
    assert spec.n_inputs == 9
    with pytest.raises(ValueError, match="sorted"):
        spec.input_columns((2, 0))


# ------------------------------------------------------------------------------ steps

def test_learning_rate_decays_every_8_rounds():
    cfg = H.HyFEMConfig()
    assert [H.learning_rate(cfg, t) for t in (0, 7, 8, 15, 16)] == pytest.approx(
        [0.005, 0.005, 0.001, 0.001, 0.0002])


def test_init_and_message_start_every_client_from_theta_0():
    spec = small_spec()
    cfg = H.HyFEMConfig(seed=3)
    state = H.init_server(spec, {0: (0, 1), 1: (1, 2), 2: (0, 2)}, cfg)
    msg = H.message_for_client(state, spec, 1)
    assert msg.views == (1, 2)
    cols = spec.input_columns((1, 2))
    np.testing.assert_array_equal(msg.inference[0][0], state.inference[0][0][:, cols])
    np.testing.assert_array_equal(msg.inference[1][0], state.inference[1][0])
    for d in (1, 2):
        np.testing.assert_array_equal(msg.extractors[d], state.extractors[d])
    with pytest.raises(ValueError, match="held by no client"):
        H.init_server(spec, {0: (0, 1)}, cfg)


def test_view_means_are_eq7_over_the_holders_only():
    rng = np.random.default_rng(0)
    ups = {m: H.ClientModels(v, {d: rng.normal(size=5).astype(np.float32) for d in v}, [])
           for m, v in {0: (0, 1), 1: (1, 2), 2: (1,)}.items()}
    sums, totals = H.sum_view_shares(ups)
    means = H.view_means(sums, totals)
    np.testing.assert_allclose(means[0], ups[0].extractors[0], rtol=1e-6)      # one holder
    np.testing.assert_allclose(means[1], (ups[0].extractors[1] + ups[1].extractors[1]
                                          + ups[2].extractors[1]) / 3, rtol=1e-6)
    np.testing.assert_allclose(means[2], ups[1].extractors[2], rtol=1e-6)
    assert totals == {0: 1.0, 1: 3.0, 2: 1.0}
    sums, totals = H.sum_view_shares(ups, weights={0: 3.0, 1: 1.0, 2: 1.0})
    means = H.view_means(sums, totals)
    np.testing.assert_allclose(means[1], (3 * ups[0].extractors[1] + ups[1].extractors[1]
                                          + ups[2].extractors[1]) / 5, rtol=1e-6)
    with pytest.raises(ValueError, match="does not hold view 2"):
        H.extractor_share(ups[0], 2)


def test_local_update_is_deterministic_and_leaves_its_input_alone():
    spec = small_spec()
    x, y = synthetic(120, seed=1)
    cfg = H.HyFEMConfig(local_steps=5, seed=2)
    state = H.init_server(spec, {0: (0, 2), 1: (1,)}, cfg)
    msg = H.message_for_client(state, spec, 0)
    keep = [W.copy() for W, _ in msg.inference]
    data = H.ClientData({0: x[0], 2: x[2]}, y)
    a, stats = H.local_update(msg, data, spec, cfg, round_index=0, client_id=0)
    b, _ = H.local_update(msg, data, spec, cfg, round_index=0, client_id=0)
    c, _ = H.local_update(msg, data, spec, cfg, round_index=1, client_id=0)
    for (W, _), k in zip(msg.inference, keep):
        np.testing.assert_array_equal(W, k)
    np.testing.assert_array_equal(a.inference[0][0], b.inference[0][0])
    np.testing.assert_array_equal(a.extractors[2], b.extractors[2])
    assert not np.array_equal(a.inference[0][0], c.inference[0][0])
    assert not np.array_equal(a.inference[0][0], msg.inference[0][0])
    assert stats["steps"] == 5 and stats["n_train"] == 120 and np.isfinite(stats["loss"])
    with pytest.raises(ValueError, match="no rows for view"):
        H.local_update(msg, H.ClientData({0: x[0]}, y), spec, cfg, 0, 0)
    with pytest.raises(ValueError, match="labels must be in"):
        H.local_update(msg, H.ClientData({0: x[0], 2: x[2]}, y + 10), spec, cfg, 0, 0)


def _distance(a: H.ClientModels, b: H.ClientModels) -> tuple[float, float]:
    inf = sum(float(((W1 - W2) ** 2).sum() + ((b1 - b2) ** 2).sum())
              for (W1, b1), (W2, b2) in zip(a.inference, b.inference))
    ext = sum(float(((a.extractors[d] - b.extractors[d]) ** 2).sum()) for d in a.views)
    return inf, ext


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_prox_with_large_mu_keeps_w_m_near_pi_m_theta_0(optimizer):
    spec = small_spec()
    x, y = synthetic(200, seed=4)
    data = H.ClientData({0: x[0], 1: x[1]}, y)
    base = dict(local_steps=32, optimizer=optimizer, lr=0.05 if optimizer == "sgd" else 0.005)
    state = H.init_server(spec, {0: (0, 1), 1: (2,)}, H.HyFEMConfig(**base))
    msg = H.message_for_client(state, spec, 0)
    avg, _ = H.local_update(msg, data, spec, H.HyFEMConfig(method="avg", **base), 0, 0)
    # SGD needs lr * 2 * weight < 2 to stay stable: mu = 5 at lr 0.05 contracts by 0.5 per step
    big = 5.0 if optimizer == "sgd" else 1e4
    prox, _ = H.local_update(msg, data, spec,
                             H.HyFEMConfig(method="prox", mu=big, extractor_weight=big, **base), 0, 0)
    small, _ = H.local_update(msg, data, spec,
                              H.HyFEMConfig(method="prox", mu=1e-4, extractor_weight=1e-4, **base), 0, 0)
    d_avg, d_prox, d_small = _distance(avg, msg), _distance(prox, msg), _distance(small, msg)
    assert d_avg[0] > 0 and d_avg[1] > 0
    assert d_prox[0] < 0.1 * d_avg[0] and d_prox[1] < 0.1 * d_avg[1]
    assert d_small[0] > 0.5 * d_avg[0]       # a tiny mu is nearly HyFEM-Avg


def test_sum_reduction_weakens_the_penalties_by_the_row_count():
    """eq. (6) literally sums the loss over the client's rows: the same mu pulls less."""
    spec = small_spec()
    x, y = synthetic(200, seed=4)
    data = H.ClientData({0: x[0], 1: x[1]}, y)
    state = H.init_server(spec, {0: (0, 1), 1: (2,)}, H.HyFEMConfig())
    msg = H.message_for_client(state, spec, 0)
    mean, _ = H.local_update(msg, data, spec, H.HyFEMConfig(method="prox", mu=10.0), 0, 0)
    summed, _ = H.local_update(msg, data, spec,
                               H.HyFEMConfig(method="prox", mu=10.0, loss_reduction="sum"), 0, 0)
    assert _distance(summed, msg)[0] > 2 * _distance(mean, msg)[0]
    with pytest.raises(ValueError, match="loss_reduction"):
        H.HyFEMConfig(loss_reduction="max")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_prox_steps_on_cnn_extractors_follow_the_gradient_of_eq6(reduction):
    """HyFEM-Prox with CNN extractors (COIL-20's): SGD steps of ``local_update`` equal plain
    gradient steps on eq. (6) written out here -- cross-entropy + mu ||w - Pi_m theta_0||^2 +
    extractor_weight sum_d ||theta_md - theta_0d||^2 over every conv and linear parameter."""
    from fedhet.algorithms.hyfem.models import extractor_from_flat
    cnn = ExtractorSpec("cnn", 64, embed_dim=4, image_shape=(1, 8, 8), channels=(3, 4))
    spec = HyFEMModelSpec((cnn, cnn, cnn), 3, (5,))
    rng = np.random.default_rng(8)
    n = 24
    y = np.arange(n) % 3
    x = {d: (rng.random((n, 64)) + 0.3 * y[:, None] * (d + 1)).astype(np.float32) for d in range(3)}
    mu, ew, lr, steps = 0.7, 2.0, 0.05 if reduction == "mean" else 0.002, 4
    cfg = H.HyFEMConfig(method="prox", mu=mu, extractor_weight=ew, optimizer="sgd", lr=lr,
                        local_steps=steps, batch_size=n, loss_reduction=reduction)
    state = H.init_server(spec, {0: (0, 2), 1: (1, 2)}, cfg)
    msg = H.message_for_client(state, spec, 0)
    data = H.ClientData({0: x[0], 2: x[2]}, y)
    got, _ = H.local_update(msg, data, spec, cfg, 0, 0)
    plain, _ = H.local_update(msg, data, spec, replace(cfg, method="avg"), 0, 0)

    nets = {d: extractor_from_flat(spec.extractors[d], msg.extractors[d]) for d in (0, 2)}
    inf = InferenceMLP.from_layers(msg.inference)
    ext_p = [q for d in (0, 2) for q in nets[d].parameters()]
    inf_p = list(inf.parameters())
    ext_a = [q.detach().clone() for q in ext_p]
    inf_a = [q.detach().clone() for q in inf_p]
    xt, yt = {d: torch.as_tensor(x[d]) for d in (0, 2)}, torch.as_tensor(y)
    for _ in range(steps):
        ce = torch.nn.functional.cross_entropy(inf(torch.cat([nets[0](xt[0]), nets[2](xt[2])], 1)), yt)
        obj = (ce * n if reduction == "sum" else ce) \
            + mu * sum(((q - a) ** 2).sum() for q, a in zip(inf_p, inf_a)) \
            + ew * sum(((q - a) ** 2).sum() for q, a in zip(ext_p, ext_a))
        grads = torch.autograd.grad(obj, ext_p + inf_p)
        with torch.no_grad():
            for q, g in zip(ext_p + inf_p, grads):
                q -= lr * g
    for d in (0, 2):
        np.testing.assert_allclose(got.extractors[d], get_flat(nets[d]), rtol=1e-4, atol=1e-6)
    for (W, b), (We, be) in zip(got.inference, get_layers(inf)):
        np.testing.assert_allclose(W, We, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(b, be, rtol=1e-4, atol=1e-6)
    # the penalties mattered: without them (HyFEM-Avg) the same steps end elsewhere
    for d in (0, 2):
        assert np.abs(plain.extractors[d] - got.extractors[d]).max() > 1e-4


def test_rounds_raise_global_accuracy_well_above_chance():
    spec = small_spec()
    x, y = synthetic(600, seed=5)
    x_test, y_test = synthetic(400, seed=6)
    split, data = hybrid_clients(x, y)
    cfg = H.HyFEMConfig(local_steps=16, seed=0)
    state, acc = run_rounds(spec, cfg, data, {m: split.views[m] for m in range(3)}, 5, x_test, y_test)
    assert acc[0] < 0.5                        # chance is 0.25
    assert acc[-1] > 0.8, acc
    # the local models see only 2 views and 3 of 4 classes, the global model every view
    local = H.average_metrics([H.evaluate_local(H.message_for_client(state, spec, m), spec,
                                                x_test, y_test) for m in range(3)])
    assert local["accuracy"] > 0.6
    assert len(state.history) == 5 and all(h["cost"] >= 0 for h in state.history)
    # every client's Pi_m is a valid injective map into theta_0
    for m, a in state.assignments.items():
        assert len(np.unique(a[0])) == 16 and a[0].max() < state.inference[0][0].shape[0]


def test_evaluate_local_reads_only_the_clients_views():
    spec = small_spec()
    x, y = synthetic(50, seed=7)
    state = H.init_server(spec, {0: (0, 1), 1: (2,)}, H.HyFEMConfig())
    msg = H.message_for_client(state, spec, 1)
    r = H.evaluate_local(msg, spec, {2: x[2]}, y)
    assert r["n"] == 50 and 0.0 <= r["accuracy"] <= 1.0 and np.isfinite(r["loss"])
    g = H.evaluate_global(state, spec, x, y)
    assert g["n"] == 50


def test_matching_requires_every_client():
    spec = small_spec()
    cfg = H.HyFEMConfig()
    state = H.init_server(spec, {0: (0, 1), 1: (2,)}, cfg)
    with pytest.raises(ValueError, match="missing \\[1\\]"):
        H.match_inference(state, spec, {0: H.message_for_client(state, spec, 0).inference}, cfg, 0)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="method"):
        H.HyFEMConfig(method="fedavg")
    with pytest.raises(ValueError, match="mu"):
        H.HyFEMConfig(mu=-0.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_local_update_on_cuda_matches_shapes():
    spec = small_spec()
    x, y = synthetic(100, seed=8)
    cfg = H.HyFEMConfig(local_steps=4, device="cuda")
    state = H.init_server(spec, {0: (0, 1, 2)}, cfg)
    out, stats = H.local_update(H.message_for_client(state, spec, 0), H.ClientData(x, y), spec, cfg, 0, 0)
    assert isinstance(out.inference[0][0], np.ndarray) and np.isfinite(stats["loss"])
    g = H.evaluate_global(state, spec, x, y, device="cuda")
    assert g["n"] == 100
