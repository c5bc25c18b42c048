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
