"""Oblivious transfer for KKRT16: Chou–Orlandi base OTs and the KKRT OT extension, on library primitives.

Nothing here talks to the network; ``fedhet.protocols.psi.kkrt`` moves the
messages.  Primitives come from libraries: edwards25519 group operations from
libsodium (PyNaCl's ``crypto_core_ed25519_*`` / ``crypto_scalarmult_ed25519_*``),
AES-128 (CTR, ECB) from ``cryptography`` (OpenSSL, AES-NI), BLAKE2b from
``hashlib``.  This module only composes them.

Base OT: Chou & Orlandi, "The Simplest Protocol for Oblivious Transfer"
(LATINCRYPT 2015), batched with one sender message for all ``k`` OTs.  Sender
secret a, ``A = aG``; the receiver with choice c_j and fresh b_j sends
``B_j = b_j G`` (c_j = 0) or ``A + b_j G`` (c_j = 1); the sender's keys are
``k_j^0 = H(j, A, B_j, a B_j)`` and ``k_j^1 = H(j, A, B_j, a (B_j - A))``, the
receiver's ``k_j^{c_j} = H(j, A, B_j, b_j A)``.  Semi-honest security rests on
CDH in the prime-order subgroup of edwards25519 with H (BLAKE2b-128,
personalised, index- and transcript-bound) a random oracle.  Known caveats:
(1) the paper's claim of UC security against malicious parties does not hold
(Genç, Iovino, Rial, "The simplest protocol for oblivious transfer revisited",
IPL 2020 / ePrint 2017/370; Hauck & Loss, ePrint 2017/1011): we rely on it
only against semi-honest parties; (2) points from the peer must be checked to
be in the prime-order subgroup (cofactor 8): :func:`co_receiver_choose` and
:func:`co_sender_keys` refuse any point libsodium's ``is_valid_point`` rejects
(small order, off-curve, non-canonical); (3) the receiver's message is not
bound to a session by itself: the key hash includes ``A`` and ``B_j`` and the
OT index, and ``a`` and the ``b_j`` are fresh per run.

OT extension: Kolesnikov, Kumaresan, Rosulek, Trieu, "Efficient Batched
Oblivious PRF with Applications to Private Set Intersection" (CCS 2016, ePrint
2016/799): the 1-out-of-∞ extension of IKNP with a pseudorandom code, their
BaRK-OPRF (KKRT16 §3; section numbers as we read the ePrint version, the
paper was not at hand offline to re-check them).  The roles are inverted with
respect to the base OTs: the OT-extension receiver R (inputs r_i, one per
cuckoo bin) is the base-OT *sender* with seed pairs (k_j^0, k_j^1), j < k; the
OT-extension sender S is the base-OT receiver with secret choice bits s in
{0,1}^k.  With G the PRG (AES-128-CTR keyed by a seed, one column of m bits
per seed)::

    R:  T = G(k^0) (columns),  U = T xor G(k^1) xor C(r)   (rows: u_i = t_i xor g1_i xor C(r_i))
    S:  Q = G(k^s) xor (U and s)   so that   q_i = t_i xor (C(r_i) and s)
    OPRF:  F_i(x) = H(q_i xor (C(x) and s)),  R's output H(t_i) = F_i(r_i).

Parameters: κ = 128 (seed and AES key length); code width ``k = 512`` bits
(four AES blocks).  KKRT16 size the pseudorandom code so that, except with
probability 2^-σ, the codewords of all inputs of a run are pairwise at Hamming
distance at least κ; for 2^20 items and σ = 40 that width is below 512 bits
(issue 16 quotes 424), and 512 is what their implementation (libOTe's
``KkrtNcoOt*``, four blocks) uses.  C is the pseudorandom code
``C_j(x) = AES_{K_{j,0}}(x) || ... || AES_{K_{j,3}}(x)`` on a 128-bit input x
with keys derived from a per-run code seed and the cuckoo hash index j (so the
PSI's ``x || j`` needs no extra input bits).

H, the correlation-robust hash, is fixed-key AES: ``H(y) = xor_k
(π(y_k xor τ_k) xor y_k xor τ_k)`` over the four 128-bit blocks y_k of a row,
with π = AES-128 under a fixed public key and τ_k a per-position tweak, i.e.
the Matyas–Meyer–Oseas form π(x) xor x that Guo, Katz, Wang, Yu ("Efficient and
Secure Multiparty Computation from Fixed-Key Block Ciphers", S&P 2020) prove
correlation robust for a random permutation, summed over blocks as libOTe's
KKRT implementation does (its ``AES_HASH`` option).  Outputs are truncated to
the PSI's ℓ bytes.

Bit matrices: bit j of a row (a codeword) is bit ``j % 8`` of byte ``j // 8``
("little" bit order); a column of m bins is m/8 bytes in the same order.
:func:`transpose_bits` turns (k, m/8) column bytes into (m, k/8) row bytes with
64x64-bit-block transpositions on uint64 words (six mask-and-shift swap
stages, Hacker's Delight §7-3), vectorised over all blocks in numpy.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from nacl import bindings as sodium

KAPPA = 128                 # computational security: seed / AES key bits
CODE_BITS = 512             # KKRT code width k = number of base OTs
CODE_BYTES = CODE_BITS // 8
BLOCK = 16
POINT_BYTES = 32
N_HASHES = 3                # cuckoo hash functions; each has its own code keys
_OT_PERSON = b"fedhet-co-ot"
_CODE_PERSON = b"fedhet-kkrt-prc"
# The fixed public key of the correlation-robust hash (any fixed key works for
# the ideal-permutation argument; this is BLAKE2b-128 of a label, so it is
# reproducible and not chosen by either party).
_FIXED_KEY = hashlib.blake2b(b"fedhet KKRT16 fixed-key AES hash", digest_size=16).digest()
_TWEAKS = np.frombuffer(hashlib.blake2b(b"fedhet KKRT16 hash tweaks", digest_size=64).digest(),
                        dtype=np.uint8).reshape(1, CODE_BYTES)


class OTError(ValueError):
    """A peer's OT message is malformed (e.g. a point outside the prime-order subgroup)."""


