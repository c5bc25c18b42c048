"""KKRT16 private set intersection (batched OPRF from OT extension), label owner and feature parties.

The second backend of :mod:`fedhet.protocols.psi` (``backend="kkrt"``): same
API, same result (:class:`~fedhet.protocols.psi.PSIResult`), same multi-party
vertical form, different cryptography.  Kolesnikov, Kumaresan, Rosulek, Trieu,
"Efficient Batched Oblivious PRF with Applications to Private Set
Intersection", CCS 2016 (ePrint 2016/799); the section numbers below are
those of the ePrint version as we read it; check them against the paper.

Two-party core, label owner L (PSI receiver, items X) and feature party F
(PSI sender, items Y); every ID is first reduced to a 128-bit digest
(SHA-256, truncated; the caller's hash context is bound into the code keys)::

    L        cuckoo-hash X into m = 1.27|X| bins, 3 hash functions, fresh seed (rehash on failure)
    L -> F   psi_kkrt/setup   |X|, reveal mode, hash context, cuckoo seed and m, Chou–Orlandi point A
    F -> L   psi_kkrt/reply   |Y|, 512 Chou–Orlandi points B_j (choice bits s), PRC seed
    L -> F   psi_kkrt/u       the OT-extension matrix U in row chunks of bins (u_b = t_b ^ g1_b ^ C(x_b))
    F -> L   psi_kkrt/ack     flow control: chunk i of U processed (bounds what is in flight)
    F -> L   psi_kkrt/oprf    for y in Y in a fresh secret random order, the OPRF values
                              H(q_h(y) ^ (C_j(y) & s)) at its 3 bins, j = 0, 1, 2, truncated to ℓ bytes
    L        compares its own H(t_b) with them: x in X∩Y and its position in F's list
    L -> F   psi_kkrt/result  (reveal mode) positions in F's shuffled list of the common IDs, agreed order

OPRF (KKRT16 §3, Fig. 2; the pseudorandom-code variant, §3.2): OT extension
in which L's choice "bits" are whole codewords C(x_b), one OT per bin; after
it F holds for every bin b a key (q_b, s) and L holds t_b with
``t_b = q_b ^ (C(x_b) & s)``, so ``F_b(x) = H(q_b ^ (C(x) & s))`` equals L's
``H(t_b)`` exactly when x = x_b.  Primitives and their parameters are in
:mod:`fedhet.crypto.ot` (base OTs, code, hash, bit transposition) and
:mod:`fedhet.crypto.cuckoo` (hashing, failure bound).

PSI from the OPRF (KKRT16 §5, after Pinkas–Schneider–Segev–Zohner 2015): L
places every x in one bin by cuckoo hashing (an x placed by hash function j
uses code C_j, so "x || j" is the OPRF input); F, which cannot know where L
put its y, evaluates each y at all three bins ("simple hashing") and sends the
3|Y| values.  No stash: cuckoo failure is detected and L rehashes with a fresh
seed before anything is sent (see :mod:`fedhet.crypto.cuckoo` for the bound).

Parameters: κ = 128, code width k = 512 (= number of base OTs), statistical
security σ = 40.  Output length ℓ = σ + ⌈log2 |X|⌉ + ⌈log2 3|Y|⌉ bits, rounded
up to bytes (8 ≤ ℓ ≤ 16): L compares each of its |X| values with 3|Y| values
of F, so a false match has probability at most 2^-σ (the same union bound as
KKRT16 §5).  For 2^20 x 2^20: m = 1,331,712 bins, U is 85 MB, the OPRF values
3 x 2^20 x 11 bytes = 35 MB.

Threat model and leakage: semi-honest (honest-but-curious) parties, as for
the ECDH backend; what each party learns is the same as there.  L learns |Y|
and X∩Y_j (per feature party j); F learns |X|, the cuckoo table size m (a
function of |X|) and, in reveal mode, the final common list.  U is masked by
the PRG output of seeds F does not hold (OT-extension receiver privacy), so F
learns nothing of X beyond its size; the OPRF values of F's items not in X are
pseudorandom to L (BaRK-OPRF security, KKRT16 §3.3, under the correlation
robustness of H and CDH for the base OTs), so L learns nothing of Y \\ X but its
size, and F's values come in a fresh random order from the OS CSPRNG.  The
cuckoo seed L sends is independent of X except for conditioning on a table
being found (failure probability of one seed, at most about 2^-40 at large
sizes).  Not covered: malicious parties (a malicious L could, e.g., send U
rows that are not codewords and learn more than X∩Y; KKRT16 is semi-honest),
timing side channels of the numpy code.  Nothing on the wire is a raw ID or an
unkeyed hash of one: L sends codewords only XOR-masked (U), F only values of a
keyed PRF.

Streaming: U goes in chunks of whole 128-bin blocks (at most ``MAX_U_ROWS``
bins = 8 MiB per message), generated bin range by bin range on L and consumed
the same way on F, with at most ``U_WINDOW_BYTES`` unacknowledged (so a peer
never queues more than that of one kind, far below the party receive
budget); OPRF values go in chunks of at most ``MAX_OPRF_ROWS`` items.  Work is
vectorised numpy and batched AES in one process per party (no worker pool).
"""
from __future__ import annotations

