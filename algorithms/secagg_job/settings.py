"""The secure-aggregation benchmark job's settings (the ``[algorithm]`` table, aggregation keys included)."""
from __future__ import annotations

from dataclasses import dataclass

from fedhet.parties.settings import setting
from fedhet.protocols.aggregation import secagg_config
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.secagg import SecAggError

NAME = "secagg_bench"
CLIP, MAX_WEIGHT = 4.0, 100.0
DEFAULTS = AggregationSettings(aggregation="secure", secagg_clip=CLIP, secagg_max_weight=MAX_WEIGHT)


@dataclass(frozen=True)
class Settings:
    m: int = setting(1000, "vector length", lo=1)
    n_clients: int = setting(3, "K, the number of clients: the federation's, named c00, c01, ...", lo=1)
    bench_rounds: int = setting(1, "timed rounds (one warm-up round more is run)", lo=1)
    input_seed: int = setting(0, "seeds the clients' vectors and weights, and which clients drop out", lo=0)
    seed: int = setting(0, "the federation's seed (unused: inputs come from input_seed)", lo=0)
    dropouts: int = setting(
        0, "clients that vanish mid-round in every timed round (not the warm-up), each after the step "
           "data.dropout_plan draws from input_seed; secure aggregation only, at most n_clients - t.  The server "
           "waits its per-step timeout (secagg_timeout, else aggregation_timeout, else the federation's) once "
           "per step with a dropout: set it to a few seconds", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)

    def validate(self) -> None:
        """Dropouts need secure aggregation and must leave the protocol's threshold t of clients."""
        if not self.dropouts:
            return
        agg = self.agg.over(DEFAULTS)
        if agg.method != "secure":
            raise ValueError(f"dropouts = {self.dropouts} needs aggregation = 'secure', got {agg.method!r} (a plain "
                             "client sends one message, there is no step to vanish after): set dropouts = 0")
        if self.dropouts > self.n_clients:
            raise ValueError(f"dropouts = {self.dropouts} exceeds n_clients = {self.n_clients}")
        try:
            t = secagg_config(agg).t(self.n_clients)
        except SecAggError as e:
            raise ValueError(f"dropouts = {self.dropouts}: {e}") from None
        if self.n_clients - self.dropouts < t:
            raise ValueError(f"dropouts = {self.dropouts} leaves {self.n_clients - self.dropouts} of n_clients = "
                             f"{self.n_clients}, below the secure aggregation threshold t = {t} (secagg_threshold): "
                             f"at most {self.n_clients - t} dropouts, or a lower secagg_threshold")
