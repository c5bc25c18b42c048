"""Federated CHFL and its baselines (``fedhet.algorithms.chfl``) as party roles.

* Each client loads only its own rows and its common + unique columns; the partition every client
  computes alone is the shared ``chfl_partition`` (disjoint rows, same common set).
* With plain aggregation the federated run equals plain FedAvg written out in one loop here
  (``_fedavg_by_hand``: per-client accuracy curves, losses, the averaged common column), and the
  per-client lr/mu/round selection (of the roles and of ``sweep``, which runs the roles in memory)
  equals ``select_per_client`` on the by-hand curves, for CHFL, Common and Local.
* Secure aggregation: the first averaged common column is within the stated error bound of the
  plain one, the accuracies close; clients send no clear vector.
* The declarations accept exactly the common column's parameter count and reject the whole
  network's or a unique column's count, any aggregation message of a Local run (not declared),
  and a global model of the wrong shape or count; a process run of the ``chfl_small`` preset passes ``fedhet audit``,
  and the audit fails when the configuration it checks against is changed.
* The trained parts: a client's part is the network it reports as selected (lr, mu, round), with
  its scaler: rebuilt, it scores the client's raw test rows to exactly the test accuracy the client
  reported for that selection; the server's part is the averaged common column(s) of the last round.
* Data tests on covertype skip without ../shared/data.
"""
from __future__ import annotations

from dataclasses import replace

import json

import numpy as np
import pytest
import torch

from fedhet.algorithms import chfl as C
from fedhet.algorithms.chfl import core as L
from fedhet.algorithms.chfl.data import client_data, own_client_data
from fedhet.algorithms.chfl.experiments import sweep
from fedhet.algorithms.chfl.models import MLPColumn, UniqueColumn, common_numel, init_common_flat
from fedhet.algorithms.chfl.settings import max_train_rows
from fedhet.parties import api
from fedhet.parties.ops import presets
from fedhet.parties.contract import PartyContext
from fedhet.parties.declare import check_record
from fedhet.parties.schema import SchemaError
from fedhet.parties.settings import SettingsError
from fedhet.parties.audit import audit
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import launch
from fedhet.algorithms.partition import chfl_partition
from fedhet.algorithms.toolkit import derive_seed
from fedhet.protocols import aggregation, secagg

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

TINY = {"dataset": "digits", "hidden": [32, 16], "local_epochs": 1, "rounds": 2}
K = 3
AGG_KINDS = {d.kind for d in aggregation.DECLARATIONS}


def _s(cfg):
    """The parsed settings of an [algorithm] table (the one parser)."""
    return C.ALGORITHM.parse(cfg)


def _load(cfg, name, role, index, n_of_role):
    return C.load_data(_s(cfg), PartyContext(name, role, index, n_of_role))




@pytest.fixture(scope="module")
def digits():
    return C.load_table("digits")


def _fedavg_by_hand(digits, method, lr, mus=(), k=K, rounds=2, seed=7, epochs=1, batch_size=64,
                    hidden=(32, 16)) -> dict:
    """Plain FedAvg (or K lone clients) in one loop over the whole table: the computation the
    federated roles must reproduce.  curves[label][part] is (rounds, clients)."""
    X, y, _ = digits
    split = chfl_partition(len(y), X.shape[1], k, 0.3, seed)
    n_classes = int(y.max()) + 1
    data = [client_data(X, y, split, i, n_classes) for i in range(k)]
    if method == "local":
        clients = [L.LocalClient(d, lr=lr, hidden=hidden, seed=seed, index=i) for i, d in enumerate(data)]
        labels = ["local"]
    else:
        clients = [L.CHFLClient(d, mus=mus, lr=lr, hidden=hidden, seed=seed, index=i) for i, d in enumerate(data)]
        labels = ["common"] + [f"chfl_mu={m:g}" for m in mus]
        theta = init_common_flat(len(split.common), n_classes, hidden, derive_seed(seed, "theta0"))
    curves = {lab: {"val": [], "test": []} for lab in labels}
    losses = []
    for _ in range(rounds):
        if method == "local":
            losses.append([c.train_round(epochs, batch_size)["loss"] for c in clients])
        else:
            sent, rl = [], []
            for c in clients:
                c.set_common(theta)
                rl.append(c.train_round(epochs, batch_size)["loss_common"])
                sent.append(c.get_common())
            theta = L.aggregate(sent, [c.n_train for c in clients])
            for c in clients:  # Theta_k^t uses the aggregated common column
                c.set_common(theta)
            losses.append(rl)
        for part in ("val", "test"):
            evs = [c.evaluate(part) for c in clients]
            for j, lab in enumerate(labels):
                row = [e["local"] if lab == "local" else e["common"] if lab == "common" else e["heads"][j - 1]
                       for e in evs]
                curves[lab][part].append(row)
    return {"curves": curves, "train_loss": losses, "theta": None if method == "local" else theta}


