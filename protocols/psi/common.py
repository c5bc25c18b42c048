"""What both PSI backends share: message kinds and schemas, the preamble, the agreed output.

Both backends (:mod:`.ecdh`, :mod:`.kkrt`) have the same shape: a label owner
L intersects its IDs with every feature party F_j, keeps the IDs common to
*all* of them, orders them (:func:`agreed_order`) and, in reveal mode, tells
each F_j the positions of those IDs in F_j's own secretly shuffled list
(``Kind.RESULT`` / ``Kind.KKRT_RESULT``, :func:`send_positions`,
:func:`received_rows`).  Every party ends with a :class:`PSIResult`.

Order of the common list: ``"sorted"`` (ints numerically, then bytes, then
strings by code point; reveals nothing about anyone's row order) or
``"label_owner"`` (L's row order, which then tells feature parties how L's
common rows are ordered).

Duplicates: IDs are sets; each party removes its duplicates before hashing
(:func:`dedupe`; equal IDs would otherwise give equal values on the wire and
leak multiplicities) and its row index for a common ID is the row of its
first occurrence.
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

import numpy as np
from numba import njit

from fedhet.crypto import cuckoo, okvs, ot, vole
from fedhet.crypto import ecdh_psi as grp
from fedhet.parties import schema as sch
from fedhet.parties.api import PeerFault, ProtocolMismatch
from fedhet.parties.contract import PartyLike
from fedhet.parties.declare import MessageDecl, declare

ECDH_VERSION = 1
KKRT_VERSION = 1
RR22_VERSION = 2           # 2: IDs digested by a keyed PRF under the setup's key dk (1: SHA-256)
SIGMA = 40                 # statistical security (bits) of the OT-based backends' OPRF outputs
DIGEST_BYTES = 16
MAX_CHUNK = 1 << 16        # rows per point message (ECDH) / items per OPRF message (KKRT)
DEFAULT_CHUNK = 1 << 14
MAX_ITEMS = (1 << 32) - 1  # positions travel as uint32
KKRT_MAX_ITEMS = 1 << 28   # items per party (bins must fit the 40-bit hash words; memory)
MAX_U_ROWS = 1 << 17       # KKRT: bins per U message (8 MiB)
RR22_MAX_ITEMS = 1 << 28   # items per party (the OKVS failure bound is stated up to here)
MAX_OKVS_ROWS = 1 << 18    # RR22: OKVS elements per message (4 MiB)
ORDERS = ("sorted", "label_owner")
BACKENDS = ("ecdh", "kkrt", "rr22")
AUTO = "auto"
CHOICES = (AUTO,) + BACKENDS   # what a psi_backend setting may say
AUTO_BACKENDS = ("ecdh", "rr22")
# "auto": the label owner runs RR22 from this many IDs (input rows) up to RR22_MAX_ITEMS, ECDH below (where
# RR22's fixed costs, its base OTs, the VOLE's 256+ GGM trees and numba's start in a fresh process, outweigh
# ECDH's per-ID curve work) and above (RR22's OKVS failure bound is stated only up to 2^28).  Measured by
# benchmarks/psi_speed.py (results/psi_speed.json, two party processes, RR22 with its start in a fresh
# process): RR22 was faster from 2^13 IDs per side at every size measured above it (ECDH 1.6 s, RR22 1.3 s).
AUTO_RR22_FROM = 8192


class Kind:
    """Every PSI message kind (the strings are on the wire and in transcripts)."""

    SETUP = "psi/setup"
    SIZE = "psi/size"
    BLIND_L = "psi/blind_l"
    BLIND_F = "psi/blind_f"
    DOUBLE_L = "psi/double_l"
    RESULT = "psi/result"
    KKRT_SETUP = "psi_kkrt/setup"
    KKRT_REPLY = "psi_kkrt/reply"
    KKRT_U = "psi_kkrt/u"
    KKRT_ACK = "psi_kkrt/ack"
    KKRT_OPRF = "psi_kkrt/oprf"
    KKRT_RESULT = "psi_kkrt/result"
    RR22_SETUP = "psi_rr22/setup"
    RR22_REPLY = "psi_rr22/reply"
    RR22_U = "psi_rr22/u"
    RR22_GGM = "psi_rr22/ggm"
    RR22_OKVS = "psi_rr22/okvs"
    RR22_ACK = "psi_rr22/ack"
    RR22_OPRF = "psi_rr22/oprf"
    RR22_RESULT = "psi_rr22/result"


# --------------------------------------------------------------- declarations
_CTX = sch.Bytes(max_len=1024)
_POSITIONS = sch.Fields({"idx": sch.Arr("<u4", (None,))})
_RESULT_WHAT = ("positions, in the feature party's own shuffled list, of the IDs common to all parties, "
                "in the agreed order: uint32 (k,)")


def _ecdh(lo: tuple[str, ...], fe: tuple[str, ...]) -> list[MessageDecl]:
    pts = sch.Fields({"i": sch.Int(lo=0), "pts": sch.Arr("|u1", (None, grp.POINT_BYTES),
                                                         max_elems=MAX_CHUNK * grp.POINT_BYTES)})
    return [
        declare(Kind.SETUP, lo, fe, "protocol version, label owner's set size, reveal mode, hash context; no arrays",
                payload=sch.Fields({"v": sch.Int(), "n": sch.Int(lo=0, hi=MAX_ITEMS), "reveal": sch.Bool(),
                                    "ctx": _CTX}), protects="control"),
        declare(Kind.SIZE, fe, lo, "feature party's set size; no arrays",
                payload=sch.Fields({"n": sch.Int(lo=0, hi=MAX_ITEMS)}), protects="control"),
        declare(Kind.BLIND_L, lo, fe, "label owner's IDs hashed to Curve25519 and blinded by its secret "
                "scalar, in secret random order: uint8 (n<=MAX_CHUNK, 32)", payload=pts, protects="blinded"),
        declare(Kind.BLIND_F, fe, lo, "feature party's IDs hashed to Curve25519 and blinded by its secret "
                "scalar, in secret random order: uint8 (n<=MAX_CHUNK, 32)", payload=pts, protects="blinded"),
        declare(Kind.DOUBLE_L, fe, lo, "the label owner's blinded points re-blinded by the feature party's "
                "scalar, same order: uint8 (n<=MAX_CHUNK, 32)", payload=pts, protects="blinded"),
        declare(Kind.RESULT, lo, fe, _RESULT_WHAT, payload=_POSITIONS, protects="clear"),
    ]


def _kkrt(lo: tuple[str, ...], fe: tuple[str, ...]) -> list[MessageDecl]:
    # One OPRF array shape per output length ℓ = 8..16 bytes (kkrt.output_bytes).
    oprf = sch.OneOf(tuple(sch.Arr("|u1", (None, cuckoo.N_HASHES, ell), max_elems=MAX_CHUNK * cuckoo.N_HASHES * ell)
                           for ell in range(8, 17)))
    return [
        declare(Kind.KKRT_SETUP, lo, fe, "protocol version, label owner's set size, reveal mode, hash context, "
                "cuckoo seed and number of bins, the Chou-Orlandi sender point A; no arrays",
                payload=sch.Fields({"v": sch.Int(), "n": sch.Int(lo=0, hi=KKRT_MAX_ITEMS), "reveal": sch.Bool(),
                                    "ctx": _CTX, "seed": sch.Bytes(length=cuckoo.SEED_BYTES),
                                    "bins": sch.Int(lo=cuckoo.BIN_ALIGN, hi=2 * KKRT_MAX_ITEMS),
                                    "A": sch.Bytes(length=ot.POINT_BYTES)}), protects="control"),
        declare(Kind.KKRT_REPLY, fe, lo, "feature party's set size, its Chou-Orlandi receiver points (one per base "
                "OT, hiding its secret choice bits): uint8 (512, 32), and the pseudorandom code's seed",
                payload=sch.Fields({"n": sch.Int(lo=0, hi=KKRT_MAX_ITEMS), "code": sch.Bytes(length=ot.BLOCK),
                                    "B": sch.Arr("|u1", (ot.CODE_BITS, ot.POINT_BYTES))}), protects="control"),
        declare(Kind.KKRT_U, lo, fe, "OT-extension rows u_b = t_b ^ g1_b ^ C(x_b) for a range of cuckoo bins, "
                "masked by PRG output the feature party cannot compute: uint8 (n<=MAX_U_ROWS, 64), n a multiple "
                "of 128 (checked by the receiver)",
                payload=sch.Fields({"i": sch.Int(lo=0), "u": sch.Arr("|u1", (None, ot.CODE_BYTES),
                                                                     max_elems=MAX_U_ROWS * ot.CODE_BYTES)}),
                protects="blinded"),
        declare(Kind.KKRT_ACK, fe, lo, "flow control: number of the U chunk the feature party has processed; "
                "no arrays", payload=sch.Fields({"i": sch.Int(lo=0)}), protects="control"),
        declare(Kind.KKRT_OPRF, fe, lo, "feature party's OPRF values, 3 per ID (one per cuckoo hash function), "
                "IDs in secret random order: uint8 (n<=MAX_CHUNK, 3, 8..16)",
                payload=sch.Fields({"i": sch.Int(lo=0), "v": oprf}), protects="blinded"),
        declare(Kind.KKRT_RESULT, lo, fe, _RESULT_WHAT, payload=_POSITIONS, protects="clear"),
    ]


def _rr22(lo: tuple[str, ...], fe: tuple[str, ...]) -> list[MessageDecl]:
    # The VOLE's sizes at the largest set (vole.params of okvs.columns(RR22_MAX_ITEMS)): every run is at most this.
    top = vole.params(okvs.columns(RR22_MAX_ITEMS))
    max_trees, max_depth = 2 * vole.noise_blocks(), top.depth
    max_cots = max_trees * (max_depth + ot.KAPPA)
    oprf = sch.OneOf(tuple(sch.Arr("|u1", (None, ell), max_elems=MAX_CHUNK * ell) for ell in range(8, 17)))
    return [
        declare(Kind.RR22_SETUP, lo, fe, "protocol version, reveal mode, hash context, the Chou-Orlandi sender "
                "point A (sent first: the base OTs need no IDs), the key dk of the ID digests (fresh, public to "
                "the parties: a PRF key drawn after the IDs are fixed); no arrays",
                payload=sch.Fields({"v": sch.Int(), "reveal": sch.Bool(), "ctx": _CTX,
                                    "A": sch.Bytes(length=ot.POINT_BYTES), "dk": sch.Bytes(length=16)},
                                   optional=("dk",)),   # absent in version 1: the version check names it
                protects="control"),
        declare(Kind.RR22_REPLY, fe, lo, "the feature party's 128 Chou-Orlandi receiver points (hiding its choice "
                "bits, the VOLE's secret Δ): uint8 (128, 32)",
                payload=sch.Fields({"B": sch.Arr("|u1", (ot.KAPPA, ot.POINT_BYTES))}), protects="control"),
        declare(Kind.RR22_U, lo, fe, "label owner's set size n, OKVS columns m (must equal okvs.columns(n)), the "
                "OKVS hash key, and the IKNP correlated-OT matrix: 128 columns of vole.params(m).cots bits masked by "
                "PRG output the feature party cannot compute, uint8 (128, cots/8) (exact size checked by the receiver)",
                payload=sch.Fields({"n": sch.Int(lo=0, hi=RR22_MAX_ITEMS),
                                    "cols": sch.Int(lo=okvs.BAND_WIDTH, hi=okvs.columns(RR22_MAX_ITEMS)),
                                    "key": sch.Bytes(length=16),
                                    "u": sch.Arr("|u1", (ot.KAPPA, None), max_elems=max_cots * ot.KAPPA // 8)}),
                protects="blinded"),
        declare(Kind.RR22_GGM, fe, lo, "feature party's set size; silent VOLE: per GGM tree and level the XOR of the "
                "left and of the right children, each encrypted under a correlated-OT hash: uint8 (t, d, 2, 16); per "
                "tree the Gilboa correction masked by the tree's leaves: uint8 (t, 16) (t, d = vole.params(m), "
                "checked by the receiver)",
                payload=sch.Fields({"n": sch.Int(lo=0, hi=RR22_MAX_ITEMS),
                                    "sums": sch.Arr("|u1", (None, None, 2, 16), max_elems=max_trees * max_depth * 32),
                                    "corr": sch.Arr("|u1", (None, 16), max_elems=max_trees * 16)}),
                protects="blinded"),
        declare(Kind.RR22_OKVS, lo, fe, "the OKVS hash key (the announced one, or a fresh one if encoding failed) and "
                "the label owner's OKVS P masked by its VOLE vector a (P + a, uniform to the feature party), a range "
                "of the m columns: uint8 (rows<=MAX_OKVS_ROWS, 16)",
                payload=sch.Fields({"i": sch.Int(lo=0), "key": sch.Bytes(length=16),
                                    "p": sch.Arr("|u1", (None, 16), max_elems=MAX_OKVS_ROWS * 16)}),
                protects="blinded"),
        declare(Kind.RR22_ACK, fe, lo, "flow control: number of the OKVS chunk the feature party has stored; no arrays",
                payload=sch.Fields({"i": sch.Int(lo=0)}), protects="control"),
        declare(Kind.RR22_OPRF, fe, lo, "feature party's OPRF values, one per ID, IDs in secret random order: "
                "uint8 (n<=MAX_CHUNK, 8..16)", payload=sch.Fields({"i": sch.Int(lo=0), "v": oprf}), protects="blinded"),
        declare(Kind.RR22_RESULT, lo, fe, _RESULT_WHAT, payload=_POSITIONS, protects="clear"),
    ]


def declarations(label_owner: str | Sequence[str] = "label_owner", feature: str | Sequence[str] = "feature",
                 backend: str | None = "ecdh") -> list[MessageDecl]:
    """The PSI message kinds of ``backend`` (None: all), for an algorithm whose roles have these names.

    ``"auto"``: the kinds of the backends it may choose (:data:`AUTO_BACKENDS`); the label owner's first
    message names the one in force and the other's kinds are never sent."""
    lo = (label_owner,) if isinstance(label_owner, str) else tuple(label_owner)
    fe = (feature,) if isinstance(feature, str) else tuple(feature)
    if backend is not None:
        check_backend(backend, auto=True)
    some = AUTO_BACKENDS if backend == AUTO else BACKENDS if backend is None else (backend,)
    return ((_ecdh(lo, fe) if "ecdh" in some else [])
            + (_kkrt(lo, fe) if "kkrt" in some else [])
            + (_rr22(lo, fe) if "rr22" in some else []))


