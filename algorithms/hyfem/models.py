"""HyFEM's networks (Zhang, Yin, Hong & Chen, "Hybrid Federated Learning", Sec. 2 and 3.1).

* a **feature extractor** theta_d per view d (h_m in Eq. (1)): :class:`ViewMLP` for feature-vector
  views (Handwritten's six views) or :class:`ViewCNN` for image views (COIL-20's 32x32 poses;
  the paper used ResNet-34's convolutional layers on ModelNet40's rendered views, which are not
  available here).  Each maps a view's rows to an embedding of ``embed_dim`` (ReLU'd) units;
* an **inference model** (w_m at client m, theta_0 at the server): an MLP with one hidden layer
  (the paper's choice; deeper is allowed) over the concatenated embeddings of the views the
  model takes, :class:`InferenceMLP`.  The global model takes every view's embedding, in view
  order; client m's model takes only its views' embeddings, in the same (sorted) order, i.e. the
  global input columns ``HyFEMModelSpec.input_columns(D_m)``.  A missing view's embedding is
  filled with zeros (:func:`concat_embeddings`), which is what "zero-padded" means in Eq. (8).

What moves between parties is numpy: an extractor as one flat float32 vector in the fixed order
of ``module.parameters()`` (:func:`get_flat` / :func:`set_flat`), an inference model as its list
of layers ``[(W, b), ...]`` with W of shape (out, in) (:func:`get_layers` /
:func:`InferenceMLP.from_layers`), the representation of :mod:`fedhet.algorithms.hyfem.matching`.

Initialisation is seeded (``toolkit.seeded``), so a seed gives the same weights and the caller's
RNG state is untouched.  Defaults (a config value each, chosen plainly
since the paper gives only "an MLP with one hidden layer"): extractor MLP hidden (128,),
embedding 32 units per view, inference hidden width 64, CNN channels (16, 32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, cast

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.toolkit import resolve_device, seeded

Layers = list[tuple[np.ndarray, np.ndarray]]


# ------------------------------------------------------------------------------ specs

@dataclass(frozen=True)
class ExtractorSpec:
    """One view's feature extractor: ``kind`` "mlp" on (n, in_dim) rows, or "cnn" on images of
    ``image_shape`` (C, H, W), given as (n, C, H, W) or flat (n, C*H*W) rows."""

    kind: str
    in_dim: int
    embed_dim: int = 32
    hidden: tuple[int, ...] = (128,)
    image_shape: tuple[int, int, int] | None = None
    channels: tuple[int, ...] = (16, 32)

    def __post_init__(self) -> None:
        if self.kind not in ("mlp", "cnn"):
            raise ValueError(f"extractor kind must be 'mlp' or 'cnn', got {self.kind!r}")
        for name in ("in_dim", "embed_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ValueError(f"extractor {name} must be a positive integer, got {v!r}")
        if any(int(h) < 1 for h in self.hidden) or any(int(c) < 1 for c in self.channels):
            raise ValueError("extractor hidden widths and channels must be positive")
        if self.kind == "cnn":
            if self.image_shape is None or len(self.image_shape) != 3:
                raise ValueError("a cnn extractor needs image_shape (C, H, W)")
            c, h, w = (int(x) for x in self.image_shape)
            if c * h * w != self.in_dim:
                raise ValueError(f"cnn image_shape {self.image_shape} has {c * h * w} values, "
                                 f"in_dim is {self.in_dim}")
            if len(self.channels) < 1:
                raise ValueError("a cnn extractor needs at least one conv layer")


@dataclass(frozen=True)
class HyFEMModelSpec:
    """Every view's extractor (view d = position d) and the inference models' shape."""

    extractors: tuple[ExtractorSpec, ...]
    n_classes: int
    hidden: tuple[int, ...] = (64,)   # inference hidden widths (the paper: one hidden layer)

    def __post_init__(self) -> None:
        if len(self.extractors) < 1:
            raise ValueError("HyFEM needs at least one view")
        if isinstance(self.n_classes, bool) or int(self.n_classes) < 2:
            raise ValueError(f"n_classes must be >= 2, got {self.n_classes!r}")
        if len(self.hidden) < 1 or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"inference hidden widths must be >= 1 (at least one layer), "
                             f"got {self.hidden!r}")

    @property
    def n_views(self) -> int:
        return len(self.extractors)

    @property
    def embed_dims(self) -> list[int]:
        return [int(e.embed_dim) for e in self.extractors]

    @property
    def n_inputs(self) -> int:
        """Width of the global inference model's input (all views' embeddings)."""
        return sum(self.embed_dims)

    def check_views(self, views: Sequence[int]) -> tuple[int, ...]:
        v = tuple(int(d) for d in views)
        if len(v) < 1 or len(set(v)) != len(v) or list(v) != sorted(v):
            raise ValueError(f"views must be distinct and sorted, got {list(views)}")
        if v[0] < 0 or v[-1] >= self.n_views:
            raise ValueError(f"views {list(v)} outside 0..{self.n_views - 1}")
        return v

    def input_columns(self, views: Sequence[int]) -> np.ndarray:
        """Global input columns of the given views' embeddings, in view order."""
        v = self.check_views(views)
        off = np.concatenate([[0], np.cumsum(self.embed_dims)])
        return np.concatenate([np.arange(off[d], off[d + 1]) for d in v]).astype(np.int64)

    def inference_widths(self, views: Sequence[int], hidden: Sequence[int] | None = None) -> list[int]:
        v = self.check_views(views)
        return ([sum(self.embed_dims[d] for d in v)]
                + [int(h) for h in (self.hidden if hidden is None else hidden)]
                + [int(self.n_classes)])


