"""RR22-class PSI (OKVS + silent VOLE), label owner and feature parties.

The third backend of :mod:`fedhet.protocols.psi` (``backend="rr22"``): same
API, same result, same multi-party vertical form as ECDH and KKRT, less on
the wire.  Rindal, Schoppmann, "VOLE-PSI: Fast OPRF and Circuit-PSI from
Vector-OLE" (Eurocrypt 2021, ePrint 2021/266) and Raghuraman, Rindal,
"Blazing Fast PSI from Improved OKVS and Subfield VOLE" (CCS 2022, ePrint
2022/320), semi-honest variant, with the random-band OKVS of Bienstock, Patel,
Seo, Yeo (USENIX Security 2023).

Two-party core, label owner L (PSI receiver, items X, |X| = n) and feature
party F (PSI sender, items Y); every ID is first a 128-bit digest: the keyed PRF
:func:`fedhet.crypto.id_prf.cbc_mac_many` (AES-128 CBC-MAC of the length-prepended encoding)
under a key dk that L draws fresh for the run and sends in its first message, so every party's IDs
are fixed before it is drawn and two distinct IDs share a digest with probability about
N^2 / 2^128 (N IDs in all) plus AES's PRP advantage (version 1 used SHA-256, one Python call
per ID; this hashes all IDs in a few AES-NI calls); all
arithmetic is in GF(2^128) (:mod:`fedhet.crypto.gf128`)::

    L -> F   psi_rr22/setup   reveal mode, hash context, Chou–Orlandi point A, the digest key dk (first
                              thing: no IDs needed)
    F -> L   psi_rr22/reply   128 Chou–Orlandi points B_j (F's choice bits are Δ)
             (both parties now encode, de-duplicate and digest their IDs)
    L -> F   psi_rr22/u       n, m = OKVS columns, the OKVS hash key, the IKNP matrix U of the VOLE's
                              correlated OTs
    F -> L   psi_rr22/ggm     |Y|, GGM level sums (encrypted), Gilboa corrections: the silent VOLE
                              (L holds a, c and F holds b, Δ with c = b + aΔ, length m)
    L -> F   psi_rr22/okvs    the OKVS hash key and P + a in chunks, P = Encode{(x, H'(x)) : x in X};
                              a = G e needs only L's own noise, so this goes out before ggm is read
    F -> L   psi_rr22/ack     flow control of the OKVS chunks
    F -> L   psi_rr22/oprf    for y in Y in a fresh secret random order:
                              H_o(y, Decode(B, y) + (Decode(P + a, y) + H'(y)) Δ), ℓ bytes
    L        computes c from ggm and its own H_o(x, Decode(C, x)) while F decodes, then compares:
             x in X∩Y and its position in F's list
    L -> F   psi_rr22/result  (reveal mode) positions in F's list of the common IDs, agreed order

Why it works (RS21 §4): Decode is linear and c = b + aΔ, so
``Decode(B, y) + (Decode(P + a, y) + H'(y)) Δ = Decode(C, y) + (Decode(P, y) + H'(y)) Δ``, which
is L's ``Decode(C, y)`` exactly when ``Decode(P, y) = H'(y)``, i.e. for y in X;
for y not in X the difference is a non-zero multiple of the secret Δ.

Parameters and what they give (λ = 128 computational, σ = 40 statistical):

* OKVS (:mod:`fedhet.crypto.okvs`): random bands of w = 128 bits in
  m = ⌈1.25 n⌉ + 128 columns; failure to encode is detected (L draws a fresh hash
  key) and bounded by 2^-58 at n = 2^20 (the module states and measures it).
* VOLE (:mod:`fedhet.crypto.vole`): dual-LPN silent VOLE with the
  Expand-Convolute code as libOTe configures it by default (rate 1/2, expander
  weight 7, 24-tap convolution twice), t >= 256 regular noise blocks, GGM trees
  over IKNP correlated OTs from 128 Chou–Orlandi base OTs.
* Output length ℓ = σ + ⌈log2 n⌉ + ⌈log2 |Y|⌉ bits rounded up to bytes
  (8..16): L compares each of its n values with |Y| values, so a false match
  has probability at most 2^-σ.
* On the wire for n = |Y| = 2^20: 16 m bytes of OKVS (21 MB), ℓ |Y| bytes of
  OPRF values (10.5 MB) and under 1 MB for the VOLE.

Assumptions: semi-honest (honest-but-curious) parties; CDH for the base OTs
(as for KKRT); dual LPN with regular noise for the Expand-Convolute code; H' and H_o are
modelled as random oracles and instantiated with fixed-key AES (H' a keyed
PRP of the digest, H_o the tweakable hash π(π(v) + τ) + π(v) with tweak
τ = H'(x); a heuristic instantiation, as any of a random oracle is);
correlation robustness of fixed-key AES for the OT hashes (Guo, Katz, Wang,
Yu, S&P 2020).  Not covered: malicious parties (RR22's malicious variant is
not implemented), timing side channels.

Leakage: the same as the other backends.  L learns |Y| and X∩Y; F learns
|X| (through m) and, in reveal mode, the common list; P + a is uniform to F
(a is pseudorandom by LPN), and F's values for y not in X are pseudorandom to
L (Δ is hidden), sent in a fresh order from the OS CSPRNG.  Nothing on the
wire is a raw ID or an unkeyed hash of one.

The stages, one function each (``send_setup`` .. ``match_peer`` on L, ``answer_setup``
.. ``send_oprf`` on F), as in :mod:`.kkrt`.
"""
from __future__ import annotations