# ---------------------------------------------------------------- AES helpers
def aes_ecb(key: bytes, data) -> np.ndarray:
    """AES-128-ECB of a whole buffer (a multiple of 16 bytes) in one OpenSSL call, as uint8."""
    arr = np.ascontiguousarray(data, dtype=np.uint8)
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint8)
    buf = memoryview(arr.reshape(-1).data)
    out = bytearray(len(buf) + BLOCK)
    enc = Cipher(algorithms.AES(bytes(key)), modes.ECB()).encryptor()
    n = enc.update_into(buf, out)
    return np.frombuffer(out, dtype=np.uint8, count=n)


def prg_columns(seeds: np.ndarray, start_block: int, n_blocks: int) -> np.ndarray:
    """G(seed) restricted to 128-bit blocks [start_block, start_block + n_blocks) for every seed.

    G is AES-128-CTR keyed by the seed with the 128-bit big-endian counter
    starting at 0, encrypting zeros: so any range of a column is computed on
    its own, which lets both sides stream the bit matrix in chunks of bins.
    Returns (len(seeds), 16 * n_blocks) uint8.
    """
    seeds = np.ascontiguousarray(seeds, dtype=np.uint8).reshape(-1, BLOCK)
    nbytes = BLOCK * int(n_blocks)
    out = np.empty((len(seeds), nbytes), dtype=np.uint8)
    zeros = bytes(nbytes)
    nonce = int(start_block).to_bytes(16, "big")
    buf = bytearray(nbytes + BLOCK)
    for j in range(len(seeds)):
        enc = Cipher(algorithms.AES(seeds[j].tobytes()), modes.CTR(nonce)).encryptor()
        enc.update_into(zeros, buf)
        out[j] = np.frombuffer(buf, dtype=np.uint8, count=nbytes)
    return out