import hashlib
import math
import os
import time
from typing import Any, Iterable, Sequence

import numpy as np

from fedhet.crypto import cuckoo, ot
from fedhet.crypto import ecdh_psi as grp
from fedhet.parties import schema as sch
from fedhet.parties.api import PartyError
from fedhet.parties.declare import MessageDecl, declare, no_arrays
from fedhet.protocols import psi

PROTOCOL_VERSION = 1
SIGMA = 40                  # statistical security (bits)
MAX_U_ROWS = 1 << 17        # bins per U message (8 MiB); the audit checks this bound
MAX_OPRF_ROWS = psi.MAX_CHUNK  # items per OPRF message
U_WINDOW_BYTES = 64 << 20   # unacknowledged U bytes in flight per feature party
MAX_ITEMS = 1 << 28         # items per party (bins must fit the 40-bit hash words; memory)
DIGEST_BYTES = 16
_CTX_PERSON = b"fedhet-kkrt-ctx"

K_SETUP, K_REPLY, K_U, K_ACK = "psi_kkrt/setup", "psi_kkrt/reply", "psi_kkrt/u", "psi_kkrt/ack"
K_OPRF, K_RESULT = "psi_kkrt/oprf", "psi_kkrt/result"


# --------------------------------------------------------------- declarations
def _one_array(arrays: list, what: str) -> tuple[str, tuple] | str:
    if len(arrays) != 1:
        return f"expected exactly one array of {what}, got {len(arrays)}"
    dt, shape = arrays[0]
    return dt, tuple(shape)


def _points_check(arrays: list, cfg: dict) -> str | None:
    got = _one_array(arrays, "base-OT points")
    if isinstance(got, str):
        return got
    dt, shape = got
    if dt != "|u1" or shape != (ot.CODE_BITS, ot.POINT_BYTES):
        return f"base-OT points must be uint8 of shape ({ot.CODE_BITS}, {ot.POINT_BYTES}), got {dt}{list(shape)}"
    return None


def _u_check(arrays: list, cfg: dict) -> str | None:
    got = _one_array(arrays, "OT-extension rows")
    if isinstance(got, str):
        return got
    dt, shape = got
    if dt != "|u1" or len(shape) != 2 or shape[1] != ot.CODE_BYTES:
        return f"OT-extension rows must be uint8 of shape (n, {ot.CODE_BYTES}), got {dt}{list(shape)}"
    if not 0 < shape[0] <= MAX_U_ROWS or shape[0] % cuckoo.BIN_ALIGN:
        return f"a chunk of U must hold a multiple of {cuckoo.BIN_ALIGN} rows, at most {MAX_U_ROWS}; got {shape[0]}"
    return None


def _oprf_check(arrays: list, cfg: dict) -> str | None:
    got = _one_array(arrays, "OPRF values")
    if isinstance(got, str):
        return got
    dt, shape = got
    if dt != "|u1" or len(shape) != 3 or shape[1] != cuckoo.N_HASHES or not 8 <= shape[2] <= 16:
        return f"OPRF values must be uint8 of shape (n, {cuckoo.N_HASHES}, 8..16), got {dt}{list(shape)}"
    if not 0 < shape[0] <= MAX_OPRF_ROWS:
        return f"a chunk of OPRF values must hold 1..{MAX_OPRF_ROWS} items, got {shape[0]}"
    return None


