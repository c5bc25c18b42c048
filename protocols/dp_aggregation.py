"""Client-level (user-level) differential privacy for the aggregate, behind the aggregation interface.

:func:`make_dp_aggregator` wraps the aggregator of :func:`fedhet.protocols.aggregation.make_aggregator`.
Every client clips its update to L2 norm ``dp_clip`` and submits it with weight 1 (a weight would
scale its sensitivity); the server's mean is the noised sum over the contributors.  Where the noise
comes from (``dp_noise``):

* ``"distributed"`` (``aggregation = "secure"``, the default there): each client adds its share of
  Skellam noise as integers on the ring (:mod:`fedhet.protocols.dp_noise`); the server unmasks the sum
  with the full noise, no client adds it all.  Threat model: the server and fewer than t clients
  (secure aggregation's) see only the noised sum; with the threshold t, a completed round carries at
  least the accounted noise (dropouts never lower it).
* ``"central"`` (plain aggregation, the default there): the server adds Gaussian noise ``z * clip`` to
  the sum before it uses it.  Trusts the server with the clients' clipped updates.
* ``"local"``: each client adds the full Gaussian noise ``z * clip`` itself (the server may see each
  update); the sum carries ``sqrt(n)`` times the noise.

Each party keeps a :class:`~fedhet.protocols.dp_ledger.Ledger` (``ledger``; its ``as_dict`` goes into
``result.json``): clients charge a round before they submit (so a run stops before passing its
budget); the server of a distributed run records the noise the round actually carried.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Iterable

import numpy as np

from fedhet.parties.contract import PartyLike

from .aggregation import AggregateResult, Aggregator, SubmitResult, make_aggregator, secagg_config
from .aggregation_settings import AggregationSettings
from .dp_ledger import Ledger, Mechanism
from .dp_noise import RingNoise, clip_l2, dp_frac_bits, gaussian_noise, private_rng, sensitivity
from .dp_settings import DPSettings, plan
from .secagg import SecAggConfig

__all__ = ["DPAggregator", "make_dp_aggregator", "noise_mode", "dp_secagg_config"]


def noise_mode(dp: DPSettings, agg: AggregationSettings) -> str:
    mode = dp.dp_noise or ("distributed" if agg.method == "secure" else "central")
    if mode == "distributed" and agg.method != "secure":
        raise ValueError("dp_noise = 'distributed' needs aggregation = 'secure' (the noise shares are only "
                         "hidden under the masks)")
    return mode


def dp_secagg_config(agg: AggregationSettings, dp: DPSettings, n_clients: int, length: int) -> tuple[SecAggConfig, int]:
    """The secure-aggregation configuration of a distributed-DP run (weights 1, clip = dp_clip, fraction
    bits from :func:`~fedhet.protocols.dp_noise.dp_frac_bits`) and its frac_bits."""
    base = dataclasses.replace(secagg_config(agg), max_weight=1.0, clip=float(dp.dp_clip))
    z = dp.noise_multiplier or 50.0  # an upper guess when calibrated later: only lowers frac_bits a little
    f = dp_frac_bits(dp.dp_clip, n_clients, z, base.ring_bits, length)
    return dataclasses.replace(base, frac_bits=f), f


class DPAggregator(Aggregator):
    """The wrapped aggregator with client-level DP (see the module docstring)."""

    def __init__(self, inner: Aggregator, ledger: Ledger, mode: str, clip: float, unit: float,
                 t: int, rng: np.random.Generator | None = None):
        """``unit``: the L2 sensitivity in the sum's units (``clip``, or for Skellam the rounded grid vector's
        ``D2 / 2**f``): the noise std is the noise multiplier times it."""
        self.inner, self.ledger, self.mode, self.clip = inner, ledger, mode, float(clip)
        self.method = inner.method
        self.unit = float(unit)
        self.t = t
        self.rng = rng or private_rng()

    def submit(self, party: PartyLike, server: str, vector, weight: float = 1.0, round: int = 0) -> SubmitResult:
        self.ledger.charge(round)  # before anything leaves: stops the run rather than pass the budget
        x = clip_l2(np.asarray(vector, dtype=np.float64), self.clip)
        if self.mode == "local":
            x = x + gaussian_noise(x.size, self.ledger.mechanism.noise * self.clip, self.rng)
        return self.inner.submit(party, server, x, 1.0, round)

    def aggregate(self, party: PartyLike, clients: Iterable[str], round: int = 0,
                  length: int | None = None) -> AggregateResult:
        if self.mode == "central":
            self.ledger.charge(round)  # before the noised sum exists
        res = self.inner.aggregate(party, clients, round, length)
        if self.mode == "central":
            res.sum = res.sum + gaussian_noise(res.sum.size, self.ledger.mechanism.noise * self.clip, self.rng)
        elif self.mode == "distributed":
            # the sum carries len(contributors) / t times the planned variance (>= 1: t is the round's minimum)
            z = self.ledger.mechanism.noise * math.sqrt(len(res.contributors) / self.t)
            self.ledger.charge(round, mechanism=self.ledger.mechanism.with_noise(z))
        else:
            self.ledger.charge(round)
        res.mean = res.sum / max(res.weight, 1.0)
        # the noise's std per coordinate of the sum (mean_error_bound stays the quantisation's alone)
        z, k = self.ledger.mechanism.noise, len(res.contributors)
        std = z * self.unit * {"central": 1.0, "local": math.sqrt(k), "distributed": math.sqrt(k / self.t)}[self.mode]
        res.details = {**res.details, "dp": self.mode, "dp_epsilon": self.ledger.spent, "dp_noise_std_sum": std}
        return res


def make_dp_aggregator(settings: AggregationSettings | None, defaults: AggregationSettings | None, dp: DPSettings,
                       n_clients: int, length: int, rounds: int, who: str = "",
                       rng: np.random.Generator | None = None, faults: Any = None) -> DPAggregator:
    """The aggregator of ``settings`` (over ``defaults``) with client-level DP for a run of ``rounds``
    aggregations of ``length``-vectors from ``n_clients`` clients (every party computes the same plan).
    ``rng``: the noise generator (tests; default one seeded by the OS); ``faults``: secure aggregation's
    injected dropouts (tests)."""
    agg = (settings or AggregationSettings()).over(defaults)
    mode = noise_mode(dp, agg)
    if mode == "distributed":
        cfg, f = dp_secagg_config(agg, dp, n_clients, length)
        d2, d1 = sensitivity(dp.dp_clip, f, length)
        t = cfg.t(n_clients)
        mech = Mechanism("skellam", "client", 1.0, d1_over_d2=d1 / (d2 * d2),
                         note=f"distributed Skellam under secure aggregation, split over t = {t} of "
                              f"{n_clients} clients, {f} fraction bits")
        ledger = plan(dp, mech, rounds, who)
        mu = (ledger.mechanism.noise * d2) ** 2
        from .aggregation import SecureAggregator

        inner: Aggregator = SecureAggregator(cfg, faults=faults, noise=RingNoise(mu, t, rng))
        return DPAggregator(inner, ledger, mode, dp.dp_clip, d2 / 2.0 ** f, t, rng)
    mech = Mechanism("gaussian", "client", 1.0, note=f"{mode} Gaussian noise on clipped client updates")
    ledger = plan(dp, mech, rounds, who)
    # a locally noised update is clipped again (post-processing) at 12 noise std beyond dp_clip
    bound = dp.dp_clip * (1 + 12 * ledger.mechanism.noise) if mode == "local" else dp.dp_clip
    inner = make_aggregator(dataclasses.replace(agg, secagg_max_weight=1.0, secagg_clip=float(bound)), None)
    return DPAggregator(inner, ledger, mode, dp.dp_clip, dp.dp_clip, n_clients, rng)


def info(a: Any) -> dict[str, Any]:
    """The ledger of a DP aggregator (empty for any other) for ``result.json``."""
    return a.ledger.as_dict() if isinstance(a, DPAggregator) else {}
