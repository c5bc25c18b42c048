"""What the CURVE ZeroMQ transport refuses: strangers' keys, impersonation,
replays, foreign runs, oversized frames; and that it keeps serving afterwards.

Each test runs one live ``ZmqParty`` ("server") in this process and talks to
it through raw DEALER sockets that play the other parties (or an attacker),
so every message crosses a real CURVE handshake over loopback TCP.
"""
from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from fedhet.parties import codec
from fedhet.parties.api import PeerFault, PeerTimeout
from fedhet.parties.zmq_transport import WIRE_OVERHEAD, InsecureTransportWarning, ZmqParty

from net_tools import loopback_endpoints, wait_for  # a helper module of tests/

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

ROLES = {"server": "server", "client1": "client", "client2": "client"}
RUN = "run-under-test"
QUIET = logging.getLogger("fedhet.test.quiet")
QUIET.setLevel(logging.CRITICAL)


class Live:
    """A running server party plus the key material an attacker might hold."""

    def __init__(self, max_message_bytes=codec.DEFAULT_MAX_MESSAGE_BYTES):
        self.keys = {n: zmq.curve_keypair() for n in ROLES}  # name -> (public, secret)
        self.endpoints = loopback_endpoints(ROLES)
        self.party = ZmqParty(
            "server", ROLES, self.endpoints, public_keys={n: k[0] for n, k in self.keys.items()},
            secret_key=self.keys["server"][1], run_id=RUN, timeout=2.0,
            max_message_bytes=max_message_bytes, logger=QUIET,
        )
        self.ctx = zmq.Context()
        self.socks: list[zmq.Socket] = []  # held so no socket is collected (and its queue dropped) early

    def dealer(self, public: bytes | None, secret: bytes | None, curve: bool = True) -> zmq.Socket:
        s = self.ctx.socket(zmq.DEALER)
        s.linger = 0
        if curve:
            s.curve_serverkey = self.keys["server"][0]
            s.curve_publickey, s.curve_secretkey = public, secret
        s.connect(self.endpoints["server"])
        self.socks.append(s)
        return s

    def as_party(self, name: str) -> zmq.Socket:
        return self.dealer(*self.keys[name])

    def close(self):
        self.ctx.destroy(linger=0)  # closes every socket made here, monitors included
        self.party._transport_close()


@pytest.fixture
def live():
    lv = Live()
    yield lv
    lv.close()


def env(frm="client1", seq=0, kind="k", payload=None, run=RUN, to="server"):
    if payload is None:
        payload = {"x": np.arange(4, dtype=np.float32), "seq": seq}
    return codec.encode(run, frm, to, kind, seq, payload)


def delivered(party) -> int:
    return sum(party.messages_received.values())


def test_key_outside_the_federation_cannot_deliver(live):
    stranger_pub, stranger_sec = zmq.curve_keypair()
    s = live.dealer(stranger_pub, stranger_sec)
    s.send_multipart(env(frm="client1"))  # well-formed, and claims a listed name
    wait_for(lambda: live.party._zap.denied > 0, what="the ZAP handler to refuse the key")
    with pytest.raises(PeerTimeout):
        live.party.recv("client1", "k", timeout=0.5)
    assert delivered(live.party) == 0

    # No CURVE at all (a plain NULL client) gets nowhere either.
    plain = live.dealer(None, None, curve=False)
    plain.send_multipart(env(frm="client1"))
    with pytest.raises(PeerTimeout):
        live.party.recv("client1", "k", timeout=0.5)
    assert delivered(live.party) == 0

    # Control: the same message under client1's own key goes through, seq 0 unused.
    live.as_party("client1").send_multipart(env(frm="client1"))
    got = live.party.recv("client1", "k", timeout=60)
    np.testing.assert_array_equal(got["x"], np.arange(4, dtype=np.float32))


def test_listed_party_cannot_send_under_another_name(live):
    live.as_party("client1").send_multipart(env(frm="client2", kind="spoof"))
    wait_for(lambda: live.party.rejected, what="a rejection")
    assert "'client1' tried to send as 'client2'" in live.party.rejected[0]
    with pytest.raises(PeerTimeout):
        live.party.recv("client2", "spoof", timeout=0.3)
    # The real client2 still starts at seq 0: the forgery consumed nothing.
    live.as_party("client2").send_multipart(env(frm="client2", kind="real"))
    assert live.party.recv("client2", "real", timeout=5)["seq"] == 0


def test_listed_party_cannot_lock_another_out_by_taking_its_routing_id(live):
    # client2 connects first under the ZeroMQ routing id "client1"...
    evil = live.ctx.socket(zmq.DEALER)
    evil.linger = 0
    evil.routing_id = b"client1"
    evil.curve_serverkey = live.keys["server"][0]
    evil.curve_publickey, evil.curve_secretkey = live.keys["client2"]
    evil.connect(live.endpoints["server"])
    live.socks.append(evil)
    evil.send_multipart(env(frm="client2", kind="first"))
    live.party.recv("client2", "first", timeout=5)
    # ...and the real client1, a ZmqParty as the transport configures it, still gets through.
    c1 = ZmqParty("client1", ROLES, live.endpoints, public_keys={n: k[0] for n, k in live.keys.items()},
                  secret_key=live.keys["client1"][1], run_id=RUN, timeout=2.0, logger=QUIET)
    try:
        c1.send("server", "k", {"hello": 1})
        assert live.party.recv("client1", "k", timeout=5) == {"hello": 1}
    finally:
        c1._transport_close()


