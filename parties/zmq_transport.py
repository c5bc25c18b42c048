"""ZeroMQ transport: one OS process per party, CURVE on every connection.

Topology: every party binds one ROUTER socket at its endpoint (a CURVE
server) and connects one DEALER to each peer's endpoint (a CURVE client
pinned to that peer's public key) when it first sends to that peer, so
parties that never talk hold no connection to each other.  Many parties
of one process (a host) may share one context (:class:`SharedContext`).  A ZAP handler on the ROUTER admits only
the public keys of the federation and reports the matching party name as the
connection's User-Id; ``Party._deliver`` then rejects any envelope whose
sender differs from that authenticated name.

CURVE is libzmq's CurveZMQ (X25519 key agreement, XSalsa20-Poly1305 boxes,
perfect forward secrecy per connection); nothing cryptographic is done here
beyond configuring it.  ``insecure=True`` turns it off, for measuring its cost
only: the sender can then no longer be authenticated, and a warning says so.

Bounded memory against a listed peer.  libzmq caps each *frame*
(``ZMQ_MAXMSGSIZE``) but buffers a multipart message whole before the
application sees any of it, whatever its length.  So:

* every frame is capped at ``frame_bytes`` (the codec's chunk size, or the
  message budget if smaller); the codec splits large arrays into such chunks;
* a message that fits in one frame budget goes as one multipart message, as
  always; a larger one is *streamed*: ``[STREAM_START, header]`` and then each
  data frame as its own single-part message.  The receiver checks the header
  against its budget and the run before it keeps any data (:class:`_Streams`),
  and holds at most one unfinished message per sender;
* ``ZMQ_RCVHWM`` bounds the complete messages libzmq queues per connection;
  on the DEALERs, which never receive, a peer may leave one message of at
  most ``DEALER_MAX_FRAME`` bytes;
* :class:`_ConnectionGuard` watches, per TCP connection, the bytes libzmq has
  read off the socket (``TCP_INFO``) against the bytes it handed to us
  (``ZMQ_SRCFD`` of each received frame).  An honest connection never holds
  more than its queue plus one frame in between; a connection that holds more
  (a hostile multipart message that libzmq is still assembling) is shut down,
  which makes libzmq drop what it buffered.  Linux only.

Outsiders: unauthenticated connections never get past the CURVE handshake,
which must finish within ``handshake_s`` (``ZMQ_HANDSHAKE_IVL``) or the
connection is dropped, so idle connections cannot pile up.

Listed peers (they pass the handshake) are bounded per connection, too:

* every connection a party dials starts with a one-frame :data:`HELLO` as soon as its
  handshake succeeds, so the receiver learns at once whose key it carries (libzmq says
  so only with each message).  An accepted connection that delivers no message within
  ``identify_s`` is dropped, whatever key it proved;
* each listed key may hold ``conns_per_peer`` identified connections (beyond, its longest
  idle one is dropped) and ``conns_per_peer`` connections not yet identified (beyond, the
  ZAP handler turns new ones away), so 1,000 idle connections under one key hold a
  handful of descriptors, not 1,000;
* a connection on which an unfinished message arrives slower than ``min_rate`` bytes/s
  (averaged since it began, checked after ``identify_s``) is dropped: a slow-loris.
  Idle connections (no unfinished message) are never dropped.

Connections diagnosed: a party dials the peers a declared message can pass between
(:meth:`~fedhet.parties.api.Party.linked_peers`) at once, and each DEALER's socket monitor
tells apart "no TCP connection", "handshake refused" and "connected" (:class:`Link`); a handshake
closed early is retried on libzmq's reconnect back-off, and only the peer's ZAP refusal of our key,
or :data:`EARLY_CLOSES_CONCLUSIVE` early closes in a row, calls it refused.
:meth:`ZmqParty.connection_state` says which; a timeout's message names the endpoint and
that state; a link that stays bad for ``diagnose_s`` is logged (WARNING) and put into the
party's status (``"links"``).  A waiting ``recv`` fails early (:class:`PeerUnreachable`)
when its peer refused the handshake for ``diagnose_s`` (a key mismatch does not heal), and,
with ``unreachable_s`` set, when it had no TCP connection for that long.
"""
from __future__ import annotations

import collections
import errno
import fcntl
import os
import select
import socket
import struct
import termios
import threading
import time
import warnings
from typing import Any, Iterable

import zmq
import zmq.utils.z85
from zmq.utils.monitor import parse_monitor_message

from . import codec
from .api import Party, PartyError, PeerTimeout
from .codec import MalformedMessage, MessageTooLarge, short
from .netlink import LinkProfile, LinkShaper

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = "fedhet"
# First part of the two-part message that opens a streamed message (header follows).
STREAM_START = b"\x00fedhet-stream-1"
RCV_HWM = 4  # complete messages libzmq may queue per connection before it stops reading it
HANDSHAKE_S = 10.0  # an unauthenticated connection must finish the CURVE handshake within this
REJECTS_KEPT = 100  # reject reasons kept (and logged) verbatim; beyond, counted by reason
# libzmq applies ZMQ_MAXMSGSIZE to the frame as it arrives, i.e. to the CURVE box around it (33 bytes more)
WIRE_OVERHEAD = 64
DEALER_MAX_FRAME = 64 << 10  # what a peer may send back on a connection we opened (it should send nothing)
# The first message on every connection a party dials (sent when its handshake succeeds): it names the
# connection's key to the receiver at once.  Not an envelope: the receiver only counts it.
HELLO = b"\x00fedhet-hello-1"
# Pending TCP connections a party's listening socket queues (the kernel caps it at net.core.somaxconn).
# libzmq's default of 100 is below what a party meets when every listed peer dials it at once (K = 100
# SecAgg clients each dial all the others): the kernel then drops SYNs or answers with cookies, and the
# handshakes crawl past the guard's identify window.
LISTEN_BACKLOG = 1024
IDENTIFY_S = HANDSHAKE_S  # an accepted connection must deliver a message (its hello) within this
CONNS_PER_PEER = 4  # identified connections per listed key, and as many not yet identified
MIN_RATE = 1024  # bytes/s an unfinished message must arrive at, on average, once it is identify_s old
FD_RESERVE = 256  # descriptors no unidentified connection may take: the party's files, libraries, listed peers


def unidentified_cap(peers: int) -> int:
    """How many accepted connections may wait at once to say whose key they carry: the process's
    open-file limit less a reserve for the party's own files (checkpoints, transcript, metrics), its
    libraries and its listed peers' connections.  Beyond it the oldest waiting one is shut, so strangers
    can never take the descriptors a checkpoint write needs."""
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, ValueError, OSError):   # pragma: no cover - not POSIX
        return 1 << 30
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(16, soft - FD_RESERVE - 2 * CONNS_PER_PEER * peers)
DIAGNOSE_S = 5.0  # a dialled link bad this long is reported; a refused handshake then fails the waiting recv
DIAL_RECONNECT_MAX_MS = 500  # reconnect back-off cap: a dead peer costs two retries a second, not ten


class PeerUnreachable(PeerTimeout):
    """A recv gave up early: the link to its peer had no TCP connection, or its handshake was refused."""

    def __init__(self, me: str, peer: str, kind: str, link: str, bad_for: float):
        PartyError.__init__(self, f"party {me!r} stopped waiting for a {kind!r} message from {peer!r}: {link}")
        self.peer, self.kind, self.timeout = peer, kind, bad_for


