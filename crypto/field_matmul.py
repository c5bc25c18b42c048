"""Exact products of Shamir shares (GF(p) elements) with public integer matrices, at BLAS speed.

``matmul(a, b)`` computes ``a @ b mod p`` for shares ``a`` (canonical uint64, shape (..., K))
and a public integer matrix ``b`` (shape (K, N) or (K,)); ``lmatmul(b, a)`` computes ``b @ a``.

How: both operands are taken as centred signed integers (a share v in [0, p) as v or v - p) and
split in two's complement into limbs: lower limbs unsigned ``w`` bits, the top limb signed.  Each
pair of limb matrices is multiplied with float64 BLAS, which is exact while every partial sum of
``|x_mk| |y_kn|`` stays <= 2**53; the plan (limb counts, widths, blocks over K) is chosen from
public bounds so that it does (the share side is bounded by (p - 1) / 2, the public side by its
actual column sums of absolute values).  The limb products (exact integers) are summed in int64,
reduced mod p and shifted by ``2**(shift)`` mod p (a rotation for p = 2**61 - 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .field import F61, PrimeField

__all__ = ["Plan", "plan", "matmul", "lmatmul"]

EXACT = 1 << 53


@dataclass(frozen=True)
class Plan:
    """Limb splits: left operand ``la`` limbs of ``wa`` bits, right ``lb`` of ``wb``; K in blocks of ``kblock``."""
    la: int
    wa: int
    lb: int
    wb: int
    kblock: int


def _split_width(bits: int, limbs: int) -> tuple[int, int]:
    """Width and digit bound of a two's-complement split of values |v| < 2**bits into ``limbs`` limbs."""
    if limbs == 1:
        return bits + 1, 1 << bits
    w = -(-bits // limbs)
    top = 1 << max(0, bits - w * (limbs - 1))
    return w, max((1 << w) - 1, top)


def plan(bits_a: int, bits_b: int, K: int, colsum_b: int | None = None) -> Plan:
    """Cheapest exact split for |a| < 2**bits_a, |b| < 2**bits_b, inner dimension K.

    ``colsum_b`` (largest column sum of |b|) allows a tighter check when b is not split.
    """
    best = None
    for la in range(1, 7):
        wa, da = _split_width(bits_a, la)
        for lb in range(1, 5):
            wb, db = _split_width(bits_b, lb)
            if lb == 1 and colsum_b is not None and da * colsum_b <= EXACT:
                kb = max(K, 1)
            else:
                kb = EXACT // (da * db)
            if kb < 1:
                continue
            kb = min(kb, max(K, 1))
            cost = la * lb * (2 * K + 40 * -(-max(K, 1) // kb))
            if best is None or cost < best[0]:
                best = (cost, Plan(la, wa, lb, wb, int(kb)))
    if best is None:
        raise ValueError(f"no exact limb split for {bits_a}-bit by {bits_b}-bit operands")
    return best[1]


def _limbs(v: np.ndarray, limbs: int, w: int) -> list[np.ndarray]:
    """Two's-complement limbs of int64 values as float64: lower ones unsigned, the top one signed."""
    if limbs == 1:
        return [v.astype(np.float64)]
    mask = np.int64((1 << w) - 1)
    out = [((v >> np.int64(w * j)) & mask).astype(np.float64) for j in range(limbs - 1)]
    out.append((v >> np.int64(w * (limbs - 1))).astype(np.float64))
    return out


def _centred_shares(a: np.ndarray, fld: PrimeField) -> np.ndarray:
    s = a.astype(np.int64)
    return np.where(a > np.uint64(fld.p // 2), s - np.int64(fld.p), s)


def _public_signed(b, fld: PrimeField) -> np.ndarray:
    """Public operand as centred int64: uint64 = field elements; signed ints reduced to (-p/2, p/2]."""
    arr = np.asarray(b)
    if arr.dtype == np.uint64:
        return _centred_shares(fld.asarray(arr, "public operand"), fld)
    if arr.dtype.kind == "i":
        half = fld.p // 2
        if arr.size and (int(arr.max()) > half or int(arr.min()) < -half):
            return _centred_shares(fld.from_int(arr), fld)
        return arr.astype(np.int64)
    if arr.dtype.kind == "O":
        return _centred_shares(fld.from_int(arr), fld)
    raise TypeError(f"public operand must be an integer array (fixed point), got dtype {arr.dtype}")


def _reduce_i64(x: np.ndarray, fld: PrimeField) -> np.ndarray:
    """Canonical residues of int64 values with |x| <= 2**61."""
    if not fld.mersenne:
        return np.mod(x, np.int64(fld.p)).astype(np.uint64)
    P = np.uint64(fld.p)
    u = x.view(np.uint64) + (P + P)          # wraps to x + 2p >= 0 for negative x
    y = (u & P) + (u >> np.uint64(61))
    return np.minimum(y, y - P)


def _core(x: np.ndarray, bits_x: int, y: np.ndarray, fld: PrimeField, share_left: bool) -> np.ndarray:
    """Exact (x @ y) mod p for signed int64 x (M, K) and y (K, N); the share side has ``bits`` p-1."""
    M, K = x.shape
    N = y.shape[1]
    share_bits = (fld.p // 2).bit_length()
    if share_left:
        pub = y
        bits_pub = int(np.abs(pub).max()).bit_length() if pub.size else 0
        colsum = int(np.abs(pub).sum(axis=0).max()) if pub.size else 0
        pl = plan(share_bits, bits_pub, K, colsum)
        la, wa, lb, wb = pl.la, pl.wa, pl.lb, pl.wb
    else:
        pub = x
        bits_pub = int(np.abs(pub).max()).bit_length() if pub.size else 0
        colsum = int(np.abs(pub).sum(axis=1).max()) if pub.size else 0
        pl = plan(share_bits, bits_pub, K, colsum)
        la, wa, lb, wb = pl.lb, pl.wb, pl.la, pl.wa
    out = np.zeros((M, N), dtype=np.uint64)
    if K == 0 or M == 0 or N == 0:
        return out
    for k0 in range(0, K, pl.kblock):
        xl = np.stack(_limbs(x[:, k0:k0 + pl.kblock], la, wa))            # (la, M, Kb)
        yl = np.concatenate(_limbs(y[k0:k0 + pl.kblock], lb, wb), axis=1)  # (Kb, lb*N)
        prod = (xl.reshape(la * M, -1) @ yl).reshape(la, M, lb, N)
        for j in range(la):
            for l in range(lb):
                term = _reduce_i64(prod[j, :, l, :].astype(np.int64), fld)
                fld.add(out, fld.mul_pow2(term, wa * j + wb * l), out=out)
    return out


def matmul(a, b, field: PrimeField = F61) -> np.ndarray:
    """Exact ``a @ b mod p``: shares ``a`` (..., K) uint64 canonical, public integers ``b`` (K, N) or (K,)."""
    a = field.asarray(a, "shares")
    bs = _public_signed(b, field)
    if a.ndim < 1 or bs.ndim not in (1, 2) or a.shape[-1] != bs.shape[0]:
        raise ValueError(f"matmul needs shares (..., K) and public (K, N) or (K,), got {a.shape} and {bs.shape}")
    vec = bs.ndim == 1
    b2 = bs[:, None] if vec else bs
    out = _core(_centred_shares(a.reshape(-1, a.shape[-1]), field), 0, b2, field, True)
    out = out.reshape(*a.shape[:-1], b2.shape[1])
    return out[..., 0] if vec else out


def lmatmul(b, a, field: PrimeField = F61) -> np.ndarray:
    """Exact ``b @ a mod p``: public integers ``b`` (M, K), shares ``a`` (K, ...)."""
    a = field.asarray(a, "shares")
    bs = _public_signed(b, field)
    if bs.ndim != 2 or a.ndim < 1 or a.shape[0] != bs.shape[1]:
        raise ValueError(f"lmatmul needs public (M, K) and shares (K, ...), got {bs.shape} and {a.shape}")
    rest = a.shape[1:]
    out = _core(bs, 0, _centred_shares(a.reshape(a.shape[0], -1), field), field, False)
    return out.reshape(bs.shape[0], *rest)
