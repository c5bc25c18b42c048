"""Silent VOLE over GF(2^128): GGM-tree punctured PRFs and an Expand-Accumulate code (dual LPN).

After the protocol the receiver R holds vectors a, c and the sender S holds
Δ and b, all in GF(2^128) (:mod:`fedhet.crypto.gf128`), with

    c = b + a·Δ        (element-wise, length m; a pseudorandom to S, Δ and b to R)

Nothing here talks to a network: :class:`Receiver` and :class:`Sender` make
and take the messages; ``fedhet.protocols.psi.rr22`` moves them.  The
construction is the PCG of Boyle, Couteau, Gilboa, Ishai, Kohl, Scholl
("Efficient Pseudorandom Correlation Generators: Silent OT Extension and
More", CRYPTO 2019) and Boyle et al. (CCS 2019), with the
Expand-Accumulate code of Boyle, Couteau, Gilboa, Ishai, Kohl, Resch, Scholl
("Correlated Pseudorandomness from Expand-Accumulate Codes", CRYPTO 2022),
as RR22 (Raghuraman, Rindal, CCS 2022) use it:

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
   vectors: ``a = G e``, ``c = G w``, ``b = G v``.  G = B·A is the
   Expand-Accumulate code's: A accumulates (prefix XOR), B is an expander
   with ``weight`` pseudorandom columns per row (SplitMix64 of a fixed public
   seed, positions by multiply-shift, bias below N/2^32).

Security (semi-honest): S learns nothing of α, β (IKNP receiver privacy);
R learns nothing of v_α or Δ (the punctured PRF's value at α and the OT
hash), so ``a = G e`` is pseudorandom to S by dual LPN with regular noise
for the EA code (the assumption), and b, Δ stay hidden from R.  Parameters
(:func:`params`): N >= 2m (rate 1/2), t regular-noise blocks with
``t >= -128 / log2(1 - 2 δ)`` for an assumed relative minimum distance
δ = 0.15 of the code (libOTe's rule for λ = 128 against linear attacks; 249
blocks), expander weight 21 (libOTe's "ExAcc21"; Silver codes are not used:
they are broken, Raghuraman–Rindal–Tanguy, CRYPTO 2023).  The assumption is the
EA-LPN one of the papers above, not a proof of this instance.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass

import numpy as np
from numba import njit

from . import gf128
from .ot import BLOCK, KAPPA, aes_ecb, iknp_receiver, iknp_sender

MIN_DIST = 0.15               # assumed relative minimum distance of the EA code (libOTe's rule)
SEC_BITS = 128
EXPANDER_WEIGHT = 21
CODE_SEED = int.from_bytes(hashlib.blake2b(b"fedhet EA code seed", digest_size=8).digest(), "little")
_KEY_L = hashlib.blake2b(b"fedhet GGM left", digest_size=16).digest()
_KEY_R = hashlib.blake2b(b"fedhet GGM right", digest_size=16).digest()
_KEY_H = hashlib.blake2b(b"fedhet COT hash", digest_size=16).digest()


class VoleError(ValueError):
    """A VOLE message does not have the shape the parameters say."""


@dataclass(frozen=True)
class Params:
    """m outputs from t GGM trees of depth d (N = t 2^d noise positions), EA expander weight."""
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


def noise_blocks(min_dist: float = MIN_DIST, sec: int = SEC_BITS) -> int:
    """t: the regular noise weight for bit security ``sec`` against linear tests, -sec / log2(1 - 2 δ)."""
    return math.ceil(-sec / math.log2(1.0 - 2.0 * min_dist))


def params(m: int) -> Params:
    """Parameters for m VOLE outputs: N = t 2^d >= 2m with at least :func:`noise_blocks` trees."""
    if m <= 0:
        raise ValueError(f"VOLE length must be positive, got {m}")
    t0 = noise_blocks()
    depth = max(1, int(math.floor(math.log2(max(2.0, 2.0 * m / t0)))))
    t = max(t0, -(-2 * m // (1 << depth)))
    return Params(m=int(m), t=int(t), depth=depth)


# ------------------------------------------------------------------ kernels
@njit(cache=True, inline="always")
def _splitmix(x):  # pragma: no cover - compiled
    x = x + np.uint64(0x9E3779B97F4A7C15)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x, z ^ (z >> np.uint64(31))


@njit(cache=True)
def _accumulate(x):  # pragma: no cover - compiled
    for i in range(1, x.shape[0]):
        x[i, 0] ^= x[i - 1, 0]
        x[i, 1] ^= x[i - 1, 1]


@njit(cache=True)
def _expand(x, m, weight, seed, out, alpha, prefix, depth, out_e):  # pragma: no cover - compiled
    """out[i] = XOR over row i's ``weight`` columns of the accumulated x.

    With ``out_e`` non-empty, also the same rows of the accumulated regular-sparse vector e (one
    non-zero per block of 2^depth, at offset alpha[block], running XORs ``prefix``) without
    materialising it: at column c, acc(e)[c] = prefix[block] if c's offset >= alpha[block],
    else prefix[block - 1] (prefix[-1] = 0).
    """
    n = np.uint64(x.shape[0])
    state = np.uint64(seed)
    cols = np.empty(weight, np.int64)
    sparse = out_e.shape[0] > 0
    low = (1 << depth) - 1
    for i in range(m):
        for k in range(weight):
            state, z = _splitmix(state)
            cols[k] = ((z >> np.uint64(32)) * n) >> np.uint64(32)
        a0 = np.uint64(0)
        a1 = np.uint64(0)
        for k in range(weight):
            c = cols[k]
            a0 ^= x[c, 0]
            a1 ^= x[c, 1]
        out[i, 0] = a0
        out[i, 1] = a1
        if sparse:
            e0 = np.uint64(0)
            e1 = np.uint64(0)
            for k in range(weight):
                c = cols[k]
                blk = c >> depth
                j = blk if (c & low) >= alpha[blk] else blk - 1
                if j >= 0:
                    e0 ^= prefix[j, 0]
                    e1 ^= prefix[j, 1]
            out_e[i, 0] = e0
            out_e[i, 1] = e1


def ea_encode(x: np.ndarray, m: int, weight: int = EXPANDER_WEIGHT, seed: int = CODE_SEED,
              sparse: tuple[np.ndarray, np.ndarray, int] | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """G x = B (A x) for a length-N vector x ((N, 2) uint64; accumulated in place): (m, 2).

    ``sparse`` = (alpha (t,), beta (t, 2), depth): also G e for the regular-sparse e with e[τ 2^d + α_τ] = β_τ,
    from the same rows (second result; None without ``sparse``).
    """
    x = np.ascontiguousarray(x, dtype=np.uint64)
    _accumulate(x)
    out = np.empty((m, 2), dtype=np.uint64)
    if sparse is None:
        alpha, prefix, depth, out_e = np.zeros(1, np.int64), np.zeros((1, 2), np.uint64), 0, np.zeros((0, 2), np.uint64)
    else:
        alpha, beta, depth = sparse
        alpha = np.ascontiguousarray(alpha, dtype=np.int64)
        prefix = np.bitwise_xor.accumulate(np.ascontiguousarray(beta, dtype=np.uint64), axis=0)
        out_e = np.empty((m, 2), dtype=np.uint64)
    _expand(x, m, weight, np.uint64(seed), out, alpha, prefix, depth, out_e)
    return out, (out_e if sparse is not None else None)


# ------------------------------------------------------------------ GGM and the COT hash
def _children(nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Left and right children of (t, k, 16) uint8 nodes: AES_kL(x) ^ x, AES_kR(x) ^ x."""
    flat = nodes.reshape(-1, BLOCK)
    left = aes_ecb(_KEY_L, flat).reshape(nodes.shape)
    left ^= nodes
    right = aes_ecb(_KEY_R, flat).reshape(nodes.shape)
    right ^= nodes
    return left, right


