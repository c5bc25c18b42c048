"""STFL and its plaintext baselines, trained in one process (the numerics the federated roles call).

Self-taught federated learning (Chu & Zhang, arXiv 2102.05883, Algorithm 3):

1. each guest trains a VAE on its unlabeled rows by minimising the negative ELBO, Eq. (5)
   (``train_vae``), then drops the decoder;
2. IDs are aligned (PSI in the federated run); each guest sends the encoder's latent means of the
   shared rows, Eq. (7) (``encode``) — never gradients, never raw features;
3. the host trains its master model on [own features || latents] with its labels, Eq. (6)
   (``train_host``) and predicts with it (``predict_host``).

Baselines of Table I: ``centralized`` (one MLP on all features of the labeled rows) and
``hierarchical`` (STFL's structure trained jointly by backprop, guest parts not self-taught); both
with ``all_data=True`` for the "(all data)" rows, which add the self-taught rows with their labels.
``stfl`` runs steps 1–3 in process.  Each returns accuracy and timings.

Training (paper §V-A): Adam, batch 128, 100 epochs, binary cross-entropy for two classes
(one logit) and cross-entropy for more.  Every function takes the typed training settings
:class:`~fedhet.algorithms.stfl.settings.Model` (the ``[algorithm]`` keys, parsed once; its
defaults are the paper's where it gives them) and the torch ``device`` to train on.

The federated Hierarchical split network's parts are here too: ``guest_net``, ``host_net`` and
the host's ``batch_order``.

Determinism: each fit draws its weights, batch order and VAE noise from its own seed
(``toolkit.frozen_seed(seed, *tags)``) inside ``toolkit.seeded``, so results repeat for a given
seed (on one device) and the caller's global RNG state is untouched.  Loss, decisions and label
checks are ``toolkit.class_loss`` / ``predict_classes`` / ``label_tensor``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.data_fate import Views
from fedhet.algorithms.party_table import check_finite
from fedhet.algorithms.stfl.models import VAE, Encoder, HierarchicalNet, latent_width, vae_loss
from fedhet.algorithms.stfl.settings import Model
from fedhet.algorithms.toolkit import (accuracy, as_tensor, class_loss, epoch_permutation, frozen_seed, label_tensor,
                                       logit_width, mlp, predict_classes, resolve_device, seeded, shuffled_batches,
                                       synchronize)

Device = str | torch.device


# --------------------------------------------------------------------------------------------
# shared machinery


def _train_loop(model: nn.Module, tensors: Sequence[torch.Tensor], step_loss: Callable,
                epochs: int, batch_size: int, lr: float, weight_decay: float,
                on_epoch: Callable | None = None) -> list[float]:
    """Adam over shuffled mini-batches; returns the mean training loss of each epoch."""
    n = tensors[0].shape[0]
    if n == 0:
        raise ValueError("no training rows")
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    device = tensors[0].device
    history = []
    model.train()
    for ep in range(epochs):
        total = torch.zeros((), device=device)
        for idx in shuffled_batches(n, batch_size, device=device):
            loss = step_loss(model, *(t[idx] for t in tensors))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += loss.detach() * len(idx)
        history.append(float(total) / n)
        if on_epoch is not None:
            on_epoch(ep + 1, epochs, history[-1])
    model.eval()
    return history


def _check_2d(name: str, x, n: int | None = None) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, features), got shape {x.shape}")
    if n is not None and x.shape[0] != n:
        raise ValueError(f"{name} has {x.shape[0]} rows, expected {n}")
    check_finite(x, argument=name)  # DataFileError (a ValueError) naming the row and column
    return x


# --------------------------------------------------------------------------------------------
# guest side: self-taught VAE


@dataclass
class VAEFit:
    vae: VAE
    encoder: Encoder
    history: list[float]  # mean negative ELBO per epoch
    seconds: float


def fit_vae(x_unlabeled, c: Model = Model(), seed: int | None = None, device: Device = "cpu",
            on_epoch: Callable | None = None) -> VAEFit:
    """Train a VAE on unlabeled rows (Eq. (5)); ``seed`` defaults to ``c.seed``."""
    x = _check_2d("x_unlabeled", x_unlabeled)
    dev = resolve_device(device)
    t0 = time.perf_counter()
    with seeded(c.seed if seed is None else seed, dev):
        vae = VAE(x.shape[1], c.vae_hidden_mult, c.latent_frac, c.hidden_layers, c.activation).to(dev)
        xt = as_tensor(x, dev)

        def step(model, xb):
            x_hat, mu, logvar = model(xb)
            return vae_loss(x_hat, xb, mu, logvar, c.kl_weight)[0]

        hist = _train_loop(vae, [xt], step, c.vae_epochs, c.batch_size, c.vae_lr,
                           c.weight_decay, on_epoch)
    synchronize(dev)
    return VAEFit(vae, vae.encoder, hist, time.perf_counter() - t0)


def train_vae(x_unlabeled, c: Model = Model(), seed: int | None = None, device: Device = "cpu") -> Encoder:
    """The guest's self-taught step: returns the encoder (the decoder is dropped)."""
    return fit_vae(x_unlabeled, c, seed, device).encoder


