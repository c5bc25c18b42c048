"""F³ on shares (algorithms/f3/core.py): the first layer and its gradients computed by the holders on Shamir
shares equal the plain computation within the error bound the shares report; shared and trusted inference
agree; the federation runs in memory in both fusion modes and a hostile coordinator's request is refused."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms import f3
from fedhet.algorithms.f3 import training as T
from fedhet.algorithms.toolkit import role_members
from fedhet.parties.settings import parse_settings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

N, DIMS, D, HID, CLASSES, ROWS = 5, [4, 6, 4, 5, 4], 4, 3, 3, 40


def _settings(**kw):
    return parse_settings(f3.Settings, {"d": D, "hidden": HID, **kw}, "f3")


def _reps(seed=0, dims=DIMS):
    rng = np.random.default_rng(seed)
    return [np.tanh(rng.normal(size=(ROWS, w))) for w in dims]


def _model(align, graph, dims=DIMS, seed=0):
    cfg = T.GlobalConfig(d=D, hidden=HID, align=align, graph=graph, seed=seed, test_samples=2)
    m = T.build_global(N, dims, CLASSES, cfg)
    m.generator = torch.Generator().manual_seed(7)
    return m


def _grads(model, first, rows, y):
    model.zero_grad()
    model.generator = torch.Generator().manual_seed(11)
    probs = model.fuse(first(rows), len(rows))
    T.nll(probs, torch.as_tensor(y[rows])).backward()
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}, probs.detach()


CASES = [("none", "none"), ("soft", "none"), ("soft", "icdf"), ("hard", "icdf"), ("tied", "icdf"), ("none", "icdf")]


@pytest.mark.unit
@pytest.mark.parametrize("align,graph,equal", [(a, g, False) for a, g in CASES] + [("soft", "icdf", True)])
def test_gradients_on_shares_equal_plain_autograd(align, graph, equal):
    # equal widths: the holders' batched products over all owners; unequal: one product per owner
    dims = [D] * N if equal or align in ("none", "tied") else DIMS
    reps = _reps(1, dims)
    s = _settings(align=align, graph=graph)
    y = np.random.default_rng(2).integers(0, CLASSES, ROWS)
    rows = np.arange(3, 3 + 17)
    model = _model(align, graph, dims)
    g_plain, p_plain = _grads(model, T.plain_first_layer(model, reps), rows, y)
    holders = f3.InProcessHolders(reps, s, m=3, seed=5)
    g_shared, p_shared = _grads(model, f3.SharedFirstLayer(model, holders, dims), rows, y)
    assert set(g_plain) == set(g_shared) and g_plain
    assert holders.max_err > 0
    for k in g_plain:
        scale = float(g_plain[k].abs().max()) + 1e-6
        assert torch.allclose(g_shared[k], g_plain[k], atol=2e-3 * scale + 1e-5), (k, g_shared[k], g_plain[k])
    assert torch.allclose(p_shared, p_plain, atol=1e-3)


@pytest.mark.unit
def test_pre_activations_on_shares_lie_within_the_reported_error_bound():
    reps = _reps(3)
    s = _settings(align="soft", graph="icdf")
    model = _model("soft", "icdf")
    rows = np.arange(ROWS)
    A = model.adj(len(rows)).detach()
    with torch.no_grad():
        exact = T.plain_first_layer(model, reps)(rows)(A.double().float()).double().numpy()
        C = [c.detach().double().numpy() for c in f3.SharedFirstLayer(model, None, DIMS).publics(
            model.W0.weight, model.alignments())]
    holders = f3.InProcessHolders(reps, s, m=4, seed=1)
    U = holders.forward(rows, A.numpy(), C, keep=False)
    # float32 torch reference: allow its own rounding on top of the shares' bound
    assert np.abs(U - exact).max() <= holders.max_err + 1e-5
    # and against the float64 computation the bound is stated for
    H = np.stack([h @ c for h, c in zip(reps, C)], 1)
    exact64 = A.double().numpy() @ H
    assert np.abs(U - exact64).max() <= holders.max_err


@pytest.mark.unit
def test_shared_and_trusted_inference_agree():
    reps = _reps(4)
    s = _settings(align="soft", graph="icdf")
    model = _model("soft", "icdf")
    pos = np.arange(ROWS)
    model.generator = torch.Generator().manual_seed(3)
    p_trusted = T.predict(model, T.plain_first_layer(model, reps), pos, 16)
    model.generator = torch.Generator().manual_seed(3)
    holders = f3.InProcessHolders(reps, s, m=3, seed=2)
    p_shared = T.predict(model, f3.SharedFirstLayer(model, holders, DIMS), pos, 16)
    assert np.abs(p_shared - p_trusted).max() < 1e-3
    assert (p_shared.argmax(1) == p_trusted.argmax(1)).mean() >= 0.95


@pytest.mark.unit
def test_t_minus_one_holders_shares_do_not_depend_on_the_representations():
    """One holder's share (t = 2) of two different representation arrays: both look uniform on the field."""
    s = _settings()
    a = f3.InProcessHolders([np.zeros((ROWS, 4))] * N, s, m=3, seed=9).shares[0][0].values
    b = f3.InProcessHolders([np.full((ROWS, 4), 0.9)] * N, s, m=3, seed=10).shares[0][0].values
    p = (1 << 61) - 1
    for v in (a, b):
        assert v.max() < p and abs(v.astype(np.float64).mean() / p - 0.5) < 0.15


