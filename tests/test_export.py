"""A trained model leaves its run: each party's part is saved by its role (parties/model_store.py),
`fedhet export` writes safetensors, metadata and ONNX, and the loaded part scores exactly as the
trained one did (algorithms/scoring.py)."""
from __future__ import annotations

from dataclasses import replace

import json
import subprocess
import sys

import numpy as np
import pytest

from fedhet.algorithms import registry
from fedhet.algorithms.scoring import ExportError, check_part, score
from fedhet.parties.ops.export import export_run, load_export
from fedhet.parties.ops import presets
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import launch
from fedhet.parties.model_store import ModelFileError, make_part, read_part, write_part

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

PARTIES = [("server", "server"), ("c1", "client"), ("c2", "client")]


def _fedavg_parts(rounds=2):
    models: dict = {}
    out = run_inmemory("fedavg_logreg", PARTIES, {"rounds": rounds}, models=models)
    return out, models


def test_every_party_saves_its_part_and_the_client_part_is_what_it_would_deploy():
    out, models = _fedavg_parts()
    assert set(models) == {"server", "c1", "c2"}
    algo = registry.get_algorithm("fedavg_logreg")
    for name, part in models.items():
        assert part.header["algorithm"] == "fedavg_logreg" and part.header["party"] == name
        assert part.header["settings"]["rounds"] == 2
        module = algo.load_model(part.meta, part.tensors)
        assert check_part(module, part.meta) is None
        # the exported weights are the global model the run reports
        w = np.r_[part.tensors["weight"], part.tensors["bias"]]
        assert np.array_equal(w, np.asarray(out["server"]["weights"]))
    c1 = models["c1"]
    assert len(c1.meta["feature_names"]) == 30 and c1.meta["scaler"] and c1.meta["classes"] == [0, 1]
    # the client's part scores raw rows: its recorded classes reproduce part of the accuracy it reported
    rows = np.asarray(c1.meta["check"]["inputs"]["x"])
    probs = score(algo.load_model(c1.meta, c1.tensors), c1.meta, {"x": rows})
    assert probs.shape == (len(rows), 2) and np.allclose(probs.sum(1), 1)


def test_a_changed_weight_fails_the_round_trip_check():
    _, models = _fedavg_parts()
    part = models["c1"]
    algo = registry.get_algorithm("fedavg_logreg")
    bad = dict(part.tensors, bias=part.tensors["bias"] + 1e-9)
    assert "differ" in check_part(algo.load_model(part.meta, bad), part.meta)


def test_a_part_its_loader_cannot_read_is_refused_naming_the_file():
    from fedhet.algorithms.scoring import rebuild

    _, models = _fedavg_parts()
    part = models["c1"]
    algo = registry.get_algorithm("fedavg_logreg")
    broken = replace(part, tensors={k: v for k, v in part.tensors.items() if k != "bias"})
    with pytest.raises(ExportError, match=r"parties/c1/model/model\.json: 'fedavg_logreg' cannot rebuild this part: "
                                          r"KeyError: 'bias'"):
        rebuild(algo, broken, "parties/c1/model/model.json")


@pytest.mark.unit
def test_part_files_are_checked_and_errors_name_the_file(tmp_path):
    part = make_part({"w": np.arange(3.0)}, {"model": "x"})
    write_part(tmp_path / "m", part, {"algorithm": "fedavg_logreg"})
    back = read_part(tmp_path / "m")
    assert np.array_equal(back.tensors["w"], np.arange(3.0)) and back.meta == {"model": "x"}
    doc = json.loads((tmp_path / "m" / "model.json").read_text())
    doc["tensors"]["w"]["shape"] = [4]
    (tmp_path / "m" / "model.json").write_text(json.dumps(doc))
    with pytest.raises(ModelFileError, match=r"model.safetensors.*'w'"):
        read_part(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelFileError, match="model.safetensors: not a safetensors file"):
        read_part(tmp_path / "m")
    with pytest.raises(ModelFileError, match="missing"):
        read_part(tmp_path / "none")
    with pytest.raises(ValueError, match="JSON"):
        make_part({"w": np.zeros(2)}, {"f": object()})
    with pytest.raises(ValueError, match="numbers only"):
        make_part({"w": np.array(["a"])}, {})


@pytest.mark.processes
def test_process_run_exports_weights_metadata_and_onnx_that_score_the_same(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    fed = replace(load(presets.path("demo")), hosts=1)   # one host process: one torch import
    summary = launch(fed, tmp_path / "run", progress=False, overrides={"rounds": 2}, timeout=240)
    assert summary["ok"]
    out = tmp_path / "exp"
    p = subprocess.run([sys.executable, "-m", "fedhet.parties.ops.cli", "export", str(tmp_path / "run"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    names = {q.name for q in fed.parties}
    assert {q.name for q in out.iterdir()} == names
    for name in names:
        module, doc = load_export(out / name, registry.get_algorithm)
        meta = doc["meta"]
        for key in ("algorithm", "settings", "fedhet_version", "fingerprint", "run_id", "party", "role"):
            assert doc[key], key
        assert doc["run_id"] == summary["run_id"] and doc["fingerprint"]["algorithm"]["rounds"]
        assert meta["feature_names"] and meta["classes"] == [0, 1]
        assert check_part(module, meta) is None           # torch: identical to the trained part
        if meta.get("check"):
            rows = np.asarray(meta["check"]["inputs"]["x"])
            sess = ort.InferenceSession(str(out / name / "model.onnx"))
            got = sess.run(None, {"x": rows})[0]
            want = np.asarray(meta["check"]["outputs"])
            assert np.allclose(got, want, rtol=0, atol=1e-12)   # another runtime's kernels: the same to 1e-12
            assert np.array_equal(got.argmax(1), want.argmax(1))


@pytest.mark.unit
def test_export_of_a_run_without_parts_or_of_an_unknown_party_says_why(tmp_path):
    (tmp_path / "run" / "parties" / "a").mkdir(parents=True)
    with pytest.raises(ExportError, match="no party saved a trained part"):
        export_run(tmp_path / "run", tmp_path / "out", registry.get_algorithm)
    with pytest.raises(ExportError, match="no party 'b'"):
        export_run(tmp_path / "run", tmp_path / "out", registry.get_algorithm, party="b")
    with pytest.raises(ExportError, match="not a run folder"):
        export_run(tmp_path, tmp_path / "out", registry.get_algorithm)
