"""The secure-aggregation benchmark job's settings (the ``[algorithm]`` table, aggregation keys included)."""
from __future__ import annotations

from dataclasses import dataclass

from fedhet.parties.settings import setting
from fedhet.protocols.aggregation_settings import AggregationSettings

NAME = "secagg_bench"
CLIP, MAX_WEIGHT = 4.0, 100.0
DEFAULTS = AggregationSettings(aggregation="secure", secagg_clip=CLIP, secagg_max_weight=MAX_WEIGHT)


@dataclass(frozen=True)
class Settings:
    m: int = setting(1000, "vector length", lo=1)
    n_clients: int = setting(3, "K, the number of clients (the server's exact mean needs it)", lo=1)
    bench_rounds: int = setting(1, "timed rounds (one warm-up round more is run)", lo=1)
    input_seed: int = setting(0, "seeds the clients' vectors and weights", lo=0)
    seed: int = setting(0, "the federation's seed (unused: inputs come from input_seed)", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)