def test_holder_refuses_rows_outside_the_shared_arrays(shared_data):
    from fedhet.parties.inmemory import run_inmemory
    s = {"dataset": "vowels", "local_epochs": 1, "epochs": 1}

    def hostile(party, st, data):
        holders = party.peers_with_role(f3.HOLDER)
        order = role_members(party, f3.OWNER)
        party.recv(order[0], f3.Kind.LABELS)
        party.broadcast(f3.Kind.OP, {"op": "forward", "step": 1, "rows": np.array([10 ** 6], dtype=np.uint32),
                                  "A": np.eye(12, dtype=np.float32), "packed": False, "C": [np.zeros((16, 16))] * 12, "keep": False},
                        to=holders)
        return {}

    algo = f3.ALGORITHM
    roles = dict(algo.roles)
    roles[f3.COORDINATOR] = hostile
    import dataclasses
    algo = dataclasses.replace(algo, roles=roles)
    parties = [("c", "coordinator"), ("h1", "holder"), ("h2", "holder")] + [(f"o{i}", "owner") for i in range(12)]
    with pytest.raises(Exception, match="rows outside"):
        run_inmemory(algo, parties, s, timeout=60, data_dir=shared_data)


@pytest.mark.unit
def test_settings_errors_name_the_problem():
    with pytest.raises(ValueError, match="given"):
        _settings(graph="given")
    s = _settings(owner_hidden=[4, 4])
    with pytest.raises(ValueError, match="owner_hidden"):
        f3.owner_widths(s, 3)


@pytest.mark.unit
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_path_of_local_and_global_training():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 6, 1)), rng.integers(0, 3, 30)
    model, _ = T.train_local(x, None, y, x[:10], None, y[:10], 3, T.LocalConfig(hidden=4, epochs=2, device="cuda"))
    assert next(model.parameters()).is_cuda
    reps = [T.represent(model, x, None, "cuda")] * N
    cfg = T.GlobalConfig(d=4, hidden=3, align="soft", graph="icdf", epochs=2, device="cuda", test_samples=2)
    g = T.build_global(N, [4] * N, 3, cfg)
    s = _settings(align="soft", graph="icdf", d=4)
    holders = f3.InProcessHolders(reps, s, m=3)
    first = f3.SharedFirstLayer(g, holders, [4] * N)
    T.train_global(g, first, y, np.arange(20), np.arange(20, 30), cfg)
    p_shared = T.predict(g, first, np.arange(30), 16)
    assert next(g.parameters()).is_cuda and np.all(np.isfinite(p_shared))


@pytest.mark.unit
def test_real_speed_files_need_both_files():
    with pytest.raises(ValueError, match="go together"):
        _settings(dataset="metr_la", speeds_file="x.h5")


def test_an_owner_sending_its_representations_in_the_clear_under_shamir_fusion_is_refused(shared_data):
    """In shamir mode f3/rep is not declared at all: the coordinator refuses it on receipt, naming sender and kind."""
    from fedhet.parties.inmemory import run_inmemory
    import dataclasses

    def leaky_owner(party, st, data):
        party.send(party.peers_with_role(f3.COORDINATOR)[0], f3.Kind.REP, {"h": np.zeros((10, 16))})
        return {}

    roles = dict(f3.ALGORITHM.roles)
    roles[f3.OWNER] = leaky_owner
    roles[f3.HOLDER] = lambda party, st, data: {}     # only the coordinator waits (for the labels)
    algo = dataclasses.replace(f3.ALGORITHM, roles=roles)
    cfg = {"dataset": "metr_la", "n_sensors": 2, "n_windows": 40, "local_epochs": 1, "epochs": 1}
    parties = [("c", "coordinator"), ("h1", "holder"), ("h2", "holder"), ("s1", "owner"), ("s2", "owner")]
    with pytest.raises(Exception, match=r"refused \(undeclared kind\)"):
        run_inmemory(algo, parties, cfg, timeout=20, data_dir=shared_data)
    declared = {d.kind for d in f3.declarations(_settings(dataset="metr_la"))}
    assert f3.Kind.REP not in declared and f3.Kind.REP in {d.kind for d in f3.declarations(_settings(fusion="trusted"))}