def _interleave(left: np.ndarray, right: np.ndarray) -> np.ndarray:
    t, k, _ = left.shape
    out = np.empty((t, 2 * k, BLOCK), dtype=np.uint8)
    out[:, 0::2] = left
    out[:, 1::2] = right
    return out


def expand_tree(roots: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """GGM trees from roots (t, 16): leaves (t, 2^depth, 16) and per level the XOR of all left and of all
    right children, (t, depth, 2, 16) uint8."""
    nodes = np.ascontiguousarray(roots, dtype=np.uint8).reshape(-1, 1, BLOCK)
    sums = np.empty((len(nodes), depth, 2, BLOCK), dtype=np.uint8)
    for lev in range(depth):
        left, right = _children(nodes)
        sums[:, lev, 0] = np.bitwise_xor.reduce(left, axis=1)
        sums[:, lev, 1] = np.bitwise_xor.reduce(right, axis=1)
        nodes = _interleave(left, right)
    return nodes, sums


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
        levels = np.arange(1, p.depth + 1)
        bits = (self.alpha[:, None] >> (p.depth - levels)[None, :]) & 1        # α's bit at each level, MSB first
        r[_level_cots(p).ravel()] = (1 - bits).ravel()                         # choose the sibling's side
        r[_beta_cots(p).ravel()] = np.unpackbits(beta.view(np.uint8), axis=1, bitorder="little").ravel()
        self.r = r
        self.u, self.t_rows = iknp_receiver(k0, k1, r)

    def extension(self) -> np.ndarray:
        """The IKNP message U: (128, cots/8) uint8."""
        return self.u

    def finish(self, sums: np.ndarray, correction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a, c), each (m, 2) uint64, from S's encrypted level sums (t, d, 2, 16) and corrections (t, 16)."""
        p = self.p
        sums = np.asarray(sums, dtype=np.uint8)
        correction = np.asarray(correction, dtype=np.uint8)
        if sums.shape != (p.t, p.depth, 2, BLOCK) or correction.shape != (p.t, BLOCK):
            raise VoleError(f"VOLE: want level sums {(p.t, p.depth, 2, BLOCK)} and corrections {(p.t, BLOCK)}, "
                            f"got {sums.shape} and {correction.shape}")
        tt = np.arange(p.t)
        idx = _level_cots(p)
        pads = cot_hash(idx.ravel(), self.t_rows[idx.ravel()]).reshape(p.t, p.depth, BLOCK)
        nodes = np.zeros((p.t, 1, BLOCK), dtype=np.uint8)
        for lev in range(1, p.depth + 1):
            path = self.alpha >> (p.depth - lev + 1)             # the unknown node at level lev - 1
            left, right = _children(nodes)
            left[tt, path] = 0
            right[tt, path] = 0
            a_bit = (self.alpha >> (p.depth - lev)) & 1             # α's side at this level
            side = 1 - a_bit                                        # the sibling's side: decrypted
            known = np.where(side[:, None, None] == 0, left, right)
            sib = sums[tt, lev - 1, side] ^ pads[:, lev - 1]        # the XOR of the level's side...
            sib ^= np.bitwise_xor.reduce(known, axis=1)             # ...less the nodes we know: the sibling
            left[tt, path] = np.where(side[:, None] == 0, sib, 0)
            right[tt, path] = np.where(side[:, None] == 1, sib, 0)
            nodes = _interleave(left, right)
        leaves = nodes                                              # (t, 2^d, 16), zero at α
        wprime = gf128.weighted_sum(gf128.from_bytes(self.t_rows[_beta_cots(p).ravel()]).reshape(p.t, KAPPA, 2))
        at_alpha = gf128.from_bytes(correction) ^ gf128.from_bytes(np.bitwise_xor.reduce(leaves, axis=1)) ^ wprime
        w = gf128.from_bytes(leaves.reshape(-1, BLOCK)).reshape(p.t, 1 << p.depth, 2).copy()
        w[tt, self.alpha] = at_alpha
        c, a = ea_encode(w.reshape(-1, 2), p.m, p.weight, sparse=(self.alpha, self.beta, p.depth))
        assert a is not None
        return a, c


class Sender:
    """S: Δ is its base-OT choice bits (128,), ``ks`` (128, 16) the keys it chose."""

    def __init__(self, p: Params, delta_bits: np.ndarray, ks: np.ndarray):
        self.p = p
        self.delta_bits = np.asarray(delta_bits, dtype=np.uint8).ravel()
        self.delta = np.packbits(self.delta_bits, bitorder="little").view("<u8").copy()   # (2,)
        self.ks = ks
        self.b: np.ndarray | None = None
        self._leaves: np.ndarray | None = None

    @staticmethod
    def new_delta_bits() -> np.ndarray:
        """Fresh secret Δ bits from the OS CSPRNG."""
        return np.unpackbits(np.frombuffer(os.urandom(KAPPA // 8), dtype=np.uint8), bitorder="little")

    def respond(self, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From R's IKNP message: the encrypted level sums (t, d, 2, 16) and corrections (t, 16); keeps b."""
        p = self.p
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
        correction = gf128.to_bytes(vprime ^ gf128.from_bytes(np.bitwise_xor.reduce(nodes, axis=1))).copy()
        self._leaves = nodes
        return sums, correction

    def finish(self) -> np.ndarray:
        """b (m, 2) uint64 (after :meth:`respond`; the messages can go out first)."""
        if self._leaves is None:
            raise RuntimeError("VOLE sender: respond() first")
        self.b, _ = ea_encode(gf128.from_bytes(self._leaves.reshape(-1, BLOCK)), self.p.m, self.p.weight)
        self._leaves = None
        return self.b
