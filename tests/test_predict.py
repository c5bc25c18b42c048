"""`fedhet predict`: every installed algorithm that trains a model scores new rows as a federation job.

For each algorithm with a model loader and a prediction job: its smoke federation trains in memory, its
parts are written as a run writes them and exported (`fedhet export`'s files), and new rows (made from
each part's own check rows, so the values are in the range it was trained on) are scored in memory and
as processes (audited).  Both give the same CSV, equal to plaintext scoring of the same rows with the
EXPORTED modules (`load_export` + `score`), exactly.  Vertical algorithms' parties hold different IDs:
the rows some party lacks are reported, by party, never dropped silently.  Bad parts and files are
refused with errors that name the file and the field.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.predict_throughput import job_layout, plaintext_vertical, smoke, train, write_rows
from fedhet.algorithms import registry
from fedhet.algorithms.scoring import score
from fedhet.parties.ops.export import export_run, load_export
from fedhet.algorithms.party_table import DataFileError, TableSpec, load_party_table
from fedhet.parties.ops.predict import job_federation
from fedhet.algorithms.predict import (MISSING, PREDICTIONS, Horizontal, PredictError, Vertical,
                                       own_rows, read_predictions)
from fedhet.parties.audit import audit
from fedhet.parties.federation import Federation
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.launcher import launch
from fedhet.protocols import psi

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

N_ROWS = 40
# run as processes in the default suite (one vertical here; a horizontal one through the command line below);
# the others with --runslow
FAST_PROCESSES = ("stfl",)


def predicting() -> list[str]:
    return [n for n in registry.names() if registry.get_algorithm(n).predict is not None]


# ------------------------------------------------------------------------------------ a trained run
class Trained:
    """An algorithm's smoke federation trained in memory: its parts written as a run writes them
    (RUN/parties/<name>/model/) and exported; the new rows of each scoring party in FOLDER/<name>.csv."""

    def __init__(self, name: str, folder: Path, fed: Federation | None = None) -> None:
        self.name, self.folder = name, folder
        self.fed = fed or smoke(name)
        self.algo = registry.get_algorithm(name)
        self.job = registry.get_algorithm(name + ".predict")
        self.layout: Any = self.job_layout()
        self.parties = [(p.name, p.role) for p in self.fed.parties]
        self.run = folder / "run"
        models = train(self.fed, self.run)
        self.exported = export_run(self.run, folder / "export", registry.get_algorithm, onnx=False)
        self.spec = self.new_rows(models)

    def job_layout(self):
        return job_layout(self.name)

    def scoring(self) -> list[str]:
        lay = self.layout
        roles = (lay.scoring_role,) if isinstance(lay, Horizontal) else (lay.label_role, *lay.feature_roles)
        return [n for n, r in self.parties if r in roles]

    def label(self) -> str:
        return next(n for n, r in self.parties if r == self.layout.label_role)

    def new_rows(self, models: dict) -> dict[str, dict]:
        """Each scoring party's file: rows near its part's check rows; vertical feature party j lacks
        r{3+j} and r17, holds two IDs nobody else has, and lists its rows in another order."""
        rng = np.random.default_rng(7)
        spec = {}
        feature = [n for n in self.scoring() if isinstance(self.layout, Vertical) and n != self.label()]
        for party in self.scoring():
            ids = [f"r{i}" for i in range(N_ROWS)]
            if party in feature:
                j = feature.index(party)
                ids = [i for i in ids if i not in (f"r{3 + j}", "r17")] + [f"x{j}a", f"x{j}b"]
                ids = [ids[i] for i in rng.permutation(len(ids))]
            spec[party] = write_rows(models[party].meta, ids, self.folder / f"{party}.csv", rng)
        return spec

    def cfg(self, out: Path, **extra: Any) -> dict:
        return {**self.fed.algorithm_cfg(), "trained_run": str(self.run), "predictions_out": str(out), **extra}

    def in_memory(self, out: Path, **extra: Any) -> dict:
        return run_inmemory(self.job, self.parties, self.cfg(out, **extra), seed=self.fed.seed, party_data=self.spec,
                            base_dir=self.folder, timeout=120)

    def table(self, party: str):
        return load_party_table(TableSpec.from_dict(self.spec[party], party=party, base_dir=self.folder))

    def module(self, party: str):
        return load_export(self.exported[party], registry.get_algorithm)

    def plaintext(self) -> dict[str, tuple[list, np.ndarray]]:
        """Scoring party -> (IDs, probabilities) computed in one process with the exported modules."""
        lay = self.layout
        if isinstance(lay, Horizontal):
            out = {}
            for party in self.scoring():
                module, doc = self.module(party)
                t = self.table(party)
                out[party] = ([str(i) for i in t.ids], lay.probabilities(doc["meta"], score(module, doc["meta"],
                                                                                           own_rows(doc["meta"], t))))
            return out
        label = self.label()
        tables = {p: self.table(p) for p in [label, *[n for n in self.scoring() if n != label]]}
        order, probs = plaintext_vertical(self.name, self.algo.parse(self.fed.algorithm_cfg()), tables,
                                          {p: self.module(p) for p in tables}, self.exported, label)
        return {label: ([str(i) for i in order], probs)}


_TRAINED: dict[str, Trained] = {}


@pytest.fixture
def trained(request, tmp_path_factory) -> Trained:
    name = request.param
    if name not in _TRAINED:
        _TRAINED[name] = Trained(name, tmp_path_factory.mktemp(f"trained-{name}"))
    return _TRAINED[name]


def fixed_point(t: Trained) -> bool:
    """F³ on shares (fusion "shamir_linear" or "mpc") computes its first layer in fixed point: not bit-exact."""
    return t.name == "f3" and t.fed.algorithm_cfg().get("fusion", "shamir_linear") != "trusted"


def check_predictions(t: Trained, out: Path) -> None:
    """Every scoring party's CSV equals plaintext scoring of the same rows, exactly (F³ on shares: to 1e-4,
    the same classes wherever the plaintext's two best differ by more)."""
    for party, (ids, probs) in t.plaintext().items():
        got_ids, got_classes, got = read_predictions(out / "parties" / party / PREDICTIONS)
        probs = np.asarray(probs, dtype=np.float64)
        assert got_ids == ids, (t.name, party)
        assert got.shape == probs.shape, (t.name, party)
        classes = [str(c) for c in t.module(party)[1]["meta"]["classes"]]
        want = [classes[i] for i in np.argmax(probs, axis=1)]
        if fixed_point(t):
            assert np.abs(got - probs).max() < 1e-4, (t.name, party)
            top2 = np.sort(probs, axis=1)[:, -2:]
            clear = top2[:, 1] - top2[:, 0] > 1e-4
            assert [c for c, ok in zip(got_classes, clear) if ok] == [c for c, ok in zip(want, clear) if ok]
            continue
        assert np.array_equal(got, probs), (t.name, party)
        assert got_classes == want
    others = set(n for n, _ in t.parties) - set(t.plaintext())
    assert not any((out / "parties" / n / PREDICTIONS).exists() for n in others), "predictions only at the scorer(s)"


