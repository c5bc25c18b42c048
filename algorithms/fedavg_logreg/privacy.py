"""FedAvg logistic regression's differential privacy (``dp = "record"`` or ``"client"``): the plan every
party derives from the settings alone, so all agree without a message.

Record level: each client's local steps are DP-SGD (:func:`.core.local_train_dp`): Poisson sampling rate
``dp_sample_rate``, per-sample L2 clip ``dp_clip``, ``local_epochs`` steps per round, ``rounds``
rounds; the guarantee is each client's, for its own rows, against everyone who sees its updates.
Client level: :mod:`fedhet.protocols.dp_aggregation` (one release per round)."""
from __future__ import annotations

from fedhet.algorithms.fedavg_logreg.settings import AGGREGATION_DEFAULTS, Settings
from fedhet.protocols.dp_aggregation import DPAggregator, make_dp_aggregator
from fedhet.protocols.dp_ledger import Ledger, Mechanism
from fedhet.protocols.dp_settings import plan

__all__ = ["record_ledger", "client_aggregator"]


def record_ledger(s: Settings, who: str) -> Ledger:
    """The DP-SGD ledger of one client (calibrated for ``rounds * local_epochs`` steps)."""
    return plan(s.dp, Mechanism("dp-sgd", "record", 1.0, sampling_rate=s.dp.dp_sample_rate,
                                steps_per_round=s.local_epochs,
                                note="DP-SGD in each client's local steps (per-sample clip, Gaussian noise)"),
                s.rounds, who)


def client_aggregator(s: Settings, n_clients: int, who: str) -> DPAggregator:
    return make_dp_aggregator(s.agg, AGGREGATION_DEFAULTS, s.dp, n_clients, s.n_params, s.rounds, who)
