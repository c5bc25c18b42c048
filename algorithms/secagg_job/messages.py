"""The job's message kinds: its round signal and per-round report, and the aggregation protocol's."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

from fedhet.algorithms.secagg_job.settings import Settings
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation

SERVER, CLIENT = "server", "client"


class Kind:
    """The job's own kinds (the aggregation protocol's are declared by :mod:`fedhet.protocols.aggregation`)."""

    GO = "bench/go"             # server -> client: the round number (start signal)
    DONE = "bench/done"         # client -> server: its CPU seconds and bytes in the round


def _reading(table: dict, check: Callable[[list, Any], str | None]) -> Callable[[list, Any], str | None]:
    return lambda arrays, _settings: check(arrays, table)


def _on_aggregation_table(decls: list[MessageDecl], table: dict) -> list[MessageDecl]:
    """The aggregation protocol's audit checks read its keys from a flat table (``aggregation``,
    ``plain_dtype``, ``secagg_ring_bits``): they get the run's aggregation table, the one ``make_aggregator``
    reads (until the protocol takes typed settings)."""
    return [d if d.check is None else dataclasses.replace(d, check=_reading(table, d.check)) for d in decls]


def declarations(s: Settings) -> list[MessageDecl]:
    return [
        declare(Kind.GO, SERVER, CLIENT, "the round number (start signal)", payload=sch.Int(lo=0)),
        declare(Kind.DONE, CLIENT, SERVER, "the client's CPU seconds (its thread, its process) and bytes in the "
                "round (scalars)", payload=sch.Fields({"cpu": sch.Float(), "pcpu": sch.Float(), "up": sch.Int(lo=0),
                                                       "down": sch.Int(lo=0)})),
    ] + _on_aggregation_table(aggregation.declarations(lambda _table: s.m, s.m), s.agg.table())
