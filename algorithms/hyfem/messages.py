"""HyFEM's message kinds and their payload schemas (schemas only).

Built from the parsed settings: one ``hyfem/theta<d>`` kind per view of the run, the views'
extractor lengths and the inference vector's length from :func:`settings.sizes`, and
``hyfem/plain_view`` declared only where the run allows a view's extractor in the clear
(``allow_plain_views`` with secure aggregation), so a plain view in any other run is an
undeclared kind on receipt and in the audit.
"""
from __future__ import annotations

from fedhet.algorithms.hyfem.settings import AGGREGATION_DEFAULTS, Settings, extractor_size, model_spec
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation, dp_settings, secagg


class Kind:
    HELLO = "hyfem/hello"
    W = "hyfem/w"
    REPORT = "hyfem/report"
    INFERENCE = "hyfem/inference"
    PLAIN_VIEW = "hyfem/plain_view"

    @staticmethod
    def theta(view: int) -> str:
        """The kind of view ``view``'s averaged extractor theta_0,d (one kind per view)."""
        return f"hyfem/theta{view}"


def declarations(s: Settings) -> list[MessageDecl]:
    D = s.partition()[0]
    lengths = [extractor_size(e) for e in model_spec(s).extractors]
    theta = [declare(Kind.theta(d), "server", "client", f"theta_0,{d}: view {d}'s averaged extractor",
                     payload=sch.Fields({"round": sch.Int(lo=0),
                                         "theta": sch.Arr("<f4", (f"ext{d}",))}),
                     protects="derived") for d in range(D)]
    decls = theta + [
        declare(Kind.HELLO, "client", "server", "the client's index and the views it holds (D_m)",
                payload=sch.Fields({"index": sch.Int(lo=0),
                                    "views": sch.ListOf(sch.Int(lo=0, hi=D - 1), max_len=D)}),
                protects="control"),
        declare(Kind.W, "server", "client", "w_m = Pi_m theta_0 on the client's views, flat float32",
                payload=sch.Fields({"round": sch.Int(lo=0), "w": sch.Arr("<f4", ("n_inference",))}),
                protects="derived"),
        declare(Kind.INFERENCE, "client", "server",
                "DISCLOSED: the client's trained inference model w_m in the clear (Eq. (8) matching is "
                "not linear), flat float32",
                payload=sch.Fields({"round": sch.Int(lo=0), "w": sch.Arr("<f4", ("n_inference",))}),
                protects="derived"),
        declare(Kind.REPORT, "client", "server", "scores of the received local model on the evaluation "
                "rows (scalars) and the round's training loss", payload=sch.Scalars(),
                protects="derived"),
    ]
    if s.allow_plain_views and s.aggregation() == "secure":
        sized = tuple(sch.Arr("<f4", (n,)) for n in sorted(set(lengths)))
        decls.append(declare(
            Kind.PLAIN_VIEW, "client", "server",
            "DISCLOSED (allow_plain_views only): the extractor of a view too few clients hold for "
            "secure aggregation, in the clear",
            payload=sch.Fields({"round": sch.Int(lo=0), "view": sch.Int(lo=0, hi=D - 1),
                                "theta": sized[0] if len(sized) == 1 else sch.OneOf(sized)}),
            protects="derived"))
    # per-view extractors, lengths ext<d> (views differ): bounded by the longest
    decls = decls + aggregation.declarations(None, max(lengths), s.agg, AGGREGATION_DEFAULTS)
    # dp = "record": everything a client sends comes out of DP-SGD steps (the declarations say so)
    return dp_settings.annotate(decls, s.dp, (Kind.INFERENCE, Kind.PLAIN_VIEW, aggregation.Kind.PLAIN,
                                              secagg.Kind.MASKED), "record")
