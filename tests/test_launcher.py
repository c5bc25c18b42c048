"""Party processes over CURVE ZeroMQ: same numbers as in memory, clean failure, auditable runs.

* The demo job gives bit-identical weights in memory and as one process per
  party over CURVE (and over plain TCP with ``--insecure``, which warns).
* SIGKILL one party mid-run: the launcher (and ``fedhet run``) fails within
  the federation timeout naming that party, and no process of the run is left.
* ``fedhet audit`` passes a clean run and fails one with a changed byte or a
  removed transcript record.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fedhet.parties.ops import cli, presets
from fedhet.parties.audit import audit
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import RunFailed, launch

from launch_tools import launch_in_background, shared_run  # a helper module of tests/

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)

STARTUP = 90.0  # seconds a party process may take to come up on a loaded machine (hang guard only)
STOP_GRACE = 3.0  # the launcher's SIGTERM -> SIGKILL grace
# Per-message timeout of the kill tests: long enough for parties to load data on a
# busy machine; a killed party must be reported well before it runs out.
FED_TIMEOUT = 20.0


def demo_fed():
    return load(presets.path("demo"))


def run_processes(run_dir: Path, *must: str) -> dict[int, list[str]]:
    """pid -> argv of every live process whose command line mentions run_dir (and all of ``must``)."""
    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            raw = Path(f"/proc/{d}/cmdline").read_bytes()
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
        if any(str(run_dir) in a for a in args) and all(m in args for m in must):
            found[int(d)] = args
    return found


def kill_strays(run_dir: Path) -> None:
    for pid in run_processes(run_dir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # Alive or a zombie nobody reaped: both count as left behind.
    return False


def wait_until_mid_run(run_dir: Path, name: str, running, timeout: float = STARTUP) -> int:
    """Wait until ``name`` reports training progress; return its pid.  ``running()`` says the launcher is alive."""
    deadline = time.monotonic() + timeout
    st = run_dir / "parties" / name / "status.json"
    while time.monotonic() < deadline:
        if not running():
            summary = (run_dir / "result.json").read_text() if (run_dir / "result.json").exists() else ""
            raise AssertionError(f"the run ended before {name} got going: {summary}")
        try:
            s = json.loads(st.read_text())
        except (OSError, ValueError):
            s = {}
        if s.get("state") == "running" and s.get("done", 0) >= 1:
            pids = run_processes(run_dir, "party", "--name", name)
            if len(pids) == 1:
                return next(iter(pids))
        time.sleep(0.05)
    raise AssertionError(f"{name} did not get going within {timeout}s")


def weights(summary: dict) -> dict:
    return {n: p["result"]["weights"] for n, p in summary["parties"].items()}


# --------------------------------------------------- one clean CURVE demo run
@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo as processes, made once for all workers (the tests only read it)."""
    fed = demo_fed()
    run_dir = shared_run(tmp_path_factory, "launcher-demo",
                         lambda folder: launch(fed, folder, progress=False, timeout=300))
    return fed, run_dir, json.loads((run_dir / "result.json").read_text())


def test_zmq_processes_match_in_memory_bit_for_bit(demo_run):
    fed, run_dir, summary = demo_run
    assert summary["ok"]
    mem = run_inmemory(fed.algorithm_name, [(p.name, p.role) for p in fed.parties], fed.algorithm_cfg(),
                       seed=fed.seed)
    assert weights(summary) == {n: r["weights"] for n, r in mem.items()}
    assert len(summary["parties"]["server"]["result"]["weights"]) == 31
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["insecure"] is False


def test_insecure_processes_also_match_and_warn(tmp_path):
    fed = replace(demo_fed(), parties=demo_fed().parties[:3])  # secure aggregation needs 2 clients
    run_dir = tmp_path / "insecure"
    summary = launch(fed, run_dir, insecure=True, progress=False, timeout=300, overrides={"rounds": 3})
    cfg = fed.algorithm_cfg() | {"rounds": 3}
    mem = run_inmemory(fed.algorithm_name, [(p.name, p.role) for p in fed.parties], cfg, seed=fed.seed)
    assert weights(summary) == {n: r["weights"] for n, r in mem.items()}
    assert json.loads((run_dir / "config.json").read_text())["insecure"] is True
    for p in fed.parties:
        assert summary["parties"][p.name]["insecure"] is True
        pdir = run_dir / "parties" / p.name
        assert "CURVE is OFF" in (pdir / "log.txt").read_text()
        assert "--insecure" in (pdir / "stdout.log").read_text()


