"""FedAvg logistic regression's message kinds and payload schemas."""
from __future__ import annotations

from dataclasses import replace

from fedhet.algorithms.fedavg_logreg.settings import AGGREGATION_DEFAULTS, Settings
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation


class Kind:
    MODEL = "fedavg/model"
    EVAL = "fedavg/eval"


def sizes(s: Settings) -> dict[str, int]:
    return {"n_params": s.n_params}


def _on_table(d: MessageDecl, table: dict) -> MessageDecl:
    """The protocol's audit check, reading the run's aggregation keys as the flat table it is
    written against."""
    inner = d.check
    if inner is None:
        return d
    return replace(d, check=lambda arrays, _settings: inner(arrays, table))


def declarations(s: Settings) -> list[MessageDecl]:
    n = s.n_params
    table = {**AGGREGATION_DEFAULTS, **s.agg.table()}
    updates = [_on_table(d, table) for d in aggregation.declarations(lambda _table: n, n)]
    return [
        declare(Kind.MODEL, "server", "client", "global weights (d+1 floats)",
                payload=sch.Fields({"w": sch.Arr("<f8", ("n_params",))})),
        declare(Kind.EVAL, "client", "server", "test accuracy counts of the global model (no arrays)",
                payload=sch.Fields({"correct": sch.Int(lo=0), "count": sch.Int(lo=0)})),
    ] + updates  # the clients' updates, plain or secure
