"""GF(2^128) arithmetic on numpy arrays, for the VOLE and OKVS of the RR22 PSI backend.

Representation: the field is GF(2)[x] / (x^128 + x^7 + x^2 + x + 1); an element
is a polynomial whose coefficient of x^i is bit ``i % 64`` of 64-bit word
``i // 64`` (little-endian, no bit reflection, unlike GCM's GHASH).  Arrays of
elements are ``(n, 2)`` uint64 (word 0 low) or, on the wire, ``(n, 16)``
uint8 of the same bytes (:func:`from_bytes` / :func:`to_bytes`, views).
Addition is XOR.

Multiplication: the compiled kernels (numba) multiply carry-less by shifts and
XORs and reduce with the pentanomial; the product of a whole vector by one
constant (:func:`mul_const`) uses sixteen 256-entry tables of the constant's
multiples (the "four Russians" method: one table look-up per byte of the
other factor).  :func:`mul_int` is a slow, obviously correct reference on
Python integers that the tests compare the kernels with.
"""
from __future__ import annotations

import numpy as np
from numba import njit

MODULUS_LOW = 0x87           # x^7 + x^2 + x + 1: x^128 reduces to this
BYTES = 16


# ---------------------------------------------------------------- reference
def mul_int(a: int, b: int) -> int:
    """a * b in GF(2^128), elements as Python integers (bit i = coefficient of x^i): the reference."""
    r = 0
    for i in range(128):
        if (b >> i) & 1:
            r ^= a << i
    for i in range(254, 127, -1):
        if (r >> i) & 1:
            r ^= (1 << i) ^ (MODULUS_LOW << (i - 128))
    return r


def to_int(x: np.ndarray) -> int:
    """One element ((2,) uint64 or (16,) uint8) as a Python integer."""
    return int.from_bytes(np.ascontiguousarray(x).view(np.uint8).tobytes(), "little")


def from_int(a: int) -> np.ndarray:
    """A Python integer below 2^128 as a (2,) uint64 element."""
    if not 0 <= a < 1 << 128:
        raise ValueError("a GF(2^128) element is an integer in [0, 2^128)")
    return np.frombuffer(a.to_bytes(BYTES, "little"), dtype="<u8").copy()


def from_bytes(b: np.ndarray) -> np.ndarray:
    """(n, 16) uint8 -> (n, 2) uint64 (a view when contiguous)."""
    return np.ascontiguousarray(b, dtype=np.uint8).reshape(-1, BYTES).view("<u8")


def to_bytes(x: np.ndarray) -> np.ndarray:
    """(n, 2) uint64 -> (n, 16) uint8 (a view when contiguous)."""
    return np.ascontiguousarray(x, dtype="<u8").reshape(-1, 2).view(np.uint8)


# ------------------------------------------------------------------ kernels
@njit(cache=True, inline="always")
def _mul_words(a0, a1, b0, b1):  # pragma: no cover - compiled
    """Carry-less product of two 128-bit polynomials, reduced: (lo, hi)."""
    r0 = np.uint64(0)                     # the 256-bit product in r0..r3
    r1 = np.uint64(0)
    r2 = np.uint64(0)
    r3 = np.uint64(0)
    one = np.uint64(1)
    for h in range(2):                    # word h of b shifts a by 64 h more
        b = b0 if h == 0 else b1
        for i in range(64):
            if (b >> np.uint64(i)) & one:
                s = np.uint64(i)
                lo = a0 << s
                mid = a1 << s
                top = np.uint64(0)
                if i:
                    mid ^= a0 >> np.uint64(64 - i)
                    top = a1 >> np.uint64(64 - i)
                if h == 0:
                    r0 ^= lo
                    r1 ^= mid
                    r2 ^= top
                else:
                    r1 ^= lo
                    r2 ^= mid
                    r3 ^= top
    return _reduce(r0, r1, r2, r3)


@njit(cache=True, inline="always")
def _reduce(r0, r1, r2, r3):  # pragma: no cover - compiled
    # x^128 = x^7 + x^2 + x + 1: fold r2, r3 (bits 128..255) down twice
    m = np.uint64(MODULUS_LOW)
    # r3 * x^192 -> r3 * (x^7+x^2+x+1) * x^64: goes to words 1, 2
    lo3, hi3 = _clmul_small(r3, m)
    r1 ^= lo3
    r2 ^= hi3
    lo2, hi2 = _clmul_small(r2, m)
    r0 ^= lo2
    r1 ^= hi2
    return r0, r1


@njit(cache=True, inline="always")
def _clmul_small(a, m):  # pragma: no cover - compiled
    """a * (x^7 + x^2 + x + 1) for a 64-bit a: (lo, hi) words (hi has at most 7 bits)."""
    lo = a ^ (a << np.uint64(1)) ^ (a << np.uint64(2)) ^ (a << np.uint64(7))
    hi = (a >> np.uint64(63)) ^ (a >> np.uint64(62)) ^ (a >> np.uint64(57))
    return lo, hi


