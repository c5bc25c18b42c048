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
parties get nothing back.  Order and duplicates: :mod:`.common`.

The stages, one function each:

=====================  =========================================================  ===================
function               does                                                       sends
=====================  =========================================================  ===================
exchange_sizes         L announces |X| and the mode, learns every |Y_j|           ``psi/setup``
answer_setup           F reads the setup, answers |Y|                             ``psi/size``
stream_own             either side: hash and blind its own IDs, shuffled          ``psi/blind_l|_f``
reblind_peers          L re-blinds each F_j's points as they arrive               (nothing)
receive_doubles        L collects (H(x)^a)^b from each F_j                        (nothing)
reblind_label_owner    F re-blinds L's points and streams them back               ``psi/double_l``
intersect              L matches, keeps the IDs every F_j has                     (nothing)
=====================  =========================================================  ===================

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
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from fedhet.crypto import ecdh_psi as grp
from fedhet.parties.api import PartyError, PeerFault, PeerTimeout, ProtocolMismatch
from fedhet.parties.contract import PartyLike

from .common import (ECDH_VERSION, MAX_CHUNK, Kind, PSIResult, agreed_order, as_id_list, dedupe, feature_result,
                     label_owner_result, received_rows, secure_permutation, send_positions, setup_from, traffic,
                     traffic_stats)

POOL_MIN_MULTS = 1 << 14   # below this many scalar multiplications, worker start-up costs more than it saves


# -------------------------------------------------------------------- helpers
def pool_workers(workers: int | None, mults: int) -> int:
    """Worker processes for ``mults`` scalar multiplications (``workers``: the caller's choice, None: auto)."""
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
        k = where.get(ab[32 * i:32 * i + 32])
        if k is not None:
            ia.append(i)
            ib.append(k)
    return np.array(ia, dtype=np.int64), np.array(ib, dtype=np.int64)


class Streamer:
    """Sends each future's points, in submission order, from a background thread."""

    def __init__(self, party: PartyLike, kind: str, to: list[str], on_sent: Callable[[int], None] | None = None):
        self.party, self.kind, self.to, self.on_sent = party, kind, list(to), on_sent
        self.q: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.rows = 0
        self.t_done: float | None = None
        self.thread = threading.Thread(target=self._run, name=f"psi-send-{kind}", daemon=True)
        self.thread.start()

    def put(self, fut: Any) -> None:
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


def _recv(party: PartyLike, frm: str, kind: str, timeout: float | None, streamers: Sequence[Streamer]) -> Any:
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


def _chunks(party: PartyLike, frm: str, kind: str, total: int, timeout: float | None,
            streamers: Sequence[Streamer]) -> Iterator[np.ndarray]:
    """The ``total`` points ``frm`` streams as ``kind``, chunk by chunk (the schema checked each chunk's shape)."""
    got, i = 0, 0
    while got < total:
        msg = _recv(party, frm, kind, timeout, streamers)
        if msg["i"] != i:
            raise PeerFault(party.name, frm, kind, f"PSI: chunk {msg['i']}, expected chunk {i}")
        pts = msg["pts"]
        if not 0 < len(pts) <= min(MAX_CHUNK, total - got):
            raise PeerFault(party.name, frm, kind, f"PSI: chunk {i} has {len(pts)} rows; "
                            f"{total - got} were still due (at most {MAX_CHUNK} per chunk)")
        yield pts
        got += len(pts)
        i += 1


class _Progress:
    def __init__(self, party: PartyLike, total: int):
        self.party, self.total, self.done = party, max(1, total), 0
        self.lock = threading.Lock()

    def add(self, k: int) -> None:
        with self.lock:
            self.done += k
            done = self.done
        self.party.progress(min(done, self.total), self.total, psi_rows=done)


# --------------------------------------------------------------------- stages
def exchange_sizes(party: PartyLike, peers: Sequence[str], n: int, reveal: bool, context: bytes,
                   timeout: float | None) -> dict[str, int]:
    """L: announce |X|, the mode and the hash context; every feature party's set size."""
    for p in peers:
        party.send(p, Kind.SETUP, {"v": ECDH_VERSION, "n": n, "reveal": bool(reveal), "ctx": context})
    return {p: _recv(party, p, Kind.SIZE, timeout, ())["n"] for p in peers}