# ---------------------------------------------------------- a party dies
def test_killed_party_fails_the_run_by_name_and_leaves_no_process(tmp_path):
    fed = replace(demo_fed(), parties=demo_fed().parties[:3], timeout=FED_TIMEOUT)
    run_dir = tmp_path / "killed"
    th, outcome = launch_in_background(fed, run_dir, overrides={"rounds": 100000})
    try:
        victim = wait_until_mid_run(run_dir, "client1", th.is_alive)
        pids = set(run_processes(run_dir, "party"))
        assert len(pids) == 3
        t_kill = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        th.join(fed.timeout + STOP_GRACE + 5)  # hang guard
        assert not th.is_alive(), "launcher did not return after a party was killed"
    finally:
        kill_strays(run_dir)  # never leave strays behind, even when failing
    err = outcome.get("error")
    assert isinstance(err, RunFailed), repr(err)
    assert err.party == "client1" and "'client1'" in str(err) and "SIGKILL" in err.reason
    # A liveness bound, not a performance measurement: the death is noticed directly,
    # not through the survivors' receive timeouts.
    assert outcome["t"] - t_kill < fed.timeout
    assert all(gone(p) for p in pids)
    assert run_processes(run_dir) == {}
    result = json.loads((run_dir / "result.json").read_text())
    assert result["ok"] is False


def test_fedhet_run_cli_exits_nonzero_naming_the_killed_party(tmp_path):
    fed = replace(demo_fed(), parties=demo_fed().parties[:3], timeout=FED_TIMEOUT, source="<memory>")
    fed_file = tmp_path / "fed.toml"
    fed_file.write_text(fed.to_toml())
    run_dir = tmp_path / "cli-run"
    log = tmp_path / "cli.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedhet.parties.ops.cli", "run", str(fed_file), "--out", str(run_dir),
             "--set", "rounds=100000", "--no-progress"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, COLUMNS="400"))
    try:
        victim = wait_until_mid_run(run_dir, "client1", lambda: proc.poll() is None)
        t_kill = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        code = proc.wait(timeout=fed.timeout + STOP_GRACE + 30)  # hang guard
        elapsed = time.monotonic() - t_kill
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_strays(run_dir)
    text = log.read_text()
    assert code == 1, text
    assert "run failed" in text and "'client1'" in text and "SIGKILL" in text, text
    assert "'server'" not in text.split("run failed", 1)[1].split("(logs in", 1)[0]
    assert elapsed < fed.timeout  # liveness bound, as above (includes the CLI's own exit)
    assert run_processes(run_dir) == {}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_no_party_outlives_a_killed_launcher(tmp_path, sig):
    """SIGTERM: the launcher stops its parties and exits 128+15; SIGKILL: the parties notice
    their parent is gone (parent-death signal) and end themselves."""
    fed = replace(demo_fed(), parties=demo_fed().parties[:3], timeout=60.0, source="<memory>")
    fed_file = tmp_path / "fed.toml"
    fed_file.write_text(fed.to_toml())
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "fedhet.parties.ops.cli", "run", str(fed_file), "--out",
                             str(run_dir), "--set", "rounds=100000", "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_mid_run(run_dir, "client2", lambda: proc.poll() is None)
        parties = set(run_processes(run_dir, "party"))
        assert len(parties) == 3
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        deadline = time.monotonic() + 20  # hang guard; the parties' own timeout (60 s) must not be needed
        while run_processes(run_dir) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = run_processes(run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_strays(run_dir)
    assert left == {}, left
    assert code == (128 + signal.SIGTERM if sig == signal.SIGTERM else -signal.SIGKILL)
    if sig == signal.SIGKILL:
        # each party's watcher on the launcher's pid wrote its record and exited at once, from its own
        # thread, whatever the main thread was doing (a signal handler waits for the main thread)
        for n in ("server", "client1", "client2"):
            rec = json.loads((run_dir / "parties" / n / "error.json").read_text())
            assert rec["cause"] == "stopped" and "the launcher is gone" in rec["error"], rec


# ------------------------------------------------------------------ audit
def _transcript(run_dir: Path, name: str) -> Path:
    return run_dir / "parties" / name / "transcript.jsonl"


def test_audit_passes_a_clean_run(demo_run):
    _, run_dir, _ = demo_run
    rep = audit(run_dir)
    assert rep.ok, rep.problems
    assert rep.messages > 0
    assert cli.main(["audit", str(run_dir), "--trust-folder-keys"]) == 0


@pytest.mark.parametrize("tamper", ["digest_byte", "middle_byte", "remove_record"])
def test_audit_fails_a_tampered_transcript(demo_run, tmp_path, tamper):
    _, run_dir, _ = demo_run
    bad = tmp_path / "tampered"
    shutil.copytree(run_dir, bad)
    t = _transcript(bad, "client1")
    lines = t.read_bytes().splitlines(keepends=True)
    assert len(lines) > 4
    if tamper == "digest_byte":  # stays valid, canonical JSON: only the hash chain can tell
        rec = json.loads(lines[2])
        h = rec["sha256"]
        rec["sha256"] = h[:10] + ("0" if h[10] != "0" else "1") + h[11:]
        new = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode() + b"\n"
        assert len(new) == len(lines[2]) and sum(a != b for a, b in zip(new, lines[2])) == 1
        lines[2] = new
        t.write_bytes(b"".join(lines))
    elif tamper == "middle_byte":
        raw = bytearray(t.read_bytes())
        i = len(raw) // 2
        raw[i] = ord("x") if raw[i] != ord("x") else ord("y")
        t.write_bytes(bytes(raw))
    else:
        del lines[3]
        t.write_bytes(b"".join(lines))
    rep = audit(bad)
    assert not rep.ok
    assert any(p.startswith("client1:") for p in rep.problems), rep.problems
    assert cli.main(["audit", str(bad)]) == 1
    assert audit(run_dir).ok  # the original is untouched


@pytest.mark.unit
def test_atomic_writes_honour_the_umask_unless_told_a_mode(tmp_path):
    import os
    import stat

    from fedhet.parties.atomic import write_atomic, write_json_atomic

    old = os.umask(0o027)
    try:
        plain = write_json_atomic(tmp_path / "result.json", {"a": 1})
        secret = write_atomic(tmp_path / "k.key", b"s", mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE(plain.stat().st_mode) == 0o640
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".*.tmp"))  # no temporary file left behind


