"""CHFL's two-column network (Mori et al., Sec. IV-B).

Each client's model has a *common column* (an MLP on the common features,
trained by FedAvg across clients) and a *unique column* of the same shape on
the client's unique features (trained locally).  Lateral connections feed
the common column's layer i into the unique column's layer i+1, scaled by a
fixed ``mu`` in [0, 1] (Eq. (6) with U replaced by mu*U):

    z_u^(i+1) = a(W_u^(i+1) z_u^(i) + b_u^(i+1) + mu * U^(i+1) z_c^(i)),  i = 1..L-1

with a = ReLU on hidden layers and the identity on the output layer (the
logits).  The output is F = softmax(z_c^(L) + z_u^(L)) (Eq. (7)); the loss is
cross-entropy on the summed logits.  ``mu = 0`` means no laterals: the
columns meet only at the output sum.

What FedAvg moves is the common column's parameters as ONE flat float32
vector (:func:`common_to_flat` / :func:`flat_to_common`), in the fixed order
of ``column.parameters()`` (layer by layer, weight then bias); its length
P_c is known from the settings alone (:func:`column_params`), which is what
the message declarations pin.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.toolkit import seeded

HIDDEN = (512, 256, 128)  # Sec. V-A2: three hidden layers, 512-256-128


class MLPColumn(nn.Module):
    """Plain MLP d_in -> hidden... -> n_classes (the common column, and the
    network of the Common and Local baselines)."""

    def __init__(self, d_in: int, n_classes: int, hidden: Sequence[int] = HIDDEN):
        super().__init__()
        _check_dims(d_in, n_classes, hidden)
        widths = [int(d_in), *map(int, hidden), int(n_classes)]
        self._widths = widths
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))

    @property
    def widths(self) -> list[int]:
        return list(self._widths)

    def forward_all(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Outputs z^(1..L) of every layer (ReLU'd hidden layers, then logits)."""
        outs, h = [], x
        last = len(self.layers) - 1
        for i, lin in enumerate(self.layers):
            h = lin(h)
            if i < last:
                h = torch.relu(h)
            outs.append(h)
        return outs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_all(x)[-1]


class UniqueColumn(nn.Module):
    """The unique column with its lateral matrices U^(2..L) (Eq. (6)).

    ``lateral=False`` builds no U at all; with laterals present the term is
    always computed and scaled by ``mu`` (so mu=0 is exactly "no laterals").
    """

    def __init__(self, d_in: int, n_classes: int, hidden: Sequence[int] = HIDDEN,
                 mu: float = 0.0, lateral: bool | None = None):
        super().__init__()
        _check_dims(d_in, n_classes, hidden)
        mu = float(mu)
        if not 0.0 <= mu <= 1.0:
            raise ValueError(f"mu must be in [0, 1], got {mu}")
        self.mu = mu
        widths = [int(d_in), *map(int, hidden), int(n_classes)]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        if lateral is None:
            lateral = mu > 0
        # U^(i+1): common layer i (width widths[i]) -> unique layer i+1; no
        # bias, as in progressive nets (the unique layer has its own b).
        self.laterals = (nn.ModuleList(nn.Linear(widths[i], widths[i + 1], bias=False)
                                       for i in range(1, len(widths) - 1))
                         if lateral else None)

    def forward(self, xu: torch.Tensor, zc: Sequence[torch.Tensor]) -> torch.Tensor:
        """Logits z_u^(L); ``zc`` = the common column's ``forward_all`` output."""
        h = xu
        last = len(self.layers) - 1
        for i, lin in enumerate(self.layers):
            a = lin(h)
            if i > 0 and self.laterals is not None:
                a = a + self.mu * self.laterals[i - 1](zc[i - 1])
            h = torch.relu(a) if i < last else a
        return h


