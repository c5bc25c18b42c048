"""Logistic regression's maths: a client's local gradient steps and the model's accuracy."""
from __future__ import annotations

import numpy as np


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


def _augment(x: np.ndarray) -> np.ndarray:
    return np.hstack([x, np.ones((len(x), 1))])


def local_train(w: np.ndarray, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, l2: float) -> np.ndarray:
    """``epochs`` full-batch gradient steps on the mean log-loss + ``l2``/2 |w|^2 (bias unpenalised)."""
    xa = _augment(x)
    for _ in range(epochs):
        g = xa.T @ (_sigmoid(xa @ w) - y) / len(y) + l2 * np.r_[w[:-1], 0.0]
        w = w - lr * g
    return w


def share_correct(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    """Share of rows whose predicted class (probability > 0.5) is the label."""
    return float(np.mean((_sigmoid(_augment(x) @ w) > 0.5) == (y > 0.5)))


def row_loss(w, x, y):
    """One row's log-loss (torch; ``x`` without the bias column): DP-SGD's per-sample loss."""
    import torch

    z = x @ w[:-1] + w[-1]
    return torch.nn.functional.binary_cross_entropy_with_logits(z, y)


def local_train_dp(w: np.ndarray, x: np.ndarray, y: np.ndarray, epochs: int, lr: float, l2: float,
                   step, generator) -> np.ndarray:
    """``epochs`` DP-SGD steps (:func:`fedhet.algorithms.dp_sgd.dp_sgd_step`, ``step`` a ``DPStep``) on the
    mean log-loss + ``l2``/2 |w|^2; the penalty's gradient (data-independent) is added after the noise."""
    import torch

    from fedhet.algorithms.dp_sgd import dp_sgd_step

    p = torch.as_tensor(w, dtype=torch.float64)
    xt, yt = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(y, dtype=torch.float64)

    def reg(q):
        return l2 * torch.cat([q[:-1], q.new_zeros(1)])

    for _ in range(epochs):
        p = dp_sgd_step(row_loss, p, xt, yt, lr, step, generator, reg)
    return p.numpy().copy()
