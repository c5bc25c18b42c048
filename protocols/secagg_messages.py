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
from typing import Callable

import msgpack
import numpy as np

from fedhet.crypto.field import F61
from fedhet.crypto.prg import SEED_BYTES
from fedhet.parties.api import PeerTimeout
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare, no_arrays

__all__ = [
    "KIND_IDENT", "KIND_KEYS", "KIND_KEYLIST", "KIND_SHARES", "KIND_RELAY", "KIND_MASKED",
    "KIND_UNMASK_REQUEST", "KIND_UNMASK", "STEPS", "SECRET_ELEMS", "RoundInbox", "check_round", "round_context",
    "keys_signed_message", "seed_commitment", "is_bytes", "declarations", "DECLARATIONS", "SCHEMAS",
    "MAX_CLIENTS",
]

KIND_IDENT = "secagg/ident"
KIND_KEYS = "secagg/keys"
KIND_KEYLIST = "secagg/keylist"
KIND_SHARES = "secagg/shares"
KIND_RELAY = "secagg/relay"
KIND_MASKED = "secagg/masked"
KIND_UNMASK_REQUEST = "secagg/unmask_request"
KIND_UNMASK = "secagg/unmask"

STEPS = ("advertise", "share", "masked", "unmask")  # a client's four messages to the server, in order
_SIG_LABEL = "fedhet/secagg/keys/v1"
# One 32-byte secret is 5 elements of GF(2**61 - 1) (7 bytes each).
SECRET_ELEMS = -(-SEED_BYTES // F61.bytes_per_element)


def round_context(tag: str, run_id: str, r: int) -> bytes:
    """Bound into every key derivation and sealed share of round ``r``."""
    return msgpack.packb(["fedhet/secagg/v1", tag, run_id, int(r)])


def keys_signed_message(tag: str, run_id: str, r: int, name: str, c_pk: bytes, s_pk: bytes,
                        commit: bytes) -> bytes:
    """What a client signs with its identity key when it advertises its round keys."""
    return msgpack.packb([_SIG_LABEL, tag, run_id, int(r), name, c_pk, s_pk, commit])


def seed_commitment(b: bytes) -> bytes:
    """The hash of the self-mask seed a client advertises (checked after reconstruction)."""
    return hashlib.sha256(b"fedhet/secagg/self-mask/v1" + b).digest()


def is_bytes(v, n: int | None = None) -> bool:
    return isinstance(v, (bytes, bytearray)) and (n is None or len(v) == n)


def check_round(last: int | None, r: int) -> None:
    """``r`` must be a non-negative int above the previous round ``last`` of the same object."""
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ValueError(f"secagg round must be a non-negative int, got {r!r}")
    if last is not None and r <= last:
        raise ValueError(f"secagg round {r} is not after the previous round {last}: every aggregation "
                         "needs a new, larger round number")


class RoundInbox:
    """Reads one (sender, kind) for the current round: drops older rounds, keeps later ones."""

    def __init__(self, log):
        self._later: dict[tuple[str, str], list] = {}
        self.log = log

    def recv(self, party, frm: str, kind: str, r: int, deadline: float):
        """The round-``r`` payload of ``kind`` from ``frm``, or None once ``deadline`` (``party.now()``) passed."""
        held = self._later.get((frm, kind))
        if held:
            for i, p in enumerate(held):
                if p["r"] == r:
                    return held.pop(i)
        while True:
            try:
                p = party.recv(frm, kind, timeout=max(0.0, deadline - party.now()))
            except PeerTimeout:
                return None
            if not isinstance(p, dict) or not isinstance(p.get("r"), int) or isinstance(p.get("r"), bool):
                self.log.warning("secagg: discarded a %s message from %s without a round number", kind, frm)
                continue
            if p["r"] < r:
                self.log.info("secagg: discarded a late %s message of round %d from %s (now round %d)",
                              kind, p["r"], frm, r)
                continue
            if p["r"] > r:
                self._later.setdefault((frm, kind), []).append(p)
                continue
            return p


# ----------------------------------------------------------- declarations
def _ring_vector(arrays: list, cfg: dict, length: int | None) -> str | None:
    bits = int(cfg.get("secagg_ring_bits", 32))
    want = "<u4" if bits == 32 else "<u8"
    if len(arrays) != 1:
        return f"expected one masked vector, got {len(arrays)} arrays"
    dt, shape = arrays[0]
    if dt != want or len(shape) != 1:
        return f"masked input must be a 1-D {want} ring vector (secagg_ring_bits={bits}), got {dt}{list(shape)}"
    if length is not None and shape[0] != length + 1:
        return f"masked input has {shape[0]} elements, expected {length} + 1 (the weight)"
    return None


def _share_arrays(arrays: list, cfg: dict) -> str | None:
    if len(arrays) != 1:
        return f"expected one array of shares, got {len(arrays)}"
    for dt, shape in arrays:
        if dt != "<u8" or len(shape) != 2 or shape[1] != SECRET_ELEMS:
            return f"shares must be uint64 arrays of shape (k, {SECRET_ELEMS}), got {dt}{list(shape)}"
    return None


# ----------------------------------------------------------- payload schemas
MAX_CLIENTS = 10_000  # bound on every list/table of clients
_R = sch.Int()  # a stale copy (a fault injected on purpose) carries r - 1, so no lower bound here
_NAMES = sch.ListOf(sch.Str(), max_len=MAX_CLIENTS)
_KEY = sch.Bytes(length=32)
# A sealed share: 2 * SECRET_ELEMS uint64 plus the AEAD nonce and tag.
_SEALED = sch.Bytes(max_len=1024)


def _notice(**fields: sch.Spec) -> sch.Spec:
    """A server message, or the ``dropped`` / ``abort`` notice sent in its place."""
    return sch.OneOf((sch.Fields({"r": _R, **fields}),
                      sch.Fields({"r": _R, "dropped": sch.Bool()}),
                      sch.Fields({"r": _R, "abort": sch.Str(max_len=4096)})))


SCHEMAS: dict[str, sch.Spec] = {
    KIND_KEYS: sch.Fields({"r": _R, "c_pk": _KEY, "s_pk": _KEY, "commit": _KEY, "sig": sch.Bytes(length=64)}),
    KIND_KEYLIST: _notice(universe=_NAMES, frac_bits=sch.Int(lo=0, hi=64), ring_bits=sch.Int(lo=1, hi=64),
                          keys=sch.MapOf(sch.ListOf(sch.Bytes(max_len=64), length=4), max_len=MAX_CLIENTS)),
    KIND_SHARES: sch.Fields({"r": _R, "ct": sch.MapOf(_SEALED, max_len=MAX_CLIENTS)}),
    KIND_RELAY: _notice(u2=_NAMES, ct=sch.MapOf(_SEALED, max_len=MAX_CLIENTS)),
    KIND_MASKED: sch.Fields({"r": _R, "y": sch.Arr(("<u4", "<u8"), (None,))}),
    KIND_UNMASK_REQUEST: _notice(u3=_NAMES),
    KIND_UNMASK: sch.Fields({"r": _R, "b_of": _NAMES, "s_of": _NAMES,
                             "shares": sch.Arr("<u8", (None, SECRET_ELEMS), max_elems=MAX_CLIENTS * SECRET_ELEMS)}),
}


def declarations(length: Callable[[dict], int] | None = None) -> list[MessageDecl]:
    """The protocol's message kinds; ``length(cfg)`` (optional) pins the vector length for the audit."""
    def masked(arrays, cfg):
        return _ring_vector(arrays, cfg, None if length is None else int(length(cfg)))

    return [
        declare(KIND_IDENT, "client", "client", "a client's per-run Ed25519 identity public key (32 bytes)",
                no_arrays, payload=sch.Fields({"pk": sch.Bytes(length=32)})),
        declare(KIND_KEYS, "client", "server",
                "two X25519 public keys, a hash of the self-mask seed, an Ed25519 signature", no_arrays,
                payload=SCHEMAS[KIND_KEYS]),
        declare(KIND_KEYLIST, "server", "client", "the signed public keys of the client's neighbours, or a "
                "dropped/abort notice", no_arrays, payload=SCHEMAS[KIND_KEYLIST]),
        declare(KIND_SHARES, "client", "server",
                "Shamir shares of the self-mask seed and mask key, AES-GCM sealed to each neighbour", no_arrays,
                payload=SCHEMAS[KIND_SHARES]),
        declare(KIND_RELAY, "server", "client", "sealed shares addressed to the client, and U2", no_arrays,
                payload=SCHEMAS[KIND_RELAY]),
        declare(KIND_MASKED, "client", "server", "the masked, quantised, weighted input (a uniform ring vector)",
                masked, payload=SCHEMAS[KIND_MASKED]),
        declare(KIND_UNMASK_REQUEST, "server", "client", "U3, the clients whose masked input arrived", no_arrays,
                payload=SCHEMAS[KIND_UNMASK_REQUEST]),
        declare(KIND_UNMASK, "client", "server",
                "self-mask seed shares of U3 and mask-key shares of U2 minus U3", _share_arrays,
                payload=SCHEMAS[KIND_UNMASK]),
    ]


DECLARATIONS = declarations()