# ------------------------------------------------------------------------------ modules

class ViewMLP(nn.Module):
    """in_dim -> hidden... -> embed_dim, ReLU after every layer (the embedding included)."""

    def __init__(self, in_dim: int, embed_dim: int, hidden: Sequence[int] = (128,)):
        super().__init__()
        widths = [int(in_dim), *map(int, hidden), int(embed_dim)]
        mods: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:]):
            mods += [nn.Linear(a, b), nn.ReLU()]
        self.net = nn.Sequential(*mods)
        self.in_dim = int(in_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], -1))


class ViewCNN(nn.Module):
    """Conv 3x3 -> ReLU -> 2x2 max-pool per entry of ``channels``, global average pool, then a
    ReLU'd linear embedding (a small stand-in for the paper's ResNet-34 conv layers)."""

    def __init__(self, image_shape: tuple[int, int, int], embed_dim: int,
                 channels: Sequence[int] = (16, 32)):
        super().__init__()
        self.image_shape = tuple(int(x) for x in image_shape)
        mods: list[nn.Module] = []
        c = self.image_shape[0]
        for k in channels:
            mods += [nn.Conv2d(c, int(k), 3, padding=1), nn.ReLU(), nn.MaxPool2d(2, ceil_mode=True)]
            c = int(k)
        mods += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, int(embed_dim)), nn.ReLU()]
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], *self.image_shape))


def build_extractor(spec: ExtractorSpec) -> nn.Module:
    if spec.kind == "mlp":
        return ViewMLP(spec.in_dim, spec.embed_dim, spec.hidden)
    assert spec.image_shape is not None  # ExtractorSpec checks it for a cnn
    return ViewCNN(spec.image_shape, spec.embed_dim, spec.channels)


class InferenceMLP(nn.Module):
    """widths[0] -> hidden... -> n_classes; ReLU after every layer but the last (logits)."""

    def __init__(self, widths: Sequence[int]):
        super().__init__()
        w = [int(x) for x in widths]
        if len(w) < 2 or min(w) < 1:
            raise ValueError(f"inference widths must be >= 2 positive numbers, got {list(widths)}")
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(w[:-1], w[1:]))

    def linears(self) -> list[nn.Linear]:
        """The layers, input to output."""
        return cast(list[nn.Linear], list(self.layers))

    @property
    def widths(self) -> list[int]:
        lins = self.linears()
        return [lins[0].in_features] + [lin.out_features for lin in lins]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, lin in enumerate(self.layers):
            x = lin(x)
            if i < last:
                x = torch.relu(x)
        return x

    @classmethod
    def from_layers(cls, layers: Sequence[tuple[np.ndarray, np.ndarray]],
                    device: torch.device | str = "cpu") -> "InferenceMLP":
        """A model holding exactly ``layers`` (widths taken from them)."""
        if len(layers) < 1:
            raise ValueError("an inference model needs at least one layer")
        widths = [int(np.shape(layers[0][0])[1])] + [int(np.shape(W)[0]) for W, _ in layers]
        model = cls(widths)
        load_layers(model, layers)
        return model.to(resolve_device(device))


