"""KKRT16 private set intersection (batched OPRF from OT extension), label owner and feature parties.

The second backend of :mod:`fedhet.protocols.psi` (``backend="kkrt"``): same
API, same result (:class:`~fedhet.protocols.psi.common.PSIResult`), same multi-party
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
budget); OPRF values go in chunks of at most ``MAX_CHUNK`` items.  Work is
vectorised numpy and batched AES in one process per party (no worker pool).

The stages, one function each:

==================  ==============================================================  ===================
function            does                                                            sends
==================  ==============================================================  ===================
send_setup          L: cuckoo table announced, one Chou–Orlandi sender per F_j      ``psi_kkrt/setup``
answer_setup        F: base-OT choices, the code seed                               ``psi_kkrt/reply``
extend              L: OT extension with one F_j, its own OPRF values               ``psi_kkrt/u``
receive_u           F: the OT-extension rows q, acknowledged chunk by chunk         ``psi_kkrt/ack``
send_oprf           F: its OPRF values at all three bins of every ID                ``psi_kkrt/oprf``
match_peer          L: which of its IDs F_j has, and where in F_j's list            (nothing)
==================  ==============================================================  ===================
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Iterable, Sequence

import numpy as np

from fedhet.crypto import cuckoo, ot
from fedhet.parties.api import PeerFault, ProtocolMismatch
from fedhet.parties.contract import PartyLike

from .common import (KKRT_MAX_ITEMS, KKRT_VERSION, MAX_U_ROWS, SIGMA, Kind, OTPeer, PSIResult, as_id_list,
                     common_to_all, digest_dedupe, expect_ack, feature_inputs, feature_result, label_owner_result,
                     match_values, oprf_bytes, peak_rss_mib, receive_rows, received_rows, setup_from, traffic,
                     traffic_stats)

U_WINDOW_BYTES = 64 << 20   # unacknowledged U bytes in flight per feature party
_CTX_PERSON = b"fedhet-kkrt-ctx"


# -------------------------------------------------------------------- helpers
def output_bytes(n_receiver: int, n_sender: int, sigma: int = SIGMA) -> int:
    """ℓ in bytes: σ + ⌈log2 n_receiver⌉ + ⌈log2 3 n_sender⌉ bits, rounded up, within 8..16 (L compares
    each of its values with the 3 values of every feature-party ID)."""
    return oprf_bytes(n_receiver, cuckoo.N_HASHES * n_sender, sigma)


def code_for(code_seed: bytes, context: bytes) -> ot.PseudorandomCode:
    """The pseudorandom code of one run: keys from the feature party's seed, bound to the hash context."""
    ctx = hashlib.blake2b(bytes(context), digest_size=16, person=_CTX_PERSON).digest()
    return ot.PseudorandomCode(hashlib.blake2b(bytes(code_seed), digest_size=16, key=ctx).digest())


