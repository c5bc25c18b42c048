"""Exact products of Shamir shares (GF(p) elements) with public integer matrices, at BLAS speed.

``matmul(a, b)`` computes ``a @ b mod p`` for shares ``a`` (canonical uint64, shape (..., K))
and a public integer matrix ``b`` (shape (K, N) or (K,)); ``lmatmul(b, a)`` computes ``b @ a``.
``matmul_trusted`` / ``lmatmul_trusted`` do the same for shares already known to be canonical
and a public operand already given as centred int64 (what :mod:`fedhet.protocols.shared_array`
holds), skipping the input checks.  ``plan`` tells how a product will be split.

How.  A share is a uniform 61-bit element, but the public operand is a small signed integer (a
fixed-point matrix, ``|M| < 2**20`` or so), so only the share is split, into L digits, e.g.
balanced ``d_j = ((a >> S_j) mod 2**w_j) - 2**(w_j - 1)``, ``|d_j| <= 2**(w_j - 1)``, so that
``a = sum_j d_j 2**S_j + C`` for a public constant C.  The digit matrices are stacked along the
row axis (along the column axis for ``lmatmul``), so ONE float64 BLAS gemm
``(L*R, K) @ (K, N)`` computes every ``G_j = d_j @ M``.  It is exact: every partial sum is an
integer of magnitude at most ``max|d_j| * sum_k |M_kn| <= EXACT < 2**51`` (the plan cuts K
into blocks where the public column sums require it; block results are summed in int64).  Then
``a @ M = sum_j 2**S_j G_j + C * (1^T M)  (mod p)``.

* Digits, two kinds.  "halves" (public column sums up to about 2**19, e.g. 16-bit fixed point
  with K = 16): the uint64 share's two 32-bit halves are the digits (32 and 29 bits, unsigned),
  converted to float64 in one numpy pass from a uint32 view.  Balanced digits otherwise: a
  digit u < 2**52 OR-ed into the bits of the float 2**52 is the float ``2**52 + u``, and one
  float subtraction removes 2**52 and the offset (no int-to-float conversion).
* Products without float-to-int conversion: for an integer |g| <= 2**51, the bits of the float
  ``g + 1.5 * 2**52`` read as int64 are ``g + B`` (B a constant, a multiple of 2**48).  The
  same float add also adds the correction ``C * (1^T M)`` (as per-column digits c_j < 2**32).
* Recombination for p = 2**61 - 1 (``2**61 = 1 mod p``): ``2**S g = r 2**S + q (mod p)`` with
  ``g = q 2**(61-S) + r``, a mask, two shifts and two adds; for two digits the sum then lies in
  [2p, 4p), and two subtractions and a minimum make it canonical (more digits: a Mersenne fold
  ``x = (x & p) + (x >> 61)`` first).  Small primes (< 2**32) use ``%`` instead.
* Everything runs in per-thread buffers reused across calls, over row chunks of about a MiB.

So a product costs two float64 gemms of the same shape (three or four digits only when the
public entries or column sums are large), plus a few elementwise passes over the shares and about nine over the
result, plus numpy's per-call overhead (tens of microseconds).  Public operands too large for any
plan (``|M| > EXACT`` or more than ``MAX_LIMBS`` digits / ``MAX_BLOCKS`` blocks) use the generic
16-bit-limb product :meth:`PrimeField.matmul`.

Measured (``benchmarks/field_matmul.py``, one BLAS thread, quiet 2-core machine): 0.32-0.35 of float64
matmul throughput for (1024, 1024)^2 and (4096, 512) @ (512, 512), 0.22-0.27 for (4343, 16) @ (16, 64)
and for (100, 3312) @ (3312, 16), 0.15-0.19 for (R, 16) @ (16, 16): for the small shapes (float64
takes 30-60 microseconds) the elementwise passes and numpy's per-call cost weigh as much as the
gemm.  F³'s holders run batched products (:func:`batched_lmatmul_trusted`); at 207 owners those
reach 0.40 of float64's stacked matmul summed over one training step, 0.31-0.34 (dC), 0.35-0.37 (dÂ)
and 0.46-0.48 (Â_b G_b), but only 0.17-0.27 for the per-owner C_i, K = 16: its two digit gemms take
as long as the ~11 elementwise passes (split, conversion, Mersenne combine) around them, which no
ufunc ordering removes; going further would take a fused compiled kernel.
"""
from __future__ import annotations

import functools
import itertools
import sys
import threading
from dataclasses import dataclass

import numpy as np

from .field import F61, PrimeField

__all__ = ["Plan", "plan", "matmul", "lmatmul", "matmul_trusted", "lmatmul_trusted", "batched_lmatmul_trusted",
           "EXACT", "MAX_LIMBS", "MAX_BLOCKS"]

