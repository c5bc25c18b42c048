"""Secure aggregation, client side: one function per round of Bonawitz et al. (Fig. 4).

:meth:`SecAggClient.submit` runs one protocol instance; each of its four
messages is computed by one function of this module, from the round's state
(:class:`ClientRound`) and what the server sent:

=================  ===============================================  ==================
function           computes                                         sends
=================  ===============================================  ==================
advertise_keys     round key pairs c_u, s_u, self-mask seed b_u,    ``secagg/keys``
                   the signed advertisement
share_keys         checks the key list (signatures, distinct keys),  ``secagg/shares``
                   t_local-of-(k + 1) shares of b_u and s_u^SK
                   sealed to each neighbour
premask            y_u = q_u + masks for every listed neighbour,     (nothing)
                   while the server gathers the shares
masked_input       opens the relayed shares, takes the masks of      ``secagg/masked``
                   listed neighbours missing from U2 back out of y_u
unmask_shares      the share of b_v for v in U3, of s_v^SK for v    ``secagg/unmask``
                   in U2 minus U3, never both
=================  ===============================================  ==================

The masked input is computed before the server's relay arrives (:func:`premask`,
right after the shares are sent): that is when the client would otherwise sit
idle, and the relay usually only confirms that every listed neighbour shared.
Each pairwise seed is agreed once per round and kept for a correction.

:class:`Faults` injects misbehaviour for tests (vanish after a step, send
late, send a stale copy of a message); it is given to the client object, so
no test hook appears in :meth:`SecAggClient.submit`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import msgpack
import numpy as np

from fedhet.crypto import keys as ck
from fedhet.crypto.field import F61
from fedhet.crypto.prg import random_seed

from fedhet.parties.contract import PartyLike
from fedhet.parties.api import PeerTimeout, ProtocolMismatch

from .secagg_config import SecAggConfig, SecAggDisagree, SecAggFault, SecAggRoundFailed, neighbours_of
from .secagg_masks import apply_masks, share_secrets_at
from .secagg_messages import (SECRET_ELEMS, STEPS, KEYS_STATEMENT, Kind, RoundInbox, check_round, keys_signed_message,
                              round_context, seed_commitment, universe_digest)
from .secagg_quantizer import Quantizer, check_input

__all__ = ["SecAggClient", "SubmitResult", "Faults", "ClientRound", "advertise_keys", "share_keys", "premask",
           "masked_input", "unmask_shares"]

_KIND_OF_STEP = {"advertise": Kind.KEYS, "share": Kind.SHARES, "masked": Kind.MASKED, "unmask": Kind.UNMASK}


@dataclass
class SubmitResult:
    status: str  # "ok" (unmasking shares sent) or "dropped" (the server went on without us) or "stopped"
    round: int
    reason: str = ""


@dataclass(frozen=True)
class Faults:
    """Misbehaviour injected into one client's round, for tests of dropouts and late or stale messages.

    ``stop_after``: ``"start"`` (before advertising keys) or a step of
    :data:`~fedhet.protocols.secagg_messages.STEPS`; the client sends that
    step's message and then vanishes from the round (``submit`` returns
    status ``"stopped"``).  ``delay``: ``(step, seconds)``, sleep before
    sending that step's message.  ``stale``: a step whose message is preceded
    by a copy labelled with the previous round (a late message of an earlier
    round, which the server must discard).
    """

    stop_after: str | None = None
    delay: tuple[str, float] | None = None
    stale: str | None = None

    def __post_init__(self):
        if self.stop_after is not None and self.stop_after not in ("start",) + STEPS:
            raise ValueError(f"stop_after must be one of {('start',) + STEPS}, got {self.stop_after!r}")
        if self.delay is not None and (len(self.delay) != 2 or self.delay[0] not in STEPS or self.delay[1] < 0):
            raise ValueError(f"delay must be (step in {STEPS}, seconds >= 0), got {self.delay!r}")
        if self.stale is not None and self.stale not in STEPS:
            raise ValueError(f"stale must be one of {STEPS}, got {self.stale!r}")


@dataclass
class ClientRound:
    """One client's state through one round (what :func:`advertise_keys` ... :func:`unmask_shares` share)."""

    cfg: SecAggConfig
    me: str
    run_id: str
    seed: int
    r: int
    x: np.ndarray
    w: float
    ctx: bytes
    server: str = ""   # whose list, relay and requests this client checks
    known: tuple[bytes, list[str]] | None = None  # (digest, client list) held from an earlier round
    # round 0
    c_sk: Any = None
    s_sk: Any = None
    c_pk: bytes = b""
    s_pk: bytes = b""
    b: bytes = b""
    commit: bytes = b""
    # round 1 (from the key list)
    universe: list[str] = field(default_factory=list)
    t: int = 0
    tl: int = 0
    quant: Quantizer | None = None
    nbrs: frozenset = frozenset()
    idx: dict[str, int] = field(default_factory=dict)
    peer_keys: dict[str, tuple[bytes, bytes, bytes]] = field(default_factory=dict)
    enc: dict[str, bytes] = field(default_factory=dict)
    own_share: np.ndarray | None = None
    # between rounds 1 and 2: the masked input for every listed neighbour, and their mask seeds
    y: np.ndarray | None = None
    masks: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    # round 2
    n2: int = 0        # |U2|; its members among this client's neighbours are those whose shares were relayed
    held: dict[str, np.ndarray] = field(default_factory=dict)


