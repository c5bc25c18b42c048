"""Fixed-point encoding of float arrays: into a prime field or the ring Z/2**k, or as exact integers.

Every fixed-point encoder of fedhet is this one rounding, ``round(x * 2**f)``
(:func:`round_scaled`: float64, ``np.ldexp`` then ``np.rint``, round half to
even, exact since scaling by a power of two is), followed by one of two
representations:

* :class:`FixedPoint` (and :func:`encode` / :func:`decode`): the integer
  reduced into a field or ring of at most 64 bits, for secret sharing and
  secure aggregation (described below);
* :func:`quantize` / :func:`dequantize`: the integer itself as a Python int
  (numpy object arrays), of any size, for Paillier plaintexts and the HE split
  layer's exact integer arithmetic; no modulus, so no range other than the
  caller's own checks.

Field and ring encoding.  ``x`` is encoded as the integer ``round(x * 2**f)`` (f = ``frac_bits``, round
half to even), reduced mod the modulus: a negative value ``-v`` becomes
``modulus - v``.  Decoding takes the centred representative (values above
``modulus // 2`` are negative) and multiplies by ``2**-f``.

Range and precision, for modulus q and ``summands`` = s:

* representable: ``|round(x * 2**f)| <= B`` with ``B = floor(((q - 1) // 2) / s)``
  for a prime q, ``B = floor((q // 2 - 1) / s)`` for q = 2**k, i.e.
  ``|x| <= max_abs = B / 2**f``.  ``summands`` reserves headroom so that the sum
  of up to s encoded values (secure aggregation) still decodes correctly.
  Anything outside, and NaN or inf, raises ValueError saying so; nothing wraps
  silently.
* precision: ``resolution = 2**-f``; a round trip is off by at most
  ``2**-(f + 1)`` while ``|x| * 2**f < 2**53`` (beyond that float64 itself is
  coarser than the grid and the round trip is exact to float64 rounding).

Default f = 16 with q = 2**61 - 1: ``|x| <= (2**60 - 1) / 2**16 ~ 1.76e13`` in
steps of ``1.5e-5``.  With q = 2**32, f = 16: ``|x| < 32768``.

Products: multiplying an encoded value by an encoded public value gives an
encoding with ``2 f`` fractional bits (range ``B / 2**(2f)``); decode it with
``decode(a, frac_bits=2 * f)``.
"""
from __future__ import annotations

import math

import numpy as np

from .field import P61, is_prime

__all__ = ["FixedPoint", "DEFAULT_FRAC_BITS", "encode", "decode", "round_scaled", "quantize", "dequantize"]

DEFAULT_FRAC_BITS = 16
_EXACT_INT64 = 2.0 ** 62  # below this a rounded float64 converts through int64 exactly and fast


def round_scaled(x, frac_bits: int) -> np.ndarray:
    """``round(x * 2**frac_bits)`` as float64 (round half to even); no range or finiteness checks."""
    # Multiplying by the power of two is exact (== ldexp) and several times faster.
    scaled = np.array(x, dtype=np.float64)  # a copy (0-d stays an array), worked on in place
    scaled *= math.ldexp(1.0, int(frac_bits))
    return np.rint(scaled, out=scaled)


def quantize(x, frac_bits: int, what: str = "quantize") -> np.ndarray:
    """``round(x * 2**frac_bits)`` as an object array of exact Python ints (any magnitude).

    ValueError (prefixed by ``what``) if ``x`` holds NaN or infinity, OverflowError if
    ``x * 2**frac_bits`` exceeds float64.  Values below ``2**62`` after scaling go
    through int64; larger ones are converted one by one, still exactly (a float64 is
    an integer times a power of two).
    """
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: contains NaN or infinity")
    with np.errstate(over="ignore"):  # an overflow is reported below, as an error
        scaled = round_scaled(x, frac_bits)
    if scaled.size == 0 or np.max(np.abs(scaled)) < _EXACT_INT64:
        return scaled.astype(np.int64).astype(object)
    if not np.all(np.isfinite(scaled)):
        raise OverflowError(f"{what}: x * 2**{int(frac_bits)} overflows float64")
    return np.array([int(v) for v in scaled.ravel()], dtype=object).reshape(scaled.shape)


def dequantize(ints, frac_bits: int) -> np.ndarray:
    """Integers (Python ints of any size, object or integer arrays) -> float64 ``v / 2**frac_bits``.

    Each value is the correctly rounded quotient (Python's int / int), so no
    precision is lost before the single final rounding to float64.
    """
    a = np.asarray(ints, dtype=object)
    scale = 1 << int(frac_bits)
    return np.array([int(v) / scale for v in a.ravel().tolist()], dtype=np.float64).reshape(a.shape)