def _selected_by_hand(digits, lrs, mus, select="best_round") -> dict:
    """Table II's groups chosen per client from the by-hand runs (lr outer, mu inner)."""
    cand = {"common": [], "chfl_mu0": [], "chfl_mu>0": [], "local": []}
    for lr in lrs:
        cv = _fedavg_by_hand(digits, "chfl", lr, mus=[0.0] + list(mus))["curves"]
        cand["common"].append({**cv["common"], "config": {"lr": lr}})
        cand["chfl_mu0"].append({**cv["chfl_mu=0"], "config": {"lr": lr, "mu": 0.0}})
        for m in mus:
            cand["chfl_mu>0"].append({**cv[f"chfl_mu={m:g}"], "config": {"lr": lr, "mu": m}})
        cand["local"].append({**_fedavg_by_hand(digits, "local", lr)["curves"]["local"], "config": {"lr": lr}})
    return {g: L.select_per_client(c, select) for g, c in cand.items()}


@pytest.fixture
def delivered(monkeypatch):
    """Every message delivered to any party's mailbox: (to, from, kind, arrays)."""
    log: list[tuple] = []
    orig = api._Mailbox.put

    def put(self, env):
        log.append((env.to, env.frm, env.kind, list(env.arrays)))
        return orig(self, env)

    monkeypatch.setattr(api._Mailbox, "put", put)
    return log


def _fed(cfg, seed=7, k=K, models=None):
    parties = [("server", "server")] + [(f"client{i + 1}", "client") for i in range(k)]
    return run_inmemory(C, parties, cfg={**TINY, **cfg}, seed=seed, timeout=60, models=models)


def _column(curves, label, part, k):
    return [row[k] for row in curves[label][part]]


# ------------------------------------------------------------------- settings and data


@pytest.mark.unit
def test_settings_reject_bad_config():
    assert _s({}).method == "chfl" and _s({"method": "Local"}).method == "local"
    with pytest.raises(SettingsError, match=r"unknown setting.*'epochs'"):
        _s({"epochs": 3})
    with pytest.raises(SettingsError, match="method"):
        _s({"method": "fedprox"})
    with pytest.raises(SettingsError, match=r"mu\[1\]|mu must be <= 1"):
        _s({"mu": [0.5, 1.5]})
    with pytest.raises(SettingsError, match="lr values repeat"):
        _s({"lr": [1e-3, 1e-3]})
    with pytest.raises(SettingsError, match="n_samples, n_features and n_classes"):
        _s({"dataset": "mine"})
    assert _s({"dataset": "mine", "n_samples": 100, "n_features": 10, "n_classes": 2}).n_common == 3
    with pytest.raises(SettingsError, match="common_ratio"):
        _s({"common_ratio": 1.0})
    assert _s({"method": "common", "mu": [0.0, 1.0]}).mus == ()
    assert _s({"dataset": " Digits "}).dataset == "digits"