# ------------------------------------------------------------------- results
@dataclass
class PSIResult:
    """What one party holds at the end.

    ``ids``: the common IDs in the agreed order (this party's own ID objects),
    or None where they were not revealed to this party.  ``rows``: for each
    of them, the row of its first occurrence in this party's input (int64).
    """
    role: str
    ids: list | None
    rows: np.ndarray | None
    revealed: bool
    stats: dict = field(default_factory=dict)

    @property
    def size(self) -> int | None:
        return None if self.ids is None else len(self.ids)


# ------------------------------------------------------------------ preamble
def check_backend(backend: str, auto: bool = False) -> str:
    """``backend`` if it names a backend (or, with ``auto``, is ``"auto"``)."""
    allowed = CHOICES if auto else BACKENDS
    if backend not in allowed:
        raise ValueError(f"PSI backend must be one of {allowed}, got {backend!r}")
    return backend


def choose_backend(n_label_owner: int) -> str:
    """``"auto"``'s choice, made by the label owner alone from its number of input IDs and sent to every
    feature party in its first message (so every party of one intersection runs the same): RR22 from
    :data:`AUTO_RR22_FROM` up to :data:`RR22_MAX_ITEMS` IDs, ECDH below and above."""
    return "rr22" if AUTO_RR22_FROM <= n_label_owner <= RR22_MAX_ITEMS else "ecdh"


