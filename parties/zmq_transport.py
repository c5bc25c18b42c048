"""ZeroMQ transport: one OS process per party, CURVE on every connection.

Topology: every party binds one ROUTER socket at its endpoint (a CURVE
server) and connects one DEALER to each peer's endpoint (a CURVE client
pinned to that peer's public key).  A ZAP handler on the ROUTER admits only
the public keys of the federation and reports the matching party name as the
connection's User-Id; ``Party._deliver`` then rejects any envelope whose
sender differs from that authenticated name.  ZMQ_MAXMSGSIZE bounds what a
peer can make us buffer; the codec bounds what we decode.

CURVE is libzmq's CurveZMQ (X25519 key agreement, XSalsa20-Poly1305 boxes,
perfect forward secrecy per connection); nothing cryptographic is done here
beyond configuring it.  ``insecure=True`` turns it off, for measuring its cost
only: the sender can then no longer be authenticated, and a warning says so.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any

import zmq
import zmq.utils.z85

from .api import Party

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = "fedhet"


class InsecureTransportWarning(UserWarning):
    pass


class _ZapHandler(threading.Thread):
    """ZAP (RFC 27) server: CURVE keys on the allow-list map to party names."""

    def __init__(self, ctx: zmq.Context, allowed: dict[bytes, str], log, insecure: bool):
        super().__init__(name="zap", daemon=True)
        self.allowed = allowed  # z85 public key -> party name
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
                if mechanism == b"CURVE" and len(creds) == 1 and len(creds[0]) == 32:
                    key = zmq.utils.z85.encode(creds[0])
                    name = self.allowed.get(key)
                    if name is not None:
                        status, text, user = b"200", b"OK", name.encode()
                    else:
                        self.denied += 1
                        self.log.warning("ZAP: refused CURVE key %s from %s (not in the federation)",
                                         key.decode(), address.decode(errors="replace"))
                elif mechanism == b"NULL" and self.insecure:
                    status, text = b"200", b"OK (insecure)"
                else:
                    self.denied += 1
                    self.log.warning("ZAP: refused %s connection from %s",
                                     mechanism.decode(errors="replace"), address.decode(errors="replace"))
                self.sock.send_multipart([version, request_id, status, text, user, b""])
            except Exception as e:  # a garbled ZAP request must not kill the handler
                self.log.warning("ZAP: bad request: %s", e)
                try:
                    self.sock.send_multipart([b"1.0", b"", b"500", b"error", b"", b""])
                except zmq.ZMQError:
                    pass

    def stop(self) -> None:
        self._halt.set()


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
        self.ctx = zmq.Context()
        self._zap = None
        if not insecure:
            allowed = {k: n for n, k in public_keys.items() if n != name}
            self._zap = _ZapHandler(self.ctx, allowed, self.log, insecure)
            self._zap.start()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.maxmsgsize = self.max_message_bytes
        self.router.rcvhwm = 0
        if not insecure:
            self.router.curve_server = True
            self.router.curve_secretkey = secret_key
            self.router.curve_publickey = public_keys[name]
            self.router.zap_domain = ZAP_DOMAIN.encode()
        self.router.bind(bind_endpoint or endpoints[name])
        self.dealers: dict[str, zmq.Socket] = {}
        for peer in self.peers:
            s = self.ctx.socket(zmq.DEALER)
            s.linger = int(self.timeout * 1000)
            s.sndhwm = 0  # never drop: a slow peer back-pressures instead
            # No fixed routing id: the ROUTER refuses a second connection with an id
            # in use, so a listed peer could lock us out by claiming ours (or a stale
            # connection could block our reconnect).  Identity comes from CURVE + ZAP.
            if not insecure:
                s.curve_serverkey = public_keys[peer]
                s.curve_publickey = public_keys[name]
                s.curve_secretkey = secret_key
            s.connect(endpoints[peer])
            self.dealers[peer] = s
        self._halt = threading.Event()
        self._rx = threading.Thread(target=self._receive_loop, name=f"rx-{name}", daemon=True)
        self._rx.start()

    def _transport_send(self, to: str, frames: list) -> None:
        self.dealers[to].send_multipart(frames, copy=len(frames) == 1)

    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._halt.is_set():
            try:
                if not dict(poller.poll(100)):
                    continue
                parts = self.router.recv_multipart(copy=False)
            except zmq.ZMQError:
                if self._halt.is_set():
                    break
                continue
            if len(parts) < 2:
                self._reject("empty message")
                continue
            user = None
            if not self.insecure:
                try:
                    user = parts[1].get("User-Id")
                except zmq.ZMQError:
                    user = None
                if not user:
                    self._reject("message on a connection without an authenticated key")
                    continue
            self._deliver([p.buffer for p in parts[1:]], authenticated=user)

    def _transport_close(self, linger_s: float | None = None) -> None:
        self._halt.set()
        self._rx.join(timeout=5)
        for s in self.dealers.values():
            # a clean close lingers until queued messages reach the peer; a failed party passes a short
            # linger so messages queued for a dead peer do not hold its exit for the whole timeout
            s.close(linger=None if linger_s is None else int(max(0.0, linger_s) * 1000))
        self.router.close(linger=0)
        if self._zap is not None:
            self._zap.stop()
            self._zap.join(timeout=2)
            self._zap.sock.close(linger=0)
        self.ctx.term()
