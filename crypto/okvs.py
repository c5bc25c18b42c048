"""A random-band OKVS (oblivious key-value store) over GF(2^128) values, for the RR22 PSI backend.

Bienstock, Patel, Seo, Yeo, "Near-Optimal Oblivious Key-Value Stores for
Efficient PSI, PSU and Volume-Hiding Multi-Maps" (USENIX Security 2023,
ePrint 2023/903).  An OKVS encodes n key-value pairs (k_i, v_i) into a vector
P of m > n field elements such that ``Decode(P, k_i) = v_i``, where Decode is
linear in P: ``Decode(P, k) = <row(k), P>``.  Here ``row(k)`` is a random
*band*: a start column ``s(k)`` uniform in ``[0, m - w]`` and ``w`` random
bits ``b(k)`` at columns ``s(k) .. s(k) + w - 1``, both from a keyed hash
of k (:func:`hash_rows`); so ``Decode(P, k) = sum_j b_j(k) P[s(k) + j]``,
values in GF(2^128), coefficients in GF(2) (XORs only).

Encoding solves the n x m band system ``row(k_i) . P = v_i`` by Gaussian
elimination: rows sorted by start column, each row's first set bit is its
pivot and is cleared from the following rows whose band reaches it (they all
start at or before the pivot, so they are the next few rows in the order),
then back substitution from the last row; columns that are no row's pivot
are zero (in the PSI the whole P is masked by a uniform VOLE vector before it
leaves the party, so nothing depends on them).  Work is O(n w) word
operations, in compiled loops (numba); decoding is w/2 XORs of 16 bytes per
key in expectation.

Failure: the system has no solution when the random band rows are linearly
dependent (probability over the hash key).  Encoding detects it (a row
eliminates to zero) and raises :class:`OKVSFailure`; the caller draws a fresh
hash key and encodes again, so a failure costs time, never a wrong result.

The bound (:func:`failure_log2`).  The dominant failure is a window of
columns holding more whole bands than columns.  With starts uniform at density
λ = 1/(1 + ε) per column, "bands started minus columns passed" is a random
walk with Poisson(λ) - 1 steps, and Lundberg's inequality bounds the chance
that it ever climbs w above any starting point by e^(-θ w), θ the positive
root of λ(e^θ - 1) = θ; a union bound over the n starting rows gives
``log2 P[fail] <= log2 n - θ w / ln 2``.  The paper (§4) proves a bound of this
exponential form; ``benchmarks/okvs_failure.py`` counts failures at widths
where they are frequent (n = 2^12, 2^14, w = 20..40) and finds them within
half a bit of this expression, which is stated with one bit of margin.  With
ε = 0.25 (θ / ln 2 = 0.62) and w = 128 the bound is 2^-58 at n = 2^20 and
2^-50 at 2^28 (:data:`MAX_ITEMS`): below the 2^-40 statistical security for
every size this backend accepts.  This rests on that measurement and the
counting argument, as the paper's own parameter tables rest on theirs.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
import numba
from numba import njit, prange, types
from numba.core.extending import intrinsic

from .ot import aes_ecb

EPSILON = 0.25           # m = ceil((1 + ε) n) + w columns
BAND_WIDTH = 128         # w: bits per row (a multiple of 64)
KEY_BYTES = 16
MAX_ITEMS = 1 << 28
MARGIN_BITS = 1.0        # added to the bound (measured failures lie within half a bit of it)


class OKVSFailure(RuntimeError):
    """The band system for these keys and this hash key has no unique solution; rehash with a fresh key."""


def columns(n: int, w: int = BAND_WIDTH, eps: float = EPSILON) -> int:
    """m: the number of columns (field elements of P) for n keys."""
    return max(w, math.ceil((1.0 + eps) * int(n)) + w)


def theta(eps: float = EPSILON) -> float:
    """θ: the positive root of λ(e^θ - 1) = θ, λ = 1/(1 + ε) (Newton's method from θ = 1)."""
    lam, t = 1.0 / (1.0 + eps), 1.0
    for _ in range(100):
        t -= (lam * math.expm1(t) - t) / (lam * math.exp(t) - 1.0)
    return t


def failure_log2(n: int, w: int = BAND_WIDTH, eps: float = EPSILON) -> float:
    """The stated bound on log2 P[encoding n keys fails] for one hash key: log2 n - θ w / ln 2 + 1."""
    return math.log2(max(2, int(n))) - theta(eps) * w / math.log(2) + MARGIN_BITS


# ------------------------------------------------------------------ hashing
def hash_rows(keys: np.ndarray, hash_key: bytes, m: int, w: int = BAND_WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """Every key's band: (starts (n,) int64 in [0, m - w], bands (n, w/64) uint64).

    ``keys`` are 128-bit digests (n, 16) uint8.  Block j of AES_{hash_key}(key XOR j)
    (j = 0 .. w/128) gives the start (first 8 bytes of block 0, reduced mod
    m - w + 1; bias below m / 2^64) and the band bits (the other blocks).
    """
    if w % 64 or w <= 0:
        raise ValueError(f"band width must be a positive multiple of 64, got {w}")
    if m < w:
        raise ValueError(f"OKVS: {m} columns cannot hold a band of {w}")
    keys = np.ascontiguousarray(keys, dtype=np.uint8).reshape(-1, KEY_BYTES)
    n = len(keys)
    nblocks = 1 + -(-w // 128)
    x = np.empty((n, nblocks, KEY_BYTES), dtype=np.uint8)
    x[:] = keys[:, None, :]
    for j in range(1, nblocks):
        x[:, j, 0] ^= np.uint8(j)
    h = aes_ecb(hash_key, x).view("<u8").reshape(n, 2 * nblocks)
    starts = (h[:, 0] % np.uint64(m - w + 1)).astype(np.int64)
    bands = np.ascontiguousarray(h[:, 2:2 + w // 64])
    return starts, bands


# ------------------------------------------------------------------ kernels
@intrinsic
def _ctz(typingctx, x):  # pragma: no cover - compiled
    """Count trailing zeros of a non-zero uint64 (LLVM's cttz: one instruction)."""
    sig = types.uint64(types.uint64)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = builder.module.declare_intrinsic("llvm.cttz.i64", fnty=ir.FunctionType(i64, [i64, ir.IntType(1)]))
        return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 0)])

    return sig, codegen


@njit(cache=True)
def _encode(starts_in, bands_in, values_in, order, out):  # pragma: no cover - compiled
    """Solve the band system for the rows taken in ``order`` (by start); returns -1 or the position in
    ``order`` of a row that eliminates to zero (dependent rows)."""
    n, nw = bands_in.shape
    starts = np.empty(n, np.int64)
    bands = np.empty((n, nw), np.uint64)       # copies in start order: eliminated in place
    values = np.empty((n, 2), np.uint64)
    for t in range(n):
        i = order[t]
        starts[t] = starts_in[i]
        for k in range(nw):
            bands[t, k] = bands_in[i, k]
        values[t, 0] = values_in[i, 0]
        values[t, 1] = values_in[i, 1]
    pivot = np.full(n, -1, dtype=np.int64)
    for i in range(n):
        # first set bit of row i
        p = -1
        for k in range(nw):
            x = bands[i, k]
            if x != 0:
                p = 64 * k + np.int64(_ctz(x))
                break
        if p < 0:
            return i
        col = starts[i] + p
        pivot[i] = col
        # clear column col from the following rows whose band reaches it
        j = i + 1
        while j < n and starts[j] <= col:
            off = col - starts[j]
            if (bands[j, off >> 6] >> np.uint64(off & 63)) & np.uint64(1):
                d = starts[j] - starts[i]     # row i shifted right by d bits lines up with row j
                q = d >> 6
                r = d & 63
                for k in range(nw - q):
                    v = bands[i, k + q] >> np.uint64(r)
                    if r and k + q + 1 < nw:
                        v |= bands[i, k + q + 1] << np.uint64(64 - r)
                    bands[j, k] ^= v
                values[j, 0] ^= values[i, 0]
                values[j, 1] ^= values[i, 1]
            j += 1
    # back substitution, last row first; non-pivot columns stay zero
    for i in range(n - 1, -1, -1):
        lo = values[i, 0]
        hi = values[i, 1]
        s = starts[i]
        c = pivot[i]
        for k in range(nw):
            x = bands[i, k]
            while x != 0:
                col = s + 64 * k + np.int64(_ctz(x))
                x &= x - np.uint64(1)
                if col != c:
                    lo ^= out[col, 0]
                    hi ^= out[col, 1]
        out[c, 0] = lo
        out[c, 1] = hi
    return -1


@njit(cache=True, parallel=True)
def _decode(ps, starts, bands, order, out, nthreads):  # pragma: no cover - compiled
    """out[v, i] = <band i, ps[v]> for every vector ps[v] ((nv, m, 2)), keys visited in ``order``
    (by start: P is read in one sweep), split across threads."""
    nv = ps.shape[0]
    nw = bands.shape[1]
    n = order.shape[0]
    chunk = (n + nthreads - 1) // nthreads
    for th in prange(nthreads):
        for t in range(th * chunk, min(n, (th + 1) * chunk)):
            i = order[t]
            s = starts[i]
            for v in range(nv):
                lo = np.uint64(0)
                hi = np.uint64(0)
                for k in range(nw):
                    x = bands[i, k]
                    base = s + 64 * k
                    while x != 0:
                        c = base + np.int64(_ctz(x))
                        x &= x - np.uint64(1)
                        lo ^= ps[v, c, 0]
                        hi ^= ps[v, c, 1]
                out[v, i, 0] = lo
                out[v, i, 1] = hi


# ------------------------------------------------------------------ the API
def encode(starts: np.ndarray, bands: np.ndarray, values: np.ndarray, m: int,
           order: np.ndarray | None = None) -> np.ndarray:
    """P (m, 2) uint64 with ``decode(P, starts, bands) == values`` ((n, 2) uint64); raises OKVSFailure.

    ``order``: the keys by start (:func:`by_start`), computed if None.
    """
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts)
    values = np.ascontiguousarray(values, dtype=np.uint64).reshape(n, 2)
    order = by_start(starts) if order is None else np.asarray(order, dtype=np.int64)
    out = np.zeros((m, 2), dtype=np.uint64)
    if n:
        bad = _encode(starts, np.ascontiguousarray(bands, dtype=np.uint64), values, order, out)
        if bad >= 0:
            raise OKVSFailure(f"OKVS: the band rows of {n} keys in {m} columns are dependent (row {int(order[bad])})")
    return out


def by_start(starts: np.ndarray) -> np.ndarray:
    """The keys' order by start column (ties by index): one sort of (start, index) packed in 64 bits.

    Encoding needs it, and decoding in it reads P in one sweep (cache-friendly).
    """
    starts = np.asarray(starts, dtype=np.int64)
    n = len(starts)
    shift = np.uint64(max(1, (n - 1).bit_length()))
    key = starts.astype(np.uint64) << shift
    key |= np.arange(n, dtype=np.uint64)
    key.sort()
    return (key & ((np.uint64(1) << shift) - np.uint64(1))).astype(np.int64)


def decode(p: np.ndarray, starts: np.ndarray, bands: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Decode(P, k) for every key's band: (n, 2) uint64 (``order``: :func:`by_start`, computed if None)."""
    return decode_many([p], starts, bands, order)[0]


def decode_two(p1: np.ndarray, p2: np.ndarray, starts: np.ndarray, bands: np.ndarray,
               order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode two vectors at the same keys in one pass (each band is read once)."""
    d1, d2 = decode_many([p1, p2], starts, bands, order)
    return d1, d2


def decode_many(ps: list[np.ndarray], starts: np.ndarray, bands: np.ndarray,
                order: np.ndarray | None = None) -> list[np.ndarray]:
    """Decode several vectors (each (m, 2) uint64) at the same keys, on every thread numba runs."""
    starts = np.asarray(starts, dtype=np.int64)
    stack = np.stack([np.ascontiguousarray(p, dtype=np.uint64).reshape(-1, 2) for p in ps])
    out = np.empty((len(ps), len(starts), 2), dtype=np.uint64)
    _decode(stack, starts, np.ascontiguousarray(bands, dtype=np.uint64),
            by_start(starts) if order is None else np.asarray(order, dtype=np.int64), out,
            max(1, numba.get_num_threads()))
    return [out[v] for v in range(len(ps))]