def test_replayed_out_of_order_and_foreign_messages_are_rejected(live):
    c1 = live.as_party("client1")
    first = env(seq=0)
    c1.send_multipart(first)
    assert live.party.recv("client1", "k", timeout=5)["seq"] == 0

    def rejected_with(frames, sock, needle):
        n = len(live.party.rejected)
        sock.send_multipart(frames)
        wait_for(lambda: len(live.party.rejected) > n, what=f"rejection ({needle})")
        assert needle in live.party.rejected[n], live.party.rejected[n]

    rejected_with(first, c1, "replayed message from 'client1': seq 0, expected 1")
    # The same captured frames replayed over a fresh connection with the same key.
    rejected_with(first, live.as_party("client1"), "replayed")
    rejected_with(env(seq=5), c1, "out-of-order message from 'client1': seq 5, expected 1")
    rejected_with(env(seq=1, run="an-earlier-run"), c1, "another run 'an-earlier-run'")
    rejected_with(env(seq=1, to="client2"), c1, "addressed to 'client2'")
    rejected_with(env(seq=1, frm="mallory"), c1, "unknown party 'mallory'")
    assert delivered(live.party) == 1
    # Only client1's key can put a message on its link, and an honest party never repeats or skips a
    # sequence number: every wait on client1 now fails at once, naming client1 (a stolen key sweeping
    # sequence numbers is named, not mistaken for silence).
    with pytest.raises(PeerFault, match="client1.*out of sequence"):
        live.party.recv("client1", "k", timeout=5)
    # None of that moved the expected sequence number.
    assert live.party._seq_in["client1"] == 1


def test_oversized_frame_drops_the_connection_and_the_party_keeps_running():
    limit = 64 << 10
    lv = Live(max_message_bytes=limit)
    try:
        assert lv.party.router.maxmsgsize == limit + WIRE_OVERHEAD
        c1 = lv.as_party("client1")
        mon = c1.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        big = env(payload={"x": np.zeros(1 << 18, dtype=np.float32)})  # one 1 MiB frame
        c1.send_multipart(big)
        seen = []
        deadline = time.monotonic() + 5
        while zmq.EVENT_DISCONNECTED not in seen and time.monotonic() < deadline:
            if mon.poll(100):
                seen.append(recv_monitor_message(mon)["event"])
        assert zmq.EVENT_DISCONNECTED in seen, "the receiver should drop a connection that sends an oversized frame"
        assert delivered(lv.party) == 0 and lv.party._rx.is_alive()

        # The decoder's own limit: each frame is under ZMQ_MAXMSGSIZE, the message is not.
        two = env(frm="client2", payload=[np.zeros(10 << 10, np.float32), np.zeros(10 << 10, np.float32)])
        assert all(len(memoryview(f)) < limit for f in two) and sum(len(memoryview(f)) for f in two) > limit
        c2 = lv.as_party("client2")
        c2.send_multipart(two)
        wait_for(lambda: lv.party.rejected, what="the decoder to refuse the message")
        assert "exceeds the limit" in lv.party.rejected[0]

        # Still serving both peers, from the sequence numbers they had.
        c1.send_multipart(env(seq=0, payload={"ok": 1}))
        assert lv.party.recv("client1", "k", timeout=5) == {"ok": 1}
        c2.send_multipart(codec.encode(RUN, "client2", "server", "k", 0, "small"))
        assert lv.party.recv("client2", "k", timeout=5) == "small"
    finally:
        lv.close()


def test_decoder_limit_counts_all_frames():
    frames = env(payload=[np.zeros(100, np.uint8), np.zeros(100, np.uint8)])
    codec.decode(frames, max_bytes=sum(len(memoryview(f)) for f in frames))
    with pytest.raises(codec.MalformedMessage, match="exceeds the limit"):
        codec.decode(frames, max_bytes=sum(len(memoryview(f)) for f in frames) - 1)


def test_insecure_mode_works_and_warns():
    roles = {"a": "x", "b": "x"}
    eps = loopback_endpoints(roles)
    with pytest.warns(InsecureTransportWarning, match="CURVE is OFF"):
        a = ZmqParty("a", roles, eps, insecure=True, run_id=RUN, timeout=5, logger=QUIET)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", InsecureTransportWarning)
        b = ZmqParty("b", roles, eps, insecure=True, run_id=RUN, timeout=5, logger=QUIET)
    try:
        x = np.random.default_rng(0).normal(size=(3, 5))
        a.send("b", "t", {"x": x})
        np.testing.assert_array_equal(b.recv("a", "t")["x"], x)
        b.send("a", "t", "back")
        assert a.recv("b", "t") == "back"
        # Plain senders cannot reach a CURVE party.
        lv = Live()
        try:
            s = lv.dealer(None, None, curve=False)
            s.send_multipart(env())
            with pytest.raises(PeerTimeout):
                lv.party.recv("client1", "k", timeout=0.5)
        finally:
            lv.close()
    finally:
        a._transport_close()
        b._transport_close()


def test_failed_party_does_not_linger_on_messages_for_a_dead_peer():
    """Messages queued for a peer that never answers hold a clean close for the
    linger time (the federation timeout); a failed party's short linger does not."""
    keys = {n: zmq.curve_keypair() for n in ROLES}
    eps = loopback_endpoints(ROLES)  # nobody listens at client1's
    party = ZmqParty("server", ROLES, eps, public_keys={n: k[0] for n, k in keys.items()},
                     secret_key=keys["server"][1], run_id=RUN, timeout=30.0, logger=QUIET)
    party.send("client1", "data", {"x": np.zeros(1000)})
    t0 = time.monotonic()
    party._transport_close(linger_s=0.1)
    assert time.monotonic() - t0 < 10.0  # a 30 s linger would hold it here
