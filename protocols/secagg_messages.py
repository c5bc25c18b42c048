"""Secure aggregation: message kinds, their declarations, round-tagged receiving and signed contents.

Every message carries ``r``, the round (one protocol instance); a party reads
messages of its current round through :class:`RoundInbox`, which discards
those of earlier rounds (a late client cannot corrupt a later round) and keeps
those of later ones for then.  The byte strings that are signed, hashed or
used as associated data (:func:`round_context`, :func:`keys_signed_message`,
:func:`seed_commitment`) are fixed here, so client and server derive them
alike.
"""
from __future__ import annotations

import hashlib
import msgpack
import numpy as np

from fedhet.crypto.field import F61
from fedhet.crypto.keys import SEAL_OVERHEAD
from fedhet.crypto.prg import SEED_BYTES
from fedhet.parties.contract import PartyLike
from fedhet.parties.api import QUEUE_MAX_BYTES, PeerFault, PeerTimeout
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare

__all__ = [
    "Kind", "STEPS", "SECRET_ELEMS", "KEYS_STATEMENT", "RoundInbox", "check_round", "round_context",
    "keys_signed_message", "seed_commitment", "universe_digest", "is_bytes", "declarations", "DECLARATIONS", "SCHEMAS",
    "MAX_CLIENTS", "DEFAULT_MAX_ELEMS", "SEALED_BYTES", "masked_schema", "payload_bytes",
]



class Kind:
    """Every secure-aggregation message kind (the strings are on the wire and in transcripts)."""

    KEYS = "secagg/keys"
    KEYLIST = "secagg/keylist"
    SHARES = "secagg/shares"
    RELAY = "secagg/relay"
    MASKED = "secagg/masked"
    UNMASK_REQUEST = "secagg/unmask_request"
    UNMASK = "secagg/unmask"


