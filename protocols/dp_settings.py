"""The differential-privacy keys of an ``[algorithm]`` table, declared once for every algorithm.

An algorithm that offers DP includes :class:`DPSettings` with ``setting(DPSettings(), flatten=True)``.
``dp = "record"``: DP-SGD in each client's local steps (:mod:`fedhet.algorithms.dp_sgd`);
``dp = "client"``: each client's update clipped to L2 norm ``dp_clip`` and the aggregate noised
(:mod:`fedhet.protocols.dp_aggregation`: ``dp_noise`` = distributed Skellam shares under secure
aggregation, central Gaussian noise added by a plain server, or local: each client adds the full noise).
Either ``dp_epsilon`` (the noise is calibrated for the planned steps before any party starts) or
``noise_multiplier`` (the epsilon reached is reported; with ``dp_epsilon`` too, that is the budget the
run stops before passing).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from fedhet.parties.settings import setting

from .dp_ledger import Ledger, Mechanism, calibrate

__all__ = ["DPSettings", "ReleaseDPSettings", "RowReleases", "release_rows", "plan", "describe", "annotate"]


@dataclass(frozen=True)
class DPSettings:
    dp: Literal["off", "record", "client"] = setting(
        "off", "differential privacy: off, record (DP-SGD in each client's local steps) or client "
               "(each client's update clipped and the aggregate noised)")
    dp_epsilon: float | None = setting(None, "privacy budget epsilon (calibrates the noise when noise_multiplier "
                                             "is unset; otherwise the run stops before passing it)",
                                       lo=0, lo_open=True)
    dp_delta: float = setting(1e-5, "delta of the (epsilon, delta) guarantee", lo=0, lo_open=True, hi=0.5)
    noise_multiplier: float | None = setting(None, "noise std / L2 sensitivity (None: calibrated from dp_epsilon)",
                                             lo=0, lo_open=True)
    dp_clip: float = setting(1.0, "L2 clipping bound: per sample (record) or per client update (client)",
                             lo=0, lo_open=True)
    dp_sample_rate: float = setting(1.0, "record level: Poisson sampling rate of each local step's batch",
                                    lo=0, lo_open=True, hi=1)
    dp_noise: Literal["distributed", "central", "local"] | None = setting(
        None, "client level: distributed (Skellam shares under secure aggregation, the default there), "
              "central (the plain server adds it, the default there) or local (each client adds the full noise)")

    @property
    def on(self) -> bool:
        return self.dp != "off"

    def check(self) -> None:
        """Refuse a DP configuration that names neither a noise multiplier nor a budget."""
        if self.on and self.dp_epsilon is None and self.noise_multiplier is None:
            raise ValueError(f"dp = {self.dp!r} needs dp_epsilon (to calibrate the noise) or noise_multiplier")


@dataclass(frozen=True)
class ReleaseDPSettings:
    """DP for a one-time release of per-row values (STFL's latents): each row clipped to L2 norm
    ``row_dp_clip`` and Gaussian noise added before the one send; one Gaussian release per row."""

    row_dp_epsilon: float | None = setting(None, "epsilon per released row (None: no DP unless row_noise)",
                                           lo=0, lo_open=True)
    row_dp_delta: float = setting(1e-5, "delta per released row", lo=0, lo_open=True, hi=0.5)
    row_noise: float | None = setting(None, "noise multiplier: std / row_dp_clip (None: calibrated)",
                                      lo=0, lo_open=True)
    row_dp_clip: float = setting(1.0, "L2 bound each released row is clipped to", lo=0, lo_open=True)

    @property
    def on(self) -> bool:
        return self.row_dp_epsilon is not None or self.row_noise is not None

    def as_dp(self) -> DPSettings:
        return DPSettings(dp="client", dp_epsilon=self.row_dp_epsilon, dp_delta=self.row_dp_delta,
                          noise_multiplier=self.row_noise, dp_clip=self.row_dp_clip)


def release_rows(s: ReleaseDPSettings, x, who: str = "", rng=None):
    """``x`` (rows) clipped and noised for one release, and the ledger of that release (one Gaussian release
    per row; unit ``row``)."""
    import numpy as np

    from .dp_noise import clip_rows_l2, gaussian_noise

    ledger = plan(s.as_dp(), Mechanism("gaussian", "row", 1.0, note="each row clipped and noised once, "
                                       "before the one send"), 1, who)
    ledger.charge(0)
    xc = clip_rows_l2(np.asarray(x, dtype=np.float64), s.row_dp_clip)
    noised = xc + gaussian_noise(xc.shape, ledger.mechanism.noise * s.row_dp_clip, rng)
    return noised.astype(np.asarray(x).dtype), ledger


class RowReleases:
    """Rows of one table released more than once (the HE split network's guest activations: a row's
    bottom-model output each time a batch holds it), each release clipped to ``row_dp_clip`` and noised.

    The ledger is planned for ``passes`` releases of any one row and charged whenever a row is released
    more often than any row before, so it holds the worst row's epsilon; a request to release a row
    beyond the plan stops the run (:class:`~fedhet.protocols.dp_ledger.PrivacyBudgetExceeded`) before
    anything is computed for it.  :meth:`state` / :meth:`load` carry the counts across a resume."""

    def __init__(self, s: ReleaseDPSettings, n_rows: int, passes: int, who: str = "", rng=None):
        import numpy as np

        from .dp_noise import private_rng

        self.clip = float(s.row_dp_clip)
        self.passes = int(passes)
        self.ledger = plan(s.as_dp(), Mechanism("gaussian", "row", 1.0, note=f"each row clipped and noised at "
                                                f"each of at most {passes} releases"), self.passes, who)
        self.counts = np.zeros(int(n_rows), dtype=np.int64)
        self.rng = rng or private_rng()

    def prepare(self, rows, norms):
        """For a release of rows ``rows`` (positions) whose values have L2 norms ``norms``: the factor
        that clips each (float64, (n,)) and the std of the noise to add (:meth:`noise`), after charging it."""
        import numpy as np

        rows = np.asarray(rows, dtype=np.int64)
        counts = self.counts.copy()
        np.add.at(counts, rows, 1)
        worst = int(counts.max(initial=0))
        if worst > self.passes:
            from .dp_ledger import PrivacyBudgetExceeded

            raise PrivacyBudgetExceeded(f"{self.ledger.who}: row {int(np.argmax(counts))} would be released "
                                        f"{worst} times, the plan allows {self.passes}: stopped before it")
        while self.ledger.steps < worst:
            self.ledger.charge(self.ledger.steps)
        self.counts = counts
        factor = np.minimum(1.0, self.clip / np.maximum(np.asarray(norms, dtype=np.float64), 1e-300))
        return factor, self.ledger.mechanism.noise * self.clip

    def noise(self, shape, std: float):
        from .dp_noise import gaussian_noise

        return gaussian_noise(shape, std, self.rng)

    def state(self) -> dict:
        return {"counts": self.counts, "rounds": list(self.ledger.rounds), "steps": int(self.ledger.steps)}

    def load(self, saved: dict) -> None:
        import numpy as np

        self.counts = np.asarray(saved["counts"], dtype=np.int64).copy()
        self.ledger.rounds, self.ledger.steps = list(saved["rounds"]), int(saved["steps"])


def plan(s: DPSettings, mechanism: Mechanism, rounds: int, who: str = "") -> Ledger:
    """The ledger of a run of ``rounds`` rounds of ``mechanism``: its noise calibrated to ``dp_epsilon`` for
    the planned steps when ``noise_multiplier`` is unset (the same on every party: a pure function of the
    settings), else ``noise_multiplier`` with ``dp_epsilon`` (if set) as the budget."""
    s.check()
    steps = rounds * mechanism.steps_per_round
    if s.noise_multiplier is None:
        assert s.dp_epsilon is not None
        m = calibrate(mechanism, steps, s.dp_epsilon, s.dp_delta)
    else:
        m = mechanism.with_noise(s.noise_multiplier)
    return Ledger(m, s.dp_delta, budget=s.dp_epsilon, planned_steps=steps, who=who)


def describe(s: DPSettings, unit: str) -> str:
    """What DP adds to a message's description (``fedhet messages``), e.g. ``with DP noise z = 1.1 ...``."""
    noise = (f"noise multiplier z = {s.noise_multiplier:g}" if s.noise_multiplier is not None
             else f"noise calibrated to epsilon = {s.dp_epsilon:g}")
    return (f"; with DP noise ({unit} level, {noise}, delta = {s.dp_delta:g}, L2 clip {s.dp_clip:g}): "
            "reveals a noised value only")


def annotate(decls: list, s: DPSettings, kinds: tuple[str, ...], unit: str) -> list:
    """``decls`` with the DP note added to the ``what`` of each kind in ``kinds`` (unchanged when DP is off)."""
    if not s.on:
        return decls
    note = describe(s, unit)
    return [dataclasses.replace(d, what=d.what + note) if d.kind in kinds else d for d in decls]
