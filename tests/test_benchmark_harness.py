"""The benchmarks' shared harness (``benchmarks/harness.py``).

* Results: JSON (parseable, the same document back), markdown and PNG land under the
  ``NAME``/``NAME_quick`` stem; a write that fails leaves the previous file intact and no
  temporary file behind.
* Metadata: the machine and software fields are present and plausible; ``finish`` adds the
  load and time at the end.
* Best-of timing returns the least wall and CPU time of the repeats (a fake clock, so no real
  timing decides the test); interleaving calls the variants round by round.
* A federation built in code runs through the real launcher and passes the audit; the result
  comes back per party; a kept run folder holds the transcripts.
* Role functions run in memory through the harness.
"""
from __future__ import annotations

import json

import pytest

from benchmarks import harness

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def test_output_writes_json_md_png_under_the_quick_stem(tmp_path):
    out = harness.Output("thing", quick=True, out_dir=tmp_path)
    assert out.stem == "thing_quick" and harness.Output("thing").stem == "thing"
    doc = {"rows": [{"a": 1, "b": 2.5}], "name": "x"}
    plt = harness.pyplot()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    paths = out.write(doc, "# title\n", fig)
    assert set(paths) == {"json", "md", "png"}
    assert json.loads((tmp_path / "thing_quick.json").read_text()) == doc
    assert out.read() == doc
    assert (tmp_path / "thing_quick.md").read_text() == "# title\n"
    assert (tmp_path / "thing_quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing_quick.json", "thing_quick.md", "thing_quick.png"]


def test_numpy_values_are_written_as_plain_numbers(tmp_path):
    import numpy as np

    out = harness.Output("np", out_dir=tmp_path)
    out.write({"x": np.float32(1.5), "v": np.arange(3), "p": tmp_path})
    assert out.read() == {"x": 1.5, "v": [0, 1, 2], "p": str(tmp_path)}


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    out = harness.Output("keep", out_dir=tmp_path)
    out.write({"good": True}, "old\n")
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        out.write({"bad": object()}, "new\n")
    assert out.read() == {"good": True}
    assert (tmp_path / "keep.md").read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json", "keep.md"]


def test_read_names_the_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.json"):
        harness.Output("nothing", out_dir=tmp_path).read()


@pytest.mark.processes
def test_session_metadata_fields():
    s = harness.Session("demo", "demo.py", ["--quick"])
    assert s.command == "python -m benchmarks.demo --quick"
    env = s.finish()
    for key in ("cpu_count", "cpu_model", "memory_gib", "python", "versions", "git_commit", "git_dirty",
                "loadavg_start", "loadavg_end", "started", "finished", "elapsed_s", "platform"):
        assert key in env, key
    assert env["cpu_count"] >= 1 and isinstance(env["cpu_model"], str) and env["cpu_model"]
    assert env["python"].count(".") == 2
    assert env["versions"]["numpy"] and env["versions"]["pyzmq"]
    assert env["elapsed_s"] >= 0
    if env["git_commit"] is not None:  # a checkout: the commit is a full hash
        assert len(env["git_commit"]) == 40 and int(env["git_commit"], 16) >= 0
    line = harness.environment_line(env)
    assert f"{env['cpu_count']} CPUs" in line and env["python"] in line