# States of a dialled link (:class:`Link`)
NO_TCP = "no TCP connection"
HANDSHAKING = "handshaking"
REFUSED = "handshake refused"
UP = "connected"
LOST = "connection lost"
BAD_STATES = (NO_TCP, HANDSHAKING, REFUSED, LOST)
SLOW_HANDSHAKE_S = 2.0  # a peer that refuses our HELLO closes at once; one that closes later timed out
# Consecutive handshakes closed early (no ZAP verdict) after which the link is called refused: a peer that
# cannot open our HELLO (we hold another key for it) closes every one, a busy one only some.  Each early
# close is retried on libzmq's reconnect back-off (100 ms doubling to DIAL_RECONNECT_MAX_MS).
EARLY_CLOSES_CONCLUSIVE = 10
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                     zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Link:
    """What a party knows of the connection it dials to one peer, from the DEALER's socket monitor.

    No TCP connection (``CONNECT_DELAYED`` / ``CONNECT_RETRIED`` without ``CONNECTED``), a
    handshake refused (``HANDSHAKE_FAILED_*``: the peer's ZAP handler refused our key, or the
    peer could not open our HELLO because we hold another public key for it), or up
    (``HANDSHAKE_SUCCEEDED``).  A refusal stays the diagnosis through reconnects until a
    handshake succeeds or a TCP connection fails outright.
    """

    def __init__(self, peer: str, endpoint: str):
        self.peer, self.endpoint = peer, endpoint
        self.state, self.detail = NO_TCP, "dialling, no attempt finished yet"
        self.since, self.t = time.time(), time.monotonic()
        self.tcp = False  # the current attempt reached TCP
        self.connected_at = 0.0  # monotonic time of the last TCP connection
        self.attempts = 0  # failed TCP attempts since the state was entered
        self.reported = False  # logged and put into the status for this episode
        self.lost_at: float | None = None  # monotonic time an up connection broke (None: up, or never was)
        self.early_closes = 0  # handshakes closed early in a row, without a ZAP verdict (retried)
        self.retries = 0  # every handshake retried over the link's life (early closes, turned away, timed out)

    def _enter(self, state: str, detail: str) -> None:
        if state != self.state:
            self.state, self.since, self.t, self.reported = state, time.time(), time.monotonic(), False
        self.detail = detail

    def event(self, ev: int, value: int) -> bool:
        """Take one monitor event; True when a handshake just succeeded."""
        if ev == zmq.EVENT_CONNECT_DELAYED:
            self.tcp = False
        elif ev == zmq.EVENT_CONNECT_RETRIED and not self.tcp:
            self.attempts = self.attempts + 1 if self.state == NO_TCP else 1
            self._enter(NO_TCP, f"{self.attempts} attempt(s) refused or unanswered")
        elif ev == zmq.EVENT_CONNECTED:
            self.tcp, self.connected_at = True, time.monotonic()
            if self.state != REFUSED:
                self._enter(HANDSHAKING, "TCP connected, the CURVE handshake has not finished")
        elif ev == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._enter(UP, "CURVE handshake succeeded")
            self.lost_at, self.early_closes = None, 0
            return True
        elif ev == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and time.monotonic() - self.connected_at > SLOW_HANDSHAKE_S:
            # closed after a long handshake: its deadline passed (a peer too busy to answer), not a refusal
            self.retries += 1
            self._enter(HANDSHAKING, "the CURVE handshake timed out; retrying")
        elif ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH and value != 500:
            self._enter(REFUSED, self._refusal(ev, value))  # the peer's ZAP handler refused our key: conclusive
        elif ev in _HANDSHAKE_FAILED:
            # closed early, or turned away for now (too many connections under our key): retried on the
            # reconnect back-off; only a run of early closes with no success says our key for it is wrong
            self.retries += 1
            self.early_closes += ev != zmq.EVENT_HANDSHAKE_FAILED_AUTH
            if self.early_closes >= EARLY_CLOSES_CONCLUSIVE:
                self._enter(REFUSED, self._refusal(ev, value))
            elif self.state != REFUSED:
                self._enter(HANDSHAKING, f"the CURVE handshake was closed early or turned away {self.retries} "
                            "time(s); retrying")
        elif ev == zmq.EVENT_DISCONNECTED and self.state == UP:
            self._enter(LOST, "the connection closed or broke; reconnecting")
            self.lost_at = time.monotonic()
        return False

    def _refusal(self, ev: int, value: int) -> str:
        if ev == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            if value == 500:
                return f"{self.peer!r} turned the connection away (too many connections under our key)"
            return (f"{self.peer!r} refused our key (ZAP status {value}): its federation file lists another "
                    "public key for us, or does not list us")
        if ev == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            return "protocol error in the CURVE handshake: is a fedhet party of this federation listening there?"
        return (f"{self.peer!r} closed the connection during the CURVE handshake {self.early_closes} times in a "
                "row: the public key we hold for it does not match its secret key (our federation file lists "
                "another key for it)")

    def bad_for(self) -> float:
        return time.monotonic() - self.t

    def describe(self) -> str:
        ep, dur = self.endpoint, f"{self.bad_for():.1f}s"
        if self.state == LOST or (self.lost_at is not None and self.state == NO_TCP):
            gone = time.monotonic() - (self.lost_at if self.lost_at is not None else self.t)
            return (f"connection to {ep} lost {gone:.1f}s ago and not re-established (the party stopped, "
                    "or the network between us broke)")
        if self.state == NO_TCP:
            return (f"no TCP connection to {ep} for {dur} ({self.detail}): nothing accepts connections there "
                    "(wrong host or port, a firewall, or the party is not running)")
        if self.state == HANDSHAKING:
            return f"TCP connection to {ep} made, but the CURVE handshake has not finished for {dur}"
        if self.state == REFUSED:
            return f"handshake refused at {ep} (for {dur}): {self.detail}"

        return f"connected but silent: our connection to {ep} is up (CURVE handshake succeeded {dur} ago)"

    def as_dict(self) -> dict:
        return {"state": self.state, "endpoint": self.endpoint, "since": self.since,
                "for_s": round(self.bad_for(), 3), "detail": self.detail}


class InsecureTransportWarning(UserWarning):
    pass


class _ZapHandler(threading.Thread):
    """ZAP (RFC 27) server: CURVE keys on the allow-list map to party names."""

    def __init__(self, ctx: zmq.Context, allowed: dict[bytes, str], log, insecure: bool,
                 domain: bytes = ZAP_DOMAIN.encode(), admit=None):
        super().__init__(name="zap", daemon=True)
        # ZAP domain -> (z85 public key -> party name, log, admit): one domain per party's ROUTER, so
        # parties sharing a context (a host process) share one handler yet admit only their peers.
        # ``admit(name)``: None to let a listed key in, else why not now (its connection budget).
        self.domains: dict[bytes, tuple[dict[bytes, str], Any, Any]] = {domain: (allowed, log, admit)}
        self.log = log
        self.insecure = insecure
        self.sock = ctx.socket(zmq.REP)
        self.sock.linger = 0
        self.sock.bind(ZAP_ENDPOINT)
        self._halt = threading.Event()
        self.denied = 0

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._halt.is_set():
            try:
                if not dict(poller.poll(100)):
                    continue
                msg = self.sock.recv_multipart()
            except zmq.ZMQError:
                break
            try:
                version, request_id, domain, address, _identity, mechanism = msg[:6]
                creds = msg[6:]
                status, text, user = b"400", b"denied", b""
                allowed, log, admit = self.domains.get(domain, ({}, self.log, None))
                if mechanism == b"CURVE" and len(creds) == 1 and len(creds[0]) == 32:
                    key = zmq.utils.z85.encode(creds[0])
                    name = allowed.get(key)
                    busy = None if name is None or admit is None else admit(name)
                    if busy is not None:  # a listed key over its connection budget
                        # 500, not 300 ("try later"): libzmq closes a connection at once only on 4xx / 5xx
                        self.denied += 1
                        status, text = b"500", b"connection budget"
                        self._warn(log, "ZAP: turned away a connection of %s: %s", name, busy)
                    elif name is not None:
                        status, text, user = b"200", b"OK", name.encode()
                    else:
                        self.denied += 1
                        self._warn(log, "ZAP: refused CURVE key %s from %s (not in the federation)",
                                   key.decode(), short(address.decode(errors="replace")))
                elif mechanism == b"NULL" and self.insecure:
                    status, text = b"200", b"OK (insecure)"
                else:
                    self.denied += 1
                    self._warn(log, "ZAP: refused %s connection from %s", short(mechanism.decode(errors="replace")),
                               short(address.decode(errors="replace")))
                self.sock.send_multipart([version, request_id, status, text, user, b""])
            except Exception as e:  # a garbled ZAP request must not kill the handler
                self._warn(self.log, "ZAP: bad request: %s", short(str(e)))
                try:
                    self.sock.send_multipart([b"1.0", b"", b"500", b"error", b"", b""])
                except zmq.ZMQError:
                    pass

    def _warn(self, log, fmt: str, *args) -> None:
        # An outsider can knock as often as it likes: log the first refusals, then every 1000th.
        if self.denied <= REJECTS_KEPT or self.denied % 1000 == 0:
            log.warning(fmt + (f" ({self.denied} refused so far)" if self.denied > REJECTS_KEPT else ""), *args)

    def stop(self) -> None:
        self._halt.set()


