"""The HE split network's messages: its own two kinds, PSI's and the HE interactive layer's."""
from __future__ import annotations

from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import dp_settings
from fedhet.protocols import he_interactive as hei
from fedhet.protocols import psi

from .data import GUEST, HOST
from .settings import Settings


class Kind:
    """The kinds he_split sends itself (besides PSI's ``psi/*`` and the layer's ``hei/*``)."""

    BATCH = "hes/batch"  # host -> guest: the next batch's positions in the common list, or stop
    WIDTH = "hes/width"  # guest -> host: the guest's bottom-model output width


def declarations(s: Settings) -> list[MessageDecl]:
    """PSI's kinds, the batch and width messages, and the HE layer's kinds for these settings (every link
    has the guest width ``guest_bottom_width`` and the interactive width)."""
    batch = sch.Fields({"pos": sch.Arr("<u4", (None,), max_elems=s.batch_size), "train": sch.Bool(),
                        "stop": sch.Bool(), "round": sch.Int(lo=0)})
    layer = hei.declarations(s.layer, s.guest_bottom_width, s.interactive_width, HOST, GUEST)
    if s.release.on:  # the guest's activations clipped and noised per row before they are encrypted
        layer = dp_settings.annotate(layer, s.release.as_dp(), (hei.Kind.ACTS,), "row")
    return (
        psi.declarations(HOST, GUEST, backend=s.psi_backend)
        + [declare(Kind.BATCH, HOST, GUEST, "positions, in the PSI common list, of the next batch's rows "
                   "(uint32, <= batch_size), train/eval flag, or stop",
                   payload=sch.OneOf((batch, sch.Fields({"stop": sch.Bool()}))), protects="control"),
           declare(Kind.WIDTH, GUEST, HOST, "the guest's bottom-model output width; no arrays",
                   payload=sch.Fields({"width": sch.Int(lo=1)}), protects="control")]
        + layer
    )