def get_layers(model: InferenceMLP) -> Layers:
    """The model's layers as float32 numpy copies (on the CPU)."""
    return [(lin.weight.detach().cpu().numpy().astype(np.float32, copy=True),
             lin.bias.detach().cpu().numpy().astype(np.float32, copy=True))
            for lin in model.linears()]


@torch.no_grad()
def load_layers(model: InferenceMLP, layers: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    if len(layers) != len(model.layers):
        raise ValueError(f"{len(layers)} layers for a model of {len(model.layers)}")
    for i, (lin, (W, b)) in enumerate(zip(model.linears(), layers)):
        W = np.asarray(W)
        b = np.asarray(b)
        if W.shape != tuple(lin.weight.shape) or b.shape != tuple(lin.bias.shape):
            raise ValueError(f"inference layer {i}: got W {W.shape}, b {b.shape}; the model has "
                             f"{tuple(lin.weight.shape)}, {tuple(lin.bias.shape)}")
        lin.weight.copy_(torch.as_tensor(W, dtype=lin.weight.dtype))
        lin.bias.copy_(torch.as_tensor(b, dtype=lin.bias.dtype))


def get_flat(module: nn.Module) -> np.ndarray:
    """All parameters as one float32 vector, in ``module.parameters()`` order."""
    return torch.cat([p.detach().reshape(-1).cpu().float() for p in module.parameters()]).numpy()


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@torch.no_grad()
def set_flat(module: nn.Module, vec) -> None:
    v = torch.as_tensor(np.asarray(vec, dtype=np.float32))
    if v.ndim != 1 or v.numel() != n_params(module):
        raise ValueError(f"flat parameter vector has shape {tuple(v.shape)}; the module has "
                         f"{n_params(module)} parameters")
    off = 0
    for p in module.parameters():
        k = p.numel()
        p.copy_(v[off:off + k].view_as(p).to(p.device, p.dtype))
        off += k


def extractor_from_flat(spec: ExtractorSpec, vec, device: torch.device | str = "cpu") -> nn.Module:
    module = build_extractor(spec)
    set_flat(module, vec)
    return module.to(resolve_device(device))


def init_extractor(spec: ExtractorSpec, seed: int) -> np.ndarray:
    """theta_d^0: a seeded initial extractor as a flat vector."""
    with seeded(seed):
        module = build_extractor(spec)
    return get_flat(module)


def init_inference(widths: Sequence[int], seed: int) -> Layers:
    """A seeded initial inference model as layers."""
    with seeded(seed):
        model = InferenceMLP(widths)
    return get_layers(model)


def concat_embeddings(embeddings: Sequence[torch.Tensor | None], dims: Sequence[int]) -> torch.Tensor:
    """[e_1 | ... | e_k] with a missing view's (None) embedding filled with zeros."""
    if len(embeddings) != len(dims):
        raise ValueError(f"{len(embeddings)} embeddings for {len(dims)} views")
    present = [e for e in embeddings if e is not None]
    if not present:
        raise ValueError("every view's embedding is missing")
    n, ref = present[0].shape[0], present[0]
    parts = []
    for e, d in zip(embeddings, dims):
        if e is None:
            parts.append(ref.new_zeros((n, int(d))))
        else:
            if e.shape != (n, int(d)):
                raise ValueError(f"embedding of shape {tuple(e.shape)}, expected ({n}, {d})")
            parts.append(e)
    return torch.cat(parts, dim=1)