@torch.no_grad()
def encode(encoder: Encoder, x, batch_size: int = 8192) -> np.ndarray:
    """Latent means (float32 numpy, rows of ``x``): what a guest sends to the host."""
    x = _check_2d("x", x)
    if x.shape[1] != encoder.in_dim:
        raise ValueError(f"encoder expects {encoder.in_dim} features, got {x.shape[1]}")
    dev = next(encoder.parameters()).device
    encoder.eval()
    out = [encoder.mean(as_tensor(x[s:s + batch_size], dev)).cpu()
           for s in range(0, len(x), batch_size)]
    if not out:
        return np.zeros((0, encoder.latent_dim), dtype=np.float32)
    return torch.cat(out).numpy().astype(np.float32)


@torch.no_grad()
def vae_eval_loss(vae: VAE, x, seed: int = 0) -> dict:
    """Mean negative ELBO, reconstruction and KL of ``vae`` on ``x`` (fixed noise seed)."""
    dev = next(vae.parameters()).device
    vae.eval()
    with seeded(seed, dev):
        xt = as_tensor(_check_2d("x", x), dev)
        x_hat, mu, logvar = vae(xt)
        tot, rec, kl = vae_loss(x_hat, xt, mu, logvar)
        rec_mean = ((vae.decoder(mu) - xt) ** 2).sum(1).mean()
    return {"neg_elbo": float(tot), "recon": float(rec), "kl": float(kl),
            "recon_at_mean": float(rec_mean)}


# --------------------------------------------------------------------------------------------
# host side: master model on [own features || latents]


@dataclass
class HostFit:
    model: nn.Module
    history: list[float]
    seconds: float
    n_classes: int


def _joint(x_host, latents, n: int | None = None) -> np.ndarray:
    x_host = _check_2d("host features", x_host, n)
    parts = [x_host] + [_check_2d(f"latents[{i}]", z, len(x_host)) for i, z in enumerate(latents)]
    return np.concatenate(parts, axis=1).astype(np.float32)


def train_host(x_host, latents: Sequence, y, n_classes: int, c: Model = Model(), seed: int | None = None,
               device: Device = "cpu", on_epoch: Callable | None = None) -> HostFit:
    """Fit the host's MLP on [x_host || z_1 || ... || z_G] with its labels (Eq. (6))."""
    x = _joint(x_host, latents)
    dev = resolve_device(device)
    t0 = time.perf_counter()
    with seeded(c.seed if seed is None else seed, dev):
        model = mlp(x.shape[1], logit_width(n_classes), c.host_hidden_mult, c.hidden_layers,
                    c.activation).to(dev)
        yt = label_tensor(y, n_classes, dev)
        if len(yt) != len(x):
            raise ValueError(f"{len(x)} host rows but {len(yt)} labels")
        hist = _train_loop(model, [as_tensor(x, dev), yt],
                           lambda m, xb, yb: class_loss(m(xb), yb),
                           c.epochs, c.batch_size, c.lr, c.weight_decay, on_epoch)
    synchronize(dev)
    return HostFit(model, hist, time.perf_counter() - t0, n_classes)


