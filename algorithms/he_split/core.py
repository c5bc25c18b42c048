"""The HE split network's models: bottom models, the host's part of the interactive layer, the top model.

Network (FATE's hetero NN): each party has a bottom model ``x -> A`` (``bottom_layers`` hidden layers,
then ``Linear -> bottom_activation`` to ``host_bottom_width`` / ``guest_bottom_width`` units); the
interactive layer ``h = act(A_h W_h + b + sum_g A_g W_g)`` of ``interactive_width`` units; the
host's top model ``h -> logits`` (``top_layers`` hidden layers), binary cross-entropy (one logit) or
cross-entropy, mean over the batch.  Bottom and top models train with Adam (``lr``), the interactive
layer with plain SGD (``interactive_lr``; FATE's dense layer update, and the only one the masked
weight update of the protocol supports).  Each guest's part ``W_g`` is not here: it lives in the
link (encrypted, :mod:`fedhet.protocols.he_interactive`, or in the clear, ``PlainLinearLayer``).

Every model is initialised from its own frozen seed (:func:`model_seed`), so the federated run and
the in-process reference start from the same weights.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.split_driver import GuestBottom, HostPart, Schedule
from fedhet.algorithms.toolkit import crc32_seed, logit_width, make_activation, mlp, seeded

from .settings import Settings

BATCH_ORDER_TAG = 0x4E5  # the batch order's key is [seed, BATCH_ORDER_TAG] (frozen)


def model_seed(seed: int, what: str) -> int:
    """The seed of one model: ``toolkit.crc32_seed`` of ``"{seed}/he_split/{what}"`` (frozen)."""
    return crc32_seed(f"{seed}/he_split/{what}")


def bottom_model(s: Settings, d_in: int, width: int) -> nn.Module:
    """``x -> A``: ``bottom_layers`` hidden layers, then Linear -> ``bottom_activation`` to ``width``."""
    return nn.Sequential(mlp(d_in, width, s.bottom_hidden_mult, s.bottom_layers, s.bottom_activation),
                         make_activation(s.bottom_activation))


class HostModel(nn.Module):
    """Host bottom, the host's part of the interactive layer (W_h, b), and the top model."""

    def __init__(self, s: Settings, d_host: int, n_classes: int):
        super().__init__()
        self.bottom = bottom_model(s, d_host, s.host_bottom_width)
        self.inter = nn.Linear(s.host_bottom_width, s.interactive_width)
        self.act = make_activation(s.interactive_activation)
        self.top = mlp(s.interactive_width, logit_width(n_classes), s.top_hidden_mult, s.top_layers,
                       s.bottom_activation)

    def head(self, z_host: torch.Tensor, z_guests: list[torch.Tensor]) -> torch.Tensor:
        """``top(act(z_host + sum_g z_g))``: the interactive layer's pre-activation summed, then the top."""
        z = z_host
        for zg in z_guests:
            z = z + zg
        return self.top(self.act(z))


def build_host(s: Settings, d_host: int, guest_widths: list[int], n_classes: int) -> tuple[HostModel, list[np.ndarray]]:
    """(HostModel, initial W_g per guest) from the run seed; the interactive layer's fan-in is the
    concatenation of all bottoms, as one Linear over [A_h || A_g1 || ...] would have."""
    with seeded(model_seed(s.seed, "host")):
        model = HostModel(s, d_host, n_classes)
        fan_in = s.host_bottom_width + sum(guest_widths)
        bound = 1.0 / np.sqrt(fan_in)
        with torch.no_grad():
            model.inter.weight.uniform_(-bound, bound)
            model.inter.bias.uniform_(-bound, bound)
        Ws = [torch.empty(w, s.interactive_width, dtype=torch.float64).uniform_(-bound, bound).numpy()
              for w in guest_widths]
    return model, Ws


def build_guest(s: Settings, d_in: int, name: str) -> nn.Module:
    """A guest's bottom model, seeded from its party name."""
    with seeded(model_seed(s.seed, f"guest/{name}")):
        return bottom_model(s, d_in, s.guest_bottom_width)


def host_optimizers(s: Settings, model: HostModel) -> list[torch.optim.Optimizer]:
    """Adam over the bottom and top models, plain SGD over the host's part of the interactive layer."""
    adam = torch.optim.Adam(list(model.bottom.parameters()) + list(model.top.parameters()), lr=s.lr)
    sgd = torch.optim.SGD(model.inter.parameters(), lr=s.interactive_lr)
    return [adam, sgd]


def schedule(s: Settings) -> Schedule:
    """The host's schedule: batch order from ``[seed, 0x4E5]`` per epoch, ``max_batches`` budget,
    ``evaluate``; the envelope round counts batches."""
    return Schedule(s.epochs, s.batch_size, [s.seed, BATCH_ORDER_TAG], s.max_batches, s.evaluate, round_per="batch")


def host_part(s: Settings, model: HostModel) -> HostPart:
    """The host's side for the driver: bottom -> own part of the interactive layer, plus every
    guest's part (the links' outputs), -> activation -> top model."""
    return HostPart(model, lambda xb, zs: model.head(model.inter(model.bottom(xb)), zs), host_optimizers(s, model))


def guest_bottom(s: Settings, x_common: np.ndarray, name: str) -> GuestBottom:
    """A guest's bottom model (its own seed, from its party name) over its common rows, with Adam."""
    model = build_guest(s, x_common.shape[1], name)
    return GuestBottom(model, np.asarray(x_common, dtype=np.float32), torch.optim.Adam(model.parameters(), lr=s.lr))
