"""Vectorised arithmetic in a prime field GF(p) on numpy uint64 arrays.

The default field is ``F61 = PrimeField(2**61 - 1)``: p is a Mersenne prime,
so reduction mod p is a shift, a mask and an add (``2**61 = 1 mod p``), and a
field element fits a uint64 with three spare bits.  Small primes (< 2**32) are
supported too, through ``%``; tests use them to check distributions
exhaustively.

Representation: an element is a uint64 in ``[0, p)`` ("canonical").  Every
operation returns canonical values.  Operands that are uint64 numpy arrays are
trusted to be canonical (not re-checked, for speed); any other integer input
(Python ints of any size, signed numpy arrays, lists) is first reduced mod p,
so ``-1`` means ``p - 1``.  Use :meth:`PrimeField.asarray` to *validate* data
that came from elsewhere (e.g. shares from the network).  Floats are refused:
encode them with :mod:`fedhet.crypto.fixedpoint`.

Operations: ``add sub neg mul pow inv sum matmul``, ``from_int`` /
``to_signed`` / ``asarray``, ``random`` (from a :class:`~fedhet.crypto.prg.PRG`),
and ``bytes_to_elements`` / ``elements_to_bytes`` for sharing byte strings
(keys, seeds) as field elements.

How the 61-bit products are done without 128-bit integers: operands are split
into 32-bit halves, the four partial products fit in uint64, and the powers
``2**64 = 8`` and ``2**61 = 1 (mod p)`` fold them back (see ``_mul61``).
``matmul`` splits both matrices into 16-bit limbs and multiplies them as
float64 with BLAS, which is exact while every dot product stays below 2**53.
"""
from __future__ import annotations

import numpy as np

__all__ = ["PrimeField", "F61", "P61", "is_prime"]