class SharedContext:
    """One ``zmq.Context`` (I/O thread, reaper) and one ZAP handler for many parties of one process.

    A host process (:mod:`fedhet.parties.host`) passes it to every :class:`ZmqParty` it runs.
    Each party's ROUTER gets a ZAP domain of its own, so the shared handler admits, per party,
    exactly the keys that party would admit alone.  :meth:`close` after every party closed.
    """

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        # libzmq's default of 1023 sockets per context is for one party; each party here has a
        # ROUTER, a DEALER per peer and a monitor per socket.  Only the OS's descriptor limit bounds it.
        self.ctx.max_sockets = self.ctx.get(zmq.SOCKET_LIMIT)
        self._zap: _ZapHandler | None = None
        self._lock = threading.Lock()

    def register(self, name: str, allowed: dict[bytes, str], log, insecure: bool, admit=None) -> bytes:
        """Admit ``allowed`` keys on party ``name``'s ROUTER; returns the ZAP domain it must use."""
        domain = f"{ZAP_DOMAIN}/{name}".encode()
        with self._lock:
            if self._zap is None:
                self._zap = _ZapHandler(self.ctx, allowed, log, insecure, domain, admit)
                self._zap.start()
            else:
                if self._zap.insecure != insecure:
                    raise ValueError("every party of a shared context must be secure, or every one --insecure")
                self._zap.domains[domain] = (allowed, log, admit)
        return domain

    def close(self) -> None:
        with self._lock:
            if self._zap is not None:
                self._zap.stop()
                self._zap.join(timeout=2)
                self._zap.sock.close(linger=0)
                self._zap = None
        self.ctx.term()


RX_IDLE_MS = 5000  # the receive loop's backstop wake-up; messages and closing wake it at once


def _wire_bytes(n: int, curve: bool) -> int:
    """Bytes one frame of ``n`` bytes takes on the wire (ZMTP 3 framing, CURVE MESSAGE box)."""
    body = n + (33 if curve else 0)  # "\\x07MESSAGE" + 8-byte nonce + 16-byte MAC + flags byte
    return body + (2 if body <= 255 else 9)