@pytest.mark.unit
def test_each_client_loads_only_its_own_rows_and_columns(digits):
    X, y, _ = digits
    cfg = {"dataset": "digits", "seed": 4, "feature_seed": 9}
    assert _load(cfg, "server", "server", 0, 1) is None
    split = chfl_partition(len(y), X.shape[1], K, 0.3, 4, 9)
    seen = []
    for k in range(K):
        d = _load(cfg, f"c{k}", "client", k, K)
        rows = np.concatenate([split.rows(k, p) for p in ("train", "val", "test")])
        assert d.x.shape == (len(rows), len(split.common) + len(split.unique[k]))
        assert np.array_equal(d.x, X[rows][:, split.features(k)]) and np.array_equal(d.y, y[rows])
        assert d.n_parts == tuple(len(split.rows(k, p)) for p in ("train", "val", "test"))
        assert d.n_common == len(split.common) == _s(cfg).n_common
        seen.append(rows)
    allrows = np.concatenate(seen)
    assert len(np.unique(allrows)) == len(allrows) == len(y)  # disjoint, together all rows
    with pytest.raises(ValueError, match="n_clients = 2"):
        _load({**cfg, "n_clients": 2}, "c0", "client", 0, K)


@pytest.mark.unit
def test_parameter_counts_match_the_models():
    for cfg in ({"dataset": "digits", "hidden": [32, 16]}, {"dataset": "covertype"},
                {"dataset": "vehicle", "common_ratio": 0.5, "hidden": [8]}):
        s = _s(cfg)
        assert _s(cfg).common_params == common_numel(MLPColumn(s.n_common, s.class_count, s.hidden))
        du = s.shape[1] - s.n_common
        u = UniqueColumn(du, s.class_count, s.hidden, mu=0.5)
        assert _s(cfg).unique_params(du) == sum(p.numel() for p in u.parameters())
    assert _s({"dataset": "covertype"}).common_params == 173831  # 16 common features, 7 classes


# ---------------------------------------------------- federated == in-process (plain)


def test_chfl_plain_equals_fedavg_by_hand(digits):
    res = _fed({"mu": [0.0, 0.5], "lr": 0.01, "aggregation": "plain", "return_weights": True})
    ref = _fedavg_by_hand(digits, "chfl", 0.01, mus=[0.0, 0.5])
    split = chfl_partition(len(digits[1]), digits[0].shape[1], K, 0.3, 7)
    for k in range(K):
        c = res[f"client{k + 1}"]
        assert c["n_unique"] == len(split.unique[k]) and c["n_common"] == len(split.common)
        for lab in ("common", "chfl_mu=0", "chfl_mu=0.5"):
            for part in ("val", "test"):
                assert c["curves"][0][lab][part] == _column(ref["curves"], lab, part, k), (lab, part)
        assert [r[0] for r in c["train_loss"]] == [r[k] for r in ref["train_loss"]]
    srv = res["server"]
    assert srv["theta"][0] == ref["theta"].tolist()  # the averaged common column, bit for bit
    for lab in ("common", "chfl_mu=0", "chfl_mu=0.5"):
        assert srv["final_test"][lab] == pytest.approx(np.mean(ref["curves"][lab]["test"][-1]), abs=1e-15)
    assert srv["final_test"]["chfl_mu=0"] > 0.5  # it learns
    assert srv["max_mean_error_bound"] == 0.0 and srv["aggregation"] == "plain"
    assert len(srv["theta"]) == 1 and len(srv["theta"][0]) == _s({**TINY}).common_params


def test_selection_and_sweep_equal_selection_by_hand(digits):
    grid = {"lr": [0.01, 0.001], "select": "best_round"}
    ch = _fed({**grid, "mu": [0.0, 0.5, 1.0], "aggregation": "plain"})["server"]["selected"]
    lo = _fed({**grid, "method": "local"})["server"]["selected"]
    co = _fed({**grid, "method": "common", "aggregation": "plain"})["server"]["selected"]
    ref = _selected_by_hand(digits, [0.01, 0.001], [0.5, 1.0])
    sw = sweep(digits, K=K, rounds=2, seed=7, lr_grid=[0.01, 0.001], mu_grid=[0.5, 1.0],
               epochs=1, hidden=[32, 16])
    assert sw["n_common"] == _s(TINY).n_common and len(sw["n_unique"]) == K
    for got, groups in ((ch, ("common", "chfl_mu0", "chfl_mu>0")), (lo, ("local",)), (co, ("common",)),
                        (sw["results"], ("common", "chfl_mu0", "chfl_mu>0", "local"))):
        assert set(got) == set(groups)
        for g in groups:
            assert got[g]["test"] == ref[g]["test"], g
            assert got[g]["chosen"] == ref[g]["chosen"], g
            assert got[g]["mean_test"] == pytest.approx(ref[g]["mean_test"], abs=1e-12)


