"""Federated HyFEM (algorithms/hyfem/): the roles on the in-memory transport and as processes.

* it learns: global and local accuracy well above chance on a Handwritten subset;
* secure per-view aggregation gives the plain run's models within its error bound;
* a view held by one client is refused under secure aggregation, unless allow_plain_views;
* no label-shaped array leaves a client, and the process run passes ``fedhet audit``;
* the trained parts score raw rows as the run did: a client's from its own views (its final local
  accuracy), the server's from every view (the final global accuracy); COIL-20's CNN extractors
  export too (weights, metadata, ONNX) and load back identical.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from fedhet.algorithms import hyfem, registry
from fedhet.algorithms.scoring import check_part, score
from fedhet.parties.ops.export import export_run, load_export
from fedhet.algorithms.hyfem.data import raw_views
from fedhet.parties.ops import presets
from fedhet.parties.audit import audit
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import launch
from fedhet.parties.settings import parse_settings

pytestmark = [pytest.mark.federation, pytest.mark.data]   # Handwritten (the generic all-algorithms test covers HyFEM on digits)

PARTIES = [("server", "server")] + [(f"client{i}", "client") for i in range(1, 5)]
SMALL = {"max_rows": 600, "extractor_hidden": 32, "inference_hidden": 16, "embed_dim": 8,
         "local_steps": 16, "rounds": 3}


def run(cfg, seed=0, models=None):
    return run_inmemory("hyfem", PARTIES, {**SMALL, **cfg}, seed=seed, timeout=180, models=models)


def test_learns_well_above_chance():
    out = run({"aggregation": "plain"})
    srv = out["server"]
    assert len(srv["global_accuracy"]) == SMALL["rounds"] + 1
    assert srv["global_accuracy"][-1] > 0.5 and srv["global_accuracy"][-1] > srv["global_accuracy"][0] + 0.3
    assert srv["local_accuracy"][-1] > 0.4          # chance is 0.1 on 10 classes
    # Fig. 3 partition: 4 views, 3 per client, so each view has 3 holders
    views = [tuple(v) for v in srv["client_views"].values()]
    assert all(len(v) == 3 for v in views)
    assert all(sum(d in v for v in views) == 3 for d in range(4))


def test_secure_equals_plain_within_the_error_bound():
    plain = run({"aggregation": "plain", "rounds": 1, "return_models": True})["server"]
    sec = run({"aggregation": "secure", "rounds": 1, "return_models": True})["server"]
    bound = sec["max_mean_error_bound"]
    assert 0 < bound < 1e-5 and set(sec["view_aggregation"].values()) == {"secure"}
    for a, b in zip(plain["extractors"], sec["extractors"]):
        a, b = np.asarray(a), np.asarray(b)
        # float32 storage of the mean adds at most one rounding of |x|
        assert np.max(np.abs(a - b) - np.abs(a) * 2.0 ** -23) <= bound * 1.001
        assert not np.array_equal(a, np.zeros_like(a))
    for (Wa, ba), (Wb, bb) in zip(plain["inference"], sec["inference"]):
        # w_m are computed from the same received models: the matching sees identical inputs
        np.testing.assert_array_equal(np.asarray(Wa), np.asarray(Wb))
        np.testing.assert_array_equal(np.asarray(ba), np.asarray(bb))


def test_trained_parts_score_raw_rows_as_the_run_did():
    """A client's part takes raw rows of its own views only and gives its final local accuracy; the
    server's takes every view and gives the final global accuracy (on the raw evaluation rows: the
    parts standardise inside)."""
    cfg = {"aggregation": "plain", "rounds": 2}
    models: dict = {}
    out = run(cfg, models=models)
    assert set(models) == {name for name, _ in PARTIES}
    algo = registry.get_algorithm("hyfem")
    s = parse_settings(hyfem.Settings, {**SMALL, **cfg})
    views, y, _, test, _ = raw_views(s)
    for name, part in models.items():
        module = algo.load_model(part.meta, part.tensors)
        assert check_part(module, part.meta) is None, name
        mine = part.meta["views"]
        if name == "server":
            assert part.meta["model"] == "hyfem/server" and mine == [0, 1, 2, 3]
            want = out["server"]["final_global_accuracy"]
        else:
            assert part.meta["model"] == "hyfem/client" and mine == out[name]["views"]
            want = out[name]["local_curve"][-1]["accuracy"]
        assert [i["name"] for i in part.meta["inputs"]] == [f"view{d}" for d in mine]
        assert part.meta["scaler"]["views"] == mine and part.meta["classes"] == list(range(10))
        logits = score(module, part.meta, {f"view{d}": views[d][test] for d in mine})
        # the run's accuracy is a float32 mean: compare the counts of right answers
        assert int((logits.argmax(1) == y[test]).sum()) == round(want * len(test)), name


ONE_HOLDER = {"scenario": "custom", "n_views": 4, "views_per_client": 1, "classes_per_client": 10,
              "unused_fraction": 0.0, "rounds": 1}


def test_a_view_with_one_holder_is_refused_under_secure_aggregation():
    with pytest.raises(Exception, match="allow_plain_views"):
        run({**ONE_HOLDER, "aggregation": "secure"})


def test_allow_plain_views_sends_single_holder_views_in_the_clear():
    srv = run({**ONE_HOLDER, "aggregation": "secure", "allow_plain_views": True})["server"]
    assert set(srv["view_aggregation"].values()) == {"plain (too few holders)"}
    assert np.isfinite(srv["global_accuracy"][-1])


@pytest.mark.unit
def test_settings_reject_bad_partitions():
    with pytest.raises(ValueError, match="views_per_client"):
        parse_settings(hyfem.Settings, {"scenario": "custom", "n_views": 3, "views_per_client": 4,
                                        "classes_per_client": 0.5, "unused_fraction": 0.0})
    with pytest.raises(ValueError, match="custom"):
        parse_settings(hyfem.Settings, {"scenario": "custom"})
    with pytest.raises(ValueError, match="divisor"):
        parse_settings(hyfem.Settings, {"dataset": "coil20", "scenario": "custom", "n_views": 5,
                                        "views_per_client": 2, "classes_per_client": 0.5,
                                        "unused_fraction": 0.0})


@pytest.mark.unit
def test_sizes_match_the_built_extractors():
    from fedhet.algorithms.hyfem.models import build_extractor, n_params
    for cfg in ({}, {"dataset": "coil20", "scenario": "custom", "n_views": 4, "views_per_client": 2,
                     "classes_per_client": 0.5, "unused_fraction": 0.0}):
        s = parse_settings(hyfem.Settings, cfg)
        sz = hyfem.sizes(s)
        for d, e in enumerate(hyfem.model_spec(s).extractors):
            assert sz[f"ext{d}"] == n_params(build_extractor(e))


@pytest.mark.processes
def test_process_run_passes_audit_and_no_label_shaped_array_leaves_a_client(tmp_path):
    fed = load(presets.path("hyfem"))
    run_dir = tmp_path / "run"
    over = {**SMALL, "rounds": 2}
    summary = launch(fed, run_dir, progress=False, timeout=240, overrides=over)
    rep = audit(run_dir)
    assert rep.ok, rep.problems[:5]
    s = parse_settings(hyfem.Settings, {**fed.algorithm_cfg(), **over})
    sz = hyfem.sizes(s)
    for name, party in summary["parties"].items():
        if not name.startswith("client"):
            continue
        res = party["result"]
        n_train = res["n_train"]
        recs = [json.loads(line) for line in
                (run_dir / "parties" / name / "transcript.jsonl").read_text().splitlines()]
        sent = [r for r in recs if r.get("dir") == "send"]
        kinds = {r["kind"] for r in sent}
        assert hyfem.Kind.INFERENCE in kinds and "secagg/masked" in kinds
        assert "agg/plain" not in kinds and hyfem.Kind.PLAIN_VIEW not in kinds
        for r in sent:
            for dt, shape in r.get("arrays") or []:
                # labels would be an integer vector of the client's rows (train or evaluation)
                assert not (dt.startswith(("<i", "|i", "<u8", "|u1")) and len(shape) == 1
                            and shape[0] in (n_train, 120)), (r["kind"], dt, shape)
                assert not shape or shape[0] != n_train, (r["kind"], dt, shape)
                if r["kind"] == hyfem.Kind.INFERENCE:
                    assert [dt, shape] == ["<f4", [sz["n_inference"]]]


@pytest.mark.processes
def test_12view_coil20_preset_runs_as_processes_and_passes_audit(tmp_path):
    fed = load(presets.path("hyfem_12view"))
    over = {"rounds": 1, "local_steps": 2, "max_rows": 200, "cnn_channels": 4, "embed_dim": 4,
            "inference_hidden": 8}
    summary = launch(fed, tmp_path / "run", progress=False, timeout=240, overrides=over)
    rep = audit(tmp_path / "run")
    assert rep.ok, rep.problems[:5]
    srv = summary["parties"]["server"]["result"]
    assert srv["dataset"] == "coil20" and len(srv["view_aggregation"]) == 12
    assert set(srv["view_aggregation"].values()) == {"secure"}
    assert all(len(v) == 9 for v in srv["client_views"].values())
    # the CNN extractors' parts: exported (weights, metadata, ONNX), loaded back identical
    ort = pytest.importorskip("onnxruntime")
    exported = export_run(tmp_path / "run", tmp_path / "export", registry.get_algorithm)
    assert set(exported) == set(summary["parties"])
    for name in ("server", "client1"):
        module, doc = load_export(exported[name], registry.get_algorithm)
        meta = doc["meta"]
        assert check_part(module, meta) is None, name
        assert "scaler" not in meta and {e["kind"] for e in meta["extractors"].values()} == {"cnn"}
        assert all(i["shape"] == [None, 1024] for i in meta["inputs"])
        rows = {k: np.asarray(v, dtype=np.float32) for k, v in meta["check"]["inputs"].items()}
        sess = ort.InferenceSession(str(exported[name] / "model.onnx"))
        got = sess.run(None, rows)[0]
        np.testing.assert_allclose(got, np.asarray(meta["check"]["outputs"]), rtol=1e-4, atol=1e-5)


@pytest.mark.unit
def test_audit_flags_a_plain_view_when_not_allowed():
    def kinds(cfg):
        return {d.kind for d in hyfem.declarations(parse_settings(hyfem.Settings, cfg))}
    assert hyfem.Kind.PLAIN_VIEW not in kinds({})   # undeclared: refused on receipt, flagged by the audit
    assert hyfem.Kind.PLAIN_VIEW not in kinds({"allow_plain_views": True, "aggregation": "plain"})
    assert hyfem.Kind.PLAIN_VIEW in kinds({"allow_plain_views": True})


@pytest.mark.unit
def test_loss_reduction_setting_reaches_the_local_update():
    assert parse_settings(hyfem.Settings, {}).config().loss_reduction == "mean"
    assert parse_settings(hyfem.Settings, {"loss_reduction": "sum"}).config().loss_reduction == "sum"
    with pytest.raises(ValueError, match="loss_reduction"):
        parse_settings(hyfem.Settings, {"loss_reduction": "max"})
