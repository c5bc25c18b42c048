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
"""
from __future__ import annotations

import collections
import errno
import fcntl
import os
import select
import socket
import struct
import sys
import termios
import threading
import time
import warnings
from typing import Any

import zmq
import zmq.utils.z85
from zmq.utils.monitor import parse_monitor_message

from . import codec
from .api import Party
from .codec import MalformedMessage, MessageTooLarge, short

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


class InsecureTransportWarning(UserWarning):
    pass


class _ZapHandler(threading.Thread):
    """ZAP (RFC 27) server: CURVE keys on the allow-list map to party names."""

    def __init__(self, ctx: zmq.Context, allowed: dict[bytes, str], log, insecure: bool,
                 domain: bytes = ZAP_DOMAIN.encode()):
        super().__init__(name="zap", daemon=True)
        # ZAP domain -> (z85 public key -> party name, log): one domain per party's ROUTER, so
        # parties sharing a context (a host process) share one handler yet admit only their peers.
        self.domains: dict[bytes, tuple[dict[bytes, str], Any]] = {domain: (allowed, log)}
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
                allowed, log = self.domains.get(domain, ({}, self.log))
                if mechanism == b"CURVE" and len(creds) == 1 and len(creds[0]) == 32:
                    key = zmq.utils.z85.encode(creds[0])
                    name = allowed.get(key)
                    if name is not None:
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

    def register(self, name: str, allowed: dict[bytes, str], log, insecure: bool) -> bytes:
        """Admit ``allowed`` keys on party ``name``'s ROUTER; returns the ZAP domain it must use."""
        domain = f"{ZAP_DOMAIN}/{name}".encode()
        with self._lock:
            if self._zap is None:
                self._zap = _ZapHandler(self.ctx, allowed, log, insecure, domain)
                self._zap.start()
            else:
                if self._zap.insecure != insecure:
                    raise ValueError("every party of a shared context must be secure, or every one --insecure")
                self._zap.domains[domain] = (allowed, log)
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
    """Shuts down connections on which libzmq buffers more than ``limit`` bytes we were not given.

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
    """

    TICK_S = 0.01
    IDLE_S = 1.0  # wake-up when nothing happens at all (a backstop; events and stop() wake it sooner)
    _EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED

    def __init__(self, watched: list, total_limit: int, curve: bool, log):
        """``watched``: [(socket, limit per connection)]; ``total_limit`` over all connections."""
        super().__init__(name="conn-guard", daemon=True)
        self.total_limit, self.curve, self.log = int(total_limit), curve, log
        self.monitors = [(sock, sock.get_monitor_socket(self._EVENTS), int(limit)) for sock, limit in watched]
        self._added: list = []  # monitors of sockets made later (watch), taken in by the guard's thread
        self._lock = threading.Lock()
        self._credit: dict[int, int] = collections.defaultdict(int)
        self._credited: set[int] = set()  # fds credited since the last look (their held bytes fell)
        self._conns: dict[int, dict] = {}  # fd -> {"base", "t" (accept time), "tcp", "limit", "got", "held"}
        self._active: set[int] = set()  # fds whose held bytes may still grow without a new arrival
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._halt = threading.Event()
        self.cut = 0  # connections shut down
        self.peak_held = 0  # largest total held bytes seen (for tests and logs)
        self.looks = 0  # connection measurements made (for tests: idle connections cost none)

    # called by the receive loop for every message it reads
    def credit(self, frames: list) -> None:
        try:
            fd = frames[0].get(zmq.SRCFD)
        except zmq.ZMQError:
            return
        n = sum(_wire_bytes(len(f), self.curve) for f in frames)
        with self._lock:
            self._credit[fd] += n
            self._credited.add(fd)

    def _received(self, fd: int) -> tuple[int, int] | None:
        """(bytes libzmq took off this socket, bytes still in the kernel queue); None: not TCP, or gone."""
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

    def watch(self, sock, limit: int) -> None:
        """Also watch ``sock`` (made after the guard started), ``limit`` bytes per connection.

        Call before connecting it, so its first connection's event is not missed.
        """
        mon = sock.get_monitor_socket(self._EVENTS)
        with self._lock:
            self._added.append((sock, mon, int(limit)))
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # pipe full (already woken) or closed
            pass

    def _events(self) -> None:
        if self._added:
            with self._lock:
                self.monitors += self._added
                self._added = []
        for _sock, mon, limit in self.monitors:
            while mon.poll(0):
                try:
                    ev = parse_monitor_message(mon.recv_multipart())
                except (zmq.ZMQError, ValueError):
                    break
                fd = ev["value"]
                if ev["event"] in (zmq.EVENT_ACCEPTED, zmq.EVENT_CONNECTED):
                    got = self._received(fd)
                    with self._lock:
                        base = 0 if got is None else got[0] - self._credit[fd]
                    self._conns[fd] = {"base": base, "t": time.monotonic(), "tcp": got is not None, "limit": limit,
                                       "got": None, "held": 0}
                    if got is not None:
                        self._register(fd)
                        self._active.add(fd)
                elif ev["event"] in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                    self._forget(fd)

    def _register(self, fd: int) -> None:
        mask = select.EPOLLIN | select.EPOLLET
        try:
            self._epoll.register(fd, mask)
        except FileExistsError:  # a reused fd number still listed (libzmq closed the old one under us)
            self._epoll.modify(fd, mask)
        except OSError:
            pass

    def _forget(self, fd: int) -> None:
        self._conns.pop(fd, None)
        self._active.discard(fd)
        try:
            self._epoll.unregister(fd)
        except (OSError, ValueError):  # closed already (epoll dropped it by itself)
            pass

    def _shut(self, fd: int, held: int, why: str) -> None:
        try:
            s = socket.socket(fileno=fd)
            try:
                s.shutdown(socket.SHUT_RDWR)  # libzmq sees the end of the stream and drops what it holds
            finally:
                s.detach()
        except OSError:
            return
        self.cut += 1
        self._forget(fd)
        if self.cut <= REJECTS_KEPT or self.cut % 100 == 0:
            self.log.warning("dropped a connection holding %d bytes of unfinished messages (%s; %d dropped so far)",
                             held, why, self.cut)

    def check(self) -> None:
        self._events()
        for fd, _ev in self._epoll.poll(0):
            if fd in self._conns:
                self._active.add(fd)
        with self._lock:
            look = (self._active | self._credited) & self._conns.keys()
            self._credited = set()
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
            if queued == 0 and rcvd == c["got"]:
                self._active.discard(fd)  # settled: nothing new came and nothing waits in the kernel
            else:
                self._active.add(fd)
            c["got"] = rcvd
        held = {fd: c["held"] for fd, c in self._conns.items() if c["tcp"]}
        total = sum(max(0, h) for h in held.values())
        self.peak_held = max(self.peak_held, total)
        for fd, h in held.items():
            if h > self._conns[fd]["limit"]:
                self._shut(fd, h, f"limit {self._conns[fd]['limit']} per connection")
                total -= h
        if total > self.total_limit:  # many connections at once: youngest first
            for fd in sorted((fd for fd in held if fd in self._conns and held[fd] > 0),
                             key=lambda fd: -self._conns[fd]["t"]):
                if total <= self.total_limit:
                    break
                total -= held[fd]
                self._shut(fd, held[fd], f"limit {self.total_limit} over all connections")

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._epoll.fileno(), zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        polled: set = set()
        while not self._halt.is_set():
            try:
                for _sock, mon, _limit in self.monitors:
                    if id(mon) not in polled:
                        poller.register(mon, zmq.POLLIN)
                        polled.add(id(mon))
                poller.poll(int(1000 * (self.TICK_S if self._active else self.IDLE_S)))
                try:
                    while os.read(self._wake_r, 4096):
                        pass
                except (BlockingIOError, OSError):
                    pass
                if self._halt.is_set():
                    break
                self.check()
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
        for sock, mon, _limit in self.monitors:
            try:
                sock.disable_monitor()
            except zmq.ZMQError:
                pass
            mon.close(linger=0)
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
        self.party._deliver([f.buffer for f in frames], authenticated=user)

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
                p._deliver([header.buffer], authenticated=user)
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
                self.party._deliver([st.header.buffer] + st.frames, authenticated=st.user)

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
        **kw: Any,
    ) -> None:
        super().__init__(name, roles, **kw)
        missing = [p for p in roles if p not in endpoints]
        if missing:
            raise ValueError(f"no endpoint for parties {missing}")
        self.insecure = insecure
        if insecure:
            msg = (f"party {name!r}: --insecure: CURVE is OFF; traffic is plain TCP and senders are not "
                   "authenticated. Use only to measure the cost of encryption.")
            warnings.warn(msg, InsecureTransportWarning, stacklevel=2)
            self.log.warning(msg)
        else:
            if not zmq.has("curve"):
                raise RuntimeError("this libzmq was built without CURVE support")
            if secret_key is None or public_keys is None or name not in public_keys:
                raise ValueError("CURVE needs this party's secret key and every party's public key")
        # Largest frame on the wire in either direction (see the module docstring).
        self.frame_bytes = max(1, min(self.max_message_bytes, codec.CHUNK_BYTES))
        self.reject_count = 0
        self.rejects_by_reason: collections.Counter = collections.Counter()
        public_keys = public_keys or {}  # --insecure runs have none
        self._shared = context  # None: this party owns its context (and ZAP handler) and ends them
        self.ctx = zmq.Context() if context is None else context.ctx
        self._zap = None
        zap_domain = ZAP_DOMAIN.encode()
        if not insecure:
            allowed = {k: n for n, k in public_keys.items() if n != name}
            if context is None:
                self._zap = _ZapHandler(self.ctx, allowed, self.log, insecure)
                self._zap.start()
            else:
                zap_domain = context.register(name, allowed, self.log, insecure)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.maxmsgsize = self.frame_bytes + WIRE_OVERHEAD
        self.router.rcvhwm = RCV_HWM
        self.router.setsockopt(zmq.HANDSHAKE_IVL, max(1, int(handshake_s * 1000)))
        if not insecure:
            self.router.curve_server = True
            self.router.curve_secretkey = secret_key
            self.router.curve_publickey = public_keys[name]
            self.router.zap_domain = zap_domain
        # One DEALER per peer, made and connected on the first message to it (:meth:`_dealer`):
        # a party connects only to the peers it talks to, so hundreds of parties that never
        # talk to each other hold no connections (and descriptors) for each other.
        self.dealers: dict[str, zmq.Socket] = {}
        self._endpoints = dict(endpoints)
        self._public_keys, self._secret_key = public_keys, secret_key
        self._guard = None
        if sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO"):
            per_conn = (RCV_HWM + 2) * self.frame_bytes + (1 << 20)
            self._guard = _ConnectionGuard([(self.router, per_conn)], (len(self.peers) + 2) * per_conn,
                                           curve=not insecure, log=self.log)
        self.router.bind(bind_endpoint or endpoints[name])
        self._streams = _Streams(self)
        self._halt = threading.Event()
        # closing writes here to wake the receive loop, which otherwise sleeps until a message comes:
        # hundreds of idle parties in one host must not wake up on a timer
        self._wake_r, self._wake_w = os.pipe()
        if self._guard is not None:
            self._guard.start()
        self._rx = threading.Thread(target=self._receive_loop, name=f"rx-{name}", daemon=True)
        self._rx.start()

    # ----------------------------------------------------------------- sending
    def _dealer(self, peer: str) -> zmq.Socket:
        """The DEALER to ``peer``, made and connected on first use (callers hold the send lock)."""
        s = self.dealers.get(peer)
        if s is not None:
            return s
        s = self.ctx.socket(zmq.DEALER)
        s.linger = int(self.timeout * 1000)
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
        if self._guard is not None:
            self._guard.watch(s, 2 * DEALER_MAX_FRAME)
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
        while not self._halt.is_set():
            try:
                if self.router not in dict(poller.poll(RX_IDLE_MS)):
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

    def _received(self, parts: list) -> None:
        if len(parts) < 2:
            self._reject("empty message")
            return
        frames = parts[1:]
        if self._guard is not None:
            self._guard.credit(frames)
        user = None
        if not self.insecure:
            try:
                user = frames[0].get("User-Id")
            except zmq.ZMQError:
                user = None
            if not user:
                self._reject("message on a connection without an authenticated key")
                return
        self._streams.feed(parts[0].bytes, user, frames)

    def _stream_refusal(self, plan: codec.Plan, user: str | None) -> str | None:
        """Why a streamed message is refused from its header alone (None: keep its data).

        The same checks as ``_deliver`` makes on a whole message, made before
        any data is buffered, plus :meth:`admit_stream`.
        """
        if plan.run != self.run_id:
            return f"message of another run {short(plan.run)} (ours {self.run_id!r}) from {short(plan.frm)}"
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
        return t

    def metric(self, **values: Any) -> None:
        try:
            super().metric(**values)
        except OSError as e:  # e.g. EMFILE under a connection flood: lose a metrics line, not the party
            if e.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOSPC):
                raise
            self.log.warning("metrics line not written: %s", e)

    # ----------------------------------------------------------------- closing
    def _transport_close(self, linger_s: float | None = None) -> None:
        self._halt.set()
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
        for s in self.dealers.values():
            # a clean close lingers until queued messages reach the peer; a failed party passes a short
            # linger so messages queued for a dead peer do not hold its exit for the whole timeout
            s.close(linger=None if linger_s is None else int(max(0.0, linger_s) * 1000))
        self.router.close(linger=0)
        if self._zap is not None:
            self._zap.stop()
            self._zap.join(timeout=2)
            self._zap.sock.close(linger=0)
        if self._shared is None:
            self.ctx.term()