import hashlib
import os
import time
from typing import Any, Iterable, Sequence

import numpy as np

from fedhet.crypto import gf128, id_prf, okvs, ot, vole
from fedhet.crypto.ot import aes_ecb
from fedhet.parties.api import PartyError, PeerFault, ProtocolMismatch
from fedhet.parties.contract import PartyLike

from .common import (MAX_OKVS_ROWS, RR22_MAX_ITEMS, RR22_VERSION, Kind, OTPeer, PSIResult, as_id_list, available_bytes,
                     common_to_all, digest_dedupe, expect_ack, feature_inputs, feature_result, label_owner_result,
                     match_values, oprf_bytes, peak_rss_mib, receive_rows, received_rows, setup_from, traffic,
                     traffic_stats)

OKVS_WINDOW_BYTES = 64 << 20   # unacknowledged OKVS bytes in flight per feature party
_KEY_OUT = hashlib.blake2b(b"fedhet RR22 output hash", digest_size=16).digest()
_PERSON = b"fedhet-rr22"


# -------------------------------------------------------------------- hashes
def value_key(okvs_key: bytes, context: bytes) -> bytes:
    """The AES key of H' (the OKVS values), from the run's OKVS hash key and the hash context."""
    ctx = hashlib.blake2b(bytes(context), digest_size=16, person=_PERSON).digest()
    return hashlib.blake2b(bytes(okvs_key), digest_size=16, key=ctx, person=b"fedhet-rr22-val").digest()


def row_key(okvs_key: bytes, context: bytes) -> bytes:
    """The AES key of the OKVS band rows, bound to the hash context."""
    ctx = hashlib.blake2b(bytes(context), digest_size=16, person=_PERSON).digest()
    return hashlib.blake2b(bytes(okvs_key), digest_size=16, key=ctx, person=b"fedhet-rr22-row").digest()


def okvs_values(digests: np.ndarray, key: bytes) -> np.ndarray:
    """H'(x) = AES_key(x) for 128-bit digests: (n, 2) uint64 field elements."""
    return gf128.from_bytes(aes_ecb(key, digests)).copy() if len(digests) else np.zeros((0, 2), np.uint64)


def output_hash(tweak: np.ndarray, v: np.ndarray, out_bytes: int) -> np.ndarray:
    """H_o(x, v) = π(π(v) ^ τ) ^ π(v), τ = H'(x), truncated to ``out_bytes``: (n, ℓ) uint8."""
    if len(v) == 0:
        return np.zeros((0, out_bytes), np.uint8)
    pv = aes_ecb(_KEY_OUT, gf128.to_bytes(v)).reshape(-1, 16)
    y = aes_ecb(_KEY_OUT, pv ^ gf128.to_bytes(tweak)).reshape(-1, 16)
    y ^= pv
    return np.ascontiguousarray(y[:, :out_bytes])


