"""The party API on the in-memory transport: ordering by kind, timeouts, failures."""
import types

import numpy as np
import pytest

from fedhet.parties.api import PeerTimeout
from fedhet.parties.inmemory import FederationFailed, InMemoryHub, run_inmemory

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)


def hub3():
    hub = InMemoryHub({"a": "x", "b": "y", "c": "y"})
    return hub, [hub.party(n, timeout=2.0) for n in "abc"]


def test_recv_picks_the_kind_asked_for_and_keeps_the_rest_in_order():
    hub, (a, b, c) = hub3()
    a.send("b", "k1", 1)
    a.send("b", "k2", {"v": np.arange(3)})
    a.send("b", "k1", 2)
    assert np.array_equal(b.recv("a", "k2")["v"], np.arange(3))
    assert [b.recv("a", "k1"), b.recv("a", "k1")] == [1, 2]


def test_broadcast_gather_and_byte_counts_agree_on_both_sides():
    hub, (a, b, c) = hub3()
    a.broadcast("hello", {"w": np.ones(10)})
    assert b.recv("a", "hello")["w"].sum() == 10
    assert c.recv("a", "hello")["w"].sum() == 10
    b.send("a", "r", 1)
    c.send("a", "r", 2)
    assert a.gather("r", frm=a.peers_with_role("y")) == {"b": 1, "c": 2}
    assert a.bytes_sent["b"] == b.bytes_received["a"] > 80
    assert a.peers == ["b", "c"] and a.peers_with_role("y") == ["b", "c"]


def test_timeout_names_the_silent_peer_and_the_kind():
    hub, (a, b, c) = hub3()
    with pytest.raises(PeerTimeout, match=r"'model'.*'c'") as e:
        a.recv("c", "model", timeout=0.05)
    assert e.value.peer == "c" and e.value.kind == "model"


def test_sending_to_a_stranger_is_an_error():
    hub, (a, b, c) = hub3()
    with pytest.raises(Exception, match="not a peer"):
        a.send("zed", "k", 1)


def test_a_failing_party_is_named_and_does_not_hang_the_others():
    def boom(party, cfg, data):
        raise ValueError("bad local data")

    def waiter(party, cfg, data):
        return party.recv("p1", "never")  # would wait for the full timeout

    algo = types.SimpleNamespace(NAME="t", ROLES={"bad": boom, "ok": waiter},
                                 load_data=lambda *a: None, DECLARATIONS=[])
    with pytest.raises(FederationFailed, match="'p1'.*bad local data") as e:
        run_inmemory(algo, [("p1", "bad"), ("p2", "ok")], timeout=60)
    assert list(e.value.failures) == ["p1"]


def test_fedavg_in_memory_learns_and_is_deterministic():
    parties = [("server", "server"), ("c1", "client"), ("c2", "client"), ("c3", "client")]
    r1 = run_inmemory("fedavg_logreg", parties, {"rounds": 8}, seed=3)
    r2 = run_inmemory("fedavg_logreg", parties, {"rounds": 8}, seed=3)
    assert r1["server"]["weights"] == r2["server"]["weights"]
    assert r1["server"]["test_accuracy"] > 0.9
    # every client ends with the server's final model
    assert all(r1[c]["weights"] == r1["server"]["weights"] for c in ("c1", "c2", "c3"))


def _three(roles):
    return types.SimpleNamespace(NAME="clock-test", ROLES=roles, load_data=lambda *a: None)


def test_on_the_virtual_clock_a_working_party_is_never_timed_out():
    """The receiver's timeout (0.01 s) is far shorter than the sender's real work (a busy machine):
    on the virtual clock the timeout cannot fire while the sender works, only when everyone waits."""
    import time

    def slow(party, c, d):
        time.sleep(0.3)          # real work, 30x the receiver's timeout
        party.send("a", "late", 7)
        return "sent"

    def receiver(party, c, d):
        got = party.recv("b", "late", timeout=0.01)
        with pytest.raises(PeerTimeout):   # c never sends: this one does fire, as an event
            party.recv("c", "never", timeout=0.01)
        return got

    out = run_inmemory(_three({"x": receiver, "y": slow, "z": lambda p, c, d: "idle"}),
                       [("a", "x"), ("b", "y"), ("c", "z")], clock="virtual")
    assert out["a"] == 7 and out["b"] == "sent"
    # the same federation on the wall clock times the slow sender out
    with pytest.raises(FederationFailed, match="waited 0.01s"):
        run_inmemory(_three({"x": receiver, "y": slow, "z": lambda p, c, d: "idle"}),
                     [("a", "x"), ("b", "y"), ("c", "z")])


def test_a_party_sleeping_on_the_virtual_clock_is_late_whatever_the_machine():
    """party.sleep(5) makes a sender late for a 1 s timeout in protocol time, and on time for a 10 s one."""
    def late(party, c, d):
        party.sleep(5.0)
        party.send("a", "m", 1)
        return None

    def receiver(timeout):
        def role(party, c, d):
            t0 = party.now()
            try:
                return ("got", party.recv("b", "m", timeout=timeout), party.now() - t0)
            except PeerTimeout:
                return ("timeout", None, party.now() - t0)
        return role

    out = run_inmemory(_three({"x": receiver(1.0), "y": late}), [("a", "x"), ("b", "y")], clock="virtual")
    assert out["a"] == ("timeout", None, 1.0)
    out = run_inmemory(_three({"x": receiver(10.0), "y": late}), [("a", "x"), ("b", "y")], clock="virtual")
    assert out["a"] == ("got", 1, 5.0)
