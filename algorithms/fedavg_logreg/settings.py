"""FedAvg logistic regression's settings: the ``[algorithm]`` keys (the one parser)."""
from __future__ import annotations

from dataclasses import dataclass

from fedhet.parties.settings import setting
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.dp_settings import DPSettings

NAME = "fedavg_logreg"

# Secure aggregation's fixed-point range: weights stay far inside [-8, 8] on
# this data, and no client can hold more rows than the 569 of the data set.
AGGREGATION_DEFAULTS = AggregationSettings(aggregation="secure", secagg_clip=8.0, secagg_max_weight=569.0)


@dataclass(frozen=True)
class Settings:
    rounds: int = setting(20, "FedAvg rounds", lo=1)
    local_epochs: int = setting(5, "full-batch gradient steps per client per round", lo=1)
    lr: float = setting(0.5, "gradient step size", lo=0, lo_open=True)
    l2: float = setting(1e-3, "L2 penalty on the weights (not the bias)", lo=0)
    test_fraction: float = setting(0.25, "share of the rows held out for testing", lo=0, lo_open=True, hi=0.9)
    n_features: int = setting(30, "feature count of the data (breast cancer: 30)", lo=1)
    seed: int = setting(0, "shuffles the rows before they are dealt to the clients", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)
    dp: DPSettings = setting(DPSettings(), flatten=True)

    @property
    def n_params(self) -> int:
        """The model's length: one weight per feature and the bias."""
        return self.n_features + 1
