"""The trained logistic regression as a party exports it: a torch module that scores raw rows.

A client's part is the global model it was last sent, with its own scaler (its training rows'
means and deviations) and the feature names in order: what it would deploy.  The server's part
is the global weights alone (its module takes standardised rows).  ``forward(x)`` returns the
class probabilities ``[1 - p, p]`` with ``p = sigmoid(((x - mean) / std) w + b)``, in float64.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

CHECK_ROWS = 8   # rows whose outputs a part carries, so a reload can show it scores the same


class LogisticScorer(nn.Module):
    weight: torch.Tensor
    bias: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, weight: np.ndarray, bias: np.ndarray, mean: np.ndarray | None = None,
                 std: np.ndarray | None = None) -> None:
        super().__init__()
        d = len(weight)
        self.register_buffer("weight", torch.as_tensor(np.asarray(weight, np.float64).reshape(d, 1)))
        self.register_buffer("bias", torch.as_tensor(np.asarray(bias, np.float64).reshape(1)))
        self.register_buffer("mean", torch.as_tensor(np.zeros(d) if mean is None else np.asarray(mean, np.float64)))
        self.register_buffer("std", torch.as_tensor(np.ones(d) if std is None else np.asarray(std, np.float64)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(((x - self.mean) / self.std) @ self.weight + self.bias)
        return torch.cat([1 - p, p], dim=1)


def part(w: np.ndarray, *, mean: np.ndarray | None, std: np.ndarray | None, feature_names: list[str],
         check_x: np.ndarray | None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and metadata ``party.save_model`` takes for global weights ``w`` (bias last)."""
    tensors = {"weight": np.asarray(w[:-1], np.float64), "bias": np.asarray(w[-1:], np.float64)}
    meta: dict[str, Any] = {"model": "logistic_regression", "feature_names": list(feature_names), "classes": [0, 1],
                            "inputs": [{"name": "x", "shape": [None, len(w) - 1], "dtype": "float64",
                                        "scaled": mean is None}],
                            "outputs": ["probabilities"]}
    if mean is not None and std is not None:
        tensors["scaler_mean"], tensors["scaler_std"] = np.asarray(mean, np.float64), np.asarray(std, np.float64)
        meta["scaler"] = {"kind": "z-score", "tensors": ["scaler_mean", "scaler_std"]}
    if check_x is not None:
        rows = np.asarray(check_x, np.float64)[:CHECK_ROWS]
        with torch.no_grad():
            out = load_model(meta, tensors)(torch.as_tensor(rows)).numpy()
        meta["check"] = {"inputs": {"x": rows.tolist()}, "outputs": out.tolist()}
    return tensors, meta


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> LogisticScorer:
    scaler = meta.get("scaler")
    return LogisticScorer(tensors["weight"], tensors["bias"],
                          tensors["scaler_mean"] if scaler else None, tensors["scaler_std"] if scaler else None)
