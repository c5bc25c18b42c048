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

Floats go through :class:`~fedhet.crypto.fixedpoint.FixedPoint`
(:func:`share_float`, :func:`reconstruct_float`); byte strings such as 32-byte
seeds and keys through :func:`share_bytes` / :func:`reconstruct_bytes`.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from .field import F61, PrimeField
from .fixedpoint import FixedPoint
from .prg import PRG

__all__ = [
    "share", "reconstruct", "lagrange_coefficients",
    "share_float", "reconstruct_float", "share_bytes", "reconstruct_bytes",
]

# Elements per chunk: the secret, t - 1 random rows, n output rows and a
# temporary for one chunk stay in L2 cache.
_CHUNK = 1 << 15


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


def share(secret, n: int, t: int, prg: PRG | None = None, field: PrimeField = F61,
          out: np.ndarray | None = None) -> np.ndarray:
    """t-of-n shares of a field array; result shape ``(n, *secret.shape)``, row i for point x = i + 1.

    ``prg`` supplies the polynomial randomness (default: a fresh OS-seeded
    PRG); a seeded PRG makes the sharing reproducible, and must then be secret.
    ``out``, a C-contiguous uint64 array of the result's shape, is filled
    instead of allocating (saves page faults when sharing repeatedly).
    """
    n, t = _check_nt(n, t, field)
    secret = field.asarray(secret, "secret")
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
    shares = field.asarray(shares, "shares")
    if shares.ndim < 1 or shares.shape[0] != len(pts):
        raise ValueError(f"got {shares.shape[0] if shares.ndim else 0} shares for {len(pts)} points")
    if t is not None and len(pts) < int(t):
        raise ValueError(f"need at least t={int(t)} shares to reconstruct, got {len(pts)}")
    lam = [np.uint64(v) for v in _lagrange(pts, 0, field.p)]
    shape = shares.shape[1:]
    flat = np.ascontiguousarray(shares).reshape(len(pts), -1)
    N = flat.shape[1]
    out = np.empty(N, dtype=np.uint64)
    step = 1 << 16
    for lo in range(0, N, step):
        acc = field.mul(flat[0, lo:lo + step], lam[0])
        for i in range(1, len(pts)):
            field.add(acc, field.mul(flat[i, lo:lo + step], lam[i]), out=acc)
        out[lo:lo + step] = acc
    return out.reshape(shape)


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
