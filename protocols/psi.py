"""ECDH private set intersection between a label owner and feature parties (vertical FL).

Two-party core, label owner L with items X, feature party F with items Y,
H the hash onto Curve25519 and ``^k`` X25519 blinding with a fresh secret
scalar (``fedhet.crypto.ecdh_psi``; its docstring gives the group, the hash and
the security argument of the primitive)::

    L -> F  psi/setup    |X|, mode, hash context
    F -> L  psi/size     |Y|
    L -> F  psi/blind_l  H(x)^a for x in X, in a fresh secret random order, streamed in chunks
    F -> L  psi/blind_f  H(y)^b for y in Y, in a fresh secret random order, streamed in chunks
    F -> L  psi/double_l (H(x)^a)^b, in the order L sent them
    L       matches (H(x)^a)^b against (H(y)^b)^a: x in X∩Y, and its position in F's list
    L -> F  psi/result   (reveal mode) positions in F's shuffled list of the common IDs, in the agreed order

With several feature parties L uses one scalar and one blinded set for all
of them, runs the core with each, and keeps the IDs common to *all* parties
(the rows a vertical model can use).  In reveal mode (the default) every party
ends with the same ordered list of common IDs and the row indices of its own
data in that order; with ``reveal_to_all=False`` only L does, and feature
parties get nothing back.

Order of the common list: ``"sorted"`` (ints numerically, then bytes, then
strings by code point; reveals nothing about anyone's row order) or ``"label_owner"`` (L's
row order, which then tells feature parties how L's common rows are ordered).

Duplicates: IDs are sets; each party removes its duplicates before hashing
(equal IDs would otherwise give equal blinded values and leak multiplicities)
and its row index for a common ID is the row of its first occurrence.

What is revealed (semi-honest parties, DDH in the prime-order subgroup,
random-oracle hash): L learns |Y_j| and X∩Y_j for every feature party j;
F_j learns |X| and, in reveal mode, the final common list (the IDs common to
all parties, a subset of X∩Y_j).  No party learns the other's non-shared IDs
or the other's row order (every blinded list is in a fresh random order from
the OS CSPRNG).  Nothing on the wire is a raw ID or an unkeyed hash of one:
every point is blinded by at least one secret scalar.  Not covered: malicious
parties (a party may lie about its set, or send garbage points, which only
makes the result wrong or raises; small-order points are refused).

Work: L computes |X| + sum_j |Y_j| scalar multiplications, F_j |Y_j| + |X|.
Both sides blind in chunks on a process pool and stream each chunk as soon as
it is ready, so the peer starts re-blinding while this side still works.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np

from fedhet.crypto import ecdh_psi as grp
from fedhet.parties.api import PartyError, PeerTimeout
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare, no_arrays

PROTOCOL_VERSION = 1
MAX_CHUNK = 1 << 16        # rows per point message; the audit checks this bound
DEFAULT_CHUNK = 1 << 14
MAX_ITEMS = (1 << 32) - 1  # positions travel as uint32
POOL_MIN_MULTS = 1 << 14   # below this many scalar multiplications, worker start-up costs more than it saves
ORDERS = ("sorted", "label_owner")
BACKENDS = ("ecdh", "kkrt")  # "kkrt": fedhet.protocols.psi_kkrt (OT-extension PSI)

K_SETUP, K_SIZE = "psi/setup", "psi/size"
K_BLIND_L, K_BLIND_F, K_DOUBLE_L, K_RESULT = "psi/blind_l", "psi/blind_f", "psi/double_l", "psi/result"


# --------------------------------------------------------------- declarations
def _points_check(arrays: list, cfg: dict) -> str | None:
    if len(arrays) != 1:
        return f"expected exactly one array of blinded points, got {len(arrays)}"
    dt, shape = arrays[0]
    if dt != "|u1" or len(shape) != 2 or shape[1] != grp.POINT_BYTES:
        return f"blinded points must be uint8 of shape (n, 32), got {dt}{list(shape)}"
    if not 0 < shape[0] <= MAX_CHUNK:
        return f"a chunk of blinded points must hold 1..{MAX_CHUNK} rows, got {shape[0]}"
    return None


def _positions_check(arrays: list, cfg: dict) -> str | None:
    if len(arrays) != 1:
        return f"expected exactly one array of positions, got {len(arrays)}"
    dt, shape = arrays[0]
    if dt != "<u4" or len(shape) != 1:
        return f"positions must be a 1-D uint32 array, got {dt}{list(shape)}"
    return None


def declarations(label_owner: str | Sequence[str] = "label_owner",
                 feature: str | Sequence[str] = "feature") -> list[MessageDecl]:
    """The PSI message kinds, for an algorithm whose roles have these names."""
    lo = (label_owner,) if isinstance(label_owner, str) else tuple(label_owner)
    fe = (feature,) if isinstance(feature, str) else tuple(feature)
    pts = sch.Fields({"i": sch.Int(lo=0), "pts": sch.Arr("|u1", (None, 32), max_elems=MAX_CHUNK * 32)})
    return [
        declare(K_SETUP, lo, fe, "protocol version, label owner's set size, reveal mode, hash context; "
                "no arrays", no_arrays, payload=sch.Fields({
                    "v": sch.Int(), "n": sch.Int(lo=0), "reveal": sch.Bool(), "ctx": sch.Bytes(max_len=1024)})),
        declare(K_SIZE, fe, lo, "feature party's set size; no arrays", no_arrays,
                payload=sch.Fields({"n": sch.Int(lo=0)})),
        declare(K_BLIND_L, lo, fe, "label owner's IDs hashed to Curve25519 and blinded by its secret "
                "scalar, in secret random order: uint8 (n<=MAX_CHUNK, 32)", _points_check, payload=pts),
        declare(K_BLIND_F, fe, lo, "feature party's IDs hashed to Curve25519 and blinded by its secret "
                "scalar, in secret random order: uint8 (n<=MAX_CHUNK, 32)", _points_check, payload=pts),
        declare(K_DOUBLE_L, fe, lo, "the label owner's blinded points re-blinded by the feature party's "
                "scalar, same order: uint8 (n<=MAX_CHUNK, 32)", _points_check, payload=pts),
        declare(K_RESULT, lo, fe, "positions, in the feature party's own shuffled list, of the IDs common "
                "to all parties, in the agreed order: uint32 (k,)", _positions_check,
                payload=sch.Fields({"idx": sch.Arr("<u4", (None,))})),
    ]


DECLARATIONS = declarations()


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


# -------------------------------------------------------------------- helpers
def as_id_list(ids: Iterable[Any], who: str) -> list:
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{who}: ids must be a collection of IDs, not a single {type(ids).__name__}")
    return list(ids)


def dedupe(items: list, who: str) -> tuple[list[bytes], np.ndarray]:
    """(unique encodings in first-occurrence order, the row of each one's first occurrence)."""
    try:
        enc = grp.encode_items(items)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{who}: {e}") from None
    if len(dict.fromkeys(enc)) == len(enc):  # no duplicates: the common case, at C speed
        uniq, rows = enc, np.arange(len(enc), dtype=np.int64)
    else:
        first: dict[bytes, int] = {}
        for i, e in enumerate(enc):
            if e not in first:
                first[e] = i
        uniq, rows = list(first), np.fromiter(first.values(), dtype=np.int64, count=len(first))
    if len(uniq) > MAX_ITEMS:
        raise ValueError(f"{who}: {len(uniq)} distinct IDs; at most {MAX_ITEMS} are supported")
    return uniq, rows


def secure_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation from the OS CSPRNG (argsort of random 64-bit keys).

    Ties (probability < n^2 / 2^65) only make the order of the tied pair
    deterministic.
    """
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    keys = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
    return np.argsort(keys).astype(np.int64)


def _workers(workers: int | None, mults: int) -> int:
    if workers is not None:
        if int(workers) < 0:
            raise ValueError(f"workers must be >= 0 (0 = inline), got {workers}")
        return int(workers)
    if mults < POOL_MIN_MULTS:
        return 0
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"PSI backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def check_chunk(chunk: int) -> int:
    chunk = int(chunk)
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk must be in 1..{MAX_CHUNK}, got {chunk}")
    return chunk


def match_rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ia, ib) with a[ia[k]] == b[ib[k]] for every row of ``a`` found in ``b`` (rows of 32 bytes).

    Sorts ``b`` by its first 8 bytes, binary-searches ``a``'s, and confirms
    every candidate on all 32 bytes.  ``ia`` is increasing.
    """
    a = np.ascontiguousarray(a, dtype=np.uint8).reshape(-1, 32)
    b = np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, 32)
    empty = np.zeros(0, dtype=np.int64)
    if len(a) == 0 or len(b) == 0:
        return empty, empty
    ka = a.view("<u8")[:, 0]
    kb = b.view("<u8")[:, 0]
    order = np.argsort(kb)
    skb = kb[order]
    if np.any(skb[1:] == skb[:-1]):  # prefix collision: only by accident or a peer's duplicates
        return _match_exact(a, b)
    oa = np.argsort(ka)  # sorted queries keep the binary search in cache
    pos = np.searchsorted(skb, ka[oa])
    pos[pos == len(skb)] = 0
    hit = np.nonzero(skb[pos] == ka[oa])[0]
    ia, jb = oa[hit], order[pos[hit]]
    full = (a[ia] == b[jb]).all(axis=1)
    ia, jb = ia[full], jb[full]
    srt = np.argsort(ia)
    return ia[srt].astype(np.int64), jb[srt].astype(np.int64)


