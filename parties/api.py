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
from typing import Any, Callable, Iterable, Mapping

from . import codec
from . import declare as decl
from . import schema
from .checkpoint import Checkpoints, CheckpointError
from .codec import MalformedMessage
from .identity import PartyIdentity
from .model_store import TrainedPart, make_part

DEFAULT_TIMEOUT = 120.0
BYE_KIND = decl.BYE_KIND      # closing barrier; declared for every run
ABORT_KIND = decl.ABORT_KIND  # "I failed, and why": peers stop at once instead of timing out
RESUME_KIND = decl.RESUME_KIND  # a resumed party's offer: the checkpoint steps it holds
# What a peer may make us hold for one message kind it sends us before we read it: honest
# protocols here stay far below (one round's message at a time); a flood is refused.
QUEUE_MAX_BYTES = 256 << 20
QUEUE_MAX_MESSAGES = 4096
MAX_REJECTS_KEPT = 100  # reasons kept verbatim; beyond, only counted by category
MAX_EXCLUSIONS_KEPT = 1000  # rounds with exclusions kept verbatim in result.json; beyond, only counted
MAX_RESTARTS = 8  # restarts of peers one run takes in its stride (restart_grace_s); then offers are refused
MAX_EVIDENCE_KEYS = 4096  # (peer, kind) pairs whose last message's seq and digest are kept as evidence


class PartyError(RuntimeError):
    """A protocol-level failure inside a party."""


class PeerTimeout(PartyError, TimeoutError):
    """A peer did not send the awaited message within the receive timeout."""

    def __init__(self, me: str, peer: str, kind: str, timeout: float, what_it_did: str = ""):
        did = what_it_did or f"{peer!r} is silent (crashed, stalled or unreachable)"
        super().__init__(f"party {me!r} waited {timeout:g}s for a {kind!r} message from {peer!r}; {did}")
        self.peer, self.kind, self.timeout = peer, kind, timeout


class PartyAborted(PartyError):
    """The federation is being torn down because another party failed.

    ``peer``: the party whose abort notice this is (None when the stop came from this
    process, e.g. the in-memory runner).  A notice is only ever a statement about its own
    sender: it names ``peer``, never a party the notice's text may mention."""

    def __init__(self, reason: str, peer: str | None = None):
        super().__init__(reason)
        self.peer = peer


class FederationMismatch(PartyError):
    """A peer's first message carries a different federation fingerprint: the two parties run from
    different federation files.  Which file is wrong is not provable, so nobody is blamed; the
    error names the peer and the sections (and [algorithm] keys) that differ."""

    def __init__(self, me: str, peer: str, sections: list[str]):
        super().__init__(f"party {me!r} and {peer!r} run from different federation files: "
                         + ", ".join(sections) + " differ (compare the two machines' files; the run id and "
                         "every section named must be the same everywhere)")
        self.peer, self.sections = peer, sections


class ProtocolMismatch(FederationMismatch):
    """A peer speaks another version of a protocol (another fedhet release on its machine).  As with
    different federation files, which side is wrong is not provable: names nobody, gives both."""

    def __init__(self, me: str, peer: str, what: str, ours: Any, theirs: Any, hint: str = "run the same fedhet "
                 "release, from the same federation file, on both machines"):
        PartyError.__init__(self, f"party {me!r} has {what} {ours!r} and {peer!r} has {theirs!r} ({hint})")
        self.peer, self.sections = peer, [f"{what}: {me} {ours!r}, {peer} {theirs!r}"]


def fingerprint_diff(mine: dict, theirs: dict | None) -> list[str]:
    """The sections (and [algorithm] keys) in which two federation fingerprints differ."""
    if theirs is None:
        return ["the whole federation (its first message carried no fingerprint)"]
    out = []
    for sec in sorted(set(mine) | set(theirs)):
        a, b = mine.get(sec), theirs.get(sec)
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            out += [f"[{sec}] {k}" for k in keys]
        elif a != b:
            out.append(f"[[party]] {sec}" if sec in ("parties", "endpoints", "keys") else f"[{sec}]")
    return out


class PeerRestarted(PartyError):
    """A peer that died came back (``fedhet party --resume``) within the restart grace period: this
    party's role stops where it is and the run goes on from the newest checkpoint every party
    holds (:meth:`Party.begin_restart`, then :meth:`Party.agree_resume`)."""

    def __init__(self, me: str, peer: str, incarnation: int):
        super().__init__(f"party {me!r}: {peer!r} offers to resume (incarnation {incarnation}): a party that died "
                         "has restarted; going back to the newest checkpoint every party holds")
        self.peer, self.incarnation = peer, incarnation


class PeerFault(PartyError):
    """A peer's own message shows it at fault: undeclared, malformed, out of bounds or
    inconsistent.  The only exception that blames a peer (``fedhet.parties.failure``):
    raise it naming the *sender* of the offending message, with what was wrong."""

    def __init__(self, me: str, peer: str, kind: str, reason: str):
        super().__init__(f"party {me!r} rejected a {kind!r} message from {peer!r}: {reason}")
        self.peer, self.kind, self.reason = peer, kind, reason


class PeersDisagree(PartyError):
    """Messages of two or more peers contradict each other and nothing shows which one deviated:
    names none of them and not the receiver (``fedhet.parties.failure``: cause ``inconsistent``)."""

    def __init__(self, me: str, peers: list[str], kind: str, reason: str):
        super().__init__((f"party {me!r}: " if me else "")
                         + f"{kind!r} messages of {', '.join(map(repr, peers))} disagree: {reason}")
        self.peers, self.kind, self.reason = list(peers), kind, reason


class RoundFailed(PartyError):
    """A round could not complete, and no message proves it against anyone: too few parties
    completed it (dropouts, refused inputs), or the party that runs it stopped it.  Names nobody
    (``fedhet.parties.failure``: cause ``round_failed``)."""


