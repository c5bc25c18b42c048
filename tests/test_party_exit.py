"""A party that lost a peer has exited by ``[federation] peer_lost_s`` (issue 43, item 6): its waits
give up the exit reserve earlier, and the process ends as soon as its records are written."""
from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from fedhet.parties import runtime
from fedhet.parties.ops import presets
from fedhet.parties.federation import load

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def demo():
    return load(presets.path("demo"))


@pytest.mark.parametrize("lost,expected", [(10.0, 8.0), (2.0, 1.5), (40.0, 38.0)])
def test_waits_on_a_lost_peer_end_before_peer_lost_s_leaving_time_to_exit(demo, lost, expected):
    fed = replace(demo, peer_lost_s=lost, timeout=600.0)
    assert runtime.give_up_after(fed) == pytest.approx(expected)
    assert runtime.give_up_after(fed) < fed.peer_lost_s


def test_the_give_up_is_bounded_by_the_timeout_and_waits_out_a_restart_grace(demo):
    assert runtime.give_up_after(replace(demo, peer_lost_s=10.0, timeout=3.0)) == 3.0
    # a peer may restart within the grace: waiting less would give up on it while it is allowed back
    assert runtime.give_up_after(replace(demo, peer_lost_s=10.0, timeout=600.0, restart_grace_s=30.0)) == 30.0


def test_a_party_process_exits_once_its_log_is_flushed_without_the_interpreters_teardown(monkeypatch, tmp_path):
    log = logging.getLogger("fedhet.test.exit_now")
    handler = logging.FileHandler(tmp_path / "log.txt", delay=False)
    log.addHandler(handler)
    handler.setLevel(logging.INFO)
    log.setLevel(logging.INFO)
    exits = []

    class Exited(Exception):
        pass

    def fake_exit(code):
        exits.append((code, (tmp_path / "log.txt").read_text()))
        raise Exited

    monkeypatch.setattr(runtime.os, "_exit", fake_exit)
    log.info("party server failed: the last line before the exit")
    closed = []
    monkeypatch.setattr(handler, "close", lambda: closed.append(True))
    with pytest.raises(Exited):
        runtime.exit_now(3)
    log.removeHandler(handler)
    logging.FileHandler.close(handler)
    assert exits and exits[0][0] == 3                        # os._exit: no teardown of the heap
    assert "the last line before the exit" in exits[0][1]    # the log reached the file first
    assert closed                                            # every handler flushed and closed