def answer_setup(party: PartyLike, lo: str, m: int, timeout: float | None,
                 first: tuple[str, dict] | None = None) -> tuple[int, bool, bytes]:
    """F: the label owner's (|X|, reveal mode, hash context), after answering |Y| = ``m`` (``first``: the
    setup already received, :func:`~fedhet.protocols.psi.common.first_message`)."""
    setup = setup_from(party, lo, "ecdh", timeout, first)
    if setup["v"] != ECDH_VERSION:
        raise ProtocolMismatch(party.name, lo, "PSI (ecdh) version", ECDH_VERSION, setup["v"])
    party.send(lo, Kind.SIZE, {"n": m})
    return setup["n"], setup["reveal"], setup["ctx"]


def stream_own(party: PartyLike, pool: Any, scalar: bytes, enc: list[bytes], perm: np.ndarray, chunk: int,
               context: bytes, kind: str, to: list[str], on_sent: Callable[[int], None]) -> Streamer:
    """Hash and blind our own IDs in the secret order ``perm``, streaming each chunk to ``to`` when ready."""
    streamer = Streamer(party, kind, to, on_sent)
    order = perm.tolist()
    for s in range(0, len(order), chunk):
        streamer.put(pool.submit_hash_blind(scalar, [enc[i] for i in order[s:s + chunk]], context))
    streamer.close()
    return streamer


def reblind_peers(party: PartyLike, pool: Any, a: bytes, sizes: dict[str, int], own: Streamer,
                  timeout: float | None) -> dict[str, list]:
    """L: every feature party's blinded points, re-blinded by ``a`` as their chunks arrive (futures)."""
    return {p: [pool.submit_blind(a, pts) for pts in _chunks(party, p, Kind.BLIND_F, n, timeout, [own])]
            for p, n in sizes.items()}


def receive_doubles(party: PartyLike, peers: Sequence[str], n: int, own: Streamer, prog: _Progress,
                    timeout: float | None) -> dict[str, np.ndarray]:
    """L: our points re-blinded by each feature party, in the order we sent them."""
    doubles: dict[str, np.ndarray] = {}
    for p in peers:
        parts = []
        for pts in _chunks(party, p, Kind.DOUBLE_L, n, timeout, [own]):
            parts.append(pts)
            prog.add(len(pts))
        doubles[p] = np.concatenate(parts) if parts else np.zeros((0, 32), np.uint8)
    return doubles


def reblind_label_owner(party: PartyLike, pool: Any, b: bytes, lo: str, n: int, own: Streamer,
                        prog: _Progress, timeout: float | None) -> Streamer:
    """F: re-blind the label owner's points by ``b`` as they arrive and stream them back, same order."""
    dbl = Streamer(party, Kind.DOUBLE_L, [lo], prog.add)
    try:
        for pts in _chunks(party, lo, Kind.BLIND_L, n, timeout, [own, dbl]):
            dbl.put(pool.submit_blind(b, pts))
    finally:
        dbl.close()
    return dbl


def intersect(doubles: dict[str, np.ndarray], theirs: dict[str, np.ndarray],
              n: int) -> tuple[np.ndarray, dict[str, np.ndarray], dict[str, int]]:
    """L: (our shuffled positions present at every peer, where each peer has each of ours, pair sizes)."""
    in_all = np.ones(n, dtype=bool)
    where: dict[str, np.ndarray] = {}
    pair_sizes: dict[str, int] = {}
    for p in doubles:
        ia, ib = match_rows(doubles[p], theirs[p])
        w = np.full(n, -1, dtype=np.int64)
        w[ia] = ib
        where[p] = w
        pair_sizes[p] = int(len(ia))
        hit = np.zeros(n, dtype=bool)
        hit[ia] = True
        in_all &= hit
    return np.nonzero(in_all)[0], where, pair_sizes


