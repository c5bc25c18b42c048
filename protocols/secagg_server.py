"""Secure aggregation, server side: one function per round of Bonawitz et al. (Fig. 4).

:meth:`SecAggServer.aggregate` runs one protocol instance as four functions
on the round's state (:class:`ServerRound`):

=====================  ==========================================================
function               collects, then sends
=====================  ==========================================================
advertise_round        ``secagg/keys`` -> U1; each client of U1 its neighbours'
                       signed keys (``secagg/keylist``)
share_round            ``secagg/shares`` -> U2; each client of U2 the shares
                       sealed to it (``secagg/relay``)
masked_round           ``secagg/masked`` -> U3, summed as they arrive;
                       ``secagg/unmask_request`` to U3
unmask_round           ``secagg/unmask`` -> U4; reconstructs b_u (u in U3) and
                       s_v^SK (v in U2 minus U3), removes their masks, decodes
=====================  ==========================================================

Each step waits until all expected clients answered or ``timeout`` passed;
the silent and those whose message is malformed (named, with the reason, in
:attr:`SecAggResult.rejected`) are dropped from then on.  On SecAgg+ a client
whose secrets have fewer than t_local possible holders left is dropped too
(:func:`prune`).  Fewer than t clients left: the round fails
(:class:`~fedhet.protocols.secagg_config.SecAggError`), the waiting clients
get an ``abort`` notice, and nothing is released.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np

from fedhet.crypto import keys as ck
from fedhet.crypto.field import F61
from fedhet.parties.contract import PartyLike
from fedhet.parties.api import PeerFault

from .secagg_config import SecAggConfig, SecAggDisagree, SecAggError, SecAggRoundFailed, neighbours
from .secagg_masks import SharedSecret, apply_masks, recover_secrets
from .secagg_messages import (KEYS_STATEMENT, SECRET_ELEMS, Kind, RoundInbox, check_round, keys_signed_message,
                              round_context, seed_commitment, universe_digest)
from .secagg_quantizer import Quantizer

__all__ = ["SecAggServer", "SecAggResult", "ServerRound", "prune", "advertise_round", "share_round",
           "masked_round", "unmask_round", "check_shares"]


@dataclass
class SecAggResult:
    """What the server learns: the weighted sum, the weight sum, and who contributed."""

    sum: np.ndarray
    weight: float
    mean: np.ndarray
    contributors: list[str]
    dropped: list[str]
    sum_error_bound: float
    mean_error_bound: float
    round: int
    frac_bits: int
    ring_bits: int
    threshold: int
    threshold_local: int
    graph: str
    degree: int
    steps: dict = field(default_factory=dict)  # step -> clients that completed it, and seconds
    rejected: dict = field(default_factory=dict)  # client -> why its message was refused (it is in dropped)


def prune(alive: set[str], nbrs: dict[str, frozenset], t: int, tl: int) -> set[str]:
    """``alive`` without the clients whose secrets have fewer than ``tl`` possible holders (repeatedly).

    Such a client could never be unmasked (SecAgg+); on the complete graph
    this removes nobody while ``len(alive) >= t``.  Below t nothing is
    removed: the round fails anyway, and the count reported is the true one.
    """
    if len(alive) < t:
        return alive
    while True:
        weak = {u for u in alive if len((nbrs[u] & alive) | {u}) < tl}
        if not weak:
            return alive
        alive = alive - weak


@dataclass
class ServerRound:
    """The server's state through one round."""

    party: PartyLike
    cfg: SecAggConfig
    r: int
    universe: list[str]
    t: int
    tl: int
    k: int
    quant: Quantizer
    nbrs: dict[str, frozenset]
    inbox: RoundInbox
    timeout: float
    observer: Callable[[str, str, Any], None] | None = None
    steps: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.universe)

    def collect(self, kind: str, frm: Iterable[str],
                valid: Callable[[str, dict], str | None] | None = None) -> dict[str, dict]:
        """Round-r messages of ``kind`` from ``frm`` until the timeout; the silent and the malformed are left out
        (``valid(u, p)``: why ``u``'s schema-checked payload is unacceptable, None when it is)."""
        party, r, log = self.party, self.r, self.party.log
        t0 = time.monotonic()
        deadline = party.now() + self.timeout
        got = {}
        for u in frm:
            try:
                p = self.inbox.recv(party, u, kind, r, deadline)
            except PeerFault as e:  # refused on receipt, or out of the protocol since: named, dropped
                log.warning("secagg round %d: dropped %s: %s", r, u, e)
                self.rejected[u] = f"{e.kind}: {e.reason}"
                continue
            if p is None:
                log.info("secagg round %d: %s dropped (no %s within %gs)", r, u, kind, self.timeout)
                continue
            why = None if valid is None else valid(u, p)
            if why:
                log.warning("secagg round %d: dropped %s: bad %s message: %s", r, u, kind, why)
                self.rejected[u] = f"{kind}: {why}"
                continue
            if self.observer is not None:
                self.observer(kind, u, p)
            got[u] = p
        self.steps[kind] = {"clients": len(got), "seconds": time.monotonic() - t0}
        return got

    def fail(self, waiting: Iterable[str], next_kind: str, reason: str):
        """Tell everyone who may be waiting for ``next_kind`` why there is none, and raise."""
        msg = f"secure aggregation round {self.r} failed: {reason}; no sum is released"
        for u in sorted(waiting):
            self.party.send(u, next_kind, {"r": self.r, "abort": msg})
        raise SecAggRoundFailed(msg)

    def tell_dropped(self, who: Iterable[str], next_kind: str) -> None:
        for u in sorted(who):
            self.party.send(u, next_kind, {"r": self.r, "dropped": True})

    def enough(self, responded: set[str], waiting: Iterable[str], next_kind: str, did: str) -> set[str]:
        """``responded`` after :func:`prune`; fails the round (naming both counts) below t."""
        kept = prune(responded, self.nbrs, self.t, self.tl)
        if len(kept) < self.t:
            if len(kept) == len(responded):
                why = f"only {len(responded)} of {self.n} clients {did}"
            else:
                why = (f"{len(responded)} of {self.n} clients {did}, but only {len(kept)} of them keep at least "
                       f"t_local={self.tl} live share holders among their k={self.k} neighbours (SecAgg+)")
            self.fail(waiting, next_kind, f"{why}, below the threshold t={self.t}")
        return kept


