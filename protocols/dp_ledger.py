"""The privacy ledger: what each differentially private release costs, accounted by ``dp-accounting``.

A mechanism (:class:`Mechanism`) is one kind of release a party makes, repeated over a run:

* ``"dp-sgd"`` (record level): a Poisson-sampled Gaussian step, sampling rate ``q``, noise
  multiplier ``z`` (noise std ``z * clip`` on the sum of per-sample clipped gradients);
* ``"gaussian"`` (client or row level): the Gaussian mechanism with noise multiplier ``z``
  (std ``z`` times the L2 sensitivity), no sampling;
* ``"skellam"`` (client level, distributed under secure aggregation): the multi-dimensional
  Skellam mechanism of Agarwal, Kairouz and Liu (NeurIPS 2021, Theorem 3.5), whose Renyi
  divergence of order ``alpha`` is at most ``alpha D2^2 / (2 mu) + 3 D1 / (4 mu)``
  (:func:`fedhet.protocols.dp_noise.skellam_zcdp`); ``dp-accounting`` takes it as a
  ``ZCDpEvent(xi, rho)``.

Every epsilon comes from ``dp-accounting``'s RDP accountant (``RdpAccountant`` over the orders
:data:`ORDERS`, add-or-remove-one neighbours), never from a formula of ours; :func:`calibrate` finds the noise multiplier that meets a
target ``(epsilon, delta)`` for the planned steps with ``dp-accounting``'s
``calibrate_dp_mechanism`` before any party starts (as Opacus's ``make_private_with_epsilon``).

:class:`Ledger` is what a party keeps: each round it :meth:`~Ledger.charge`\\ s the round's steps,
which raises :class:`PrivacyBudgetExceeded` *before* the release when the epsilon after it would
pass the budget, and records ``epsilon(delta)`` after every round; :meth:`~Ledger.as_dict` goes
into the party's ``result.json`` (``"privacy"``).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable

__all__ = ["Mechanism", "Ledger", "PrivacyBudgetExceeded", "epsilon", "calibrate", "dp_event", "MECHANISMS",
           "UNITS", "ORDERS"]

MECHANISMS = ("dp-sgd", "gaussian", "skellam")
UNITS = ("record", "client", "row")

# The RDP orders the accountant optimises over: integers (dp-accounting's fractional orders below 2 fail
# to converge for sampling rates near 1/2 and cost seconds; at delta = 1e-5 and epsilon >= 0.5 the best
# order lies above 2 anyway, and leaving an order out can only raise the epsilon reported).
ORDERS = tuple(range(2, 65)) + (80, 96, 128, 192, 256, 512, 1024)


class PrivacyBudgetExceeded(RuntimeError):
    """A release would take the party's epsilon past its budget: the run stops before it."""


@dataclass(frozen=True)
class Mechanism:
    """One repeated release.  ``noise``: the noise multiplier z (std / L2 sensitivity); ``sampling_rate``:
    Poisson sampling rate of DP-SGD (1 for the others); ``steps_per_round``: releases per round;
    ``d1_over_d2``: for Skellam, the L1 sensitivity over the squared L2 sensitivity in noise units
    (``3 D1 / (4 mu) = 3 d1_over_d2 / (4 z^2)``), see :func:`fedhet.protocols.dp_noise.skellam_zcdp`."""

    name: str
    unit: str
    noise: float
    sampling_rate: float = 1.0
    steps_per_round: int = 1
    d1_over_d2: float = 0.0
    note: str = ""

    def __post_init__(self) -> None:
        if self.name not in MECHANISMS:
            raise ValueError(f"DP mechanism must be one of {MECHANISMS}, got {self.name!r}")
        if self.unit not in UNITS:
            raise ValueError(f"DP unit must be one of {UNITS}, got {self.unit!r}")
        if not (math.isfinite(self.noise) and self.noise > 0):
            raise ValueError(f"DP noise multiplier must be a positive finite number, got {self.noise!r}")
        if not 0 < self.sampling_rate <= 1:
            raise ValueError(f"DP sampling rate must be in (0, 1], got {self.sampling_rate!r}")
        if self.steps_per_round < 1:
            raise ValueError(f"DP steps per round must be >= 1, got {self.steps_per_round!r}")

    def with_noise(self, z: float) -> "Mechanism":
        return replace(self, noise=float(z))

    def as_dict(self) -> dict[str, Any]:
        return {"mechanism": self.name, "unit": self.unit, "noise_multiplier": self.noise,
                "sampling_rate": self.sampling_rate, "steps_per_round": self.steps_per_round,
                **({"d1_over_d2": self.d1_over_d2} if self.name == "skellam" else {}),
                **({"note": self.note} if self.note else {})}


def dp_event(m: Mechanism, steps: int) -> Any:
    """``steps`` releases of ``m`` as one dp-accounting event."""
    import dp_accounting as dpa

    if m.name == "dp-sgd":
        one = dpa.PoissonSampledDpEvent(m.sampling_rate, dpa.GaussianDpEvent(m.noise))
    elif m.name == "gaussian":
        one = dpa.GaussianDpEvent(m.noise)
    else:  # skellam: (xi, rho)-zCDP with rho = D2^2 / (2 mu) = 1 / (2 z^2), xi = 3 D1 / (4 mu)
        one = dpa.ZCDpEvent(rho=1.0 / (2.0 * m.noise ** 2), xi=3.0 * m.d1_over_d2 / (4.0 * m.noise ** 2))
    return dpa.SelfComposedDpEvent(one, int(steps))


