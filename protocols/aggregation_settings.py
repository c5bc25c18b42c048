"""The aggregation keys of an ``[algorithm]`` table, declared once for every algorithm.

An algorithm that aggregates includes :class:`AggregationSettings` in its settings dataclass
with ``setting(AggregationSettings(), flatten=True)``: its keys (``aggregation``,
``secagg_clip``, ...) then sit in the same flat table, checked by the one settings parser.
Unset keys (None) fall back to the algorithm's own defaults (its public clipping bound and
largest weight): another :class:`AggregationSettings`, which it passes with the run's to
:func:`fedhet.protocols.aggregation.make_aggregator` and :func:`~fedhet.protocols.aggregation.declarations`
(``settings.over(defaults)`` is what is in force).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Literal

from fedhet.parties.settings import setting


@dataclass(frozen=True)
class AggregationSettings:
    aggregation: Literal["secure", "plain"] | None = setting(
        None, "secure: Bonawitz et al.'s secure aggregation (the server sees masked vectors); "
              "plain: vectors in the clear (the algorithm's default when unset)")
    plain_dtype: Literal["float64", "float32"] | None = setting(
        None, "plain aggregation's vector dtype (float64 keeps the in-process mean exact)")
    aggregation_timeout: float | None = setting(None, "seconds the server waits per step (None: the party timeout)",
                                                lo=0, lo_open=True)
    secagg_graph: Literal["complete", "harary"] | None = setting(
        None, "masking graph: complete (every pair) or harary (SecAgg+, O(log n) neighbours)")
    secagg_degree: int | None = setting(None, "SecAgg+ neighbours per client (None: the documented default)", lo=2)
    secagg_threshold: float | int | None = setting(
        None, "clients needed: a fraction in (0, 1) (t = floor(f n) + 1) or a count >= 2", lo=0, lo_open=True)
    secagg_ring_bits: Literal[32, 64] | None = setting(None, "ring Z/2^b of the masked vectors")
    secagg_clip: float | None = setting(None, "public clipping bound |x| <= clip of every input", lo=0,
                                        lo_open=True)
    secagg_max_weight: float | None = setting(None, "largest weight a client may submit (its row count)",
                                              lo=0, lo_open=True)
    secagg_frac_bits: int | None = setting(None, "fixed-point fraction bits (None: the most the ring allows)",
                                           lo=0, hi=61)
    secagg_timeout: float | None = setting(None, "seconds the server waits per secagg step", lo=0, lo_open=True)
    secagg_client_timeout: float | None = setting(None, "seconds a client waits for the server", lo=0,
                                                  lo_open=True)

    def over(self, defaults: "AggregationSettings | None") -> "AggregationSettings":
        """These settings, each key left unset (None) taking its value from ``defaults``."""
        if defaults is None:
            return self
        return replace(defaults, **{f.name: getattr(self, f.name) for f in fields(self)
                                    if getattr(self, f.name) is not None})

    @property
    def method(self) -> str:
        """The aggregation method in force: ``aggregation``, secure when unset."""
        return self.aggregation or "secure"
