"""What crosses a party boundary in a CHFL run: the kinds and their payload schemas.

What leaves a client (declared, checked on receipt and by ``fedhet audit``): the aggregator's
messages, whose only array is the masked (or, with plain aggregation, clear) vector of exactly the
common column's parameter count P_c = sum over layers of (in*out + out) for the widths
[n_common, *hidden, n_classes] (+1 masked weight coordinate) -- a unique column, the laterals or
the whole network cannot pass; in a Local run no aggregation message at all (not declared); and at
the end one ``chfl/result`` of scalars (per-client test accuracies, chosen hyper-parameters,
counts, timings).  The server sends ``chfl/global``: the averaged common column(s), one float32
(P_c,) vector per lr (none in a Local run).
"""
from __future__ import annotations

from fedhet.algorithms.chfl.settings import AGGREGATION_DEFAULTS, Settings
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation, dp_settings, secagg


class Kind:
    GLOBAL = "chfl/global"
    RESULT = "chfl/result"


def sizes(s: Settings) -> dict[str, int]:
    """The schemas' symbols: P_c (the common column's parameter count) and G (vectors per message)."""
    return {"P_c": s.common_params if s.G else 0, "G": s.G}


def declarations(s: Settings) -> list[MessageDecl]:
    result = declare(Kind.RESULT, "client", "server",
                     "final scalars: per-client test accuracies, chosen lr/mu/round, test count, timings",
                     payload=sch.Scalars(), protects="derived")
    if s.method == "local":  # no parameter leaves a client: no global model, no aggregation message
        return [result]
    glob = declare(Kind.GLOBAL, "server", "client",
                   "the averaged common column theta_c, one float32 (P_c,) vector per lr",
                   payload=sch.Fields({"r": sch.Int(lo=0),
                                       "theta": sch.ListOf(sch.Arr("<f4", ("P_c",)), length="G")}),
                   protects="derived")
    P = s.common_params
    updates = aggregation.declarations(P, P, s.agg, AGGREGATION_DEFAULTS)
    # dp = "record": theta_c comes out of DP-SGD; "client": the update of theta_c, clipped and noised (the
    # declaration says so; fedhet messages shows it)
    updates = dp_settings.annotate(updates, s.dp, (aggregation.Kind.PLAIN, secagg.Kind.MASKED), s.dp.dp)
    return [glob, result] + updates