def test_sweep_reports_progress_per_round(digits):
    seen = []
    sweep(digits, K=2, rounds=2, seed=1, lr_grid=[0.01, 0.001], mu_grid=[0.5], epochs=1, hidden=[8],
            progress=lambda done, total, **m: seen.append((done, total, sorted(m))))
    # CHFL lr1, Local lr1, CHFL lr2, Local lr2: two rounds each
    assert seen == [(r, 2, ["loss", "val"]) for _ in range(4) for r in (1, 2)]


def test_local_sends_no_parameters(digits, delivered):
    res = _fed({"method": "local", "lr": 0.01})
    ref = _fedavg_by_hand(digits, "local", 0.01)
    for k in range(K):
        assert res[f"client{k + 1}"]["curves"][0]["local"]["test"] == _column(ref["curves"], "local", "test", k)
    from_clients = [(kind, arrays) for to, frm, kind, arrays in delivered if frm.startswith("client")]
    assert {kind for kind, _ in from_clients} <= {C.Kind.RESULT, "_bye"}
    assert all(not arrays for _, arrays in from_clients)
    assert not [1 for to, frm, kind, _ in delivered if kind == C.Kind.GLOBAL]


# ------------------------------------------------------------------- secure aggregation


def test_secure_mean_within_bound_and_accuracy_close(delivered):
    one = {"mu": 0.5, "lr": 0.01, "rounds": 1, "return_weights": True}
    plain = _fed({**one, "aggregation": "plain"})["server"]
    sec = _fed({**one, "aggregation": "secure"})["server"]
    assert sec["aggregation"] == "secure" and 0 < sec["max_mean_error_bound"] < 1e-5
    diff = np.abs(np.asarray(sec["theta"][0], np.float64) - np.asarray(plain["theta"][0], np.float64))
    # The bound is on the float64 mean; the float32 cast adds at most half an ulp.
    ulp = np.spacing(np.abs(np.asarray(plain["theta"][0], np.float32))).astype(np.float64)
    assert (diff <= sec["max_mean_error_bound"] + ulp).all()
    # What the clients sent under secure aggregation: masked ring vectors of P_c + 1 only.
    P = _s({**TINY}).common_params
    sent = [(kind, arrays) for to, frm, kind, arrays in delivered if frm.startswith("client")]
    assert aggregation.Kind.PLAIN in {kind for kind, _ in sent}  # the plain run's
    masked = [a for kind, a in sent if kind == secagg.Kind.MASKED]
    assert len(masked) == K and all(a == [("<u4", (P + 1,))] for a in masked)
    # Over more rounds the two trajectories part by float noise only.
    three = {"mu": 0.5, "lr": 0.01, "rounds": 3}
    p3 = _fed({**three, "aggregation": "plain"})["server"]["final_test"]
    s3 = _fed({**three, "aggregation": "secure"})["server"]["final_test"]
    assert p3.keys() == s3.keys()
    for lab in p3:
        assert abs(p3[lab] - s3[lab]) <= 0.03, (lab, p3[lab], s3[lab])


# ------------------------------------------------------------------------ declarations


def _audit(cfg, kind, arrays):
    """The audit's verdict on one record of ``kind`` holding ``arrays`` ((dtype, shape) each, or
    (path, dtype, shape)) in a run of ``cfg``: None when it passes (the real declarations)."""
    s = _s(cfg)
    declared = {d.kind: d for d in C.declarations(s)}
    if kind not in declared:
        return f"{kind} is not declared"
    return check_record(declared[kind], arrays, C.sizes(s))