def describe_backend(backend: str, key: str = "psi_backend") -> str:
    """One sentence: which PSI backend a setting ``key`` = ``backend`` runs, and why."""
    check_backend(backend, auto=True)
    if backend == AUTO:
        return (f"{key} = \"auto\": the label owner picks by its own number of IDs and names the backend in "
                f"its first message: rr22 (OKVS + silent VOLE, the fastest and fewest bytes) from {AUTO_RR22_FROM} "
                f"IDs up to 2^28, ecdh below {AUTO_RR22_FROM} (rr22's fixed costs outweigh ECDH's per-ID work "
                f"there) and above 2^28 (rr22's OKVS bound ends there); feature parties follow")
    why = {"ecdh": "X25519 blinding: the fewest assumptions (DDH), slowest at large sizes",
           "kkrt": "KKRT16 OT-extension PSI: less CPU than ECDH at large sizes, most bytes",
           "rr22": "RR22 OKVS + silent VOLE: the fastest at large sizes, fewest bytes"}[backend]
    return f"{key} = \"{backend}\" at every size: {why}; every party must set the same"


def check_chunk(chunk: int) -> int:
    chunk = int(chunk)
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk must be in 1..{MAX_CHUNK}, got {chunk}")
    return chunk


def label_owner_args(party: PartyLike, peers: Sequence[str], order: str, chunk: int,
                     context: bytes) -> tuple[list[str], int, bytes]:
    """The label owner's arguments checked: (peers, chunk, context)."""
    peers = list(peers)
    if not peers:
        raise ValueError("psi_label_owner needs at least one feature party in peers")
    if len(set(peers)) != len(peers):
        raise ValueError(f"psi_label_owner: duplicate names in peers {peers}")
    bad = [p for p in peers if p not in party.peers]
    if bad:
        raise ValueError(f"psi_label_owner: {bad} are not peers of {party.name!r} ({party.peers})")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    chunk = check_chunk(chunk)
    if not isinstance(context, (bytes, bytearray)):
        raise TypeError(f"context must be bytes, got {type(context).__name__}")
    return peers, chunk, bytes(context)


