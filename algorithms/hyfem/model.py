"""HyFEM's trained parts as they leave the run: per-view extractors and an inference model that
score raw rows of the views they take.

* **client** m (``hyfem/client``): the model it would deploy, the global extractors theta_{0,d}
  of its views D_m and its inference model w_m = Pi_m theta_0, as it received them for the final
  round (what its final local accuracy scores).  Inputs ``view<d>`` for d in D_m, in view order:
  raw rows of view d; output the class logits.  It scores alone, from its own views.
* **server** (``hyfem/server``): the global model, every view's extractor theta_{0,d} and theta_0.
  Inputs ``view0 .. view{D-1}``; output the class logits.  It scores rows that have every view.

A feature view's standardisation (the public evaluation rows' column means and deviations,
``data.view_scalers``) is applied inside (``scaler_mean_<d>``, ``scaler_std_<d>``), so a part
takes raw rows; image views (COIL-20's 32 x 32 poses, CNN extractors) are used as they are, given
flat (rows, 1024) or as (rows, 1, 32, 32).  The classes are 0..C-1, the decision the arg-max.  A
part's ``check`` holds up to 8 evaluation rows (the public held-out split every party loads) and
the logits the trained model (``core.predict_logits``) gave them.  No part holds a party's
training rows.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.hyfem.core import predict_logits
from fedhet.algorithms.hyfem.models import (ExtractorSpec, HyFEMModelSpec, InferenceMLP, Layers, build_extractor,
                                            extractor_from_flat)
from fedhet.algorithms.toolkit import seeded

CHECK_ROWS = 8   # rows whose outputs a part carries, so a reload can show it scores the same
Scaler = tuple[np.ndarray, np.ndarray] | None


class ViewsScorer(nn.Module):
    """``forward(x_a, x_b, ...)``: each view's rows standardised (feature views), through its
    extractor, the embeddings concatenated in view order, through the inference model: logits."""

    def __init__(self, views: Sequence[int], extractors: Sequence[nn.Module], inference: InferenceMLP,
                 scalers: Sequence[Scaler]) -> None:
        super().__init__()
        self.views = [int(d) for d in views]
        self.extractors = nn.ModuleDict({f"view{d}": e for d, e in zip(self.views, extractors)})
        self.inference = inference
        self.scaled = [sc is not None for sc in scalers]
        for d, sc in zip(self.views, scalers):
            if sc is not None:
                self.register_buffer(f"scaler_mean_{d}", torch.as_tensor(np.array(sc[0], dtype=np.float32)))
                self.register_buffer(f"scaler_std_{d}", torch.as_tensor(np.array(sc[1], dtype=np.float32)))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        emb = []
        for d, scaled, x in zip(self.views, self.scaled, xs):
            if scaled:
                x = (x - getattr(self, f"scaler_mean_{d}")) / getattr(self, f"scaler_std_{d}")
            emb.append(self.extractors[f"view{d}"](x))
        return self.inference(torch.cat(emb, dim=1))


def _spec_meta(e: ExtractorSpec) -> dict[str, Any]:
    return dataclasses.asdict(e)


def _spec(doc: Mapping[str, Any]) -> ExtractorSpec:
    shape = doc.get("image_shape")
    return ExtractorSpec(str(doc["kind"]), int(doc["in_dim"]), int(doc["embed_dim"]), tuple(doc["hidden"]),
                         None if shape is None else (int(shape[0]), int(shape[1]), int(shape[2])),
                         tuple(doc["channels"]))


def part(role: str, spec: HyFEMModelSpec, views: Sequence[int], extractors: Mapping[int, np.ndarray],
         inference: Layers, scalers: Mapping[int, Scaler], x_raw: Mapping[int, np.ndarray],
         x_scaled: Mapping[int, np.ndarray], *, dataset: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and metadata ``party.save_model`` takes for the model made of ``extractors``
    (flat theta_d of ``views``) and ``inference``; ``x_raw`` / ``x_scaled``: evaluation rows of
    those views before and after the run's scaling (the check's outputs: ``predict_logits`` on the
    scaled rows, the role's own evaluation)."""
    v = spec.check_views(views)
    k = min(CHECK_ROWS, len(x_raw[v[0]]))
    rows = {d: np.asarray(x_scaled[d][:k], dtype=np.float32) for d in v}
    with seeded(0):   # building modules draws weights: torch's RNG is left as it was
        out = predict_logits(extractors, inference, v, spec, rows, "cpu").numpy()
        scorer = ViewsScorer(v, [extractor_from_flat(spec.extractors[d], extractors[d]) for d in v],
                             InferenceMLP.from_layers(inference), [scalers[d] for d in v])
    tensors = {name: t.detach().numpy().copy() for name, t in scorer.state_dict().items()}
    inputs = [{"name": f"view{d}", "shape": [None, int(spec.extractors[d].in_dim)], "dtype": "float32"} for d in v]
    meta: dict[str, Any] = {
        "model": f"hyfem/{role}", "dataset": dataset, "views": list(v),
        "feature_names": {f"view{d}": [f"f{j}" for j in range(spec.extractors[d].in_dim)] for d in v},
        "feature_names_note": "the data set names no columns: f0..f{d-1} are a view's columns in order"
                              + ("; an image view's are its pixels, row-major" if any(
                                  spec.extractors[d].kind == "cnn" for d in v) else ""),
        "extractors": {str(d): _spec_meta(spec.extractors[d]) for d in v},
        "inference_widths": scorer.inference.widths,
        "classes": list(range(spec.n_classes)), "decision": "arg-max of the logits",
        "inputs": inputs, "outputs": ["logits"],
        "check": {"inputs": {f"view{d}": np.asarray(x_raw[d][:k], dtype=np.float32).tolist() for d in v},
                  "outputs": out.tolist()}}
    scaled = [d for d in v if scalers[d] is not None]
    if scaled:
        meta["scaler"] = {"kind": "z-score", "views": scaled,
                          "tensors": [f"scaler_{w}_{d}" for d in scaled for w in ("mean", "std")]}
    return tensors, meta


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> ViewsScorer:
    """A part's scoring module, rebuilt from its extractor specs and inference widths (torch's RNG
    untouched)."""
    views = [int(d) for d in meta["views"]]
    scaled = set(int(d) for d in (meta.get("scaler") or {}).get("views", []))
    scalers: list[Scaler] = [(tensors[f"scaler_mean_{d}"], tensors[f"scaler_std_{d}"]) if d in scaled else None
                             for d in views]
    with seeded(0):
        scorer = ViewsScorer(views, [build_extractor(_spec(meta["extractors"][str(d)])) for d in views],
                             InferenceMLP(meta["inference_widths"]), scalers)
    scorer.load_state_dict({k: torch.as_tensor(np.array(v)) for k, v in tensors.items()})
    return scorer.eval()