# ------------------------------------------------------------ the rounds
def advertise_round(st: ServerRound) -> tuple[dict[str, dict], set[str]]:
    """Round 0: collect the signed keys (U1) and send each client of U1 its neighbours' keys."""
    def signed(u, p):  # the schema checked every key's and the signature's length
        msg = keys_signed_message(st.cfg.tag, st.party.run_id, st.r, u, p["c_pk"], p["s_pk"], p["commit"])
        if not st.party.verify(u, KEYS_STATEMENT, msg, p["sig"]):
            return "the signature on its keys does not verify under its pinned sign_key"
        return None

    adv = st.collect(Kind.KEYS, st.universe, signed)
    u1 = st.enough(set(adv), st.universe, Kind.KEYLIST, "advertised keys")
    st.tell_dropped(set(st.universe) - u1, Kind.KEYLIST)
    t0 = time.monotonic()
    entry = {u: [adv[u]["c_pk"], adv[u]["s_pk"], adv[u]["commit"], adv[u]["sig"]] for u in u1}
    digest = universe_digest(st.cfg.tag, st.universe)
    for u in sorted(u1):
        # A client that holds this round's client list (it said so by its digest) gets the digest alone.
        names = [] if bytes(adv[u]["have"]) == digest else st.universe
        st.party.send(u, Kind.KEYLIST, {"r": st.r, "universe": names, "digest": digest,
                                        "frac_bits": st.quant.frac_bits, "ring_bits": st.quant.ring_bits,
                                        "keys": {v: entry[v] for v in sorted((st.nbrs[u] & u1) | {u})}})
    st.steps["send " + Kind.KEYLIST] = {"clients": len(u1), "seconds": time.monotonic() - t0}
    return adv, u1


def share_round(st: ServerRound, u1: set[str]) -> set[str]:
    """Round 1: collect the sealed shares (U2) and relay to each client of U2 the shares addressed to it."""
    def valid_shares(u, p):
        if set(p["ct"]) != (st.nbrs[u] & u1):  # (the schema checked every sealed share's size)
            return "sealed shares must be addressed to exactly the neighbours in U1"
        return None

    sh = st.collect(Kind.SHARES, sorted(u1), valid_shares)
    u2 = st.enough(set(sh), u1, Kind.RELAY, "shared keys")
    st.tell_dropped(u1 - u2, Kind.RELAY)
    t0 = time.monotonic()
    for v in sorted(u2):
        st.party.send(v, Kind.RELAY, {"r": st.r, "n2": len(u2),
                                      "ct": {u: sh[u]["ct"][v] for u in sorted(st.nbrs[v] & u2)}})
    st.steps["send " + Kind.RELAY] = {"clients": len(u2), "seconds": time.monotonic() - t0}
    return u2