def feature_args(party: PartyLike, label_owner: str, chunk: int) -> int:
    """The feature party's arguments checked: the chunk."""
    if label_owner not in party.peers:
        raise ValueError(f"psi_feature_party: {label_owner!r} is not a peer of {party.name!r} ({party.peers})")
    return check_chunk(chunk)


def as_id_list(ids: Iterable[Any], who: str) -> list:
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{who}: ids must be a collection of IDs, not a single {type(ids).__name__}")
    return list(ids)


def dedupe(items: list, who: str, max_items: int = MAX_ITEMS) -> tuple[list[bytes], np.ndarray]:
    """(unique encodings in first-occurrence order, the row of each one's first occurrence)."""
    try:
        enc = grp.encode_items(items)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None
    if len(dict.fromkeys(enc)) == len(enc):  # no duplicates: the common case, at C speed
        uniq, rows = enc, np.arange(len(enc), dtype=np.int64)
    else:
        first: dict[bytes, int] = {}
        for i, item in enumerate(enc):
            if item not in first:
                first[item] = i
        uniq, rows = list(first), np.fromiter(first.values(), dtype=np.int64, count=len(first))
    if len(uniq) > max_items:
        raise ValueError(f"{who}: {len(uniq)} distinct IDs; at most {max_items} are supported")
    return uniq, rows


