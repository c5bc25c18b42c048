"""CHFL's differential privacy: the common column is the only part that leaves a client.

Record level (``dp = "record"``): DP-SGD on the common column
(:meth:`fedhet.algorithms.chfl.core.CHFLClient.train_round`).

Per client: Poisson sampling rate ``q = batch_size / n_train``, ``ceil(n_train / batch_size)`` steps per
local epoch, ``local_epochs`` epochs per round, one common column per lr (``G`` of them, each submitted):
``G * local_epochs * ceil(n / batch_size)`` DP-SGD steps per round, accounted by
:mod:`fedhet.protocols.dp_ledger`.  The unique column and laterals train on the same batches but never
leave the client; model selection reads the validation rows, not the training rows.

Client level (``dp = "client"``, for federations of many clients): each client submits its round's
update of each common column (theta_c after its local epochs minus the global theta_c it was sent),
clipped to L2 norm ``dp_clip``, with weight 1; the server adds the noised mean update to the global
column (:mod:`fedhet.protocols.dp_aggregation`: distributed Skellam under secure aggregation, central or
local Gaussian otherwise).  ``G`` columns a round: ``rounds * G`` releases, accounted as such."""
from __future__ import annotations

import math
from typing import Sequence

from fedhet.algorithms.chfl.core import CHFLClient
from fedhet.algorithms.chfl.settings import Settings, aggregation_defaults
from fedhet.algorithms.dp_sgd import DPStep, private_generator
from fedhet.protocols.dp_aggregation import DPAggregator, make_dp_aggregator
from fedhet.protocols.dp_ledger import Ledger, Mechanism
from fedhet.protocols.dp_settings import plan

__all__ = ["record_ledger", "use_dp", "sampling_rate", "client_aggregator"]


def sampling_rate(s: Settings, n_train: int) -> float:
    return min(1.0, s.batch_size / max(1, n_train))


def record_ledger(s: Settings, n_train: int, who: str) -> Ledger:
    steps = s.G * s.local_epochs * math.ceil(n_train / s.batch_size)
    return plan(s.dp, Mechanism("dp-sgd", "record", 1.0, sampling_rate=sampling_rate(s, n_train),
                                steps_per_round=steps,
                                note="DP-SGD of CHFL's common column (per-sample clip, Gaussian noise, Adam)"),
                s.rounds, who)


def use_dp(trainers: Sequence[CHFLClient], s: Settings, n_train: int, ledger: Ledger) -> None:
    """Switch every federated trainer's step 1 to DP-SGD with the ledger's noise (a private generator)."""
    gen = private_generator()
    for t in trainers:
        t.dp = (DPStep(s.dp.dp_clip, ledger.mechanism.noise, sampling_rate(s, n_train)), gen)


def client_aggregator(s: Settings, n_clients: int, who: str) -> DPAggregator:
    """The aggregator of a client-level DP run: one release per common column and round (every party
    derives the same plan from the settings)."""
    return make_dp_aggregator(s.agg, aggregation_defaults(s, n_clients), s.dp, n_clients, s.common_params,
                              s.rounds * s.G, who)
