"""Users' own data files, end to end: CHFL and STFL read each party's CSV named in its section of
the federation, in memory and as processes (audited); bad files fail before training, naming the
party, the file, the row and the column."""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from fedhet.algorithms import registry
from fedhet.algorithms.party_table import PartyDataError
from fedhet.parties.audit import audit
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.launcher import launch

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

X, Y = load_breast_cancer(return_X_y=True)
NAMES = [f"f{i}" for i in range(X.shape[1])]


def _write(path: Path, header: list[str], rows) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


# ------------------------------------------------------------------ CHFL

def _chfl_files(tmp: Path) -> dict:
    """Two hospitals: disjoint rows; columns f0..f4 common, each its own further columns."""
    order = np.random.default_rng(0).permutation(len(Y))
    halves = np.array_split(order, 2)
    own_cols = [list(range(5, 15)), list(range(15, 30))]
    specs = {}
    for k, (rows, cols) in enumerate(zip(halves, own_cols)):
        header = ["id"] + NAMES[:5] + [NAMES[c] for c in cols] + ["label"]
        body = [[f"p{r}"] + [f"{v:.6g}" for v in X[r, :5]] + [f"{X[r, c]:.6g}" for c in cols] + [int(Y[r])]
                for r in rows]
        _write(tmp / f"hospital{k}.csv", header, body)
        specs[f"client{k + 1}"] = {"path": f"hospital{k}.csv", "label": "label", "classes": [0, 1],
                                   "ignore": ["id"]}
    return specs


CHFL_CFG = {"dataset": "files", "common_features": NAMES[:5], "n_classes": 2, "hidden": [16], "rounds": 4,
            "local_epochs": 2, "lr": 0.01, "aggregation": "plain"}
CHFL_PARTIES = [("server", "server"), ("client1", "client"), ("client2", "client")]


def test_chfl_runs_from_each_clients_own_csv(tmp_path):
    specs = _chfl_files(tmp_path)
    out = run_inmemory("chfl", CHFL_PARTIES, CHFL_CFG, party_data=specs, base_dir=tmp_path)
    assert out["server"]["n_common"] == 5
    assert out["client1"]["n_unique"] == 10 and out["client2"]["n_unique"] == 15
    assert out["server"]["selected"]["chfl_mu>0"]["mean_test"] > 0.85  # chance is about 0.63


def test_chfl_file_without_a_common_column_is_named(tmp_path):
    specs = _chfl_files(tmp_path)
    cfg = dict(CHFL_CFG, common_features=NAMES[:5] + ["f29"])  # f29 is only client2's
    with pytest.raises(FederationFailed) as e:
        run_inmemory("chfl", CHFL_PARTIES, cfg, party_data=specs, base_dir=tmp_path)
    msg = str(e.value)
    assert "'client1'" in msg and "hospital0.csv" in msg and "f29" in msg


# ------------------------------------------------------------------ STFL

def _stfl_files(tmp: Path, mutate=None) -> dict:
    """The host holds f0..f9 and the label of 80 % of the rows; the guest f10..f29 of every row
    but a few (its extra rows are its self-taught rows)."""
    rng = np.random.default_rng(1)
    ids = np.array([f"u{i:04d}" for i in range(len(Y))])
    host_rows = np.sort(rng.permutation(len(Y))[: int(0.8 * len(Y))])
    guest_rows = np.sort(rng.permutation(len(Y))[: len(Y) - 10])
    host = [[ids[r]] + [f"{v:.6g}" for v in X[r, :10]] + [int(Y[r])] for r in host_rows]
    guest = [[ids[r]] + [f"{v:.6g}" for v in X[r, 10:]] for r in guest_rows]
    if mutate is not None:
        mutate(host, guest)
    _write(tmp / "host.csv", ["id"] + NAMES[:10] + ["label"], host)
    _write(tmp / "guest.csv", ["id"] + NAMES[10:], guest)
    return {"host": {"path": "host.csv", "id": "id", "label": "label", "classes": [0, 1]},
            "guest": {"path": "guest.csv", "id": "id"}}