def digest_dedupe(items: list, who: str, max_items: int = MAX_ITEMS,
                  digests_of: Callable[[list[bytes]], np.ndarray] | None = None
                  ) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """:func:`dedupe` with the 128-bit digests of the unique IDs (``digests_of`` the encodings, default
    :func:`item_digests`), for the OT backends.

    The digests of all IDs are computed first; when their first 8 bytes are all distinct (one sort),
    so are the IDs and no dictionary is needed; otherwise :func:`dedupe` decides exactly.
    """
    try:
        enc = grp.encode_items(items)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None
    digests = (digests_of or item_digests)(enc)
    prefix = np.sort(np.ascontiguousarray(digests[:, :8]).view("<u8").ravel())
    if len(prefix) < 2 or (prefix[1:] != prefix[:-1]).all():
        if len(enc) > max_items:
            raise ValueError(f"{who}: {len(enc)} distinct IDs; at most {max_items} are supported")
        return enc, np.arange(len(enc), dtype=np.int64), digests
    uniq, rows = dedupe(items, who, max_items)
    return uniq, rows, digests[rows]


def secure_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation from the OS CSPRNG (argsort of random 64-bit keys).

    Ties (probability < n^2 / 2^65) only make the order of the tied pair
    deterministic.
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return np.argsort(keys).astype(np.int64)