class RestartedWithoutResume(PartyError):
    """This party was started again in a run that went on without it, and not with ``--resume``: a
    peer's first message to it continues the earlier start's conversation.  The party's own failure
    (it names itself, the one that restarted), never its peer's."""

    def __init__(self, me: str, peer: str, seq: int):
        super().__init__(f"party {me!r} restarted without --resume: {peer!r} goes on with the run at message "
                         f"{seq} of its link to the earlier start of {me!r} (restart the run with `fedhet run "
                         "--resume`, or start every party again with a new run id)")
        self.peer, self.seq = peer, seq


class MessageLost(PartyError):
    """Messages of a peer were lost on this party's side: its own connection guard cut the
    connection they came on, so a later sequence gap proves nothing against the sender.  Names
    nobody (``fedhet.parties.failure``: cause ``local_loss``)."""

    def __init__(self, me: str, peer: str, kind: str, reason: str):
        super().__init__(f"party {me!r} lost messages of {peer!r} ({kind!r} next): {reason}")
        self.peer, self.kind, self.reason = peer, kind, reason


class MessageRejected(PeerFault):
    """A peer sent a message this party refused (undeclared kind, payload against its schema,
    or a flood); raised by the ``recv`` that waited for it, naming sender, kind and field."""


class RealClock:
    """Wall-clock time: what every party process runs on."""

    virtual = False

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, owner: str, seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class VirtualClock:
    """Time for parties that are threads of one process (the in-memory runner's ``clock="virtual"``):
    it stands still while any party works, and jumps to the earliest deadline only when every live
    party waits (for a message, or in :meth:`sleep`).  A timeout is then an event of the protocol, not
    a race with the machine's speed: an honest party is never timed out while it computes, and a
    silent one is timed out however busy the machine is.

    Only for role functions that wait in one thread at a time (a party computing in a helper thread
    while its main thread waits would let time jump past it).  Every mailbox of the federation shares
    :attr:`cv`; a delivery marks its receiver runnable at once (under that lock), so time cannot jump
    between a send and the receiver's wake-up.  ``safety_s`` bounds each real wait, so a party blocked
    elsewhere (a lock, a thread outside the clock) cannot hang a test for ever: it only re-checks.
    """

    virtual = True

    def __init__(self, safety_s: float = 0.5) -> None:
        self.cv = threading.Condition()
        self._now = 0.0
        self.live: set[str] = set()
        self.waiting: dict[str, float] = {}   # party -> the deadline it waits for
        self.safety_s = safety_s

    def now(self) -> float:
        return self._now

    def start(self, owner: str) -> None:
        with self.cv:
            self.live.add(owner)

    def finish(self, owner: str) -> None:
        with self.cv:
            self.live.discard(owner)
            self.waiting.pop(owner, None)
            self._advance()

    def runnable(self, owner: str) -> None:
        """``owner`` has something to do (a message arrived): caller holds :attr:`cv`."""
        self.waiting.pop(owner, None)

    def wait(self, owner: str, deadline: float) -> None:
        """Wait (caller holds :attr:`cv`) until woken or ``deadline`` is due; the caller re-checks."""
        self.waiting[owner] = deadline
        self._advance()
        if self._now < deadline and owner in self.waiting:
            self.cv.wait(self.safety_s)
        self.waiting.pop(owner, None)

    def sleep(self, owner: str, seconds: float) -> None:
        with self.cv:
            deadline = self._now + max(0.0, seconds)
            while self._now < deadline:
                self.wait(owner, deadline)

    def _advance(self) -> None:
        if self.live and all(p in self.waiting for p in self.live):
            due = min(self.waiting[p] for p in self.live)
            if due > self._now:
                self._now = due
            self.cv.notify_all()