EXACT = (1 << 51) - (1 << 31)  # |block products| bound: with a 31-bit correction, convertible by one add
MAX_LIMBS = 4            # beyond this the generic two-sided limb product is as good
MAX_BLOCKS = 64          # sums of up to 64 blocks stay below 2**57 (the range combine relies on)
_CALL_COST = 15000        # a K-block's numpy calls, in units of one element of an elementwise pass
CHUNK_ELEMENTS = 1 << 17  # digits or products per row chunk (~1 MiB per buffer)
MIN_GEMM_ROWS = 256      # but at least this many stacked rows per gemm call
SCRATCH_KEEP = 1 << 22   # work buffers up to this many elements (32 MiB) are kept per thread

_U64 = np.uint64
_MAGIC = _U64(0x4330000000000000)  # bits of the float 2**52
_TWO52 = float(1 << 52)
_MAGIC_F = 1.5 * _TWO52            # x + 1.5 * 2**52 has the bits B + x for integers |x| < 2**51
_B = 0x4338000000000000            # those bits: a multiple of 2**48
_HALVES = (32, 29)
_BATCH_DIGITS = ((32, 29), (21, 20, 20), (16, 15, 15, 15))   # digit widths batched_lmatmul_trusted tries
BATCH_BELOW = 1 << 18   # batched_lmatmul_trusted batches products with fewer multiply-adds than this
BATCH_NARROW = 32       # ... and products with at most this many output columns
# halves: |G_j| <= (2**32 - 1) * column sum, plus a correction digit < 2**32, within 2**51
_HALVES_LIMIT = ((1 << 51) - (1 << 32)) // ((1 << 32) - 1)
_LITTLE = sys.byteorder == "little"


@dataclass(frozen=True)
class Plan:
    """An exact split: the share in digits of ``widths`` bits (low first), K cut at ``cuts``.

    ``halves``: the two 32-bit halves of the uint64 share as unsigned digits (widths 32, 29),
    converted to float64 in one pass straight from a uint32 view; otherwise balanced digits.
    """

    widths: tuple[int, ...]
    cuts: tuple[int, ...]      # 0 = cuts[0] < ... < cuts[-1] = K
    halves: bool = False

    @property
    def limbs(self) -> int:
        return len(self.widths)

    @property
    def shifts(self) -> tuple[int, ...]:
        return tuple(itertools.accumulate((0,) + self.widths[:-1]))

    @property
    def digit_bound(self) -> int:
        """max |d_j| of the digits."""
        return (1 << 32) - 1 if self.halves else 1 << (max(self.widths) - 1)

    @property
    def blocks(self) -> int:
        return len(self.cuts) - 1


def _widths(nbits: int, limbs: int) -> tuple[int, ...]:
    base, extra = divmod(nbits, limbs)
    return tuple([base + 1] * extra + [base] * (limbs - extra))


