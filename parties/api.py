"""The party API: the one abstraction every protocol and algorithm is written against.

A party is a name, a role and a channel to every other party.  Role functions
call ``send``/``recv``/``broadcast``/``gather``; transports (in-memory threads,
CURVE-encrypted ZeroMQ processes) only implement ``_transport_send`` and feed
received frames into ``_deliver``.  Everything that must behave identically
under both transports lives here: encoding, sequence numbers, run-id and
sender checks, byte counting, transcripts, metrics and progress.
"""
from __future__ import annotations

import collections
import json
import logging
import threading
import time
from typing import Any, Callable, Iterable

from . import codec
from .codec import MalformedMessage

DEFAULT_TIMEOUT = 120.0
BYE_KIND = "_bye"  # closing barrier; declared for every run by the audit


class PartyError(RuntimeError):
    """A protocol-level failure inside a party."""


class PeerTimeout(PartyError, TimeoutError):
    """A peer stayed silent past the receive timeout."""

    def __init__(self, me: str, peer: str, kind: str, timeout: float):
        super().__init__(
            f"party {me!r} waited {timeout:g}s for a {kind!r} message from {peer!r}; "
            f"{peer!r} is silent (crashed, stalled or unreachable)"
        )
        self.peer, self.kind, self.timeout = peer, kind, timeout


class PartyAborted(PartyError):
    """The federation is being torn down because another party failed."""


class _Mailbox:
    """Received envelopes, keyed by (sender, kind), so a recv can wait for one kind."""

    def __init__(self) -> None:
        self._queues: dict[tuple[str, str], collections.deque] = collections.defaultdict(collections.deque)
        self._cv = threading.Condition()
        self.aborted: str | None = None

    def put(self, env: codec.Envelope) -> None:
        with self._cv:
            self._queues[(env.frm, env.kind)].append(env)
            self._cv.notify_all()

    def abort(self, reason: str) -> None:
        with self._cv:
            self.aborted = reason
            self._cv.notify_all()

    def get(self, frm: str, kind: str, timeout: float) -> codec.Envelope | None:
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                q = self._queues.get((frm, kind))
                if q:
                    return q.popleft()
                if self.aborted is not None:
                    raise PartyAborted(self.aborted)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(min(left, 0.5))


