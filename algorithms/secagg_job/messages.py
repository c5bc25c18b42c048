"""The job's message kinds: its round signal and per-round report, and the aggregation protocol's."""
from __future__ import annotations

from fedhet.algorithms.secagg_job.settings import DEFAULTS, Settings
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation

SERVER, CLIENT = "server", "client"


class Kind:
    """The job's own kinds (the aggregation protocol's are declared by :mod:`fedhet.protocols.aggregation`)."""

    GO = "bench/go"             # server -> client: the round number (start signal)
    DONE = "bench/done"         # client -> server: its CPU seconds and bytes in the round


def declarations(s: Settings) -> list[MessageDecl]:
    return [
        declare(Kind.GO, SERVER, CLIENT, "the round number (start signal)", payload=sch.Int(lo=0),
                protects="control"),
        declare(Kind.DONE, CLIENT, SERVER, "the client's CPU seconds (its thread, its process) and bytes in the "
                "round (scalars)", payload=sch.Fields({"cpu": sch.Float(), "pcpu": sch.Float(), "up": sch.Int(lo=0),
                                                       "down": sch.Int(lo=0)}),
                protects="control"),
    ] + aggregation.declarations(s.m, s.m, s.agg, DEFAULTS)