def _positions_check(arrays: list, cfg: dict) -> str | None:
    got = _one_array(arrays, "positions")
    if isinstance(got, str):
        return got
    dt, shape = got
    if dt != "<u4" or len(shape) != 1:
        return f"positions must be a 1-D uint32 array, got {dt}{list(shape)}"
    return None


def declarations(label_owner: str | Sequence[str] = "label_owner",
                 feature: str | Sequence[str] = "feature") -> list[MessageDecl]:
    """The KKRT-PSI message kinds, for an algorithm whose roles have these names."""
    lo = (label_owner,) if isinstance(label_owner, str) else tuple(label_owner)
    fe = (feature,) if isinstance(feature, str) else tuple(feature)
    return [
        declare(K_SETUP, lo, fe, "protocol version, label owner's set size, reveal mode, hash context, cuckoo "
                "seed and number of bins, the Chou-Orlandi sender point A; no arrays", no_arrays,
                payload=sch.Fields({"v": sch.Int(), "n": sch.Int(lo=0, hi=MAX_ITEMS), "reveal": sch.Bool(),
                                    "ctx": sch.Bytes(max_len=1024), "seed": sch.Bytes(length=cuckoo.SEED_BYTES),
                                    "bins": sch.Int(lo=cuckoo.BIN_ALIGN, hi=2 * MAX_ITEMS),
                                    "A": sch.Bytes(length=ot.POINT_BYTES)})),
        declare(K_REPLY, fe, lo, "feature party's set size, its Chou-Orlandi receiver points (one per base OT, "
                "hiding its secret choice bits): uint8 (512, 32), and the pseudorandom code's seed",
                _points_check, payload=sch.Fields({
                    "n": sch.Int(lo=0, hi=MAX_ITEMS), "code": sch.Bytes(length=ot.BLOCK),
                    "B": sch.Arr("|u1", (ot.CODE_BITS, ot.POINT_BYTES))})),
        declare(K_U, lo, fe, "OT-extension rows u_b = t_b ^ g1_b ^ C(x_b) for a range of cuckoo bins, masked by "
                "PRG output the feature party cannot compute: uint8 (n<=MAX_U_ROWS, 64)", _u_check,
                payload=sch.Fields({"i": sch.Int(lo=0),
                                    "u": sch.Arr("|u1", (None, ot.CODE_BYTES), max_elems=MAX_U_ROWS * ot.CODE_BYTES)})),
        declare(K_ACK, fe, lo, "flow control: number of the U chunk the feature party has processed; no arrays",
                no_arrays, payload=sch.Fields({"i": sch.Int(lo=0)})),
        declare(K_OPRF, fe, lo, "feature party's OPRF values, 3 per ID (one per cuckoo hash function), IDs in "
                "secret random order: uint8 (n<=MAX_OPRF_ROWS, 3, 8..16)", _oprf_check,
                payload=sch.Fields({"i": sch.Int(lo=0),
                                    "v": sch.Arr("|u1", (None, cuckoo.N_HASHES, None),
                                                 max_elems=MAX_OPRF_ROWS * cuckoo.N_HASHES * 16)})),
        declare(K_RESULT, lo, fe, "positions, in the feature party's own shuffled list, of the IDs common "
                "to all parties, in the agreed order: uint32 (k,)", _positions_check,
                payload=sch.Fields({"idx": sch.Arr("<u4", (None,))})),
    ]


DECLARATIONS = declarations()