@pytest.mark.unit
def test_declarations_pass_only_the_common_column():
    cfg = {"dataset": "covertype"}
    s = _s(cfg)
    P = s.common_params
    du = s.shape[1] - s.n_common
    uniq = s.unique_params(du)
    M = secagg.Kind.MASKED
    assert _audit(cfg, M, [("<u4", (P + 1,))]) is None
    assert _audit(cfg, M, [("<u4", (P + uniq + 1,))]) is not None  # the whole network
    assert _audit(cfg, M, [("<u4", (uniq + 1,))]) is not None  # a unique column with its laterals
    assert _audit(cfg, M, [("<u4", (s.unique_params(du, lateral=False) + 1,))]) is not None
    assert _audit(cfg, M, [("<u8", (P + 1,))]) is not None
    assert _audit({**cfg, "secagg_ring_bits": 64}, M, [("<u8", (P + 1,))]) is None
    # Another model size changes what passes: the count comes from the configuration.
    small = {**cfg, "hidden": [32, 16]}
    assert _audit(small, M, [("<u4", (P + 1,))]) is not None
    assert _audit(small, M, [("<u4", (_s(small).common_params + 1,))]) is None

    pcfg = {**cfg, "aggregation": "plain"}
    assert _audit(pcfg, aggregation.Kind.PLAIN, [("<f8", (P,))]) is None
    assert _audit(pcfg, aggregation.Kind.PLAIN, [("<f8", (P + uniq,))]) is not None
    assert _audit(cfg, aggregation.Kind.PLAIN, [("<f8", (P,))]) is not None  # a clear vector in a secure run
    local = {**cfg, "method": "local"}
    # A Local run declares no global model and no aggregation message of any kind.
    assert {d.kind for d in C.declarations(_s(local))} == {C.Kind.RESULT}
    for kind in AGG_KINDS | {C.Kind.GLOBAL}:
        assert _audit(local, kind, []) is not None, kind

    G = C.Kind.GLOBAL
    assert _audit(cfg, G, [("theta[0]", "<f4", (P,))]) is None
    two = {**cfg, "lr": [1e-3, 1e-4]}
    assert _audit(two, G, [("theta[0]", "<f4", (P,)), ("theta[1]", "<f4", (P,))]) is None
    assert _audit(cfg, G, [("theta[0]", "<f4", (P + uniq,))]) is not None
    assert _audit(cfg, G, [("theta[0]", "<f8", (P,))]) is not None
    assert _audit(cfg, C.Kind.RESULT, [("<f4", (3,))]) is not None
    # On receipt the schema also pins the number of vectors: one per lr.
    spec = {d.kind: d for d in C.declarations(_s(two))}[G].payload
    spec.validate({"r": 0, "theta": [np.zeros(P, np.float32)] * 2}, "", C.sizes(_s(two)))
    with pytest.raises(SchemaError, match="theta"):
        spec.validate({"r": 0, "theta": [np.zeros(P, np.float32)]}, "", C.sizes(_s(two)))
    with pytest.raises(SettingsError, match="mu"):
        _s({**cfg, "mu": 2.0})  # the audit of a run whose settings do not parse fails before any record


@pytest.mark.unit
def test_presets_parse():
    big = load(presets.path("chfl"))
    s = _s(big.algorithm_cfg())
    assert s.dataset == "covertype" and s.method == "chfl" and s.rounds == 20 and s.local_epochs == 5
    assert sorted(big.roles.values()) == ["client"] * 5 + ["server"]
    assert big.algorithm_cfg()["aggregation"] == "secure"
    small = load(presets.path("chfl_small"))
    assert _s(small.algorithm_cfg()).dataset == "digits"
    assert sorted(small.roles.values()) == ["client"] * 3 + ["server"]


