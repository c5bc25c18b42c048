"""Users' own data files (issue 10 item 8): each party reads its own CSV table.

The tables are built in tmp_path from one real table (scikit-learn's breast cancer set): every
client gets its own rows, the common columns by name and some columns of its own.  Bad input
fails before training with a message naming the party, file and row/column.
"""
from __future__ import annotations

import csv

import numpy as np
import pytest

from fedhet.algorithms.chfl.model import load_model
from fedhet.algorithms.scoring import check_part
from fedhet.parties.inmemory import run_inmemory

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

sklearn_datasets = pytest.importorskip("sklearn.datasets")

CLIENTS = ["c0", "c1", "c2"]


def _cancer() -> tuple[np.ndarray, np.ndarray]:
    d = sklearn_datasets.load_breast_cancer()
    order = np.random.default_rng(0).permutation(len(d.target))
    return d.data[order], d.target[order]


def write_csv(path, header: list[str], rows: list[list]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def read_csv(path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="") as f:
        r = list(csv.reader(f))
    return r[0], r[1:]


def edit_csv(path, row: int, column: str, value) -> None:
    header, rows = read_csv(path)
    rows[row][header.index(column)] = str(value)
    write_csv(path, header, rows)


def drop_column(path, column: str) -> None:
    header, rows = read_csv(path)
    j = header.index(column)
    write_csv(path, header[:j] + header[j + 1:], [r[:j] + r[j + 1:] for r in rows])


def _chfl_files(tmp_path) -> tuple[dict, dict]:
    """Three clients, disjoint rows; common f0..f5; each client its own 4 other columns."""
    X, y = _cancer()
    common = list(range(6))
    parts = np.array_split(np.arange(len(y)), len(CLIENTS))
    specs = {}
    for k, (name, rows) in enumerate(zip(CLIENTS, parts)):
        cols = common + [6 + 4 * k + j for j in range(4)]
        path = tmp_path / f"{name}.csv"
        write_csv(path, [f"f{c}" for c in cols] + ["label"],
                  [[repr(float(X[i, c])) for c in cols] + [int(y[i])] for i in rows])
        specs[name] = {"path": path.name, "label": "label", "classes": [0, 1]}
    cfg = {"dataset": "files", "common_features": [f"f{c}" for c in common], "n_classes": 2, "rounds": 3,
           "local_epochs": 2, "batch_size": 32, "hidden": [16], "lr": 3e-3, "seed": 0,
           "aggregation": "plain"}
    return cfg, specs


def _run_chfl(cfg, specs, tmp_path, models=None):
    parties = [("server", "server")] + [(c, "client") for c in CLIENTS]
    return run_inmemory("chfl", parties, cfg, seed=0, party_data=specs, base_dir=tmp_path, models=models)


def test_chfl_from_users_csv_files(tmp_path):
    cfg, specs = _chfl_files(tmp_path)
    models: dict = {}
    res = _run_chfl(cfg, specs, tmp_path, models)["server"]
    # each client's trained part names its own file's feature columns (common first) and classes
    for k, name in enumerate(CLIENTS):
        meta = models[name].meta
        assert meta["feature_names"] == [f"f{c}" for c in list(range(6)) + [6 + 4 * k + j for j in range(4)]]
        assert meta["classes"] == [0, 1] and meta["feature_names_from"] == "the client's file header"
        assert check_part(load_model(meta, models[name].tensors), meta) is None
    assert models["server"].meta["feature_names"] == cfg["common_features"]
    assert res["dataset"] == "files" and res["n_common"] == 6 and res["n_test"] == [38, 38, 38]
    # Breast cancer: always guessing the majority class scores about 0.63.
    assert res["final_test"]["chfl_mu=0.5"] > 0.75, res["final_test"]
    assert res["final_test"]["common"] > 0.75, res["final_test"]


@pytest.mark.parametrize("case", ["missing_file", "unknown_column", "nan", "bad_label", "common_missing"])
def test_chfl_bad_files_fail_before_training(tmp_path, case):
    cfg, specs = _chfl_files(tmp_path)
    path = tmp_path / "c1.csv"
    expect = []
    if case == "missing_file":
        specs["c1"] = {**specs["c1"], "path": "nowhere.csv"}
        expect = ["c1", "nowhere.csv"]
    elif case == "unknown_column":
        specs["c1"] = {**specs["c1"], "label": "lable"}
        expect = ["c1", "c1.csv", "lable"]
    elif case == "nan":
        edit_csv(path, 3, "f2", "nan")
        expect = ["c1", "c1.csv", "f2", "line 5"]
    elif case == "bad_label":
        edit_csv(path, 4, "label", 7)
        expect = ["c1", "c1.csv", "label", "7", "line 6"]
    elif case == "common_missing":
        drop_column(path, "f3")
        expect = ["c1", "c1.csv", "f3"]
    with pytest.raises(Exception) as ei:
        _run_chfl(cfg, specs, tmp_path)
    msg = str(ei.value)
    for word in expect:
        assert word in msg, (word, msg)