STFL_CFG = {"dataset": "files", "guest_features": [20], "n_classes": 2, "epochs": 30, "vae_epochs": 30}
STFL_PARTIES = [("host", "host"), ("guest", "guest")]


def test_stfl_runs_from_each_partys_own_csv(tmp_path):
    specs = _stfl_files(tmp_path)
    out = run_inmemory("stfl", STFL_PARTIES, STFL_CFG, party_data=specs, base_dir=tmp_path)
    assert out["host"]["test_accuracy"] > 0.85


@pytest.mark.processes
def test_stfl_from_files_as_processes_passes_the_audit(tmp_path):
    specs = _stfl_files(tmp_path)
    lines = ["[federation]", 'name = "files"', "timeout = 120", "", "[algorithm]", 'name = "stfl"',
             'dataset = "files"', "guest_features = [20]", "n_classes = 2", "epochs = 5", "vae_epochs = 5"]
    for name, role in STFL_PARTIES:
        spec = ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in specs[name].items())
        lines += ["", "[[party]]", f'name = "{name}"', f'role = "{role}"', 'endpoint = "tcp://127.0.0.1:0"',
                  f"data = {{ {spec} }}"]
    (tmp_path / "fed.toml").write_text("\n".join(lines) + "\n")
    fed = load(tmp_path / "fed.toml")
    summary = launch(fed, tmp_path / "run", progress=False, timeout=240)
    assert summary["parties"]["host"]["result"]["test_accuracy"] > 0.6
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    assert "host.csv" not in (tmp_path / "run" / "config.json").read_text()  # local paths stay local


def _bad_nan(host, guest):
    guest[3][5] = "nan"


def _bad_dup(host, guest):
    host[4][0] = host[2][0]


def _bad_label(host, guest):
    host[6][-1] = 7


def _bad_text(host, guest):
    host[1][3] = "12 kg"


@pytest.mark.parametrize("mutate, party, words", [
    (_bad_nan, "guest", ["guest.csv", "data row 4", "column 'f14'", "NaN"]),
    (_bad_dup, "host", ["host.csv", "data row 5", "column 'id'", "duplicate ID", "data row 3"]),
    (_bad_label, "host", ["host.csv", "data row 7", "column 'label'", "'7'"]),
    (_bad_text, "host", ["host.csv", "data row 2", "column 'f2'", "'12 kg'"]),
])
def test_stfl_bad_files_fail_before_training_naming_party_file_row_and_column(tmp_path, mutate, party, words):
    specs = _stfl_files(tmp_path, mutate)
    with pytest.raises(FederationFailed) as e:
        run_inmemory("stfl", STFL_PARTIES, STFL_CFG, party_data=specs, base_dir=tmp_path, timeout=30)
    err = e.value.failures[party]
    assert isinstance(err, PartyDataError), err
    for w in [f"party '{party}'"] + words:
        assert w in str(err), (w, str(err))


def test_stfl_missing_file_unknown_column_and_width_are_named(tmp_path):
    specs = _stfl_files(tmp_path)
    cases = [
        (dict(specs, guest={"path": "nowhere.csv", "id": "id"}), "guest", ["nowhere.csv", "not found"]),
        (dict(specs, host=dict(specs["host"], label="lable")), "host", ["'lable'", "did you mean 'label'"]),
    ]
    for party_data, party, words in cases:
        with pytest.raises(FederationFailed) as e:
            run_inmemory("stfl", STFL_PARTIES, STFL_CFG, party_data=party_data, base_dir=tmp_path, timeout=30)
        msg = str(e.value.failures[party])
        for w in [f"party '{party}'"] + words:
            assert w in msg, (w, msg)
    with pytest.raises(FederationFailed) as e:
        run_inmemory("stfl", STFL_PARTIES, dict(STFL_CFG, guest_features=[19]), party_data=specs,
                     base_dir=tmp_path, timeout=30)
    msg = str(e.value.failures["guest"])
    assert "party 'guest'" in msg and "guest.csv" in msg and "20" in msg and "19" in msg