class Rows:
    """One party's digests with their OKVS bands and H' values (for a given OKVS key)."""

    def __init__(self, digests: np.ndarray, okvs_key: bytes, context: bytes, m: int):
        self.starts, self.bands = okvs.hash_rows(digests, row_key(okvs_key, context), m)
        self.values = okvs_values(digests, value_key(okvs_key, context))
        self.order = okvs.by_start(self.starts)


def encode_set(digests: np.ndarray, context: bytes, m: int, attempts: int = 8,
               first: tuple[bytes, Rows] | None = None) -> tuple[bytes, Rows, np.ndarray]:
    """L: (OKVS key, its rows, P) for our digests, trying ``first`` (a key and its rows) if given; a
    fresh key after a (detected) failure."""
    for _ in range(attempts):
        key, rows = first if first is not None else (os.urandom(16), None)
        first = None
        rows = rows if rows is not None else Rows(digests, key, context, m)
        try:
            return key, rows, okvs.encode(rows.starts, rows.bands, rows.values, m, rows.order)
        except okvs.OKVSFailure:
            continue
    raise PartyError(f"PSI-RR22: the OKVS failed to encode {len(digests)} IDs with {attempts} fresh keys "
                     f"(each fails with probability 2^{okvs.failure_log2(len(digests)):.0f})")


def warm_up() -> float:
    """Run every compiled kernel once on tiny inputs (numba's one-time start and the load of the cached
    machine code, about half a second in a fresh process); returns the seconds it took."""
    t0 = time.perf_counter()
    id_prf.cbc_mac_many(bytes(16), [b"a"])
    keys = np.arange(64, dtype=np.uint8).reshape(4, 16)
    m = okvs.columns(len(keys))
    rows = Rows(keys, bytes(16), b"", m)
    p = okvs.encode(rows.starts, rows.bands, rows.values, m, rows.order)
    okvs.decode_two(p, p, rows.starts, rows.bands, rows.order)
    gf128.mul_const(rows.values, 3)
    gf128.weighted_sum(np.zeros((1, 128, 2), dtype=np.uint64))
    vole.code_encode([np.zeros((vole.params(4).n, 2), dtype=np.uint64)], 4)
    return time.perf_counter() - t0


def _ack(party: PartyLike, frm: str, want: int, timeout: float | None) -> None:
    expect_ack(party, frm, Kind.RR22_ACK, want, timeout, "PSI-RR22")


# --------------------------------------------------------------------- stages
class PeerRun(OTPeer):
    """L's state for one feature party: the common one and our side of the VOLE with it."""

    def __init__(self, name: str):
        super().__init__(name)
        self.receiver: vole.Receiver | None = None


def digester(dk: bytes):
    """The ID digests of a run whose digest key is ``dk``: encodings -> (n, 16) uint8."""
    return lambda enc: id_prf.cbc_mac_many(dk, enc)


def send_setup(party: PartyLike, peers: Sequence[str], reveal: bool, context: bytes,
               dk: bytes) -> dict[str, PeerRun]:
    """L, first thing: the mode, the hash context, one base-OT sender point per feature party (the
    base OTs need no IDs, so they run while both sides prepare theirs) and the digest key ``dk`` (the
    same for every feature party: our digests serve them all)."""
    runs = {p: PeerRun(p) for p in peers}
    for p, r in runs.items():
        party.send(p, Kind.RR22_SETUP, {"v": RR22_VERSION, "reveal": bool(reveal), "ctx": context, "A": r.A,
                                        "dk": dk})
    return runs


def start_vole(party: PartyLike, r: PeerRun, n: int, m: int, key: bytes, timeout: float | None) -> None:
    """L with one feature party: base OTs from its reply, then our size, the OKVS size and hash key
    and the IKNP message U."""
    reply = party.recv(r.name, Kind.RR22_REPLY, timeout=timeout)
    try:
        k0, k1 = ot.co_sender_keys(r.a, r.A, reply["B"])
    except ot.OTError as e:
        raise PeerFault(party.name, r.name, Kind.RR22_REPLY, f"PSI-RR22: {e}") from None
    r.receiver = vole.Receiver(vole.params(m), k0, k1)
    party.send(r.name, Kind.RR22_U, {"n": n, "cols": m, "key": key, "u": r.receiver.extension()})