# ------------------------------------------------------------ bit transposition
_M1, _M2, _M3 = np.uint64(0x00AA00AA00AA00AA), np.uint64(0x0000CCCC0000CCCC), np.uint64(0x00000000F0F0F0F0)
_S1, _S2, _S3 = np.uint64(7), np.uint64(14), np.uint64(28)
_SWAP64 = [(np.uint64(j), np.uint64(mask)) for j, mask in (
    (32, 0x00000000FFFFFFFF), (16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF),
    (4, 0x0F0F0F0F0F0F0F0F), (2, 0x3333333333333333), (1, 0x5555555555555555))]


def transpose_bits(cols: np.ndarray) -> np.ndarray:
    """Bit-transpose a (k, M) uint8 matrix of k columns of 8M bits into (8M, k/8) row bytes.

    ``out[i, j // 8]`` bit ``j % 8`` == ``cols[j, i // 8]`` bit ``i % 8``.  k must be a multiple of 8.
    With k a multiple of 64 and M of 8 (the OT extension's case) it runs on 64x64-bit blocks
    in place (:func:`_transpose_64`), else on 8x8-bit blocks (:func:`_transpose_8`).
    """
    cols = np.asarray(cols, dtype=np.uint8)
    k, m = cols.shape
    if k % 8:
        raise ValueError(f"transpose_bits: the number of columns must be a multiple of 8, got {k}")
    if k % 64 == 0 and m % 8 == 0:
        return _transpose_64(cols)
    return _transpose_8(cols)


