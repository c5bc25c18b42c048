"""Shamir-shared arrays between parties: data owners -> m share holders -> a coordinator.

Flow (every function below runs on one party, against the party API)::

    owner        share_to_holders(party, X, holders, t)     X -> fixed point -> t-of-m Shamir shares,
                                                             one share per holder  ({prefix}/share)
    holder       s = receive_shares(party, owners)          {owner: SharedArray}
    holder       y = sum_shares([matmul(s[o], P[o]) ...])   local linear algebra on shares, no messages
    holder       send_to_coordinator(party, coord, y)       ({prefix}/result)
    coordinator  r = reconstruct_at_coordinator(party, holders, t)   any t of the m holders suffice

The algebra on shares (:class:`SharedArray` and its operations, local
sharing and reconstruction; sharing format, range and error bounds, what a
coalition learns) is :mod:`fedhet.protocols.shared_array`; its public names are
re-exported here.  This module moves shares between parties.

Points.  Holder points are fixed by the *whole* holder list: the holders
sorted by name get x = 1..m (:func:`holder_points`).  Every owner, and the
coordinator, must therefore be given the same holder list, so that shares of
different owners held by one holder lie at the same point and can be combined.

Use in F³ (Section "F³" of ALGORITHMS.md).  Owner i shares its
representations h^i (batch, d_i) once.  The linear part of the global model
runs on shares: alignment ``matmul(h^i, P_i^T)``, stacking over owners
``stack(..., axis=1)`` -> H (batch, n, d), graph aggregation
``lmatmul(A_hat, H)`` on the owner axis, ``matmul(., W_0)``, sums over owners,
``lmatmul(ones(1, n) / n, .)``.  The nonlinear parts (ReLU, softmax) cannot
be done by linear operations on Shamir shares: they need the coordinator to
reconstruct the pre-activations (``A_hat H W_0``), which it then sees in the
clear, or a separate interactive protocol (comparison/truncation), which this
module does not provide.

Dropouts.  The coordinator waits for all holders until ``timeout``; holders
still silent then are left out, and any t of them suffice.  With more than t
shares the extra ones are checked against the polynomial through the first t
(a holder that computed something else, or sent garbage, is detected, not
corrected).  Messages carry a ``tag`` chosen by the caller, so give each
sharing and each reconstruction its own tag.  A holder refuses a share with
another tag; the coordinator discards a result with another tag (a late
answer to an earlier reconstruction, from a holder left out then), so it must
ask for results in the order the holders send them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from fedhet.crypto.field import F61, PrimeField
from fedhet.crypto.fixedpoint import DEFAULT_FRAC_BITS
from fedhet.crypto.prg import PRG
from fedhet.parties.contract import PartyLike
from fedhet.parties.api import PeerTimeout
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare

from .shared_array import (PUBLIC_FRAC_BITS, SharedArray, ShamirDisagree, ShamirError, ShamirFault, ShareRangeError, add, add_public,
                           batched_lmatmul, check_threshold, concatenate, contiguous_u64, decode_fixed, interpolate, lift, lmatmul,
                           matmul, max_signed, neg, reconstruct_shares, scale, share_array, stack, sub,
                           sum_shares)

__all__ = [
    "SharedArray", "Reconstruction", "ShareInfo", "ShamirError", "ShareRangeError", "PUBLIC_FRAC_BITS",
    "holder_points", "share_array", "reconstruct_shares",
    "share_to_holders", "receive_shares", "send_to_coordinator", "reconstruct_at_coordinator",
    "share_state", "share_from_state",
    "add", "sub", "neg", "sum_shares", "add_public", "scale", "matmul", "lmatmul", "batched_lmatmul", "stack",
    "concatenate", "lift", "declarations", "DECLARATIONS", "DEFAULT_PREFIX", "PROTOCOL_VERSION", "Kind",
]

PROTOCOL_VERSION = 1
DEFAULT_PREFIX = "shamir"


# ----------------------------------------------------------------- points
def holder_points(holders: Iterable[str]) -> dict[str, int]:
    """Holder name -> its evaluation point: the holders sorted by name get 1..m."""
    if isinstance(holders, str):
        raise TypeError("holders must be a list of party names, not a single string")
    hs = list(holders)
    if not hs:
        raise ValueError("need at least one share holder")
    if len(set(hs)) != len(hs):
        raise ValueError(f"share holders must be distinct, got {hs}")
    return {h: i + 1 for i, h in enumerate(sorted(hs))}


# ------------------------------------------------------------------ wire
class Kind:
    """The protocol's two message kinds, under a kind prefix (``"shamir/share"``, ``"shamir/result"`` by
    default): an algorithm that shares several arrays gives each sharing its own prefix."""

    SHARE = "share"
    RESULT = "result"

    @staticmethod
    def of(prefix: str = DEFAULT_PREFIX) -> tuple[str, str]:
        """(share kind, result kind) under ``prefix``."""
        if not isinstance(prefix, str) or not prefix or prefix.endswith("/") or any(c.isspace() for c in prefix):
            raise ValueError(f"kind_prefix must be a non-empty string without spaces or trailing '/', got {prefix!r}")
        return f"{prefix}/{Kind.SHARE}", f"{prefix}/{Kind.RESULT}"


def _meta(a: SharedArray, tag: str) -> dict:
    return {"v": PROTOCOL_VERSION, "tag": tag, "x": a.x, "t": a.t, "p": a.field.p, "frac_bits": a.frac_bits,
            "bound": int(a.bound), "err": float(a.err), "shares": contiguous_u64(a.values)}


def _parse(msg: dict, frm: str, kind: str, tag: str, fld: PrimeField, me: str | None = None) -> SharedArray:
    """A share message as a SharedArray (its types and ranges were checked on receipt by :func:`share_schema`).
    ``me``: the receiving party (a wrong message is the sender's fault); None: this party's own checkpoint."""
    def bad(why: str) -> ShamirError:
        return ShamirError(f"{kind} from {frm!r}: {why}") if me is None else ShamirFault(me, frm, kind, why)

    if msg["v"] != PROTOCOL_VERSION:
        raise bad(f"protocol version {msg['v']!r}, expected {PROTOCOL_VERSION}")
    if msg["tag"] != tag:
        raise bad(f"tag {msg['tag']!r}, expected {tag!r} (a message of another sharing)")
    if msg["p"] != fld.p:
        raise bad(f"field modulus {msg['p']!r}, expected {fld.p}")
    if msg["x"] >= fld.p or msg["bound"] > max_signed(fld) or msg["err"] < 0:
        raise bad(f"x, bound or err out of range ({msg['x']}, {msg['bound']}, {msg['err']})")
    try:
        sh = fld.asarray(msg["shares"], f"shares from {frm!r}")
    except ValueError as e:
        raise bad(str(e)) from None
    return SharedArray(sh, msg["x"], msg["t"], msg["frac_bits"], msg["bound"], float(msg["err"]), fld)


def share_state(a: SharedArray) -> dict:
    """A holder's share as checkpoint state (the fields of its share message: an array and numbers).
    Shares are secret: they go only into the holder's private checkpoints."""
    return _meta(a, "")


def share_from_state(state: dict, field: PrimeField = F61) -> SharedArray:
    """The share :func:`share_state` gave, checked as a received one is."""
    return _parse(state, "this party's checkpoint", "checkpoint", "", field)


@dataclass
class ShareInfo:
    """What an owner knows after sharing: the public facts every holder received."""
    shape: tuple
    t: int
    frac_bits: int
    bound: int
    err: float
    points: dict[str, int]

    @property
    def max_abs(self) -> float:
        return math.ldexp(float(self.bound), -self.frac_bits)


def _check_holders(party: PartyLike, holders: Sequence[str], what: str) -> list[str]:
    if isinstance(holders, str):
        raise TypeError(f"{what}: holders must be a list of party names, not a single string")
    hs = list(holders)
    bad = [h for h in hs if h not in party.peers]
    if bad:
        raise ValueError(f"{what}: {bad} are not peers of {party.name!r} (peers: {party.peers})")
    return hs


def share_to_holders(party: PartyLike, array, holders: Sequence[str], t: int, kind_prefix: str = DEFAULT_PREFIX, *,
                     frac_bits: int = DEFAULT_FRAC_BITS, max_abs: float | None = None, tag: str = "",
                     field: PrimeField = F61, prg: PRG | None = None) -> ShareInfo:
    """Owner side: t-of-m share ``array`` and send each holder its share (kind ``{prefix}/share``).

    ``holders`` is the full holder list (points follow its sorted order; every
    owner and the coordinator must use the same list).  ``frac_bits``,
    ``max_abs``, ``field``, ``prg``: see :func:`share_array`.  ``tag`` names
    this sharing; the holders must expect the same tag.
    """
    kind, _ = Kind.of(kind_prefix)
    points = holder_points(_check_holders(party, holders, "share_to_holders"))
    parts = share_array(array, len(points), t, frac_bits=frac_bits, max_abs=max_abs, field=field, prg=prg)
    for h, x in points.items():
        party.send(h, kind, _meta(parts[x - 1], str(tag)))
    p0 = parts[0]
    return ShareInfo(p0.shape, p0.t, p0.frac_bits, p0.bound, p0.err, points)


def receive_shares(party: PartyLike, owners: str | Sequence[str], kind_prefix: str = DEFAULT_PREFIX, *,
                   t: int | None = None, tag: str = "", field: PrimeField = F61,
                   timeout: float | None = None) -> dict[str, SharedArray]:
    """Holder side: each owner's share of its array, ``{owner: SharedArray}``.

    Checks every share message (field elements, metadata) and that all owners
    gave this holder the same point and threshold (``t``, when given, must
    match), so the shares can be combined.
    """
    kind, _ = Kind.of(kind_prefix)
    owners = [owners] if isinstance(owners, str) else list(owners)
    if not owners:
        raise ValueError("receive_shares: no owners given")
    if len(set(owners)) != len(owners):
        raise ValueError(f"receive_shares: owners must be distinct, got {owners}")
    out: dict[str, SharedArray] = {}
    for o in owners:
        out[o] = _parse(party.recv(o, kind, timeout=timeout), o, kind, str(tag), field, party.name)
    first = out[owners[0]]
    for o, a in out.items():
        if t is not None and a.t != int(t):
            raise ShamirFault(party.name, o, kind, f"threshold t={a.t}, expected {int(t)}")
        if (a.x, a.t) != (first.x, first.t):
            raise ShamirDisagree(party.name, [owners[0], o], kind, "owners disagree on this holder's point or "
                                 f"threshold: {owners[0]!r} used "
                              f"x={first.x}, t={first.t}, {o!r} used x={a.x}, t={a.t}; every owner must "
                              "share to the same holder list with the same t")
    return out


def send_to_coordinator(party: PartyLike, coordinator: str, shares: SharedArray, kind_prefix: str = DEFAULT_PREFIX, *,
                        tag: str = "") -> None:
    """Holder side: send this holder's share of a result (kind ``{prefix}/result``)."""
    _, kind = Kind.of(kind_prefix)
    if not isinstance(shares, SharedArray):
        raise TypeError(f"send_to_coordinator needs a SharedArray, got {type(shares).__name__}")
    party.send(coordinator, kind, _meta(shares, str(tag)))


@dataclass
class Reconstruction:
    """The coordinator's result: ``value`` (float64) is within ``err`` of the exact value, per element."""
    value: np.ndarray
    raw: np.ndarray          # the reconstructed field elements
    frac_bits: int
    bound: int
    err: float
    used: list[str]          # holders whose shares were used
    missing: list[str]       # holders that stayed silent until the timeout

    @property
    def max_abs(self) -> float:
        return math.ldexp(float(self.bound), -self.frac_bits)


def reconstruct_at_coordinator(party: PartyLike, holders: Sequence[str], t: int, kind_prefix: str = DEFAULT_PREFIX, *,
                               tag: str = "", field: PrimeField = F61, timeout: float | None = None,
                               quorum: int | None = None, asked: Sequence[str] | None = None) -> Reconstruction:
    """Coordinator side: collect result shares and reconstruct; any t of the holders suffice.

    ``holders`` is the full holder list the owners shared to (it fixes every holder's point).
    ``asked``: the holders this result was requested from (default: all); only they are waited for.
    Waits until ``quorum`` of them (default: all asked) answered or ``timeout`` seconds (default
    the party's) passed; raises :class:`ShamirError` if fewer than t answered.
    Every share beyond the first t is checked for consistency.
    """
    _, kind = Kind.of(kind_prefix)
    points = holder_points(_check_holders(party, holders, "reconstruct_at_coordinator"))
    t = check_threshold(t, len(points))
    if asked is not None and (isinstance(asked, str) or not set(asked) <= set(points)
                              or len(set(asked)) != len(list(asked))):
        raise ValueError(f"asked must be distinct holders among {sorted(points)}, got {asked!r}")
    pending = sorted(points if asked is None else asked)
    m = len(pending)
    quorum = m if quorum is None else int(quorum)
    if not t <= quorum <= m:
        raise ValueError(f"quorum must be in t..{m} (t = {t}, {m} holders asked), got {quorum}")
    total = party.timeout if timeout is None else float(timeout)
    deadline = party.now() + total
    got: dict[str, SharedArray] = {}

    def take(h: str, wait: float) -> None:
        try:
            msg = party.recv(h, kind, timeout=wait)
        except PeerTimeout:
            return
        if msg["tag"] != str(tag):
            # A late answer to an earlier reconstruction (its holder was left out then).
            party.log.warning("discarding %s from %s with tag %r (expected %r)", kind, h, msg["tag"], tag)
            return
        got[h] = _parse(msg, h, kind, str(tag), field, party.name)
        pending.remove(h)

    while pending and len(got) < quorum:
        for h in list(pending):
            if len(got) >= quorum:
                break
            take(h, 0.0)
        left = deadline - party.now()
        if not pending or len(got) >= quorum or left <= 0:
            break
        take(pending[0], min(0.05, left))
    if len(got) < t:
        raise ShamirError(f"coordinator {party.name!r} got result shares from {len(got)} of {m} holders "
                          f"({sorted(got)}); t={t} are needed to reconstruct; silent after {total:g}s: {pending}")
    used = sorted(got, key=points.__getitem__)
    a0 = got[used[0]]
    for h in used:
        a = got[h]
        if a.x != points[h]:
            raise ShamirError(f"holder {h!r} sent the share at x={a.x}, but its point is x={points[h]}")
        if a.t != t:
            raise ShamirError(f"holder {h!r} sent a share of a t={a.t} sharing, expected t={t}")
        if (a.frac_bits, a.bound, a.shape) != (a0.frac_bits, a0.bound, a0.shape):
            raise ShamirError(f"holders disagree on the result: {used[0]!r} has frac_bits={a0.frac_bits}, "
                              f"bound={a0.bound}, shape={a0.shape}; {h!r} has {a.frac_bits}, {a.bound}, {a.shape}")
    raw = interpolate([got[h].values for h in used], [points[h] for h in used], t, field,
                       [repr(h) for h in used])
    value = decode_fixed(raw, a0.frac_bits, field)
    return Reconstruction(value, raw, a0.frac_bits, a0.bound, max(got[h].err for h in used), used, pending)


# ----------------------------------------------------------- declarations
MAX_SHARE_NDIM = 4  # arrays of up to this many axes may be shared


def share_schema(shape: tuple | None = None) -> sch.Spec:
    """The payload of a share or result-share message (what :func:`_meta` builds); ``shares`` of
    ``shape`` (None entries: any length) or, without one, of any shape up to MAX_SHARE_NDIM axes."""
    shares: sch.Spec = (sch.OneOf(tuple(sch.Arr("<u8", (None,) * d) for d in range(MAX_SHARE_NDIM + 1)))
                        if shape is None else sch.Arr("<u8", tuple(shape)))
    return sch.Fields({"v": sch.Int(), "tag": sch.Str(max_len=1024), "x": sch.Int(lo=1), "t": sch.Int(lo=1),
                       "p": sch.Int(lo=2), "frac_bits": sch.Int(lo=0, hi=63), "bound": sch.Int(lo=0),
                       "err": sch.Float(), "shares": shares})


def declarations(kind_prefix: str = DEFAULT_PREFIX, owner: str | Sequence[str] = "owner",
                 holder: str | Sequence[str] = "holder", coordinator: str | Sequence[str] = "coordinator",
                 share_shape: tuple | None = None, result_shape: tuple | None = None) -> list[MessageDecl]:
    """The two message kinds for the given roles.

    ``share_shape`` / ``result_shape`` (from the run's settings; None entries match any length): the
    shape of the shared arrays and of the result, checked on receipt and by the audit; None: any.
    """
    k_share, k_result = Kind.of(kind_prefix)
    return [
        declare(k_share, owner, holder, "one holder's Shamir share of an owner's fixed-point array (uniform "
                "field elements, uint64) with public metadata: point, t, p, frac_bits, bound, err, tag",
                payload=share_schema(share_shape), protects="shares"),
        declare(k_result, holder, coordinator, "one holder's share of a linear function of the shared arrays "
                "(uint64 field elements) with the same public metadata", payload=share_schema(result_shape),
                # a share, but the coordinator receives t of them and opens the declared result
                protects="derived"),
    ]


DECLARATIONS = declarations()