def test_asking_t_holders_in_turn_gives_the_model_that_asking_all_gives():
    """Reconstruction is exact in the field, so whichever t holders answer, the coordinator gets the same
    values: ``ask = "t"`` (rotating) and ``ask = "all"`` must train the identical model."""
    from fedhet.algorithms import registry
    from fedhet.parties.ops import presets
    from fedhet.parties.federation import load
    from fedhet.parties.inmemory import run_inmemory
    fed = load(presets.path("f3_grid"))   # generated graph: no data folder needed
    parties = [(p.name, p.role) for p in fed.parties]
    assert sum(r == "holder" for _, r in parties) == 3
    out = {}
    for ask in ("t", "all"):
        cfg = {**fed.algorithm_cfg(), "local_epochs": 2, "epochs": 2, "graph": "icdf", "test_samples": 2, "ask": ask}
        out[ask] = run_inmemory(registry.get_algorithm("f3"), parties, cfg, seed=fed.seed, timeout=120)
    steps = {ask: {h: out[ask][h]["steps"] for h in ("h1", "h2", "h3")} for ask in out}
    assert len(set(steps["all"].values())) == 1
    assert sum(steps["t"].values()) == 2 * steps["all"]["h1"]     # t = 2 of 3 asked per step
    a, b = out["t"]["coordinator"], out["all"]["coordinator"]
    assert a["test_probabilities"] == b["test_probabilities"] and a["test"] == b["test"]
    assert a["val_best_loss"] == b["val_best_loss"]
    assert [e["train_loss"] for e in a["history"]] == [e["train_loss"] for e in b["history"]]


def test_holders_in_a_trusted_run_fail_at_once_naming_the_setting():
    """Trusted fusion has no holders: a holder listed anyway stops the run with the reason, instead of
    waiting out its receive timeout for shares no owner sends."""
    from fedhet.parties.ops import presets
    from fedhet.parties.federation import load
    from fedhet.parties.inmemory import FederationFailed, run_inmemory

    fed = load(presets.path("f3_grid"))
    cfg = {**fed.algorithm_cfg(), "local_epochs": 1, "epochs": 1, "test_samples": 2, "fusion": "trusted"}
    with pytest.raises(FederationFailed) as e:
        run_inmemory("f3", [(p.name, p.role) for p in fed.parties], cfg, seed=fed.seed, timeout=600)
    holders = {p.name for p in fed.parties if p.role == "holder"}
    assert set(e.value.failures) <= holders and e.value.failures
    assert all("fusion = 'trusted' has no holders" in str(err) for err in e.value.failures.values())


# ----------------------------------------------------------------------- trained parts (algorithms/f3/model.py)
def _grid_parts(fusion, graph):
    from fedhet.parties.ops import presets
    from fedhet.parties.federation import load
    from fedhet.parties.inmemory import run_inmemory
    fed = load(presets.path("f3_grid"))
    cfg = {**fed.algorithm_cfg(), "local_epochs": 2, "epochs": 2, "test_samples": 2, "fusion": fusion, "graph": graph}
    parties = [(p.name, p.role) for p in fed.parties if fusion != "trusted" or p.role != f3.HOLDER]
    models: dict = {}
    out = run_inmemory("f3", parties, cfg, seed=fed.seed, timeout=240, models=models)
    return out, models


def _chain(models):
    """Every owner's part on its own raw check rows (the same samples: rows align by index), their h into
    the coordinator's part."""
    from fedhet.algorithms.scoring import score
    owners = models["coordinator"].meta["owners"]
    hs = {}
    for o in owners:
        meta = models[o].meta
        module = f3.ALGORITHM.load_model(meta, models[o].tensors)
        hs[f"h_{o}"] = score(module, meta, meta["check"]["inputs"])
        assert np.array_equal(hs[f"h_{o}"], np.asarray(meta["check"]["outputs"], dtype=np.float32))
        x = torch.as_tensor(np.asarray(meta["check"]["inputs"]["x"]))
        with torch.no_grad():   # the local head rides along: the local model's probabilities
            local = module.local_probabilities(x).numpy()
        assert np.array_equal(local, np.asarray(meta["check_local"], dtype=np.float32))
    coord = models["coordinator"]
    return score(f3.ALGORITHM.load_model(coord.meta, coord.tensors), coord.meta, hs), hs