class CHFLNet(nn.Module):
    """One client's whole network Theta_k = (theta_c, theta_u,k, U_k)."""

    def __init__(self, d_common: int, d_unique: int, n_classes: int,
                 hidden: Sequence[int] = HIDDEN, mu: float = 0.0, lateral: bool | None = None,
                 common: MLPColumn | None = None):
        super().__init__()
        self.common = common if common is not None else MLPColumn(d_common, n_classes, hidden)
        if self.common.widths[1:-1] != list(hidden) or self.common.widths[0] != d_common:
            raise ValueError(f"common column widths {self.common.widths} do not match "
                             f"d_common={d_common}, hidden={list(hidden)}")
        self.unique = UniqueColumn(d_unique, n_classes, hidden, mu, lateral)

    @property
    def mu(self) -> float:
        return self.unique.mu

    def forward(self, xc: torch.Tensor, xu: torch.Tensor) -> torch.Tensor:
        """Logits z_c^(L) + z_u^(L); softmax of these is F (Eq. (7))."""
        zc = self.common.forward_all(xc)
        return zc[-1] + self.unique(xu, zc)

    def forward_fixed_common(self, xc: torch.Tensor, xu: torch.Tensor) -> torch.Tensor:
        """Same output with the common column treated as a constant (no
        gradient reaches theta_c: Algorithm 2, lines 15-16)."""
        with torch.no_grad():
            zc = self.common.forward_all(xc)
        return zc[-1] + self.unique(xu, zc)


def _check_dims(d_in: int, n_classes: int, hidden: Sequence[int]) -> None:
    if int(d_in) < 1:
        raise ValueError(f"input width must be >= 1, got {d_in}")
    if int(n_classes) < 2:
        raise ValueError(f"need at least 2 classes, got {n_classes}")
    if len(hidden) < 1 or any(int(h) < 1 for h in hidden):
        raise ValueError(f"hidden widths must be positive, got {list(hidden)}")


# ------------------------------------------------------------- parameter counts

def column_params(d_in: int, n_classes: int, hidden: Sequence[int], lateral: bool = False) -> int:
    """Parameters of a column ``[d_in, *hidden, n_classes]`` (in*out + out per layer), plus, with
    ``lateral``, the unique column's lateral matrices U^(2..L) (no bias): P_c for the common column."""
    w = [int(d_in), *map(int, hidden), int(n_classes)]
    count = sum(a * b + b for a, b in zip(w[:-1], w[1:]))
    return count + (sum(a * b for a, b in zip(w[1:-1], w[2:])) if lateral else 0)


# ------------------------------------------------------------- flat vectors

def common_numel(column: nn.Module) -> int:
    return sum(p.numel() for p in column.parameters())


def common_to_flat(column: nn.Module) -> np.ndarray:
    """The column's parameters as one contiguous float32 numpy vector (a copy)."""
    with torch.no_grad():
        vec = torch.cat([p.detach().reshape(-1).float().cpu() for p in column.parameters()])
    return vec.numpy().astype(np.float32, copy=False)


def flat_to_common(column: nn.Module, vec: np.ndarray | torch.Tensor) -> None:
    """Load a flat vector (numpy or torch) into the column's parameters in place."""
    v = torch.as_tensor(np.asarray(vec) if not torch.is_tensor(vec) else vec)
    n = common_numel(column)
    if v.ndim != 1 or v.numel() != n:
        raise ValueError(f"common vector has shape {tuple(v.shape)}, expected ({n},)")
    if not torch.isfinite(v).all():
        raise ValueError("common vector has NaN or infinite entries")
    with torch.no_grad():
        off = 0
        for p in column.parameters():
            k = p.numel()
            p.copy_(v[off:off + k].view_as(p).to(p.device, p.dtype))
            off += k


def init_common_flat(d_common: int, n_classes: int, hidden: Sequence[int] = HIDDEN,
                     seed: int = 0) -> np.ndarray:
    """theta_c^0 from a seed (what a server sends before round 0), without
    touching torch's global RNG."""
    with seeded(seed):
        col = MLPColumn(d_common, n_classes, hidden)
    return common_to_flat(col)
