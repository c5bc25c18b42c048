"""Issue 26, items 8-14: the headline shown in full, a strict federation file, settings checked
before launch, brackets kept in messages, hints that work, ``keys --update`` that keeps the
user's file, and arrays checked through the Python API.

The CLI runs in-process (``fedhet.parties.ops.cli.main``); where a run would start parties,
``launch`` or ``subprocess.Popen`` is replaced, so no test here starts a process.
"""
from __future__ import annotations

import ast
import copy
import re
import shlex
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from fedhet.parties.ops import cli, launcher
from fedhet.parties.ops.engines import local as local_engine
from fedhet.parties.ops.cli import main
from fedhet.parties.federation import FederationError, check_keys_present, from_dict, load

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]

GOOD = {
    "federation": {"name": "t", "key_dir": "keys"},
    "algorithm": {"name": "fedavg_logreg", "rounds": 2},
    "party": [{"name": "server", "role": "server", "endpoint": "tcp://127.0.0.1:5000"},
              {"name": "client1", "role": "client", "endpoint": "tcp://127.0.0.1:5001",
               "data": {"path": "c1.csv", "label": "y"}}],
}


def flat(text: str) -> str:
    """Rich wraps long lines at spaces: compare text with every run of whitespace made one space."""
    return " ".join(text.split())


@pytest.fixture
def console(monkeypatch):
    """The CLI's console at a narrow terminal's width (what `fedhet run > log` gets)."""
    c = Console(width=80)
    monkeypatch.setattr(cli, "console", c)
    return c


@pytest.fixture
def no_party_starts(monkeypatch):
    def refuse(*a, **kw):
        raise AssertionError(f"a party process was started: {a[0] if a else kw}")
    monkeypatch.setattr(local_engine.subprocess, "Popen", refuse)


# ------------------------------------------------------------------------- item 8: headline

def test_chfl_hyfem_mmvfl_declare_their_final_accuracy_as_headline():
    from fedhet.algorithms import registry

    assert "final_global_accuracy" in registry.get_algorithm("hyfem").headline
    assert "final_test" in registry.get_algorithm("chfl").headline
    assert "accuracy" in registry.get_algorithm("mmvfl").headline
    for name in registry.names():  # every algorithm that trains a model names its accuracy
        if name not in ("psi", "shamir", "secagg_bench"):
            assert registry.get_algorithm(name).headline, name


def _hyfem_summary() -> dict:
    server = {"rounds": 20, "clients": 4, "method": "hyfem", "mu": 0.1, "dataset": "handwritten",
              "scenario": "hybrid", "max_mean_error_bound": 1.5e-9, "note": "a long note " * 5,
              "final_global_accuracy": 0.8123456, "final_local_accuracy": 0.7012345,
              "global_accuracy": [0.5, 0.7, 0.8123456]}
    client = {"round": 20, "local_accuracy": 0.69, "n_test": 400}
    tr = {"bytes_sent_total": 123456789, "bytes_received_total": 987654321}
    return {"wall_s": 12.5, "parties": {
        "server": {"role": "server", "result": server, "traffic": tr, "wall_s": 12.3},
        "client1": {"role": "client", "result": client, "traffic": tr, "wall_s": 12.1}}}