@torch.no_grad()
def predict_host(fit: HostFit, x_host, latents: Sequence) -> np.ndarray:
    dev = next(fit.model.parameters()).device
    return predict_classes(fit.model(as_tensor(_joint(x_host, latents), dev)))


# --------------------------------------------------------------------------------------------
# whole methods, in process


def _check_aligned(v: Views) -> None:
    for i, g in enumerate(v.guests):
        if not (np.array_equal(g.ids_train, v.host.ids_train)
                and np.array_equal(g.ids_test, v.host.ids_test)):
            raise ValueError(f"guest {i}'s rows are not aligned with the host's")


def stfl_latents(v: Views, c: Model = Model(), device: Device = "cpu") -> dict:
    """The guests' half of STFL: each guest's self-taught VAE and the latent means of its train and test rows
    (what it sends once), with timings."""
    _check_aligned(v)
    vae_s, enc_s, z_tr, z_te, vae_hist = [], [], [], [], []
    for i, g in enumerate(v.guests):
        fit = fit_vae(g.x_unlabeled, c, seed=frozen_seed(c.seed, "guest", i), device=device)
        vae_s.append(fit.seconds)
        vae_hist.append((fit.history[0], fit.history[-1]))
        t1 = time.perf_counter()
        z_tr.append(encode(fit.encoder, g.x_train))
        z_te.append(encode(fit.encoder, g.x_test))
        enc_s.append(time.perf_counter() - t1)
    return {"z_train": z_tr, "z_test": z_te, "vae_s": vae_s, "encode_s": enc_s, "vae_hist": vae_hist}


def stfl_host(v: Views, z_tr: list[np.ndarray], z_te: list[np.ndarray], c: Model = Model(),
              device: Device = "cpu") -> tuple[float, float]:
    """The host's half: its MLP on its features and the guests' latents; (test accuracy, seconds)."""
    h = v.host
    hf = train_host(h.x_train, z_tr, h.y_train, h.n_classes, c, seed=frozen_seed(c.seed, "host"), device=device)
    return accuracy(predict_host(hf, h.x_test, z_te), h.y_test), hf.seconds


def stfl(v: Views, c: Model = Model(), device: Device = "cpu") -> dict:
    """Self-taught VAEs on the guests, latents to the host, host MLP; test accuracy + timings."""
    t0 = time.perf_counter()
    lat = stfl_latents(v, c, device)
    acc, host_s = stfl_host(v, lat["z_train"], lat["z_test"], c, device)
    return {"method": "stfl", "accuracy": acc, "total_s": time.perf_counter() - t0,
            "vae_s": lat["vae_s"], "encode_s": lat["encode_s"], "host_s": host_s,
            "vae_neg_elbo_first_last": lat["vae_hist"],
            "latent_dims": [int(z.shape[1]) for z in lat["z_train"]],
            "n_selftaught": int(len(v.guests[0].x_unlabeled)) if v.guests else 0,
            "n_train": int(len(v.host.y_train)), "n_test": int(len(v.host.y_test))}


def _train_rows(v: Views, all_data: bool) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    h = v.host
    xh, xg, y = h.x_train, [g.x_train for g in v.guests], h.y_train
    if all_data:
        if h.x_selftaught is None:
            raise ValueError("all_data needs the host's self-taught rows "
                             "(data_fate.host_view(..., with_selftaught=True))")
        for g in v.guests:
            if not np.array_equal(g.ids_unlabeled, h.ids_selftaught):
                raise ValueError("self-taught rows of host and guest are not aligned")
        xh = np.concatenate([xh, h.x_selftaught])
        xg = [np.concatenate([a, g.x_unlabeled]) for a, g in zip(xg, v.guests)]
        y = np.concatenate([y, h.y_selftaught])
    return xh, xg, y