STEPS = ("advertise", "share", "masked", "unmask")  # a client's four messages to the server, in order
_SIG_LABEL = "fedhet/secagg/keys/v1"
# The label of a client's signed advertisement among its party's statements (fedhet.parties.identity):
# signed with the party's federation key, checked against the sign_key the federation file pins.
KEYS_STATEMENT = "secagg/keys"
# One 32-byte secret is 5 elements of GF(2**61 - 1) (7 bytes each).
SECRET_ELEMS = -(-SEED_BYTES // F61.bytes_per_element)


def round_context(tag: str, run_id: str, r: int) -> bytes:
    """Bound into every key derivation and sealed share of round ``r``."""
    return msgpack.packb(["fedhet/secagg/v1", tag, run_id, int(r)])


def keys_signed_message(tag: str, run_id: str, r: int, name: str, c_pk: bytes, s_pk: bytes,
                        commit: bytes) -> bytes:
    """What a client signs with its federation key when it advertises its round keys."""
    return msgpack.packb([_SIG_LABEL, tag, run_id, int(r), name, c_pk, s_pk, commit])


def seed_commitment(b: bytes) -> bytes:
    """The hash of the self-mask seed a client advertises (checked after reconstruction)."""
    return hashlib.sha256(b"fedhet/secagg/self-mask/v1" + b).digest()


def universe_digest(tag: str, universe: list[str]) -> bytes:
    """Names a round's client list: a client that holds the list of this digest (from an earlier
    round) is sent the digest alone, so its key list carries its k neighbours, not all n names."""
    return hashlib.sha256(msgpack.packb(["fedhet/secagg/universe/v1", tag, list(universe)])).digest()


def is_bytes(v, n: int | None = None) -> bool:
    return isinstance(v, (bytes, bytearray)) and (n is None or len(v) == n)


def check_round(last: int | None, r: int) -> None:
    """``r`` must be a non-negative int above the previous round ``last`` of the same object."""
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ValueError(f"secagg round must be a non-negative int, got {r!r}")
    if last is not None and r <= last:
        raise ValueError(f"secagg round {r} is not after the previous round {last}: every aggregation "
                         "needs a new, larger round number")


def payload_bytes(p) -> int:
    """Bytes a decoded payload holds in its arrays and byte strings (what a held message costs)."""
    if isinstance(p, np.ndarray):
        return int(p.nbytes)
    if isinstance(p, (bytes, bytearray, str)):
        return len(p)
    if isinstance(p, dict):
        return sum(payload_bytes(v) for v in p.values())
    if isinstance(p, (list, tuple)):
        return sum(payload_bytes(v) for v in p)
    return 8


class RoundInbox:
    """Reads one (sender, kind) for the current round: drops older rounds, holds ONE later round per sender.

    Per-link order means an honest sender's message of the current round comes before its later
    ones; a later-round message is read only when the sender skipped the current round (an honest
    client dropped from round r goes on to r + 1 while the reader still finishes r).  So at most one
    later round is held per sender, at most one message per kind (:meth:`held_bytes` counts them).
    A message of a second later round, or a second one of a kind for the held round, is a
    :class:`PeerFault` naming the sender, and so is a payload without a round number or one the
    party API refused (schema, flood): the sender is out of every later read too, so a hostile
    sender costs one bounded message per kind and is named, and the reader goes on without it.
    """

    def __init__(self, log):
        self._later: dict[str, tuple[int, dict[str, dict]]] = {}  # sender -> (round, kind -> payload)
        self._faulty: dict[str, PeerFault] = {}
        self.log = log

    def faulty(self, frm: str) -> PeerFault | None:
        """The fault that put ``frm`` out of the protocol (None while it is not)."""
        return self._faulty.get(frm)

    def held_bytes(self, frm: str | None = None) -> int:
        """Bytes of later-round messages held (from ``frm``, or from every sender)."""
        return sum(payload_bytes(p) for u, (_, kinds) in self._later.items() if frm in (None, u)
                   for p in kinds.values())

    def _fault(self, party: PartyLike, frm: str, kind: str, reason: str) -> PeerFault:
        e = PeerFault(party.name, frm, kind, reason)
        self._faulty[frm] = e
        self._later.pop(frm, None)
        return e

    def recv(self, party: PartyLike, frm: str, kind: str, r: int, deadline: float):
        """The round-``r`` payload of ``kind`` from ``frm``, or None once ``deadline`` (``party.now()``) passed.

        Raises :class:`PeerFault` (naming ``frm``) when ``frm`` broke the rules, now or before.
        """
        if frm in self._faulty:
            raise self._faulty[frm]
        held = self._later.get(frm)
        if held is not None and held[0] <= r:
            p = held[1].pop(kind, None)
            if held[0] < r or not held[1]:
                del self._later[frm]
            if p is not None and held[0] == r:
                return p
        while True:
            try:
                p = party.recv(frm, kind, timeout=max(0.0, deadline - party.now()))
            except PeerTimeout:
                return None
            except PeerFault as e:
                self._faulty[frm] = e
                self._later.pop(frm, None)
                raise
            pr = p.get("r") if isinstance(p, dict) else None
            if not isinstance(pr, (int, np.integer)) or isinstance(pr, bool):
                raise self._fault(party, frm, kind, "a message without a round number")
            if pr < r:
                self.log.info("secagg: discarded a late %s message of round %d from %s (now round %d)",
                              kind, pr, frm, r)
                continue
            if pr > r:
                held = self._later.get(frm)
                if held is None:
                    self._later[frm] = (int(pr), {kind: p})
                    continue
                if held[0] == pr and kind not in held[1]:
                    held[1][kind] = p
                    continue
                what = (f"a second {kind!r} message of round {pr}" if held[0] == pr
                        else f"a message of round {pr} while one of round {held[0]} is already held")
                raise self._fault(party, frm, kind, f"{what} (reading round {r}): at most one later round, "
                                  "one message per kind, is kept for a sender")
            return p


# ----------------------------------------------------------- payload schemas
MAX_CLIENTS = 10_000  # bound on every list/table of clients
_R = sch.Int()  # a stale copy (a fault injected on purpose) carries r - 1, so no lower bound here
_NAMES = sch.ListOf(sch.Str(), max_len=MAX_CLIENTS)
_KEY = sch.Bytes(length=32)
# A sealed share: 2 * SECRET_ELEMS uint64 plus the AEAD nonce and tag.
SEALED_BYTES = 2 * SECRET_ELEMS * 8 + SEAL_OVERHEAD
_SEALED = sch.Bytes(length=SEALED_BYTES)


def _notice(**fields: sch.Spec) -> sch.Spec:
    """A server message, or the ``dropped`` / ``abort`` notice sent in its place."""
    return sch.OneOf((sch.Fields({"r": _R, **fields}),
                      sch.Fields({"r": _R, "dropped": sch.Bool()}),
                      sch.Fields({"r": _R, "abort": sch.Str(max_len=4096)})))


# Without the vector length from the settings, a masked input may hold as many elements as fit the
# party API's per-sender queue bound (QUEUE_MAX_BYTES) in the widest ring.
DEFAULT_MAX_ELEMS = QUEUE_MAX_BYTES // 8


def masked_schema(max_length: int | None, length: int | None = None, ring_bits: int | None = None) -> sch.Spec:
    """``secagg/masked``: a ring vector of the input and its weight: exactly ``length + 1`` elements when
    the settings fix the length, else at most ``max_length + 1`` (from the settings; without them
    :data:`DEFAULT_MAX_ELEMS`); of the ring ``ring_bits`` (32: uint32, 64: uint64; None: either)."""
    cap = DEFAULT_MAX_ELEMS if max_length is None else int(max_length) + 1
    dtype = ("<u4", "<u8") if ring_bits is None else {32: "<u4", 64: "<u8"}[int(ring_bits)]
    return sch.Fields({"r": _R, "y": sch.Arr(dtype, (None if length is None else int(length) + 1,), max_elems=cap)})


SCHEMAS: dict[str, sch.Spec] = {
    Kind.KEYS: sch.Fields({"r": _R, "c_pk": _KEY, "s_pk": _KEY, "commit": _KEY, "sig": sch.Bytes(length=64),
                           "have": sch.Bytes(max_len=32)}),
    Kind.KEYLIST: _notice(universe=_NAMES, digest=_KEY, frac_bits=sch.Int(lo=0, hi=64), ring_bits=sch.Int(lo=1, hi=64),
                          keys=sch.MapOf(sch.ListOf(sch.Bytes(max_len=64), length=4), max_len=MAX_CLIENTS)),
    Kind.SHARES: sch.Fields({"r": _R, "ct": sch.MapOf(_SEALED, max_len=MAX_CLIENTS)}),
    Kind.RELAY: _notice(n2=sch.Int(lo=0, hi=MAX_CLIENTS), ct=sch.MapOf(_SEALED, max_len=MAX_CLIENTS)),
    Kind.MASKED: masked_schema(None),
    Kind.UNMASK_REQUEST: _notice(u3=_NAMES, n3=sch.Int(lo=0, hi=MAX_CLIENTS)),
    Kind.UNMASK: sch.Fields({"r": _R, "b_of": _NAMES, "s_of": _NAMES,
                             "shares": sch.Arr("<u8", (None, SECRET_ELEMS), max_elems=MAX_CLIENTS * SECRET_ELEMS)}),
}


def declarations(length: int | None = None, max_length: int | None = None,
                 ring_bits: int | None = None) -> list[MessageDecl]:
    """The protocol's message kinds, from the run's settings: ``length`` (when fixed) the length of every
    aggregated vector, ``max_length`` the longest one (bounds every masked input on receipt to
    ``max_length + 1`` elements), ``ring_bits`` the ring of the masked vectors (None: unknown)."""
    return [
        declare(Kind.KEYS, "client", "server",
                "two X25519 public keys, a hash of the self-mask seed, the party's Ed25519 signature with its "
                "federation key, and the digest of the client list it holds from an earlier round",
                payload=SCHEMAS[Kind.KEYS], protects="control"),
        declare(Kind.KEYLIST, "server", "client", "the signed public keys of the client's neighbours and the "
                "client list (only its digest when the client holds it), or a dropped/abort notice", payload=SCHEMAS[Kind.KEYLIST], protects="control"),
        declare(Kind.SHARES, "client", "server",
                "Shamir shares of the self-mask seed and mask key, AES-GCM sealed to each neighbour",
                payload=SCHEMAS[Kind.SHARES], protects="shares", after=Kind.KEYLIST),
        declare(Kind.RELAY, "server", "client", "sealed shares addressed to the client by its neighbours in U2, "
                "and the size of U2",
                payload=SCHEMAS[Kind.RELAY], protects="shares"),
        declare(Kind.MASKED, "client", "server", "the masked, quantised, weighted input (a uniform ring vector)",
                payload=masked_schema(max_length, length, ring_bits), protects="masked", after=Kind.RELAY),
        declare(Kind.UNMASK_REQUEST, "server", "client", "the client's share holders in U3 (the clients whose masked input "
                "arrived), and the size of U3",
                payload=SCHEMAS[Kind.UNMASK_REQUEST], protects="control"),
        declare(Kind.UNMASK, "client", "server",
                "self-mask seed shares of U3 and mask-key shares of U2 minus U3", payload=SCHEMAS[Kind.UNMASK],
                protects="shares", after=Kind.UNMASK_REQUEST),
    ]


DECLARATIONS = declarations()