def _accountant() -> Any:
    from dp_accounting import rdp

    return rdp.RdpAccountant(list(ORDERS))


@functools.lru_cache(maxsize=4096)
def epsilon(m: Mechanism, steps: int, delta: float) -> float:
    """epsilon(delta) after ``steps`` releases of ``m`` (0 for no step), by dp-accounting's RDP accountant."""
    if steps <= 0:
        return 0.0
    return float(_accountant().compose(dp_event(m, steps)).get_epsilon(delta))


@functools.lru_cache(maxsize=256)
def calibrate(m: Mechanism, steps: int, target_epsilon: float, delta: float) -> Mechanism:
    """``m`` with the smallest noise multiplier whose ``steps`` releases stay within ``(target_epsilon, delta)``
    (dp-accounting's ``calibrate_dp_mechanism``; the result's epsilon is at most the target)."""
    from dp_accounting import mechanism_calibration as mc

    if not (target_epsilon > 0 and 0 < delta < 1):
        raise ValueError(f"dp_epsilon must be > 0 and dp_delta in (0, 1), got {target_epsilon!r}, {delta!r}")
    z = mc.calibrate_dp_mechanism(_accountant, lambda z: dp_event(m.with_noise(z), steps), target_epsilon, delta,
                                  mc.ExplicitBracketInterval(1e-3, 1e4), tol=1e-7)
    out = m.with_noise(float(z))
    if epsilon(out, steps, delta) > target_epsilon:  # the bisection returns the upper end; say so if it did not
        raise ValueError(f"DP calibration: no noise multiplier in [1e-3, 1e4] meets epsilon {target_epsilon:g} "
                         f"at delta {delta:g} over {steps} steps")
    return out


@dataclass
class Ledger:
    """A party's account of one mechanism over a run (see the module docstring).

    ``budget``: the epsilon a release may not pass (None: no cap, epsilon only reported);
    ``planned_steps``: the steps the noise was calibrated for (recorded)."""

    mechanism: Mechanism
    delta: float
    budget: float | None = None
    planned_steps: int | None = None
    who: str = ""
    steps: int = 0
    rounds: list[dict[str, Any]] = field(default_factory=list)
    eps_fn: Callable[[Mechanism, int, float], float] = epsilon

    @property
    def spent(self) -> float:
        """epsilon(delta) of the releases charged so far."""
        return self.rounds[-1]["epsilon"] if self.rounds else 0.0

    def charge(self, round: int, steps: int | None = None, mechanism: Mechanism | None = None) -> float:
        """Account round ``round``'s ``steps`` releases (default the mechanism's steps per round) before they
        happen; returns epsilon after them.  Raises :class:`PrivacyBudgetExceeded` (nothing recorded) when
        that epsilon would pass the budget.  ``mechanism``: this round's actual mechanism when it differs
        from the planned one (e.g. more noise than planned because more clients contributed); the ledger
        then accounts the composition exactly as the sum of per-mechanism RDP curves."""
        k = self.mechanism.steps_per_round if steps is None else int(steps)
        m = mechanism or self.mechanism
        eps = self._epsilon_with(m, k)
        if self.budget is not None and eps > self.budget * (1 + 1e-9):
            who = f"{self.who}: " if self.who else ""
            raise PrivacyBudgetExceeded(
                f"{who}round {round} would spend epsilon {eps:.4g} (delta {self.delta:g}) with {m.name} noise "
                f"{m.noise:.4g}, past the budget dp_epsilon = {self.budget:g}; the run stops before it "
                f"({self.steps} steps done, epsilon {self.spent:.4g})")
        self.steps += k
        self.rounds.append({"round": int(round), "steps": self.steps, "epsilon": eps,
                            **({"noise_multiplier": m.noise} if m is not self.mechanism else {})})
        return eps

    def _epsilon_with(self, m: Mechanism, k: int) -> float:
        if all("noise_multiplier" not in r for r in self.rounds) and m is self.mechanism:
            return self.eps_fn(m, self.steps + k, self.delta)
        # mixed rounds: compose every round's own event
        import dp_accounting as dpa

        events, prev = [], 0
        for r in self.rounds:
            mr = self.mechanism.with_noise(r["noise_multiplier"]) if "noise_multiplier" in r else self.mechanism
            events.append(dp_event(mr, r["steps"] - prev))
            prev = r["steps"]
        events.append(dp_event(m, k))
        return float(_accountant().compose(dpa.ComposedDpEvent(events)).get_epsilon(self.delta))

    def as_dict(self) -> dict[str, Any]:
        """What ``result.json`` holds under ``"privacy"``."""
        return {**self.mechanism.as_dict(), "delta": self.delta, "budget_epsilon": self.budget,
                "planned_steps": self.planned_steps, "steps": self.steps, "epsilon": self.spent,
                "accountant": "dp-accounting RDP (add or remove one)", "rounds": list(self.rounds)}