@njit(cache=True)
def _mul_vec(a, b, out):  # pragma: no cover - compiled
    for i in range(a.shape[0]):
        out[i, 0], out[i, 1] = _mul_words(a[i, 0], a[i, 1], b[i, 0], b[i, 1])


@njit(cache=True)
def _const_tables(c0, c1):  # pragma: no cover - compiled
    """t[k, v] = c * (v * x^(8k)) for every byte position k and byte value v: (16, 256, 2)."""
    t = np.zeros((16, 256, 2), dtype=np.uint64)
    for k in range(16):
        # c * x^(8k + j) for j = 0..7, then every byte value as their XOR
        base = np.zeros((8, 2), dtype=np.uint64)
        for j in range(8):
            e = 8 * k + j
            w0 = np.uint64(1) << np.uint64(e) if e < 64 else np.uint64(0)
            w1 = np.uint64(1) << np.uint64(e - 64) if e >= 64 else np.uint64(0)
            base[j, 0], base[j, 1] = _mul_words(c0, c1, w0, w1)
        for v in range(1, 256):
            low = v & -v
            j = 0
            while (1 << j) != low:
                j += 1
            t[k, v, 0] = t[k, v ^ low, 0] ^ base[j, 0]
            t[k, v, 1] = t[k, v ^ low, 1] ^ base[j, 1]
    return t


@njit(cache=True)
def _mul_tables(xb, t, out):  # pragma: no cover - compiled
    for i in range(xb.shape[0]):
        lo = np.uint64(0)
        hi = np.uint64(0)
        for k in range(16):
            v = xb[i, k]
            lo ^= t[k, v, 0]
            hi ^= t[k, v, 1]
        out[i, 0] = lo
        out[i, 1] = hi


@njit(cache=True)
def _weighted_sum(q, out):  # pragma: no cover - compiled
    """out[g] = sum_k x^k * q[g, k] for q (G, 128, 2): 128 bits of correlation packed into one element."""
    for g in range(q.shape[0]):
        r0 = q[g, 0, 0]
        r1 = q[g, 0, 1] ^ q[g, 64, 0]
        r2 = q[g, 64, 1]
        r3 = np.uint64(0)
        for k in range(1, 64):
            s = np.uint64(k)
            t = np.uint64(64 - k)
            a0 = q[g, k, 0]
            a1 = q[g, k, 1]
            r0 ^= a0 << s
            r1 ^= (a1 << s) ^ (a0 >> t)
            r2 ^= a1 >> t
            b0 = q[g, k + 64, 0]
            b1 = q[g, k + 64, 1]
            r1 ^= b0 << s
            r2 ^= (b1 << s) ^ (b0 >> t)
            r3 ^= b1 >> t
        out[g, 0], out[g, 1] = _reduce(r0, r1, r2, r3)


# ------------------------------------------------------------------ the API
def _elements(x: np.ndarray, what: str) -> np.ndarray:
    x = np.ascontiguousarray(x)
    if x.dtype == np.uint8:
        x = from_bytes(x)
    if x.dtype != np.uint64 or x.ndim != 2 or x.shape[1] != 2:
        raise ValueError(f"{what}: GF(2^128) elements are (n, 2) uint64 or (n, 16) uint8, got {x.dtype} {x.shape}")
    return x


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise a * b of two (n, 2) uint64 vectors."""
    a, b = _elements(a, "mul"), _elements(b, "mul")
    if a.shape != b.shape:
        raise ValueError(f"mul: shapes differ, {a.shape} and {b.shape}")
    out = np.empty_like(a)
    _mul_vec(a, b, out)
    return out


def mul_const(x: np.ndarray, c: np.ndarray | int) -> np.ndarray:
    """x * c for a vector x ((n, 2) uint64) and one element c (table look-ups, one per byte of x)."""
    x = _elements(x, "mul_const")
    cw = from_int(c) if isinstance(c, int) else np.ascontiguousarray(c, dtype="<u8").reshape(2)
    t = _const_tables(cw[0], cw[1])
    out = np.empty_like(x)
    _mul_tables(x.view(np.uint8).reshape(-1, BYTES), t, out)
    return out


def weighted_sum(q: np.ndarray) -> np.ndarray:
    """sum_k x^k q[:, k] for q (G, 128, 2) uint64: (G, 2).

    With ``q[g, k]`` the k-th of 128 correlated OTs (``t_k = q_k + r_k Δ``),
    the sums satisfy ``sum x^k t_k = sum x^k q_k + (sum r_k x^k) Δ``: one VOLE
    correlation whose value is the element with bits r (Gilboa's product).
    """
    q = np.ascontiguousarray(q, dtype="<u8")
    if q.ndim != 3 or q.shape[1:] != (128, 2):
        raise ValueError(f"weighted_sum: want (G, 128, 2) uint64, got {q.shape}")
    out = np.zeros((q.shape[0], 2), dtype=np.uint64)
    _weighted_sum(q, out)
    return out