# -------------------------------------------------------------------- helpers
def output_bytes(n_receiver: int, n_sender: int, sigma: int = SIGMA) -> int:
    """ℓ in bytes: σ + ⌈log2 n_receiver⌉ + ⌈log2 3 n_sender⌉ bits, rounded up, within 8..16."""
    bits = sigma + math.ceil(math.log2(max(2, n_receiver))) + math.ceil(math.log2(max(2, cuckoo.N_HASHES * n_sender)))
    return min(16, max(8, -(-bits // 8)))


def item_digests(encoded: Sequence[bytes]) -> np.ndarray:
    """128-bit digests of encoded IDs (SHA-256, truncated; they never leave the party): (n, 16) uint8.

    Collision resistance is all that is needed here: the hash context enters
    through the code keys (:func:`code_for`), so both parties can digest their
    IDs before they have exchanged a message.
    """
    sha = hashlib.sha256
    flat = np.frombuffer(b"".join([sha(x).digest() for x in encoded]), dtype=np.uint8)
    return np.ascontiguousarray(flat.reshape(-1, 32)[:, :DIGEST_BYTES])


def code_for(code_seed: bytes, context: bytes) -> ot.PseudorandomCode:
    """The pseudorandom code of one run: keys from the feature party's seed, bound to the hash context."""
    ctx = hashlib.blake2b(bytes(context), digest_size=16, person=_CTX_PERSON).digest()
    return ot.PseudorandomCode(hashlib.blake2b(bytes(code_seed), digest_size=16, key=ctx).digest())


def match_values(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ia, ib) with a[ia[k]] == b[ib[k]] for every row of ``a`` found in ``b``; ia increasing, with the
    first (smallest) ib for each.

    Both sides are sorted by their first 8 bytes with the row index packed into
    the low bits of the key (a plain ``np.sort``, several times faster than an
    argsort), every key of ``b`` is looked up in ``a`` on the remaining top
    bits (all equal keys, so nothing is missed when top bits collide), and each
    candidate pair is confirmed on all bytes.
    """
    a = np.ascontiguousarray(a, dtype=np.uint8)
    b = np.ascontiguousarray(b, dtype=np.uint8)
    empty = np.zeros(0, dtype=np.int64)
    if len(a) == 0 or len(b) == 0:
        return empty, empty
    if len(b) >= 1 << 32:
        raise ValueError(f"match_values: at most 2^32 rows in b, got {len(b)}")
    shift = np.uint64(max((len(a) - 1).bit_length(), (len(b) - 1).bit_length(), 1))
    low = (np.uint64(1) << shift) - np.uint64(1)

    def sorted_keys(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = np.ascontiguousarray(x[:, :8]).view("<u8").ravel() & ~low
        k |= np.arange(len(x), dtype=np.uint64)
        k.sort()
        return k >> shift, (k & low).astype(np.int64)

    top_a, order_a = sorted_keys(a)
    top_b, order_b = sorted_keys(b)
    lo = np.searchsorted(top_a, top_b, "left")
    cnt = np.searchsorted(top_a, top_b, "right") - lo
    q = np.nonzero(cnt)[0]
    c = cnt[q]
    if len(c) and c.max() > 1:  # equal top bits in a: try every one of them
        total = int(c.sum())
        first = np.repeat(lo[q] - (np.cumsum(c) - c), c)
        cand_a = order_a[first + np.arange(total)]
        cand_b = np.repeat(order_b[q], c)
    else:
        cand_a, cand_b = order_a[lo[q]], order_b[q]
    full = (a[cand_a] == b[cand_b]).all(axis=1)
    pairs = (cand_a[full].astype(np.uint64) << np.uint64(32)) | cand_b[full].astype(np.uint64)
    pairs.sort()
    ia = (pairs >> np.uint64(32)).astype(np.int64)
    keep = np.ones(len(ia), dtype=bool)
    keep[1:] = ia[1:] != ia[:-1]
    return ia[keep], (pairs[keep] & np.uint64(0xFFFFFFFF)).astype(np.int64)


def _u_rows(chunk: int) -> int:
    return min(MAX_U_ROWS, max(cuckoo.BIN_ALIGN, -(-4 * int(chunk) // cuckoo.BIN_ALIGN) * cuckoo.BIN_ALIGN))


def _count(msg: Any, frm: str, kind: str) -> int:
    n = msg.get("n") if isinstance(msg, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_ITEMS:
        raise PartyError(f"PSI-KKRT: {kind} from {frm!r} carries no valid set size (got {n!r})")
    return n


def _sent_to(party, peers: Sequence[str]) -> int:
    return sum(party.bytes_sent.get(p, 0) for p in peers)


def _received_from(party, peers: Sequence[str]) -> int:
    return sum(party.bytes_received.get(p, 0) for p in peers)


def _check_ack(msg: Any, frm: str, want: int) -> None:
    if not isinstance(msg, dict) or msg.get("i") != want:
        raise PartyError(f"PSI-KKRT: {K_ACK} from {frm!r} acknowledges chunk {msg!r}, expected {want}")


def bin_codes(code: ot.PseudorandomCode, digests: np.ndarray, table: np.ndarray, which: np.ndarray) -> np.ndarray:
    """The codeword of the item in each bin (C_j of its digest, j the hash that placed it); zero rows for empty bins."""
    out = np.zeros((len(table), ot.CODE_BYTES), dtype=np.uint8)
    for j in range(cuckoo.N_HASHES):
        sel = np.nonzero(which == j)[0]
        if len(sel):
            out[sel] = code.encode(digests[table[sel]], j)
    return out


def sender_values(q: np.ndarray, masked: Sequence[np.ndarray], bins: np.ndarray, out_bytes: int) -> np.ndarray:
    """F's OPRF values H(q_{h_j(y)} ^ (C_j(y) & s)) of items with bins (n, 3) and masked codewords
    ``masked[j]`` (n, 64), from the OT-extension rows q: (n, 3, ℓ) uint8."""
    out = np.empty((len(bins), cuckoo.N_HASHES, out_bytes), dtype=np.uint8)
    for j in range(cuckoo.N_HASHES):
        rows = q[bins[:, j]]
        rows ^= masked[j]
        out[:, j] = ot.cr_hash(rows, out_bytes)
    return out


# ---------------------------------------------------------------- label owner
class _PeerRun:
    """L's state for one feature party."""

    def __init__(self, name: str):
        self.name = name
        self.a, self.A = ot.co_sender_setup()
        self.n = 0
        self.values: np.ndarray | None = None  # L's own OPRF values, one row per de-duplicated ID
        self.acked = 0
        self.sent = 0


def kkrt_label_owner(party, ids: Iterable[Any], peers: Sequence[str], reveal_to_all: bool = True, *,
                     order: str = "sorted", chunk: int = psi.DEFAULT_CHUNK, context: bytes = b"",
                     timeout: float | None = None) -> psi.PSIResult:
    """The label owner's side of KKRT-PSI with every feature party in ``peers`` (see :func:`psi.psi_label_owner`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    peers = list(peers)
    if not peers:
        raise ValueError("psi_label_owner needs at least one feature party in peers")
    if len(set(peers)) != len(peers) or any(p not in party.peers for p in peers):
        raise ValueError(f"psi_label_owner: peers {peers} must be distinct peers of {party.name!r} ({party.peers})")
    if order not in psi.ORDERS:
        raise ValueError(f"order must be one of {psi.ORDERS}, got {order!r}")
    chunk = psi.check_chunk(chunk)
    context = bytes(context)
    who = f"label owner {party.name!r}"
    items = psi.as_id_list(ids, who)
    sent0, recv0 = _sent_to(party, peers), _received_from(party, peers)
    enc, first_rows = psi.dedupe(items, who)
    n = len(enc)
    if n > MAX_ITEMS:
        raise ValueError(f"{who}: {n} distinct IDs; the KKRT backend supports at most {MAX_ITEMS}")
    digests = item_digests(enc)
    seed, m, table, which, attempts = cuckoo.build_table(digests)
    t_hash = time.perf_counter()
    runs = {p: _PeerRun(p) for p in peers}
    for p, r in runs.items():
        party.send(p, K_SETUP, {"v": PROTOCOL_VERSION, "n": n, "reveal": bool(reveal_to_all), "ctx": context,
                                "seed": seed, "bins": m, "A": r.A})
    occupied = np.nonzero(table >= 0)[0]
    u_rows = _u_rows(chunk)
    window = max(2, U_WINDOW_BYTES // (u_rows * ot.CODE_BYTES))
    n_chunks = -(-m // u_rows)
    prog_total = max(1, n_chunks * len(peers))
    done = 0
    for p, r in runs.items():
        reply = party.recv(p, K_REPLY, timeout=timeout)
        r.n = _count(reply, p, K_REPLY)
        try:
            k0, k1 = ot.co_sender_keys(r.a, r.A, reply["B"])
        except ot.OTError as e:
            raise PartyError(f"PSI-KKRT: {K_REPLY} from {p!r}: {e}") from None
        receiver = ot.KkrtReceiver(k0, k1)
        code = code_for(reply["code"], context)
        ell = output_bytes(n, r.n)
        r.values = np.zeros((n, ell), dtype=np.uint8)
        for i, s in enumerate(range(0, m, u_rows)):
            e = min(m, s + u_rows)
            u, t = receiver.chunk(bin_codes(code, digests, table[s:e], which[s:e]), s)
            occ = occupied[np.searchsorted(occupied, s):np.searchsorted(occupied, e)]
            if len(occ):
                r.values[table[occ]] = ot.cr_hash(t[occ - s], ell)
            while r.sent - r.acked >= window:
                _check_ack(party.recv(p, K_ACK, timeout=timeout), p, r.acked)
                r.acked += 1
            party.send(p, K_U, {"i": i, "u": u})
            r.sent += 1
            done += 1
            party.progress(done, prog_total, psi_bins=done * u_rows)
    t_u = time.perf_counter()
    # Which of our IDs each feature party has, and where in its shuffled list.
    in_all = np.ones(n, dtype=bool)
    where: dict[str, np.ndarray] = {}
    pair_sizes: dict[str, int] = {}
    for p, r in runs.items():
        while r.acked < r.sent:
            _check_ack(party.recv(p, K_ACK, timeout=timeout), p, r.acked)
            r.acked += 1
        ell = r.values.shape[1]
        parts, got, i = [], 0, 0
        while got < r.n:
            msg = party.recv(p, K_OPRF, timeout=timeout)
            v = msg.get("v") if isinstance(msg, dict) else None
            if msg.get("i") != i or not isinstance(v, np.ndarray) or v.ndim != 3 or v.shape[1:] != (cuckoo.N_HASHES, ell) \
                    or not 0 < len(v) <= r.n - got:
                raise PartyError(f"PSI-KKRT: {K_OPRF} chunk {msg.get('i')} from {p!r} is not chunk {i} of "
                                 f"(rows<={r.n - got}, {cuckoo.N_HASHES}, {ell}) values")
            parts.append(v)
            got += len(v)
            i += 1
        theirs = np.concatenate(parts).reshape(-1, ell) if parts else np.zeros((0, ell), np.uint8)
        ia, ib = match_values(r.values, theirs)
        w = np.full(n, -1, dtype=np.int64)
        w[ia] = ib // cuckoo.N_HASHES
        where[p] = w
        pair_sizes[p] = int(len(ia))
        in_all &= w >= 0
        r.values = None
    t_match = time.perf_counter()
    uniq = np.nonzero(in_all)[0]  # de-duplicated IDs common to all, in first-occurrence order
    if order == "sorted":
        uniq = uniq[np.array(grp.canonical_order([enc[u] for u in uniq.tolist()]), dtype=np.int64)]
    if reveal_to_all:
        for p in peers:
            party.send(p, K_RESULT, {"idx": where[p][uniq].astype(np.uint32)})
    rows = first_rows[uniq]
    t_end = time.perf_counter()
    stats = {
        "backend": "kkrt", "n_input": len(items), "n_unique": n, "peer_sizes": {p: r.n for p, r in runs.items()},
        "pair_sizes": pair_sizes, "size": int(len(rows)), "workers": 0, "chunk": chunk, "bins": m,
        "cuckoo_attempts": attempts, "code_bits": ot.CODE_BITS, "u_rows_per_message": u_rows,
        "out_bytes": {p: output_bytes(n, r.n) for p, r in runs.items()},
        "seconds": t_end - t0, "cpu_seconds": time.process_time() - c0, "seconds_hash": t_hash - t0, "seconds_ot": t_u - t_hash,
        "seconds_match": t_match - t_u, "bytes_sent": _sent_to(party, peers) - sent0,
        "bytes_received": _received_from(party, peers) - recv0,
    }
    return psi.PSIResult("label_owner", [items[r] for r in rows.tolist()], rows, True, stats)


# -------------------------------------------------------------- feature party
def kkrt_feature_party(party, ids: Iterable[Any], label_owner: str, *, chunk: int = psi.DEFAULT_CHUNK,
                       timeout: float | None = None) -> psi.PSIResult:
    """This feature party's side of :func:`kkrt_label_owner` (see :func:`psi.psi_feature_party`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    if label_owner not in party.peers:
        raise ValueError(f"psi_feature_party: {label_owner!r} is not a peer of {party.name!r} ({party.peers})")
    chunk = psi.check_chunk(chunk)
    lo = label_owner
    who = f"feature party {party.name!r}"
    items = psi.as_id_list(ids, who)
    sent0, recv0 = _sent_to(party, [lo]), _received_from(party, [lo])
    enc, first_rows = psi.dedupe(items, who)
    mine = len(enc)
    if mine > MAX_ITEMS:
        raise ValueError(f"{who}: {mine} distinct IDs; the KKRT backend supports at most {MAX_ITEMS}")
    digests = item_digests(enc)
    perm = psi.secure_permutation(mine)
    digests = digests[perm]  # from here on our IDs are in the secret random order we send them in
    setup = party.recv(lo, K_SETUP, timeout=timeout)
    version = setup.get("v") if isinstance(setup, dict) else None
    if version != PROTOCOL_VERSION:
        raise PartyError(f"PSI-KKRT: {lo!r} speaks version {version!r}, we speak {PROTOCOL_VERSION}")
    n = _count(setup, lo, K_SETUP)
    reveal = bool(setup["reveal"])
    m = int(setup["bins"])
    if m != cuckoo.num_bins(n):
        raise PartyError(f"PSI-KKRT: {K_SETUP} from {lo!r} announces {m} bins for {n} IDs, "
                         f"expected {cuckoo.num_bins(n)}")
    s_bits = ot.KkrtSender.new_choices()
    try:
        B, ks = ot.co_receiver_choose(setup["A"], s_bits)
    except ot.OTError as e:
        raise PartyError(f"PSI-KKRT: {K_SETUP} from {lo!r}: {e}") from None
    code_seed = os.urandom(ot.BLOCK)
    party.send(lo, K_REPLY, {"n": mine, "B": B, "code": code_seed})
    sender = ot.KkrtSender(s_bits, ks)
    code = code_for(code_seed, setup["ctx"])
    ell = output_bytes(n, mine)
    bins = cuckoo.bin_hashes(digests, setup["seed"], m)
    # C_j(y) & s for every ID and hash function: needs no U, so it overlaps the label owner's work
    masked = [sender.masked(code.encode(digests, j)) for j in range(cuckoo.N_HASHES)]
    t_setup = time.perf_counter()
    q = np.empty((m, ot.CODE_BYTES), dtype=np.uint8)
    got, i = 0, 0
    while got < m:
        msg = party.recv(lo, K_U, timeout=timeout)
        u = msg.get("u") if isinstance(msg, dict) else None
        if msg.get("i") != i or not isinstance(u, np.ndarray) or u.ndim != 2 or u.shape[1] != ot.CODE_BYTES \
                or not 0 < len(u) <= m - got or (len(u) % cuckoo.BIN_ALIGN):
            raise PartyError(f"PSI-KKRT: {K_U} chunk {msg.get('i')} from {lo!r} is not chunk {i} of "
                             f"(rows<={m - got}, {ot.CODE_BYTES}) OT-extension rows")
        q[got:got + len(u)] = sender.chunk(u, got)
        party.send(lo, K_ACK, {"i": i})
        got += len(u)
        i += 1
        party.progress(got, m, psi_bins=got)
    t_ot = time.perf_counter()
    for i, s in enumerate(range(0, mine, chunk)):
        party.send(lo, K_OPRF, {"i": i, "v": sender_values(q, [c[s:s + chunk] for c in masked], bins[s:s + chunk],
                                                           ell)})
    del q, masked
    t_sent = time.perf_counter()
    ids_out = rows = None
    if reveal:
        msg = party.recv(lo, K_RESULT, timeout=timeout)
        idx = msg.get("idx") if isinstance(msg, dict) else None
        if not isinstance(idx, np.ndarray) or idx.dtype != np.uint32 or idx.ndim != 1:
            raise PartyError(f"PSI-KKRT: {K_RESULT} from {lo!r} must hold a 1-D uint32 array of positions")
        idx = idx.astype(np.int64)
        if len(idx) and (idx.max() >= mine or len(np.unique(idx)) != len(idx)):
            raise PartyError(f"PSI-KKRT: {K_RESULT} from {lo!r} names positions outside our {mine} IDs or twice")
        rows = first_rows[perm[idx]]
        ids_out = [items[r] for r in rows.tolist()]
    t_end = time.perf_counter()
    stats = {
        "backend": "kkrt", "n_input": len(items), "n_unique": mine, "label_owner_size": n,
        "size": None if rows is None else len(rows), "workers": 0, "chunk": chunk, "bins": m, "out_bytes": ell,
        "seconds": t_end - t0, "cpu_seconds": time.process_time() - c0, "seconds_setup": t_setup - t0, "seconds_ot": t_ot - t_setup,
        "seconds_oprf": t_sent - t_ot, "seconds_wait_result": t_end - t_sent,
        "bytes_sent": _sent_to(party, [lo]) - sent0, "bytes_received": _received_from(party, [lo]) - recv0,
    }
    return psi.PSIResult("feature", ids_out, rows, reveal, stats)
