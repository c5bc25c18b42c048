"""STFL's trained parts as they leave the run: each party's own network behind its own scaler.

Every part is a :class:`PartScorer`: the party's standardisation (its ``scaler_mean`` and
``scaler_std``, applied inside, so it takes RAW rows of its own columns) and then its MLP.

* **guest** (``stfl/guest``: its self-taught VAE's encoder, posterior mean, the decoder dropped;
  ``stfl-hierarchical/guest``: its bottom network): input ``x``, the guest's raw rows (its
  columns, ``feature_names``), output ``z``, the latent code the host's part takes for those rows.
  Its scaler is the statistics of its self-taught rows.  It scores alone, but what it gives is a
  code, not a prediction: the host's part needs it.
* **host** (``stfl/host``, ``stfl-hierarchical/host``): inputs ``x``, the host's raw rows (its
  columns, scaled by its training rows' statistics), and ``z0 .. z{G-1}``, guest ``g``'s part's
  output for the same IDs (guest index ``g``, the order the host trained with); output the logits
  (one logit for two classes: class 1 where it is > 0; else the arg-max of ``classes``).  It
  cannot score alone: each guest runs its part on its own rows of the same IDs and hands the code.

A part holds its party's weights and scaler only.  Its ``check`` holds up to 8 of the party's own
rows (a guest: common rows; the host: common test rows) with the outputs the trained network gave
them; the host's check also holds the latent codes the guests sent it for those rows (messages it
received in the run, never a guest's features).
"""
from __future__ import annotations

import copy
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.stfl.models import Encoder
from fedhet.algorithms.toolkit import Scaler, as_tensor, mlp_from_widths, seeded

CHECK_ROWS = 8   # rows whose outputs a part carries, so a reload can show it scores the same
HOST, GUEST = "host", "guest"


class PartScorer(nn.Module):
    """``forward(x, *z) = net([(x - mean) / std as float32 || z_0 || ... ])``: a party's MLP on its
    standardised raw rows, then (the host) the guests' codes."""

    scaler_mean: torch.Tensor
    scaler_std: torch.Tensor

    def __init__(self, net: nn.Module, mean: np.ndarray, std: np.ndarray) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("scaler_mean", torch.as_tensor(np.array(mean)))
        self.register_buffer("scaler_std", torch.as_tensor(np.array(std)))

    def forward(self, x: torch.Tensor, *z: torch.Tensor) -> torch.Tensor:
        xs = ((x.to(self.scaler_mean.dtype) - self.scaler_mean) / self.scaler_std).to(torch.float32)
        return self.net(torch.cat([xs, *z], dim=1) if z else xs)


def mlp_widths(net: nn.Module) -> list[int]:
    """The widths of an MLP's linear layers, input first (``toolkit.mlp_from_widths``'s argument)."""
    lins = [m for m in net.modules() if isinstance(m, nn.Linear)]
    return [lins[0].in_features] + [m.out_features for m in lins]


def encoder_mean_net(encoder: Encoder) -> nn.Sequential:
    """A CPU copy of a VAE encoder's posterior mean, ``mu(trunk(x))``, as one MLP."""
    enc = copy.deepcopy(encoder).cpu()
    return nn.Sequential(*enc.trunk, enc.mu)


def cpu_copy(net: nn.Module) -> nn.Module:
    """The trained network on the CPU in eval mode, the role's own module left as it is."""
    return copy.deepcopy(net).cpu().eval()


def part(role: str, variant: str, net: nn.Module, scaler: Scaler, *, activation: str, feature_names: Sequence[str],
         raw_rows: np.ndarray, scaled_rows: np.ndarray, codes: Sequence[np.ndarray] = (),
         n_classes: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and metadata ``party.save_model`` takes for a party's trained ``net`` (a CPU
    copy, :func:`cpu_copy` / :func:`encoder_mean_net`) and its ``scaler``.  ``raw_rows`` and
    ``scaled_rows`` are the same rows of the party before and after the role's scaling, ``codes``
    (the host) the guests' codes of those rows; the check's outputs are ``net`` on the role's own
    scaled rows."""
    mean, std = np.asarray(scaler.mean), np.asarray(scaler.std)
    dtype = str(mean.dtype)
    if dtype not in ("float32", "float64"):
        raise ValueError(f"stfl: a scaler of dtype {dtype}; float32 or float64 expected")
    k = min(CHECK_ROWS, len(raw_rows))
    raw = np.asarray(raw_rows[:k], dtype=mean.dtype)
    zs = [np.asarray(z[:k], dtype=np.float32) for z in codes]
    net = net.eval()
    with torch.no_grad():
        out = net(torch.cat([as_tensor(scaled_rows[:k]), *map(as_tensor, zs)], dim=1)).numpy()
    scorer = PartScorer(net, mean, std)
    tensors = {name: t.detach().numpy().copy() for name, t in scorer.state_dict().items()}
    inputs = [{"name": "x", "shape": [None, int(mean.shape[0])], "dtype": dtype}]
    inputs += [{"name": f"z{g}", "shape": [None, int(z.shape[1])], "dtype": "float32",
                "from": f"guest {g}'s part (its output z for the same row)"} for g, z in enumerate(zs)]
    meta: dict[str, Any] = {
        "model": f"{'stfl' if variant == 'stfl' else 'stfl-hierarchical'}/{role}", "variant": variant,
        "feature_names": list(feature_names), "widths": mlp_widths(net), "activation": activation,
        "scaler": {"kind": "z-score", "tensors": ["scaler_mean", "scaler_std"]},
        "inputs": inputs, "outputs": ["logits" if role == HOST else "z"],
        "check": {"inputs": {"x": raw.tolist(), **{f"z{g}": z.tolist() for g, z in enumerate(zs)}},
                  "outputs": out.tolist()}}
    if n_classes is not None:
        meta["classes"] = list(range(n_classes))
        meta["decision"] = "one logit: class 1 where it is > 0" if out.shape[1] == 1 else "arg-max of the logits"
    return tensors, meta


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> PartScorer:
    """A part's scoring module, rebuilt from its widths and activation (torch's RNG untouched)."""
    with seeded(0):
        net = mlp_from_widths(meta["widths"], meta["activation"])
    scorer = PartScorer(net, tensors["scaler_mean"], tensors["scaler_std"])
    scorer.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in tensors.items()})
    return scorer.eval()