class FixedPoint:
    """Codec ``FixedPoint(frac_bits=16, modulus=2**61 - 1, summands=1)``.

    ``modulus`` is an odd prime below 2**63 (values stored as uint64) or
    2**32 / 2**64 (the ring Z/2**k, stored as uint32 / uint64, negative values
    in two's complement).
    """

    def __init__(self, frac_bits: int = DEFAULT_FRAC_BITS, modulus: int = P61, summands: int = 1):
        for name, v in (("frac_bits", frac_bits), ("modulus", modulus), ("summands", summands)):
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
                raise TypeError(f"{name} must be an int, got {type(v).__name__}")
        frac_bits, modulus, summands = int(frac_bits), int(modulus), int(summands)
        if modulus in (1 << 32, 1 << 64):
            self.ring_bits = modulus.bit_length() - 1
            half = modulus // 2 - 1
            self.dtype = np.dtype(np.uint32 if self.ring_bits == 32 else np.uint64)
        elif 2 < modulus < 1 << 63 and is_prime(modulus):
            self.ring_bits = 0
            half = (modulus - 1) // 2
            self.dtype = np.dtype(np.uint64)
        else:
            raise ValueError(f"fixed-point modulus must be an odd prime below 2**63, 2**32 or 2**64; got {modulus}")
        if summands < 1:
            raise ValueError(f"summands must be >= 1, got {summands}")
        if not 0 <= frac_bits < 62:
            raise ValueError(f"frac_bits must be in [0, 62), got {frac_bits}")
        self.frac_bits = frac_bits
        self.modulus = modulus
        self.summands = summands
        self._half = half
        self.bound = half // summands                   # largest |integer| encoded
        if self.bound < 1:
            raise ValueError(f"modulus {modulus} leaves no room for {summands} summands")
        bf = float(self.bound)
        # Largest float not above the integer bound, so the float comparison is exact.
        self._bound_f = bf if int(bf) <= self.bound else float(np.nextafter(bf, 0.0))
        self.max_abs = math.ldexp(self._bound_f, -frac_bits)
        self.resolution = math.ldexp(1.0, -frac_bits)
        self._scale = math.ldexp(1.0, frac_bits)

    def __repr__(self) -> str:
        return (f"FixedPoint(frac_bits={self.frac_bits}, modulus={self.modulus}, "
                f"summands={self.summands}; |x| <= {self.max_abs:.6g}, step {self.resolution:.3g})")

    def encode(self, x) -> np.ndarray:
        """Float array -> integers mod ``modulus`` (dtype ``self.dtype``). ValueError if out of range."""
        x = np.asarray(x)
        if x.ndim == 0:  # numpy ufuncs turn 0-d results into scalars; work on a 1-element view
            return self.encode(x.reshape(1)).reshape(())
        if x.dtype.kind not in "fiub":
            raise TypeError(f"fixed-point encode needs a real numeric array, got dtype {x.dtype}")
        scaled = round_scaled(x, self.frac_bits)
        if scaled.size:
            lo, hi = float(scaled.min()), float(scaled.max())
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise ValueError("fixed-point encode: input contains NaN or inf")
            worst = max(-lo, hi)
            if worst > self._bound_f:
                raise ValueError(
                    f"fixed-point encode: |x| = {math.ldexp(worst, -self.frac_bits):.6g} is outside the "
                    f"representable range |x| <= {self.max_abs:.6g} (frac_bits={self.frac_bits}, "
                    f"modulus={self.modulus}, summands={self.summands}); it would wrap around"
                )
        if self.ring_bits:  # in range (checked above): straight to the ring's two's complement
            return scaled.astype(np.int32 if self.ring_bits == 32 else np.int64).view(self.dtype)
        v = scaled.astype(np.int64)
        # negative v -> v + modulus, branch-free: (v >> 63) is all ones exactly when v < 0
        neg = np.right_shift(v, 63)
        np.bitwise_and(neg, np.int64(self.modulus), out=neg)
        np.add(v, neg, out=v)
        return v.view(np.uint64)

    def decode(self, a, frac_bits: int | None = None) -> np.ndarray:
        """Integers mod ``modulus`` -> float64; ``frac_bits`` overrides f (e.g. ``2 f`` after a product)."""
        f = self.frac_bits if frac_bits is None else int(frac_bits)
        a = np.asarray(a)
        if a.ndim == 0:
            return self.decode(a.reshape(1), frac_bits).reshape(())
        if a.dtype.kind not in "ui":
            raise TypeError(f"fixed-point decode needs an integer array, got dtype {a.dtype}")
        if self.ring_bits == 64:
            s = a.astype(np.uint64, copy=False).view(np.int64)
        elif self.ring_bits == 32:
            s = a.astype(np.uint32, copy=False).view(np.int32)
        else:
            if a.size and (int(a.max()) >= self.modulus or int(a.min()) < 0):
                raise ValueError(f"fixed-point decode: values must be in [0, {self.modulus})")
            s = a.astype(np.int64)
            # values above half are negative: subtract the modulus where (half - s) < 0
            neg = np.right_shift(np.int64(self._half) - s, 63)
            np.bitwise_and(neg, np.int64(self.modulus), out=neg)
            np.subtract(s, neg, out=s)
        out = s.astype(np.float64)
        out *= math.ldexp(1.0, -f)   # exact (a power of two; the results are normal numbers), == np.ldexp
        return out


_DEFAULT = FixedPoint()


def encode(x, frac_bits: int = DEFAULT_FRAC_BITS) -> np.ndarray:
    """Encode into GF(2**61 - 1) with ``frac_bits`` fractional bits (see module docstring)."""
    codec = _DEFAULT if frac_bits == DEFAULT_FRAC_BITS else FixedPoint(frac_bits)
    return codec.encode(x)


def decode(a, frac_bits: int = DEFAULT_FRAC_BITS) -> np.ndarray:
    """Decode from GF(2**61 - 1) with ``frac_bits`` fractional bits."""
    return _DEFAULT.decode(a, frac_bits=frac_bits)