def _match_exact(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    where: dict[bytes, int] = {}
    bb = b.tobytes()
    for j in range(len(b)):
        where.setdefault(bb[32 * j:32 * j + 32], j)
    ab = a.tobytes()
    ia, ib = [], []
    for i in range(len(a)):
        j = where.get(ab[32 * i:32 * i + 32])
        if j is not None:
            ia.append(i)
            ib.append(j)
    return np.array(ia, dtype=np.int64), np.array(ib, dtype=np.int64)


class _Streamer:
    """Sends each future's points, in submission order, from a background thread."""

    def __init__(self, party, kind: str, to: list[str], on_sent=None):
        self.party, self.kind, self.to, self.on_sent = party, kind, list(to), on_sent
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.rows = 0
        self.t_done: float | None = None
        self.thread = threading.Thread(target=self._run, name=f"psi-send-{kind}", daemon=True)
        self.thread.start()

    def put(self, fut) -> None:
        self.q.put(fut)

    def close(self) -> None:
        self.q.put(None)

    def _run(self) -> None:
        i = 0
        try:
            while True:
                fut = self.q.get()
                if fut is None:
                    break
                pts = grp.as_array(fut.result())
                for t in self.to:
                    self.party.send(t, self.kind, {"i": i, "pts": pts})
                i += 1
                self.rows += len(pts)
                if self.on_sent is not None:
                    self.on_sent(len(pts))
        except BaseException as e:  # noqa: BLE001 - handed to the protocol thread
            self.error = e
            # Drain so that futures still queued are not waited on by nobody.
            while True:
                try:
                    if self.q.get_nowait() is None:
                        break
                except queue.Empty:
                    break
        self.t_done = time.perf_counter()

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _recv(party, frm: str, kind: str, timeout: float | None, streamers: Sequence[_Streamer]) -> Any:
    """party.recv, but fails early (with the real cause) when one of our sending threads failed."""
    total = party.timeout if timeout is None else float(timeout)
    deadline = party.now() + total
    while True:
        for s in streamers:
            if s.error is not None:
                raise PartyError(f"PSI: sending {s.kind} failed: {type(s.error).__name__}: {s.error}") from s.error
        left = deadline - party.now()
        if left <= 0:
            raise PeerTimeout(party.name, frm, kind, total)
        try:
            return party.recv(frm, kind, timeout=min(1.0, left))
        except PeerTimeout:
            continue


def _points(msg: Any, frm: str, kind: str, expect_i: int, left: int) -> np.ndarray:
    if not isinstance(msg, dict) or "pts" not in msg:
        raise PartyError(f"PSI: {kind} from {frm!r} is not a chunk of points")
    pts = msg["pts"]
    if not isinstance(pts, np.ndarray) or pts.dtype != np.uint8 or pts.ndim != 2 or pts.shape[1] != 32:
        raise PartyError(f"PSI: {kind} from {frm!r} must hold a uint8 (n, 32) array, got "
                         f"{getattr(pts, 'dtype', type(pts).__name__)}{list(getattr(pts, 'shape', []))}")
    if msg.get("i") != expect_i:
        raise PartyError(f"PSI: {kind} chunk {msg.get('i')} from {frm!r}, expected chunk {expect_i}")
    if not 0 < len(pts) <= min(MAX_CHUNK, left):
        raise PartyError(f"PSI: {kind} chunk {expect_i} from {frm!r} has {len(pts)} rows; "
                         f"{left} were still due (at most {MAX_CHUNK} per chunk)")
    return pts


def _count(msg: Any, frm: str, kind: str, key: str = "n") -> int:
    n = msg.get(key) if isinstance(msg, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= MAX_ITEMS:
        raise PartyError(f"PSI: {kind} from {frm!r} carries no valid set size (got {n!r})")
    return n


class _Progress:
    def __init__(self, party, total: int):
        self.party, self.total, self.done = party, max(1, total), 0
        self.lock = threading.Lock()

    def add(self, k: int) -> None:
        with self.lock:
            self.done += k
            done = self.done
        self.party.progress(min(done, self.total), self.total, psi_rows=done)


def _submit_own(pool, scalar: bytes, enc: list[bytes], perm: np.ndarray, chunk: int, context: bytes,
                streamer: _Streamer) -> None:
    order = perm.tolist()
    for s in range(0, len(order), chunk):
        streamer.put(pool.submit_hash_blind(scalar, [enc[i] for i in order[s:s + chunk]], context))
    streamer.close()


def _sent_to(party, peers: Sequence[str]) -> int:
    return sum(party.bytes_sent.get(p, 0) for p in peers)


def _received_from(party, peers: Sequence[str]) -> int:
    return sum(party.bytes_received.get(p, 0) for p in peers)


# ---------------------------------------------------------------- label owner
def psi_label_owner(party, ids: Iterable[Any], peers: Sequence[str], reveal_to_all: bool = True, *,
                    order: str = "sorted", chunk: int = DEFAULT_CHUNK, workers: int | None = None,
                    context: bytes = b"", timeout: float | None = None, backend: str = "ecdh") -> PSIResult:
    """Intersect this party's ``ids`` with every feature party in ``peers``.

    Returns the IDs common to all parties in the agreed ``order`` and this
    party's rows for them; with ``reveal_to_all`` the feature parties receive
    the same list.  ``workers``: worker processes for the scalar
    multiplications (None: every core once the sets are large enough, 0:
    inline).  ``context``: bytes that separate this intersection's hash domain
    from others (e.g. the ID namespace); sent to the peers.  ``timeout``:
    seconds to wait for any one message (default: the party's); the waits
    include the peers' computation.  ``backend``: ``"ecdh"`` (this module) or
    ``"kkrt"`` (OT-extension PSI, :mod:`fedhet.protocols.psi_kkrt`; ``workers``
    does not apply to it); every party of one intersection must use the same.
    """
    t0 = time.perf_counter()
    check_backend(backend)
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
    context = bytes(context)
    if backend == "kkrt":
        from fedhet.protocols import psi_kkrt  # imports this module: only when asked for

        return psi_kkrt.kkrt_label_owner(party, ids, peers, reveal_to_all, order=order, chunk=chunk,
                                         context=context, timeout=timeout)
    who = f"label owner {party.name!r}"
    items = as_id_list(ids, who)
    sent0, recv0 = _sent_to(party, peers), _received_from(party, peers)
    nworkers = _workers(workers, 2 * len(items))  # decided before the sizes are known, to start early
    with grp.BlindPool(nworkers) as pool:
        pool.start()  # workers boot while we encode
        enc, first_rows = dedupe(items, who)
        n = len(enc)
        for p in peers:
            party.send(p, K_SETUP, {"v": PROTOCOL_VERSION, "n": n, "reveal": bool(reveal_to_all), "ctx": context})
        sizes = {p: _count(_recv(party, p, K_SIZE, timeout, ()), p, K_SIZE) for p in peers}
        a = grp.new_scalar()
        perm = secure_permutation(n)
        prog = _Progress(party, n * (1 + len(peers)) + sum(sizes.values()))
        t_start = time.perf_counter()
        own = _Streamer(party, K_BLIND_L, peers, prog.add)
        _submit_own(pool, a, enc, perm, chunk, context, own)
        # Re-blind each feature party's points as their chunks arrive.
        futs: dict[str, list] = {}
        for p in peers:
            futs[p], got, i = [], 0, 0
            while got < sizes[p]:
                pts = _points(_recv(party, p, K_BLIND_F, timeout, [own]), p, K_BLIND_F, i, sizes[p] - got)
                futs[p].append(pool.submit_blind(a, pts))
                got += len(pts)
                i += 1
        doubles: dict[str, np.ndarray] = {}
        for p in peers:
            parts, got, i = [], 0, 0
            while got < n:
                pts = _points(_recv(party, p, K_DOUBLE_L, timeout, [own]), p, K_DOUBLE_L, i, n - got)
                parts.append(pts)
                got += len(pts)
                i += 1
                prog.add(len(pts))
            doubles[p] = np.concatenate(parts) if parts else np.zeros((0, 32), np.uint8)
        theirs: dict[str, np.ndarray] = {}
        for p in peers:
            theirs[p] = grp.as_array(b"".join(f.result() for f in futs[p]))
            prog.add(sizes[p])
        own.join()
    t_blind = time.perf_counter()
    # Positions (in our shuffled order) present at every peer, and where each peer has them.
    in_all = np.ones(n, dtype=bool)
    where: dict[str, np.ndarray] = {}
    pair_sizes: dict[str, int] = {}
    for p in peers:
        ia, ib = match_rows(doubles[p], theirs[p])
        w = np.full(n, -1, dtype=np.int64)
        w[ia] = ib
        where[p] = w
        pair_sizes[p] = int(len(ia))
        hit = np.zeros(n, dtype=bool)
        hit[ia] = True
        in_all &= hit
    common_pos = np.nonzero(in_all)[0]
    uniq = perm[common_pos]  # indices into our de-duplicated IDs
    if order == "sorted":
        ordering = np.array(grp.canonical_order([enc[u] for u in uniq.tolist()]), dtype=np.int64)
    else:
        ordering = np.argsort(uniq)  # de-duplicated order = order of first occurrence
    common_pos, uniq = common_pos[ordering], uniq[ordering]
    if reveal_to_all:
        for p in peers:
            party.send(p, K_RESULT, {"idx": where[p][common_pos].astype(np.uint32)})
    rows = first_rows[uniq]
    t_end = time.perf_counter()
    stats = {
        "n_input": len(items), "n_unique": n, "peer_sizes": sizes, "pair_sizes": pair_sizes,
        "size": int(len(rows)), "workers": nworkers, "chunk": chunk, "scalar_mults": n + sum(sizes.values()),
        "seconds": t_end - t0, "seconds_blind": t_blind - t_start, "seconds_match": t_end - t_blind,
        "bytes_sent": _sent_to(party, peers) - sent0, "bytes_received": _received_from(party, peers) - recv0,
    }
    return PSIResult("label_owner", [items[r] for r in rows.tolist()], rows, True, stats)


# -------------------------------------------------------------- feature party
def psi_feature_party(party, ids: Iterable[Any], label_owner: str, *, chunk: int = DEFAULT_CHUNK,
                      workers: int | None = None, timeout: float | None = None, backend: str = "ecdh") -> PSIResult:
    """This feature party's side of :func:`psi_label_owner` (same ``backend`` as the label owner's).

    Returns the common IDs (in the label owner's agreed order) and this
    party's rows for them, or ``ids=None`` when the label owner keeps the
    result to itself.
    """
    t0 = time.perf_counter()
    check_backend(backend)
    if label_owner not in party.peers:
        raise ValueError(f"psi_feature_party: {label_owner!r} is not a peer of {party.name!r} ({party.peers})")
    chunk = check_chunk(chunk)
    if backend == "kkrt":
        from fedhet.protocols import psi_kkrt

        return psi_kkrt.kkrt_feature_party(party, ids, label_owner, chunk=chunk, timeout=timeout)
    lo = label_owner
    who = f"feature party {party.name!r}"
    items = as_id_list(ids, who)
    sent0, recv0 = _sent_to(party, [lo]), _received_from(party, [lo])
    nworkers = _workers(workers, 2 * len(items))
    with grp.BlindPool(nworkers) as pool:
        pool.start()
        enc, first_rows = dedupe(items, who)
        m = len(enc)
        setup = _recv(party, lo, K_SETUP, timeout, ())
        version = setup.get("v") if isinstance(setup, dict) else None
        if version != PROTOCOL_VERSION:
            raise PartyError(f"PSI: {lo!r} speaks PSI version {version!r}, we speak {PROTOCOL_VERSION}")
        n = _count(setup, lo, K_SETUP)
        reveal = bool(setup.get("reveal", True))
        context = setup.get("ctx", b"")
        if not isinstance(context, bytes):
            raise PartyError(f"PSI: {K_SETUP} from {lo!r} carries a hash context that is not bytes")
        party.send(lo, K_SIZE, {"n": m})
        b = grp.new_scalar()
        perm = secure_permutation(m)
        prog = _Progress(party, m + n)
        t_start = time.perf_counter()
        own = _Streamer(party, K_BLIND_F, [lo], prog.add)
        _submit_own(pool, b, enc, perm, chunk, context, own)
        dbl = _Streamer(party, K_DOUBLE_L, [lo], prog.add)
        try:
            got, i = 0, 0
            while got < n:
                pts = _points(_recv(party, lo, K_BLIND_L, timeout, [own, dbl]), lo, K_BLIND_L, i, n - got)
                dbl.put(pool.submit_blind(b, pts))
                got += len(pts)
                i += 1
        finally:
            dbl.close()
        own.join()
        dbl.join()
    t_blind = time.perf_counter()
    ids_out = rows = None
    if reveal:
        msg = _recv(party, lo, K_RESULT, timeout, ())
        idx = msg.get("idx") if isinstance(msg, dict) else None
        if not isinstance(idx, np.ndarray) or idx.dtype != np.uint32 or idx.ndim != 1:
            raise PartyError(f"PSI: {K_RESULT} from {lo!r} must hold a 1-D uint32 array of positions")
        idx = idx.astype(np.int64)
        if len(idx) and (idx.max() >= m or len(np.unique(idx)) != len(idx)):
            raise PartyError(f"PSI: {K_RESULT} from {lo!r} names positions outside our {m} IDs or twice")
        rows = first_rows[perm[idx]]
        ids_out = [items[r] for r in rows.tolist()]
    t_end = time.perf_counter()
    stats = {
        "n_input": len(items), "n_unique": m, "label_owner_size": n, "size": None if rows is None else len(rows),
        "workers": nworkers, "chunk": chunk, "scalar_mults": m + n, "seconds": t_end - t0,
        "seconds_blind": t_blind - t_start, "seconds_wait_result": t_end - t_blind,
        "bytes_sent": _sent_to(party, [lo]) - sent0, "bytes_received": _received_from(party, [lo]) - recv0,
    }
    return PSIResult("feature", ids_out, rows, reveal, stats)
