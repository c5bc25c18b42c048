"""A party's status.json has one writer and only moves forward (parties/status.py).

The race a user hit: a progress write that started before a stop finished after it, so a stopped
party read "running" on the board.  These tests race them, many times, and hold a write open at
its worst point with events (no sleeps decide anything)."""
from __future__ import annotations

import json
import threading

import pytest

from fedhet.parties import status as party_status
from fedhet.parties.status import FINAL, ORDER, StatusFile, advance, may_follow

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def _state(path) -> str:
    return json.loads(path.read_text())["state"]


def test_states_move_forward_only():
    assert may_follow(None, "starting") and may_follow("starting", "running")
    assert may_follow("running", "running") and may_follow("starting", "done")
    for final in FINAL:
        assert may_follow("running", final)
        assert may_follow(final, final)   # more detail, same state
        for other in ORDER:
            if other != final:
                assert not may_follow(final, other), (final, other)
    assert not may_follow("running", "starting")
    with pytest.raises(ValueError, match="unknown party state 'runing'"):
        may_follow("starting", "runing")


def test_a_write_after_the_final_state_is_refused(tmp_path):
    f = StatusFile(tmp_path / "status.json")
    assert f.write({"state": "starting", "done": 0})
    assert f.write({"done": 3})                      # no state: a progress report, "running"
    assert _state(f.path) == "running"
    assert f.write({"state": "stopped", "error": "Stopped: SIGTERM"})
    assert not f.write({"done": 4})
    assert not f.write({"state": "done"})
    st = json.loads(f.path.read_text())
    assert st["state"] == "stopped" and st["error"] == "Stopped: SIGTERM"


def test_a_stop_waits_for_a_progress_write_in_flight(tmp_path, monkeypatch):
    """A progress write held open between its check and its rename: the stop must not land before
    it (else the late rename would put "running" over "stopped")."""
    f = StatusFile(tmp_path / "status.json")
    f.write({"state": "running", "done": 1})
    inside, release = threading.Event(), threading.Event()
    real = party_status.write_json_atomic

    def slow_write(path, obj, *a, **k):
        if obj.get("done") == 2:     # the progress write: pause inside it
            inside.set()
            assert release.wait(30)
        return real(path, obj, *a, **k)

    monkeypatch.setattr(party_status, "write_json_atomic", slow_write)
    progress = threading.Thread(target=f.write, args=({"done": 2},))
    progress.start()
    assert inside.wait(30)
    stopped = threading.Event()
    stopper = threading.Thread(target=lambda: (f.write({"state": "stopped"}), stopped.set()))
    stopper.start()
    assert not stopped.wait(0.2)     # blocked behind the write in flight (a broken lock fails here)
    release.set()
    progress.join(30)
    stopper.join(30)
    assert stopped.is_set() and _state(f.path) == "stopped"


def test_progress_racing_a_stop_never_ends_running(tmp_path):
    """Four threads report progress as fast as they can while a fifth records the stop at a
    different point each time; after every round the file reads "stopped"."""
    for i in range(80):
        f = StatusFile(tmp_path / f"status-{i}.json")
        f.write({"state": "running", "done": 0})
        go = threading.Barrier(5)

        def progress():
            go.wait()
            for n in range(20):
                f.write({"done": n})

        def stop():
            go.wait()
            for _ in range(i % 15):   # a different interleaving each round
                f.write({"done": -1})
            f.write({"state": "stopped"})

        threads = [threading.Thread(target=progress) for _ in range(4)] + [threading.Thread(target=stop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert _state(f.path) == "stopped", i
        assert f.state == "stopped"


def test_advance_from_another_process_never_overrides_a_final_state(tmp_path):
    p = tmp_path / "status.json"
    StatusFile(p).write({"state": "done", "done": 1, "total": 1})
    assert not advance(p, {"state": "stopped", "reason": "stopped by the launcher"})
    assert _state(p) == "done"
    q = tmp_path / "other.json"
    StatusFile(q).write({"state": "running", "done": 5})
    assert advance(q, {"state": "stopped", "reason": "stopped by the launcher"})
    st = json.loads(q.read_text())
    assert st["state"] == "stopped" and st["done"] == 5 and st["reason"] == "stopped by the launcher"