def check_missing(t: Trained, out: Path, results: dict) -> None:
    if not isinstance(t.layout, Vertical):
        return
    label = t.label()
    feature = [n for n in t.scoring() if n != label]
    lines = (out / "parties" / label / MISSING).read_text().splitlines()
    assert lines[0] == "ID,missing_at"
    got = dict(line.split(",") for line in lines[1:])
    want = {"r17": ";".join(feature), **{f"r{3 + j}": p for j, p in enumerate(feature)}}
    assert got == want
    res = results[label]
    assert res["n_missing"] == len(want) and res["n_predicted"] == N_ROWS - len(want)
    assert res["missing_by_party"] == {p: 2 for p in feature}
    for p in feature:   # its own two IDs nobody else has, and the one each other feature party lacks
        assert results[p]["n_unmatched"] == 2 + len(feature) - 1


@pytest.mark.parametrize("trained", predicting(), indirect=True)
def test_in_memory_predictions_equal_plaintext_scoring_of_the_exported_parts(trained, tmp_path):
    out = tmp_path / "pred"
    results = trained.in_memory(out)
    check_predictions(trained, out)
    check_missing(trained, out, results)
    if isinstance(trained.layout, Vertical):   # "auto" at 40 rows: the label party chose ecdh, all followed
        assert {r["psi_backend"] for n, r in results.items() if n in trained.scoring()} == {psi.choose_backend(N_ROWS)}