# ------------------------------------------------------------ the rounds
def advertise_keys(st: ClientRound, sign: Callable[[str, bytes], bytes]) -> dict:
    """Round 0: fresh key pairs and self-mask seed; the ``secagg/keys`` payload, signed by ``sign``
    (the party's federation key: :meth:`fedhet.parties.api.Party.sign`)."""
    st.c_sk, st.s_sk = ck.generate_x25519(), ck.generate_x25519()
    st.c_pk, st.s_pk = ck.public_bytes(st.c_sk), ck.public_bytes(st.s_sk)
    st.b = random_seed()
    st.commit = seed_commitment(st.b)
    sig = sign(KEYS_STATEMENT, keys_signed_message(st.cfg.tag, st.run_id, st.r, st.me, st.c_pk, st.s_pk, st.commit))
    have = st.known[0] if st.known is not None else b""
    return {"r": st.r, "c_pk": st.c_pk, "s_pk": st.s_pk, "commit": st.commit, "sig": sig, "have": have}


def share_keys(st: ClientRound, p: dict, peer_roles: Mapping[str, str], own_role: str,
               signed_by: Callable[[str, bytes, bytes], bool]) -> dict:
    """Round 1: check the server's key list ``p``; the sealed shares (``secagg/shares`` payload).

    ``signed_by(v, message, sig)``: whether ``sig`` on ``message`` is v's, by the key the federation
    file pins for v (:meth:`fedhet.parties.api.Party.verify`).  The server checked every signature
    when the keys reached it, so a relayed one that does not verify is the server's fault.
    """
    cfg, r, me = st.cfg, st.r, st.me
    universe, digest = p["universe"], bytes(p["digest"])
    if not universe:  # the list this client holds from an earlier round, named by its digest
        if st.known is None or st.known[0] != digest:
            raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: it names a client list by a digest this "
                              "client did not report holding, and sends no list")
        universe = st.known[1]
    elif universe_digest(cfg.tag, universe) != digest:
        raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: the client list does not match its digest")
    if len(set(universe)) != len(universe) or me not in universe:
        raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: the client list is malformed or lacks {me!r}")
    st.known = (digest, list(universe))
    universe = sorted(universe)
    strangers = [u for u in universe if u != me and peer_roles.get(u) != own_role]
    if strangers:
        raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: it lists parties that are not {own_role}s: "
                          f"{strangers}")
    n = len(universe)
    st.universe, st.t, st.tl = universe, cfg.t(n), cfg.t_local(n)
    quant = st.quant = cfg.quantizer(n)
    if (p["frac_bits"], p["ring_bits"]) != (quant.frac_bits, quant.ring_bits):
        raise ProtocolMismatch(me, st.server, "secure aggregation encoding (frac_bits, ring_bits)",
                               (quant.frac_bits, quant.ring_bits), (p["frac_bits"], p["ring_bits"]),
                               "do both use the same secagg_* settings?")
    st.nbrs = neighbours_of(me, universe, cfg, st.seed, st.run_id, r)
    keys = p["keys"]
    if me not in keys:
        raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: the key list lacks this client's own keys")
    seen: set[bytes] = set()
    for v, entry in keys.items():
        if v != me and v not in st.nbrs:
            raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: the key list holds {v!r}, not a neighbour "
                              f"of {me!r}")
        vc, vs, vcommit, vsig = (bytes(e) for e in entry)
        if v == me:
            if (vc, vs, vcommit) != (st.c_pk, st.s_pk, st.commit):
                raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: it relayed keys for {me!r} that are not "
                                  "its own")
        elif not signed_by(v, keys_signed_message(cfg.tag, st.run_id, r, v, vc, vs, vcommit), vsig):
            raise SecAggFault(me, st.server, Kind.KEYLIST, f"round {r}: the signature on {v!r}'s keys, as the "
                              f"server relayed them, does not verify under {v!r}'s pinned sign_key (the server "
                              "checks each on receipt, so it altered them or relayed a bad one)")
        if vc in seen or vs in seen or vc == vs:
            raise SecAggDisagree(me, [v, st.server], Kind.KEYLIST, f"round {r}: public keys in the key list are "
                                 "not distinct")
        seen.update((vc, vs))
        st.peer_keys[v] = (vc, vs, vcommit)
    if len(st.peer_keys) < st.tl:
        raise SecAggRoundFailed(f"round {r}: only {len(st.peer_keys)} share holders, below the threshold {st.tl}")
    st.idx = {u: i for i, u in enumerate(universe)}
    holders = sorted(st.peer_keys)  # its neighbours in U1 and itself: only their points are computed
    rows = share_secrets_at([st.b, ck.private_bytes(st.s_sk)], [st.idx[v] + 1 for v in holders], st.tl)
    shares = dict(zip(holders, rows))  # v's share is at x = (v's place in the client list) + 1
    st.own_share = shares[me].copy()
    ct = {}
    for v, (vc, _, _) in st.peer_keys.items():
        if v == me:
            continue
        st.enc[v] = ck.agree(st.c_sk, vc, info=b"enc" + st.ctx)  # the same key opens v's shares for us
        ct[v] = ck.seal(st.enc[v], shares[v].tobytes(), aad=st.ctx + msgpack.packb([me, v]))
    return {"r": r, "ct": ct}


