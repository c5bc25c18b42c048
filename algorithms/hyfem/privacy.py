"""HyFEM's record-level differential privacy (``dp = "record"``): every local step is DP-SGD
(:func:`fedhet.algorithms.hyfem.core.local_update` with ``dp``), so the extractors and the inference model a
client sends all come out of it.  Per client: Poisson sampling rate ``q = min(batch_size, n) / n``,
``local_steps`` steps per round, accounted by :mod:`fedhet.protocols.dp_ledger`."""
from __future__ import annotations

import torch

from fedhet.algorithms.dp_sgd import DPStep, private_generator
from fedhet.algorithms.hyfem.settings import Settings
from fedhet.protocols.dp_ledger import Ledger, Mechanism
from fedhet.protocols.dp_settings import plan

__all__ = ["record_plan"]


def record_plan(s: Settings, n_train: int, who: str) -> tuple[Ledger, tuple[DPStep, torch.Generator]]:
    """The client's ledger (calibrated for ``rounds * local_steps`` steps) and its DP-SGD step with a private
    noise generator."""
    q = min(s.batch_size, n_train) / max(1, n_train)
    ledger = plan(s.dp, Mechanism("dp-sgd", "record", 1.0, sampling_rate=q, steps_per_round=s.local_steps,
                                  note="DP-SGD of every HyFEM local step (extractors and inference model)"),
                  s.rounds, who)
    return ledger, (DPStep(s.dp.dp_clip, ledger.mechanism.noise, q), private_generator())
