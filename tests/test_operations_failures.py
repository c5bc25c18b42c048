"""Operating parties started by hand (as on separate machines): a party that cannot start tells its
peers at once, a second start of a running party is refused without touching it, and the launcher's
verdict names the party whose own failure came first (issue: operating a federation)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedhet.parties.ops import presets
from fedhet.parties.federation import load
from fedhet.parties.ops.engines.local import prepare_local
from fedhet.parties.ops.launcher import RunFailed, launch

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)

HANG_GUARD = 240.0   # seconds: only ends a hung test; nothing here is timed


def by_hand(tmp_path: Path, fed, names=None):
    """Start each party as its own `fedhet party` process (no launcher), as users do across machines."""
    run_dir = tmp_path / "run"
    resolved, fed_file = prepare_local(fed, run_dir)
    procs = {p.name: start(fed_file, p.name, run_dir, resolved.run_id) for p in resolved.parties
             if names is None or p.name in names}
    return resolved, fed_file, run_dir, procs


def start(fed_file, name, run_dir, run_id):
    return subprocess.Popen(
        [sys.executable, "-m", "fedhet.parties", "party", str(fed_file), "--name", name, "--out",
         str(run_dir), "--run-id", run_id, "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def wait_all(procs, resolved) -> dict:
    """Every process's exit code (the hang guard ends a hung test), then no process and no key left."""
    try:
        return {n: pr.wait(HANG_GUARD) for n, pr in procs.items()}
    finally:
        for pr in procs.values():
            pr.kill()
        shutil.rmtree(resolved.key_dir, ignore_errors=True)