def send_okvs(party: PartyLike, r: PeerRun, key: bytes, p: np.ndarray, timeout: float | None) -> None:
    """L: P + a in flow-controlled chunks.  a = G e is ours alone (the VOLE's noise), so this goes out
    before the feature party's VOLE answer is even read; its acknowledgements are collected later
    (:func:`own_values`)."""
    assert r.receiver is not None
    a = r.receiver.vector_a()
    a ^= p                                          # P + a, in place
    masked = gf128.to_bytes(a)
    window = max(2, OKVS_WINDOW_BYTES // (MAX_OKVS_ROWS * 16))
    for i, s in enumerate(range(0, len(masked), MAX_OKVS_ROWS)):
        while r.sent - r.acked >= window:
            _ack(party, r.name, r.acked, timeout)
            r.acked += 1
        party.send(r.name, Kind.RR22_OKVS, {"i": i, "key": key, "p": masked[s:s + MAX_OKVS_ROWS]})
        r.sent += 1


def own_values(party: PartyLike, r: PeerRun, rows: Rows, timeout: float | None) -> None:
    """L: the feature party's VOLE answer, our c, and our OPRF values at our own IDs (while the
    feature party decodes P + a); then the OKVS acknowledgements."""
    msg = party.recv(r.name, Kind.RR22_GGM, timeout=timeout)
    assert r.receiver is not None
    r.n = msg["n"]
    try:
        c = r.receiver.finish_c(msg["sums"], msg["corr"])
    except vole.VoleError as e:
        raise PeerFault(party.name, r.name, Kind.RR22_GGM, f"PSI-RR22: {e}") from None
    r.receiver = None
    ell = oprf_bytes(len(rows.starts), r.n)
    r.values = output_hash(rows.values, okvs.decode(c, rows.starts, rows.bands, rows.order), ell)
    while r.acked < r.sent:
        _ack(party, r.name, r.acked, timeout)
        r.acked += 1


def match_peer(party: PartyLike, r: PeerRun, n: int, timeout: float | None) -> np.ndarray:
    """L: the feature party's OPRF values matched with ours: for each of our IDs its position in the
    feature party's list (-1: not there)."""
    assert r.values is not None
    theirs = receive_rows(party, r.name, Kind.RR22_OPRF, r.n, (r.values.shape[1],), timeout, "PSI-RR22")
    ia, ib = match_values(r.values, theirs)
    w = np.full(n, -1, dtype=np.int64)
    w[ia] = ib
    r.values = None
    return w


def answer_setup(party: PartyLike, lo: str, timeout: float | None,
                 first: tuple[str, dict] | None = None) -> tuple[dict, vole.Sender]:
    """F, first thing: the label owner's setup (checked; ``first``: already received), answered with
    base-OT points (choices Δ)."""
    setup = setup_from(party, lo, "rr22", timeout, first)
    if setup["v"] != RR22_VERSION:
        raise ProtocolMismatch(party.name, lo, "PSI (rr22) version", RR22_VERSION, setup["v"])
    if "dk" not in setup:
        raise PeerFault(party.name, lo, Kind.RR22_SETUP, f"PSI-RR22: a version {RR22_VERSION} setup without the "
                        "digest key dk")
    delta_bits = vole.Sender.new_delta_bits()
    try:
        B, ks = ot.co_receiver_choose(setup["A"], delta_bits)
    except ot.OTError as e:
        raise PeerFault(party.name, lo, Kind.RR22_SETUP, f"PSI-RR22: {e}") from None
    party.send(lo, Kind.RR22_REPLY, {"B": B})
    return setup, vole.Sender(delta_bits, ks)


def answer_vole(party: PartyLike, lo: str, sender: vole.Sender, mine: int,
                timeout: float | None) -> tuple[dict, np.ndarray]:
    """F: L's sizes and IKNP message (checked), answered with our size, the GGM sums and corrections;
    returns L's message (n, cols, key) and our VOLE vector b."""
    msg = party.recv(lo, Kind.RR22_U, timeout=timeout)
    n, m = msg["n"], msg["cols"]
    if m != okvs.columns(n):
        raise PeerFault(party.name, lo, Kind.RR22_U, f"PSI-RR22: announces {m} OKVS columns for {n} IDs, "
                        f"expected {okvs.columns(n)}")
    # The VOLE expands a small message into O(n) memory here: a size this machine cannot hold is refused
    # before any of it is allocated (the label owner's own signed message announced it).
    need, have = vole.sender_bytes(vole.params(m)) + 32 * m, available_bytes()
    if have is not None and need > have:   # own: this machine's memory, not the label owner's fault
        raise PartyError(f"PSI-RR22: {Kind.RR22_U} from {lo!r} announces {n} IDs; the VOLE for them needs about "
                         f"{need / 2**30:.1f} GiB and this machine has {have / 2**30:.1f} GiB available")
    try:
        sums, corr = sender.respond(vole.params(m), msg["u"])
    except vole.VoleError as e:
        raise PeerFault(party.name, lo, Kind.RR22_U, f"PSI-RR22: {e}") from None
    party.send(lo, Kind.RR22_GGM, {"n": mine, "sums": sums, "corr": corr})
    return msg, sender.finish()


def receive_okvs(party: PartyLike, lo: str, m: int, timeout: float | None) -> tuple[bytes, np.ndarray]:
    """F: the OKVS key and P + a ((m, 2) uint64), each chunk acknowledged once stored."""
    out = np.empty((m, 16), dtype=np.uint8)
    got, i, key = 0, 0, b""
    while got < m:
        msg = party.recv(lo, Kind.RR22_OKVS, timeout=timeout)
        p = msg["p"]
        if msg["i"] != i or not 0 < len(p) <= m - got or (i and msg["key"] != key):
            raise PeerFault(party.name, lo, Kind.RR22_OKVS, f"PSI-RR22: chunk {msg['i']} is not chunk {i} of "
                            f"(rows<={m - got}, 16) OKVS elements under one key")
        key = msg["key"]
        out[got:got + len(p)] = p
        party.send(lo, Kind.RR22_ACK, {"i": i})
        got += len(p)
        i += 1
        party.progress(got, m, psi_okvs=got)
    return key, gf128.from_bytes(out)


def send_oprf(party: PartyLike, lo: str, values: np.ndarray, chunk: int) -> None:
    """F: its OPRF values, ``chunk`` IDs per message, in its secret order."""
    for i, s in enumerate(range(0, len(values), chunk)):
        party.send(lo, Kind.RR22_OPRF, {"i": i, "v": values[s:s + chunk]})


# ---------------------------------------------------------------------- roles
def label_owner(party: PartyLike, ids: Iterable[Any], peers: list[str], reveal_to_all: bool, *, order: str,
                chunk: int, context: bytes, timeout: float | None) -> PSIResult:
    """L's side of RR22-PSI with every feature party in ``peers`` (arguments checked by the caller,
    :func:`fedhet.protocols.psi.psi_label_owner`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    who = f"label owner {party.name!r}"
    items = as_id_list(ids, who)
    start = traffic(party, peers)
    dk = os.urandom(16)
    runs = send_setup(party, peers, reveal_to_all, context, dk)
    enc, first_rows, digests = digest_dedupe(items, who, RR22_MAX_ITEMS, digester(dk))
    n = len(enc)
    m = okvs.columns(n)
    t_hash = time.perf_counter()
    key = os.urandom(16)
    rows = Rows(digests, key, context, m)
    for r in runs.values():
        start_vole(party, r, n, m, key, timeout)
    key, rows, p = encode_set(digests, context, m, first=(key, rows))  # overlaps the feature parties' VOLE work
    t_okvs = time.perf_counter()
    for r in runs.values():
        send_okvs(party, r, key, p, timeout)
    del p
    t_sent = time.perf_counter()
    for k, r in enumerate(runs.values()):
        own_values(party, r, rows, timeout)
        party.progress(k + 1, len(runs), psi_peers=k + 1)
    t_vole = time.perf_counter()
    where = {p_: match_peer(party, r, n, timeout) for p_, r in runs.items()}
    t_match = time.perf_counter()
    uniq = common_to_all(party, peers, Kind.RR22_RESULT, where, enc, order, reveal_to_all)
    out_rows = first_rows[uniq]
    t_end = time.perf_counter()
    prm = vole.params(m)
    stats = {
        "backend": "rr22", "n_input": len(items), "n_unique": n, "peer_sizes": {p_: r.n for p_, r in runs.items()},
        "pair_sizes": {p_: int((w >= 0).sum()) for p_, w in where.items()}, "size": int(len(out_rows)),
        "workers": 0, "chunk": chunk, "okvs_columns": m, "okvs_band": okvs.BAND_WIDTH,
        "okvs_failure_log2": okvs.failure_log2(n), "vole_trees": prm.t, "vole_depth": prm.depth,
        "vole_cots": prm.cots, "out_bytes": {p_: oprf_bytes(n, r.n) for p_, r in runs.items()},
        "total_s": t_end - t0, "cpu_s": time.process_time() - c0, "hash_s": t_hash - t0,
        "okvs_s": t_okvs - t_hash, "send_okvs_s": t_sent - t_okvs, "vole_s": t_vole - t_sent,
        "match_s": t_match - t_vole, "order_s": t_end - t_match, "max_rss_mib": peak_rss_mib(),
        **traffic_stats(party, peers, start),
    }
    return label_owner_result(items, out_rows, stats)


def feature_party(party: PartyLike, ids: Iterable[Any], lo: str, *, chunk: int, timeout: float | None,
                  first: tuple[str, dict] | None = None) -> PSIResult:
    """F's side of :func:`label_owner` (arguments checked by :func:`fedhet.protocols.psi.psi_feature_party`)."""
    t0, c0 = time.perf_counter(), time.process_time()
    start = traffic(party, [lo])
    setup, sender = answer_setup(party, lo, timeout, first)   # the digest key first, then our IDs
    items, _, enc, first_rows, digests, perm = feature_inputs(party, ids, lo, RR22_MAX_ITEMS, digester(setup["dk"]))
    mine = len(enc)   # from here on our IDs are in a secret random order
    t_setup = time.perf_counter()
    msg, b = answer_vole(party, lo, sender, mine, timeout)
    n, m = msg["n"], msg["cols"]
    rows = Rows(digests, msg["key"], setup["ctx"], m)     # while the label owner finishes the VOLE
    t_vole = time.perf_counter()
    key, pa = receive_okvs(party, lo, m, timeout)
    if key != msg["key"]:                                  # the label owner re-keyed its OKVS
        rows = Rows(digests, key, setup["ctx"], m)
    t_okvs = time.perf_counter()
    d_p, d_b = okvs.decode_two(pa, b, rows.starts, rows.bands, rows.order)
    del pa, b
    d_p ^= rows.values
    v = gf128.mul_const(d_p, sender.delta)
    v ^= d_b
    ell = oprf_bytes(n, mine)
    send_oprf(party, lo, output_hash(rows.values, v, ell), chunk)
    t_sent = time.perf_counter()
    out_rows = received_rows(party.name, party.recv(lo, Kind.RR22_RESULT, timeout=timeout), lo, Kind.RR22_RESULT, perm,
                             first_rows) if setup["reveal"] else None
    t_end = time.perf_counter()
    stats = {
        "backend": "rr22", "n_input": len(items), "n_unique": mine, "label_owner_size": n,
        "size": None if out_rows is None else len(out_rows), "workers": 0, "chunk": chunk, "okvs_columns": m,
        "out_bytes": ell, "total_s": t_end - t0, "cpu_s": time.process_time() - c0,
        "setup_s": t_setup - t0, "vole_s": t_vole - t_setup, "wait_okvs_s": t_okvs - t_vole,
        "oprf_s": t_sent - t_okvs, "wait_result_s": t_end - t_sent, "max_rss_mib": peak_rss_mib(),
        **traffic_stats(party, [lo], start),
    }
    return feature_result(items, out_rows, stats)
