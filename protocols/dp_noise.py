"""Noise for differentially private aggregates: clipping, Gaussian noise, and distributed Skellam noise
as integers on the secure-aggregation ring.

Distributed Skellam (Agarwal, Kairouz and Liu, "The Skellam Mechanism for Differentially Private
Federated Learning", NeurIPS 2021).  ``Sk(mu)`` is ``Poisson(mu/2) - Poisson(mu/2)``: an integer
with mean 0 and variance ``mu``, and ``Sk(a) + Sk(b) = Sk(a + b)`` exactly.  Each client

1. clips its update to L2 norm ``C`` (:func:`clip_l2`) and submits it with weight 1;
2. the secure-aggregation quantiser scales it by ``2**f`` and rounds it (:mod:`.secagg_quantizer`):
   the integer vector has L2 norm at most ``D2 = C 2**f + sqrt(d)/2`` (each coordinate moves at most
   1/2), and L1 norm at most ``D1 = min(D2**2, sqrt(d) D2)`` (an integer ``|v| <= v**2``);
3. adds ``Sk(mu / t)`` to every coordinate on the ring (:class:`RingNoise`), ``t`` the secure-aggregation
   threshold: a round that completes has at least ``t`` contributors, so the sum the server unmasks
   carries ``Sk(mu')`` with ``mu' >= mu``, and no client adds more than ``1/t`` of it.

The sum's Renyi divergence of order ``alpha`` between neighbouring federations (one client's update
in or out) is at most ``alpha D2**2 / (2 mu) + 3 D1 / (4 mu)`` (Agarwal et al., Theorem 3.5, the
second term of its min): ``(xi, rho)``-zCDP with ``rho = D2**2 / (2 mu)`` and ``xi = 3 D1 / (4 mu)``,
which the ledger hands to dp-accounting (:func:`skellam_zcdp`; ``tests/test_dp_noise.py`` checks the
bound against the exact divergence of the one-dimensional Skellam).  The noise multiplier
``z = sqrt(mu) / D2`` is the ledger's.

Dropouts.  A client that drops before its masked input takes its share out of the sum; the round
still needs ``t`` contributors (or fails, releasing nothing), so the sum's noise never falls below
the ``mu`` the ledger accounted.  The server's ledger records each round's actual contributors
(``mu' = n_contrib mu / t``).

Modular wrap.  The sum must stay inside the ring's signed range; :func:`dp_frac_bits` picks the
fraction bits so that the clipped sum plus 40 standard deviations of the noise fits (a Skellam
variable passes 40 std with probability below ``1e-300``), and so that ``mu`` stays within numpy's
Poisson sampler.
"""
from __future__ import annotations

import math
import secrets
from dataclasses import dataclass

import numpy as np

from .secagg_quantizer import Quantizer

__all__ = ["clip_l2", "clip_rows_l2", "gaussian_noise", "skellam", "skellam_zcdp", "RingNoise", "dp_frac_bits", "sensitivity"]

SCALE_BITS = 16  # C * 2**f is about 2**16 grid units: fine enough for a rounding error of sqrt(d)/2
TAIL_STDS = 40.0


def clip_l2(x: np.ndarray, bound: float) -> np.ndarray:
    """``x`` scaled down to L2 norm ``bound`` when it is longer."""
    n = float(np.linalg.norm(x))
    return x * (bound / n) if n > bound else x


def clip_rows_l2(x: np.ndarray, bound: float) -> np.ndarray:
    """Every row of ``x`` scaled down to L2 norm ``bound`` when it is longer."""
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x * np.minimum(1.0, bound / np.maximum(n, 1e-300))


def private_rng() -> np.random.Generator:
    """A generator seeded from the operating system: DP noise no other party can reproduce (the run seed
    is public to the federation)."""
    return np.random.default_rng(secrets.randbits(128))


def gaussian_noise(shape: int | tuple[int, ...], std: float, rng: np.random.Generator | None = None) -> np.ndarray:
    return (rng or private_rng()).normal(0.0, std, size=shape)


def skellam(mu: float, size: int | tuple[int, ...], rng: np.random.Generator | None = None) -> np.ndarray:
    """``size`` draws of ``Sk(mu) = Poisson(mu/2) - Poisson(mu/2)`` (variance ``mu``), int64."""
    if not (mu >= 0 and math.isfinite(mu)):
        raise ValueError(f"Skellam variance must be finite and >= 0, got {mu!r}")
    g = rng or private_rng()
    return g.poisson(mu / 2, size).astype(np.int64) - g.poisson(mu / 2, size).astype(np.int64)


def sensitivity(clip: float, frac_bits: int, d: int) -> tuple[float, float]:
    """(D2, D1) of one client's rounded integer vector (see the module docstring)."""
    d2 = clip * 2.0 ** frac_bits + math.sqrt(d) / 2
    return d2, min(d2 * d2, math.sqrt(d) * d2)


def skellam_zcdp(mu: float, d2: float, d1: float) -> tuple[float, float]:
    """(xi, rho) of the multi-dimensional Skellam mechanism with variance ``mu`` per coordinate and L2/L1
    sensitivities ``d2``/``d1``: ``D_alpha <= xi + rho alpha`` (Agarwal et al. 2021, Theorem 3.5)."""
    return 3.0 * d1 / (4.0 * mu), d2 * d2 / (2.0 * mu)


def dp_frac_bits(clip: float, n: int, noise_multiplier: float, ring_bits: int, d: int) -> int:
    """Fraction bits for DP under secure aggregation: ``clip * 2**f`` near ``2**SCALE_BITS``, lowered until
    ``n`` clipped inputs plus ``TAIL_STDS`` noise standard deviations fit the ring's signed range and the
    quantiser's float64 bound."""
    f = max(0, SCALE_BITS - math.ceil(math.log2(clip)))
    while f > 0:
        d2, _ = sensitivity(clip, f, d)
        std = noise_multiplier * d2 * math.sqrt(n)  # at most n/t <= n times the planned variance
        if n * clip * 2.0 ** f + TAIL_STDS * std < 2.0 ** (ring_bits - 2) and noise_multiplier ** 2 * d2 ** 2 < 1e15:
            break
        f -= 1
    return f


@dataclass
class RingNoise:
    """A client's share of the distributed Skellam noise, added to its quantised vector on the ring
    before the masks (:class:`fedhet.protocols.secagg_client.SecAggClient`'s ``noise`` hook).

    ``mu``: the variance the sum must carry (grid units); ``share_of``: how many contributors it is split
    over (the secure-aggregation threshold t)."""

    mu: float
    share_of: int
    rng: np.random.Generator | None = None

    def __call__(self, y: np.ndarray, length: int, quant: Quantizer) -> None:
        """Add ``Sk(mu / share_of)`` to ``y[:length]`` (the weight coordinate stays exact), mod 2**bits."""
        z = skellam(self.mu / self.share_of, length, self.rng)
        view = y[:length]
        view += z.astype(quant.sdtype).view(quant.dtype)  # two's complement: wraps mod 2**bits