class OTPeer:
    """The label owner's state for one feature party in an OT backend: its base-OT sender secret and
    point, the feature party's set size, our own OPRF values, chunks sent and acknowledged."""

    def __init__(self, name: str):
        self.name = name
        self.a, self.A = ot.co_sender_setup()
        self.n = 0
        self.values: np.ndarray | None = None   # our OPRF values, one row per de-duplicated ID
        self.sent = 0
        self.acked = 0


SETUP_KINDS = {Kind.SETUP: "ecdh", Kind.KKRT_SETUP: "kkrt", Kind.RR22_SETUP: "rr22"}   # each backend's first message


def first_message(party: PartyLike, lo: str, backend: str, timeout: float | None) -> tuple[str, dict]:
    """F's first message, for ``backend`` or, for ``"auto"``, whichever of :data:`AUTO_BACKENDS` the label
    owner chose: (the backend in force, the setup).  A label owner on another backend fails this at once,
    naming both (ProtocolMismatch: which side is wrong is not provable), instead of each side waiting out
    its timeout for the other."""
    kind, setup = party.recv_any(lo, SETUP_KINDS, timeout=timeout)
    got = SETUP_KINDS[kind]
    if backend == AUTO and got not in AUTO_BACKENDS:
        raise ProtocolMismatch(party.name, lo, "PSI backend", f"auto ({' or '.join(AUTO_BACKENDS)})", got,
                               "set psi_backend the same for every party")
    return (got if backend == AUTO else backend), setup


def setup_from(party: PartyLike, lo: str, backend: str, timeout: float | None,
               first: tuple[str, dict] | None = None) -> dict:
    """F's first message: the label owner's setup for ``backend`` (``first``: the backend and setup
    :func:`first_message` received already).  A label owner on another backend fails this at once,
    naming both backends (ProtocolMismatch: which side is wrong is not provable),
    instead of each side waiting out its timeout for the other."""
    if first is not None:
        got, setup = first
        if got != backend:
            raise ProtocolMismatch(party.name, lo, "PSI backend", backend, got, "set psi_backend the same for every party")
        return setup
    kind, setup = party.recv_any(lo, SETUP_KINDS, timeout=timeout)
    if SETUP_KINDS[kind] != backend:
        raise ProtocolMismatch(party.name, lo, "PSI backend", backend, SETUP_KINDS[kind],
                               "set psi_backend the same for every party")
    return setup


def expect_ack(party: PartyLike, frm: str, kind: str, want: int, timeout: float | None, proto: str) -> None:
    """Flow control: the next acknowledgement from ``frm`` must name chunk ``want``."""
    i = party.recv(frm, kind, timeout=timeout)["i"]
    if i != want:
        raise PeerFault(party.name, frm, kind, f"{proto}: acknowledges chunk {i!r}, expected {want}")


def receive_rows(party: PartyLike, frm: str, kind: str, total: int, row_shape: tuple[int, ...],
                 timeout: float | None, proto: str) -> np.ndarray:
    """``total`` rows of shape ``row_shape`` (uint8) that ``frm`` sends in numbered chunks (payload
    ``{"i": k, "v": rows}``), each checked to be the next one and to fit: (total, *row_shape)."""
    parts, got, i = [], 0, 0
    while got < total:
        msg = party.recv(frm, kind, timeout=timeout)
        v = msg["v"]
        if msg["i"] != i or tuple(v.shape[1:]) != tuple(row_shape) or not 0 < len(v) <= total - got:
            raise PeerFault(party.name, frm, kind, f"{proto}: chunk {msg['i']} is not chunk {i} of "
                            f"(rows<={total - got}, {', '.join(map(str, row_shape))}) values")
        parts.append(v)
        got += len(v)
        i += 1
    return np.concatenate(parts) if parts else np.zeros((0,) + tuple(row_shape), np.uint8)


def available_bytes() -> int | None:
    """Memory this machine can still give (Linux MemAvailable), or None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_mib() -> float | None:
    """This process's peak resident memory so far, MiB (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Linux/macOS
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if sys.platform != "darwin" else peak / (1 << 20)