class Party:
    """Base class of both transports; role functions only see this interface."""

    def __init__(
        self,
        name: str,
        roles: dict[str, str],
        run_id: str,
        seed: int = 0,
        device: str = "cpu",
        timeout: float = DEFAULT_TIMEOUT,
        max_message_bytes: int = codec.DEFAULT_MAX_MESSAGE_BYTES,
        transcript=None,
        logger: logging.Logger | None = None,
        metrics_path=None,
        status_cb: Callable[[dict], None] | None = None,
    ) -> None:
        if name not in roles:
            raise ValueError(f"party {name!r} is not in the federation ({sorted(roles)})")
        self.name = name
        self.roles = dict(roles)
        self.role = roles[name]
        self.peers = sorted(n for n in roles if n != name)
        self.run_id = run_id
        self.seed = int(seed)
        self.device = resolve_device(device)
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.round = 0
        self.transcript = transcript
        self.log = logger or logging.getLogger(f"fedhet.party.{name}")
        self._metrics_path = metrics_path
        self._status_cb = status_cb
        self._last_status = 0.0
        self._t0 = time.monotonic()
        self._mailbox = _Mailbox()
        self._seq_out: dict[str, int] = collections.defaultdict(int)
        self._seq_in: dict[str, int] = collections.defaultdict(int)
        self._lock = threading.Lock()  # guards counters and the transcript
        self._send_lock = threading.Lock()
        self._reject_lock = threading.Lock()
        self.bytes_sent: dict[str, int] = collections.defaultdict(int)
        self.bytes_received: dict[str, int] = collections.defaultdict(int)
        self.messages_sent: dict[str, int] = collections.defaultdict(int)
        self.messages_received: dict[str, int] = collections.defaultdict(int)
        self.rejected: list[str] = []

    # ------------------------------------------------------------------ API
    def peers_with_role(self, role: str) -> list[str]:
        return sorted(n for n, r in self.roles.items() if r == role and n != self.name)

    def send(self, to: str, kind: str, payload: Any) -> None:
        if to not in self.roles or to == self.name:
            raise PartyError(f"party {self.name!r} cannot send to {to!r}: not a peer ({self.peers})")
        if not isinstance(kind, str) or not kind:
            raise PartyError("message kind must be a non-empty string")
        with self._send_lock:
            seq = self._seq_out[to]
            frames = codec.encode(self.run_id, self.name, to, kind, seq, payload, self.round)
            digest, n = codec.frames_digest(frames)
            self._transport_send(to, frames)
            self._seq_out[to] = seq + 1
        with self._lock:
            self.bytes_sent[to] += n
            self.messages_sent[to] += 1
            if self.transcript is not None:
                self.transcript.record("send", to, kind, self.round, seq, n, digest, codec.describe(payload))

    def recv(self, frm: str, kind: str, timeout: float | None = None) -> Any:
        if frm not in self.roles or frm == self.name:
            raise PartyError(f"party {self.name!r} cannot receive from {frm!r}: not a peer ({self.peers})")
        t = self.timeout if timeout is None else float(timeout)
        env = self._mailbox.get(frm, kind, t)
        if env is None:
            raise PeerTimeout(self.name, frm, kind, t)
        return env.payload

    def broadcast(self, kind: str, payload: Any, to: Iterable[str] | None = None) -> None:
        for p in (self.peers if to is None else list(to)):
            self.send(p, kind, payload)

    def gather(self, kind: str, frm: Iterable[str] | None = None, timeout: float | None = None) -> dict[str, Any]:
        return {p: self.recv(p, kind, timeout) for p in (self.peers if frm is None else list(frm))}

    def progress(self, done: int, total: int, **metrics: Any) -> None:
        now = time.monotonic()
        if self._status_cb is None or (now - self._last_status < 0.2 and done < total):
            return
        self._last_status = now
        self._status_cb({"done": done, "total": total, "metrics": _jsonable(metrics),
                         "elapsed_s": now - self._t0})

    def metric(self, **values: Any) -> None:
        rec = {"party": self.name, "round": self.round, "wall_s": round(time.monotonic() - self._t0, 6),
               "bytes_sent": sum(self.bytes_sent.values()),
               "bytes_received": sum(self.bytes_received.values())}
        rec.update(_jsonable(values))
        if self._metrics_path is not None:
            with open(self._metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def abort(self, reason: str) -> None:
        """Make every pending and future recv fail (used when another party failed)."""
        self._mailbox.abort(reason)

    def close(self, timeout: float | None = None) -> None:
        """Closing barrier: tell every peer we are done and wait for theirs.

        Per-link ordering means a peer's ``_bye`` arrives after everything it
        sent us, so after the barrier no message of this run is in flight to us.
        """
        t = self.timeout if timeout is None else timeout
        for p in self.peers:
            try:
                self.send(p, BYE_KIND, None)
            except Exception as e:  # a dead peer must not stop our clean exit
                self.log.warning("could not send closing message to %s: %s", p, e)
        for p in self.peers:
            try:
                self.recv(p, BYE_KIND, timeout=t)
            except PartyError as e:
                self.log.warning("closing barrier: %s", e)
        self._transport_close()

    # --------------------------------------------------------- transport side
    def _transport_send(self, to: str, frames: list) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _transport_close(self, linger_s: float | None = None) -> None:
        pass

    def _reject(self, reason: str) -> None:
        self.log.warning("rejected message: %s", reason)
        with self._reject_lock:
            self.rejected.append(reason)

    def _deliver(self, frames: list, authenticated: str | None) -> bool:
        """Validate one received frame set and queue it; never raises.

        ``authenticated`` is the sender name the transport vouches for (the
        CURVE key the connection proved, mapped through the allow-list), or
        None where the transport cannot vouch (``--insecure``).
        """
        try:
            env = codec.decode(frames, self.max_message_bytes)
        except MalformedMessage as e:
            self._reject(f"malformed from {authenticated or '?'}: {e}")
            return False
        except Exception as e:  # belt and braces: nothing a peer sends may crash us
            self._reject(f"undecodable from {authenticated or '?'}: {type(e).__name__}: {e}")
            return False
        if env.run != self.run_id:
            self._reject(f"message of another run {env.run!r} (ours {self.run_id!r}) from {env.frm!r}")
            return False
        if env.to != self.name:
            self._reject(f"message addressed to {env.to!r} delivered to {self.name!r}")
            return False
        if env.frm not in self.roles or env.frm == self.name:
            self._reject(f"message from unknown party {env.frm!r}")
            return False
        if authenticated is not None and authenticated != env.frm:
            self._reject(f"party {authenticated!r} tried to send as {env.frm!r}")
            return False
        with self._lock:
            expected = self._seq_in[env.frm]
            if env.seq != expected:
                what = "replayed" if env.seq < expected else "out-of-order"
                self._reject(f"{what} message from {env.frm!r}: seq {env.seq}, expected {expected}")
                return False
            self._seq_in[env.frm] = expected + 1
            self.bytes_received[env.frm] += env.nbytes
            self.messages_received[env.frm] += 1
            if self.transcript is not None:
                self.transcript.record("recv", env.frm, env.kind, env.round, env.seq,
                                       env.nbytes, env.digest, env.arrays)
        self._mailbox.put(env)
        return True

    def traffic(self) -> dict:
        return {
            "bytes_sent": dict(self.bytes_sent), "bytes_received": dict(self.bytes_received),
            "messages_sent": dict(self.messages_sent), "messages_received": dict(self.messages_received),
            "bytes_sent_total": sum(self.bytes_sent.values()),
            "bytes_received_total": sum(self.bytes_received.values()),
            "rejected": len(self.rejected),
        }


def resolve_device(device: str | None) -> str:
    """'auto' picks CUDA when torch sees it; an explicit CUDA request without CUDA is an error."""
    device = (device or "cpu").strip()
    if device == "cpu":
        return device
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    if device == "auto":
        return "cuda" if has_cuda else "cpu"
    if device.startswith("cuda"):
        if not has_cuda:
            raise PartyError(f"device {device!r} requested but torch sees no CUDA device")
        return device
    raise PartyError(f"unknown device {device!r} (use cpu, cuda, cuda:N or auto)")


def _jsonable(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        if hasattr(v, "item") and callable(v.item):
            try:
                v = v.item()
            except Exception:
                v = str(v)
        elif not isinstance(v, (str, int, float, bool, type(None), list, dict)):
            v = str(v)
        out[k] = v
    return out
