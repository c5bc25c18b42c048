"""Secure aggregation: clipping, weighting and fixed-point encoding into the ring Z/2**bits.

A client clips its vector to ``[-clip, clip]``, multiplies it by its weight
``w`` (sample count, MMVFL's ``zeta_k``; ``0 < w <= max_weight``) and encodes
it with :class:`fedhet.crypto.fixedpoint.FixedPoint` on the ring
``Z/2**bits`` (``round(v * 2**f)``, round half to even; negative values in
two's complement); ``w`` itself travels as one extra coordinate, so the server
learns only ``sum w``.  ``f`` (``frac_bits``) is the largest that keeps
``n * (max_weight * max(clip, 1) * 2**f + 1/2) < 2**(bits - 1)`` (no sum can
wrap) and ``n * max_weight * max(clip, 1) * 2**f <= 2**52`` (float64 exact).
Each coordinate's rounding error is at most ``2**-(f + 1)``, so with ``s``
contributing clients

    |sum - sum_u w_u clip(x_u)|  <=  e_sum  = s * (2**-(f+1) + max_weight * clip * 2**-52)
    |sum w - sum_u w_u|          <=  e_w    = s * (2**-(f+1) + max_weight * 2**-52)
    |mean - exact mean|          <=  (e_sum + clip * e_w) / (sum w) + clip * 2**-51

(the ``2**-52`` terms cover float64 rounding of ``w * x``; for the mean,
``|S'/W' - S/W| <= (|S' - S| + |S/W| |W' - W|) / W'`` with ``|S/W| <= clip``).
"""
from __future__ import annotations

import math

import numpy as np

from fedhet.crypto.fixedpoint import FixedPoint

__all__ = ["Quantizer", "check_input"]


class Quantizer:
    """Clip, weight and round to the fixed-point grid of ``Z/2**bits``; decode sums (see the module docstring)."""

    def __init__(self, ring_bits: int, clip: float, max_weight: float, n: int, frac_bits: int | None = None):
        self.ring_bits, self.clip, self.max_weight, self.n = int(ring_bits), float(clip), float(max_weight), int(n)
        self.dtype = np.dtype(np.uint32 if self.ring_bits == 32 else np.uint64)
        self.sdtype = np.dtype(np.int32 if self.ring_bits == 32 else np.int64)
        mag = self.n * self.max_weight * max(self.clip, 1.0)  # worst |sum| in units of 2**f
        limit = 2.0 ** (self.ring_bits - 1) - 1 - self.n / 2
        fmax = min(math.floor(math.log2(limit / mag)), math.floor(52 - math.log2(mag)), 61)
        if frac_bits is None:
            if fmax < 0:
                raise ValueError(f"secagg: {self.n} clients x max_weight {self.max_weight:g} x clip "
                                 f"{self.clip:g} do not fit a {self.ring_bits}-bit ring; lower them or use 64 bits")
            frac_bits = fmax
        elif frac_bits > fmax:
            raise ValueError(f"secagg frac_bits={frac_bits} lets the sum of {self.n} clients (max_weight "
                             f"{self.max_weight:g}, clip {self.clip:g}) wrap a {self.ring_bits}-bit ring; "
                             f"use at most {fmax}")
        self.frac_bits = int(frac_bits)
        self.scale = math.ldexp(1.0, self.frac_bits)
        # The n summands' headroom is what frac_bits was chosen for; the codec checks it again.
        self.codec = FixedPoint(self.frac_bits, modulus=1 << self.ring_bits, summands=self.n)

    def encode_into(self, out: np.ndarray, x: np.ndarray, w: float, lo: int, hi: int, tmp: np.ndarray) -> None:
        """Quantise coordinates ``lo:hi`` of ``(x, w)`` (index ``len(x)`` is the weight) into ``out[lo:hi]``.

        ``clip(w * x, +-clip * w)`` then the codec's ``round(. * 2**f)``,
        in place in ``tmp`` (float64, at least ``hi - lo`` long): scaling by
        the power of two 2**f is exact, so ``x * (w * 2**f)`` clipped to
        ``+-(clip * w) * 2**f`` and rounded (half to even) gives the same
        ring values as the codec on ``clip(w * x)``.  The clipped values lie
        within the codec's range by the choice of f (checked once per call,
        not per element); the integers go straight into the ring's two's
        complement.
        """
        m = x.size
        xe = min(hi, m)
        if lo < xe:
            lim = self.clip * w
            if lim > self.codec.max_abs:
                raise ValueError(f"secagg: weight {w:g} x clip {self.clip:g} exceeds the fixed-point range "
                                 f"{self.codec.max_abs:g} (weight above max_weight?)")
            f = tmp[: xe - lo]
            np.multiply(x[lo:xe], w * self.scale, out=f)
            np.clip(f, -lim * self.scale, lim * self.scale, out=f)
            np.rint(f, out=f)
            out[lo:xe].view(self.sdtype)[...] = f
        if lo <= m < hi:
            out[m] = self.codec.encode(np.array([w]))[0]

    def decode(self, acc: np.ndarray) -> tuple[np.ndarray, float]:
        """A ring vector of sums -> (the weighted sum, float64; the weight sum)."""
        vals = self.codec.decode(acc)
        return vals[:-1], float(vals[-1])

    def bounds(self, contributors: int, weight_sum: float) -> tuple[float, float]:
        """(bound on |sum error| per coordinate, bound on |mean error| per coordinate)."""
        half = math.ldexp(1.0, -(self.frac_bits + 1))
        e_sum = contributors * (half + self.max_weight * self.clip * 2.0 ** -52)
        e_w = contributors * (half + self.max_weight * 2.0 ** -52)
        e_mean = (e_sum + self.clip * e_w) / weight_sum + self.clip * 2.0 ** -51 if weight_sum > 0 else math.inf
        return e_sum, e_mean


def check_input(vector, weight, max_weight: float, who: str = "") -> tuple[np.ndarray, float]:
    """The input as a contiguous float64 vector and the weight as a float; clear errors otherwise.

    ``who`` (a party name) is named in the error, so a federation's log says
    whose input was refused.
    """
    of = f" of {who!r}" if who else ""
    x = np.asarray(vector)
    if x.ndim != 1:
        raise ValueError(f"aggregation input{of} must be a 1-D vector, got shape {x.shape}")
    if x.dtype.kind not in "fiu":
        raise TypeError(f"aggregation input{of} must be real numbers, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float64)
    finite = np.isfinite(x)
    if not finite.all():
        i = int(np.argmin(finite))
        raise ValueError(f"aggregation input{of} contains NaN or inf (first at index {i}: {x[i]})")
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise TypeError(f"aggregation weight{of} must be a number, got {weight!r}") from None
    if not (math.isfinite(w) and 0 < w <= max_weight):
        raise ValueError(f"aggregation weight{of} must be in (0, max_weight={max_weight:g}], got {w!r} "
                         "(raise secagg_max_weight)")
    return x, w
