"""MMVFL's trained parts as they leave the run: each participant's own feature selection and classifier.

A participant's part (``"mmvfl/participant"``) is what it trained and what it scores with, all its
own: its ``W_k`` (d_k x classes; the feature scores ``||W_k^(i)||_2`` and so the top-p % selections
derive from it), its z-score (mean and scale of its common training rows), and its k-NN reference set
(its common training rows, standardised, with the labels it trained the classifier on: the true
labels for the label holder, ``argmax Z_k`` for the others, which MMVFL shares by design, see the
package docstring).  ``forward(x)`` takes its RAW rows (float64, its view's columns in order) and
returns, for every percentage p of ``percents``, the class k-NN gives on the top p % of its features
(int64, rows x len(percents)): the classifier its reported accuracies score.  It scores alone: MMVFL
needs no other party at prediction time.

The server holds no part: its Z is the consensus pseudo-label matrix of the common training rows
(rows it cannot even name: it takes no part in PSI), a by-product of training, not a model of
features; it stays in its result (``report_model``).

The k-NN here is :func:`core.knn_predict`'s rule in torch (squared distances up to a per-row
constant, neighbours by distance then training row, votes tied between classes to the nearest tied
neighbour).  Its distances are rounded as torch computes them, numpy's may differ in the last bits, so
where neighbours tie in exact arithmetic (integer pixels on a few features) it may pick another of
them than the run's evaluation did; elsewhere it gives the run's classes.  The check rows (the participant's first validation rows) are scored by this module built
from the live state, and the rebuilt one must give the same classes.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.toolkit import Standardise

from . import core

CHECK_ROWS = 8


class SelectionKNN(nn.Module):
    """Raw rows -> the k-NN class on each selection of features (one column per selection)."""

    reference: torch.Tensor
    labels: torch.Tensor

    def __init__(self, mean: np.ndarray, scale: np.ndarray, reference: np.ndarray, labels: np.ndarray,
                 selections: Sequence[np.ndarray], k: int, n_classes: int) -> None:
        super().__init__()
        self.scaler = Standardise(np.asarray(mean, np.float64), np.asarray(scale, np.float64))
        self.register_buffer("reference", torch.as_tensor(np.asarray(reference, np.float64)))
        self.register_buffer("labels", torch.as_tensor(np.asarray(labels, np.int64)))
        self.n_sel = len(selections)
        for i, idx in enumerate(selections):
            self.register_buffer(f"sel{i}", torch.as_tensor(np.asarray(idx, np.int64)))
        self.k, self.n_classes = min(int(k), len(labels)), int(n_classes)

    def knn(self, q: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
        d2 = (ref * ref).sum(1)[None, :] - 2.0 * (q @ ref.T)
        cols = torch.arange(ref.shape[0])[None, :]
        near = []
        for _ in range(self.k):   # successive first arg-mins: the stable order of the distances
            j = torch.argmin(d2, dim=1, keepdim=True)
            near.append(j)
            d2 = torch.where(cols == j, torch.full_like(d2, float("inf")), d2)
        nl = self.labels[torch.cat(near, dim=1)]                                    # (rows, k)
        votes = (nl[:, :, None] == torch.arange(self.n_classes)[None, None, :]).sum(1)  # (rows, classes)
        best = votes == votes.max(dim=1, keepdim=True).values
        first = torch.argmax(best.gather(1, nl).to(torch.int64), dim=1, keepdim=True)  # nearest tied best
        return nl.gather(1, first).squeeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = self.scaler(x)
        out = []
        for i in range(self.n_sel):
            idx = getattr(self, f"sel{i}")
            out.append(self.knn(xs[:, idx], self.reference[:, idx]))
        return torch.stack(out, dim=1)


def selections(W: np.ndarray, percents: Sequence[float]) -> list[np.ndarray]:
    """The top-p % feature indices of ``W`` for every p (:func:`core.top_features` of its scores)."""
    scores = core.feature_scores(W)
    return [core.top_features(scores, p) for p in percents]


def participant_part(W: np.ndarray, mean: np.ndarray, scale: np.ndarray, X: np.ndarray, labels: np.ndarray,
                     percents: Sequence[float], knn_k: int, n_classes: int, label_source: str,
                     check_x: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and meta ``party.save_model`` takes for a participant (its live trained state)."""
    d = int(np.asarray(W).shape[0])
    tensors = {"W": np.asarray(W, np.float64), "scaler_mean": np.asarray(mean, np.float64),
               "scaler_scale": np.asarray(scale, np.float64), "reference_x": np.asarray(X, np.float64),
               "reference_labels": np.asarray(labels, np.int64)}
    live = SelectionKNN(mean, scale, X, labels, selections(W, percents), knn_k, n_classes).eval()
    rows = np.asarray(check_x, np.float64)[:CHECK_ROWS]
    with torch.no_grad():
        out = live(torch.as_tensor(rows)).numpy()
    meta: dict[str, Any] = {
        "model": "mmvfl/participant", "feature_names": [f"f{i}" for i in range(d)],
        "feature_names_note": "the multi-view sets have no column names: f0..f{d-1} in the view's column order",
        "classes": list(range(int(n_classes))), "percents": [float(p) for p in percents], "knn_k": int(knn_k),
        "reference_labels": label_source,
        "scaler": {"kind": "z-score", "tensors": ["scaler_mean", "scaler_scale"],
                   "fitted_on": "the participant's common training rows"},
        "inputs": [{"name": "x", "shape": [None, d], "dtype": "float64"}],
        "outputs": ["classes_by_percent"],
        "scores_alone": "yes: the k-NN class of a raw row on each top-p % selection of its own features",
        "check": {"inputs": {"x": rows.tolist()}, "outputs": out.tolist()}}
    return tensors, meta


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> SelectionKNN:
    if meta.get("model") != "mmvfl/participant":
        raise ValueError(f"mmvfl: unknown part {meta.get('model')!r}")
    return SelectionKNN(tensors["scaler_mean"], tensors["scaler_scale"], tensors["reference_x"],
                        tensors["reference_labels"], selections(tensors["W"], meta["percents"]),
                        int(meta["knn_k"]), len(meta["classes"])).eval()