P61 = (1 << 61) - 1
_U64 = np.uint64
_M32 = _U64(0xFFFFFFFF)


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin, exact for n < 3.3e24 (so for every uint64)."""
    n = int(n)
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for q in small:
        if n % q == 0:
            return n == q
    d, r = n - 1, 0
    while d % 2 == 0:
        d //= 2
        r += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


class PrimeField:
    """GF(p) for p = 2**61 - 1 (fast path) or a prime p < 2**32."""

    def __init__(self, p: int):
        if not isinstance(p, (int, np.integer)) or isinstance(p, bool):
            raise TypeError(f"field modulus must be an int, got {type(p).__name__}")
        p = int(p)
        if not (p == P61 or 2 <= p < 1 << 32):
            raise ValueError(f"field modulus must be 2**61 - 1 or a prime below 2**32, got {p}")
        if not is_prime(p):
            raise ValueError(f"field modulus {p} is not prime")
        self.p = p
        self.mersenne = p == P61
        self._P = _U64(p)
        # Bytes that always fit below p, used to pack byte strings.
        self.bytes_per_element = (p.bit_length() - 1) // 8

    def __repr__(self) -> str:
        return "PrimeField(2**61 - 1)" if self.mersenne else f"PrimeField({self.p})"

    def __eq__(self, other) -> bool:
        return isinstance(other, PrimeField) and other.p == self.p

    def __hash__(self) -> int:
        return hash(("PrimeField", self.p))

    # -- conversion ----------------------------------------------------------
    def from_int(self, x) -> np.ndarray:
        """Any integers (Python ints of any size, signed or unsigned arrays) reduced mod p."""
        if isinstance(x, np.ndarray) and x.dtype == np.uint64:
            return np.remainder(x, self._P)
        if isinstance(x, (bool, np.bool_)) or (isinstance(x, np.ndarray) and x.dtype == bool):
            raise TypeError("field elements must be integers, got booleans")
        if isinstance(x, (int, np.integer)):
            return np.array(int(x) % self.p, dtype=np.uint64)
        a = np.asarray(x)
        if a.dtype.kind == "u":
            return np.remainder(a.astype(np.uint64), self._P)
        if a.dtype.kind == "i":
            return np.mod(a.astype(np.int64), np.int64(self.p)).astype(np.uint64)
        if a.dtype.kind == "O":
            if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in a.reshape(-1)):
                raise TypeError("field elements must be integers")
            flat = [int(v) % self.p for v in a.reshape(-1)]
            return np.array(flat, dtype=np.uint64).reshape(a.shape)
        raise TypeError(
            f"field elements must be integers, got dtype {a.dtype}; encode floats with fedhet.crypto.fixedpoint"
        )

    def asarray(self, x, name: str = "array") -> np.ndarray:
        """Validate that ``x`` holds canonical elements (integers in [0, p)); return it as uint64.

        Raises ValueError naming ``name`` when a value is negative or >= p.
        """
        a = np.asarray(x)
        if a.dtype.kind not in "ui":
            raise TypeError(f"{name}: field elements must be an integer array, got dtype {a.dtype}")
        if a.size:
            hi = int(a.max())
            lo = 0 if a.dtype.kind == "u" else int(a.min())
            if lo < 0 or hi >= self.p:
                bad = lo if lo < 0 else hi
                raise ValueError(f"{name}: value {bad} is not a field element (must be in [0, {self.p}))")
        return a.astype(np.uint64, copy=False)

    def _u(self, x) -> np.ndarray:
        if isinstance(x, np.ndarray) and x.dtype == np.uint64:
            return x
        return np.asarray(self.from_int(x))

    def to_signed(self, a) -> np.ndarray:
        """Centred representatives as int64: values above p // 2 become ``v - p``."""
        a = self._u(a)
        s = a.astype(np.int64)
        return np.where(a > _U64(self.p // 2), s - np.int64(self.p), s)

    def zeros(self, shape) -> np.ndarray:
        return np.zeros(shape, dtype=np.uint64)

    # -- additive ------------------------------------------------------------
    # a + b < 2p < 2**64; subtracting p wraps around exactly when a + b < p,
    # so min(a + b, a + b - p) is the canonical sum.  Same trick for sub/neg.
    # ``out`` may be one of the operands (in-place update).
    def add(self, a, b, out: np.ndarray | None = None) -> np.ndarray:
        a, b = self._u(a), self._u(b)
        r = np.add(a, b, out=_out(out, a, b))
        return np.minimum(r, np.subtract(r, self._P), out=r)

    def sub(self, a, b, out: np.ndarray | None = None) -> np.ndarray:
        a, b = self._u(a), self._u(b)
        r = np.subtract(a, b, out=_out(out, a, b))
        return np.minimum(r, np.add(r, self._P), out=r)

    def neg(self, a, out: np.ndarray | None = None) -> np.ndarray:
        a = self._u(a)
        r = np.subtract(self._P, a, out=_out(out, a, a))
        return np.minimum(r, np.subtract(r, self._P), out=r)

    def _reduce_u64(self, x: np.ndarray) -> np.ndarray:
        """Canonical residue of arbitrary uint64 values (new array)."""
        x = np.asarray(x, dtype=np.uint64)
        if not self.mersenne:
            return np.remainder(x, self._P, out=np.empty_like(x))
        y = np.add(x & self._P, x >> _U64(61), out=np.empty_like(x))
        return np.minimum(y, np.subtract(y, self._P), out=y)

    def sum(self, a, axis=None) -> np.ndarray:
        """Sum mod p along ``axis`` (exact for up to 2**32 terms)."""
        a = self._u(a)
        n = a.size if axis is None else np.prod([a.shape[i] for i in np.atleast_1d(axis)])
        if n >= 1 << 32:
            raise ValueError("field sum supports at most 2**32 terms per output")
        lo = np.sum(a & _M32, axis=axis, dtype=np.uint64)
        hi = np.sum(a >> _U64(32), axis=axis, dtype=np.uint64)
        return self.add(self._reduce_u64(lo), self.mul_pow2(self._reduce_u64(hi), 32))

    # -- multiplicative ------------------------------------------------------
    def mul(self, a, b) -> np.ndarray:
        a, b = self._u(a), self._u(b)
        if a.ndim == 0 and b.ndim == 0:
            return np.array(int(a) * int(b) % self.p, dtype=np.uint64)
        if not self.mersenne:
            return np.remainder(a * b, self._P)
        return _mul61(a, b)

    def mul_pow2(self, a, k: int) -> np.ndarray:
        """``a * 2**k mod p``; for p = 2**61 - 1 a 61-bit rotation."""
        a = self._u(a)
        if not self.mersenne:
            return self.mul(a, pow(2, int(k), self.p))
        k = int(k) % 61
        if k == 0:
            return a.copy()
        return ((a << _U64(k)) & self._P) | (a >> _U64(61 - k))

    def pow(self, a, e: int) -> np.ndarray:
        """Elementwise ``a**e`` for a public non-negative exponent (square and multiply)."""
        e = int(e)
        if e < 0:
            raise ValueError("negative exponents: use inv() first")
        a = self._u(a)
        result = np.ones_like(a)
        base = a.copy()
        while e:
            if e & 1:
                result = self.mul(result, base)
            e >>= 1
            if e:
                base = self.mul(base, base)
        return result

    def inv(self, a) -> np.ndarray:
        """Elementwise inverse (Fermat); ValueError if any element is zero."""
        a = self._u(a)
        if np.any(a == 0):
            raise ValueError("zero has no inverse in the field")
        return self.pow(a, self.p - 2)

    def matmul(self, a, b) -> np.ndarray:
        """Exact ``a @ b mod p`` for ``a`` of shape (..., K) and ``b`` of shape (K, N) or (K,).

        Meant for shares times a public matrix.  Both are split into 16-bit
        limbs and multiplied as float64 via BLAS; every partial dot product is
        below 2**53 (K is processed in blocks of at most 2**17), so the float
        results are exact integers.
        """
        a, b = self._u(a), self._u(b)
        if a.ndim < 1 or b.ndim not in (1, 2):
            raise ValueError(f"matmul needs a of shape (..., K) and b of shape (K, N) or (K,), got {a.shape} and {b.shape}")
        vec = b.ndim == 1
        b2 = b[:, None] if vec else b
        K, N = b2.shape
        if a.shape[-1] != K:
            raise ValueError(f"matmul shape mismatch: a has {a.shape[-1]} columns, b has {K} rows")
        lead = a.shape[:-1]
        a2 = a.reshape(-1, K)
        M = a2.shape[0]
        out = np.zeros((M, N), dtype=np.uint64)
        L = (self.p.bit_length() + 15) // 16
        kblock = 1 << 17                      # L * K * (2**16 - 1)**2 < 2**53 for L <= 4
        # Row blocks keep the float limb copies and the product near 32 MiB.
        rows = max(1, (1 << 22) // max(1, L * min(K, kblock), L * L * N))
        for k0 in range(0, K, kblock):
            bl = _limbs(b2[k0:k0 + kblock], L)                     # (L, Kb, N)
            bstack = np.concatenate(list(bl), axis=1)               # (Kb, L*N)
            for m0 in range(0, M, rows):
                al = _limbs(a2[m0:m0 + rows, k0:k0 + kblock], L)  # (L, Mb, Kb)
                Mb = al.shape[1]
                prod = al.reshape(L * Mb, -1) @ bstack              # block (j, k) = A_j @ B_k
                prod = prod.reshape(L, Mb, L, N)
                acc = out[m0:m0 + Mb]
                for s in range(2 * L - 1):
                    part = sum(prod[j, :, s - j, :] for j in range(max(0, s - L + 1), min(L, s + 1)))
                    term = self._reduce_u64(part.astype(np.uint64))
                    self.add(acc, self.mul_pow2(term, 16 * s), out=acc)
        out = out.reshape(*lead, N)
        return out[..., 0] if vec else out

    # -- randomness and bytes ------------------------------------------------
    def random(self, shape, prg=None) -> np.ndarray:
        """Uniform field elements from ``prg`` (a fresh OS-seeded PRG when None)."""
        from .prg import PRG

        prg = PRG.from_random() if prg is None else prg
        return prg.integers_mod(shape, self.p)

    def bytes_to_elements(self, data: bytes) -> np.ndarray:
        """Pack bytes into elements, ``bytes_per_element`` (7 for 2**61 - 1) little-endian bytes each."""
        bpe = self.bytes_per_element
        if bpe < 1:
            raise ValueError(f"field {self!r} is too small to carry bytes")
        data = bytes(data)
        n = -(-len(data) // bpe)
        padded = np.zeros(n * bpe, dtype=np.uint8)
        padded[: len(data)] = np.frombuffer(data, dtype=np.uint8)
        buf = np.zeros((n, 8), dtype=np.uint8)
        buf[:, :bpe] = padded.reshape(n, bpe)
        return buf.reshape(-1).view("<u8").astype(np.uint64)

    def elements_to_bytes(self, a, length: int) -> bytes:
        """Inverse of :meth:`bytes_to_elements`; ValueError if ``a`` does not encode ``length`` bytes."""
        a = self.asarray(a, "packed bytes").reshape(-1)
        bpe = self.bytes_per_element
        if a.size != -(-int(length) // bpe):
            raise ValueError(f"{a.size} elements cannot hold exactly {length} bytes ({bpe} per element)")
        if np.any(a >> _U64(8 * bpe)):
            raise ValueError("element does not encode bytes: value too large (corrupt or wrong shares?)")
        raw = a.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :bpe].reshape(-1)
        if np.any(raw[length:]):
            raise ValueError("non-zero padding after the encoded bytes (corrupt or wrong shares?)")
        return raw[:length].tobytes()


def _out(out, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # Always an array (never a numpy scalar) so the in-place reduction works on 0-d inputs.
    if out is not None:
        return out
    return np.empty(np.broadcast_shapes(a.shape, b.shape), dtype=np.uint64)


def _limbs(x: np.ndarray, L: int) -> np.ndarray:
    """16-bit limbs of uint64 values as float64, shape (L, *x.shape)."""
    out = np.empty((L, *x.shape), dtype=np.float64)
    for j in range(L):
        out[j] = (x >> _U64(16 * j)) & _U64(0xFFFF)
    return out


def _mul61(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # a = ah*2**32 + al, b = bh*2**32 + bl with ah, bh < 2**29.
    #   a*b = ah*bh*2**64 + (ah*bl + al*bh)*2**32 + al*bl
    # With 2**64 = 8 and 2**61 = 1 (mod p), and mid = mh*2**29 + ml:
    #   mid*2**32 = mh + ml*2**32 (mod p).  Every term below is < 2**61 + 2**33,
    #   so the total is < 2**63 and one fold plus one conditional subtraction
    #   makes it canonical.
    P = _U64(P61)
    ah, al = a >> _U64(32), a & _M32
    bh, bl = b >> _U64(32), b & _M32
    mid = ah * bl
    mid += al * bh
    r = al * bl
    r = (r & P) + (r >> _U64(61))
    r += (ah * bh) << _U64(3)
    r += mid >> _U64(29)
    r += (mid & _U64((1 << 29) - 1)) << _U64(32)
    r = (r & P) + (r >> _U64(61))
    return np.minimum(r, r - P, out=r)


F61 = PrimeField(P61)