@pytest.mark.processes
@pytest.mark.smoke   # make test's process run of this family
def test_preset_as_processes_passes_audit(tmp_path):
    fed = replace(load(presets.path("chfl_small")), hosts=2)   # two host processes: two torch imports, not four
    run_dir = tmp_path / "run"
    over = {"rounds": 2, "local_epochs": 1, "hidden": [32, 16], "lr": 0.01}
    launch(fed, run_dir, progress=False, timeout=240, overrides=over)
    rep = audit(run_dir)
    assert rep.ok, rep.problems
    srv = json.loads((run_dir / "parties" / "server" / "result.json").read_text())["result"]
    assert srv["aggregation"] == "secure" and srv["rounds"] == 2 and len(srv["clients"]) == 3
    assert srv["selected"]["chfl_mu0"]["mean_test"] > 0.5
    P = _s({**fed.algorithm_cfg(), **over}).common_params
    for name in srv["clients"]:
        recs = [json.loads(line) for line in
                (run_dir / "parties" / name / "transcript.jsonl").read_text().splitlines()]
        sends = [r for r in recs if r.get("dir") == "send"]
        with_arrays = [r for r in sends if r.get("arrays")]
        assert {r["kind"] for r in with_arrays} <= {secagg.Kind.MASKED, secagg.Kind.UNMASK}
        masked = [r for r in with_arrays if r["kind"] == secagg.Kind.MASKED]
        assert len(masked) == 2 and all(r["arrays"] == [["<u4", [P + 1]]] for r in masked)
    # The audit checks against the run's configuration: claim a different common ratio and the
    # (unchanged) masked vectors no longer have the common column's length.
    cfg_path = run_dir / "config.json"
    conf = json.loads(cfg_path.read_text())
    conf["algorithm_cfg"]["common_ratio"] = 0.5
    cfg_path.write_text(json.dumps(conf))
    bad = audit(run_dir)
    assert not bad.ok and any("secagg/masked" in p and "is declared" in p for p in bad.problems)


# --------------------------------------------------------------------- real data


@pytest.mark.unit
def test_covertype_partition_and_count(shared_data):
    cfg = {"dataset": "covertype", "seed": 1000, "feature_seed": 0}
    parts = [_load(cfg, f"client{k}", "client", k, 5) for k in range(5)]
    assert all(p.n_common == 16 for p in parts)
    assert [p.x.shape[1] - 16 for p in parts] == [8, 8, 8, 7, 7]
    assert sum(len(p.y) for p in parts) == 15120
    cd = own_client_data(parts[0], _s(cfg), "cpu")
    X, y, _ = C.load_table("covertype")
    ref = client_data(X, y, chfl_partition(len(y), X.shape[1], 5, 0.3, 1000, 0), 0, 7)
    for p in ("train", "val", "test"):
        assert torch.equal(cd.xc[p], ref.xc[p]) and torch.equal(cd.xu[p], ref.xu[p])
    assert common_numel(MLPColumn(16, 7)) == _s(cfg).common_params
    assert max_train_rows(_s(cfg), 5) == max(p.n_parts[0] for p in parts)


# ------------------------------------------------------------------------ trained parts