class _ConnectionGuard(threading.Thread):
    """Shuts down connections on which libzmq buffers more than ``limit`` bytes we were not given,
    accepted connections that never say whose key they carry or trickle a message, and the
    connections of a listed key beyond its budget; and feeds the dialled links' monitor events
    to the party (:class:`Link`).

    Per accepted TCP connection (socket monitor: ACCEPTED / DISCONNECTED give
    its fd): received = bytes TCP took in (``TCP_INFO.tcpi_bytes_received``)
    minus bytes still in the kernel queue (``FIONREAD``); credited = wire size
    of every frame the receive loop read from that fd (``ZMQ_SRCFD``).  The
    difference is what libzmq holds: the partial frame, the queued complete
    messages (``RCV_HWM``) and any multipart message still being assembled.

    Event-driven, so that hundreds of idle parties in one host cost nothing:
    each connection's fd is also in an edge-triggered epoll set of the guard's
    own, which reports every arrival of new bytes.  Only connections that got
    bytes (or were credited) since the last look are measured, at most every
    ``TICK_S`` while bytes keep coming; a connection stays "active" until its
    kernel queue is empty and nothing new came, because libzmq may still move
    queued bytes into its own buffers without another arrival.  Held bytes can
    then only fall (by credits), so an idle connection needs no polling.
    Between two looks a connection can take at most one tick of traffic
    beyond its limit (plus the kernel's receive buffer), as with a fixed tick.

    Timed checks cover only connections that need them: accepted ones not yet
    identified (no message yet; dropped ``identify_s`` after they were accepted) and
    identified ones with an unfinished message (dropped when it has taken ``identify_s``
    and arrives slower than ``min_rate``).  Byte measurements need Linux (``TCP_INFO``,
    epoll); elsewhere only the budget, identification and link checks run.
    """

    TICK_S = 0.01
    IDLE_S = 1.0  # wake-up when nothing happens at all (a backstop; events and stop() wake it sooner)
    DRAIN_GRACE_S = 0.5  # libzmq's own thread decodes what it read into the queue within this
    _EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
    _DIAL_EVENTS = (_EVENTS | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_HANDSHAKE_SUCCEEDED
                    | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    def __init__(self, watched: list, total_limit: int, curve: bool, log, identify_s: float = IDENTIFY_S,
                 min_rate: float = MIN_RATE, per_peer: int = CONNS_PER_PEER, on_link=None, tick=None,
                 max_unidentified: int = 1 << 30):
        """``watched``: [(socket, limit per connection)]; ``total_limit`` over all connections.

        ``on_link(peer, event, value)``: a monitor event of the socket :meth:`watch` was given
        ``peer`` for; ``tick()``: called on every wake-up, returns seconds until it is due again
        (None: not before the next event).
        """
        super().__init__(name="conn-guard", daemon=True)
        self.total_limit, self.curve, self.log = int(total_limit), curve, log
        self.identify_s, self.min_rate, self.per_peer = float(identify_s), float(min_rate), int(per_peer)
        self.max_unidentified = int(max_unidentified)   # accepted, not yet identified, at once (unidentified_cap)
        self.on_link, self.tick = on_link, tick
        self.monitors = [(sock, sock.get_monitor_socket(self._EVENTS), int(limit), None) for sock, limit in watched]
        # The listening sockets' monitors are read on every look; a dialled peer's (one per DEALER:
        # a server of K clients has K) only when its poll said it holds events, so a look costs
        # the same with 10 or 1,000 peers dialled.
        self._always = {id(mon) for _sock, mon, _limit, _peer in self.monitors}
        self._ready: set[int] | None = None   # ids of the dialled monitors the last poll found readable
        self._added: list = []  # monitors of sockets made later (watch), taken in by the guard's thread
        self._lock = threading.Lock()
        self._credit: dict[int, int] = collections.defaultdict(int)
        self._credited: dict[int, str | None] = {}  # fds credited since the last look -> User-Id
        # fd -> {"base", "t" (accept time), "tcp", "limit", "got", "held", "in" (accepted), "known" (identified),
        #        "user", "last" (last credit), "floor" (held with nothing unfinished), "start" (unfinished since)}
        self._conns: dict[int, dict] = {}
        self._active: set[int] = set()  # fds whose held bytes may still grow without a new arrival
        self._unknown: set[int] = set()  # accepted fds that have not delivered a message yet
        self._partial: set[int] = set()  # identified fds with an unfinished message
        self._holding: set[int] = set()  # fds whose last look found bytes held (not yet credited)
        self._keyed: dict[str, set[int]] = {}  # listed key's party -> its identified fds
        self._pending: dict[str, collections.deque] = {}  # party -> times ZAP admitted a connection not yet identified
        self._epoll = select.epoll() if hasattr(select, "epoll") else None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._halt = threading.Event()
        self.cut = 0  # connections shut down
        self.cut_by_reason: collections.Counter = collections.Counter()  # "limit", "silent", "slow", "budget"
        self.cut_users: collections.Counter = collections.Counter()  # listed party -> its connections cut
        # listed party -> unidentified connections cut that may have been its own: a handshake under its
        # key passed (ZAP) and had not identified itself when the cut came.  A gap in its sequence after
        # such a cut is a possible local loss.
        self.maybe_cut: collections.Counter = collections.Counter()
        self.breaks: collections.Counter = collections.Counter()  # listed party -> its connections that ended
        self.joined: collections.Counter = collections.Counter()  # listed party -> its connections made (either way)
        self.turned_away = 0  # connections the ZAP handler refused for the budget
        # When this party's receive loop last found nothing waiting (None: not told; every silent
        # connection is then judged at its deadline).  A connection is silent only if the loop
        # caught up after its deadline: before, its first message may be waiting in this party's
        # own queue, behind the messages a busy (loaded) party has not read yet.
        self.drained_at: float | None = None
        self.held_back = 0  # silent-connection checks put off because the receive loop was behind
        self.peak_held = 0  # largest total held bytes seen (for tests and logs)
        self.looks = 0  # connection measurements made (for tests: idle connections cost none)

    # called by the receive loop for every message it reads
    def credit(self, frames: list, user: str | None = None) -> None:
        try:
            fd = frames[0].get(zmq.SRCFD)
        except zmq.ZMQError:
            return
        n = sum(_wire_bytes(len(f), self.curve) for f in frames)
        with self._lock:
            self._credit[fd] += n
            self._credited[fd] = user
        if fd in self._unknown or fd not in self._conns:
            # identify it now (its ACCEPTED may not be taken in yet): its budget and the ZAP handler's
            # count depend on it
            self._wake()

    # called by the ZAP handler for every listed key that passed the handshake
    def admit(self, user: str) -> str | None:
        """None to admit one more connection of ``user``; else why not (too many not yet identified)."""
        now = time.monotonic()
        with self._lock:
            q = self._pending.setdefault(user, collections.deque())
            while q and now - q[0] > self.identify_s + 2 * self.IDLE_S:  # dropped by now, or identified
                q.popleft()
            if len(q) >= self.per_peer:
                self.turned_away += 1
                return (f"{len(q)} of its connections have not delivered a message yet "
                        f"(budget {self.per_peer} per listed key)")
            q.append(now)
        return None

    def _received(self, fd: int) -> tuple[int, int] | None:
        """(bytes libzmq took off this socket, bytes still in the kernel queue); None: not TCP, or gone."""
        if not hasattr(socket, "TCP_INFO"):
            return None
        try:
            s = socket.socket(fileno=fd)
        except OSError:
            return None
        try:
            info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            inq = bytearray(4)
            fcntl.ioctl(fd, termios.FIONREAD, inq)
        except OSError:
            return None
        finally:
            s.detach()
        if len(info) < 136:  # kernel without tcpi_bytes_received (Linux < 4.1)
            return None
        queued = struct.unpack("<i", inq)[0]
        return struct.unpack_from("<Q", info, 128)[0] - queued, queued

    def watch(self, sock, limit: int, peer: str | None = None) -> None:
        """Also watch ``sock`` (made after the guard started), ``limit`` bytes per connection;
        with ``peer``, its dialling events go to ``on_link``.

        Call before connecting it, so its first connection's event is not missed.
        """
        mon = sock.get_monitor_socket(self._DIAL_EVENTS if peer is not None else self._EVENTS)
        with self._lock:
            self._added.append((sock, mon, int(limit), peer))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # pipe full (already woken) or closed
            pass

    def _events(self, credited: dict | None = None) -> None:
        """Take in the monitors' events; ``credited``: fds credited since the last look (-> User-Id), so a
        connection that delivered a message and ended before this look is still known as its party's."""
        fresh: set[int] = set()
        if self._added:
            with self._lock:
                fresh = {id(m[1]) for m in self._added}
                self.monitors += self._added
                self._added = []
        ready = self._ready
        for _sock, mon, limit, peer in self.monitors:
            if ready is not None and id(mon) not in ready and id(mon) not in self._always and id(mon) not in fresh:
                continue
            while mon.poll(0):
                try:
                    ev = parse_monitor_message(mon.recv_multipart())
                except (zmq.ZMQError, ValueError):
                    break
                fd = ev["value"]
                if peer is not None and self.on_link is not None:
                    self.on_link(peer, ev["event"], ev["value"])
                if ev["event"] in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
                    if peer is not None and ev["event"] == zmq.EVENT_CONNECTED:
                        self.joined[peer] += 1
                    self._forget(fd)  # a reused fd number: what we knew of the old connection is void
                    got = self._received(fd)
                    inbound = ev["event"] == zmq.EVENT_ACCEPTED
                    with self._lock:
                        base = 0 if got is None else got[0] - self._credit[fd]
                    now = time.monotonic()
                    self._conns[fd] = {"base": base, "t": now, "tcp": got is not None, "limit": limit,
                                       "got": None, "held": 0, "in": inbound, "known": False, "user": None,
                                       "last": now, "floor": None, "start": None, "mon": id(mon)}
                    if inbound:
                        self._unknown.add(fd)
                        if len(self._unknown) > self.max_unidentified:
                            # the oldest goes: an honest connection identifies itself within a round trip,
                            # so only strangers grow old here, and a finite flood cannot starve a newcomer
                            old = min(self._unknown, key=lambda f: self._conns[f]["t"])
                            self._shut(old, 0, f"more than {self.max_unidentified} connections wait to identify "
                                       "themselves (descriptors are kept for this party's files and peers); the "
                                       "oldest goes", "unidentified")
                            if old == fd:
                                continue
                    if got is not None:
                        self._register(fd)
                        self._active.add(fd)
                elif ev["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                    c = self._conns.get(fd)
                    if c is not None and c["mon"] == id(mon):  # not a reused number now another socket's
                        if credited and c["in"] and not c["known"] and fd in credited:
                            self._identify(fd, credited[fd], time.monotonic())
                        who = peer if peer is not None else c["user"]
                        if who is not None and ev["event"] == zmq.EVENT_DISCONNECTED:
                            self.breaks[who] += 1   # a peer's connection ended (it died, or the network broke)
                        self._forget(fd)

    def _register(self, fd: int) -> None:
        if self._epoll is None:
            return
        mask = select.EPOLLIN | select.EPOLLET
        try:
            self._epoll.register(fd, mask)
        except FileExistsError:  # a reused fd number still listed (libzmq closed the old one under us)
            self._epoll.modify(fd, mask)
        except OSError:
            pass

    def _forget(self, fd: int) -> None:
        c = self._conns.pop(fd, None)
        self._active.discard(fd)
        self._unknown.discard(fd)
        self._partial.discard(fd)
        self._holding.discard(fd)
        if c is not None and c["user"] is not None:
            self._keyed.get(c["user"], set()).discard(fd)
        if self._epoll is not None:
            try:
                self._epoll.unregister(fd)
            except (OSError, ValueError):  # closed already (epoll dropped it by itself)
                pass

    def _shut(self, fd: int, held: int, why: str, kind: str = "limit") -> None:
        self.cut += 1  # counted first: whoever sees the connection end sees it counted
        self.cut_by_reason[kind] += 1
        c = self._conns.get(fd) or {}
        user = c.get("user")
        if user is not None:
            self.cut_users[user] += 1
        try:
            s = socket.socket(fileno=fd)
            try:
                s.shutdown(socket.SHUT_RDWR)  # libzmq sees the end of the stream and drops what it holds
            finally:
                s.detach()
        except OSError:
            self.cut -= 1
            self.cut_by_reason[kind] -= 1
            if user is not None:
                self.cut_users[user] -= 1
            self._forget(fd)
            return
        if user is None and c.get("in"):
            # Any listed key with a handshake admitted and not yet identified may own it: the times do
            # not tell (this thread takes in a connection's ACCEPTED after its handshake when it is
            # busy), and counting one key too many only makes a later gap of its inconclusive.
            with self._lock:
                for u, q in self._pending.items():
                    if q:
                        self.maybe_cut[u] += 1
        self._forget(fd)
        if self.cut <= REJECTS_KEPT or self.cut % 100 == 0:
            self.log.warning("dropped a connection (%s; %d bytes of unfinished messages; %d dropped so far)",
                             why, held, self.cut)

    def _identify(self, fd: int, user: str | None, now: float) -> None:
        """``fd`` delivered a message under ``user``'s key: count it against that key's budget."""
        c = self._conns.get(fd)
        if c is None:
            return
        c["last"] = now
        if not c["in"] or c["known"]:
            return
        c["known"] = True
        self._unknown.discard(fd)
        if user is None:  # --insecure: no key to count it against
            return
        c["user"] = user
        self.joined[user] += 1
        with self._lock:
            q = self._pending.get(user)
            if q:
                q.popleft()
        mine = self._keyed.setdefault(user, set())
        mine.add(fd)
        while len(mine) > self.per_peer:
            old = min((f for f in mine if f != fd), key=lambda f: self._conns[f]["last"])
            self._shut(old, self._conns[old]["held"], f"{user!r} holds more than {self.per_peer} connections; "
                       "its longest idle one goes", "budget")

    def _unfinished(self, fd: int, c: dict, held: int, credited: bool, now: float) -> None:
        """Track an identified connection's unfinished message (bytes held beyond its floor)."""
        if credited:
            c["floor"] = held if c["floor"] is None else min(c["floor"], held)
        if c["floor"] is None:
            return
        if held - c["floor"] > 0:
            # The unfinished message is the one after the last message that completed: its clock
            # starts anew whenever one completes (credited), so a busy connection that keeps
            # delivering whole messages is never judged by the age of its first unfinished byte.
            if c["start"] is None or credited:
                c["start"] = now
            self._partial.add(fd)
        else:
            c["start"] = None
            self._partial.discard(fd)

    def check(self) -> None:
        # Credits first, then events: a connection's ACCEPTED is queued before any message on it
        # can be read, so every connection credited here is known once the events are in.
        with self._lock:
            credited = self._credited
            self._credited = {}
        self._events(credited)
        if self._epoll is not None:
            for fd, _ev in self._epoll.poll(0):
                if fd in self._conns:
                    self._active.add(fd)
        now = time.monotonic()
        for fd, user in credited.items():
            self._identify(fd, user, now)
        look = (self._active | credited.keys()) & self._conns.keys()
        for fd in look:
            c = self._conns[fd]
            if not c["tcp"]:
                self._active.discard(fd)
                continue
            got = self._received(fd)
            self.looks += 1
            if got is None:
                self._active.discard(fd)
                continue
            rcvd, queued = got
            with self._lock:
                c["held"] = rcvd - self._credit[fd] - c["base"]
            if c["held"] > 0:
                self._holding.add(fd)
            else:
                self._holding.discard(fd)
            if queued == 0 and rcvd == c["got"]:
                self._active.discard(fd)  # settled: nothing new came and nothing waits in the kernel
            else:
                self._active.add(fd)
            c["got"] = rcvd
            if c["in"] and c["known"]:
                self._unfinished(fd, c, c["held"], fd in credited, now)
        # only connections holding bytes count (the others add nothing): a look costs the same with
        # 10 or 1,000 connections open
        held = {fd: self._conns[fd]["held"] for fd in self._holding if fd in self._conns and self._conns[fd]["tcp"]}
        total = sum(max(0, h) for h in held.values())
        self.peak_held = max(self.peak_held, total)
        for fd, h in held.items():
            if fd in self._conns and h > self._conns[fd]["limit"]:
                self._shut(fd, h, f"limit {self._conns[fd]['limit']} per connection")
                total -= h
        if total > self.total_limit:  # many connections at once: youngest first
            for fd in sorted((fd for fd in held if fd in self._conns and held[fd] > 0),
                             key=lambda fd: -self._conns[fd]["t"]):
                if total <= self.total_limit:
                    break
                total -= held[fd]
                self._shut(fd, held[fd], f"limit {self.total_limit} over all connections")

    def timed(self) -> float | None:
        """Drop unidentified connections past ``identify_s`` and slow unfinished messages; returns
        seconds until the next such check is due (None: none is pending)."""
        now = time.monotonic()
        due: float | None = None
        for fd in list(self._unknown):
            c = self._conns.get(fd)
            if c is None:
                self._unknown.discard(fd)
                continue
            left = c["t"] + self.identify_s - now
            if left > 0:
                due = left if due is None else min(due, left)
                continue
            got = self._received(fd)
            if got is not None and got[1] > 0:  # bytes still wait in the kernel: let libzmq read them first
                due = self.TICK_S
                continue
            with self._lock:
                just = fd in self._credited   # it delivered a message since check() took the credits
            if just:
                due = self.TICK_S
                continue
            drained = self.drained_at
            if drained is not None and drained < c["t"] + self.identify_s + self.DRAIN_GRACE_S:
                # this party has not read all it was sent since the deadline: not evidence of silence
                if not c.get("held_back"):
                    c["held_back"] = True
                    self.held_back += 1
                due = self.IDLE_S if due is None else min(due, self.IDLE_S)
                continue
            self._shut(fd, c["held"], f"no message within {self.identify_s:g}s of connecting", "silent")
        for fd in list(self._partial):
            c = self._conns.get(fd)
            if c is None or c["start"] is None or c["floor"] is None:
                self._partial.discard(fd)
                continue
            took = now - c["start"]
            if took < self.identify_s:
                left = self.identify_s - took
                due = left if due is None else min(due, left)
                continue
            got = self._received(fd)
            if got is None:
                self._partial.discard(fd)
                continue
            with self._lock:
                unfinished = got[0] - self._credit[fd] - c["base"] - c["floor"]
            if unfinished <= 0:
                c["start"] = None
                self._partial.discard(fd)
            elif unfinished / took < self.min_rate:
                self._shut(fd, unfinished, f"an unfinished message arrived at {unfinished / took:.0f} bytes/s over "
                           f"{took:.0f}s, under the floor of {self.min_rate:g}", "slow")
            else:
                due = self.IDLE_S if due is None else min(due, self.IDLE_S)
        return due

    def run(self) -> None:
        poller = zmq.Poller()
        if self._epoll is not None:
            poller.register(self._epoll.fileno(), zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        registered = 0
        due: float | None = None
        while not self._halt.is_set():
            try:
                for _sock, mon, _limit, _peer in self.monitors[registered:]:
                    poller.register(mon, zmq.POLLIN)
                registered = len(self.monitors)
                wait = self.TICK_S if self._active else self.IDLE_S
                if due is not None:
                    wait = max(self.TICK_S, min(wait, due))
                self._ready = {id(sock) for sock, _ev in poller.poll(int(1000 * wait)) if isinstance(sock, zmq.Socket)}
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                if self._halt.is_set():
                    break
                self.check()
                due = self.timed()
                if self.tick is not None:
                    t = self.tick()
                    if t is not None:
                        due = t if due is None else min(due, t)
                if self._active:
                    self._halt.wait(self.TICK_S)  # bytes are flowing: look again after one tick, not at once
            except zmq.ZMQError:
                break
            except Exception as e:  # the guard must never take the party down
                self.log.warning("connection guard: %s: %s", type(e).__name__, short(str(e)))
                self._halt.wait(self.TICK_S)

    def stop(self) -> None:
        self._halt.set()
        self._wake()

    def close(self) -> None:
        with self._lock:
            self.monitors += self._added
            self._added = []
        for sock, mon, _limit, _peer in self.monitors:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            mon.close(linger=0)
        if self._epoll is not None:
            self._epoll.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


class _Stream:
    __slots__ = ("user", "plan", "header", "frames", "skip", "seen")

    def __init__(self, user, plan, header, skip: bool):
        self.user, self.plan, self.header, self.skip = user, plan, header, skip
        self.frames: list = []
        self.seen = 0


class _Streams:
    """Reassembles streamed messages per connection; at most one unfinished message per sender."""

    def __init__(self, party: "ZmqParty"):
        self.party = party
        self.open: dict[bytes, _Stream] = {}  # routing id -> stream
        self.by_user: dict[Any, bytes] = {}

    def feed(self, rid: bytes, user: str | None, frames: list) -> None:
        st = self.open.get(rid)
        if len(frames) == 2 and len(frames[0]) == len(STREAM_START) and frames[0].bytes == STREAM_START:
            if st is not None:
                self._drop(rid, st, "superseded by a new message")
            self._start(rid, user, frames[1])
            return
        if st is not None and len(frames) == 1:
            self._data(rid, st, frames[0])
            return
        if st is not None:
            self._drop(rid, st, "interrupted by another message")
        self.party._arrived([f.buffer for f in frames], authenticated=user)

    def _start(self, rid: bytes, user: str | None, header) -> None:
        p = self.party
        who = user or "?"
        why = None
        try:
            plan = codec.plan(header.buffer, p.max_message_bytes)
        except MessageTooLarge as e:  # refused, but its data frames are known: read and drop them
            plan, why = e.plan, f"malformed from {who}: {e}"
        except MalformedMessage as e:
            p._reject(f"malformed from {who}: {e}")
            return
        if not plan.frame_sizes:
            if why is not None:
                p._reject(why)
            else:
                p._arrived([header.buffer], authenticated=user)
            return
        key = user if user is not None else rid
        old = self.by_user.get(key)
        if old is not None and old in self.open:
            self._drop(old, self.open[old], "superseded by a new message on another connection")
        why = why or p._stream_refusal(plan, user)
        self.open[rid] = _Stream(user, plan, header, skip=why is not None)
        self.by_user[key] = rid
        if why is not None:  # refused before any data is kept; its data frames are read and dropped
            p._reject(why)

    def _data(self, rid: bytes, st: _Stream, frame) -> None:
        sizes = st.plan.frame_sizes
        k = st.seen
        if len(frame) != sizes[k]:
            self._drop(rid, st, f"data frame {k} has {len(frame)} bytes where the header announced {sizes[k]}")
            return
        st.seen += 1
        if not st.skip:
            st.frames.append(frame.buffer)
        if st.seen == len(sizes):
            self._close(rid, st)
            if not st.skip:
                self.party._arrived([st.header.buffer] + st.frames, authenticated=st.user)

    def _close(self, rid: bytes, st: _Stream) -> None:
        self.open.pop(rid, None)
        key = st.user if st.user is not None else rid
        if self.by_user.get(key) == rid:
            del self.by_user[key]

    def _drop(self, rid: bytes, st: _Stream, why: str) -> None:
        self._close(rid, st)
        if not st.skip:
            self.party._reject(f"unfinished {st.plan.kind!r} message from {st.user or '?'} "
                               f"({st.seen} of {len(st.plan.frame_sizes)} data frames) dropped: {why}")


class ZmqParty(Party):
    """A party whose peers are other processes reached over (CURVE-)ZeroMQ."""

    def __init__(
        self,
        name: str,
        roles: dict[str, str],
        endpoints: dict[str, str],
        public_keys: dict[str, bytes] | None = None,
        secret_key: bytes | None = None,
        insecure: bool = False,
        bind_endpoint: str | None = None,
        handshake_s: float = HANDSHAKE_S,
        context: SharedContext | None = None,
        diagnose_s: float = DIAGNOSE_S,
        unreachable_s: float | None = None,
        lost_s: float | None = None,
        identify_s: float = IDENTIFY_S,
        min_rate: float = MIN_RATE,
        conns_per_peer: int = CONNS_PER_PEER,
        network: LinkProfile | None = None,
        **kw: Any,
    ) -> None:
        """``diagnose_s``: a dialled link bad this long is logged and put into the status, and a
        recv waiting on a peer that refused the handshake that long fails (:class:`PeerUnreachable`).
        ``unreachable_s``: a recv waiting on a peer with no TCP connection for that long fails too
        (None: it waits out its timeout, as parties started by hand may come up minutes apart).
        ``identify_s``, ``min_rate``, ``conns_per_peer``: the bounds on accepted connections
        (module docstring).  ``network``: the simulated link each message from a peer crosses
        (:mod:`fedhet.parties.netlink`; None: loopback, delivered as the socket hands it over)."""
        super().__init__(name, roles, **kw)
        self._shaper = None if network is None else LinkShaper(network, self._checked, name)
        missing = [p for p in roles if p not in endpoints]
        if missing:
            raise ValueError(f"no endpoint for parties {missing}")
        self._init_links(diagnose_s, unreachable_s, lost_s)
        self._check_security(insecure, secret_key, public_keys)
        # Largest frame on the wire in either direction (see the module docstring).
        self.frame_bytes = max(1, min(self.max_message_bytes, codec.CHUNK_BYTES))
        self.reject_count = 0
        self.rejects_by_reason: collections.Counter = collections.Counter()
        public_keys = public_keys or {}  # --insecure runs have none
        self._shared = context  # None: this party owns its context (and ZAP handler) and ends them
        if context is None:
            self.ctx = zmq.Context()
            # a DEALER and its monitor per dialled peer: libzmq's default of 1,023 sockets stopped a
            # server of 500 clients started as a process of its own (as in a host's SharedContext)
            self.ctx.max_sockets = self.ctx.get(zmq.SOCKET_LIMIT)
        else:
            self.ctx = context.ctx
        self.router = self._router(context, public_keys, secret_key, handshake_s)
        # One DEALER per peer, made and connected on the first message to it (:meth:`_dealer`):
        # a party connects only to the peers it talks to, so hundreds of parties that never
        # talk to each other hold no connections (and descriptors) for each other.
        self.dealers: dict[str, zmq.Socket] = {}
        self._endpoints = dict(endpoints)
        self._public_keys, self._secret_key = public_keys, secret_key
        per_conn = (RCV_HWM + 2) * self.frame_bytes + (1 << 20)
        self._guard: _ConnectionGuard | None = _ConnectionGuard(
            [(self.router, per_conn)], (len(self.peers) + 2) * per_conn, curve=not insecure, log=self.log,
            identify_s=identify_s, min_rate=min_rate, per_peer=conns_per_peer, on_link=self._link_event,
            tick=self._check_links, max_unidentified=unidentified_cap(len(self.peers)))
        self.router.bind(bind_endpoint or endpoints[name])
        self._start_threads()

    def _init_links(self, diagnose_s: float, unreachable_s: float | None, lost_s: float | None) -> None:
        """What the party keeps about each dialled peer's link, and when it gives up on one."""
        self.diagnose_s = float(diagnose_s)
        self.unreachable_s = None if unreachable_s is None else float(unreachable_s)
        # a peer whose up connection broke and stays down this long is gone (it died or the network
        # broke): waits on it end then, not after the whole timeout, and later waits at once
        self.lost_s = None if lost_s is None else float(lost_s)
        self._links: dict[str, Link] = {}  # dialled peer -> what its DEALER's monitor told
        self._breaks_seen: dict[str, int] = {}  # peer -> its ended connections when this incarnation began
        self._links_lock = threading.Lock()
        self._awaiting: collections.Counter = collections.Counter()  # (peer, kind) -> recvs waiting on it
        self._gave_up: dict[str, str] = {}  # peer -> why a recv from it fails at once
        self._links_due = 0.0  # monotonic time the links need a look again
        self._link_report: dict[str, dict] = {}  # bad links reported, for the status
        self._status_seen: dict = {"state": "starting", "done": 0, "total": 0}
        if self._status_cb is not None:
            self._status_cb = self._status_with_links(self._status_cb)

    def _check_security(self, insecure: bool, secret_key: bytes | None, public_keys: dict[str, bytes] | None) -> None:
        """CURVE's keys present, or --insecure said loudly."""
        self.insecure = insecure
        if insecure:
            msg = (f"party {self.name!r}: --insecure: CURVE is OFF; traffic is plain TCP and senders are not "
                   "authenticated. Use only to measure the cost of encryption.")
            warnings.warn(msg, InsecureTransportWarning, stacklevel=3)
            self.log.warning(msg)
            return
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq was built without CURVE support")
        if secret_key is None or public_keys is None or self.name not in public_keys:
            raise ValueError("CURVE needs this party's secret key and every party's public key")

    def _router(self, context: SharedContext | None, public_keys: dict[str, bytes], secret_key: bytes | None,
                handshake_s: float) -> zmq.Socket:
        """The listening ROUTER socket, its CURVE server keys and its ZAP allow-list (every listed
        party but this one): this party's own handler, or the host's shared context's."""
        self._zap = None
        zap_domain = ZAP_DOMAIN.encode()
        if not self.insecure:
            allowed = {k: n for n, k in public_keys.items() if n != self.name}
            if context is None:
                self._zap = _ZapHandler(self.ctx, allowed, self.log, self.insecure, admit=self._admit_connection)
                self._zap.start()
            else:
                zap_domain = context.register(self.name, allowed, self.log, self.insecure,
                                              admit=self._admit_connection)
        router = self.ctx.socket(zmq.ROUTER)
        router.linger = 0
        router.maxmsgsize = self.frame_bytes + WIRE_OVERHEAD
        router.rcvhwm = RCV_HWM
        router.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(handshake_s * 1000)))
        router.setsockopt(zmq.BACKLOG, LISTEN_BACKLOG)
        if not self.insecure:
            router.curve_server = True
            router.curve_secretkey = secret_key
            router.curve_publickey = public_keys[self.name]
            router.zap_domain = zap_domain
        return router

    def _start_threads(self) -> None:
        """The guard and the receive loop running, and the peers this party talks to dialled."""
        self._streams = _Streams(self)
        self._halt = threading.Event()
        # closing writes here to wake the receive loop, which otherwise sleeps until a message comes:
        # hundreds of idle parties in one host must not wake up on a timer
        self._wake_r, self._wake_w = os.pipe()
        if self._guard is not None:
            self._guard.start()
        self._rx = threading.Thread(target=self._receive_loop, name=f"rx-{self.name}", daemon=True)
        self._rx.start()
        # Dial the peers we exchange messages with now, not at the first send, so that a wrong
        # endpoint or key shows within seconds (and not to all n - 1 peers: hundreds of owners
        # that never talk to each other need no connection).
        with self._send_lock:
            for p in self.linked_peers():
                self._dealer(p)

    # ------------------------------------------------------------ connections
    def connection_state(self, peer: str) -> dict:
        """What this party knows of its connection to ``peer``: ``state`` (``"no TCP connection"``,
        ``"handshaking"``, ``"handshake refused"``, ``"connected"``, ``"connection lost"``, or
        ``"not dialled"``), ``endpoint``, ``since`` (epoch seconds), ``for_s`` and ``detail``."""
        with self._links_lock:
            link = self._links.get(peer)
            if link is not None:
                return link.as_dict()
        return {"state": "not dialled", "endpoint": self._endpoints.get(peer), "since": None, "for_s": 0.0,
                "detail": "no declared message goes to it"}

    def _what_peer_did(self, peer: str) -> str:
        did = super()._what_peer_did(peer)
        with self._links_lock:
            link = self._links.get(peer)
            return did if link is None else f"{did}; {link.describe()}"

    def recv_any(self, frm: str, kinds: Iterable[str], timeout: float | None = None) -> tuple[str, Any]:
        kinds = tuple(kinds)
        with self._links_lock:
            for kind in kinds:
                self._awaiting[(frm, kind)] += 1
            why = self._gave_up.get(frm)
        try:
            if why is not None:  # raised only if no message of these kinds is queued already
                for kind in kinds:
                    self._mailbox.poison(frm, kind, PeerUnreachable(self.name, frm, kind, why, 0.0))
            return super().recv_any(frm, kinds, timeout)
        finally:
            with self._links_lock:
                for kind in kinds:
                    self._awaiting[(frm, kind)] -= 1
                    if self._awaiting[(frm, kind)] <= 0:
                        del self._awaiting[(frm, kind)]

    def _admit_connection(self, user: str) -> str | None:
        """The ZAP handler's question for a listed key: may it open one more connection?"""
        guard = self._guard
        return None if guard is None else guard.admit(user)

    def _link_event(self, peer: str, ev: int, value: int) -> None:
        """A monitor event of the DEALER to ``peer`` (the guard's thread)."""
        with self._links_lock:
            link = self._links.get(peer)
            if link is None:
                return
            was, reported = link.state, link.reported
            up = link.event(ev, value)
            self._links_due = 0.0
        if up:
            self._say_hello(peer)
            if reported and was != UP:
                self.log.info("reached %s at %s", peer, link.endpoint)
                with self._links_lock:
                    self._link_report.pop(peer, None)
                self._write_status()

    def _say_hello(self, peer: str) -> None:
        """Send :data:`HELLO` on a connection whose handshake just succeeded: it names our key to the peer."""
        with self._send_lock:
            s = self.dealers.get(peer)
            if s is None or self._halt.is_set():
                return
            with self._links_lock:
                link = self._links.get(peer)
                if link is not None and link.state != UP:
                    # the connection broke before we got to it: a hello queued now would wait for a
                    # reconnection that may never come (the peer finished) and hold our exit for the linger
                    return
            try:
                s.send(HELLO, zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _fails_after(self, link: Link) -> float | None:
        """Seconds after ``link.t`` (its state's start) at which waits on its peer give up."""
        if link.state == REFUSED:
            return self.diagnose_s
        if link.lost_at is not None and self.lost_s is not None and link.state in (LOST, NO_TCP):
            return max(0.0, self.lost_s - (link.t - link.lost_at))   # counted from the loss
        if link.state == NO_TCP and link.attempts > 0:
            return self.unreachable_s
        return None

    def _check_links(self) -> float | None:
        """Report links bad for ``diagnose_s`` and give up on those past their limit (the guard's
        thread, on every wake-up); returns seconds until a link needs a look again."""
        now = time.monotonic()
        if now < self._links_due:
            return self._links_due - now
        report, give_up, due = [], [], None
        with self._links_lock:
            for peer, link in self._links.items():
                if link.state not in BAD_STATES:
                    continue
                limits = [(self.diagnose_s, "report")] if not link.reported else []
                fail = self._fails_after(link)
                if fail is not None and peer not in self._gave_up:
                    limits.append((fail, "fail"))
                for limit, what in limits:
                    left = link.t + limit - now
                    if left > 0:
                        due = left if due is None else min(due, left)
                    elif what == "report":
                        link.reported = True
                        self._link_report[peer] = dict(link.as_dict(), reported_after_s=round(self.elapsed(), 3))
                        report.append((peer, link.describe()))
                    else:
                        self._gave_up[peer] = link.describe()
                        give_up.append((peer, self._gave_up[peer], link.bad_for(),
                                        [k for (p, k) in self._awaiting if p == peer]))
            self._links_due = now + (due if due is not None else 3600.0)
        for peer, why in report:
            self.log.warning("peer %s: %s", peer, why)
        if report:
            self._write_status()
        for peer, why, bad_for, kinds in give_up:
            self.log.error("giving up on %s: %s", peer, why)
            for kind in kinds:
                self._mailbox.poison(peer, kind, PeerUnreachable(self.name, peer, kind, why, bad_for))
        return due

    def _status_with_links(self, cb):
        """Wrap the status callback: every status carries the links reported bad (``"links"``)."""
        def status(st: dict) -> None:
            self._status_seen = dict(st)
            with self._links_lock:
                links = dict(self._link_report)
            cb(dict(st, links=links) if links else st)
        return status

    def _write_status(self) -> None:
        if self._status_cb is not None:
            self._status_cb(dict(self._status_seen))

    # ----------------------------------------------------------------- sending
    def _dealer(self, peer: str) -> zmq.Socket:
        """The DEALER to ``peer``, made and connected on first use (callers hold the send lock)."""
        s = self.dealers.get(peer)
        if s is not None:
            return s
        s = self.ctx.socket(zmq.DEALER)
        s.linger = int(self.timeout * 1000)
        s.reconnect_ivl_max = DIAL_RECONNECT_MAX_MS
        s.sndhwm = 0  # never drop: a slow peer back-pressures instead
        # Nothing is ever received on a DEALER (peers answer through our ROUTER), so a peer
        # that sends on it anyway can make libzmq hold one small message, no more.
        s.rcvhwm = 1
        s.maxmsgsize = DEALER_MAX_FRAME
        # No fixed routing id: the ROUTER refuses a second connection with an id
        # in use, so a listed peer could lock us out by claiming ours (or a stale
        # connection could block our reconnect).  Identity comes from CURVE + ZAP.
        if not self.insecure:
            s.curve_serverkey = self._public_keys[peer]
            s.curve_publickey = self._public_keys[self.name]
            s.curve_secretkey = self._secret_key
        with self._links_lock:
            self._links[peer] = Link(peer, self._endpoints[peer])
            self._links_due = 0.0
        if self._guard is not None:
            self._guard.watch(s, 2 * DEALER_MAX_FRAME, peer)
        s.connect(self._endpoints[peer])
        self.dealers[peer] = s
        return s

    def _transport_send(self, to: str, frames: list) -> None:
        sock = self._dealer(to)
        if sum(len(memoryview(f)) for f in frames) <= self.frame_bytes:
            sock.send_multipart(frames, copy=len(frames) == 1)
            return
        # Too large for one frame budget: stream it, one bounded frame per message.
        if len(memoryview(frames[0])) > self.frame_bytes or any(len(memoryview(f)) > self.frame_bytes
                                                                for f in frames[1:]):
            raise ValueError(f"party {self.name!r}: a frame of this message exceeds the {self.frame_bytes}-byte "
                             "frame limit (the message is larger than max_message_mb allows)")
        sock.send_multipart([STREAM_START, frames[0]])
        for f in frames[1:]:
            sock.send(f, copy=False)

    # --------------------------------------------------------------- receiving
    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        guard = self._guard
        if guard is not None:
            guard.drained_at = time.monotonic()   # nothing was sent to it yet
        while not self._halt.is_set():
            try:
                if self.router not in dict(poller.poll(RX_IDLE_MS)):
                    if guard is not None:
                        guard.drained_at = time.monotonic()  # nothing waits: this party is not behind
                    continue
                parts = self.router.recv_multipart(copy=False, flags=zmq.NOBLOCK)
            except zmq.ZMQError:
                if self._halt.is_set():
                    break
                continue
            try:
                self._received(parts)
            except Exception as e:  # belt and braces: nothing a peer sends may stop the receive loop
                self._reject(f"receive loop: {type(e).__name__}: {short(str(e))}")
            if guard is not None and not int(self.router.get(zmq.EVENTS)) & zmq.POLLIN:
                guard.drained_at = time.monotonic()  # read all that was waiting

    def _received(self, parts: list) -> None:
        if len(parts) < 2:
            self._reject("empty message")
            return
        frames = parts[1:]
        user = None
        if not self.insecure:
            try:
                user = frames[0].get("User-Id")
            except zmq.ZMQError:
                user = None
        if self._guard is not None:
            self._guard.credit(frames, user or None)
        if not self.insecure and not user:
            self._reject("message on a connection without an authenticated key")
            return
        if len(frames) == 1 and len(frames[0]) == len(HELLO) and frames[0].bytes == HELLO:
            return  # a new connection named its key (the guard counted it); nothing to deliver
        if self._shaper is not None:
            self._shaper.heard(user)
        self._streams.feed(parts[0].bytes, user, frames)

    def _arrived(self, frames: list, authenticated: str | None) -> None:
        """A whole message the sockets handed over: to the checks now, or after its simulated link."""
        if self._shaper is None:
            self._deliver(frames, authenticated)
            return
        peer = authenticated
        if peer is None:   # --insecure: the link is the one the header names (the checks judge the claim)
            try:
                peer = codec.plan(frames[0], self.max_message_bytes).frm
            except Exception:
                self._deliver(frames, authenticated)   # refused there, at once
                return
        self._shaper.put(peer, frames, authenticated)

    def _checked(self, frames: list, authenticated: str | None) -> None:
        """The link's delivery (its own thread): the checks, which never raise (as in the receive loop)."""
        try:
            self._deliver(frames, authenticated)
        except Exception as e:  # belt and braces
            self._reject(f"link delivery: {type(e).__name__}: {short(str(e))}")

    def _stream_refusal(self, plan: codec.Plan, user: str | None) -> str | None:
        """Why a streamed message is refused from its header alone (None: keep its data).

        The same checks as ``_deliver`` makes on a whole message, made before
        any data is buffered, plus :meth:`admit_stream`.
        """
        if plan.run != self.wire_id:
            return f"message of another run {short(plan.run)} (ours {self.wire_id!r}) from {short(plan.frm)}"
        if plan.to != self.name:
            return f"message addressed to {short(plan.to)} delivered to {self.name!r}"
        if plan.frm not in self.roles or plan.frm == self.name:
            return f"message from unknown party {short(plan.frm)}"
        if user is not None and user != plan.frm:
            return f"party {user!r} tried to send as {short(plan.frm)}"
        expected = self._seq_in.get(plan.frm, 0)
        if plan.seq != expected:
            what = "replayed" if plan.seq < expected else "out-of-order"
            return f"{what} message from {plan.frm!r}: seq {plan.seq}, expected {expected}"
        return self.admit_stream(plan.frm, plan.kind, plan.data_bytes)

    def admit_stream(self, frm: str, kind: str, nbytes: int) -> str | None:
        """Hook: refuse a streamed message of ``nbytes`` array bytes before it is buffered.

        Returns the reason, or None to accept.  The default accepts anything
        within ``max_message_bytes`` (already checked).
        """
        return None

    def _restart_judge(self, peer: str) -> str:
        """"seen" once one of ``peer``'s connections ended since this incarnation began; else
        "unseen" if this party exchanged a message with it, "unknown" if it never did (then the
        parties that did talk with it judge, and vouch).  The exchange is counted where messages are
        delivered and sent, in step with the offer itself; the guard's count of connections is not
        (its thread may not have counted the connection an offer came on yet, on a loaded machine)."""
        guard = self._guard
        if guard is None or guard.breaks[peer] > self._breaks_seen.get(peer, 0):
            return "seen"
        # (the caller holds self._lock, under which these counters change)
        return "unseen" if (self.messages_received.get(peer) or self.messages_sent.get(peer)) else "unknown"

    def _restart_seen(self) -> None:
        guard = self._guard
        if guard is not None:
            self._breaks_seen = dict(guard.breaks)

    def _cut_links(self, peer: str) -> int:
        guard = self._guard
        return 0 if guard is None else guard.cut_users[peer] + guard.maybe_cut[peer]

    # ------------------------------------------------------- bounded reporting
    def _reject(self, reason: str, *args: Any, **kw: Any) -> None:
        """Keep (and log) the first ``REJECTS_KEPT`` reasons; beyond, count them by reason."""
        reason = reason if len(reason) <= 4 * codec.REFLECT_CHARS else reason[:4 * codec.REFLECT_CHARS] + "..."
        with self._reject_lock:
            self.reject_count += 1
            n = self.reject_count
        if n <= REJECTS_KEPT:
            super()._reject(reason, *args, **kw)
            return
        key = reason.split(":", 1)[0][:codec.REFLECT_CHARS]
        with self._reject_lock:
            self.rejects_by_reason[key] += 1
        if n & (n - 1) == 0:  # a summary at 128, 256, 512, ... rejections
            self.log.warning("rejected %d messages in all; beyond the first %d, by reason: %s", n, REJECTS_KEPT,
                             short(dict(self.rejects_by_reason.most_common(10)), 4 * codec.REFLECT_CHARS))

    def traffic(self) -> dict:
        t = super().traffic()
        t["rejected"] = max(t.get("rejected", 0), self.reject_count)
        guard = self._guard
        if guard is not None:   # connections this party's own guard cut: listed peers' and strangers'
            t["guard_cuts"] = {"total": guard.cut, "by_reason": dict(guard.cut_by_reason),
                               "listed": {u: n for u, n in guard.cut_users.items() if n},
                               "maybe_listed": {u: n for u, n in guard.maybe_cut.items() if n},
                               "held_back": guard.held_back}
        with self._links_lock:   # the peers this party dialled, and the handshakes it had to retry
            retries = {p: link.retries for p, link in self._links.items() if link.retries}
            t["dialled"] = len(self._links)
        t["handshake_retries"] = {"total": sum(retries.values()), "by_peer": retries}
        if self._shaper is not None:   # the simulated link: messages held and seconds they waited on it
            t["link"] = self._shaper.stats()
        return t

    def metric(self, **values: Any) -> None:
        try:
            super().metric(**values)
        except OSError as e:  # e.g. EMFILE under a connection flood: lose a metrics line, not the party
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOSPC):
                raise
            self.log.warning("metrics line not written: %s", e)

    # ----------------------------------------------------------------- closing
    def _transport_close(self, linger_s: float | None = None, unreached_s: float | None = None) -> None:
        self._halt.set()
        if self._shaper is not None:
            self._shaper.close()
        try:
            os.write(self._wake_w, b"\0")
        except OSError:
            pass
        self._rx.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
        if self._guard is not None:
            self._guard.stop()
            self._guard.join(timeout=2)
            self._guard.close()
        with self._links_lock:
            gone = {p for p, link in self._links.items() if link.lost_at is not None and link.state != UP}
        starting = unreached_s is not None and not any(self.messages_received.values())
        for peer, s in self.dealers.items():
            # a clean close lingers until queued messages reach the peer; a failed party passes a short
            # linger so messages queued for a dead peer do not hold its exit for the whole timeout, and
            # so does a peer whose connection broke and is down now (it finished, or it is gone)
            linger = 0.0 if peer in gone else linger_s
            if (starting and linger is not None and peer not in gone and self._guard is not None
                    and not self._guard.joined[peer]):
                # this party failed before it heard from anyone, and never reached this peer: the
                # peer may still be starting (parties started by hand, a loaded machine); the failure
                # notice waits for it longer, and leaves as soon as it is up
                linger = max(linger, float(unreached_s or 0.0))
            s.close(linger=None if linger is None else int(max(0.0, linger) * 1000))
        self.router.close(linger=0)
        if self._zap is not None:
            self._zap.stop()
            self._zap.join(timeout=2)
            self._zap.sock.close(linger=0)
        if self._shared is None:
            self.ctx.term()
