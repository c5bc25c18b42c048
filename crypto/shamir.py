"""Shamir t-of-n secret sharing of whole arrays over GF(p).

Every element ``s`` of the secret gets its own random polynomial ``f`` of
degree ``t - 1`` with ``f(0) = s``; party ``i`` (i = 1..n) holds ``f(i)``.
``share`` returns an array of shape ``(n, *secret.shape)`` whose row ``i - 1``
is party i's share.  Any ``t`` shares give ``s`` back by Lagrange
interpolation at 0 (:func:`reconstruct`, coefficients precomputed per set of
points); any ``t - 1`` shares are uniformly distributed whatever ``s`` is, so
they reveal nothing.

Shares are linear: parties can add their shares of two secrets, or multiply
them by public field constants or matrices (:meth:`PrimeField.matmul`, e.g.
a public weight matrix in fixed point), and reconstructing the results gives
the sum / product.  Products of two fixed-point values carry 2 f fractional
bits (decode with ``frac_bits=2 * f``).

Fast path.  The polynomial is drawn in the Newton (forward-difference) basis,
``f(x) = s + sum_k C(x, k) d_k`` with ``d_1..d_{t-1}`` uniform: the map from
``d`` to the usual coefficients is an invertible triangular linear map
(diagonal ``1/k!``), so uniform ``d`` is the same distribution as uniform
coefficients.  Then ``f(1), f(2), ...`` follow by repeated differencing with
only modular additions, ``n + (n - 1)(t - 2)`` of them, each three in-place numpy
passes (``add``, ``- p``, ``minimum``) over cache-sized chunks, and no
multiplication at all.  Randomness comes from the AES-CTR :class:`PRG`.
Reconstruction (:func:`_interpolate61`) multiplies by the precomputed Lagrange
coefficients with 31-bit limbs whose products add up without overflow, and
reduces mod 2**61 - 1 once per four shares (shift, mask, add: 2**61 = 1).
Both check that their uint64 inputs are field elements chunk by chunk, while
the chunk is in cache, instead of in a separate pass over memory.

Floats go through :class:`~fedhet.crypto.fixedpoint.FixedPoint`
(:func:`share_float`, :func:`reconstruct_float`); byte strings such as 32-byte
seeds and keys through :func:`share_bytes` / :func:`reconstruct_bytes`.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from .field import F61, P61, PrimeField
from .fixedpoint import FixedPoint
from .prg import PRG

__all__ = [
    "share", "share_at", "reconstruct", "lagrange_coefficients", "interpolate", "syndromes", "locate_error", "parity_check",
    "share_float", "reconstruct_float", "share_bytes", "reconstruct_bytes",
]

# Elements per chunk: the secret, t - 1 random rows, n output rows and a
# temporary for one chunk stay in L2 cache.
_CHUNK = 1 << 15
# Reconstruction keeps six chunk-sized buffers besides the shares' chunks.
_RCHUNK = 1 << 14


def _check_nt(n, t, field: PrimeField) -> tuple[int, int]:
    for name, v in (("n", n), ("t", t)):
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    n, t = int(n), int(t)
    if not 1 <= t <= n:
        raise ValueError(f"need 1 <= t <= n for a t-of-n sharing, got t={t}, n={n}")
    if n >= field.p:
        raise ValueError(f"n={n} parties need n distinct non-zero points, field {field!r} is too small")
    return n, t


def _canonical_input(x, field: PrimeField, name: str) -> tuple[np.ndarray, bool]:
    """``x`` as uint64 and whether its range still has to be checked (done chunk by chunk, in cache)."""
    if isinstance(x, np.ndarray) and x.dtype == np.uint64:
        return x, True
    return field.asarray(x, name), False


def _check_chunk(chunk: np.ndarray, field: PrimeField, name: str) -> None:
    if chunk.size and int(chunk.max()) >= field.p:
        raise ValueError(f"{name}: value {int(chunk.max())} is not a field element (must be in [0, {field.p}))")


def share(secret, n: int, t: int, prg: PRG | None = None, field: PrimeField = F61,
          out: np.ndarray | None = None) -> np.ndarray:
    """t-of-n shares of a field array; result shape ``(n, *secret.shape)``, row i for point x = i + 1.

    ``prg`` supplies the polynomial randomness (default: a fresh OS-seeded
    PRG); a seeded PRG makes the sharing reproducible, and must then be secret.
    ``out``, a C-contiguous uint64 array of the result's shape, is filled
    instead of allocating (saves page faults when sharing repeatedly).
    """
    n, t = _check_nt(n, t, field)
    secret, check = _canonical_input(secret, field, "secret")
    shape = secret.shape
    s = np.ascontiguousarray(secret).reshape(-1)
    N = s.size
    if out is None:
        out = np.empty((n, N), dtype=np.uint64)
    else:
        if (not isinstance(out, np.ndarray) or out.dtype != np.uint64 or out.shape != (n, *shape)
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous uint64 array of shape {(n, *shape)}")
        if np.shares_memory(out, s):
            raise ValueError("out must not overlap the secret")
        out = out.reshape(n, N)
    if t == 1:
        if check:
            _check_chunk(s, field, "secret")
        out[:] = s
        return out.reshape((n, *shape))
    prg = PRG.from_random() if prg is None else prg
    P = np.uint64(field.p)
    chunk = min(_CHUNK, max(N, 1))
    rbuf = np.empty((t - 1) * chunk, dtype=np.uint64)
    tmp_buf = np.empty(chunk, dtype=np.uint64)
    add, sub, minimum = np.add, np.subtract, np.minimum
    for lo in range(0, N, chunk):
        hi = min(N, lo + chunk)
        c = hi - lo
        if check:
            _check_chunk(s[lo:hi], field, "secret")
        rand = rbuf[: (t - 1) * c].reshape(t - 1, c)
        prg.fill_mod(rand, field.p)
        tmp = tmp_buf[:c]
        # D[0] = f(x), D[k] = k-th forward difference at x; start at x = 0.
        D = [s[lo:hi], *rand]
        for x in range(n):
            row = out[x, lo:hi]
            add(D[0], D[1], out=row)
            sub(row, P, out=tmp)
            minimum(row, tmp, out=row)
            D[0] = row
            if x + 1 < n:
                for k in range(1, t - 1):
                    d = D[k]
                    add(d, D[k + 1], out=d)
                    sub(d, P, out=tmp)
                    minimum(d, tmp, out=d)
    return out.reshape((n, *shape))


def share_at(secret, xs: Sequence[int], t: int, prg: PRG | None = None, field: PrimeField = F61) -> np.ndarray:
    """The shares :func:`share` would give at the points ``xs`` only; shape ``(len(xs), *secret.shape)``.

    For a dealer whose holders are a few of many parties (SecAgg+: its k + 1 of n): the cost grows
    with ``len(xs)``, not with the largest point.  The polynomial is drawn as in :func:`share` (the
    Newton basis, ``d_1..d_{t-1}`` uniform from ``prg``), so for a secret of at most one chunk
    and the same ``prg`` state the rows equal ``share(secret, n, t, prg)[x - 1]``; each is
    ``f(x) = s + sum_k C(x, k) d_k``, one exact matrix product (:meth:`PrimeField.matmul`).
    """
    pts = _check_points(xs, field)
    if not pts:
        raise ValueError("share_at needs at least one point")
    _check_nt(max(max(pts), t), t, field)
    secret, check = _canonical_input(secret, field, "secret")
    shape = secret.shape
    s = np.ascontiguousarray(secret).reshape(-1)
    if check:
        _check_chunk(s, field, "secret")
    if t == 1:
        return np.broadcast_to(s, (len(pts), s.size)).copy().reshape((len(pts), *shape))
    prg = PRG.from_random() if prg is None else prg
    N = s.size
    d = np.empty((t - 1, N), dtype=np.uint64)
    chunk = min(_CHUNK, max(N, 1))
    for lo in range(0, N, chunk):  # the same draws, chunk by chunk, as share()
        hi = min(N, lo + chunk)
        part = np.empty((t - 1, hi - lo), dtype=np.uint64)
        prg.fill_mod(part, field.p)
        d[:, lo:hi] = part
    p = field.p
    binom = np.empty((len(pts), t - 1), dtype=np.uint64)
    for i, x in enumerate(pts):
        c = 1
        for k in range(1, t):
            c = c * (x - k + 1) // k  # C(x, k), exact; 0 once k > x
            binom[i, k - 1] = c % p
    out = field.matmul(binom, d)
    field.add(out, s[None, :], out=out)
    return out.reshape((len(pts), *shape))


@lru_cache(maxsize=256)
def _lagrange(xs: tuple[int, ...], at: int, p: int) -> tuple[int, ...]:
    lam = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (at - xj) % p
                den = den * (xi - xj) % p
        lam.append(num * pow(den, -1, p) % p)
    return tuple(lam)


def _check_points(xs, field: PrimeField) -> tuple[int, ...]:
    try:
        pts = tuple(int(x) for x in xs)
    except TypeError:
        raise TypeError("xs must be a sequence of integer evaluation points") from None
    if not pts:
        raise ValueError("need at least one share to reconstruct")
    if len(set(pts)) != len(pts):
        raise ValueError(f"evaluation points must be distinct, got {list(pts)}")
    bad = [x for x in pts if not 1 <= x < field.p]
    if bad:
        raise ValueError(f"evaluation points must be in [1, p), got {bad}")
    return pts


def lagrange_coefficients(xs: Sequence[int], at: int = 0, field: PrimeField = F61) -> tuple[int, ...]:
    """Coefficients ``l_i`` with ``f(at) = sum_i l_i f(xs[i])`` for every polynomial of degree < len(xs)."""
    return _lagrange(_check_points(xs, field), int(at) % field.p, field.p)


def reconstruct(shares, xs: Sequence[int], field: PrimeField = F61, t: int | None = None) -> np.ndarray:
    """The secret from shares ``shares[i]`` held at points ``xs[i]`` (party i has x = i + 1).

    Pass at least t shares; with more, all are used (and must be consistent).
    If ``t`` is given, fewer than t shares raise ValueError instead of
    returning a meaningless value.
    """
    pts = _check_points(xs, field)
    shares, check = _canonical_input(shares, field, "shares")
    if shares.ndim < 1 or shares.shape[0] != len(pts):
        raise ValueError(f"got {shares.shape[0] if shares.ndim else 0} shares for {len(pts)} points")
    if t is not None and len(pts) < int(t):
        raise ValueError(f"need at least t={int(t)} shares to reconstruct, got {len(pts)}")
    lam = _lagrange(pts, 0, field.p)
    shape = shares.shape[1:]
    flat = np.ascontiguousarray(shares).reshape(len(pts), -1)
    if not field.mersenne:
        if check:
            _check_chunk(flat, field, "shares")
        acc = field.mul(flat[0], lam[0])
        for i in range(1, len(pts)):
            field.add(acc, field.mul(flat[i], lam[i]), out=acc)
        return acc.reshape(shape)
    return _interpolate61(flat, lam, check).reshape(shape)


def interpolate(shares, xs: Sequence[int], at: Sequence[int], field: PrimeField = F61) -> np.ndarray:
    """Values at the points ``at`` of the polynomial of degree < len(xs) through ``(xs[i], shares[i])``.

    Result shape ``(len(at), *shares.shape[1:])``.  ``at = [0]`` gives the secret like
    :func:`reconstruct`; evaluated at the points of further shares it checks them: redundant shares
    are consistent exactly when each equals the value there.  The Lagrange matrix is built in
    barycentric form with vectorised field arithmetic (O(len(at) * len(xs) + len(xs)**2) products,
    no Python loop over pairs) and applied with :meth:`PrimeField.matmul`.
    """
    pts = _check_points(xs, field)
    shares = field.asarray(shares, "shares")
    if shares.ndim < 1 or shares.shape[0] != len(pts):
        raise ValueError(f"got {shares.shape[0] if shares.ndim else 0} shares for {len(pts)} points")
    ats = [int(a) % field.p for a in at]
    flat = shares.reshape(len(pts), -1)
    out = field.matmul(_lagrange_matrix(pts, ats, field), flat) if ats else np.empty((0, flat.shape[1]), np.uint64)
    return out.reshape(len(ats), *shares.shape[1:])


def syndromes(shares, xs: Sequence[int], t: int, field: PrimeField = F61) -> np.ndarray:
    """``H @ shares`` for the parity-check matrix H of k shares at ``xs`` with threshold t.

    Shape ``(k - t, *shares.shape[1:])``: all zero exactly when the k shares lie on one
    polynomial of degree < t, i.e. the redundant shares are consistent.  H is the dual of
    the Reed-Solomon code the shares form, ``H[m, i] = v_i x_i**m`` (m < k - t) with
    ``v_i = 1 / prod_{j != i} (x_i - x_j)``: ``sum_i v_i h(x_i) = 0`` for every h of degree
    below k - 1, and ``f x**m`` is one for deg f < t.
    """
    pts = _check_points(xs, field)
    k, t = len(pts), int(t)
    shares = field.asarray(shares, "shares")
    if shares.ndim < 1 or shares.shape[0] != k:
        raise ValueError(f"got {shares.shape[0] if shares.ndim else 0} shares for {k} points")
    if not 1 <= t <= k:
        raise ValueError(f"need 1 <= t <= k shares, got t={t}, k={k}")
    flat = shares.reshape(k, -1)
    if k == t:
        return np.zeros((0, *shares.shape[1:]), dtype=np.uint64)
    x = np.array(pts, dtype=np.uint64)
    rows = [_dual_weights(pts, field)]
    for _ in range(k - t - 1):
        rows.append(field.mul(rows[-1], x))
    return field.matmul(np.stack(rows), flat).reshape(k - t, *shares.shape[1:])


def parity_check(xs: Sequence[int], t: int, field: PrimeField = F61, r: int | None = None) -> np.ndarray:
    """A random parity check ``c`` (length k) for shares at ``xs`` with threshold t: ``c @ shares``
    is zero for consistent shares, and for inconsistent ones non-zero except with probability
    below ``k / p`` over the choice of ``r`` (secret, drawn after the shares arrived).

    ``c_i = v_i g(x_i)`` with ``g(x) = (x - r)**(k - t - 1)``, one element of the dual code (see
    :func:`syndromes`): ``c @ y = sum_m C(k-t-1, m) (-r)**(k-t-1-m) S_m``, a polynomial in r of
    degree < k - t whose coefficients vanish only if the syndromes do.  O(k**2) vectorised
    products and k modular powers (the syndromes take O(k (k - t)) products and a matrix product).
    """
    pts = _check_points(xs, field)
    k, t = len(pts), int(t)
    if not 1 <= t <= k:
        raise ValueError(f"need 1 <= t <= k shares, got t={t}, k={k}")
    if k == t:
        return np.zeros(k, dtype=np.uint64)
    p = field.p
    if r is None:
        import secrets
        r = secrets.randbelow(p)
    g = np.array([pow(x - r, k - t - 1, p) for x in pts], dtype=np.uint64)
    return field.mul(_dual_weights(pts, field), g)


def _dual_weights(pts: tuple[int, ...], field: PrimeField) -> np.ndarray:
    """``v_i = 1 / prod_{j != i} (x_i - x_j)`` (barycentric weights; the dual code's column scales)."""
    x = np.array(pts, dtype=np.uint64)
    k = len(pts)
    e = _diff(x, x, field.p)
    e[np.arange(k), np.arange(k)] = 1
    return np.array(_batch_inverse([int(v) for v in _row_products(e, field)], field.p), dtype=np.uint64)


def _batch_inverse(vals: list[int], p: int) -> list[int]:
    """Inverses of non-zero residues with one modular inversion (Montgomery's trick)."""
    prefix, acc = [], 1
    for v in vals:
        prefix.append(acc)
        acc = acc * v % p
    inv = pow(acc, -1, p)
    out = [0] * len(vals)
    for i in range(len(vals) - 1, -1, -1):
        out[i] = inv * prefix[i] % p
        inv = inv * vals[i] % p
    return out


def locate_error(shares, xs: Sequence[int], t: int, field: PrimeField = F61) -> int | None:
    """The index of the one wrong share among k >= t + 2, or None.

    None when the shares are consistent, when k < t + 2 (one redundant share detects an error
    but cannot place it), or when no single share explains the syndromes (two or more wrong).
    With one wrong share i off by d, the syndromes are ``d v_i x_i**m``, so ``S_1 / S_0 = x_i``;
    the answer is checked: the other shares must then be consistent.
    """
    pts = _check_points(xs, field)
    k = len(pts)
    if k < int(t) + 2:
        return None
    S = syndromes(shares, pts, t, field).reshape(k - int(t), -1)
    cols = np.flatnonzero(S[0])
    if not cols.size:
        return None
    c = int(cols[0])
    x = int(S[1, c]) * pow(int(S[0, c]), -1, field.p) % field.p
    if x not in pts:
        return None
    i = pts.index(x)
    shares = field.asarray(shares, "shares")
    rest = [j for j in range(k) if j != i]
    if np.any(syndromes(shares[rest], [pts[j] for j in rest], t, field)):
        return None
    return i


def _row_products(m: np.ndarray, field: PrimeField) -> np.ndarray:
    """Product mod p of each row of a uint64 matrix (pairwise halving, vectorised)."""
    m = np.ascontiguousarray(m)
    while m.shape[1] > 1:
        if m.shape[1] % 2:
            m = np.concatenate([m, np.ones((m.shape[0], 1), dtype=np.uint64)], axis=1)
        m = field.mul(m[:, 0::2], m[:, 1::2])
    return m[:, 0]


def _diff(a: np.ndarray, b: np.ndarray, p: int) -> np.ndarray:
    """``(a[:, None] - b[None, :]) mod p`` for canonical uint64 vectors."""
    A, B = a[:, None], b[None, :]
    return np.where(A >= B, A - B, A + np.uint64(p) - B)


def _lagrange_matrix(pts: tuple[int, ...], ats: list[int], field: PrimeField) -> np.ndarray:
    """``L[j, i]`` with ``f(ats[j]) = sum_i L[j, i] f(pts[i])`` for deg f < len(pts)."""
    x = np.array(pts, dtype=np.uint64)
    a = np.array(ats, dtype=np.uint64)
    w = _dual_weights(pts, field)                    # barycentric weights 1 / prod_{j != i} (x_i - x_j)
    d = _diff(a, x, field.p)                         # a_j - x_i
    hit = d == 0                                     # an evaluation point that is a share point
    d[hit] = 1
    ell = _row_products(d, field)                    # prod_i (a_j - x_i), over the non-hits
    L = field.mul(field.mul(field.inv(d), w[None, :]), ell[:, None])
    rows = hit.any(axis=1)
    L[rows] = hit[rows].astype(np.uint64)
    return L


# Shares are split at bit 31 (y = yh 2**31 + yl, yh < 2**30) and so are the
# Lagrange coefficients (l = lh 2**31 + ll): every partial product is below
# 2**62, so the products of up to four shares add up in uint64 without
# reduction, in three sums by weight, 2**0, 2**31 and 2**62 = 2 (mod p).
_M31 = np.uint64((1 << 31) - 1)
_GROUP = 4


def _interpolate61(flat: np.ndarray, lam: tuple[int, ...], check: bool) -> np.ndarray:
    """``sum_i lam[i] * flat[i] mod 2**61 - 1``, chunk by chunk with preallocated buffers."""
    k, N = flat.shape
    P = np.uint64(P61)
    u31, u30, u61, u1 = np.uint64(31), np.uint64(30), np.uint64(61), np.uint64(1)
    coef = [(np.uint64(v & ((1 << 31) - 1)), np.uint64(v >> 31)) for v in lam]
    out = np.empty(N, dtype=np.uint64)
    chunk = min(_RCHUNK, max(N, 1))
    w0, w31, w62, yl, yh, tmp = np.empty((6, chunk), dtype=np.uint64)
    add, mul, band, shr, shl, sub, minimum = (np.add, np.multiply, np.bitwise_and, np.right_shift,
                                              np.left_shift, np.subtract, np.minimum)
    for lo in range(0, N, chunk):
        hi = min(N, lo + chunk)
        c = hi - lo
        W0, W31, W62, YL, YH, T = w0[:c], w31[:c], w62[:c], yl[:c], yh[:c], tmp[:c]
        acc = out[lo:hi]
        for g0 in range(0, k, _GROUP):
            for i in range(g0, min(k, g0 + _GROUP)):
                y = flat[i, lo:hi]
                if check:
                    _check_chunk(y, F61, "shares")
                cl, ch = coef[i]
                band(y, _M31, out=YL)
                shr(y, u31, out=YH)
                if i == g0:
                    mul(YL, cl, out=W0)
                    mul(YH, ch, out=W62)
                    mul(YL, ch, out=W31)
                else:
                    mul(YL, cl, out=T)
                    add(W0, T, out=W0)
                    mul(YH, ch, out=T)
                    add(W62, T, out=W62)
                    mul(YL, ch, out=T)
                    add(W31, T, out=W31)
                mul(YH, cl, out=T)
                add(W31, T, out=W31)
            # W0, W31 < 2**64: fold once (2**61 = 1), to below 2**61 + 8.
            shr(W0, u61, out=T)
            band(W0, P, out=W0)
            add(W0, T, out=W0)
            shr(W31, u61, out=T)
            band(W31, P, out=W31)
            add(W31, T, out=W31)
            sub(W31, P, out=T)
            minimum(W31, T, out=W31)            # canonical, so rotating it is multiplying by 2**31
            shr(W31, u30, out=T)
            shl(W31, u31, out=W31)
            band(W31, P, out=W31)
            np.bitwise_or(W31, T, out=W31)
            shl(W62, u1, out=W62)                # 2**62 = 2 (mod p); W62 < 2**62 before
            add(W0, W31, out=W0)
            add(W0, W62, out=W0)                 # < 2**63 + 2**62 + 8
            shr(W0, u61, out=T)
            band(W0, P, out=W0)
            add(W0, T, out=W0)
            sub(W0, P, out=T)
            if g0 == 0:
                minimum(W0, T, out=acc)
            else:
                minimum(W0, T, out=W0)
                add(acc, W0, out=acc)
                sub(acc, P, out=T)
                minimum(acc, T, out=acc)
    return out


def share_float(x, n: int, t: int, codec: FixedPoint | None = None, prg: PRG | None = None,
                field: PrimeField = F61) -> np.ndarray:
    """Fixed-point encode a float array (ValueError if out of range), then :func:`share` it."""
    codec = _codec(codec, field)
    return share(codec.encode(x), n, t, prg=prg, field=field)


def reconstruct_float(shares, xs: Sequence[int], codec: FixedPoint | None = None,
                      frac_bits: int | None = None, field: PrimeField = F61) -> np.ndarray:
    """:func:`reconstruct` then fixed-point decode (``frac_bits`` overrides the codec's, e.g. after a product)."""
    codec = _codec(codec, field)
    return codec.decode(reconstruct(shares, xs, field=field), frac_bits=frac_bits)


def _codec(codec: FixedPoint | None, field: PrimeField) -> FixedPoint:
    codec = FixedPoint(modulus=field.p) if codec is None else codec
    if codec.modulus != field.p:
        raise ValueError(f"fixed-point codec modulus {codec.modulus} differs from the field's p = {field.p}")
    return codec


def share_bytes(secret: bytes, n: int, t: int, prg: PRG | None = None, field: PrimeField = F61) -> np.ndarray:
    """Shares of a byte string (e.g. a 32-byte seed or key), shape ``(n, k)`` with k elements per share."""
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError(f"share_bytes needs bytes, got {type(secret).__name__}")
    return share(field.bytes_to_elements(bytes(secret)), n, t, prg=prg, field=field)


def reconstruct_bytes(shares, xs: Sequence[int], length: int, field: PrimeField = F61) -> bytes:
    """Inverse of :func:`share_bytes`; ValueError if the shares do not decode to ``length`` bytes."""
    return field.elements_to_bytes(reconstruct(shares, xs, field=field), length)