@pytest.mark.parametrize("method", ["chfl", "common", "local"])
def test_a_clients_part_is_its_selected_network_scoring_raw_rows(digits, method):
    """Two lrs, two mus, four rounds: each client's part is the network of its own selection (for
    CHFL the better of chfl_mu0 and chfl_mu>0 on validation) at its selected round (some client picks
    an earlier one than the last), and rebuilt from the part alone it gives the client's raw test rows
    the reported test accuracy."""
    from fedhet.algorithms.chfl.data import column_names
    from fedhet.algorithms.scoring import check_part, score

    lrs = [0.1, 0.01] if method == "local" else [0.05, 0.003]   # some client's best round is not the last
    cfg = {"method": method, "lr": lrs, "mu": [0.0, 0.5], "rounds": 4, "aggregation": "plain",
           "return_weights": True}
    models: dict = {}
    res = _fed(cfg, models=models)
    clients = [f"client{k + 1}" for k in range(K)]
    assert set(models) == set(clients) | ({"server"} if method != "local" else set())
    names = column_names("digits", 64)
    rounds = []
    split = chfl_partition(len(digits[1]), 64, K, 0.3, 7)
    for k, c in enumerate(clients):
        part = models[c]
        meta = part.meta
        module = C.ALGORITHM.load_model(meta, part.tensors)
        assert check_part(module, meta) is None
        sel = meta["selected"]
        group = sel.pop("group")
        assert sel == res[c]["selected"][group]["chosen"]          # the network the client reports
        rounds.append(sel["round"])
        if method == "chfl":
            other = {"chfl_mu0": "chfl_mu>0", "chfl_mu>0": "chfl_mu0"}[group]
            assert group in ("chfl_mu0", "chfl_mu>0") and (sel["mu"] == 0) == (group == "chfl_mu0")
            vals = [max(res[c]["curves"][j][f"chfl_mu={m:g}"]["val"]) for j in range(2) for m in (0.0, 0.5)]
            assert meta["selected_val"] == max(vals)                 # the better of the two groups
            o = res[c]["selected"][other]["chosen"]
            j = lrs.index(o["lr"])
            assert res[c]["curves"][j][f"chfl_mu={o['mu']:g}"]["val"][o["round"] - 1] <= meta["selected_val"]
        # scores the client's raw rows alone: its reported test accuracy for that selection, exactly
        rows = _load({**TINY, **cfg, "seed": 7}, c, "client", k, K)
        ntr, nva, _ = rows.n_parts
        n_in = rows.n_common if method == "common" else rows.x.shape[1]
        logits = score(module, meta, {"x": rows.x[ntr + nva:, :n_in]})
        correct = int((logits.argmax(1) == rows.y[ntr + nva:]).sum())   # the run's accuracy is a float32 mean
        assert correct == round(res[c]["selected"][group]["test"] * len(logits))
        assert meta["feature_names"] == [names[i] for i in split.features(k)][:n_in]
        assert meta["inputs"][0]["shape"] == [None, n_in] and meta["scaler"] and meta["classes"] == list(range(10))
    assert min(rounds) < 4
    if method != "local":   # the server: the last round's average per lr, on standardised common features
        srv = models["server"]
        assert list(srv.meta["lrs"].values()) == lrs
        assert srv.meta["feature_names"] == [names[i] for i in split.common]
        for j, theta in enumerate(res["server"]["theta"]):
            cols = [v.reshape(-1) for k, v in srv.tensors.items() if k.startswith(f"columns.lr{j}.")]
            assert np.concatenate(cols).tolist() == theta
        out = score(C.ALGORITHM.load_model(srv.meta, srv.tensors), srv.meta, {"x": np.zeros((2, split.common.size))})
        assert out.shape == (2, 2, 10)


def test_exported_parts_score_the_same_in_onnxruntime(tmp_path):
    """The export's ONNX files (a client's network with its scaler; the server's columns, one per lr)
    give the parts' logits to float32 precision in another runtime."""
    ort = pytest.importorskip("onnxruntime")
    from fedhet.algorithms import registry
    from fedhet.algorithms.scoring import score
    from fedhet.parties.ops.export import export_run
    from fedhet.parties.model_store import write_part

    models: dict = {}
    _fed({"lr": [0.01, 0.001], "mu": [0.0, 0.5], "aggregation": "plain"}, models=models)
    for name, part in models.items():
        write_part(tmp_path / "run" / "parties" / name / "model", part, {"algorithm": "chfl", "party": name})
    exported = export_run(tmp_path / "run", tmp_path / "export", registry.get_algorithm)
    assert set(exported) == set(models)
    for name, folder in exported.items():
        meta = models[name].meta
        rows = (np.asarray(meta["check"]["inputs"]["x"], np.float32) if name != "server"
                else np.linspace(-2, 2, 3 * meta["n_common"], dtype=np.float32).reshape(3, -1))
        want = score(C.ALGORITHM.load_model(meta, models[name].tensors), meta, {"x": rows})
        got = ort.InferenceSession(str(folder / "model.onnx")).run(None, {"x": rows})[0]
        assert got.shape == want.shape and np.allclose(got, want, rtol=0, atol=1e-5), name
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), name
