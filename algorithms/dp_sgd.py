"""Record-level DP-SGD (Abadi et al. 2016) for a client's local steps, with torch.func per-sample gradients.

One step: Poisson-sample each row with probability ``q``; compute every sampled row's gradient
(``torch.func.vmap(torch.func.grad(loss))``, as Opacus's functorch path does); clip each to L2 norm
``C``; sum, add ``N(0, (z C)^2)`` to every coordinate, divide by the expected batch size ``q n``
(Opacus's convention), and take the step.  A data-independent regulariser's gradient is added
after the noise.  The steps are accounted by :mod:`fedhet.protocols.dp_ledger` as
``PoissonSampled(q, Gaussian(z))`` per step (dp-accounting's RDP accountant).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["DPStep", "private_generator", "per_sample_clipped_sum", "dp_sgd_step"]


def private_generator() -> torch.Generator:
    """A generator seeded from the operating system: the noise no other party can reproduce."""
    g = torch.Generator()
    g.manual_seed(secrets.randbits(63))
    return g


@dataclass(frozen=True)
class DPStep:
    clip: float
    noise_multiplier: float
    sampling_rate: float


def per_sample_clipped_sum(loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                           params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, clip: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over rows of the per-sample gradients clipped to L2 norm ``clip``, the unclipped norms).

    ``loss(params, x_i, y_i)``: one row's loss, a scalar; ``params`` one flat tensor."""
    if len(x) == 0:
        return torch.zeros_like(params), torch.zeros(0, dtype=params.dtype)
    grads = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))(params, x, y)
    norms = grads.norm(dim=1)
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return (grads * factor[:, None]).sum(0), norms


def dp_sgd_step(loss: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor], params: torch.Tensor,
                x: torch.Tensor, y: torch.Tensor, lr: float, step: DPStep, generator: torch.Generator,
                reg_grad: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """One DP-SGD step from ``params`` (see the module docstring); returns the new params."""
    n = len(x)
    take = torch.rand(n, generator=generator, dtype=torch.float64) < step.sampling_rate
    g, _ = per_sample_clipped_sum(loss, params, x[take], y[take], step.clip)
    noise = torch.normal(0.0, step.noise_multiplier * step.clip, size=params.shape, generator=generator,
                         dtype=params.dtype)
    g = (g + noise) / (step.sampling_rate * n)
    if reg_grad is not None:
        g = g + reg_grad(params)
    return params - lr * g