class FakeClock:
    """perf_counter / process_time that only move when the timed function says so."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def spend(self, seconds):
        self.t += seconds


def test_best_of_returns_the_least_wall_and_cpu_time(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    monkeypatch.setattr(harness.time, "process_time", clock)
    durations = iter([0.5, 0.2, 0.9])
    calls = []

    def fn():
        calls.append(1)
        clock.spend(next(durations))
        return len(calls)

    t = harness.best_of(fn, repeats=3)
    assert t.wall_s == pytest.approx(0.2) and t.cpu_s == pytest.approx(0.2)
    assert t.walls == pytest.approx((0.5, 0.2, 0.9)) and t.result == 3
    with pytest.raises(ValueError, match="repeats"):
        harness.best_of(fn, repeats=0)


def test_best_of_interleaved_alternates_the_variants(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(harness.time, "perf_counter", clock)
    monkeypatch.setattr(harness.time, "process_time", clock)
    order = []
    cost = {"a": iter([3.0, 1.0]), "b": iter([2.0, 4.0])}

    def variant(name):
        def fn():
            order.append(name)
            clock.spend(next(cost[name]))
        return fn

    got = harness.best_of_interleaved({"a": variant("a"), "b": variant("b")}, repeats=2)
    assert order == ["a", "b", "a", "b"]
    assert got["a"].wall_s == pytest.approx(1.0) and got["b"].wall_s == pytest.approx(2.0)


def test_federation_built_in_code_drops_unset_keys():
    fed = harness.federation({"name": "psi", "n": 10, "workers": None}, [("lo", "label_owner"), ("f", "feature")])
    assert fed.roles == {"lo": "label_owner", "f": "feature"}
    assert fed.algorithm == {"name": "psi", "n": 10}
    assert fed.algorithm_name == "psi"
    with pytest.raises(ValueError, match="needs a name"):
        harness.federation({"n": 1}, [("a", "x"), ("b", "y")])


@pytest.mark.processes
def test_launching_a_federation_passes_the_audit(tmp_path):
    cfg = {"name": "psi", "n": 200, "overlap": 0.5, "pair_overlap": 0.0, "duplicates": 0.0, "workers": 0}
    fed = harness.federation(cfg, [("label_owner", "label_owner"), ("feature", "feature")], timeout=60)
    run = harness.launch_audited(fed, run_dir=tmp_path / "run", timeout=120)
    assert run.audit_ok is True and run.audit_problems == []
    assert {row["party"] for row in run.audit_table} == {"label_owner", "feature"}
    res = run.results
    assert set(res) == {"label_owner", "feature"}
    assert all(r["correct"] and r["size"] == 100 for r in res.values())
    assert res["label_owner"]["ids_sha256"] == res["feature"]["ids_sha256"]
    assert list(run.by_role("feature")) == ["feature"]
    assert run.cpu_s > 0 and run.wall_s > 0
    assert run.run_dir == tmp_path / "run"
    assert (run.run_dir / "parties" / "feature" / "transcript.jsonl").exists()


@pytest.mark.processes
def test_a_preset_passes_the_audit_and_its_temporary_run_folder_is_removed(tmp_path, monkeypatch):
    made = []

    def mkdtemp(prefix=""):
        made.append(tmp_path / f"{prefix}run")
        made[-1].mkdir()
        return str(made[-1])

    monkeypatch.setattr(harness.tempfile, "mkdtemp", mkdtemp)
    run = harness.launch_audited("psi", overrides={"n": 60, "workers": 0}, timeout=120)
    assert run.audit_ok is True and run.run_dir is None
    runs = [m for m in made if m.name.startswith("bench-")]  # the launcher's key folder is another
    assert len(runs) == 1 and not runs[0].exists()
    assert {r["role"] for r in run.summary["parties"].values()} == {"label_owner", "feature"}


@pytest.mark.federation
def test_role_functions_run_in_memory():
    def server(party, cfg, data):
        return sum(party.gather("t/n", frm=party.peers_with_role("client")).values())

    def client(party, cfg, data):
        party.send("s", "t/n", cfg["base"] + data)
        return data

    algo = harness.roles_algorithm("toy", {"server": server, "client": client})
    run = harness.run_roles(algo, [("s", "server"), ("c1", "client"), ("c2", "client")], {"base": 10},
                            data={"s": None, "c1": 1, "c2": 2}, timeout=30)
    assert run.results == {"s": 23, "c1": 1, "c2": 2}
    assert run.wall_s >= 0 and run.cpu_s >= 0


@pytest.mark.processes   # it runs git
def test_a_run_is_modified_by_code_changes_only_and_names_them(tmp_path, monkeypatch):
    """A results file written meanwhile (by another benchmark) is not a change of the code that ran; a
    changed source file is, and the record names it."""
    import subprocess

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    for name in ("benchmarks/results/x.json", "docs/results.md", "code.py"):
        (tmp_path / name).write_text("a\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    monkeypatch.setattr(harness, "REPO", tmp_path)
    (tmp_path / "benchmarks/results/x.json").write_text("b\n")
    (tmp_path / "docs/results.md").write_text("b\n")
    assert harness.git_commit()["dirty"] is False
    (tmp_path / "code.py").write_text("b\n")
    g = harness.git_commit()
    assert g["dirty"] is True and g["dirty_files"] == ["code.py"]
