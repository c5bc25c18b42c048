"""F³ with ``fusion = "shares"`` (algorithms/f3/shares.py, shares_roles.py): every step on shares equals the same
step in float64 within the fixed point; the mode trains as trusted fusion does on the generated street grid; the
coordinator receives nothing per sample or per owner (declarations and the run's transcripts); a killed and
resumed run gives the uninterrupted run's results, in memory and as audited processes, with shares only in the
holders' checkpoints."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms import f3, registry
from fedhet.algorithms.f3 import shares as S
from fedhet.algorithms.f3.models import normalise_adj
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops import presets
from fedhet.parties.settings import parse_settings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

GRID = {"local_epochs": 20, "epochs": 10, "graph": "given"}


def _problem(seed=0, n=4, rows=120, width=6, classes=3):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, rows)
    centre = rng.normal(size=(classes, n, width))
    reps = [np.tanh(centre[y, i] + 0.8 * rng.normal(size=(rows, width))) for i in range(n)]
    A = normalise_adj(torch.tensor((rng.random((n, n)) > 0.5).astype(np.float32))).double().numpy()
    return reps, y, A.astype(np.float32).astype(np.float64)


@pytest.mark.unit
@pytest.mark.parametrize("align,optimizer", [("soft", "sgd"), ("none", "sgd"), ("soft", "lion")])
def test_steps_on_shares_follow_float64_training_within_the_fixed_point(align, optimizer):
    reps, y, A = _problem()
    classes = 3
    d = 6 if align == "none" else 5
    m = S.InProcessShares(reps, y, classes, A, d=d, hidden=4, align=align, seed=1)
    w = m.open_model()            # the same initial weights for the float64 reference
    v = {k: np.zeros_like(x) for k, x in w.items()}
    H = np.stack([S.rs.decode(S.rs.encode(r, S.H_BITS), S.H_BITS) for r in reps])
    Y = np.eye(classes)[y]
    for epoch in range(2):
        for lo in range(0, len(y), 40):
            rows = np.arange(lo, lo + 40)
            lr = 0.01 if optimizer == "lion" else 0.3
            assert m.step(rows, lr, 0.9, optimizer) == S.plain_step(w, v, H[:, rows], Y[rows], A, lr, 0.9, align,
                                                                     optimizer)
    got = m.open_model()
    for k in w:
        diff = np.abs(got[k] - w[k])
        if optimizer == "sgd":
            assert diff.max() < 2e-3 * max(1.0, np.abs(w[k]).max()), k
        else:   # Lion's sign of a gradient within the fixed point's error of 0 may flip: a step of 2 lr apart
            assert np.mean(diff < 2e-3) >= 0.9, k
            assert np.all((diff < 2e-3) | (np.abs(diff / 0.02 - np.rint(diff / 0.02)) < 0.1)), k
    conf = m.confusion(np.arange(len(y)), 50)
    assert conf.sum() == pytest.approx(len(y)) and np.allclose(conf, np.rint(conf))
    kinds = {k for k, _ in m.opened}
    assert kinds - {f"model/{k}" for k in w} == {"hits", "confusion"}
    assert all(size == 1 for k, size in m.opened if k == "hits")


@pytest.mark.unit
@pytest.mark.parametrize("align", ["soft", "none"])
def test_predictions_on_shares_are_the_opened_models_classes_and_open_nothing_else(align):
    """Prediction on shares (training's forward, then the predicted class) gives each new row the class the same
    trained model gives opened in float64, wherever its two best logits differ by more than the fixed point's
    error; only the one-hot classes are opened."""
    reps, y, A = _problem(rows=200)
    d = 6 if align == "none" else 5
    m = S.InProcessShares([r[:120] for r in reps], y[:120], 3, A, d=d, hidden=4, align=align, seed=1)
    for epoch in range(3):
        for lo in range(0, 120, 40):
            m.step(np.arange(lo, lo + 40), 0.3, 0.9)
    w = {k: torch.tensor(x) for k, x in m.open_model().items()}
    new = [r[120:] for r in reps]
    m.opened.clear()
    got = m.predict(new, batch=32)
    H = np.stack([S.rs.decode(S.rs.encode(r, S.H_BITS), S.H_BITS) for r in new])
    logits = S.plain_logits(w, H, A, align).numpy()
    # the forward's fixed-point error on these logits (opened here, in the test only): well inside the margin
    Xn = m._deal(np.stack([S.rs.encode(r, S.H_BITS, "h") for r in new]))
    shared = S.rs.in_process(lambda h: S.forward(h, m.models[h.i], m.shape, Xn[h.i], A)[0], m.holders)
    err = np.abs(S.rs.decode(S.rs.open_pairs([(x.a, x.b) for x in shared]), S.F) - logits).max()
    assert err < 5e-4, err                            # so a margin above 2 x 5e-4 cannot flip the class
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3
    assert got.shape == (80, 3) and set(np.unique(got)) <= {0, 1} and (got.sum(1) >= 1).all()
    assert clear.mean() >= 0.9                       # the comparison below covers most rows
    assert np.array_equal(got[clear], np.eye(3, dtype=np.int64)[logits[clear].argmax(1)])
    assert (logits.argmax(1) == y[120:]).mean() > 0.5   # a trained model, not a constant one
    assert m.opened == [("class", 32 * 3), ("class", 32 * 3), ("class", 16 * 3)]


@pytest.mark.unit
def test_initial_weights_come_from_every_holder_and_no_public_seed():
    reps, y, A = _problem()
    a = S.InProcessShares(reps, y, 3, A, d=5, hidden=4).open_model()
    b = S.InProcessShares(reps, y, 3, A, d=5, hidden=4).open_model()
    assert all(not np.allclose(a[k], b[k]) for k in a)           # fresh each run
    c = S.InProcessShares(reps, y, 3, A, d=5, hidden=4, seed=4).open_model()
    e = S.InProcessShares(reps, y, 3, A, d=5, hidden=4, seed=4).open_model()
    assert all(np.array_equal(c[k], e[k]) for k in c)              # init_seed: reproducible
    # torch's variance: W_0 uniform in ±1/sqrt(d), its std 1/sqrt(3 d)
    assert np.std(a["P"]) == pytest.approx(np.sqrt(6 / (5 + 6)) / np.sqrt(3), rel=0.3)


def _grid(**kw):
    fed = load(presets.path("f3_grid"))
    return fed, [(p.name, p.role) for p in fed.parties], {**fed.algorithm_cfg(), **GRID, **kw}


def test_shares_fusion_trains_as_trusted_fusion_does_on_the_street_grid():
    fed, parties, cfg = _grid(fusion="shares", init_seed=3)
    got = run_inmemory(registry.get_algorithm("f3"), parties, cfg, seed=fed.seed, timeout=300)
    trusted = run_inmemory(registry.get_algorithm("f3"), [p for p in parties if p[1] != "holder"],
                           {**cfg, "fusion": "trusted", "init_seed": None}, seed=fed.seed, timeout=300)
    c, t = got["coordinator"], trusted["coordinator"]
    assert c["fusion"] == "shares" and c["model_opened"] is False and c["epochs"] == 10
    assert abs(c["test"]["f1"] - t["test"]["f1"]) <= 0.02, (c["test"], t["test"])
    assert "test_probabilities" not in c
    assert sum(map(sum, c["test_confusion"])) == pytest.approx(40)
    assert got["h1"]["rounds"] == got["h2"]["rounds"] > 0


def test_the_shares_coordinator_receives_only_counts_and_labels():
    s = parse_settings(f3.Settings, {"fusion": "shares", "graph": "none"}, "f3")
    to_coord = {d.kind: d for d in f3.declarations(s) if f3.COORDINATOR in d.receiver}
    assert set(to_coord) == {f3.Kind.LABELS, f3.Kind.EPOCH_DONE, f3.Kind.SHARES_HITS, f3.Kind.SHARES_CONFUSION}
    opened = parse_settings(f3.Settings, {"fusion": "shares", "graph": "none", "open_model": True}, "f3")
    assert f3.Kind.SHARES_MODEL in {d.kind for d in f3.declarations(opened)}
    with pytest.raises(ValueError, match="graph 'given' or 'none'"):
        parse_settings(f3.Settings, {"fusion": "shares", "graph": "icdf"}, "f3")
    with pytest.raises(ValueError, match="align 'soft' or 'none'"):
        parse_settings(f3.Settings, {"fusion": "shares", "graph": "none", "align": "hard"}, "f3")


def test_killed_and_resumed_in_memory_gives_the_same_results_with_shares_only_in_holder_checkpoints(tmp_path):
    fed, parties, cfg = _grid(fusion="shares", init_seed=3, epochs=3, local_epochs=2)
    algo = registry.get_algorithm("f3")
    ref = run_inmemory(algo, parties, cfg, seed=fed.seed, run_id="r", timeout=300, checkpoint_dir=tmp_path / "ref")
    with pytest.raises(FederationFailed):
        run_inmemory(algo, parties, cfg, seed=fed.seed, run_id="r", timeout=120, clock="virtual",
                     checkpoint_dir=tmp_path / "k", kill={"h2": 3})
    resumed: dict = {}
    got = run_inmemory(algo, parties, cfg, seed=fed.seed, run_id="r", timeout=300, checkpoint_dir=tmp_path / "k",
                       resume=True, resumed=resumed)
    assert len(set(resumed.values())) == 1 and resumed["h2"] >= 2, resumed
    assert got["coordinator"]["history"] == [{**h, "epoch_s": g["epoch_s"]} for h, g in
                                              zip(ref["coordinator"]["history"], got["coordinator"]["history"])]
    assert got["coordinator"]["test"] == ref["coordinator"]["test"]
    # a holder's checkpoint: uint64 pairs (shares) and counters, no float weight or label
    from fedhet.parties.checkpoint import Checkpoints
    cp = Checkpoints(tmp_path / "k" / "h1")
    state = cp.read(max(cp.steps()))[0]["role"]
    assert set(state) == {"X", "Y", "model", "best", "steps", "compute_s", "counters"}
    for part in (state["model"]["w"], state["model"]["v"], state["best"]):
        assert all(np.asarray(x["a"]).dtype == np.uint64 for x in part.values())


@pytest.mark.processes
def test_processes_killed_and_resumed_give_the_in_memory_results_and_the_coordinator_receives_only_counts(tmp_path):
    """As processes (two hosts), a holder killed with SIGKILL right after a mid-training checkpoint and the run
    resumed: the in-memory run's results; the audit follows every transcript, and the coordinator's received
    kinds are the labels, the epoch acknowledgements and the opened counts."""
    import os
    from dataclasses import replace

    from algorithm_tools import comparable, jsonable   # a helper module of tests/
    from fedhet.parties.audit import audit
    from fedhet.parties.faults import KILL_ENV
    from fedhet.parties.ops.launcher import RunFailed, launch, resume_federation
    fed, parties, cfg = _grid(fusion="shares", init_seed=3, epochs=3, local_epochs=2)
    mem = run_inmemory(registry.get_algorithm("f3"), parties, cfg, seed=fed.seed, run_id="resume-test", timeout=300)
    fed = replace(fed, algorithm={"name": "f3", **cfg}, hosts=2)
    run = tmp_path / "run"
    with pytest.raises(RunFailed):
        launch(fed, run, progress=False, timeout=240, env=dict(os.environ, **{KILL_ENV: "h2:3:self"}))
    summary = launch(resume_federation(run), run, progress=False, timeout=240, resume=True)
    steps = {p: r.get("resumed_from") for p, r in summary["parties"].items()}
    assert len(set(steps.values())) == 1, steps
    rep = audit(run, registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    for p in fed.parties:
        assert comparable(jsonable(summary["parties"][p.name]["result"])) == comparable(jsonable(mem[p.name])), p.name
    # the runtime's own control kinds ("_bye", "_resume") carry no algorithm data
    got = {r["kind"] for r in rep.table if r["party"] == "coordinator" and r["received"] and r["kind"][0] != "_"}
    assert got == {f3.Kind.LABELS, f3.Kind.EPOCH_DONE, f3.Kind.SHARES_HITS, f3.Kind.SHARES_CONFUSION}, got


# ------------------------------------------------------------------------------------------- fedhet predict
class SharesRun:
    """F³'s smoke federation trained with fusion "shares" in memory, its parts written as a run writes them; new
    rows for every owner (the label owner's r0..r39; the others lack r17) in FOLDER/<owner>.csv."""

    def __init__(self, folder, **cfg):
        from benchmarks.predict_throughput import smoke, train, write_rows
        from dataclasses import replace
        fed = smoke("f3")
        self.fed = replace(fed, algorithm={**fed.algorithm, "fusion": "shares", "init_seed": 3, **cfg})
        self.folder, self.run = folder, folder / "run"
        self.models = train(self.fed, self.run)
        self.owners = [p.name for p in self.fed.parties if p.role == "owner"]
        self.holders = [p.name for p in self.fed.parties if p.role == "holder"]
        rng = np.random.default_rng(7)
        self.spec = {}
        for o in self.owners:
            ids = [f"r{i}" for i in range(40) if o == self.owners[0] or i != 17]
            self.spec[o] = write_rows(self.models[o].meta, ids, folder / f"{o}.csv", rng)

    def weights(self) -> dict[str, np.ndarray]:
        """The trained weights reconstructed from the three holders' parts (what no party of the run can do)."""
        parts = [self.models[h] for h in sorted(self.holders)]
        return {k: S.rs.decode(S.rs.open_pairs([(p.tensors[f"w.{k}.a"], p.tensors[f"w.{k}.b"]) for p in parts]), S.F)
                for k in parts[0].meta["weights"]}

    def oracle(self) -> tuple[list[str], np.ndarray]:
        """The common rows' IDs (sorted, as PSI's order) and their logits in float64: every owner's h from its part,
        through the reconstructed weights."""
        from fedhet.algorithms.f3.model import load_model
        from fedhet.algorithms.party_table import TableSpec, load_party_table
        from fedhet.algorithms.predict import own_rows
        from fedhet.algorithms.scoring import score
        tables = {o: load_party_table(TableSpec.from_dict(self.spec[o], party=o, base_dir=self.folder))
                  for o in self.owners}
        common = sorted(set.intersection(*[set(map(str, t.ids)) for t in tables.values()]))
        hs = []
        for o in self.owners:
            at = {str(i): j for j, i in enumerate(tables[o].ids)}
            meta = self.models[o].meta
            rows = {k: v[[at[i] for i in common]] for k, v in own_rows(meta, tables[o]).items()}
            h = score(load_model(meta, self.models[o].tensors), meta, rows).astype(np.float64)
            hs.append(S.rs.decode(S.rs.encode(h, S.H_BITS), S.H_BITS))
        A = np.asarray(self.models[self.holders[0]].tensors["graph"])
        w = {k: torch.tensor(x) for k, x in self.weights().items()}
        return common, S.plain_logits(w, np.stack(hs), A, self.fed.algorithm["align"]).numpy()

    def check(self, out) -> None:
        """The label owner's predictions: the oracle's class wherever its two best logits differ by more than the
        fixed point's error, probabilities 0/1; no other party holds predictions."""
        from fedhet.algorithms.predict import read_predictions
        ids, classes, p = read_predictions(out / "parties" / self.owners[0] / "predictions.csv")
        common, logits = self.oracle()
        assert ids == common and len(ids) == 39
        top2 = np.sort(logits, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 1e-3
        assert clear.mean() >= 0.9
        assert [c for c, ok in zip(classes, clear) if ok] == [str(c) for c in logits[clear].argmax(1)]
        assert set(np.unique(p)) <= {0.0, 0.5, 1.0} and np.allclose(p.sum(1), 1)
        assert not any((out / "parties" / p.name / "predictions.csv").exists() for p in self.fed.parties
                       if p.name != self.owners[0])


def test_a_shares_run_leaves_each_holder_its_shares_of_the_weights_and_predicts_on_shares_in_memory(tmp_path):
    """open_model = true, so the coordinator's part holds the opened weights: each holder's part holds uint64 words
    only (its pair), the three reconstruct exactly those weights, and one holder's pair alone is not them; fedhet
    predict (in memory) gives the reconstructed model's classes."""
    r = SharesRun(tmp_path, open_model=True)
    coord = r.models["coordinator"].tensors
    for h in r.holders:
        t = r.models[h].tensors
        assert {k for k, x in t.items() if x.dtype != np.uint64} == {"graph"}
        assert r.models[h].meta["model"] == "f3/holder-shares"
    w = r.weights()
    assert np.array_equal(w["W0"].astype(np.float32), coord["gcn.W0.weight"])
    assert np.array_equal(w["W1"].astype(np.float32), coord["gcn.W1.weight"])
    assert all(np.array_equal(w["P"][i].astype(np.float32), coord[f"gcn.P.{i}"]) for i in range(len(r.owners)))
    one = r.models[r.holders[0]].tensors["w.W0.a"]
    assert not np.allclose(S.rs.decode(one, S.F), w["W0"], atol=1e-2)
    from fedhet.parties.ops.export import export_run     # fedhet export rebuilds and copies a holder's shares too
    assert set(r.holders) <= set(export_run(r.run, tmp_path / "export", registry.get_algorithm, onnx=False))
    job = registry.get_algorithm("f3.predict")
    cfg = {**r.fed.algorithm_cfg(), "trained_run": str(r.run), "predictions_out": str(tmp_path / "pred")}
    res = run_inmemory(job, [(p.name, p.role) for p in r.fed.parties], cfg, seed=r.fed.seed, party_data=r.spec,
                       base_dir=tmp_path, timeout=120)
    r.check(tmp_path / "pred")
    assert res[r.owners[0]]["n_predicted"] == 39 and res["coordinator"]["n_predicted"] == 0
    # a holder's part that is not one sharing with the others' (one word changed) stops the job before any row
    from fedhet.algorithms.f3.predict import PART
    from fedhet.parties.model_store import read_part, write_part
    folder = r.run / "parties" / r.holders[1] / "model"
    part = read_part(folder)
    part.tensors["w.W1.a"][0, 0] += np.uint64(1)
    write_part(folder, part, part.header)
    with pytest.raises(FederationFailed, match=PART):
        run_inmemory(job, [(p.name, p.role) for p in r.fed.parties], {**cfg, "predictions_out": str(tmp_path / "p2")},
                     seed=r.fed.seed, party_data=r.spec, base_dir=tmp_path, timeout=120)
    assert not (tmp_path / "p2" / "parties" / r.owners[0] / "predictions.csv").exists()


@pytest.mark.processes
def test_predict_on_shares_as_processes_passes_the_audit_and_the_coordinator_receives_nothing(tmp_path):
    """open_model = false (the default: no party holds the trained weights): fedhet predict as processes (two
    hosts) gives the label owner the reconstructed model's classes; the audit follows every transcript; the
    coordinator receives no message at all, the label owner only PSI and the holders' pairs of the classes."""
    from dataclasses import replace

    from fedhet.algorithms.f3.predict import CLASS
    from fedhet.parties.audit import audit
    from fedhet.parties.ops.launcher import launch
    from fedhet.parties.ops.predict import job_federation
    r = SharesRun(tmp_path)
    assert "coordinator" not in r.models                   # nothing opened, no part
    fed = replace(r.fed, parties=[replace(p, data=r.spec.get(p.name, {})) for p in r.fed.parties],
                  base_dir=str(tmp_path), hosts=2)
    out = tmp_path / "pred"
    summary = launch(job_federation(fed, r.run, out), out, progress=False,
                     algorithm=registry.get_algorithm("f3.predict"), timeout=240)
    assert summary["ok"]
    rep = audit(out, registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    r.check(out)
    received = {}
    for row in rep.table:
        if row["received"] and row["kind"][0] != "_":      # the runtime's own control kinds carry no data
            received.setdefault(row["party"], set()).add(row["kind"])
    assert "coordinator" not in received, received["coordinator"]
    label = received[r.owners[0]]
    assert CLASS in label and all(k == CLASS or k.startswith("psi/") for k in label), label
    for o in r.owners[1:]:
        assert all(k.startswith("psi/") for k in received.get(o, set())), (o, received[o])
    batches = -(-39 // r.fed.algorithm_cfg().get("batch", 100))
    assert sum(row["received"] for row in rep.table if row["party"] == r.owners[0] and row["kind"] == CLASS) == \
        3 * batches                                         # one pair per holder per batch: the classes only
