"""STFL's message kinds and their payload schemas (schemas only).

The schemas are built from the parsed settings: a run declares only its variant's kinds (STFL:
PSI and the latent codes; Hierarchical: PSI and the split network's four kinds), with the latent
widths and the intersection size of its data set, so the party's check on receipt and the
audit's check of every record say everything the message may be.
"""
from __future__ import annotations

from fedhet.algorithms.split_driver import SplitKinds
from fedhet.algorithms.stfl.settings import GUEST, HOST, Settings
from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import dp_settings, psi


class Kind:
    LATENT = "stfl/latent"
    READY = "split/ready"
    BATCH = "split/batch"
    ACTIVATION = "split/activation"
    GRADIENT = "split/gradient"


SPLIT_KINDS = SplitKinds(Kind.BATCH, Kind.ACTIVATION, Kind.GRADIENT)


def _f32_rows(s: Settings, rows: int | None, max_rows: int | None = None) -> sch.Spec:
    """float32 (rows, d_latent) with d_latent one of the guests' latent widths."""
    options = tuple(sch.Arr("<f4", (rows, w), max_elems=None if max_rows is None else max_rows * w)
                    for w in sorted(set(s.latent_widths())))
    return options[0] if len(options) == 1 else sch.OneOf(options)


def declarations(s: Settings) -> list[MessageDecl]:
    guest_index = sch.Int(lo=0, hi=s.n_guests - 1)
    if s.variant == "stfl":
        decls = psi.declarations(HOST, GUEST, backend=s.psi_backend) + [
            declare(Kind.LATENT, GUEST, HOST, "STFL: a guest's frozen-encoder latent means of exactly the "
                    "intersected rows, once: float32 (n_common, d_latent = guest input width * latent_frac)",
                    payload=sch.Fields({"z": _f32_rows(s, s.expected_common()), "guest_index": guest_index}),
                    protects="derived"),
        ]
        if s.release.on:  # each latent row clipped and noised once (one Gaussian release per row)
            decls = dp_settings.annotate(decls, s.release.as_dp(), (Kind.LATENT,), "row")
        return decls
    bs = s.model.batch_size
    return psi.declarations(HOST, GUEST, backend=s.psi_backend) + [
        declare(Kind.READY, GUEST, HOST, "hierarchical: a guest's index among the guests; no arrays",
                payload=sch.Fields({"guest_index": guest_index}), protects="control"),
        declare(Kind.BATCH, HOST, GUEST, "hierarchical: op (train/eval/stop) and the batch's positions in the "
                "common list as a plain list; no arrays",
                payload=sch.Fields({"op": sch.Str(choices=("train", "eval", "stop")),
                                    "rows": sch.ListOf(sch.Int(lo=0), max_len=bs)}), protects="control"),
        declare(Kind.ACTIVATION, GUEST, HOST, "hierarchical: guest encoder outputs of one batch, plaintext: "
                "float32 (batch <= batch_size, d_latent)", payload=sch.Fields({"a": _f32_rows(s, None, bs)}),
                protects="clear"),
        declare(Kind.GRADIENT, HOST, GUEST, "hierarchical: d loss / d activation of one batch, plaintext: "
                "float32 (batch <= batch_size, d_latent)", payload=sch.Fields({"g": _f32_rows(s, None, bs)}),
                protects="clear"),
    ]
