"""MMVFL's messages: its own three kinds, PSI's, and the aggregation kinds of its settings' method.

The aggregated vectors are Z_k (n_rows x n_classes, flattened) and the objective's two terms; their
schemas say exactly that: a plain update is one of those two lengths in the ``plain_dtype``, a masked
one Z_k's length + 1 in the settings' ring (default 64 bits) or the objective's + 1 in the 64-bit ring.
Only the kinds of the configured method are declared, so a plain update in a secure run is refused.
"""
from __future__ import annotations

from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import aggregation, psi, secagg

from .settings import N_OBJECTIVE, PARTICIPANT, SERVER, Settings, sizes


class Kind:
    """The kinds MMVFL sends itself (besides PSI's and the aggregation's)."""

    Z = "mmvfl/z"            # server -> participant: the combined pseudo-labels Z (Eq. (8))
    STEP = "mmvfl/step"      # server -> participant: go on or stop
    REPORT = "mmvfl/report"  # participant -> server: validation accuracies (scalars)


def _vectors(s: Settings) -> tuple[str, sch.Spec]:
    """The aggregation's vector field and its schema: Z_k's or the objective's vector (module docstring)."""
    z_len = sizes(s)["z_len"]
    if (s.agg.aggregation or "secure") == "plain":
        dt = "<f4" if s.agg.plain_dtype == "float32" else "<f8"
        # Values are the server's own per-round checks (check_update): NaN or inf drops that update.
        return "x", sch.OneOf((sch.Arr(dt, (z_len,), finite=False), sch.Arr(dt, (N_OBJECTIVE,), finite=False)))
    z_ring = "<u4" if s.agg.secagg_ring_bits == 32 else "<u8"
    return "y", sch.OneOf((sch.Arr(z_ring, (z_len + 1,)), sch.Arr("<u8", (N_OBJECTIVE + 1,))))


def _as_participant(d: MessageDecl, vector: tuple[str, sch.Spec]) -> MessageDecl:
    """An aggregation kind with its "client" role renamed to this algorithm's participant; the vector
    kinds' payloads pinned to Z_k's and the objective's vectors."""
    def role(t: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(PARTICIPANT if r == "client" else r for r in t)
    payload = d.payload
    if d.kind in (aggregation.Kind.PLAIN, secagg.Kind.MASKED) and isinstance(payload, sch.Fields):
        field, spec = vector
        payload = sch.Fields({**payload.fields, field: spec}, payload.optional)
    return declare(d.kind, role(d.sender), role(d.receiver), d.what, payload, protects=d.protects)


def declarations(s: Settings) -> list[MessageDecl]:
    plain = (s.agg.aggregation or "secure") == "plain"
    vector = _vectors(s)
    agg = [d for d in aggregation.declarations(None, max(sizes(s)["z_len"], N_OBJECTIVE))
           if (d.kind == aggregation.Kind.PLAIN) == plain]
    return [
        declare(Kind.Z, SERVER, PARTICIPANT, "the combined pseudo-labels Z = sum zeta_k Z_k / sum zeta_k (Eq. (8)) "
                "of the common training rows; approximates the labels Y by design",
                payload=sch.Fields({"r": sch.Int(lo=0), "Z": sch.Arr("<f8", ("n_rows", "n_classes"))}),
                # The opened aggregate of the participants' pseudo-labels (what it approximates is declared).
                protects="derived"),
        declare(Kind.STEP, SERVER, PARTICIPANT, "go on or stop (from the aggregated objective); no arrays",
                payload=sch.Fields({"r": sch.Int(lo=0), "stop": sch.Bool()}), protects="control"),
        declare(Kind.REPORT, PARTICIPANT, SERVER, "a participant's validation accuracy for each p, its "
                "reweighting steps and solver; scalars only",
                payload=sch.Fields({"accuracy": sch.ListOf(sch.Float(), length="n_percents"),
                                    "inner_iterations": sch.Int(lo=0), "n_features": sch.Int(lo=1),
                                    "solver": sch.Str(max_len=16)}), protects="derived"),
    ] + psi.declarations(PARTICIPANT, PARTICIPANT, backend=s.psi_backend) + [_as_participant(d, vector) for d in agg]