def traffic(party: PartyLike, peers: Sequence[str]) -> tuple[int, int]:
    """(bytes sent to, bytes received from) ``peers`` so far."""
    return (sum(party.bytes_sent.get(p, 0) for p in peers), sum(party.bytes_received.get(p, 0) for p in peers))


def traffic_stats(party: PartyLike, peers: Sequence[str], start: tuple[int, int]) -> dict:
    sent, received = traffic(party, peers)
    return {"bytes_sent": sent - start[0], "bytes_received": received - start[1]}


def oprf_bytes(n_receiver: int, n_compared: int, sigma: int = SIGMA) -> int:
    """ℓ in bytes for OPRF values: σ + ⌈log2 n_receiver⌉ + ⌈log2 n_compared⌉ bits, rounded up, within 8..16.

    The label owner compares each of its n_receiver values with n_compared values of a feature
    party, so a false match has probability at most 2^-σ (union bound).
    """
    bits = sigma + math.ceil(math.log2(max(2, n_receiver))) + math.ceil(math.log2(max(2, n_compared)))
    return min(16, max(8, -(-bits // 8)))


def item_digests(encoded: Sequence[bytes]) -> np.ndarray:
    """128-bit digests of encoded IDs (SHA-256, truncated; they never leave the party): (n, 16) uint8.

    Collision resistance is all that is needed here: the hash context enters through the backends'
    keys, so both parties can digest their IDs before they have exchanged a message.
    """
    sha = hashlib.sha256
    flat = np.frombuffer(b"".join([sha(x).digest() for x in encoded]), dtype=np.uint8)
    return np.ascontiguousarray(flat.reshape(-1, 32)[:, :DIGEST_BYTES])


def _sorted_keys(x: np.ndarray, shift: np.uint64) -> np.ndarray:
    """Each row's first 8 bytes (little-endian, zero-padded) with the row index in the low ``shift``
    bits, sorted (one ``np.sort`` of uint64, far faster than an argsort)."""
    width = min(8, x.shape[1])
    pad = np.zeros((len(x), 8), dtype=np.uint8)
    pad[:, :width] = x[:, :width]
    k = pad.view("<u8").ravel()
    k &= ~((np.uint64(1) << shift) - np.uint64(1))
    k |= np.arange(len(x), dtype=np.uint64)
    k.sort()
    return k


@njit(cache=True)
def _merge(ka, kb, a, b, shift, where):  # pragma: no cover - compiled
    """Walk the two sorted key lists together; for rows of a and b whose keys agree above the index
    bits, confirm on all bytes and keep in where[ia] the smallest matching ib."""
    low = (np.uint64(1) << shift) - np.uint64(1)
    width = a.shape[1]
    i = 0
    j = 0
    na = ka.shape[0]
    nb = kb.shape[0]
    while i < na and j < nb:
        ta = ka[i] >> shift
        tb = kb[j] >> shift
        if ta < tb:
            i += 1
        elif tb < ta:
            j += 1
        else:
            j_end = j
            while j_end < nb and (kb[j_end] >> shift) == ta:
                j_end += 1
            while i < na and (ka[i] >> shift) == ta:
                ia = np.int64(ka[i] & low)
                for jj in range(j, j_end):
                    ib = np.int64(kb[jj] & low)
                    same = True
                    for q in range(width):
                        if a[ia, q] != b[ib, q]:
                            same = False
                            break
                    if same and (where[ia] < 0 or ib < where[ia]):
                        where[ia] = ib
                i += 1
            j = j_end


def match_values(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ia, ib) with a[ia[k]] == b[ib[k]] for every row of ``a`` found in ``b``; ia increasing, with the
    first (smallest) ib for each.

    Both sides are sorted by their first 8 bytes with the row index packed into the low bits
    (:func:`_sorted_keys`), then walked together in compiled code (:func:`_merge`): rows whose keys
    agree above the index bits are confirmed on all bytes, so equal prefixes cost time, never a
    wrong match.
    """
    a = np.ascontiguousarray(a, dtype=np.uint8)
    b = np.ascontiguousarray(b, dtype=np.uint8)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"match_values: rows of equal width wanted, got {a.shape} and {b.shape}")
    empty = np.zeros(0, dtype=np.int64)
    if len(a) == 0 or len(b) == 0:
        return empty, empty
    if len(b) >= 1 << 32 or len(a) >= 1 << 32:
        raise ValueError(f"match_values: at most 2^32 rows, got {len(a)} and {len(b)}")
    shift = np.uint64(max((len(a) - 1).bit_length(), (len(b) - 1).bit_length(), 1))
    where = np.full(len(a), -1, dtype=np.int64)
    _merge(_sorted_keys(a, shift), _sorted_keys(b, shift), a, b, shift, where)
    ia = np.nonzero(where >= 0)[0]
    return ia, where[ia]


def agreed_order(enc: Sequence[bytes], uniq: np.ndarray, order: str) -> np.ndarray:
    """The permutation that puts the common de-duplicated IDs ``uniq`` (indices into ``enc``) in the
    agreed ``order``: canonical for ``"sorted"``, first occurrence for ``"label_owner"``."""
    if order == "sorted":
        return grp.canonical_order([enc[u] for u in uniq.tolist()])
    return np.argsort(uniq)  # de-duplicated order = order of first occurrence


def send_positions(party: PartyLike, peers: Sequence[str], kind: str, where: dict[str, np.ndarray],
                   common: np.ndarray) -> None:
    """Reveal mode: tell each feature party where the common IDs sit in its shuffled list."""
    for p in peers:
        party.send(p, kind, {"idx": where[p][common].astype(np.uint32)})


def received_rows(me: str, msg: dict, lo: str, kind: str, perm: np.ndarray, first_rows: np.ndarray) -> np.ndarray:
    """Feature party ``me``'s rows of the common IDs, from the label owner's positions (its ``kind`` message)."""
    idx = msg["idx"].astype(np.int64)
    if len(idx) and (idx.max() >= len(perm) or len(np.unique(idx)) != len(idx)):
        raise PeerFault(me, lo, kind, f"PSI: names positions outside our {len(perm)} IDs or twice")
    return first_rows[perm[idx]]


def common_to_all(party: PartyLike, peers: Sequence[str], kind: str, where: dict[str, np.ndarray], enc: Sequence[bytes],
                  order: str, reveal: bool) -> np.ndarray:
    """The label owner's end of an OT backend: from ``where`` (per feature party, each of our
    de-duplicated IDs' position in its list, -1 if absent), the IDs common to all in the agreed
    order, their positions sent to every feature party in reveal mode (``kind``); returns them
    (indices into our de-duplicated IDs)."""
    in_all = np.ones(len(enc), dtype=bool)
    for w in where.values():
        in_all &= w >= 0
    uniq = np.nonzero(in_all)[0]  # de-duplicated IDs common to all, in first-occurrence order
    uniq = uniq[agreed_order(enc, uniq, order)]
    if reveal:
        send_positions(party, peers, kind, where, uniq)
    return uniq


def feature_inputs(party: PartyLike, ids: Iterable[Any], lo: str, max_items: int,
                   digests_of: Callable[[list[bytes]], np.ndarray] | None = None
                   ) -> tuple[list, tuple[int, int], list[bytes], np.ndarray, np.ndarray, np.ndarray]:
    """A feature party's start in an OT backend: (items, traffic so far, unique encodings, their first
    rows, their digests (``digests_of``, default :func:`item_digests`) in a fresh secret order, that order)."""
    who = f"feature party {party.name!r}"
    items = as_id_list(ids, who)
    start = traffic(party, [lo])
    enc, first_rows, digests = digest_dedupe(items, who, max_items, digests_of)
    perm = secure_permutation(len(enc))
    return items, start, enc, first_rows, digests[perm], perm


def label_owner_result(items: list, rows: np.ndarray, stats: dict) -> PSIResult:
    return PSIResult("label_owner", [items[r] for r in rows.tolist()], rows, True, stats)


def feature_result(items: list, rows: np.ndarray | None, stats: dict) -> PSIResult:
    return PSIResult("feature", None if rows is None else [items[r] for r in rows.tolist()], rows,
                     rows is not None, stats)