def _cuts(sums: "_Sums", top: int, limit: int) -> tuple[int, ...] | None:
    """K-block boundaries with every block's column sums of |M| <= limit, at most MAX_BLOCKS blocks."""
    K, colmax = sums.K, sums.colmax
    if top > limit:
        return None
    per_row = limit // max(top, 1)              # any run of this many rows fits
    n_safe = -(-K // per_row)
    if colmax is None:
        tries = [n_safe]
    else:
        n0 = max(1, -(-colmax // limit))
        tries = list(range(n0, min(n0 + 8, n_safe))) + [n_safe]
    for nb in tries:
        if nb > MAX_BLOCKS:
            return None
        cuts = (np.arange(nb + 1) * K) // nb
        if nb == n_safe:
            return tuple(int(c) for c in cuts)
        cs = sums.cumulative()
        if int((cs[cuts[1:]] - cs[cuts[:-1]]).max()) <= limit:
            return tuple(int(c) for c in cuts)
    return None


class _Sums:
    """Column sums of |M| (None where int64 could overflow), cumulative sums over K on demand."""

    def __init__(self, abs_pub: np.ndarray, colmax: int | None):
        self.abs_pub, self.K, self.colmax = abs_pub, abs_pub.shape[0], colmax
        self._cs: np.ndarray | None = None

    def cumulative(self) -> np.ndarray:
        if self._cs is None:
            K, N = self.abs_pub.shape
            cs = np.empty((K + 1, N), dtype=np.int64)
            cs[0] = 0
            np.cumsum(self.abs_pub, axis=0, out=cs[1:])
            self._cs = cs
        return self._cs


def plan(abs_pub: np.ndarray, field: PrimeField = F61, rows: int | None = None) -> Plan | None:
    """The cheapest exact split for shares times a public (K, N) matrix with entries ``abs_pub`` = |M|.

    ``rows``: how many share rows the product has (when known: few rows make each K-block's
    numpy calls count).  Returns None when no split with at most ``MAX_LIMBS`` digits and
    ``MAX_BLOCKS`` blocks is exact.
    """
    abs_pub = np.asarray(abs_pub)
    if abs_pub.ndim == 1:
        abs_pub = abs_pub[:, None]
    K, N = abs_pub.shape
    nbits = field.p.bit_length()
    top = int(abs_pub.max()) if abs_pub.size else 0
    if top >= EXACT:
        return None
    if K == 0 or N == 0:
        return Plan(_widths(nbits, MAX_LIMBS), (0, K))
    safe = top * K < 1 << 62                   # int64 column sums cannot overflow
    colmax = int(abs_pub.sum(axis=0).max()) if safe else None
    if colmax is not None:
        quick = _one_block_plan(nbits, top, colmax, K, N, rows)
        if quick is not None:
            return quick
    sums = _Sums(abs_pub, colmax)
    best = None
    for L in range(1, MAX_LIMBS + 1):
        widths = _widths(nbits, L)
        limit = EXACT >> (max(widths) - 1)
        if top > limit or max(widths) > 31:      # (digits of the correction must stay < 2**31)
            continue
        found = (0, K) if colmax is not None and colmax <= limit else _cuts(sums, top, limit)
        if found is None:
            continue
        cuts = found
        nb = len(cuts) - 1
        # per output row, in units of one elementwise pass: the gemm flops (~1/10 of a pass
        # each), converting and summing each block's products, splitting the share
        cost = L * (0.1 * K * N + 2 * nb * N + 3 * K)
        if rows:                                 # + the calls per block and chunk, per row
            cost += nb * _CALL_COST / _chunk(L, K, N, rows)
        if best is None or cost < best[0]:
            best = (cost, Plan(widths, cuts))
        if nb == 1:
            break                                # more digits only cost more
    if field.mersenne and _LITTLE and top <= _HALVES_LIMIT:
        hcuts = _cuts(sums, top, _HALVES_LIMIT) if safe else None
        if hcuts is not None:
            cuts = hcuts
            nb = len(cuts) - 1
            cost = 2 * (0.1 * K * N + 2 * nb * N + K)
            if rows:
                cost += nb * _CALL_COST / _chunk(2, K, N, rows)
            if best is None or cost < best[0]:
                best = (cost, Plan(_HALVES, cuts, True))
    return None if best is None else best[1]


@functools.lru_cache(maxsize=256)
def _one_block_plan(nbits: int, top: int, colmax: int, K: int, N: int, rows: int | None) -> Plan | None:
    """The plan when the fewest digits that fit need one block (the common case), else None."""
    if nbits == 61 and _LITTLE and colmax <= _HALVES_LIMIT:
        return Plan(_HALVES, (0, K), True)
    for L in range(1, MAX_LIMBS + 1):
        widths = _widths(nbits, L)
        limit = EXACT >> (max(widths) - 1)
        if top > limit or max(widths) > 31:
            continue
        # blocks with fewer digits might be cheaper: let the full search decide
        return Plan(widths, (0, K)) if colmax <= limit else None
    return None


# ----------------------------------------------------------------- the kernel
_SCRATCH = threading.local()


def _scratch(name: str, size: int, dtype) -> np.ndarray:
    """A per-thread flat work buffer of at least ``size`` elements, kept between calls.

    Fresh large arrays cost page faults on first touch, which for the small products of F3 is
    a good part of the arithmetic; the buffers are bounded by the row chunks (a few MiB).
    """
    if size > SCRATCH_KEEP:
        return np.empty(size, dtype=dtype)       # too large to keep around
    bufs = getattr(_SCRATCH, "bufs", None)
    if bufs is None:
        bufs = _SCRATCH.bufs = {}
    buf = bufs.get(name)
    if buf is None or buf.size < size:
        buf = bufs[name] = np.empty(max(size, 1), dtype=dtype)
    return buf


@dataclass(frozen=True)
class _Digits:
    """Per-plan constants: digit shifts and masks, the float offsets, the constants of the sums."""

    L: int
    shifts: tuple[int, ...]
    masks: tuple
    fsub: np.ndarray       # 2**52 + offset per digit (the digit's float bits hold 2**52 + u)
    C: int                 # a = sum_j d_j 2**S_j + C
    K0: int                # what the conversion leaves in the Mersenne sums (see _corrections)


@functools.lru_cache(maxsize=64)
def _digits(widths: tuple[int, ...], p: int, halves: bool = False) -> _Digits:
    shifts = tuple(itertools.accumulate((0,) + widths[:-1]))
    offs = [0 if halves else 1 << (w - 1) for w in widths]
    C = sum(o << s for o, s in zip(offs, shifts)) % p
    K0 = (_B + sum(_B >> (61 - s) for s in shifts[1:])) % p
    fsub = np.array([_TWO52 + o for o in offs])
    fsub.flags.writeable = False
    return _Digits(len(widths), shifts, tuple(_U64((1 << w) - 1) for w in widths), fsub, C, K0)


def _corrections(dg: _Digits, widths, colsum, fld: PrimeField) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-output float constants (L, N) added to the digit products, and (small primes) the correction.

    a @ M = sum_j 2**S_j G_j + C * colsum(M).  For p = 2**61 - 1 the correction is carried by
    the conversion itself: G_j is converted as G_j + c_j + B (see _add_magic_rows), where c_j are the
    digits of C * colsum - K0 in the same radix, and K0 = B + sum_{j>0} (B >> (61 - S_j)) is
    what the magic constant B leaves behind in _combine.  For small primes the correction is
    added at the end.
    """
    p = fld.p
    if not fld.mersenne:
        corr = np.array([(dg.C * int(v)) % p for v in colsum.tolist()], dtype=np.uint64)
        return np.full((dg.L, len(corr)), _MAGIC_F), corr
    if dg.C == 0:                            # unsigned digits: the same constants for every output
        v0 = -dg.K0 % p
        return np.array([[((v0 >> s) & ((1 << w) - 1)) + _MAGIC_F] for s, w in zip(dg.shifts, widths)]), None
    if len(colsum) <= 256:
        vs = [(dg.C * int(c) - dg.K0) % p for c in colsum.tolist()]
        mag = np.array([[(x >> s) & ((1 << w) - 1) for x in vs] for s, w in zip(dg.shifts, widths)],
                       dtype=np.float64)
    else:
        vv = fld.sub(fld.mul(fld.from_int(colsum), _U64(dg.C)), _U64(dg.K0))
        mag = np.stack([((vv >> _U64(s)) & m).astype(np.float64) for s, m in zip(dg.shifts, dg.masks)])
    mag += _MAGIC_F
    return mag, None


def _split(dg: _Digits, src: np.ndarray, ub: list[np.ndarray]) -> None:
    """Balanced digits of the canonical shares ``src`` as float64 bits, into the uint64 views ``ub``.

    A digit u < 2**52 OR-ed into the bits of 2**52 is the float 2**52 + u; the caller
    subtracts ``fsub`` = 2**52 + offset from every digit in one pass.
    """
    L = dg.L
    for j, (s, m) in enumerate(zip(dg.shifts, dg.masks)):
        if s == 0:
            np.bitwise_and(src, m, out=ub[j])
        else:
            np.right_shift(src, _U64(s), out=ub[j])
            if j < L - 1:
                np.bitwise_and(ub[j], m, out=ub[j])


def _combine(dg: _Digits, nb: int, gi: list[np.ndarray], tmp: np.ndarray, out: np.ndarray,
             fld: PrimeField, corr: np.ndarray | None) -> None:
    """out = a @ M mod p (canonical) from gi[j] = G_j + c_j + B (int64 views; clobbered)."""
    P = _U64(fld.p)
    if not fld.mersenne:
        acc = np.zeros(out.shape, dtype=np.uint64)
        for g, s in zip(gi, dg.shifts):
            g -= np.int64(_B)
            r = np.mod(g, np.int64(fld.p)).astype(np.uint64)
            fld.add(acc, np.remainder(r * _U64(pow(2, s, fld.p)), P), out=acc)
        fld.add(acc, corr, out=out)
        return
    # 2**S g = 2**S (q 2**(61-S) + r) = r 2**S + q 2**61 = r 2**S + q (mod p), r 2**S < 2**61;
    # g + B has the same r (B is a multiple of 2**48), and q + (B >> (61 - S))
    x = gi[0]
    for j in range(1, dg.L):
        s = dg.shifts[j]
        np.bitwise_and(gi[j], np.int64((1 << (61 - s)) - 1), out=tmp)
        np.left_shift(tmp, np.int64(s), out=tmp)
        np.right_shift(gi[j], np.int64(61 - s), out=gi[j])
        np.add(x, gi[j], out=x)
        np.add(x, tmp, out=x)
    xv = x.view(np.uint64)
    tv = tmp.view(np.uint64)
    if dg.L == 2 and nb <= MAX_BLOCKS:
        # x lies in [2p, 4p) (B is about 2.1 p, the sums are below 2**57 + 2**61)
        np.subtract(xv, P + P, out=xv)
    else:
        # 0 < x < 2**64: one Mersenne fold leaves [0, p + 8)
        np.bitwise_and(xv, P, out=tv)
        np.right_shift(xv, _U64(61), out=xv)
        np.add(xv, tv, out=xv)
    np.subtract(xv, P, out=tv)
    np.minimum(xv, tv, out=out)


def _add_magic(flat: np.ndarray, L: int, n: int, N: int, mag: np.ndarray, mag_t, t: int) -> None:
    """Add the per-digit (mag of shape (L, 1)) or per-digit-and-column (L, N) constants."""
    if mag.shape[1] == 1:
        g = flat[:L * n * N].reshape(L, n * N)
        np.add(g, mag, out=g)
    else:
        _add_magic_rows(flat, L, n, N, mag_t, t)


def _add_magic_rows(flat: np.ndarray, L: int, n: int, N: int, mag_t: np.ndarray, t: int) -> None:
    """flat = L blocks of (n, N) products; add mag (L, N) to every row of block j.

    ``mag_t`` is mag repeated over t rows, (L, 1, t*N), so numpy's inner loop runs over t*N
    elements rather than N (a short inner loop costs more than the addition).
    """
    full = n - n % t
    if full == n:
        g = flat[:L * n * N].reshape(L, n // t, t * N)
        np.add(g, mag_t, out=g)
        return
    for j in range(L):
        seg = flat[j * n * N:(j + 1) * n * N]
        if full:
            g2 = seg[:full * N].reshape(full // t, t * N)
            np.add(g2, mag_t[j], out=g2)
        g2 = seg[full * N:].reshape(n - full, N)
        np.add(g2, mag_t[j, :, :N], out=g2)


def _unbias(gi: np.ndarray, nb: int) -> None:
    """gi holds the sum of nb blocks, each + B (mod 2**64): leave a single + B."""
    gu = gi.view(np.uint64)
    np.subtract(gu, _U64(((nb - 1) * _B) % (1 << 64)), out=gu)


def _chunk(L: int, K: int, N: int, total: int, multiple: int = 1) -> int:
    # small enough that the elementwise passes stay near the cache, large enough for the gemm
    rows = max(CHUNK_ELEMENTS // max(1, L * max(K, N)), MIN_GEMM_ROWS // L, 1)
    rows = -(-rows // multiple) * multiple
    return min(total, rows)


def _left(a2: np.ndarray, m: np.ndarray, pl: Plan, fld: PrimeField, colsum) -> np.ndarray:
    """(R, K) canonical shares @ (K, N) public int64 -> (R, N) canonical: digits stacked on rows."""
    R, K = a2.shape
    N = m.shape[1]
    out = np.empty((R, N), dtype=np.uint64)
    dg = _digits(pl.widths, fld.p, pl.halves)
    L, cuts, nb = dg.L, pl.cuts, pl.blocks
    mag, corr = _corrections(dg, pl.widths, colsum, fld)
    if mag.shape[1] == 1:
        t, mag_t = 1, None                   # one constant per digit: a plain broadcast add
    else:
        t = max(1, min(-(-256 // N), R))
        mag_t = np.concatenate([mag] * t, axis=1).reshape(L, 1, t * N)
    mf = m.astype(np.float64)
    fsub = dg.fsub.reshape(L, 1, 1)
    rc = _chunk(L, K, N, R, t)
    ubuf = _scratch("digits", L * rc * K, np.uint64)
    abuf = _scratch("sums", L * rc * N, np.float64)
    gbuf = _scratch("products", L * rc * N if nb > 1 else 0, np.float64)
    tbuf = _scratch("tmp", rc * N, np.int64)
    for r0 in range(0, R, rc):
        n = min(rc, R - r0)
        ub = ubuf[:L * n * K].reshape(L, n, K)
        fb = ub.view(np.float64)
        if pl.halves:
            src = a2[r0:r0 + n].view(np.uint32).reshape(n, K, 2)
            np.copyto(fb, src.transpose(2, 0, 1), casting="unsafe")
        else:
            _split(dg, a2[r0:r0 + n], list(ub))
            np.bitwise_or(ub, _MAGIC, out=ub)
            np.subtract(fb, fsub, out=fb)
        f2 = fb.reshape(L * n, K)
        acc = abuf[:L * n * N].reshape(L * n, N)
        if nb == 1:
            np.matmul(f2, mf, out=acc)
            _add_magic(abuf, L, n, N, mag, mag_t, t)
        else:
            g = gbuf[:L * n * N].reshape(L * n, N)
            for b in range(nb):
                k0, k1 = cuts[b], cuts[b + 1]
                if b == 0:
                    np.matmul(f2[:, k0:k1], mf[k0:k1], out=acc)
                    _add_magic(abuf, L, n, N, mag, mag_t, t)
                else:
                    np.matmul(f2[:, k0:k1], mf[k0:k1], out=g)
                    np.add(g, _MAGIC_F, out=g)
                    np.add(acc.view(np.int64), g.view(np.int64), out=acc.view(np.int64))
            _unbias(acc, nb)
        gi = abuf[:L * n * N].view(np.int64).reshape(L, n, N)
        _combine(dg, nb, list(gi), tbuf[:n * N].reshape(n, N), out[r0:r0 + n], fld, corr)
    return out


def _right(m: np.ndarray, a2: np.ndarray, pl: Plan, fld: PrimeField, colsum) -> np.ndarray:
    """(J, K) public int64 @ (K, C) canonical shares -> (J, C) canonical: digits stacked on columns."""
    J, K = m.shape
    C = a2.shape[1]
    out = np.empty((J, C), dtype=np.uint64)
    dg = _digits(pl.widths, fld.p, pl.halves)
    L, cuts, nb = dg.L, pl.cuts, pl.blocks
    mag, corr = _corrections(dg, pl.widths, colsum, fld)
    if corr is not None:
        corr = corr[:, None]                 # one correction per output row here
    mag = np.ascontiguousarray(mag.T).reshape(mag.shape[1], L, 1)
    mf = m.astype(np.float64)
    fsub = dg.fsub.reshape(1, L, 1)
    cc = _chunk(L, K, J, C)
    ubuf = _scratch("digits", L * cc * K, np.uint64)
    abuf = _scratch("sums", L * cc * J, np.float64)
    gbuf = _scratch("products", L * cc * J if nb > 1 else 0, np.float64)
    tbuf = _scratch("tmp", cc * J, np.int64)
    res = _scratch("res", cc * J, np.uint64)
    for c0 in range(0, C, cc):
        n = min(cc, C - c0)
        ub = ubuf[:L * n * K].reshape(K, L, n)
        fb = ub.view(np.float64)
        if pl.halves:
            src = a2[:, c0:c0 + n].view(np.uint32).reshape(K, n, 2)
            np.copyto(fb, src.transpose(0, 2, 1), casting="unsafe")
        else:
            _split(dg, a2[:, c0:c0 + n], [ub[:, j, :] for j in range(L)])
            np.bitwise_or(ub, _MAGIC, out=ub)
            np.subtract(fb, fsub, out=fb)
        f2 = fb.reshape(K, L * n)
        acc = abuf[:L * n * J].reshape(J, L * n)
        if nb == 1:
            np.matmul(mf, f2, out=acc)
            a3 = acc.reshape(J, L, n)
            np.add(a3, mag, out=a3)
        else:
            g = gbuf[:L * n * J].reshape(J, L * n)
            for b in range(nb):
                k0, k1 = cuts[b], cuts[b + 1]
                if b == 0:
                    np.matmul(mf[:, k0:k1], f2[k0:k1], out=acc)
                    a3 = acc.reshape(J, L, n)
                    np.add(a3, mag, out=a3)
                else:
                    np.matmul(mf[:, k0:k1], f2[k0:k1], out=g)
                    np.add(g, _MAGIC_F, out=g)
                    np.add(acc.view(np.int64), g.view(np.int64), out=acc.view(np.int64))
            _unbias(acc, nb)
        g3 = acc.view(np.int64).reshape(J, L, n)
        r = res[:J * n].reshape(J, n)
        _combine(dg, nb, [g3[:, j, :] for j in range(L)], tbuf[:J * n].reshape(J, n), r, fld, corr)
        out[:, c0:c0 + n] = r
    return out


def _prepare(m: np.ndarray, field: PrimeField, rows: int) -> tuple[Plan | None, np.ndarray | list]:
    """The plan for a centred int64 (K, N) public matrix, and its exact column sums."""
    am = np.abs(m)
    pl = plan(am, field, rows)
    if pl is None:
        return None, []
    top = int(am.max()) if am.size else 0
    colsum = m.sum(axis=0) if top * max(m.shape[0], 1) < 1 << 62 else m.astype(object).sum(axis=0)
    return pl, colsum


# ------------------------------------------------------------------ public API
def _public_signed(b, fld: PrimeField) -> np.ndarray:
    """Public operand as centred int64: uint64 = field elements; signed ints reduced to (-p/2, p/2]."""
    arr = np.asarray(b)
    if arr.dtype == np.uint64:
        return fld.to_signed(fld.asarray(arr, "public operand"))
    if arr.dtype.kind == "i":
        half = fld.p // 2
        if arr.size and (int(arr.max()) > half or int(arr.min()) < -half):
            return fld.to_signed(fld.from_int(arr))
        return arr.astype(np.int64, copy=False)
    if arr.dtype.kind in "uO":
        return fld.to_signed(fld.from_int(arr))
    raise TypeError(f"public operand must be an integer array (fixed point), got dtype {arr.dtype}")


def matmul_trusted(a: np.ndarray, m: np.ndarray, field: PrimeField = F61) -> np.ndarray:
    """``a @ m mod p`` for canonical uint64 shares ``a`` (..., K) and a centred int64 ``m`` (K, N) or (K,).

    The inputs are not checked (callers that hold validated shares and encoded public operands).
    """
    vec = m.ndim == 1
    m2 = m[:, None] if vec else m
    K, N = m2.shape
    lead = a.shape[:-1]
    if a.size == 0 or N == 0:
        out = np.zeros((*lead, N), dtype=np.uint64)
        return out[..., 0] if vec else out
    a2 = np.ascontiguousarray(a.reshape(-1, K))
    pl, colsum = _prepare(m2, field, a2.shape[0])
    if pl is None:
        out = field.matmul(a2, field.from_int(m2))
    else:
        out = _left(a2, m2, pl, field, colsum)
    out = out.reshape(*lead, N)
    return out[..., 0] if vec else out


def lmatmul_trusted(m: np.ndarray, a: np.ndarray, field: PrimeField = F61) -> np.ndarray:
    """``m @ a mod p`` for a centred int64 ``m`` (J, K) and canonical uint64 shares ``a`` (K, ...); unchecked."""
    J, K = m.shape
    rest = a.shape[1:]
    if a.size == 0 or J == 0:
        return np.zeros((J, *rest), dtype=np.uint64)
    a2 = np.ascontiguousarray(a.reshape(K, -1))
    pl, colsum = _prepare(m.T, field, a2.shape[1])
    if pl is None:
        # (m @ a)^T = a^T @ m^T with the generic two-sided limb product
        out = np.ascontiguousarray(field.matmul(np.ascontiguousarray(a2.T), field.from_int(m.T)).T)
    else:
        out = _right(m, a2, pl, field, colsum)
    return out.reshape(J, *rest)


def batched_lmatmul_trusted(m: np.ndarray, a: np.ndarray, field: PrimeField = F61,
                            rowmax: int | None = None) -> np.ndarray:
    """``m[b] @ a[b] mod p`` for every b: centred integers ``m`` (B, J, K), int64 or float64 holding integers
    below 2**53, canonical uint64 shares ``a`` (B, K, N).  ``rowmax``: the largest row sum of |m| when the
    caller knows it already.

    A different public matrix per batch element (F³'s graph per sample) rules out stacking the
    digits into one gemm; numpy's stacked matmul still runs every product in C, so the Python cost
    is per batch, not per element.  When every row sum of |m| is at most ``_HALVES_LIMIT`` (about
    2**19: F³'s operands at their default fractional bits) :func:`_batched_halves` does it with
    the share's 32-bit halves.  Otherwise the share is cut into 2, 3 or 4 unsigned digits, as few as keep
    every digit product exact in float64 (digit bound times the largest row sum of |m| below 2**52);
    each digit's product G_j is reduced mod p and shifted into place with the Mersenne rule
    2**S x = (x mod 2**(61-S)) 2**S + (x >> (61-S)) (mod 2**61 - 1).
    Other fields, row sums too large even for 4 digits, or products of ``BATCH_BELOW`` multiply-adds or
    more take :func:`lmatmul_trusted` per element.
    Unchecked.
    """
    B, J, K = m.shape
    N = a.shape[-1]
    if a.shape != (B, K, N):
        raise ValueError(f"batched_lmatmul: shapes {m.shape} @ {a.shape} do not match")
    if B == 0 or J == 0 or N == 0:
        return np.zeros((B, J, N), dtype=np.uint64)
    if rowmax is None:
        rowmax = int(np.abs(m).sum(axis=-1).max()) if K else 0
    if field.p == (1 << 61) - 1 and _LITTLE and rowmax <= _HALVES_LIMIT:
        # two digits, float-bit conversion, batch chunks near the cache: measured on F³'s holder
        # products at 207 owners, 1.5-5x the generic digits below and 2.8x the per-element products
        # for wide outputs (dÂ = dU Gᵀ)
        return _batched_halves(m, np.ascontiguousarray(a), field)
    widths = next((w for w in _BATCH_DIGITS if ((1 << max(w)) - 1) * rowmax < 1 << 52), None)
    # for these generic digits (larger row sums), large products amortise numpy's per-call cost and the
    # per-product kernel does fewer passes: measured on F³'s shapes before the halves path, batching won
    # below about 2**18 multiply-adds each and for narrow outputs at any size, while wide outputs ran
    # 2x faster per product
    if field.p != (1 << 61) - 1 or widths is None or (J * K * N >= BATCH_BELOW and N > BATCH_NARROW):
        mi = m if m.dtype == np.int64 else m.astype(np.int64)
        return np.stack([lmatmul_trusted(mi[b], a[b], field) for b in range(B)])
    L = len(widths)
    digits = np.empty((B, K, L * N), dtype=np.float64)
    shift = 0
    for j, w in enumerate(widths):
        np.copyto(digits[..., j * N:(j + 1) * N], (a >> _U64(shift)) & _U64((1 << w) - 1), casting="unsafe")
        shift += w
    g = np.matmul(m.astype(np.float64, copy=False), digits)          # exact integers, |g| < 2**52
    P = _U64(field.p)
    out = np.zeros((B, J, N), dtype=np.uint64)
    tmp = np.empty_like(out)
    shift = 0
    for j, w in enumerate(widths):
        gj = g[..., j * N:(j + 1) * N].astype(np.int64).view(np.uint64)
        np.add(gj, P, out=gj)                             # g + p lies in (0, 2**62): g mod p by one fold
        np.bitwise_and(gj, P, out=tmp)
        np.right_shift(gj, _U64(61), out=gj)
        np.add(gj, tmp, out=gj)
        np.minimum(gj, gj - P, out=gj)
        if shift:
            np.right_shift(gj, _U64(61 - shift), out=tmp)
            np.bitwise_and(gj, _U64((1 << (61 - shift)) - 1), out=gj)
            np.left_shift(gj, _U64(shift), out=gj)
            np.add(gj, tmp, out=gj)                       # < 2**61 + 2**shift: one subtraction at most
            np.minimum(gj, gj - P, out=gj)
        np.add(out, gj, out=out)
        np.minimum(out, out - P, out=out)                 # x - p wraps to a huge value when x < p
        shift += w
    return out


def _batched_halves(m: np.ndarray, a: np.ndarray, field: PrimeField) -> np.ndarray:
    """:func:`batched_lmatmul_trusted` when every row sum of |m| is at most ``_HALVES_LIMIT``: the
    share's two 32-bit halves as the digits, and :func:`_left`'s float-bit conversion and Mersenne
    combine, over chunks of the batch that stay near the cache.

    The digits are stacked on a leading axis, (2, b, K, N), so one broadcast matmul gives each
    digit's products contiguously, (2, b, J, N); |G_j| <= (2**32 - 1) * rowmax leaves room for the
    correction digit below 2**51, so adding ``1.5 * 2**52`` (and the correction) converts exactly.
    """
    B, J, K = m.shape
    N = a.shape[-1]
    dg = _digits(_HALVES, field.p, True)
    mag, _ = _corrections(dg, _HALVES, None, field)       # unsigned digits: one constant per digit
    mf = m if m.dtype == np.float64 else m.astype(np.float64)
    out = np.empty((B, J, N), dtype=np.uint64)
    per = min(B, max(1, CHUNK_ELEMENTS // max(1, J * N + K * N)))
    dbuf = _scratch("batch digits", 2 * per * K * N, np.float64)
    gbuf = _scratch("batch products", 2 * per * J * N, np.float64)
    tbuf = _scratch("batch tmp", per * J * N, np.int64)
    halves = a.view(np.uint32).reshape(B, K, N, 2)
    for b0 in range(0, B, per):
        n = min(per, B - b0)
        d = dbuf[:2 * n * K * N].reshape(2, n, K, N)
        np.copyto(d, halves[b0:b0 + n].transpose(3, 0, 1, 2), casting="unsafe")
        g = gbuf[:2 * n * J * N].reshape(2, n, J, N)
        np.matmul(mf[b0:b0 + n], d, out=g)
        g2 = g.reshape(2, n * J * N)
        np.add(g2, mag, out=g2)
        gi = g.view(np.int64)
        _combine(dg, 1, [gi[0], gi[1]], tbuf[:n * J * N].reshape(n, J, N), out[b0:b0 + n], field, None)
    return out


def matmul(a, b, field: PrimeField = F61) -> np.ndarray:
    """Exact ``a @ b mod p``: shares ``a`` (..., K) uint64 canonical, public integers ``b`` (K, N) or (K,)."""
    a = field.asarray(a, "shares")
    bs = _public_signed(b, field)
    if a.ndim < 1 or bs.ndim not in (1, 2) or a.shape[-1] != bs.shape[0]:
        raise ValueError(f"matmul needs shares (..., K) and public (K, N) or (K,), got {a.shape} and {bs.shape}")
    return matmul_trusted(a, bs, field)


def lmatmul(b, a, field: PrimeField = F61) -> np.ndarray:
    """Exact ``b @ a mod p``: public integers ``b`` (M, K), shares ``a`` (K, ...)."""
    a = field.asarray(a, "shares")
    bs = _public_signed(b, field)
    if bs.ndim != 2 or a.ndim < 1 or a.shape[0] != bs.shape[1]:
        raise ValueError(f"lmatmul needs public (M, K) and shares (K, ...), got {bs.shape} and {a.shape}")
    return lmatmul_trusted(bs, a, field)
