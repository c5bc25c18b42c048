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

__all__ = ["noised_release", "DPStep", "private_generator", "per_sample_clipped_sum", "dp_sgd_step", "module_clipped_grads",
           "dp_sgd_module_step", "poisson_batch"]


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


def module_clipped_grads(model: torch.nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                         x: torch.Tensor, y: torch.Tensor, clip: float) -> dict[str, torch.Tensor]:
    """For an ``nn.Module``: the sum over rows of per-sample gradients (of ``loss_fn(model(x_i), y_i)``) clipped
    jointly over all parameters to L2 norm ``clip``, by parameter name."""
    params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
    buffers = {k: v.detach() for k, v in model.named_buffers()}

    def one(p, xi, yi):
        out = torch.func.functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    if len(x) == 0:
        return {k: torch.zeros_like(v) for k, v in params.items()}
    grads = torch.func.vmap(torch.func.grad(one), in_dims=(None, 0, 0))(params, x, y)
    norms = torch.sqrt(sum((g.reshape(len(x), -1) ** 2).sum(1) for g in grads.values()))
    factor = torch.clamp(clip / (norms + 1e-12), max=1.0)
    return {k: (g * factor.view(-1, *([1] * (g.dim() - 1)))).sum(0) for k, g in grads.items()}


def dp_sgd_module_step(model: torch.nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                       x: torch.Tensor, y: torch.Tensor, lr: float, step: DPStep, generator: torch.Generator,
                       n: int | None = None) -> None:
    """One DP-SGD step on ``model`` in place: ``x``/``y`` are the Poisson-sampled batch (each of the ``n``
    rows taken with probability ``step.sampling_rate``; :func:`poisson_batch`)."""
    n = len(x) if n is None else n
    g = module_clipped_grads(model, loss_fn, x, y, step.clip)
    with torch.no_grad():
        for k, p in model.named_parameters():
            if k in g:
                noise = torch.normal(0.0, step.noise_multiplier * step.clip, size=p.shape, generator=generator,
                                     dtype=p.dtype)
                p.sub_(lr * (g[k] + noise) / (step.sampling_rate * n))


def poisson_batch(n: int, rate: float, generator: torch.Generator) -> torch.Tensor:
    """Indices of a Poisson-sampled batch: each of ``n`` rows independently with probability ``rate``."""
    return torch.nonzero(torch.rand(n, generator=generator, dtype=torch.float64) < rate).flatten()


def noised_release(releases) -> Callable[[object, torch.Tensor], torch.Tensor]:
    """``(rows, out) -> out`` clipped per row and noised by ``releases``
    (:class:`fedhet.protocols.dp_settings.RowReleases`), for a split network's bottom output before it
    leaves the party.  The clip factor is a constant of the backward pass (the gradient flows through
    the scaled output); the noise is drawn from the OS-seeded generator, never the run seed."""

    def release(rows, out: torch.Tensor) -> torch.Tensor:
        norms = torch.linalg.vector_norm(out.detach(), dim=1).cpu().numpy()
        factor, std = releases.prepare(rows, norms)
        scale = torch.as_tensor(factor, dtype=out.dtype, device=out.device)[:, None]
        noise = torch.as_tensor(releases.noise(tuple(out.shape), std), dtype=out.dtype, device=out.device)
        return out * scale + noise

    return release