def masked_round(st: ServerRound, u2: set[str], length: int | None) -> tuple[np.ndarray, set[str]]:
    """Round 2: sum the masked inputs as they arrive (U3); ask U3 for unmasking shares."""
    acc = None
    want = None if length is None else int(length) + 1
    quant = st.quant

    def valid_masked(u, p):
        nonlocal acc, want
        y = p["y"]  # a 1-D ring vector (the schema checked)
        if y.dtype != quant.dtype:
            return f"masked input must be a 1-D {quant.dtype} array"
        if want is None:
            want = y.size
        if y.size != want:
            return f"masked input has {y.size} elements, expected {want}"
        if acc is None:
            acc = y.copy()
        else:
            np.add(acc, y, out=acc)  # the sum is all the server keeps
        return None

    u3 = set(st.collect(Kind.MASKED, sorted(u2), valid_masked))
    if len(u3) < st.t:
        st.fail(u2, Kind.UNMASK_REQUEST,
                f"only {len(u3)} of {st.n} masked inputs arrived, below the threshold t={st.t}")
    st.tell_dropped(u2 - u3, Kind.UNMASK_REQUEST)
    for u in sorted(u3):  # a client needs to know which of the clients whose shares it holds are in U3
        st.party.send(u, Kind.UNMASK_REQUEST, {"r": st.r, "u3": sorted(u3 & (st.nbrs[u] | {u})), "n3": len(u3)})
    assert acc is not None  # t >= 1 masked inputs were summed
    return acc, u3


def check_shares(st: ServerRound, items: dict) -> None:
    """Fail the round, naming the holder proven at fault where one is, if any unmasking share was wrong.

    A holder whose share is off the polynomial that gives the dealer's committed secret either
    sent a wrong share or was dealt one by that dealer.  It is named (:class:`PeerFault`) when no
    single other party explains it: a wrong share of its own secret, or of the secrets of two or
    more dealers.  Otherwise, and for secrets that could not be recovered at all, the round fails
    with the evidence and says that it cannot name a sender.  Nothing is released either way.
    """
    r = st.r
    against: dict[str, set[str]] = {}  # holder -> owners of the secrets its share is off for
    for (_, owner), it in items.items():
        for h in it.off:
            against.setdefault(h, set()).add(owner)
    lost = [it.note for it in items.values() if it.secret is None]
    if not against and not lost:
        return
    proven = sorted(h for h, owners in against.items() if h in owners or len(owners) >= 2)
    facts = [f"{h!r}'s unmasking share of the secret(s) of {sorted(o)} is off the polynomial the other holders' "
             "shares give (which matches the dealer's commitment)" for h, o in sorted(against.items())]
    unsure = [f"{h!r} sent a wrong share or {sorted(o)[0]!r} dealt it one" for h, o in sorted(against.items())
              if h not in proven]
    evidence = "; ".join(facts + lost)
    if proven:
        for h in proven:
            st.rejected[h] = f"{Kind.UNMASK}: wrong unmasking shares"
        raise PeerFault(st.party.name, proven[0], Kind.UNMASK,
                        f"secure aggregation round {r}: wrong unmasking shares from {proven} "
                        f"(proven: no single other party explains them); {evidence}; no sum is released")
    raise SecAggDisagree(st.party.name, sorted(against), Kind.UNMASK,
                         f"secure aggregation round {r} failed: inconsistent unmasking shares, sender unknown"
                         + (f" ({'; '.join(unsure)})" if unsure else "") + f": {evidence}; no sum is released")