def test_owner_parts_into_the_coordinator_part_predict_what_the_trusted_run_predicted():
    """Each owner's part scores its RAW series (its scaler inside) into h; the coordinator's part takes every
    owner's h and, with the run's graph (here Â = I), gives the run's test probabilities."""
    out, models = _grid_parts("trusted", "none")
    owners = [f"s{i}" for i in range(1, 5)]
    assert set(models) == {"coordinator", *owners}
    for o in owners:
        meta = models[o].meta
        assert meta["model"] == "f3/owner" and meta["scaler"] and meta["outputs"] == ["h"]
        assert meta["feature_names"] == [f"speed_g{int(o[1:]) - 1}"] and meta["inputs"][0]["shape"] == [None, 12, 1]
    coord = models["coordinator"].meta
    assert coord["inputs"][0] == {"name": "h_s1", "shape": [None, 16], "dtype": "float32", "from": "s1"}
    probs, _ = _chain(models)
    want = np.asarray(out["coordinator"]["test_probabilities"])[:len(probs)]
    assert np.allclose(probs, want, rtol=0, atol=1e-6)


def test_a_shamir_coordinator_part_takes_h_it_never_held_and_holders_save_none():
    """In shamir fusion the coordinator held no h: its part is checked on synthetic h, and scoring real rows
    takes the owners' h (federated prediction); the chained parts give the run's predictions up to the
    fixed-point error of the shares.  Holders hold shares only: no part."""
    out, models = _grid_parts("shamir_linear", "none")
    assert not {"h1", "h2", "h3"} & set(models)
    coord = models["coordinator"]
    assert coord.meta["fusion"] == "shamir_linear" and "synthetic" in coord.meta["check_inputs"]
    probs, hs = _chain(models)
    for name, rows in coord.meta["check"]["inputs"].items():
        assert not np.allclose(np.asarray(rows, dtype=np.float32), hs[name])
    want = np.asarray(out["coordinator"]["test_probabilities"])[:len(probs)]
    assert np.allclose(probs, want, rtol=0, atol=1e-3)


def test_a_learned_graph_part_scores_with_fixed_draws_from_its_theta():
    """The run drew a fresh ICDF graph per sample; the part carries test_samples normalised draws from the
    learned θ (its own seeded generator), so the same rows always get the same answer."""
    from fedhet.algorithms.f3 import model as M
    _, models = _grid_parts("trusted", "icdf")
    coord = models["coordinator"]
    graphs, theta = coord.tensors["graphs"], coord.tensors["gcn.theta"]
    assert graphs.shape == (2, 4, 4) and np.allclose(graphs, graphs.transpose(0, 2, 1)) and theta.shape == (4, 4)
    gcn = f3.ALGORITHM.load_model(coord.meta, coord.tensors).gcn
    assert np.array_equal(M.fixed_graphs(gcn).numpy(), graphs)
    a, _ = _chain(models)
    b, _ = _chain(models)
    assert np.array_equal(a, b) and np.allclose(a.sum(1), 1, atol=1e-6)


def test_a_vowels_owner_part_reads_each_row_to_its_length(shared_data):
    """Japanese Vowels' series are zero-padded: the owner's part takes the lengths and ignores what follows."""
    from fedhet.algorithms.scoring import check_part, score
    from fedhet.parties.inmemory import run_inmemory
    models: dict = {}
    parties = [("c", "coordinator")] + [(f"o{i}", "owner") for i in range(12)]
    run_inmemory("f3", parties, {"dataset": "vowels", "local_epochs": 1, "epochs": 1, "fusion": "trusted",
                                 "graph": "none"}, timeout=120, models=models, data_dir=shared_data)
    part = models["o3"]
    assert [i["name"] for i in part.meta["inputs"]] == ["x", "lengths"] and part.meta["feature_names"] == ["lpc_4"]
    module = f3.ALGORITHM.load_model(part.meta, part.tensors)
    assert check_part(module, part.meta) is None
    rows = {k: np.asarray(v) for k, v in part.meta["check"]["inputs"].items()}
    tail = rows["x"].copy()
    for r, n in enumerate(rows["lengths"].astype(int)):
        tail[r, n:] = 7.0
    assert np.array_equal(score(module, part.meta, {**rows, "x": tail}), score(module, part.meta, rows))