def vertical() -> list[str]:
    return [n for n in predicting() if isinstance(job_layout(n), Vertical)]


@pytest.mark.parametrize("backend", ["kkrt", "rr22"])   # "auto" (ecdh at these sizes): the test above
@pytest.mark.parametrize("trained", vertical(), indirect=True)
def test_every_psi_backend_aligns_the_new_rows_to_the_same_predictions(trained, backend, tmp_path):
    """Issue 49: ``predict_psi_backend`` picks the PSI that aligns the new rows; every backend gives the
    plaintext's predictions and missing rows, and each aligning party records the backend in force."""
    out = tmp_path / "pred"
    results = trained.in_memory(out, predict_psi_backend=backend)
    check_predictions(trained, out)
    check_missing(trained, out, results)
    assert {r["psi_backend"] for n, r in results.items() if n in trained.scoring()} == {backend}


@pytest.mark.processes
@pytest.mark.parametrize("trained", [pytest.param(n, marks=() if n in FAST_PROCESSES else pytest.mark.slow)
                                     for n in predicting()], indirect=True)
def test_processes_give_the_same_predictions_and_pass_the_audit(trained, tmp_path):
    fed = replace(trained.fed, parties=[replace(p, data=trained.spec.get(p.name, {})) for p in trained.fed.parties],
                  base_dir=str(trained.folder))
    if len(fed.parties) >= 4:
        fed = replace(fed, hosts=2)
    out = tmp_path / "pred"
    summary = launch(job_federation(fed, trained.run, out), out, progress=False, algorithm=trained.job, timeout=240)
    assert summary["ok"]
    rep = audit(out, registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    check_predictions(trained, out)
    check_missing(trained, out, {n: p["result"] for n, p in summary["parties"].items()})


def test_f3_with_trusted_fusion_predicts_exactly_what_its_exported_parts_give(tmp_path):
    fed = smoke("f3")
    fed = replace(fed, parties=[p for p in fed.parties if p.role != "holder"],
                  algorithm={**fed.algorithm, "fusion": "trusted"})
    t = Trained("f3", tmp_path, fed)
    assert not fixed_point(t)
    results = t.in_memory(tmp_path / "pred")
    check_predictions(t, tmp_path / "pred")
    check_missing(t, tmp_path / "pred", results)
    assert results["coordinator"]["fusion"] == "trusted"


@pytest.mark.unit
def test_every_algorithm_that_trains_a_model_can_predict():
    trains = [n for n in registry.names() if registry.get_algorithm(n).load_model is not None]
    assert trains and predicting() == trains


# ------------------------------------------------------------------------------------ refusals
@pytest.mark.parametrize("trained", ["stfl"], indirect=True)
def test_a_part_that_does_not_fit_is_refused_naming_file_and_field(trained, tmp_path):
    model_json = trained.run / "parties" / "guest" / "model" / "model.json"
    saved = model_json.read_text()
    try:
        with pytest.raises(FederationFailed) as e:
            trained.in_memory(tmp_path / "a", epochs=3)
        err = e.value.failures["guest"]
        assert isinstance(err, PredictError) and "guest/model/model.json: field 'settings.epochs' is 2" in str(err)
        doc = json.loads(saved)
        doc["algorithm"] = "he_split"
        model_json.write_text(json.dumps(doc))
        with pytest.raises(FederationFailed, match=r"guest/model/model.json: field 'algorithm' is 'he_split'"):
            trained.in_memory(tmp_path / "c")
        doc = json.loads(saved)
        doc["fingerprint"] = {"parties": "0" * 16}
        model_json.write_text(json.dumps(doc))
        with pytest.raises(FederationFailed, match=r"field 'fingerprint.parties'.*trained by another federation"):
            trained.in_memory(tmp_path / "d")
    finally:
        model_json.write_text(saved)


@pytest.mark.parametrize("trained", ["stfl"], indirect=True)
def test_new_rows_whose_columns_differ_from_the_part_are_refused_naming_file_and_column(trained, tmp_path):
    path = trained.folder / "host.csv"
    saved = path.read_text()
    header, rest = saved.split("\n", 1)
    cols = header.split(",")
    try:
        path.write_text(",".join([cols[0], cols[2], cols[1], *cols[3:]]) + "\n" + rest)
        with pytest.raises(FederationFailed) as e:
            trained.in_memory(tmp_path / "a")
        err = e.value.failures["host"]
        assert isinstance(err, DataFileError) and "host.csv" in str(err) and "another order" in str(err)
        path.write_text(",".join([cols[0], "nope", *cols[2:]]) + "\n" + rest)
        with pytest.raises(FederationFailed, match=r"host.csv.*feature column 1 is 'nope', but its trained part "
                                                   r"\(.*host/model/model.json, field 'feature_names'\)"):
            trained.in_memory(tmp_path / "b")
    finally:
        path.write_text(saved)
    assert (trained.folder / "host.csv").read_text() == saved


@pytest.mark.processes
@pytest.mark.parametrize("trained", ["fedavg_logreg"], indirect=True)
def test_the_command_line_predicts_and_the_audit_passes(trained, tmp_path):
    """`fedhet predict` scores a file per client, `fedhet audit` checks the job."""
    t = trained
    fed_text = (Path(str(resources.files("fedhet.algorithms.fedavg_logreg") / "smoke.toml"))).read_text()
    for party in t.scoring():
        fed_text = fed_text.replace(f'name = "{party}"\n', f'name = "{party}"\ndata = {{ path = "{party}.csv", '
                                                           f'id = "id" }}\n')
    fed_text = fed_text.replace("[federation]\n", "[federation]\nhosts = 1\n", 1)   # one host process: one torch import
    (t.folder / "predict.toml").write_text(fed_text)
    cli = [sys.executable, "-m", "fedhet.parties.ops.cli"]
    p = subprocess.run(cli + ["predict", str(t.folder / "predict.toml"), "--model", str(t.run), "--out",
                              str(tmp_path / "pred"), "--no-progress"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    check_predictions(t, tmp_path / "pred")
    p = subprocess.run(cli + ["audit", str(tmp_path / "pred"), "--trust-folder-keys"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.unit
def test_the_job_federation_names_the_job_and_its_folders_and_can_be_run_again(tmp_path):
    (tmp_path / "run" / "parties").mkdir(parents=True)
    fed = smoke("stfl")
    job = job_federation(fed, tmp_path / "run", tmp_path / "pred")
    assert job.algorithm["name"] == "stfl.predict" and job.algorithm["epochs"] == fed.algorithm["epochs"]
    assert job.algorithm["trained_run"] == str((tmp_path / "run").resolve())
    again = job_federation(job, tmp_path / "run", tmp_path / "pred2")   # a job's own federation file, reused
    assert again.algorithm == {**job.algorithm, "predictions_out": str((tmp_path / "pred2").resolve())}
    # a job's federation file may choose its PSI (issue 49): the key carries over, the folders do not
    chosen = replace(job, algorithm={**job.algorithm, "predict_psi_backend": "rr22", "predictions_out": "elsewhere"})
    again = job_federation(chosen, tmp_path / "run", tmp_path / "pred3")
    assert again.algorithm["predict_psi_backend"] == "rr22"
    assert again.algorithm["predictions_out"] == str((tmp_path / "pred3").resolve())
    assert registry.get_algorithm("stfl.predict").parse({k: v for k, v in again.algorithm.items()
                                                         if k != "name"}).job.predict_psi_backend == "rr22"
    with pytest.raises(ValueError, match="not a run folder"):
        job_federation(fed, tmp_path / "nowhere", tmp_path / "pred")
    with pytest.raises(ValueError, match=r"sets \['trained_run'\]"):
        job_federation(replace(fed, algorithm={**fed.algorithm, "trained_run": "x"}), tmp_path / "run", tmp_path / "p")