def _transpose_64(cols: np.ndarray) -> np.ndarray:
    """64x64-bit block transposition by six swap stages (Hacker's Delight §7-3), over all blocks at once.

    A[g, r, w] (uint64) is word w of column 64g + r, i.e. bits of bins 64w..64w+63; stage j swaps
    the j-bit sub-blocks above the diagonal with those below it, between rows r and r + j.
    Afterwards A[g, b, w] bit r is column 64g + r's bit for bin 64w + b: row 64w + b's word g.
    """
    k, m = cols.shape
    w = m // 8
    a = np.array(cols, dtype=np.uint8, order="C").view("<u8").reshape(k // 64, 64, w)  # a copy: worked in place
    buf = np.empty(a.size // 2, dtype=np.uint64)
    for j, mask in _SWAP64:
        v = a.reshape(k // 64, 64 // (2 * int(j)), 2, int(j), w)
        lo, hi = v[:, :, 0], v[:, :, 1]
        t = buf.reshape(lo.shape)
        np.right_shift(lo, j, out=t)
        np.bitwise_xor(t, hi, out=t)
        np.bitwise_and(t, mask, out=t)
        np.bitwise_xor(hi, t, out=hi)
        np.left_shift(t, j, out=t)
        np.bitwise_xor(lo, t, out=lo)
    return np.ascontiguousarray(a.transpose(2, 1, 0)).view(np.uint8).reshape(8 * m, k // 8)


def _transpose_8(cols: np.ndarray) -> np.ndarray:
    """8x8-bit block transposition on uint64 words (three mask-and-shift steps), any k multiple of 8."""
    k, m = cols.shape
    # x[c, g] holds the 8 bytes cols[8g + r, c], r = 0..7: one 8x8 bit block, bit 8r + b
    # (a copy even where the transpose is already contiguous: the steps below work in place)
    x = cols.reshape(k // 8, 8, m).transpose(2, 0, 1).copy(order="C").view("<u8").reshape(m, k // 8)
    t = np.empty_like(x)
    for mask, sh in ((_M1, _S1), (_M2, _S2), (_M3, _S3)):
        np.right_shift(x, sh, out=t)
        np.bitwise_xor(t, x, out=t)
        np.bitwise_and(t, mask, out=t)
        np.bitwise_xor(x, t, out=x)
        np.left_shift(t, sh, out=t)
        np.bitwise_xor(x, t, out=x)
    # now byte b of x[c, g] is row 8c + b's byte g
    return np.ascontiguousarray(x.view(np.uint8).reshape(m, k // 8, 8).transpose(0, 2, 1)).reshape(8 * m, k // 8)


def transpose_bits_reference(cols: np.ndarray) -> np.ndarray:
    """The same transposition through unpackbits/packbits (slow; the tests' reference)."""
    bits = np.unpackbits(np.asarray(cols, dtype=np.uint8), axis=1, bitorder="little")
    return np.packbits(np.ascontiguousarray(bits.T), axis=1, bitorder="little")


def pack_choice_bits(bits: np.ndarray) -> np.ndarray:
    """k choice bits (0/1) as the k/8-byte row mask used to AND codewords."""
    return np.packbits(np.asarray(bits, dtype=np.uint8), bitorder="little")


# ------------------------------------------------------------------ base OT
def _random_scalar() -> bytes:
    # uniform mod l: reduce 512 random bits (bias < 2^-250)
    return sodium.crypto_core_ed25519_scalar_reduce(os.urandom(64))


def _check_point(p: bytes, what: str) -> bytes:
    p = bytes(p)
    if len(p) != POINT_BYTES or not sodium.crypto_core_ed25519_is_valid_point(p):
        raise OTError(f"{what} is not a valid edwards25519 point of the prime-order subgroup")
    return p


def _ot_key(j: int, A: bytes, B: bytes, P: bytes) -> bytes:
    return hashlib.blake2b(j.to_bytes(4, "little") + A + B + P, digest_size=BLOCK, person=_OT_PERSON).digest()


def co_sender_setup() -> tuple[bytes, bytes]:
    """The base-OT sender's fresh secret scalar a and public point A = aG."""
    a = _random_scalar()
    return a, sodium.crypto_scalarmult_ed25519_base_noclamp(a)


def co_receiver_choose(A: bytes, choices, scalars: list[bytes] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For choice bits c_j: the points B_j to send, (k, 32) uint8, and the chosen keys k_j^{c_j}, (k, 16) uint8.

    ``scalars`` (the b_j) is for known-answer tests only; by default they are fresh.
    """
    A = _check_point(A, "the base-OT sender's point A")
    c = np.asarray(choices, dtype=np.uint8).ravel()
    if c.size and c.max() > 1:
        raise ValueError("choice bits must be 0 or 1")
    Bs, keys = [], []
    for j, cj in enumerate(c.tolist()):
        b = scalars[j] if scalars is not None else _random_scalar()
        bG = sodium.crypto_scalarmult_ed25519_base_noclamp(b)
        B = sodium.crypto_core_ed25519_add(A, bG) if cj else bG
        Bs.append(B)
        keys.append(_ot_key(j, A, B, sodium.crypto_scalarmult_ed25519_noclamp(b, A)))
    return (np.frombuffer(b"".join(Bs), dtype=np.uint8).reshape(-1, POINT_BYTES).copy(),
            np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(-1, BLOCK).copy())


def co_sender_keys(a: bytes, A: bytes, B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sender's two keys per OT, (k0, k1), each (k, 16) uint8, from the receiver's points B (k, 32)."""
    B = np.ascontiguousarray(B, dtype=np.uint8).reshape(-1, POINT_BYTES)
    aA = sodium.crypto_scalarmult_ed25519_noclamp(a, A)
    k0, k1 = [], []
    for j in range(len(B)):
        Bj = _check_point(B[j].tobytes(), f"the base-OT receiver's point #{j}")
        aB = sodium.crypto_scalarmult_ed25519_noclamp(a, Bj)
        k0.append(_ot_key(j, A, Bj, aB))
        k1.append(_ot_key(j, A, Bj, sodium.crypto_core_ed25519_sub(aB, aA)))  # a(B - A) = aB - aA
    as_arr = lambda ks: np.frombuffer(b"".join(ks), dtype=np.uint8).reshape(-1, BLOCK).copy()  # noqa: E731
    return as_arr(k0), as_arr(k1)


# ------------------------------------------------------------ pseudorandom code
class PseudorandomCode:
    """C_j(x): four AES-128 blocks of a 128-bit input under keys derived from a seed and hash index j."""

    def __init__(self, seed: bytes, n_hashes: int = N_HASHES):
        if len(seed) != BLOCK:
            raise ValueError(f"code seed must be {BLOCK} bytes, got {len(seed)}")
        self.seed = bytes(seed)
        self.keys = [[hashlib.blake2b(bytes([j, i]), digest_size=BLOCK, key=self.seed, person=_CODE_PERSON).digest()
                      for i in range(CODE_BYTES // BLOCK)] for j in range(n_hashes)]

    def encode(self, x: np.ndarray, j: int) -> np.ndarray:
        """Codewords of 128-bit inputs x (n, 16) under hash index j: (n, 64) uint8."""
        x = np.ascontiguousarray(x, dtype=np.uint8).reshape(-1, BLOCK)
        out = np.empty((len(x), CODE_BYTES), dtype=np.uint8)
        for i, key in enumerate(self.keys[j]):
            out[:, BLOCK * i:BLOCK * (i + 1)] = aes_ecb(key, x).reshape(-1, BLOCK)
        return out


# ------------------------------------------------------------ correlation-robust hash
def cr_hash(rows: np.ndarray, out_bytes: int) -> np.ndarray:
    """H(y) = xor over blocks k of (π(y_k ^ τ_k) ^ y_k ^ τ_k), fixed-key AES π; (n, 64) -> (n, out_bytes)."""
    if not 1 <= out_bytes <= BLOCK:
        raise ValueError(f"out_bytes must be in 1..{BLOCK}, got {out_bytes}")
    y = np.bitwise_xor(np.asarray(rows, dtype=np.uint8).reshape(-1, CODE_BYTES), _TWEAKS)
    z = aes_ecb(_FIXED_KEY, y).reshape(-1, CODE_BYTES)
    z = np.bitwise_xor(z, y, out=np.empty_like(y)).view("<u8").reshape(-1, CODE_BYTES // 8)
    acc = z[:, 0:2] ^ z[:, 2:4]
    acc ^= z[:, 4:6]
    acc ^= z[:, 6:8]
    return np.ascontiguousarray(acc).view(np.uint8)[:, :out_bytes].copy()


# ------------------------------------------------------------------ OT extension
def _block_range(start_bin: int, n_bins: int) -> tuple[int, int]:
    if start_bin % KAPPA or n_bins % KAPPA:
        raise ValueError(f"OT-extension chunks start and end on multiples of {KAPPA} bins, "
                         f"got start {start_bin}, {n_bins} bins")
    return start_bin // KAPPA, n_bins // KAPPA


class KkrtReceiver:
    """The OT-extension receiver (PSI label owner): base-OT sender keys (k0, k1), each (k, 16)."""

    def __init__(self, k0: np.ndarray, k1: np.ndarray):
        self.k0 = np.ascontiguousarray(k0, dtype=np.uint8).reshape(CODE_BITS, BLOCK)
        self.k1 = np.ascontiguousarray(k1, dtype=np.uint8).reshape(CODE_BITS, BLOCK)

    def chunk(self, codes: np.ndarray, start_bin: int) -> tuple[np.ndarray, np.ndarray]:
        """For bins [start_bin, start_bin + len(codes)) with codewords ``codes`` (n, 64):
        (U rows to send, T rows kept), each (n, 64) uint8."""
        codes = np.asarray(codes, dtype=np.uint8).reshape(-1, CODE_BYTES)
        b0, nb = _block_range(start_bin, len(codes))
        g0 = prg_columns(self.k0, b0, nb)
        g1 = prg_columns(self.k1, b0, nb)
        np.bitwise_xor(g1, g0, out=g1)
        t = transpose_bits(g0)
        u = transpose_bits(g1)
        np.bitwise_xor(u, codes, out=u)
        return u, t


class KkrtSender:
    """The OT-extension sender (PSI feature party): choice bits s (k,) and the chosen keys k^s (k, 16)."""

    def __init__(self, s_bits: np.ndarray, ks: np.ndarray):
        self.s_bits = np.asarray(s_bits, dtype=np.uint8).ravel()
        if self.s_bits.size != CODE_BITS:
            raise ValueError(f"need {CODE_BITS} choice bits, got {self.s_bits.size}")
        self.s_mask = pack_choice_bits(self.s_bits)
        self.ks = np.ascontiguousarray(ks, dtype=np.uint8).reshape(CODE_BITS, BLOCK)

    @staticmethod
    def new_choices() -> np.ndarray:
        """Fresh secret choice bits s from the OS CSPRNG."""
        return np.unpackbits(np.frombuffer(os.urandom(CODE_BYTES), dtype=np.uint8), bitorder="little")

    def chunk(self, u: np.ndarray, start_bin: int) -> np.ndarray:
        """Q rows for bins [start_bin, start_bin + len(u)) from the receiver's U rows: (n, 64) uint8."""
        u = np.asarray(u, dtype=np.uint8).reshape(-1, CODE_BYTES)
        b0, nb = _block_range(start_bin, len(u))
        q = transpose_bits(prg_columns(self.ks, b0, nb))
        q ^= u & self.s_mask
        return q

    def masked(self, codes: np.ndarray) -> np.ndarray:
        """C(x) and s, row-wise (what the sender XORs into q to evaluate the OPRF at x)."""
        return np.bitwise_and(codes, self.s_mask)


# ------------------------------------------------------- IKNP correlated OT
IKNP_BITS = KAPPA           # base OTs of the IKNP extension: one per bit of the correlation Δ


def _iknp_blocks(n_ots: int) -> int:
    if n_ots <= 0 or n_ots % KAPPA:
        raise ValueError(f"IKNP extends to a positive multiple of {KAPPA} OTs, got {n_ots}")
    return n_ots // KAPPA


def iknp_receiver(k0: np.ndarray, k1: np.ndarray, choices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IKNP (Ishai, Kilian, Nissim, Petrank, CRYPTO 2003) correlated OTs, receiver side.

    With base-OT sender keys ``k0``, ``k1`` (128, 16) and ``choices`` r (M bits, M a multiple of
    128): returns (U to send: (128, M/8) uint8 columns ``G(k0_j) ^ G(k1_j) ^ r``, T kept: (M, 16)
    uint8 rows of the columns ``G(k0_j)``).  The sender's rows then satisfy
    ``T_i = Q_i ^ r_i Δ``, Δ its 128 base-OT choice bits (:func:`iknp_sender`), so T_i is one of
    the two 128-bit messages Q_i, Q_i ^ Δ of a correlated OT with global Δ, chosen by r_i.
    G is :func:`prg_columns` (AES-128-CTR keyed by the base-OT key).
    """
    r = np.asarray(choices, dtype=np.uint8).ravel()
    nb = _iknp_blocks(len(r))
    g0 = prg_columns(np.asarray(k0).reshape(IKNP_BITS, BLOCK), 0, nb)
    u = prg_columns(np.asarray(k1).reshape(IKNP_BITS, BLOCK), 0, nb)
    u ^= g0
    u ^= np.packbits(r, bitorder="little")[None, :]
    return u, transpose_bits(g0)


def iknp_sender(delta_bits: np.ndarray, ks: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The IKNP sender's rows Q (M, 16) uint8 from its base-OT choice bits Δ (128,), the keys it
    chose ``ks`` (128, 16) and the receiver's U (128, M/8): ``Q_i = T_i ^ r_i Δ``."""
    s = np.asarray(delta_bits, dtype=np.uint8).ravel()
    u = np.asarray(u, dtype=np.uint8)
    if s.size != IKNP_BITS or u.ndim != 2 or u.shape[0] != IKNP_BITS:
        raise ValueError(f"IKNP: want {IKNP_BITS} choice bits and U of {IKNP_BITS} columns, got {s.size}, {u.shape}")
    nb = _iknp_blocks(8 * u.shape[1])
    q = prg_columns(np.asarray(ks).reshape(IKNP_BITS, BLOCK), 0, nb)
    q ^= u * s[:, None]
    return transpose_bits(q)