def record(run_dir: Path, name: str) -> dict:
    return json.loads((run_dir / "parties" / name / "error.json").read_text())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_a_party_without_its_device_stops_its_peers_with_a_notice_naming_it(tmp_path):
    fed = load(presets.path("demo"))
    fed = replace(fed, timeout=180.0, parties=[replace(p, device="cuda") if p.name == "client1" else p
                                               for p in fed.parties])
    resolved, _, run_dir, procs = by_hand(tmp_path, fed)
    codes = wait_all(procs, resolved)
    assert all(c != 0 for c in codes.values()), codes
    own = record(run_dir, "client1")
    assert own["cause"] == "own" and "CUDA" in own["error"]
    for n in ("server", "client2", "client3"):
        r = record(run_dir, n)
        # stopped by client1's notice, not after waiting out the 180 s timeout
        assert r["cause"] == "peer_abort" and r["culprit"] == "client1", r
        assert "CUDA" in r["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_a_party_that_fails_before_its_peers_are_up_still_stops_them(tmp_path):
    """Under load the peers started by hand came up after the failed party's 2 s linger: its notice was
    lost and they waited for it instead of naming it.  Here the peers start only once it has failed:
    the notice waits for a peer it never reached, and every peer names it."""
    import time

    fed = load(presets.path("demo"))
    fed = replace(fed, timeout=180.0, parties=[replace(p, device="cuda") if p.name == "client1" else p
                                               for p in fed.parties])
    resolved, fed_file, run_dir, procs = by_hand(tmp_path, fed, names={"client1"})
    deadline = time.monotonic() + HANG_GUARD
    while not (run_dir / "parties" / "client1" / "error.json").exists():   # it failed, and lingers
        assert time.monotonic() < deadline, "client1 never failed"
        time.sleep(0.05)
    procs.update({n: start(fed_file, n, run_dir, resolved.run_id) for n in ("server", "client2", "client3")})
    codes = wait_all(procs, resolved)
    assert all(c != 0 for c in codes.values()), codes
    for n in ("server", "client2", "client3"):
        r = record(run_dir, n)
        assert r["cause"] == "peer_abort" and r["culprit"] == "client1", r


def test_a_second_start_of_a_running_party_is_refused_and_leaves_the_first_alone(tmp_path):
    fed = replace(load(presets.path("demo")), timeout=180.0)
    resolved, fed_file, run_dir, procs = by_hand(tmp_path, fed, names={"server"})
    first = procs["server"]
    try:
        lock = run_dir / "parties" / "server" / ".lock"
        import time
        deadline = time.monotonic() + HANG_GUARD
        while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        status_before = (run_dir / "parties" / "server" / "status.json").read_bytes() \
            if (run_dir / "parties" / "server" / "status.json").exists() else None
        second = subprocess.run(
            [sys.executable, "-m", "fedhet.parties", "party", str(fed_file), "--name", "server", "--out",
             str(run_dir), "--run-id", resolved.run_id, "--quiet"],
            capture_output=True, text=True, timeout=HANG_GUARD)
        assert second.returncode == 1
        assert "already running" in second.stderr and str(first.pid) in second.stderr
        assert "Traceback" not in second.stderr
        assert first.poll() is None                       # the first runs on
        assert not (run_dir / "parties" / "server" / "error.json").exists()
        if status_before is not None:
            st = json.loads((run_dir / "parties" / "server" / "status.json").read_text())
            assert st.get("state") != "failed"
    finally:
        first.kill()
        first.wait()
        shutil.rmtree(resolved.key_dir, ignore_errors=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_the_launcher_names_the_party_whose_own_failure_came_first_with_its_full_reason(tmp_path):
    fed = load(presets.path("demo"))
    fed = replace(fed, timeout=180.0, parties=[replace(p, device="cuda:3") if p.name == "client2" else p
                                               for p in fed.parties])
    with pytest.raises(RunFailed) as e:
        launch(fed, tmp_path / "run", progress=False, timeout=HANG_GUARD)
    assert e.value.party == "client2"
    summary = json.loads((tmp_path / "run" / "result.json").read_text())
    assert summary["failed"]["party"] == "client2" and summary["failed"]["proven"]
    assert "device 'cuda:3' requested but torch sees no CUDA device" in summary["failed"]["reason"]


def test_two_machines_with_different_federation_files_stop_naming_the_peer_and_the_key(tmp_path):
    """The label owner's file says psi_backend = "kkrt", the feature parties' "ecdh": every party stops
    at the first message, naming the peer and `[algorithm] psi_backend`, and nobody is blamed."""
    fed = replace(load(presets.path("psi")), timeout=180.0)
    run_dir = tmp_path / "run"
    resolved, fed_file = prepare_local(fed, run_dir, {"n": 200, "psi_backend": "ecdh"})
    other = replace(resolved, algorithm={**resolved.algorithm, "psi_backend": "kkrt"})
    owner_file = run_dir / "owner.toml"   # beside the resolved file: its key_dir is relative to it
    owner_file.write_text(other.to_toml())
    procs = {p.name: start(owner_file if p.role == "label_owner" else fed_file, p.name, run_dir, resolved.run_id)
             for p in resolved.parties}
    codes = wait_all(procs, resolved)
    assert all(c != 0 for c in codes.values()), codes
    recs = {n: record(run_dir, n) for n in procs}
    mism = [r for r in recs.values() if r["cause"] == "mismatch"]
    assert mism, recs
    for r in mism:
        assert "[algorithm] psi_backend" in r["error"] and r["culprit"] is None
        assert r["evidence"]["sections"] == ["[algorithm] psi_backend"]
    # the others stopped at the detecting party's notice, not at the 180 s timeout
    assert all(r["cause"] in ("mismatch", "peer_abort") for r in recs.values()), recs
    from fedhet.parties import failure
    v = failure.verdict(recs)
    assert v["party"] is None and "different federation files" in v["reason"]


@pytest.mark.federation
def test_a_restarted_party_keeps_the_earlier_transcript_and_a_running_one_is_not_touched(tmp_path):
    import os

    from fedhet.algorithms import registry
    from fedhet.parties.runtime import PartyRun, PartyRunning

    fed = load(presets.path("demo"))
    resolved, _ = prepare_local(fed, tmp_path / "run")
    algo = registry.get_algorithm("fedavg_logreg")
    try:
        first = PartyRun(resolved, "server", tmp_path / "run", algo, echo=False)
        earlier = "".join(f'{{"i": {i}}}\n' for i in range(308))
        (first.pdir / "transcript.jsonl").write_text(earlier)
        (first.pdir / "status.json").write_text('{"state": "running"}')
        with pytest.raises(PartyRunning, match=f"already running .*process {os.getpid()}"):
            PartyRun(resolved, "server", tmp_path / "run", algo, echo=False)
        assert (first.pdir / "status.json").read_text() == '{"state": "running"}'
        os.close(first._lock_fd)          # the first process died: the OS drops its lock
        again = PartyRun(resolved, "server", tmp_path / "run", algo, echo=False)
        assert (again.pdir / "transcript.1.jsonl").read_text() == earlier   # evidence kept, not overwritten
        os.close(again._lock_fd)
        third = PartyRun(resolved, "server", tmp_path / "run", algo, echo=False)
        assert not (third.pdir / "transcript.2.jsonl").exists()            # nothing new to keep
        os.close(third._lock_fd)
    finally:
        shutil.rmtree(resolved.key_dir, ignore_errors=True)


def test_hand_started_parties_give_up_on_a_killed_peer_when_its_connection_stays_down(tmp_path):
    """kill -9 of a client mid-run, no launcher: the server's link to it breaks and stays down, so
    the waits on it end after [federation] peer_lost_s, not after the federation's 600 s receive
    timeout (the hang guard, far shorter, would fail the test first)."""
    import json as _json
    import os
    import signal
    import time

    fed = replace(load(presets.path("demo")), timeout=600.0, peer_lost_s=2.0)
    resolved, fed_file = prepare_local(fed, tmp_path / "run", {"rounds": 400, "aggregation": "plain"})
    run_dir = tmp_path / "run"
    procs = {}
    try:
        procs = {p.name: start(fed_file, p.name, run_dir, resolved.run_id) for p in resolved.parties}
        st = run_dir / "parties" / "client2" / "status.json"
        deadline = time.monotonic() + HANG_GUARD
        while True:   # an event, not a sleep: client2 is mid-run once it reports a step
            assert time.monotonic() < deadline and procs["client2"].poll() is None
            try:
                if _json.loads(st.read_text()).get("done", 0) >= 2:
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        os.kill(procs["client2"].pid, signal.SIGKILL)
        codes = {n: pr.wait(HANG_GUARD) for n, pr in procs.items() if n != "client2"}
    finally:
        for pr in procs.values():
            pr.kill()
        shutil.rmtree(resolved.key_dir, ignore_errors=True)
    # the server dropped client2 (plain aggregation goes on without it) or stopped naming the lost link
    server_dir = run_dir / "parties" / "server"
    log = (server_dir / "log.txt").read_text()
    assert "lost" in log and "client2" in log, log[-2000:]
    assert all(c in (0, 1) for c in codes.values()), codes
