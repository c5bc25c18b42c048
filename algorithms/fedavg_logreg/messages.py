"""FedAvg logistic regression's message kinds and payload schemas."""
from __future__ import annotations

from fedhet.algorithms.fedavg_logreg.settings import AGGREGATION_DEFAULTS, Settings
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation, dp_settings
from fedhet.protocols.aggregation import Kind as AggKind
from fedhet.protocols.secagg import Kind as SecAggKind


class Kind:
    MODEL = "fedavg/model"
    EVAL = "fedavg/eval"


def sizes(s: Settings) -> dict[str, int]:
    return {"n_params": s.n_params}


def declarations(s: Settings) -> list[MessageDecl]:
    n = s.n_params
    updates = aggregation.declarations(n, n, s.agg, AGGREGATION_DEFAULTS)
    # under DP the clients' updates carry noise (record level: DP-SGD; client level: clipped and noised)
    updates = dp_settings.annotate(updates, s.dp, (AggKind.PLAIN, SecAggKind.MASKED), s.dp.dp)
    return [
        declare(Kind.MODEL, "server", "client", "global weights (d+1 floats)",
                payload=sch.Fields({"w": sch.Arr("<f8", ("n_params",))}), protects="derived"),
        declare(Kind.EVAL, "client", "server", "test accuracy counts of the global model (no arrays)",
                payload=sch.Fields({"correct": sch.Int(lo=0), "count": sch.Int(lo=0)}), protects="derived"),
    ] + updates  # the clients' updates, plain or secure