def premask(st: ClientRound) -> None:
    """Between rounds 1 and 2: ``y_u = q_u + PRG(b_u) + sum_v +-PRG(s_uv)`` over every neighbour in the key list.

    The relay (U2) may leave some of them out; :func:`masked_input` then
    takes their masks back out.  The seeds ``s_uv`` are agreed here, once.
    """
    for v in sorted(set(st.peer_keys) - {st.me}):
        seed = ck.agree(st.s_sk, st.peer_keys[v][1], info=b"mask" + st.ctx)
        st.masks[v] = (seed, +1 if st.idx[st.me] < st.idx[v] else -1)
    assert st.quant is not None  # set by share_keys
    st.y = np.empty(st.x.size + 1, dtype=st.quant.dtype)
    apply_masks(st.y, [(st.b, +1)] + [st.masks[v] for v in sorted(st.masks)], st.quant, st.x, st.w)


def masked_input(st: ClientRound, p: dict) -> dict:
    """Round 2: open the shares relayed in ``p``; the masked input (``secagg/masked`` payload)."""
    r, me = st.r, st.me
    n2, relayed = int(p["n2"]), p["ct"]
    # The neighbours in U2 are those whose shares are relayed; U2 itself is sent as its size only.
    mask_peers = sorted(relayed)
    stray = set(mask_peers) - (st.nbrs & set(st.peer_keys))
    if stray:
        raise SecAggFault(me, st.server, Kind.RELAY, f"round {r}: relayed shares come from {sorted(stray)}, which "
                          f"are not neighbours of {me!r} whose keys were listed")
    if not len(mask_peers) + 1 <= n2 <= len(st.universe):
        raise SecAggFault(me, st.server, Kind.RELAY, f"round {r}: malformed relay of shares (U2 of size {n2} must "
                          f"hold {me!r} and the {len(mask_peers)} neighbours whose shares it relays, within the "
                          f"{len(st.universe)} listed clients)")
    st.n2 = n2
    if n2 < st.t:
        raise SecAggRoundFailed(f"round {r}: only {n2} clients shared keys, below t={st.t}")
    assert st.own_share is not None  # set by share_keys
    st.held = {me: st.own_share}
    for v in mask_peers:
        try:
            raw = ck.open_sealed(st.enc[v], relayed[v], aad=st.ctx + msgpack.packb([v, me]))
        except (ck.AuthenticationError, TypeError) as e:
            raise SecAggDisagree(me, [v, st.server], Kind.RELAY, f"round {r}: the shares from {v!r}, as the server "
                                 f"relayed them, fail authentication: {e}") from None
        row = np.frombuffer(raw, dtype=np.uint64)
        if row.size != 2 * SECRET_ELEMS:
            raise SecAggDisagree(me, [v, st.server], Kind.RELAY, f"round {r}: the shares from {v!r} have the wrong "
                                 "size")
        st.held[v] = F61.asarray(row.copy(), f"shares from {v}")
    if st.y is None:
        premask(st)
    assert st.y is not None
    # Listed neighbours that did not share (not in U2): nobody can unmask their pairwise masks.
    gone = sorted(set(st.masks) - set(mask_peers))
    if gone:
        apply_masks(st.y, [(st.masks[v][0], -st.masks[v][1]) for v in gone])
    y, st.y = st.y, None
    return {"r": r, "y": y}