def test_end_of_run_table_shows_the_headline_in_full(monkeypatch, console, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "launch", lambda *a, **kw: _hyfem_summary())
    assert main(["run", "hyfem", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "final_global_accuracy=0.8123" in out  # one unbroken token, not "final_global_accu…"
    assert "final_local_accuracy=0.7012" in out


def test_end_of_run_table_shows_the_epsilon_a_dp_run_spent(monkeypatch, console, capsys, tmp_path):
    summary = _hyfem_summary()
    summary["parties"]["client1"]["result"]["privacy"] = {"epsilon": 2.3861, "delta": 1e-5, "unit": "record"}
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(launcher, "launch", lambda *a, **kw: summary)
    assert main(["run", "hyfem", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "epsilon=2.39 (delta 1e-05, record)" in out
    assert out.count("epsilon=") == 1   # the server ran without a ledger: nothing claimed for it


# ---------------------------------------------------------------- item 9: strict federation file

@pytest.mark.parametrize("change,where,bad,near", [
    (lambda d: d["federation"].update(timout=120), "[federation]", "timout", "timeout"),
    (lambda d: d["party"][1].update(endpont="tcp://x:1"), "[[party]] #2 'client1'", "endpont", "endpoint"),
    (lambda d: d["party"][1]["data"].update(lable="y"), "[[party]] #2 'client1' data", "lable", "label"),
])
def test_unknown_keys_are_refused_naming_file_section_key_and_closest(change, where, bad, near):
    d = copy.deepcopy(GOOD)
    change(d)
    with pytest.raises(FederationError) as e:
        from_dict(d, source="fed.toml")
    msg = str(e.value)
    assert msg.startswith("fed.toml: ") and where in msg
    assert f"unknown key {bad!r} (did you mean {near!r}?)" in msg


def test_a_typo_in_a_file_is_refused_at_load(tmp_path):
    f = tmp_path / "fed.toml"
    f.write_text(from_dict(GOOD).to_toml().replace("[federation]\n", "[federation]\ntimout = 120\n"))
    with pytest.raises(FederationError, match=re.escape(f"{f}: [federation]: unknown key 'timout' (did you "
                                                        "mean 'timeout'?)")):
        load(f)


# ----------------------------------------------------------- item 10: settings before any party

def test_a_bad_set_value_fails_before_any_party_and_leaves_no_run_folder(tmp_path, console, capsys,
                                                                         no_party_starts):
    out_dir = tmp_path / "run"
    assert main(["run", "demo", "--set", "round=5", "--out", str(out_dir), "--no-progress"]) == 2
    out = flat(capsys.readouterr().out)
    assert "'round' (did you mean 'rounds'?)" in out and "no party was started" in out
    assert not out_dir.exists()


def test_stfl_files_needs_its_keys_before_launch(tmp_path, console, capsys, no_party_starts):
    out_dir = tmp_path / "run"
    assert main(["run", "stfl", "--set", "dataset=files", "--out", str(out_dir), "--no-progress"]) == 2
    out = flat(capsys.readouterr().out)
    assert "guest_features" in out and "no party was started" in out
    assert main(["run", "stfl", "--set", "dataset=files", "--set", "guest_features=[20]",
                 "--out", str(out_dir), "--no-progress"]) == 2
    assert "n_classes" in flat(capsys.readouterr().out)
    assert not out_dir.exists()


def test_the_keys_a_files_run_needs_are_documented():
    assert "docs/user_data.md" in (ROOT / "README.md").read_text()  # the README links the page that lists them
    text = (ROOT / "docs/user_data.md").read_text()
    for key in ("guest_features", "n_classes", "common_features"):
        assert key in text, key


# ---------------------------------------------------------------- item 11: brackets survive

def test_brackets_survive_in_cli_messages(tmp_path, monkeypatch, console, capsys, no_party_starts):
    d = copy.deepcopy(GOOD)
    d["party"][0]["colour"] = "red"
    f = tmp_path / "fed.toml"
    f.write_text(from_dict(GOOD).to_toml().replace('role = "server"', 'role = "server"\ncolour = "red"'))
    assert main(["run", str(f)]) == 2
    assert "[[party]] #1 'server'" in flat(capsys.readouterr().out)

    assert main(["run", "stfl", "--set", "dataset=files", "--out", str(tmp_path / "r")]) == 2
    assert "guest_features = [input width of each guest]" in flat(capsys.readouterr().out)

    reason = ("DataFileError: party 'guest1', file 'g.csv': has 5 feature columns (a, b, c, d, e), "
              "but guest_features in [algorithm] expects 6")

    def failing(*a, **kw):
        raise launcher.RunFailed("guest1", reason, tmp_path)
    monkeypatch.setattr(launcher, "launch", failing)
    assert main(["run", "stfl", "--no-progress"]) == 1
    assert "in [algorithm] expects 6" in flat(capsys.readouterr().out)


def test_describe_keeps_algorithm_in_its_title(console, capsys):
    assert main(["presets", "--describe", "stfl"]) == 0
    out = flat(capsys.readouterr().out)
    assert "[algorithm] settings of stfl" in out
    assert "[[party]] data" in out  # a setting's own doc text keeps its brackets too
    # issue 49: which PSI backend the preset runs, and why
    assert 'PSI (psi_backend, the default): psi_backend = "auto": the label owner picks' in out


def test_describe_names_the_psi_backend_a_preset_sets():
    rows = [{"key": "psi_backend", "default": "auto"}, {"key": "predict_psi_backend", "default": "auto"},
            {"key": "seed", "default": 0}]
    got = cli.psi_backend_lines(rows, {"psi_backend": "rr22"})
    assert len(got) == 2 and got[0].startswith('PSI (psi_backend, set by this preset): psi_backend = "rr22" at every size')
    assert got[1].startswith('PSI (predict_psi_backend, the default): predict_psi_backend = "auto"')
    assert cli.psi_backend_lines(rows[2:], None) == []


# ------------------------------------------------------------------------ item 12: hints

def _flags_named_in_messages() -> set[str]:
    """Every --flag in a string of parties/ and algorithms/ (docstrings left out)."""
    found: set[str] = set()
    for folder in ("parties", "algorithms"):
        for py in (ROOT / folder).glob("*.py"):
            tree = ast.parse(py.read_text())
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                    and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                    found |= set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", n.value))
    return found


def _cli_flags() -> set[str]:
    import argparse

    ap = cli.build_parser()
    flags = {o for a in ap._actions for o in a.option_strings}
    for a in ap._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                flags |= {o for b in sub._actions for o in b.option_strings}
    return flags


def test_hints_name_only_flags_that_exist():
    named = _flags_named_in_messages()
    assert "--data-dir" in named  # the data folder hint
    assert named <= _cli_flags(), sorted(named - _cli_flags())


def test_run_and_party_take_data_dir(tmp_path, monkeypatch):
    seen = {}

    def fake_launch(fed, *a, **kw):
        seen["data_dir"] = fed.data_dir
        return {"wall_s": 0.0, "parties": {}}
    monkeypatch.setattr(launcher, "launch", fake_launch)
    assert main(["run", "demo", "--data-dir", str(tmp_path), "--no-progress"]) == 0
    assert seen["data_dir"] == str(tmp_path.resolve())
    args = cli.build_parser().parse_args(["party", "f.toml", "--name", "s", "--data-dir", "d"])
    assert args.data_dir == "d"


@pytest.mark.parametrize("keys_made_before", [False, True])
def test_the_missing_keys_hint_is_a_command_that_fixes_it(tmp_path, monkeypatch, keys_made_before):
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "fed.toml"
    f.write_text(from_dict(GOOD, source=str(f), base_dir=tmp_path).to_toml())
    if keys_made_before:  # keys made (and printed) without --update: the file still lacks them
        assert main(["keys", str(f)]) == 0
    with pytest.raises(FederationError) as e:
        check_keys_present(load(f))
    cmd = re.findall(r"`(fedhet keys [^`]*)`", str(e.value))[0]
    assert main(shlex.split(cmd)[1:]) == 0
    check_keys_present(load(f))


def test_a_preset_name_that_is_also_a_folder_is_an_explicit_error(tmp_path, monkeypatch, console, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hyfem").mkdir()
    assert main(["run", "hyfem"]) == 2
    out = flat(capsys.readouterr().out)
    assert "'hyfem' is both a preset and a folder here" in out and "hyfem/federation.toml" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"fedhet {version('fedhet')}"


# ---------------------------------------------------------- item 13: keys --update keeps the file

KEPT = """\
# Our federation: keep this comment.
[federation]
name = "t"            # a trailing comment
key_dir = "keys"

[algorithm]
name = "fedavg_logreg"
rounds = 2

# the server runs on the big machine
[[party]]
name = "server"
role = "server"
endpoint = "tcp://127.0.0.1:5000"

[[party]]
name = "client1"
role = "client"
endpoint = "tcp://127.0.0.1:5001"

[party.data]                 # the client's own table
path = "c1.csv"
label = "y"
"""


def test_keys_update_keeps_comments_and_layout_and_writes_no_defaults(tmp_path):
    f = tmp_path / "fed.toml"
    f.write_text(KEPT)
    assert main(["keys", str(f), "--update"]) == 0
    text = f.read_text()
    lines = text.splitlines()
    it = iter(lines)
    assert all(any(line == got for got in it) for line in KEPT.splitlines())  # every line kept, in order
    added = [ln for ln in lines if ln not in KEPT.splitlines()]
    assert len(added) == 4 and all(re.match(r'^(public_key|sign_key) = "', ln) for ln in added), added
    for default in ("timeout", "seed", "max_message_mb"):
        assert default not in text
    check_keys_present(load(f))
    first = {p.name: p.public_key for p in load(f).parties}
    assert main(["keys", str(f), "--update", "--force"]) == 0  # new keys replace the values in place
    again = f.read_text().splitlines()
    assert len(again) == len(lines) and all(a == b for a, b in zip(again, lines) if "_key = " not in a)
    assert all(p.public_key != first[p.name] for p in load(f).parties)


# ----------------------------------------------------------- item 14: arrays through the API

def test_a_nan_in_client_rows_is_refused_naming_party_argument_row_and_column():
    from fedhet.algorithms import chfl
    from fedhet.algorithms.chfl.experiments import run_table
    from fedhet.algorithms.partition import chfl_partition
    from fedhet.algorithms.party_table import DataFileError

    sk = pytest.importorskip("sklearn.datasets")
    X, y = sk.load_wine(return_X_y=True)
    X = X.astype(np.float32)
    cfg = {"dataset": "table", "n_samples": X.shape[0], "n_features": X.shape[1], "n_classes": 3, "rounds": 1}
    s = chfl.ALGORITHM.parse(cfg)
    split = chfl_partition(X.shape[0], X.shape[1], 3, s.common_ratio, s.seed, s.feature_seed)
    col = int(split.common[0])  # a common column: every client reads it
    owner = next(k for k in range(3) for p in ("train", "val", "test") if 17 in split.rows(k, p))
    X[17, col] = np.nan
    msg = (f"party 'client{owner + 1}', argument 'X', row 18 (index 17), column {col + 1} (index {col}): "
           "value is NaN")
    with pytest.raises(DataFileError, match=re.escape(msg)):
        run_table({"rounds": 1}, X, y, 3)
    X[17, col] = 1.0
    yf = y.astype(float)
    yf[5] = np.inf
    with pytest.raises(DataFileError, match=r"argument 'y', row 6 \(index 5\): label is \+inf"):
        run_table({"rounds": 1}, X, yf, 3)


def test_other_array_entry_points_name_argument_row_and_column():
    from fedhet.algorithms.mmvfl import core as mmvfl_core
    from fedhet.algorithms.stfl import core as stfl_local
    from fedhet.algorithms.party_table import DataFileError

    X = np.ones((6, 4))
    X[2, 3] = -np.inf
    with pytest.raises(DataFileError, match=re.escape("argument 'X', row 3 (index 2), column 4 (index 3): "
                                                      "value is -inf")):
        mmvfl_core.prepare_view(X, 2)
    with pytest.raises(DataFileError, match=re.escape("argument 'x_unlabeled', row 3 (index 2), column 4")):
        stfl_local.train_vae(X)