def centralized(v: Views, c: Model = Model(), all_data: bool = False, device: Device = "cpu") -> dict:
    """One MLP on all parties' features (data pooled; no privacy) — Table I's baseline."""
    _check_aligned(v)
    xh, xg, y = _train_rows(v, all_data)
    x = np.concatenate([xh, *xg], axis=1)
    h = v.host
    x_test = np.concatenate([h.x_test, *[g.x_test for g in v.guests]], axis=1)
    dev = resolve_device(device)
    t0 = time.perf_counter()
    with seeded(frozen_seed(c.seed, "centralized"), dev):
        model = mlp(x.shape[1], logit_width(h.n_classes), c.central_hidden_mult, c.hidden_layers,
                    c.activation).to(dev)
        _train_loop(model, [as_tensor(x, dev), label_tensor(y, h.n_classes, dev)],
                    lambda m, xb, yb: class_loss(m(xb), yb),
                    c.epochs, c.batch_size, c.lr, c.weight_decay)
    with torch.no_grad():
        pred = predict_classes(model(as_tensor(x_test, dev)))
    synchronize(dev)
    return {"method": "centralized" + ("_all" if all_data else ""),
            "accuracy": accuracy(pred, h.y_test), "total_s": time.perf_counter() - t0,
            "n_train": int(len(y)), "n_test": int(len(h.y_test))}


def hierarchical(v: Views, c: Model = Model(), all_data: bool = False, device: Device = "cpu") -> dict:
    """STFL's network (guest encoders + host MLP) trained jointly by backprop, in plaintext."""
    _check_aligned(v)
    xh, xg, y = _train_rows(v, all_data)
    h = v.host
    dev = resolve_device(device)
    t0 = time.perf_counter()
    with seeded(frozen_seed(c.seed, "hierarchical"), dev):
        net = HierarchicalNet(xh.shape[1], [a.shape[1] for a in xg], h.n_classes,
                              c.vae_hidden_mult, c.latent_frac, c.host_hidden_mult,
                              c.hidden_layers, c.activation).to(dev)
        tensors = [as_tensor(xh, dev), label_tensor(y, h.n_classes, dev)] + [as_tensor(a, dev) for a in xg]
        _train_loop(net, tensors, lambda m, xb, yb, *gs: class_loss(m(xb, list(gs)), yb),
                    c.epochs, c.batch_size, c.lr, c.weight_decay)
    with torch.no_grad():
        pred = predict_classes(net(as_tensor(h.x_test, dev), [as_tensor(g.x_test, dev) for g in v.guests]))
    synchronize(dev)
    return {"method": "hierarchical" + ("_all" if all_data else ""),
            "accuracy": accuracy(pred, h.y_test), "total_s": time.perf_counter() - t0,
            "n_train": int(len(y)), "n_test": int(len(h.y_test))}


METHODS: dict[str, Callable[[Views, Model, Device], dict]] = {
    "centralized": lambda v, c, device: centralized(v, c, device=device),
    "centralized_all": lambda v, c, device: centralized(v, c, all_data=True, device=device),
    "hierarchical": lambda v, c, device: hierarchical(v, c, device=device),
    "hierarchical_all": lambda v, c, device: hierarchical(v, c, all_data=True, device=device),
    "stfl": stfl,
}
"""Table I's methods by name: ``METHODS[name](views, model settings, device)``."""


# --------------------------------------------------------------------------------------------
# the federated Hierarchical split network's parts


def guest_net(in_dim: int, c: Model, index: int) -> torch.nn.Module:
    """Hierarchical guest encoder (HierarchicalNet's guest part), its own seed."""
    with seeded(frozen_seed(c.seed, "split", "guest", index)):
        return mlp(in_dim, latent_width(in_dim, c.latent_frac), c.vae_hidden_mult, c.hidden_layers, c.activation)


def host_net(joint_dim: int, n_classes: int, c: Model) -> torch.nn.Module:
    """Hierarchical host MLP on [own features || activations], its own seed."""
    with seeded(frozen_seed(c.seed, "split", "host")):
        return mlp(joint_dim, logit_width(n_classes), c.host_hidden_mult, c.hidden_layers, c.activation)


def order_key(seed: int) -> int:
    """The split driver's schedule key of the host's batch order."""
    return frozen_seed(seed, "split", "order")


def batch_order(seed: int, n_train: int, epoch: int) -> np.ndarray:
    """The host's permutation of its training rows in one epoch (the split driver's schedule)."""
    return epoch_permutation(order_key(seed), epoch, n_train)