def unmask_shares(st: ClientRound, p: dict) -> dict:
    """Round 3: for the unmask request ``p`` (U3), the shares the server may have (``secagg/unmask`` payload)."""
    r, me = st.r, st.me
    u3, n3 = set(p["u3"]), int(p["n3"])  # this client's share holders in U3, and the size of U3
    if not (me in u3 and u3 <= set(st.held) and len(u3) <= n3 <= st.n2):
        raise SecAggFault(me, st.server, Kind.UNMASK_REQUEST, f"round {r}: malformed unmask request (U3 must hold "
                          f"{me!r}, name only clients whose shares this client holds, and lie within U2)")
    if n3 < st.t:
        raise SecAggRoundFailed(f"round {r}: only {n3} masked inputs, below t={st.t}; refusing to unmask")
    b_of = sorted(v for v in st.held if v in u3)
    s_of = sorted(v for v in st.held if v not in u3)  # dropped after sharing: reveal its mask key only
    # One array, b-shares then s-shares: never empty (it holds our own b-share).
    rows = [st.held[v][:SECRET_ELEMS] for v in b_of] + [st.held[v][SECRET_ELEMS:] for v in s_of]
    return {"r": r, "b_of": b_of, "s_of": s_of, "shares": np.stack(rows)}


# ----------------------------------------------------------------- client
class SecAggClient:
    """The client side.  One object per party and run.

    ``faults`` (tests, and runs that simulate dropouts): a :class:`Faults` for every
    round, or a mapping round -> :class:`Faults`.
    """

    def __init__(self, config: SecAggConfig | None = None, faults: Faults | Mapping[int, Faults] | None = None,
                 noise: Callable[[np.ndarray, int, Quantizer], None] | None = None):
        self.cfg = config or SecAggConfig()
        self.faults = faults
        self.noise = noise  # DP: adds this client's noise share to its quantised vector (dp_noise.RingNoise)
        self._inbox: RoundInbox | None = None
        self._last_round: int | None = None
        self._known: tuple[bytes, list[str]] | None = None  # the client list of the last round, by digest

    def _timeout(self, party: PartyLike) -> float:
        if self.cfg.client_timeout is not None:
            return float(self.cfg.client_timeout)
        return float(party.timeout) + float(self.cfg.timeout or party.timeout)

    def _from_server(self, party: PartyLike, server: str, kind: str, r: int) -> dict:
        assert self._inbox is not None  # made by submit
        p = self._inbox.recv(party, server, kind, r, party.now() + self._timeout(party))
        if p is None:
            raise PeerTimeout(party.name, server, kind, self._timeout(party), f"no message for round {r}")
        if p.get("abort"):
            raise SecAggRoundFailed(f"round {r} aborted by the server: {p['abort']}")
        return p

    def _faults_for(self, r: int) -> Faults:
        f = self.faults
        if isinstance(f, Mapping):
            f = f.get(r)
        return f or Faults()

    def submit(self, party: PartyLike, server: str, vector, weight: float = 1.0, round: int = 0) -> SubmitResult:
        """Take part in one aggregation with ``weight * clip(vector)``.

        Raises ValueError / TypeError naming this party if the input is not a
        finite 1-D vector or the weight is outside ``(0, max_weight]``: nothing
        is sent, and the server goes on without this client.
        """
        r = int(round)
        check_round(self._last_round, r)
        x, w = check_input(vector, weight, self.cfg.max_weight, who=getattr(party, "name", ""))
        self._last_round = r
        if self._inbox is None:
            self._inbox = RoundInbox(party.log)
        faults = self._faults_for(r)
        if faults.stop_after == "start":
            return SubmitResult("stopped", r, "before advertising keys")
        st = ClientRound(self.cfg, party.name, party.run_id, party.seed, r, x, w,
                         round_context(self.cfg.tag, party.run_id, r), server=server, known=self._known)

        def send(step: str, payload: dict) -> bool:
            """Send ``step``'s message as the faults say; True when the client vanishes after it."""
            if faults.delay is not None and faults.delay[0] == step:
                party.sleep(float(faults.delay[1]))
            if faults.stale == step:
                party.send(server, _KIND_OF_STEP[step], {**payload, "r": r - 1})
            party.send(server, _KIND_OF_STEP[step], payload)
            return faults.stop_after == step

        if send("advertise", advertise_keys(st, party.sign)):
            return SubmitResult("stopped", r, "after advertising keys")

        p = self._from_server(party, server, Kind.KEYLIST, r)
        if p.get("dropped"):
            return SubmitResult("dropped", r, "excluded at the key list")
        payload = share_keys(st, p, party.roles, party.role,
                             lambda v, msg, sig: party.verify(v, KEYS_STATEMENT, msg, sig))
        self._known = st.known
        if send("share", payload):
            return SubmitResult("stopped", r, "after sharing keys")
        premask(st)  # while the server gathers everyone's shares
        if self.noise is not None:
            assert st.y is not None and st.quant is not None  # set by premask
            self.noise(st.y, st.x.size, st.quant)

        p = self._from_server(party, server, Kind.RELAY, r)
        if p.get("dropped"):
            return SubmitResult("dropped", r, "excluded after sharing keys")
        if send("masked", masked_input(st, p)):
            return SubmitResult("stopped", r, "after sending the masked input")

        p = self._from_server(party, server, Kind.UNMASK_REQUEST, r)
        if p.get("dropped"):
            return SubmitResult("dropped", r, "excluded after the masked input")
        send("unmask", unmask_shares(st, p))
        return SubmitResult("ok", r)
