"""Silent VOLE over GF(2^128): GGM-tree punctured PRFs and an Expand-Convolute code (dual LPN).

After the protocol the receiver R holds vectors a, c and the sender S holds
Δ and b, all in GF(2^128) (:mod:`fedhet.crypto.gf128`), with

    c = b + a·Δ        (element-wise, length m; a pseudorandom to S, Δ and b to R)

Nothing here talks to a network: :class:`Receiver` and :class:`Sender` make
and take the messages; ``fedhet.protocols.psi.rr22`` moves them.  The
construction is the PCG of Boyle, Couteau, Gilboa, Ishai, Kohl, Scholl
("Efficient Pseudorandom Correlation Generators: Silent OT Extension and
More", CRYPTO 2019) with the Expand-Convolute code of Raghuraman, Rindal,
Tanguy ("Expand-Convolute Codes for Pseudorandom Correlation Generators
from LPN", CRYPTO 2023), as libOTe configures it by default ("ExConv7x24")
and RR22-class PSI uses it:

1. **Base OTs and IKNP.**  128 Chou–Orlandi OTs (R sends, S chooses with the
   bits of Δ), extended by IKNP (:func:`fedhet.crypto.ot.iknp_receiver`) to
   ``cots`` correlated OTs ``T_j = Q_j + r_j Δ`` with choice bits r_j that R
   picks.
2. **Sparse VOLE.**  The length-N vector (N = t 2^d) is cut into t blocks of
   2^d.  S expands a GGM tree per block from a fresh seed (children
   ``AES_kL(x) ^ x`` and ``AES_kR(x) ^ x``, fixed public keys) to leaves v.
   R has a secret point α_τ and a secret non-zero value β_τ per block; for
   each tree level S sends the XOR of all left and of all right children, each
   encrypted under the hash of a correlated OT (``H(j, Q_j)`` and
   ``H(j, Q_j ^ Δ)``, H the tweakable correlation-robust hash
   ``π(π(x) ^ j) ^ π(x)`` of Guo, Katz, Wang, Yu, S&P 2020); R chose r_j as
   the complement of α's bit, so it learns every leaf but v_α.  Then 128
   more correlated OTs chosen by the bits of β give Gilboa's product
   ``Σ_k x^k T_k = Σ_k x^k Q_k + β Δ`` (:func:`fedhet.crypto.gf128.weighted_sum`);
   S sends ``Σ_k x^k Q_k + Σ_i v_i`` and R solves for ``w_α = v_α + β Δ``.  Now
   ``w = v + e Δ`` with e the t-sparse vector of the β's.
3. **Compression.**  Both apply the same public linear map G (m x N) to their
   vectors: ``a = G e``, ``c = G w``, ``b = G v`` (:func:`code_encode`).  G is
   the systematic Expand-Convolute code: the first m positions pass through,
   the other N - m are convolved twice (each position added to the next 24
   under pseudorandom taps and always to the 25th, cyclically) and then
   expanded (each output adds 7 of them: 4 from equal regions, 3 uniform).
   The code is public and fixed (SplitMix64 of a fixed seed).

Security (semi-honest): S learns nothing of α, β (IKNP receiver privacy);
R learns nothing of v_α or Δ (the punctured PRF's value at α and the OT
hash), so ``a = G e`` is pseudorandom to S by dual LPN with regular noise
for this code (the assumption), and b, Δ stay hidden from R.  Parameters
(:func:`params`): N = t 2^d >= 2m (rate 1/2 or less; N < 2m + 2^d), t
regular-noise blocks with ``t >= -128 / log2(1 - 2 δ)`` for the relative
minimum distance δ = 0.15 that libOTe estimates for this code, rounded up to
8 (256 blocks; libOTe's rule for λ = 128 against linear attacks).  Silver
codes are not used: they are broken (Raghuraman–Rindal–Tanguy, CRYPTO 2023).
The assumption is the dual-LPN one of the papers above for this code family,
with libOTe's parameter estimate; it is not a proof of this instance.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from . import gf128
from .ot import BLOCK, KAPPA, aes_ecb, iknp_receiver, iknp_sender

MIN_DIST = 0.15               # assumed relative minimum distance of the code (libOTe's estimate for ExConv7x24)
SEC_BITS = 128
EXPANDER_WEIGHT = 7           # B: 4 regular and 3 uniform columns per row
ACC_WEIGHT = 24               # A: 24 random taps and one fixed one per position
CODE_SEED = int.from_bytes(hashlib.blake2b(b"fedhet ExConv code seed", digest_size=8).digest(), "little")
_KEY_L = hashlib.blake2b(b"fedhet GGM left", digest_size=16).digest()
_KEY_R = hashlib.blake2b(b"fedhet GGM right", digest_size=16).digest()
_KEY_H = hashlib.blake2b(b"fedhet COT hash", digest_size=16).digest()


class VoleError(ValueError):
    """A VOLE message does not have the shape the parameters say."""


@dataclass(frozen=True)
class Params:
    """m outputs from t GGM trees of depth d (N = t 2^d noise positions), expander weight."""
    m: int
    t: int
    depth: int
    weight: int = EXPANDER_WEIGHT

    @property
    def n(self) -> int:
        return self.t << self.depth

    @property
    def cots(self) -> int:
        """Correlated OTs needed: d per tree (the GGM levels) and 128 per tree (β), rounded up to 128."""
        k = self.t * (self.depth + KAPPA)
        return -(-k // KAPPA) * KAPPA


def sender_bytes(p: Params) -> int:
    """Peak working memory of the sender's side for parameters p (GGM levels, leaves and the code's
    copies: about 5 arrays of N 16-byte blocks), in bytes."""
    return 5 * p.n * BLOCK + p.cots * BLOCK


def noise_blocks(min_dist: float = MIN_DIST, sec: int = SEC_BITS) -> int:
    """t: the regular noise weight for bit security ``sec`` against linear tests, -sec / log2(1 - 2 δ),
    rounded up to a multiple of 8 (256 for δ = 0.15)."""
    t = math.ceil(-sec / math.log2(1.0 - 2.0 * min_dist))
    return -(-t // 8) * 8


def params(m: int) -> Params:
    """Parameters for m VOLE outputs: t >= :func:`noise_blocks` trees of depth d with N = t 2^d >= 2m.

    Of the depths that allow it, the one with the least work: correlated OTs (t (d + 128), which
    cost bytes) plus the noise positions over 16 (N, which cost time).
    """
    if m <= 0:
        raise ValueError(f"VOLE length must be positive, got {m}")
    t0 = noise_blocks()
    best = None
    for depth in range(1, 48):
        t = max(t0, -(-2 * m // (1 << depth)))
        cost = t * (depth + KAPPA) + (t << depth) / 16
        if best is None or cost < best[0]:
            best = (cost, t, depth)
        if t == t0:
            break
    assert best is not None
    return Params(m=int(m), t=int(best[1]), depth=best[2])


# ------------------------------------------------------------------ kernels
@njit(cache=True, inline="always")
def _splitmix(x):  # pragma: no cover - compiled
    x = x + np.uint64(0x9E3779B97F4A7C15)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x, z ^ (z >> np.uint64(31))


@njit(cache=True)
def _convolute(x, seed):  # pragma: no cover - compiled
    """The convolution A on x (size, words) uint64 in place, every word column alike.

    Its definition: for i = 0, 1, ..., size - 1 in turn, row i is added to each row i+1+k
    (k = 0..23) whose tap bit k of z_i is set, and always to row i+25, indices mod size; z_i is the
    i-th SplitMix64 output of ``seed``.  Computed here in the equivalent gather form: row j
    collects rows j-1 .. j-25 (masks, no branches), then the last 25 rows' wrap-around additions to
    rows 0 .. 24 come last (size > 50, so those rows are no longer read).
    """
    size, nw = x.shape
    z = np.empty(size, np.uint64)
    state = np.uint64(seed)
    for i in range(size):
        state, zi = _splitmix(state)
        z[i] = zi
    one = np.uint64(1)
    for j in range(size):
        for q in range(nw):
            acc = x[j, q]
            for k in range(ACC_WEIGHT):
                i = j - 1 - k
                if i >= 0:
                    acc ^= x[i, q] & (np.uint64(0) - ((z[i] >> np.uint64(k)) & one))
            if j > ACC_WEIGHT:
                acc ^= x[j - 1 - ACC_WEIGHT, q]
            x[j, q] = acc
    for i in range(size - ACC_WEIGHT - 1, size):
        for k in range(ACC_WEIGHT + 1):
            j = i + 1 + k
            if j >= size and (k == ACC_WEIGHT or (z[i] >> np.uint64(k)) & one):
                for q in range(nw):
                    x[j - size, q] ^= x[i, q]


@njit(cache=True, parallel=True)
def _convolute_all(xs, seed):  # pragma: no cover - compiled
    """:func:`_convolute` of every vector xs[v] ((nv, size, 2)), the vectors on parallel threads."""
    for v in prange(xs.shape[0]):
        _convolute(xs[v], seed)


EXPAND_BLOCK = 256   # rows whose columns are drawn before their reads: the reads of a block overlap in memory


@njit(cache=True, parallel=True)
def _expand(xs, out, weight, seed):  # pragma: no cover - compiled
    """out[v, i] ^= XOR of xs[v]'s rows at row i's columns (xs (nv, size, 2), out (nv, m, 2) uint64).

    Row i has ``weight - weight // 2`` regular columns (one uniform in each of that many equal
    regions) and ``weight // 2`` uniform ones, from draws i*weight .. i*weight + weight - 1 of the
    SplitMix64 stream of ``seed`` (so rows are independent and split across threads), positions by
    multiply-shift (bias below size / 2^32).  Rows go in blocks of :data:`EXPAND_BLOCK`: a block's
    columns are drawn first, then its random reads of xs, which no longer wait on the draws and so
    overlap (the reads are the cost: xs is larger than the caches).
    """
    nv, size, _ = xs.shape
    m = out.shape[1]
    uni = weight // 2
    reg = weight - uni
    step = size // reg
    nblocks = (m + EXPAND_BLOCK - 1) // EXPAND_BLOCK
    for blk in prange(nblocks):
        lo = blk * EXPAND_BLOCK
        hi = min(m, lo + EXPAND_BLOCK)
        cols = np.empty((EXPAND_BLOCK, weight), np.int64)
        for i in range(lo, hi):
            state = np.uint64(seed) + np.uint64(i * weight) * np.uint64(0x9E3779B97F4A7C15)
            for k in range(weight):
                state, z = _splitmix(state)
                hi32 = z >> np.uint64(32)
                if k < reg:
                    cols[i - lo, k] = k * step + np.int64((hi32 * np.uint64(step)) >> np.uint64(32))
                else:
                    cols[i - lo, k] = np.int64((hi32 * np.uint64(size)) >> np.uint64(32))
        for v in range(nv):
            for i in range(lo, hi):
                a0 = out[v, i, 0]
                a1 = out[v, i, 1]
                for k in range(weight):
                    c = cols[i - lo, k]
                    a0 ^= xs[v, c, 0]
                    a1 ^= xs[v, c, 1]
                out[v, i, 0] = a0
                out[v, i, 1] = a1


def code_encode(vectors: list[np.ndarray], m: int, weight: int = EXPANDER_WEIGHT,
                seed: int = CODE_SEED) -> list[np.ndarray]:
    """G x for each length-N vector x ((N, 2) uint64, N >= 2m): (m, 2) each (the inputs are not changed).

    The systematic Expand-Convolute code: ``G x = x[:m] + B (A' A x[m:])`` with A, A' two
    convolutions (:func:`_convolute`, seeds ``seed`` and its complement) and B the expander
    (:func:`_expand`).
    """
    if not vectors:
        return []
    stack = np.stack([np.asarray(x, dtype=np.uint64).reshape(-1, 2) for x in vectors])
    out = encode_in_place(stack, m, weight, seed)
    return [out[v] for v in range(len(vectors))]


def encode_in_place(xs: np.ndarray, m: int, weight: int = EXPANDER_WEIGHT, seed: int = CODE_SEED) -> np.ndarray:
    """:func:`code_encode` of the vectors xs (k, N, 2) uint64, overwriting them; returns the view xs[:, :m].

    The vectors are convolved on parallel threads and expanded together (rows split across threads).
    """
    k, n, _ = xs.shape
    if n < 2 * m:
        raise ValueError(f"code: {n} noise positions cannot make {m} outputs at rate 1/2")
    tails = xs[:, m:]
    _convolute_all(tails, np.uint64(seed))
    _convolute_all(tails, np.uint64(seed) ^ np.uint64(0xFFFFFFFFFFFFFFFF))
    out = xs[:, :m]
    _expand(tails, out, weight, np.uint64(seed) ^ np.uint64(0x5DEECE66D))
    return out


# ------------------------------------------------------------------ GGM and the COT hash
def _grow(nodes: np.ndarray) -> np.ndarray:
    """One GGM level, node-major: nodes (k, t, 16) uint8 -> children (2k, t, 16), rows 0..k-1 the left
    children AES_kL(x) ^ x and rows k..2k-1 the right ones AES_kR(x) ^ x (node j's children are j, j + k)."""
    k = len(nodes)
    out = np.empty((2 * k,) + nodes.shape[1:], dtype=np.uint8)
    flat = nodes.reshape(-1, BLOCK)
    np.bitwise_xor(aes_ecb(_KEY_L, flat).reshape(nodes.shape), nodes, out=out[:k])
    np.bitwise_xor(aes_ecb(_KEY_R, flat).reshape(nodes.shape), nodes, out=out[k:])
    return out


def expand_tree(roots: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """GGM trees from roots (t, 16): leaves (2^depth, t, 16) and per level the XOR of all left and of
    all right children, (t, depth, 2, 16) uint8.

    Leaf j of a tree is reached by going right at level l (1-based) when bit l - 1 of j is set.
    """
    nodes = np.ascontiguousarray(roots, dtype=np.uint8).reshape(1, -1, BLOCK)
    t = nodes.shape[1]
    sums = np.empty((t, depth, 2, BLOCK), dtype=np.uint8)
    for lev in range(depth):
        nodes = _grow(nodes)
        k = len(nodes) // 2
        sums[:, lev, 0] = np.bitwise_xor.reduce(nodes[:k], axis=0)
        sums[:, lev, 1] = np.bitwise_xor.reduce(nodes[k:], axis=0)
    return nodes, sums


def _tree_major(leaves: np.ndarray, out: np.ndarray) -> None:
    """(2^d, t, 16) uint8 leaves into out (t 2^d, 2) uint64, tree τ's leaves at τ 2^d .. (τ + 1) 2^d - 1."""
    k, t, _ = leaves.shape
    out.reshape(t, k, 2)[:] = leaves.view("<u8").reshape(k, t, 2).transpose(1, 0, 2)


def cot_hash(index: np.ndarray, x: np.ndarray) -> np.ndarray:
    """H(j, x) = π(π(x) ^ j) ^ π(x), π = AES under a fixed public key; (n, 16) uint8 in and out."""
    x = np.ascontiguousarray(x, dtype=np.uint8).reshape(-1, BLOCK)
    px = aes_ecb(_KEY_H, x).reshape(-1, BLOCK)
    tw = np.zeros((len(x), BLOCK), dtype=np.uint8)
    tw[:, :8] = np.asarray(index, dtype="<u8").reshape(-1, 1).view(np.uint8)
    y = aes_ecb(_KEY_H, px ^ tw).reshape(-1, BLOCK)
    y ^= px
    return y


def _level_cots(p: Params) -> np.ndarray:
    """Indices of the COTs of tree τ, level l (1..d): (t, d); the β COTs follow: t*d + 128 τ + k."""
    return np.arange(p.t * p.depth, dtype=np.int64).reshape(p.t, p.depth)


def _beta_cots(p: Params) -> np.ndarray:
    return p.t * p.depth + np.arange(p.t * KAPPA, dtype=np.int64).reshape(p.t, KAPPA)


# ------------------------------------------------------------------ the two parties
class Receiver:
    """R: secret points α and values β; base-OT *sender* keys (k0, k1), each (128, 16)."""

    def __init__(self, p: Params, k0: np.ndarray, k1: np.ndarray):
        self.p = p
        self.alpha = (np.frombuffer(os.urandom(8 * p.t), dtype="<u8") % np.uint64(1 << p.depth)).astype(np.int64)
        beta = np.frombuffer(os.urandom(16 * p.t), dtype="<u8").reshape(p.t, 2).copy()
        beta[(beta == 0).all(axis=1), 0] = 1            # β ≠ 0 (a zero is probability 2^-128 anyway)
        self.beta = beta
        r = np.zeros(p.cots, dtype=np.uint8)
        bits = (self.alpha[:, None] >> np.arange(p.depth)[None, :]) & 1      # α's side at level l: bit l - 1
        r[_level_cots(p).ravel()] = (1 - bits).ravel()                         # choose the sibling's side
        r[_beta_cots(p).ravel()] = np.unpackbits(beta.view(np.uint8), axis=1, bitorder="little").ravel()
        self.r = r
        self.u, self.t_rows = iknp_receiver(k0, k1, r)

    def extension(self) -> np.ndarray:
        """The IKNP message U: (128, cots/8) uint8."""
        return self.u

    def finish(self, sums: np.ndarray, correction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a, c), each (m, 2) uint64, from S's encrypted level sums (t, d, 2, 16) and corrections (t, 16)."""
        return self.vector_a(), self.finish_c(sums, correction)

    def vector_a(self) -> np.ndarray:
        """a = G e (m, 2) uint64: it depends on our noise (α, β) only, so it can be computed (and the PSI
        can send P + a) before S's message arrives."""
        p = self.p
        e = np.zeros((1, p.n, 2), dtype=np.uint64)
        e[0, np.arange(p.t) * (1 << p.depth) + self.alpha] = self.beta
        return encode_in_place(e, p.m, p.weight)[0]

    def finish_c(self, sums: np.ndarray, correction: np.ndarray) -> np.ndarray:
        """c (m, 2) uint64 from S's encrypted level sums (t, d, 2, 16) and corrections (t, 16): the
        punctured GGM trees give every leaf but v_α, the correction gives w_α = v_α + β Δ, then c = G w."""
        p = self.p
        sums = np.asarray(sums, dtype=np.uint8)
        correction = np.asarray(correction, dtype=np.uint8)
        if sums.shape != (p.t, p.depth, 2, BLOCK) or correction.shape != (p.t, BLOCK):
            raise VoleError(f"VOLE: want level sums {(p.t, p.depth, 2, BLOCK)} and corrections {(p.t, BLOCK)}, "
                            f"got {sums.shape} and {correction.shape}")
        tt = np.arange(p.t)
        idx = _level_cots(p)
        pads = cot_hash(idx.ravel(), self.t_rows[idx.ravel()]).reshape(p.t, p.depth, BLOCK)
        nodes = np.zeros((1, p.t, BLOCK), dtype=np.uint8)       # node-major; the unknown node of each tree is zero
        for lev in range(p.depth):
            k = len(nodes)
            path = self.alpha & (k - 1)                         # the unknown node at this level
            nodes = _grow(nodes)
            nodes[path, tt] = 0                                 # its children are garbage: clear them
            nodes[path + k, tt] = 0
            side = 1 - ((self.alpha >> lev) & 1)                # the sibling's side, whose sum we decrypt
            known = np.where(side[:, None] == 0, np.bitwise_xor.reduce(nodes[:k], axis=0),
                             np.bitwise_xor.reduce(nodes[k:], axis=0))
            nodes[path + side * k, tt] = sums[tt, lev, side] ^ pads[:, lev] ^ known
        wprime = gf128.weighted_sum(gf128.from_bytes(self.t_rows[_beta_cots(p).ravel()]).reshape(p.t, KAPPA, 2))
        at_alpha = gf128.from_bytes(correction) ^ gf128.from_bytes(np.bitwise_xor.reduce(nodes, axis=0)) ^ wprime
        w = np.empty((1, p.n, 2), dtype=np.uint64)
        _tree_major(nodes, w[0])
        del nodes
        w[0, tt * (1 << p.depth) + self.alpha] = at_alpha
        return encode_in_place(w, p.m, p.weight)[0]


class Sender:
    """S: Δ is its base-OT choice bits (128,), ``ks`` (128, 16) the keys it chose (the parameters come
    with R's message: S can answer the base OTs before it knows them)."""

    def __init__(self, delta_bits: np.ndarray, ks: np.ndarray):
        self.p: Params | None = None
        self.delta_bits = np.asarray(delta_bits, dtype=np.uint8).ravel()
        self.delta = np.packbits(self.delta_bits, bitorder="little").view("<u8").copy()   # (2,)
        self.ks = ks
        self.b: np.ndarray | None = None
        self._leaves: np.ndarray | None = None

    @staticmethod
    def new_delta_bits() -> np.ndarray:
        """Fresh secret Δ bits from the OS CSPRNG."""
        return np.unpackbits(np.frombuffer(os.urandom(KAPPA // 8), dtype=np.uint8), bitorder="little")

    def respond(self, p: Params, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From R's IKNP message for parameters p: the encrypted level sums (t, d, 2, 16) and
        corrections (t, 16); :meth:`finish` then gives b."""
        self.p = p
        u = np.asarray(u, dtype=np.uint8)
        if u.shape != (KAPPA, p.cots // 8):
            raise VoleError(f"VOLE: want an IKNP message of shape {(KAPPA, p.cots // 8)}, got {u.shape}")
        q = iknp_sender(self.delta_bits, self.ks, u)                  # (cots, 16)
        nodes, sums = expand_tree(np.frombuffer(os.urandom(BLOCK * p.t), dtype=np.uint8).reshape(p.t, BLOCK), p.depth)
        idx = _level_cots(p).ravel()
        dbytes = self.delta.view(np.uint8)
        sums[:, :, 0] ^= cot_hash(idx, q[idx]).reshape(p.t, p.depth, BLOCK)
        sums[:, :, 1] ^= cot_hash(idx, q[idx] ^ dbytes).reshape(p.t, p.depth, BLOCK)
        vprime = gf128.weighted_sum(gf128.from_bytes(q[_beta_cots(p).ravel()]).reshape(p.t, KAPPA, 2))
        correction = gf128.to_bytes(vprime ^ gf128.from_bytes(np.bitwise_xor.reduce(nodes, axis=0))).copy()
        self._leaves = nodes
        return sums, correction

    def finish(self) -> np.ndarray:
        """b (m, 2) uint64 (after :meth:`respond`; the messages can go out first)."""
        if self._leaves is None or self.p is None:
            raise RuntimeError("VOLE sender: respond() first")
        xs = np.empty((1, self.p.n, 2), dtype=np.uint64)
        _tree_major(self._leaves, xs[0])
        self._leaves = None
        self.b = encode_in_place(xs, self.p.m, self.p.weight)[0]
        return self.b
