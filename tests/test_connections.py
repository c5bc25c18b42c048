"""Connections diagnosed (issue 26, item 1): a party names the endpoint it dials and tells apart
"no TCP connection", "handshake refused" and "connected but silent", within seconds.

Two live ``ZmqParty`` objects in this process over loopback TCP.  Early failures are driven by
an explicit small ``diagnose_s`` / ``unreachable_s`` (the link's state is the event); receive
timeouts are only safety nets, except where the state is known before the wait begins.
"""
from __future__ import annotations

import logging
import time

import pytest
import zmq

from fedhet.parties.api import PeerTimeout
from fedhet.parties.zmq_transport import PeerUnreachable, ZmqParty

from net_tools import free_port, loopback_endpoints, wait_for  # a helper module of tests/

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

ROLES = {"a": "server", "b": "client"}
RUN = "links"
SAFETY_S = 60.0  # never reached when the behaviour is right


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record):
        self.lines.append((record.levelno, record.getMessage()))


def logger(name: str) -> tuple[logging.Logger, Records]:
    log = logging.getLogger(f"fedhet.test.links.{name}.{time.monotonic_ns()}")
    log.propagate = False
    log.setLevel(logging.INFO)
    rec = Records()
    log.addHandler(rec)
    return log, rec


@pytest.fixture
def world():
    keys = {n: zmq.curve_keypair() for n in ROLES}
    eps = loopback_endpoints(ROLES)
    made: list[ZmqParty] = []

    def party(name, public=None, endpoints=None, **kw):
        log, rec = logger(name)
        pub = {n: k[0] for n, k in keys.items()}
        pub.update(public or {})
        p = ZmqParty(name, ROLES, endpoints or eps, public_keys=pub, secret_key=keys[name][1], run_id=RUN,
                     timeout=SAFETY_S, logger=log, **kw)
        p.records = rec
        made.append(p)
        return p

    yield keys, eps, party
    for p in made:
        p._transport_close(linger_s=0)


def test_wrong_port_is_named_no_tcp_connection(world):
    keys, eps, party = world
    listened = {int(e.rsplit(":", 1)[1]) for e in eps.values()}
    wrong = dict(eps, b=f"tcp://127.0.0.1:{free_port(listened)}")  # nothing listens there
    statuses: list[dict] = []
    a = party("a", endpoints=wrong, status_cb=statuses.append, diagnose_s=0.2, unreachable_s=0.3)
    b = party("b")  # up, at the port the federation should have named
    # the state is known from the start: even a short timeout says what is wrong
    with pytest.raises(PeerTimeout) as short:
        a.recv("b", "k", timeout=0.1)
    assert f"no TCP connection to {wrong['b']}" in str(short.value)
    # with unreachable_s, the waiting recv fails once the link has had no TCP connection that long
    with pytest.raises(PeerUnreachable) as early:
        a.recv("b", "k")
    msg = str(early.value)
    assert f"no TCP connection to {wrong['b']}" in msg and "attempt(s) refused" in msg, msg
    st = a.connection_state("b")
    assert st["state"] == "no TCP connection" and st["endpoint"] == wrong["b"] and st["since"] > 0
    # reported: a warning and a field of the status
    wait_for(lambda: any("links" in s for s in statuses), what="the status to name the link")
    links = next(s for s in statuses if "links" in s)["links"]
    assert links["b"]["state"] == "no TCP connection" and links["b"]["endpoint"] == wrong["b"]
    assert any(lv == logging.WARNING and wrong["b"] in m for lv, m in a.records.lines), a.records.lines
    assert b.connection_state("a")["state"] == "connected"  # the other way round works


def test_without_unreachable_s_a_missing_peer_is_reported_but_waited_for(world):
    keys, eps, party = world
    statuses: list[dict] = []
    a = party("a", status_cb=statuses.append, diagnose_s=0.2)  # b is not started (yet)
    wait_for(lambda: any("links" in s for s in statuses), what="the status to name the link")
    assert a.connection_state("b")["state"] == "no TCP connection"
    b = party("b")  # a party started by hand, later: nothing failed meanwhile
    b.send("a", "k", 7)
    assert a.recv("b", "k") == 7
    wait_for(lambda: a.connection_state("b")["state"] == "connected", what="a's own dial to reach b")


def test_peer_holding_another_key_for_us_refuses_the_handshake(world):
    keys, eps, party = world
    a = party("a", diagnose_s=0.3)
    party("b", public={"a": zmq.curve_keypair()[0]})  # b's federation file lists another key for a
    with pytest.raises(PeerUnreachable) as e:
        a.recv("b", "k")
    msg = str(e.value)
    assert f"handshake refused at {eps['b']}" in msg and "refused our key" in msg, msg
    assert a.connection_state("b")["state"] == "handshake refused"


def test_our_wrong_key_for_the_peer_is_a_refused_handshake(world):
    keys, eps, party = world
    a = party("a", public={"b": zmq.curve_keypair()[0]}, diagnose_s=0.3)  # our file has another key for b
    party("b")
    with pytest.raises(PeerUnreachable) as e:
        a.recv("b", "k")
    msg = str(e.value)
    assert f"handshake refused at {eps['b']}" in msg and "does not match its secret key" in msg, msg


def test_peer_up_but_silent_is_named_connected_but_silent(world):
    keys, eps, party = world
    a = party("a")
    party("b")  # up, never sends
    wait_for(lambda: a.connection_state("b")["state"] == "connected", what="the handshake")
    with pytest.raises(PeerTimeout) as e:
        a.recv("b", "k", timeout=0.1)
    msg = str(e.value)
    assert "connected but silent" in msg and eps["b"] in msg, msg
    assert not isinstance(e.value, PeerUnreachable)