def unmask_round(st: ServerRound, adv: dict[str, dict], u2: set[str], u3: set[str],
                 acc: np.ndarray) -> SecAggResult:
    """Round 3: collect the shares (U4), reconstruct the secrets, remove their masks from ``acc``, decode."""
    r, nbrs, tl = st.r, st.nbrs, st.tl
    idx = {u: i for i, u in enumerate(st.universe)}
    holders = {u: ((nbrs[u] & u2) | {u}) for u in u2}

    def valid_unmask(u, p):
        b_of, s_of = p["b_of"], p["s_of"]
        if set(b_of) != holders[u] & u3 or set(s_of) != holders[u] - u3:
            return "shares are not for exactly the expected clients"
        a = p["shares"]  # uint64 (k, SECRET_ELEMS) (the schema checked)
        rows = len(b_of) + len(s_of)
        if len(a) != rows:
            return f"shares must be a uint64 array of shape ({rows}, {SECRET_ELEMS})"
        try:
            F61.asarray(a, "shares")
        except ValueError as e:
            return str(e)
        return None

    un = st.collect(Kind.UNMASK, sorted(u3), valid_unmask)
    if len(un) < st.t:
        raise SecAggRoundFailed(f"secure aggregation round {r} failed: only {len(un)} of {st.n} clients sent "
                                f"unmasking shares, below the threshold t={st.t}; no sum is released")
    b_rows: dict[str, list] = {u: [] for u in u3}
    s_rows: dict[str, list] = {v: [] for v in u2 - u3}
    for h in sorted(un, key=idx.__getitem__):  # ascending x = idx + 1
        p = un[h]
        nb = len(p["b_of"])
        for v, row in zip(p["b_of"], p["shares"][:nb]):
            b_rows[v].append((h, idx[h] + 1, row))
        for v, row in zip(p["s_of"], p["shares"][nb:]):
            s_rows[v].append((h, idx[h] + 1, row))
    ctx = round_context(st.cfg.tag, st.party.run_id, r)

    def seed_of(u):
        return lambda b: seed_commitment(b) == adv[u]["commit"]

    def key_of(v):
        def verify(raw: bytes) -> bool:
            try:
                return ck.public_bytes(ck.private_key_from_bytes(raw, "x25519")) == adv[v]["s_pk"]
            except ValueError:
                return False
        return verify

    def item(what: str, rows: list, verify) -> SharedSecret:
        return SharedSecret(what, [h for h, _, _ in rows], [x for _, x, _ in rows], [a for _, _, a in rows], verify)

    b_items = {u: item(f"the self-mask seed of {u!r}", b_rows[u], seed_of(u)) for u in sorted(u3)}
    s_items = {v: item(f"the mask key of {v!r}", s_rows[v], key_of(v)) for v in sorted(u2 - u3)}
    try:
        recover_secrets(list(b_items.values()) + list(s_items.values()), tl)
    except SecAggError as e:
        raise SecAggRoundFailed(f"secure aggregation round {r} failed: {e}; no sum is released") from None
    check_shares(st, {**{("b", u): it for u, it in b_items.items()}, **{("s", v): it for v, it in s_items.items()}})
    secret = {what: it.secret for what, it in [*b_items.items(), *s_items.items()] if it.secret is not None}
    masks: list[tuple[bytes, int]] = [(secret[u], -1) for u in b_items]
    for v in s_items:
        sk: Any = ck.private_key_from_bytes(secret[v], "x25519")
        for u in sorted(nbrs[v] & u3):
            seed = ck.agree(sk, adv[u]["s_pk"], info=b"mask" + ctx)
            # u added +PRG(s_uv) when u sorts before v: take it back out.
            masks.append((seed, -1 if idx[u] < idx[v] else +1))
    t0 = time.monotonic()
    apply_masks(acc, masks)
    total, wsum = st.quant.decode(acc)
    st.steps["unmask_compute"] = {"seconds": time.monotonic() - t0}
    e_sum, e_mean = st.quant.bounds(len(u3), wsum)
    if not wsum > 0:
        raise SecAggDisagree(st.party.name, sorted(u3), Kind.MASKED, f"secure aggregation round {r}: the weights "
                             f"sum to {wsum} (some client's masked input or unmasking share is wrong; the sum "
                             "cannot tell whose)")
    return SecAggResult(
        sum=total, weight=wsum, mean=total / wsum, contributors=sorted(u3), dropped=sorted(set(st.universe) - u3),
        sum_error_bound=e_sum, mean_error_bound=e_mean, round=r, frac_bits=st.quant.frac_bits,
        ring_bits=st.quant.ring_bits, threshold=st.t, threshold_local=tl, graph=st.cfg.graph, degree=st.k,
        steps=st.steps, rejected=dict(st.rejected))


# ----------------------------------------------------------------- server
class SecAggServer:
    """The server side.  ``observer(kind, client, payload)`` sees every accepted message (its whole view)."""

    def __init__(self, config: SecAggConfig | None = None, observer: Callable[[str, str, Any], None] | None = None):
        self.cfg = config or SecAggConfig()
        self.observer = observer
        self._inbox: RoundInbox | None = None
        self._last_round: int | None = None

    def aggregate(self, party: PartyLike, clients: Iterable[str], round: int = 0,
                  length: int | None = None) -> SecAggResult:
        """Run one round with ``clients``; returns the weighted sum (``length`` checks the vector length)."""
        cfg = self.cfg
        r = int(round)
        check_round(self._last_round, r)
        self._last_round = r
        if self._inbox is None:
            self._inbox = RoundInbox(party.log)
        universe = sorted(set(clients))
        bad = [u for u in universe if u not in party.roles or u == party.name]
        if bad:
            raise ValueError(f"secagg: {bad} are not peers of {party.name!r}")
        n = len(universe)
        st = ServerRound(party=party, cfg=cfg, r=r, universe=universe, t=cfg.t(n), tl=cfg.t_local(n), k=cfg.k(n),
                         quant=cfg.quantizer(n), nbrs=neighbours(universe, cfg, party.seed, party.run_id, r),
                         inbox=self._inbox, timeout=float(cfg.timeout if cfg.timeout is not None else party.timeout),
                         observer=self.observer)
        adv, u1 = advertise_round(st)
        u2 = share_round(st, u1)
        acc, u3 = masked_round(st, u2, length)
        return unmask_round(st, adv, u2, u3, acc)