def _u_rows(chunk: int) -> int:
    return min(MAX_U_ROWS, max(cuckoo.BIN_ALIGN, -(-4 * int(chunk) // cuckoo.BIN_ALIGN) * cuckoo.BIN_ALIGN))


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


def _ack(party: PartyLike, frm: str, want: int, timeout: float | None) -> None:
    expect_ack(party, frm, Kind.KKRT_ACK, want, timeout, "PSI-KKRT")


# --------------------------------------------------------------------- stages
PeerRun = OTPeer   # L's state for one feature party


class Table:
    """L's cuckoo table of its de-duplicated IDs (their digests)."""

    def __init__(self, digests: np.ndarray):
        self.digests = digests
        self.seed, self.m, self.table, self.which, self.attempts = cuckoo.build_table(digests)
        self.occupied = np.nonzero(self.table >= 0)[0]


def send_setup(party: PartyLike, peers: Sequence[str], n: int, reveal: bool, context: bytes,
               tab: Table) -> dict[str, PeerRun]:
    """L: announce |X|, the mode, the hash context and the cuckoo table; one base-OT sender per feature party."""
    runs = {p: PeerRun(p) for p in peers}
    for p, r in runs.items():
        party.send(p, Kind.KKRT_SETUP, {"v": KKRT_VERSION, "n": n, "reveal": bool(reveal), "ctx": context,
                                        "seed": tab.seed, "bins": tab.m, "A": r.A})
    return runs


def extend(party: PartyLike, r: PeerRun, tab: Table, context: bytes, u_rows: int, window: int,
           timeout: float | None, on_chunk: Any) -> None:
    """L with one feature party: base OTs from its reply, then the OT-extension matrix U streamed in
    flow-controlled chunks; keeps our own OPRF values ``r.values``."""
    n, m = len(tab.digests), tab.m
    reply = party.recv(r.name, Kind.KKRT_REPLY, timeout=timeout)
    r.n = reply["n"]
    try:
        k0, k1 = ot.co_sender_keys(r.a, r.A, reply["B"])
    except ot.OTError as e:
        raise PeerFault(party.name, r.name, Kind.KKRT_REPLY, f"PSI-KKRT: {e}") from None
    receiver = ot.KkrtReceiver(k0, k1)
    code = code_for(reply["code"], context)
    ell = output_bytes(n, r.n)
    r.values = np.zeros((n, ell), dtype=np.uint8)
    occupied = tab.occupied
    for i, s in enumerate(range(0, m, u_rows)):
        end = min(m, s + u_rows)
        u, t = receiver.chunk(bin_codes(code, tab.digests, tab.table[s:end], tab.which[s:end]), s)
        occ = occupied[np.searchsorted(occupied, s):np.searchsorted(occupied, end)]
        if len(occ):
            r.values[tab.table[occ]] = ot.cr_hash(t[occ - s], ell)
        while r.sent - r.acked >= window:
            _ack(party, r.name, r.acked, timeout)
            r.acked += 1
        party.send(r.name, Kind.KKRT_U, {"i": i, "u": u})
        r.sent += 1
        on_chunk()


def match_peer(party: PartyLike, r: PeerRun, n: int, timeout: float | None) -> np.ndarray:
    """L: the remaining acknowledgements, then the feature party's OPRF values matched with ours:
    for each of our IDs its position in the feature party's list (-1: not there)."""
    while r.acked < r.sent:
        _ack(party, r.name, r.acked, timeout)
        r.acked += 1
    assert r.values is not None
    ell = r.values.shape[1]
    theirs = receive_rows(party, r.name, Kind.KKRT_OPRF, r.n, (cuckoo.N_HASHES, ell), timeout,
                          "PSI-KKRT").reshape(-1, ell)
    ia, ib = match_values(r.values, theirs)
    w = np.full(n, -1, dtype=np.int64)
    w[ia] = ib // cuckoo.N_HASHES
    r.values = None
    return w


def answer_setup(party: PartyLike, lo: str, mine: int, timeout: float | None) -> tuple[dict, ot.KkrtSender, bytes]:
    """F: the label owner's setup (checked), after answering with our size, base-OT choices and code seed."""
    setup = setup_from(party, lo, "kkrt", timeout)
    if setup["v"] != KKRT_VERSION:
        raise ProtocolMismatch(party.name, lo, "PSI (kkrt) version", KKRT_VERSION, setup["v"])
    n, m = setup["n"], setup["bins"]
    if m != cuckoo.num_bins(n):
        raise PeerFault(party.name, lo, Kind.KKRT_SETUP, f"PSI-KKRT: announces {m} bins for {n} IDs, "
                        f"expected {cuckoo.num_bins(n)}")
    s_bits = ot.KkrtSender.new_choices()
    try:
        B, ks = ot.co_receiver_choose(setup["A"], s_bits)
    except ot.OTError as e:
        raise PeerFault(party.name, lo, Kind.KKRT_SETUP, f"PSI-KKRT: {e}") from None
    code_seed = os.urandom(ot.BLOCK)
    party.send(lo, Kind.KKRT_REPLY, {"n": mine, "B": B, "code": code_seed})
    return setup, ot.KkrtSender(s_bits, ks), code_seed


def receive_u(party: PartyLike, lo: str, sender: ot.KkrtSender, m: int, timeout: float | None) -> np.ndarray:
    """F: the OT-extension rows q of all ``m`` bins, each chunk of U acknowledged once processed."""
    q = np.empty((m, ot.CODE_BYTES), dtype=np.uint8)
    got, i = 0, 0
    while got < m:
        msg = party.recv(lo, Kind.KKRT_U, timeout=timeout)
        u = msg["u"]
        if msg["i"] != i or not 0 < len(u) <= m - got or (len(u) % cuckoo.BIN_ALIGN):
            raise PeerFault(party.name, lo, Kind.KKRT_U, f"PSI-KKRT: chunk {msg['i']} is not chunk {i} of "
                            f"(rows<={m - got}, {ot.CODE_BYTES}) OT-extension rows")
        q[got:got + len(u)] = sender.chunk(u, got)
        party.send(lo, Kind.KKRT_ACK, {"i": i})
        got += len(u)
        i += 1
        party.progress(got, m, psi_bins=got)
    return q


def send_oprf(party: PartyLike, lo: str, q: np.ndarray, masked: list[np.ndarray], bins: np.ndarray, ell: int,
              chunk: int) -> None:
    """F: its OPRF values, ``chunk`` IDs per message, in its secret order."""
    for i, s in enumerate(range(0, len(bins), chunk)):
        party.send(lo, Kind.KKRT_OPRF, {"i": i, "v": sender_values(q, [c[s:s + chunk] for c in masked],
                                                                   bins[s:s + chunk], ell)})


# ---------------------------------------------------------------------- roles
def label_owner(party: PartyLike, ids: Iterable[Any], peers: list[str], reveal_to_all: bool, *, order: str,
                chunk: int, context: bytes, timeout: float | None) -> PSIResult:
    """L's side of KKRT-PSI with every feature party in ``peers`` (arguments checked by the caller,
    :func:`fedhet.protocols.psi.psi_label_owner`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    who = f"label owner {party.name!r}"
    items = as_id_list(ids, who)
    start = traffic(party, peers)
    enc, first_rows, digests = digest_dedupe(items, who, KKRT_MAX_ITEMS)
    n = len(enc)
    tab = Table(digests)
    t_hash = time.perf_counter()
    runs = send_setup(party, peers, n, reveal_to_all, context, tab)
    u_rows = _u_rows(chunk)
    window = max(2, U_WINDOW_BYTES // (u_rows * ot.CODE_BYTES))
    prog_total = max(1, -(-tab.m // u_rows) * len(peers))
    done = [0]

    def on_chunk() -> None:
        done[0] += 1
        party.progress(done[0], prog_total, psi_bins=done[0] * u_rows)

    for r in runs.values():
        extend(party, r, tab, context, u_rows, window, timeout, on_chunk)
    t_u = time.perf_counter()
    # Which of our IDs each feature party has, and where in its shuffled list.
    where = {p: match_peer(party, r, n, timeout) for p, r in runs.items()}
    t_match = time.perf_counter()
    uniq = common_to_all(party, peers, Kind.KKRT_RESULT, where, enc, order, reveal_to_all)
    rows = first_rows[uniq]
    t_end = time.perf_counter()
    stats = {
        "backend": "kkrt", "n_input": len(items), "n_unique": n, "peer_sizes": {p: r.n for p, r in runs.items()},
        "pair_sizes": {p: int((w >= 0).sum()) for p, w in where.items()}, "size": int(len(rows)), "workers": 0,
        "chunk": chunk, "bins": tab.m, "cuckoo_attempts": tab.attempts, "code_bits": ot.CODE_BITS,
        "u_rows_per_message": u_rows, "out_bytes": {p: output_bytes(n, r.n) for p, r in runs.items()},
        "total_s": t_end - t0, "cpu_s": time.process_time() - c0, "hash_s": t_hash - t0,
        "ot_s": t_u - t_hash, "match_s": t_match - t_u, "max_rss_mib": peak_rss_mib(),
        **traffic_stats(party, peers, start),
    }
    return label_owner_result(items, rows, stats)


def feature_party(party: PartyLike, ids: Iterable[Any], lo: str, *, chunk: int, timeout: float | None) -> PSIResult:
    """F's side of :func:`label_owner` (arguments checked by :func:`fedhet.protocols.psi.psi_feature_party`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    items, start, enc, first_rows, digests, perm = feature_inputs(party, ids, lo, KKRT_MAX_ITEMS)
    mine = len(enc)   # from here on our IDs are in the secret random order we send them in
    setup, sender, code_seed = answer_setup(party, lo, mine, timeout)
    n, m = setup["n"], setup["bins"]
    code = code_for(code_seed, setup["ctx"])
    ell = output_bytes(n, mine)
    bins = cuckoo.bin_hashes(digests, setup["seed"], m)
    # C_j(y) & s for every ID and hash function: needs no U, so it overlaps the label owner's work
    masked = [sender.masked(code.encode(digests, j)) for j in range(cuckoo.N_HASHES)]
    t_setup = time.perf_counter()
    q = receive_u(party, lo, sender, m, timeout)
    t_ot = time.perf_counter()
    send_oprf(party, lo, q, masked, bins, ell, chunk)
    del q, masked
    t_sent = time.perf_counter()
    rows = received_rows(party.name, party.recv(lo, Kind.KKRT_RESULT, timeout=timeout), lo, Kind.KKRT_RESULT, perm,
                         first_rows) if setup["reveal"] else None
    t_end = time.perf_counter()
    stats = {
        "backend": "kkrt", "n_input": len(items), "n_unique": mine, "label_owner_size": n,
        "size": None if rows is None else len(rows), "workers": 0, "chunk": chunk, "bins": m, "out_bytes": ell,
        "total_s": t_end - t0, "cpu_s": time.process_time() - c0, "setup_s": t_setup - t0,
        "ot_s": t_ot - t_setup, "oprf_s": t_sent - t_ot, "wait_result_s": t_end - t_sent,
        "max_rss_mib": peak_rss_mib(), **traffic_stats(party, [lo], start),
    }
    return feature_result(items, rows, stats)