# ---------------------------------------------------------------------- roles
def label_owner(party: PartyLike, ids: Iterable[Any], peers: list[str], reveal_to_all: bool, *, order: str,
                chunk: int, workers: int | None, context: bytes, timeout: float | None) -> PSIResult:
    """L's side with every feature party in ``peers`` (arguments checked by the caller,
    :func:`fedhet.protocols.psi.psi_label_owner`)."""
    t0 = time.perf_counter()
    who = f"label owner {party.name!r}"
    items = as_id_list(ids, who)
    start = traffic(party, peers)
    nworkers = pool_workers(workers, 2 * len(items))  # decided before the sizes are known, to start early
    with grp.BlindPool(nworkers) as pool:
        pool.start()  # workers boot while we encode
        enc, first_rows = dedupe(items, who)
        n = len(enc)
        sizes = exchange_sizes(party, peers, n, reveal_to_all, context, timeout)
        a = grp.new_scalar()
        perm = secure_permutation(n)
        prog = _Progress(party, n * (1 + len(peers)) + sum(sizes.values()))
        t_start = time.perf_counter()
        own = stream_own(party, pool, a, enc, perm, chunk, context, Kind.BLIND_L, peers, prog.add)
        futs = reblind_peers(party, pool, a, sizes, own, timeout)
        doubles = receive_doubles(party, peers, n, own, prog, timeout)
        theirs: dict[str, np.ndarray] = {}
        for p in peers:
            theirs[p] = grp.as_array(b"".join(f.result() for f in futs[p]))
            prog.add(sizes[p])
        own.join()
    t_blind = time.perf_counter()
    common_pos, where, pair_sizes = intersect(doubles, theirs, n)
    uniq = perm[common_pos]  # indices into our de-duplicated IDs
    ordering = agreed_order(enc, uniq, order)
    common_pos, uniq = common_pos[ordering], uniq[ordering]
    if reveal_to_all:
        send_positions(party, peers, Kind.RESULT, where, common_pos)
    rows = first_rows[uniq]
    t_end = time.perf_counter()
    stats = {
        "backend": "ecdh", "n_input": len(items), "n_unique": n, "peer_sizes": sizes, "pair_sizes": pair_sizes,
        "size": int(len(rows)), "workers": nworkers, "chunk": chunk, "scalar_mults": n + sum(sizes.values()),
        "total_s": t_end - t0, "blind_s": t_blind - t_start, "match_s": t_end - t_blind,
        **traffic_stats(party, peers, start),
    }
    return label_owner_result(items, rows, stats)


def feature_party(party: PartyLike, ids: Iterable[Any], lo: str, *, chunk: int, workers: int | None,
                  timeout: float | None, first: tuple[str, dict] | None = None) -> PSIResult:
    """F's side of :func:`label_owner` (arguments checked by :func:`fedhet.protocols.psi.psi_feature_party`)."""
    t0 = time.perf_counter()
    who = f"feature party {party.name!r}"
    items = as_id_list(ids, who)
    start = traffic(party, [lo])
    nworkers = pool_workers(workers, 2 * len(items))
    with grp.BlindPool(nworkers) as pool:
        pool.start()
        enc, first_rows = dedupe(items, who)
        m = len(enc)
        n, reveal, context = answer_setup(party, lo, m, timeout, first)
        b = grp.new_scalar()
        perm = secure_permutation(m)
        prog = _Progress(party, m + n)
        t_start = time.perf_counter()
        own = stream_own(party, pool, b, enc, perm, chunk, context, Kind.BLIND_F, [lo], prog.add)
        dbl = reblind_label_owner(party, pool, b, lo, n, own, prog, timeout)
        own.join()
        dbl.join()
    t_blind = time.perf_counter()
    rows = received_rows(party.name, _recv(party, lo, Kind.RESULT, timeout, ()), lo, Kind.RESULT, perm, first_rows) \
        if reveal else None
    t_end = time.perf_counter()
    stats = {
        "backend": "ecdh", "n_input": len(items), "n_unique": m, "label_owner_size": n, "size": None if rows is None else len(rows),
        "workers": nworkers, "chunk": chunk, "scalar_mults": m + n, "total_s": t_end - t0,
        "blind_s": t_blind - t_start, "wait_result_s": t_end - t_blind,
        **traffic_stats(party, [lo], start),
    }
    return feature_result(items, rows, stats)