@pytest.mark.unit
def test_listening_ports_are_drawn_below_the_kernelsephemeral_range():
    """A party could not bind the port the launcher had found free ("Address already in use"): a port
    the kernel hands out to outgoing connections was taken again before the party started, under load
    with thousands of connections open.  Listening ports now come from below that range."""
    import socket

    from fedhet.parties.ops.engines.local import LISTEN_PORTS_FROM, ephemeral_range, free_port

    lo, _ = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(LISTEN_PORTS_FROM <= p < lo for p in ports), ports
    for p in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))   # free, as promised


@pytest.mark.unit
def test_ports_stay_distinct_when_the_ephemeral_range_starts_low(monkeypatch, tmp_path):
    """A kernel whose outgoing range starts at or below LISTEN_PORTS_FROM (ip_local_port_range 1024 ...)
    left no port below it to draw from: every draw was the same port, and the launcher asked again
    for a port not handed out yet, forever.  Now the kernel picks, and no port is handed out twice."""
    from fedhet.parties.ops.engines import local

    monkeypatch.setattr(local, "ephemeral_range", lambda: (local.LISTEN_PORTS_FROM - 1000, 65535))
    taken: set[int] = set()
    for _ in range(20):
        taken.add(local.free_port(taken))
    assert len(taken) == 20
    fed, _ = local.prepare_local(load(presets.path("demo")), tmp_path / "run", key_dir=tmp_path / "keys")
    ports = [int(p.endpoint.rsplit(":", 1)[1]) for p in fed.parties]
    assert len(set(ports)) == len(ports) == len(fed.parties)


@pytest.mark.unit
def test_a_party_killed_after_every_other_ended_is_not_restarted(monkeypatch):
    """With restart_grace_s a killed party comes back with --resume, but only while another unit
    still runs: after the others ended there is nobody to resume with, and a restart would only
    wait out the timeout and then blame a party that had finished."""
    from fedhet.parties.ops.engines import local

    class Proc:
        def __init__(self, code):
            self.code = code

        def poll(self):
            return self.code

    started: list[str] = []
    monkeypatch.setattr(local, "start_process", lambda cmd, *a, **k: started.append(cmd[-1]) or Proc(None))
    eng = local.LocalProcesses()
    eng.fed = replace(load(presets.path("demo")), restart_grace_s=30.0)
    eng.commands = {n: ([n], Path("log"), {}) for n in ("a", "b")}
    eng.procs = {"a": Proc(-9), "b": Proc(0)}
    assert eng.poll() == {"a": -9, "b": 0} and started == []
    eng.procs = {"a": Proc(-9), "b": Proc(None)}
    assert eng.poll() == {"a": None, "b": None} and started == ["--resume"] and eng.restarts == {"a": 1}