class _Mailbox:
    """Received envelopes, keyed by (sender, kind), so a recv can wait for one kind."""

    def __init__(self, owner: str = "", clock: "RealClock | VirtualClock | None" = None) -> None:
        self._queues: dict[tuple[str, str], collections.deque] = collections.defaultdict(collections.deque)
        self._bytes: dict[tuple[str, str], int] = collections.defaultdict(int)
        self._poisoned: dict[tuple[str, str], Exception] = {}
        self._poisoned_senders: dict[str, Exception] = {}
        self._failed: Exception | None = None
        self.owner = owner
        self.clock = clock or RealClock()
        self._virtual = self.clock if isinstance(self.clock, VirtualClock) else None
        self._cv = self._virtual.cv if self._virtual is not None else threading.Condition()
        self.aborted: str | None = None
        self.aborted_by: str | None = None  # the peer whose abort notice stopped us
        self._interrupt: Exception | None = None
        self.wire: str | None = None   # after a restart: the run id this incarnation's messages carry

    def put(self, env: codec.Envelope) -> tuple[str, str] | None:
        """Queue ``env``; returns (category, why) when refused: its (sender, kind) queue is full
        ("flood"), or it belongs to an earlier incarnation ("foreign run")."""
        key = (env.frm, env.kind)
        with self._cv:
            if self.wire is not None and env.run != self.wire:
                return "foreign run", f"a message of an earlier incarnation ({env.run!r}) from {env.frm!r}"
            q = self._queues[key]
            if len(q) >= QUEUE_MAX_MESSAGES or self._bytes[key] + env.nbytes > QUEUE_MAX_BYTES:
                return "flood", (f"{len(q)} unread {env.kind!r} messages ({self._bytes[key]:,} bytes) already "
                                 f"queued from {env.frm!r}; limit {QUEUE_MAX_MESSAGES} / {QUEUE_MAX_BYTES:,} bytes")
            q.append(env)
            self._bytes[key] += env.nbytes
            self._wake()
        return None

    def _wake(self) -> None:
        if self._virtual is not None:
            self._virtual.runnable(self.owner)
        self._cv.notify_all()

    def fail(self, err: Exception) -> None:
        """Make every recv raise ``err`` (this party cannot go on: e.g. a federation mismatch)."""
        with self._cv:
            if self._failed is None:
                self._failed = err
            self._wake()

    def poison_sender(self, frm: str, err: Exception) -> None:
        """Make every recv from ``frm``, of any kind, raise ``err``."""
        with self._cv:
            self._poisoned_senders.setdefault(frm, err)
            self._wake()

    def poison(self, frm: str, kind: str, err: Exception) -> None:
        """Make the next recv of (frm, kind) raise ``err`` (the message it waits for was refused)."""
        with self._cv:
            self._poisoned.setdefault((frm, kind), err)
            self._wake()

    def interrupt(self, err: Exception) -> None:
        """Make the next recv raise ``err``, once (a peer restarted: the role goes back to a checkpoint)."""
        with self._cv:
            self._interrupt = err
            self._wake()

    def reset(self, wire: str) -> None:
        """A new incarnation of the run starts, its messages carry run id ``wire``: forget every
        refusal and every queued message of an earlier one, and take no more of them."""
        with self._cv:
            self.wire = wire
            for key, q in self._queues.items():
                keep = [e for e in q if e.run == wire]
                q.clear()
                q.extend(keep)
                self._bytes[key] = sum(e.nbytes for e in keep)
            self._poisoned.clear()
            self._poisoned_senders.clear()
            self._interrupt = None

    def abort(self, reason: str, peer: str | None = None) -> None:
        with self._cv:
            if self.aborted is None:
                self.aborted, self.aborted_by = reason, peer
            self._wake()

    def get(self, frm: str, kind: str | tuple[str, ...], timeout: float) -> codec.Envelope | None:
        """The next message from ``frm`` of ``kind`` (or of any of a tuple of kinds, the first queued)."""
        kinds = (kind,) if isinstance(kind, str) else tuple(kind)
        deadline = self.clock.now() + timeout
        with self._cv:
            while True:
                for k in kinds:
                    q = self._queues.get((frm, k))
                    if q:
                        env = q.popleft()
                        self._bytes[(frm, k)] -= env.nbytes
                        return env
                if self._interrupt is not None:
                    err, self._interrupt = self._interrupt, None
                    raise err
                for k in kinds:
                    if (frm, k) in self._poisoned:
                        raise self._poisoned[(frm, k)]
                if frm in self._poisoned_senders:
                    raise self._poisoned_senders[frm]
                if self._failed is not None:
                    raise self._failed
                if self.aborted is not None:
                    raise PartyAborted(self.aborted, self.aborted_by)
                left = deadline - self.clock.now()
                if left <= 0:
                    return None
                if self._virtual is not None:
                    self._virtual.wait(self.owner, deadline)
                else:
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
        declarations: dict[str, decl.MessageDecl] | None = None,
        sizes: dict[str, int] | None = None,
        clock: RealClock | VirtualClock | None = None,
        fingerprint: dict | None = None,
        incarnation: int = 0,
        restarted: bool = False,
        identity: PartyIdentity | None = None,
    ) -> None:
        if name not in roles:
            raise ValueError(f"party {name!r} is not in the federation ({sorted(roles)})")
        self.name = name
        self.roles = dict(roles)
        self.role = roles[name]
        self.peers = sorted(n for n in roles if n != name)
        self.run_id = run_id
        self.seed = int(seed)
        self.device = device_name(device)
        self.timeout = float(timeout)
        self.max_message_bytes = int(max_message_bytes)
        self.round = 0
        self.transcript = transcript
        self.log = logger or logging.getLogger(f"fedhet.party.{name}")
        self._metrics_path = metrics_path
        self._status_cb = status_cb
        self._last_status = 0.0
        self._spent: float | None = None   # the last dp_epsilon metric: progress shows it (the board's "spent")
        self._t0 = time.monotonic()
        self.clock = clock or RealClock()
        self._mailbox = _Mailbox(name, self.clock)
        # The federation's fingerprint (Federation.fingerprint): sent on each link's first message,
        # checked on each peer's; None (in-memory runs) sends and checks none.
        self.fingerprint = fingerprint
        # The party's federation signing key and every party's pinned one (fedhet.parties.identity):
        # statements a protocol lets travel through another party (:meth:`sign`, :meth:`verify`).
        self.identity = identity
        self._seq_out: dict[str, int] = collections.defaultdict(int)
        self._seq_in: dict[str, int] = collections.defaultdict(int)
        self._last_in: dict[tuple[str, str], dict] = {}   # (peer, kind) -> seq, round, digest of its last message
        self._lock = threading.Lock()  # guards counters and the transcript
        self._send_lock = threading.Lock()
        self._reject_lock = threading.Lock()
        self.bytes_sent: dict[str, int] = collections.defaultdict(int)
        self.bytes_received: dict[str, int] = collections.defaultdict(int)
        self.messages_sent: dict[str, int] = collections.defaultdict(int)
        self.messages_received: dict[str, int] = collections.defaultdict(int)
        self.rejected: list[str] = []  # the first MAX_REJECTS_KEPT reasons, verbatim (truncated)
        self.trained: TrainedPart | None = None   # what the role handed to save_model
        self.reject_counts: dict[str, int] = collections.defaultdict(int)  # "peer: category" -> count
        # Declarations make receipt strict: undeclared kinds, wrong roles and payloads against
        # their schema are refused.  None (low-level tests only) accepts any kind.
        if declarations is not None:
            declarations = decl.index(declarations.values() if isinstance(declarations, dict) else declarations)
        self.declarations = declarations
        self.sizes = dict(sizes or {})
        # Checkpoints (fedhet.parties.checkpoint), set by the runner: where, how often (every k-th
        # step; 0: never), what to do once one is written (fault injection: a kill), and on a resumed
        # run the incarnation (restarts so far: messages carry it, so none crosses a restart).
        self.checkpoints: Checkpoints | None = None
        self.checkpoint_every = 0
        self.after_checkpoint: Callable[[int], None] | None = None
        self.incarnation = int(incarnation)   # before any message: the transport checks it on receipt
        # This party started before in this run (its folder keeps an earlier transcript) and now starts
        # afresh, without resume: a peer whose first message to it is numbered past 0 goes on with the
        # earlier start, so the gap is this party's own restart, never the peer's fault.
        self.restarted = bool(restarted)
        self.exclusions: list[dict] = []   # rounds that went on without some parties (note_round)
        self.exclusion_count = 0
        # what checkpoints cost: seconds the role waited (encoding), write_s the writes took
        self.checkpoint_stats = {"written": 0, "bytes": 0, "seconds": 0.0, "write_s": 0.0}
        self.restart_grace: bool = False          # a peer may restart alone: accept its resume offer
        self.restarts_left = MAX_RESTARTS          # ... this many times a run (a peer cannot loop us for ever)
        self.recorded: dict[int, str] = {}        # step -> digest of the checkpoints its transcript records
        self._restart_offers: dict[str, list[bytes]] = {}   # next incarnation's offers, until it starts
        self._restart_vouches: dict[str, frozenset] = {}   # offering party -> the restarts its offer vouches for
        self._restart_cause: list[str] = []   # the restarts this party's current incarnation answered
        self.resumed_from: int | None = None     # the step agreed on a resumed run (0: none held by all)
        self._resume_state: dict | None = None   # that step's saved state, until the role restores it

    @property
    def wire_id(self) -> str:
        """The run id messages carry: the run's, plus the incarnation after a restart (a message of an
        earlier incarnation is refused as another run's, so none replays across a resume)."""
        return self.run_id if self.incarnation == 0 else f"{self.run_id}/resume-{self.incarnation}"

    # ------------------------------------------------------------------ API
    def peers_with_role(self, role: str) -> list[str]:
        return sorted(n for n, r in self.roles.items() if r == role and n != self.name)

    def peer_with_role(self, role: str) -> str:
        """The one peer of ``role``; a :class:`PartyError` naming what the federation has otherwise."""
        found = self.peers_with_role(role)
        if len(found) != 1:
            raise PartyError(f"{self.role} {self.name!r} needs exactly one {role}, the federation has "
                             f"{len(found)}: {found}")
        return found[0]

    def send(self, to: str, kind: str, payload: Any) -> None:
        if to not in self.roles or to == self.name:
            raise PartyError(f"party {self.name!r} cannot send to {to!r}: not a peer ({self.peers})")
        if not isinstance(kind, str) or not kind:
            raise PartyError("message kind must be a non-empty string")
        with self._send_lock:
            seq = self._seq_out[to]
            if self._resume_state is not None and kind not in decl.BUILTIN_KINDS:
                raise PartyError(f"{self.role} {self.name!r} resumes from step {self.resumed_from} but its role "
                                 "sent a message before calling party.restore(): this algorithm's role does "
                                 "not resume from checkpoints")
            frames = codec.encode(self.wire_id, self.name, to, kind, seq, payload, self.round,
                                  fed=self.fingerprint if seq == 0 else None)
            digest, n = codec.frames_digest(frames)
            self._transport_send(to, frames)
            self._seq_out[to] = seq + 1
        with self._lock:
            self.bytes_sent[to] += n
            self.messages_sent[to] += 1
            if self.transcript is not None:
                self._record("send", to, kind, self.round, seq, n, digest, payload)

    def recv(self, frm: str, kind: str, timeout: float | None = None) -> Any:
        return self.recv_any(frm, (kind,), timeout)[1]

    def recv_any(self, frm: str, kinds: Iterable[str], timeout: float | None = None) -> tuple[str, Any]:
        """The first message from ``frm`` of any of ``kinds``: (its kind, its payload).  For a party
        that must tell which of several first messages a peer sent (a peer on another PSI backend)."""
        kinds = tuple(kinds)
        if frm not in self.roles or frm == self.name:
            raise PartyError(f"party {self.name!r} cannot receive from {frm!r}: not a peer ({self.peers})")
        t = self.timeout if timeout is None else float(timeout)
        env = self._mailbox.get(frm, kinds, t)
        if env is None:
            raise PeerTimeout(self.name, frm, " or ".join(kinds), t, self._what_peer_did(frm))
        return env.kind, env.payload

    def last_received(self, peer: str, kind: str) -> dict | None:
        """Evidence of the last ``kind`` message accepted from ``peer`` at the sequence layer: its seq,
        round and digest (as in both parties' transcripts)."""
        with self._lock:
            got = self._last_in.get((peer, kind))
        return dict(got, peer=peer, kind=kind) if got else None

    def _what_peer_did(self, peer: str) -> str:
        """For a timeout's message: what ``peer`` did send, so an honest peer is not called silent."""
        with self._reject_lock:
            refused = {k.split(": ", 1)[1]: v for k, v in self.reject_counts.items() if k.startswith(peer + ": ")}
        got = self.messages_received.get(peer, 0)
        if not refused and not got:
            return f"{peer!r} sent nothing (crashed, stalled or unreachable)"
        parts = [f"{peer!r} sent {got} accepted message(s)"]
        if refused:
            parts.append("and " + ", ".join(f"{v} refused ({k})" for k, v in sorted(refused.items())))
        return " ".join(parts) + " but not this one"

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
        if self._spent is not None and "dp_epsilon" not in metrics:   # every DP run's board shows epsilon spent
            metrics = {**metrics, "dp_epsilon": round(self._spent, 4)}
        self._status_cb({"done": done, "total": total, "metrics": _jsonable(metrics),
                         "elapsed_s": now - self._t0})

    def save_model(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None:
        """Hand the runtime this party's trained part (:mod:`fedhet.parties.model_store`): its
        arrays and the algorithm's metadata.  The last call wins; the runner writes it to the
        party's ``model/`` folder when the role has returned."""
        self.trained = make_part(tensors, meta)

    # ------------------------------------------------------- checkpoints
    def checkpoint(self, step: int, state: Mapping[str, Any]) -> None:
        """The role's state at the end of step ``step`` (a round or epoch; every role of an algorithm
        checkpoints at the same steps, 1, 2, ...): written when checkpoints are on and ``step`` is a
        multiple of ``checkpoint_every``, with this party's own counters, and its digest recorded in
        the transcript.  ``state``: what the role needs to go on exactly as if never stopped (model,
        optimizer, RNG states, position in the data order, results so far); arrays, tensors, numbers,
        strings, bytes, lists and dicts (:mod:`fedhet.parties.checkpoint`)."""
        if self.checkpoints is None or self.checkpoint_every <= 0 or step % self.checkpoint_every:
            return
        t0 = time.perf_counter()
        with self._lock:
            mine = {"round": self.round, "bytes_sent": dict(self.bytes_sent),
                    "bytes_received": dict(self.bytes_received), "messages_sent": dict(self.messages_sent),
                    "messages_received": dict(self.messages_received)}
        header: dict[str, Any] = {"party": self.name, "role": self.role, "run_id": self.run_id,
                                  "incarnation": self.incarnation}
        if self.transcript is not None:
            header["transcript"] = dict(zip(("count", "head"), self.transcript.head))
        st = self.checkpoint_stats

        def written(digest: str, n: int, write_s: float) -> None:
            # only a checkpoint on disk is recorded (and so ever offered for a resume)
            if self.transcript is not None:
                self.transcript.mark("checkpoint", step=int(step), sha256=digest, bytes=n)
            self.recorded[int(step)] = digest
            st["written"], st["bytes"], st["write_s"] = st["written"] + 1, st["bytes"] + n, st["write_s"] + write_s
            self.log.debug("checkpoint of step %d written (%d bytes, %.3fs)", step, n, write_s)
            if self.after_checkpoint is not None:
                self.after_checkpoint(step)

        self.checkpoints.submit(step, {"role": dict(state), "party": mine}, header, written)
        if self.after_checkpoint is not None:
            # a fault cued at a step (faults.kill_hook, raise_at) fires before the role goes on: with the
            # write left to the writer thread, a kill "after step 2" could land rounds later (or after
            # the run ended), under load
            self.checkpoints.flush()
        st["seconds"] += time.perf_counter() - t0   # what the role waited for

    def begin_restart(self, cause: PeerRestarted) -> dict[int, str]:
        """A peer restarted: start the next incarnation in this process (sequence numbers afresh,
        queued messages of the old one dropped, a ``resume`` record), hand on the offers that came
        for it, and return the checkpoints this party can offer (step -> digest)."""
        self.flush_checkpoints()
        have = self.checkpoints.digests() if self.checkpoints is not None else {}
        offered = {s: d for s, d in have.items() if self.recorded.get(s) == d}
        with self._lock:   # as _deliver's checks: no message lands on the wrong side of the resume record
            self.restarts_left -= 1
            self.incarnation += 1
            self._seq_out.clear()
            self._seq_in.clear()
            if self.transcript is not None:
                self.transcript.mark("resume", incarnation=self.incarnation, earlier=None, offer_from=cause.peer,
                                     offered={str(k): v for k, v in sorted(offered.items())})
        self._mailbox.reset(self.wire_id)
        self._restart_seen()
        self.log.warning("%s; checkpoints held: %s", cause, sorted(offered) or "none")
        with self._lock:
            waiting, self._restart_offers = self._restart_offers, {}
            self._restart_vouches = {}
            self._restart_cause = [cause.peer]
        for frm, frames in waiting.items():
            self._deliver(frames, authenticated=frm)
        return offered

    def _restart_offer(self, env: codec.Envelope, frames: list, authenticated: str | None) -> bool:
        """Keep the first message of the next incarnation, a peer's resume offer, and stop the role
        (True); False for anything else."""
        nxt = f"{self.run_id}/resume-{self.incarnation + 1}"
        if (not self.restart_grace or self.restarts_left <= 0 or env.run != nxt or env.kind != RESUME_KIND or env.seq != 0
                or authenticated is None or authenticated != env.frm):
            return False
        with self._lock:
            if env.frm in self._restart_offers or len(self._restart_offers) >= len(self.peers):
                return False
            self._restart_offers[env.frm] = [bytes(f) for f in frames]
            seen = env.payload.get("seen") if isinstance(env.payload, dict) else None
            self._restart_vouches[env.frm] = frozenset(
                v for v in (seen if isinstance(seen, (list, tuple)) else ()) if isinstance(v, str))
            cause = self._restart_to_honour()
        if cause is None:
            self.log.warning("a resume offer from %r, whose restart this party cannot see (its connections never "
                             "broke since this party's last (re)start, or they never talked) and no party it "
                             "talked with vouches for: held, not honoured", env.frm)
            return True
        self._mailbox.interrupt(PeerRestarted(self.name, cause, self.incarnation + 1))
        return True

    def _restart_to_honour(self) -> str | None:
        """The held offer that starts the next incarnation, or None while none may (caller holds the lock).

        A party that restarts died first: its connections ended.  An offer is honoured when this party
        sees the offering party's restart (one of its connections ended), or when a party this one
        talked with vouches for it: that party's own offer names it among the restarts it answered
        (it saw them, or was vouched to by a party it talked with).  An offer from a party whose
        connections never broke, alone, rolls nobody back: it stays held and the run goes on.  A
        party that never talked with the offering one cannot see its restart: it waits for a vouch,
        so a listed party lying about a restart cannot split those that never talked with it from
        the rest.  A party that talked with nobody at all has nothing to judge by and honours it.
        """
        judged = {p: self._restart_judge(p) for p in self._restart_offers}
        for p, j in judged.items():
            if j == "seen":
                return p
        for p in judged:
            if any(p in self._restart_vouches.get(q, ()) for q, j in judged.items() if q != p and j != "unknown"):
                return p
        if not (any(self.messages_received.values()) or any(self.messages_sent.values())):
            return next(iter(judged), None)
        return None

    def flush_checkpoints(self) -> None:
        """Wait for checkpoints still being written (a runner calls it before closing the transcript)."""
        if self.checkpoints is not None:
            self.checkpoints.flush()

    def restore(self) -> tuple[int, dict]:
        """``(step, state)`` to start from: on a resumed run the state this role handed
        :meth:`checkpoint` at the step every party holds, else ``(0, {})``.  A role calls it once,
        before its first message, and goes on from step ``step + 1``."""
        state, self._resume_state = self._resume_state, None
        if state is None:
            return 0, {}
        return int(self.resumed_from or 0), state

    def agree_resume(self, offered: Mapping[int, str]) -> int:
        """A resumed run's first exchange: send every peer the checkpoint steps this party holds
        (``offered``: step -> the SHA-256 its transcript recorded), hear theirs, and load the newest
        step all hold (0: none, the run starts over; the transcript still goes on).  Returns it."""
        held = sorted(int(s) for s in offered)[-decl.MAX_HELD:]
        self.recorded.update({int(s): d for s, d in offered.items()})
        for p in self.peers:   # "seen": the restarts this incarnation answered (a vouch for them)
            self.send(p, RESUME_KIND, {"held": held, "incarnation": self.incarnation,
                                       "seen": sorted(set(self._restart_cause))})
        common = set(held)
        for p in self.peers:
            offer = self.recv(p, RESUME_KIND)
            if offer["incarnation"] != self.incarnation:
                raise PeerFault(self.name, p, RESUME_KIND, f"it resumes incarnation {offer['incarnation']}, "
                                f"this party {self.incarnation}")
            common &= set(offer["held"])
        step = max(common, default=0)
        self.resumed_from = step
        digest = offered.get(step) if step else None
        if self.transcript is not None:
            self.transcript.mark("restore", step=step, sha256=digest, incarnation=self.incarnation)
        if step == 0:
            self._resume_state = {}
            self.log.warning("resume: no checkpoint is held by every party; the run starts over")
            return 0
        if self.checkpoints is None:
            raise CheckpointError(f"party {self.name!r} agreed on step {step} but has no checkpoint folder")
        saved, _ = self.checkpoints.read(step, digest)
        mine = saved["party"]
        with self._lock:
            self.round = int(mine["round"])
            for attr in ("bytes_sent", "bytes_received", "messages_sent", "messages_received"):
                getattr(self, attr).update(mine[attr])
        self._resume_state = saved["role"]
        self.log.info("resume: every party holds step %d; going on from there", step)
        return step

    def metric(self, **values: Any) -> None:
        rec = {"party": self.name, "round": self.round, "wall_s": round(time.monotonic() - self._t0, 6),
               "bytes_sent": sum(self.bytes_sent.values()),
               "bytes_received": sum(self.bytes_received.values())}
        rec.update(_jsonable(values))
        if isinstance(values.get("dp_epsilon"), (int, float)):
            self._spent = float(values["dp_epsilon"])
        if self._metrics_path is not None:
            with open(self._metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec, sort_keys=True) + "\n")

    def note_round(self, step: str, round: int, contributors: Iterable[str], excluded: Mapping[str, str]) -> None:
        """Record a round of ``step`` (an aggregation, a view) that went on without some parties:
        its contributors and each excluded party with the reason.  The runner writes these into
        ``result.json`` (``"exclusions"``), so a run that left a party out never reads as complete."""
        if not excluded:
            return
        with self._lock:
            self.exclusion_count += 1
            if len(self.exclusions) < MAX_EXCLUSIONS_KEPT:
                self.exclusions.append({"step": step, "round": int(round), "contributors": sorted(contributors),
                                        "excluded": {str(k): str(v) for k, v in sorted(excluded.items())}})
        self.log.warning("%s round %d went on without %s", step, round,
                         "; ".join(f"{k} ({v})" for k, v in sorted(excluded.items())))

    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    # ------------------------------------------------------------ identity
    def _identity(self) -> PartyIdentity:
        if self.identity is None:
            raise PartyError(f"party {self.name!r} has no federation signing key (this transport was made "
                             "without one), so it cannot sign or check a party's statement")
        return self.identity

    def sign(self, label: str, message: bytes) -> bytes:
        """This party's Ed25519 signature, with its federation key, on ``message`` as a ``label`` statement
        of this run (:mod:`fedhet.parties.identity`): a peer checks it with :meth:`verify`."""
        return self._identity().sign(self.run_id, self.name, label, message)

    def verify(self, signer: str, label: str, message: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is ``signer``'s, by the key the federation file pins for it, on ``message``
        as a ``label`` statement of this run.  A missing pinned key is this party's own configuration
        problem (a :class:`PartyError` naming it), never evidence against anyone."""
        ok = self._identity().verify(self.run_id, signer, label, message, signature)
        if ok is None:
            raise PartyError(f"party {self.name!r} has no sign_key pinned for {signer!r} in its federation file, "
                             "so it cannot check what that party signed (run `fedhet keys FILE --update` "
                             "and copy every party's sign_key into every machine's copy of the file)")
        return ok

    def now(self) -> float:
        """The clock that receive timeouts run on (monotonic seconds; virtual under the in-memory
        runner's ``clock="virtual"``).  Protocol deadlines are computed from it, never from time.*."""
        return self.clock.now()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on :meth:`now`'s clock (fault injection: a late party)."""
        self.clock.sleep(self.name, seconds)

    def abort(self, reason: str, peer: str | None = None) -> None:
        """Make every pending and future recv fail (used when another party, ``peer``, failed)."""
        self._mailbox.abort(reason, peer)

    def close(self, timeout: float | None = None) -> None:
        """Closing barrier: tell every linked peer (:meth:`linked_peers`) we are done and wait for theirs.

        Per-link ordering means a peer's ``_bye`` arrives after everything it
        sent us, so after the barrier no message of this run is in flight to us.
        """
        t = self.timeout if timeout is None else timeout
        linked = self.linked_peers()
        for p in linked:
            try:
                self.send(p, BYE_KIND, None)
            except Exception as e:  # a dead peer must not stop our clean exit
                self.log.warning("could not send closing message to %s: %s", p, e)
        for p in linked:
            try:
                self.recv(p, BYE_KIND, timeout=t)
            except PartyError as e:
                self.log.warning("closing barrier: %s", e)
        self._transport_close()

    def linked_peers(self) -> list[str]:
        """Peers a declared message kind can pass between (either way): the closing barrier's.

        A peer whose role no declaration links to ours can send us nothing we accept, so the
        barrier skips it (hundreds of owners that never talk to each other need not connect).
        Without declarations (low-level tests) every peer is linked.
        """
        if self.declarations is None:
            return list(self.peers)
        decls = [d for k, d in self.declarations.items() if k not in decl.BUILTIN_KINDS]

        def linked(role: str) -> bool:
            return any((decl.role_ok(self.role, d.sender) and decl.role_ok(role, d.receiver))
                       or (decl.role_ok(role, d.sender) and decl.role_ok(self.role, d.receiver)) for d in decls)

        by_role = {r: linked(r) for r in set(self.roles.values())}
        return [p for p in self.peers if by_role[self.roles[p]]]

    # --------------------------------------------------------- transport side
    def _transport_send(self, to: str, frames: list) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _transport_close(self, linger_s: float | None = None, unreached_s: float | None = None) -> None:
        """Close the transport: queued messages get ``linger_s`` (None: as long as they need) to leave;
        with ``unreached_s``, a party that has heard from no peer yet gives those for a peer it never
        reached at least that long (a failure notice for a peer that may still be starting)."""

    def _restart_judge(self, peer: str) -> str:
        """What this party can tell of ``peer``'s restart since this incarnation began: "seen" (one
        of its connections ended), "unseen" (they talked, and none ended) or "unknown" (they never
        talked: nothing here can tell).  In memory every offer is a real restart."""
        return "seen"

    def _restart_seen(self) -> None:
        """A new incarnation begins: restarts are judged from here on (the transport's hook)."""

    def _cut_links(self, peer: str) -> int:
        """Connections of ``peer`` this party's own guard has cut (a transport with a guard says);
        while there are any, a gap in that peer's sequence is a local loss, not its fault."""
        return 0

    def _reject(self, reason: str, peer: str = "?", category: str = "malformed") -> None:
        """Log and count a refused message.  Reasons can reflect what a peer sent: they are cut
        to 200 characters, and only the first MAX_REJECTS_KEPT are kept and logged verbatim."""
        reason = str(reason)
        reason = reason if len(reason) <= 200 else reason[:197] + "..."
        with self._reject_lock:
            self.reject_counts[f"{peer}: {category}"] += 1
            keep = len(self.rejected) < MAX_REJECTS_KEPT
            if keep:
                self.rejected.append(reason)
        if keep:
            self.log.warning("rejected message: %s", reason)
        elif sum(self.reject_counts.values()) % 1000 == 0:
            self.log.warning("rejected messages so far: %s", dict(self.reject_counts))

    def _record(self, direction: str, peer: str, kind: str, rnd: int, seq: int, n: int, digest: str,
                payload: Any) -> None:
        described = schema.describe(payload)
        self.transcript.record(direction, peer, kind, rnd, seq, n, digest,
                               [(dt, shape) for _, dt, shape in described],
                               paths=[p for p, _, _ in described])

    def _admit(self, env: codec.Envelope) -> tuple[str, str, Exception | None] | None:
        """Check a received message against the declarations: None if admitted, else
        (category, reason, error for the waiting recv)."""
        if self.declarations is None:
            return None
        d = self.declarations.get(env.kind)
        srole = self.roles.get(env.frm, "?")
        if d is None:
            return ("undeclared kind", f"undeclared message kind {env.kind!r} from {env.frm!r}", None)
        if not decl.role_ok(srole, d.sender) or not decl.role_ok(self.role, d.receiver):
            return ("undeclared kind", f"kind {env.kind!r} is declared {list(d.sender)} -> {list(d.receiver)}, "
                    f"not {srole} {env.frm!r} -> {self.role} {self.name!r}", None)
        if d.payload is not None:
            try:
                d.payload.validate(env.payload, "", self.sizes)
            except schema.SchemaError as e:
                return ("against its schema", f"{env.kind!r} from {env.frm!r}: {e}",
                        MessageRejected(self.name, env.frm, env.kind, str(e)))
        return None

    def _deliver(self, frames: list, authenticated: str | None) -> bool:
        """Validate one received frame set and queue it; never raises.

        ``authenticated`` is the sender name the transport vouches for (the
        CURVE key the connection proved, mapped through the allow-list), or
        None where the transport cannot vouch (``--insecure``).
        """
        peer = authenticated or "?"
        except_reason = None
        try:
            env = codec.decode(frames, self.max_message_bytes)
        except MalformedMessage as e:
            except_reason = f"malformed from {peer}: {e}"
        except Exception as e:  # belt and braces: nothing a peer sends may crash us
            except_reason = f"undecodable from {peer}: {type(e).__name__}: {e}"
        if except_reason is not None:
            self._reject(except_reason, peer, "malformed")
            return False
        if env.run != self.wire_id:
            if self._restart_offer(env, frames, authenticated):
                return True
            self._reject(f"message of another run {env.run!r} (ours {self.wire_id!r}) from {env.frm!r}",
                         peer, "foreign run")
            return False
        if env.to != self.name:
            self._reject(f"message addressed to {env.to!r} delivered to {self.name!r}", peer, "misaddressed")
            return False
        if env.frm not in self.roles or env.frm == self.name:
            self._reject(f"message from unknown party {env.frm!r}", peer, "unknown sender")
            return False
        if authenticated is not None and authenticated != env.frm:
            self._reject(f"party {authenticated!r} tried to send as {env.frm!r}", peer, "impersonation")
            return False
        with self._lock:
            if env.run != self.wire_id:   # this party restarted since the check above: a stale message
                self._reject(f"message of an earlier incarnation {env.run!r} from {env.frm!r}", env.frm, "foreign run")
                return False
            expected = self._seq_in[env.frm]
            if env.seq != expected:
                what = "replayed" if env.seq < expected else "out-of-order"
                why = f"{what} message from {env.frm!r}: seq {env.seq}, expected {expected}"
                self._reject(why, env.frm, what)
                cuts = self._cut_links(env.frm)
                if self.restarted and expected == 0 and env.seq > 0:
                    self._mailbox.poison_sender(env.frm, RestartedWithoutResume(self.name, env.frm, env.seq))
                elif authenticated is not None and cuts:
                    # This party's own guard cut a connection of that peer: the gap may be the
                    # message that was in flight on it.  A local loss, not evidence against the peer.
                    self._mailbox.poison_sender(env.frm, MessageLost(
                        self.name, env.frm, env.kind, f"{why}, after this party's connection guard cut "
                        f"{cuts} connection(s) of {env.frm!r}: the missing message(s) were lost here"))
                elif authenticated is not None:
                    # Only the holder of env.frm's key can put a message on this link: an honest party
                    # never repeats or skips a sequence number, so its key is replaying or is used by a
                    # second sender.  Every wait on it fails now, naming it, instead of timing out.
                    self._mailbox.poison_sender(env.frm, PeerFault(
                        self.name, env.frm, env.kind, f"{why}: messages under {env.frm!r}'s key are out of "
                        "sequence (a replay, or a second sender holding its key)"))
                return False
            self._seq_in[env.frm] = expected + 1
            if expected == 0 and self.fingerprint is not None:
                differ = fingerprint_diff(self.fingerprint, env.fed)
                if differ:
                    mismatch = FederationMismatch(self.name, env.frm, differ)
                    self._reject(str(mismatch), env.frm, "federation mismatch")
                    self._mailbox.fail(mismatch)
                    return False
            self.bytes_received[env.frm] += env.nbytes
            if len(self._last_in) < MAX_EVIDENCE_KEYS or (env.frm, env.kind) in self._last_in:
                self._last_in[(env.frm, env.kind)] = {"seq": env.seq, "round": env.round, "sha256": env.digest}
        refused = self._admit(env)
        if refused is not None:
            category, reason, err = refused
            self._reject(reason, env.frm, category)
            if err is not None:
                self._mailbox.poison(env.frm, env.kind, err)
            return False
        with self._lock:
            if env.run != self.wire_id:   # this party restarted while checking it
                return False
            self.messages_received[env.frm] += 1
            if self.transcript is not None:
                self._record("recv", env.frm, env.kind, env.round, env.seq, env.nbytes, env.digest, env.payload)
        if env.kind == ABORT_KIND:
            reason = env.payload.get("reason", "") if isinstance(env.payload, dict) else ""
            self._mailbox.abort(f"party {env.frm!r} announced its own failure: {str(reason)[:2000]}", env.frm)
            return True
        queued = self._mailbox.put(env)
        if queued is not None:
            category, why = queued
            self._reject(why, env.frm, category)
            if category == "flood":
                self._mailbox.poison(env.frm, env.kind, MessageRejected(self.name, env.frm, env.kind, why))
            return False
        return True

    def notify_failure(self, reason: str) -> None:
        """Tell every peer this party failed (best effort), so they stop within seconds and name it."""
        for p in self.peers:
            try:
                self.send(p, ABORT_KIND, {"reason": str(reason)[:schema.MAX_TEXT]})
            except Exception:  # a dead link must not hide the original failure
                pass

    def traffic(self) -> dict:
        return {
            "bytes_sent": dict(self.bytes_sent), "bytes_received": dict(self.bytes_received),
            "messages_sent": dict(self.messages_sent), "messages_received": dict(self.messages_received),
            "bytes_sent_total": sum(self.bytes_sent.values()),
            "bytes_received_total": sum(self.bytes_received.values()),
            "rejected": len(self.rejected),
        }


class UnknownDevice(PartyError, ValueError):
    """A device spec that is none of cpu, cuda, cuda:N, auto."""


def device_name(device: str | None) -> str:
    """The one resolution of a device spec (a party's ``device``, a role's): ``"cpu"``, ``"cuda"``,
    ``"cuda:N"`` or ``"auto"`` (CUDA when torch sees it) as the name torch takes.

    Asking for CUDA where torch sees none is an error (:class:`PartyError`), never a silent fall-back
    to the CPU; anything else is an :class:`UnknownDevice`.  ``algorithms.toolkit.resolve_device``
    is this as a ``torch.device``.
    """
    name = str(device if device is not None else "cpu").strip().lower()
    if name == "cpu":
        return name
    import torch   # here, so a party that runs on the CPU imports no torch for this

    has_cuda = torch.cuda.is_available()
    if name == "auto":
        return "cuda" if has_cuda else "cpu"
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not has_cuda:
            raise PartyError(f"device {device!r} requested but torch sees no CUDA device "
                             f"(CUDA is not available)")
        return name
    raise UnknownDevice(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto")


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
