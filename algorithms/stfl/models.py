"""Networks of STFL (Chu & Zhang, arXiv 2102.05883) and its plaintext baselines.

* ``VAE`` — a guest's self-taught feature extractor (paper §IV-A, Algorithm 3): an MLP encoder
  q_phi(z|x) = N(mu(x), diag(exp(logvar(x)))) and an MLP decoder p_theta(x|z); hidden width =
  ``hidden_mult`` x input width, latent width = ``latent_frac`` x input width (paper §V-A: half).
  ``vae_loss`` is the negative ELBO of Eq. (5): reconstruction error + KL(q_phi(z|x) || N(0, I)).
  After self-taught training the decoder is dropped and the guest sends ``Encoder.mean(x)``
  (Eq. (7): z = a(W x + b) through the encoder's layers).
* ``toolkit.mlp`` — the host's master model on [host features || guest latents] (Eq. (6)), the
  centralized baseline on all features, and the hierarchical baseline's parts (one logit for two
  classes, ``toolkit.logit_width``).
* ``HierarchicalNet`` — paper §V-A "Hierarchical": the same structure as STFL (one encoder per
  guest, deterministic, feeding the host MLP) but trained jointly end to end by backprop on the
  labeled rows; the guest parts are not self-taught.

Width rule: every hidden layer has ``round(mult * input width)`` units (at least 2,
``toolkit.hidden_width``).  The paper's multipliers were lost from the text; defaults live in
``settings.Model``.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fedhet.algorithms.toolkit import hidden_width, logit_width, make_activation, mlp, mlp_from_widths


def latent_width(in_dim: int, frac: float = 0.5) -> int:
    """A guest's latent width: ``floor(frac * in_dim)``, at least 1 (paper: half the input)."""
    if not 0 < frac:
        raise ValueError(f"latent_frac must be > 0, got {frac}")
    return max(1, int(math.floor(frac * in_dim)))


class Encoder(nn.Module):
    """q_phi(z|x): shared MLP trunk, then a mean head and a log-variance head."""

    def __init__(self, in_dim: int, hidden_mult: float = 2.0, latent_frac: float = 0.5,
                 layers: int = 1, activation: str = "relu"):
        super().__init__()
        self.in_dim = in_dim
        self.latent_dim = latent_width(in_dim, latent_frac)
        h = hidden_width(in_dim, hidden_mult)
        trunk: list[nn.Module] = []
        d = in_dim
        for _ in range(layers):
            trunk += [nn.Linear(d, h), make_activation(activation)]
            d = h
        self.trunk = nn.Sequential(*trunk)
        self.mu = nn.Linear(d, self.latent_dim)
        self.logvar = nn.Linear(d, self.latent_dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = self.trunk(x)
        return self.mu(t), self.logvar(t)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """The latent code a guest shares (the posterior mean, no sampling noise)."""
        return self.mu(self.trunk(x))


class VAE(nn.Module):
    def __init__(self, in_dim: int, hidden_mult: float = 2.0, latent_frac: float = 0.5,
                 layers: int = 1, activation: str = "relu"):
        super().__init__()
        self.encoder = Encoder(in_dim, hidden_mult, latent_frac, layers, activation)
        # Decoder mirrors the encoder: same hidden width, back to the input width.
        self.decoder = mlp_from_widths([self.encoder.latent_dim]
                                       + [hidden_width(in_dim, hidden_mult)] * layers + [in_dim], activation)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        mu, logvar = self.encoder(x)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)  # reparameterisation trick
        return self.decoder(z), mu, logvar


def vae_loss(x_hat: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor,
             kl_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Negative ELBO, Eq. (5), averaged over the batch: (total, reconstruction, KL).

    Reconstruction = sum over features of the squared error, i.e. -log p_theta(x|z) for a Gaussian
    decoder with fixed variance 1/2, up to a constant (inputs are standardised, real valued).
    KL(N(mu, sigma^2) || N(0, I)) = -1/2 sum(1 + logvar - mu^2 - exp(logvar)).
    """
    rec = ((x_hat - x) ** 2).sum(dim=1).mean()
    kl = (-0.5 * (1 + logvar - mu.pow(2) - logvar.exp()).sum(dim=1)).mean()
    return rec + kl_weight * kl, rec, kl


class HierarchicalNet(nn.Module):
    """Guest encoders (deterministic, same widths as STFL's) + host MLP, trained jointly."""

    def __init__(self, host_dim: int, guest_dims: list[int], n_classes: int,
                 enc_hidden_mult: float = 2.0, latent_frac: float = 0.5,
                 host_hidden_mult: float = 2.0, layers: int = 1, activation: str = "relu"):
        super().__init__()
        self.guest_nets = nn.ModuleList(
            mlp(d, latent_width(d, latent_frac), enc_hidden_mult, layers, activation)
            for d in guest_dims)
        joint = host_dim + sum(latent_width(d, latent_frac) for d in guest_dims)
        self.host_net = mlp(joint, logit_width(n_classes), host_hidden_mult, layers, activation)

    def forward(self, x_host: torch.Tensor, xs_guest: list[torch.Tensor]) -> torch.Tensor:
        zs = [net(x) for net, x in zip(self.guest_nets, xs_guest)]
        return self.host_net(torch.cat([x_host, *zs], dim=1))
