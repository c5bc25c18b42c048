"""HyFEM's steps (Zhang, Yin, Hong & Chen, "Hybrid Federated Learning", Algorithm 1), one
function per step, with explicit numpy inputs and outputs so that the federated roles (and the
in-memory sweeps, which run those roles) call the one implementation step by step.

Round t of Algorithm 1 and the functions that compute it:

1. local update at client m, Q steps (``local_update``):
   HyFEM-Avg, Eq. (9):  min  sum_n l(h(theta_m; x_m^n); w_m; y_m^n)
   HyFEM-Prox, Eq. (6): the same + mu ||Pi_m theta_0 - w_m||^2 + sum_{d in D_m} ||theta_{m,d} - theta_{0,d}||^2
   where Pi_m theta_0 and theta_{0,d} are what the client received at the start of the round
   (Algorithm 1 sets w_m^{t,0} = Pi_m theta_0, theta_{m,d}^{t,0} = theta_{0,d}), so the client
   keeps no state between rounds beyond its data;
2. theta_{0,d} = mean of theta_{m,d} over the clients holding view d, Eq. (7), written as a sum
   that secure aggregation can compute: each holder contributes ``extractor_share`` (its weight
   times theta_{m,d}), the sum is formed (``sum_view_shares`` in the clear, secure aggregation in
   the federated run) and the server divides (``view_means``) and stores (``update_extractors``);
3. matched averaging of the inference models, Eq. (8) (``match_inference``, via
   :mod:`.matching`): needs every w_m at the server in the clear;
4. what goes back (``message_for_client``): w_m = Pi_m theta_0 restricted to the client's views,
   and theta_{0,d} for d in D_m.

Server state (``ServerState``): theta_{0,d} for every view, theta_0, Pi_m per client.  Start:
``init_server`` (theta_d^0 and theta_0^0 seeded; Pi_m^0 = the first neurons of theta_0^0, so
every client starts from the same inference weights restricted to its views).  Evaluation:
``evaluate_local`` (a client's model on test rows with only its views) and ``evaluate_global``
(theta_0 with every view).  The centralized baseline is ``local_update`` of one client that
holds every view and every row, fed back its own output each round.

Training choices (``HyFEMConfig``, the steps' own typed view of the training; a federated run
builds it from its parsed settings in one place, ``settings.Settings.config``; paper Sec. 3.1
where it says, else the plainest choice):

=================  ==========  ==============================================================
field              default     meaning
=================  ==========  ==============================================================
method             "avg"       "avg" (Eq. (9)) or "prox" (Eq. (6))
mu                 0.1         weight of ||Pi_m theta_0 - w_m||^2 in Eq. (6) (paper: 0.1, 0.5)
extractor_weight   1.0         weight of sum_d ||theta_{m,d} - theta_{0,d}||^2 (Eq. (6): 1)
loss_reduction     "mean"      data term: batch-mean cross-entropy ("mean"), or that times the
                               client's row count ("sum": an unbiased estimate of Eq. (6)'s
                               sum over its rows, which makes both penalties n_m times weaker)
lr                 0.005       initial learning rate (paper)
lr_decay           0.2         multiplied in every ``decay_every`` rounds (paper)
decay_every        8           (paper)
local_steps        32          Q, mini-batch steps per round (paper)
batch_size         32          (paper)
optimizer          "adam"      "adam" or "sgd" (the paper: "gradient-based local solvers such
                               as SGD"; plain SGD at lr 0.005 barely moves extractors trained
                               from scratch in 32 x 32 steps, so Adam is the default)
momentum           0.0         SGD momentum
passes             None        P of Algorithm 1; None -> 2 M
threshold          1.0         cost of a new global neuron, relative to |a_j|^2 (see matching)
threshold_mode     "relative"  or "absolute"
max_width          None        cap on the global hidden width; None -> 2 x the local width
match_outgoing     True        last hidden layer matched on its outgoing weights too
prune              True        drop global neurons no client maps to
device             "cpu"       "cpu", "cuda", "cuda:N" or "auto" (training and evaluation)
seed               0           init, batch order and matching picks derive from it
=================  ==========  ==============================================================

The data term is by default the mean cross-entropy of the mini-batch (Eq. (6) sums over the
client's rows; the mean keeps the penalties' weights independent of the client's row count, as
FedProx implementations do); ``loss_reduction="sum"`` follows Eq. (6) literally.
The optimizer starts fresh each round.  Batches are drawn from a generator seeded by
(seed, client, round), so a round repeats exactly given its inputs (on one device).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from torch.nn import functional as F

from fedhet.algorithms.dp_sgd import DPStep, module_clipped_grads, poisson_batch
from fedhet.algorithms.hyfem.matching import Assignment, MatchResult, MatchSettings, matched_averaging, project
from fedhet.algorithms.hyfem.models import (HyFEMModelSpec, InferenceMLP, Layers, extractor_from_flat, get_flat,
                                            get_layers, init_extractor, init_inference)
from fedhet.algorithms.toolkit import frozen_seed, resolve_device


# ------------------------------------------------------------------------------ settings

@dataclass(frozen=True)
class HyFEMConfig:
    method: str = "avg"
    mu: float = 0.1
    extractor_weight: float = 1.0
    loss_reduction: str = "mean"
    lr: float = 0.005
    lr_decay: float = 0.2
    decay_every: int = 8
    local_steps: int = 32
    batch_size: int = 32
    optimizer: str = "adam"
    momentum: float = 0.0
    passes: int | None = None
    threshold: float = 1.0
    threshold_mode: str = "relative"
    max_width: int | None = None
    match_outgoing: bool = True
    prune: bool = True
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in ("avg", "prox"):
            raise ValueError(f"HyFEM method must be 'avg' or 'prox', got {self.method!r}")
        if self.loss_reduction not in ("mean", "sum"):
            raise ValueError(f"HyFEM loss_reduction must be 'mean' or 'sum', "
                             f"got {self.loss_reduction!r}")
        if self.optimizer not in ("adam", "sgd"):
            raise ValueError(f"HyFEM optimizer must be 'adam' or 'sgd', got {self.optimizer!r}")
        for name in ("decay_every", "local_steps", "batch_size", "seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise ValueError(f"HyFEM {name} must be an integer, got {v!r}")
        for name in ("decay_every", "local_steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"HyFEM {name} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0 or not 0 < self.lr_decay <= 1:
            raise ValueError(f"HyFEM needs lr > 0 and 0 < lr_decay <= 1, got {self.lr}, {self.lr_decay}")
        for name in ("mu", "extractor_weight", "momentum"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"HyFEM {name} must be >= 0, got {getattr(self, name)!r}")
        self.match_settings(1)   # validates the matching fields

    def match_settings(self, local_width: int) -> MatchSettings:
        cap = self.max_width if self.max_width is not None else 2 * int(local_width)
        return MatchSettings(passes=self.passes, threshold=self.threshold,
                             threshold_mode=self.threshold_mode, max_width=cap,
                             match_outgoing=self.match_outgoing, prune=self.prune)


def learning_rate(cfg: HyFEMConfig, round_index: int) -> float:
    """lr x lr_decay^(floor(round / decay_every)) (paper: 0.005, x0.2 every 8 rounds)."""
    if round_index < 0:
        raise ValueError(f"round_index must be >= 0, got {round_index}")
    return float(cfg.lr) * float(cfg.lr_decay) ** (int(round_index) // int(cfg.decay_every))


# ------------------------------------------------------------------------------ client side

@dataclass
class ClientModels:
    """A client's models (or what the server sends it): theta_{m,d} per view it holds (flat
    float32) and w_m (layers; first layer over its views' embedding columns, in view order)."""

    views: tuple[int, ...]
    extractors: dict[int, np.ndarray]
    inference: Layers


@dataclass
class ClientData:
    """A client's rows: ``x[d]`` for each view it holds (numpy, or tensors already on the
    device), all with the same rows in the same order, and their labels ``y`` (0..C-1)."""

    x: dict[int, Any]
    y: Any

    @property
    def n(self) -> int:
        return int(len(self.y))


def _check_models(models: ClientModels, spec: HyFEMModelSpec, who: str) -> tuple[int, ...]:
    views = spec.check_views(models.views)
    if set(models.extractors) != set(views):
        raise ValueError(f"{who}: extractors for views {sorted(models.extractors)}, "
                         f"holds views {list(views)}")
    in_w = spec.inference_widths(views)[0]
    if np.shape(models.inference[0][0])[1] != in_w:
        raise ValueError(f"{who}: inference model takes {np.shape(models.inference[0][0])[1]} "
                         f"inputs; views {list(views)} give {in_w}")
    if np.shape(models.inference[-1][0])[0] != spec.n_classes:
        raise ValueError(f"{who}: inference model has {np.shape(models.inference[-1][0])[0]} "
                         f"outputs for {spec.n_classes} classes")
    return views


def _tensor(a, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(a, torch.Tensor):
        return a.to(device=device, dtype=dtype)
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype).to(device)


def _data_tensors(data: ClientData, views: Sequence[int], spec: HyFEMModelSpec,
                  device: torch.device, who: str) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    missing = [d for d in views if d not in data.x]
    if missing:
        raise ValueError(f"{who}: no rows for view(s) {missing}")
    y = _tensor(data.y, device, torch.long).reshape(-1)
    xs = {}
    for d in views:
        x = _tensor(data.x[d], device, torch.float32)
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{who}: view {d} has {x.shape[0]} rows, labels have {y.shape[0]}")
        if x.shape[0] and x[0].numel() != spec.extractors[d].in_dim:
            raise ValueError(f"{who}: view {d} rows have {x[0].numel()} values, the extractor "
                             f"takes {spec.extractors[d].in_dim}")
        xs[d] = x
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= spec.n_classes):
        raise ValueError(f"{who}: labels must be in 0..{spec.n_classes - 1}")
    return xs, y


def _optimizer(params, cfg: HyFEMConfig, lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum)
    return torch.optim.Adam(params, lr=lr)


class _Joint(torch.nn.Module):
    """The client's whole network (its views' extractors, then the inference MLP) as one module of the
    views' inputs flattened side by side: what DP-SGD's per-sample gradients are taken of."""

    def __init__(self, extractors: Mapping[int, torch.nn.Module], model: torch.nn.Module, views: Sequence[int],
                 shapes: Mapping[int, tuple[int, ...]]):
        super().__init__()
        self.ext = torch.nn.ModuleDict({str(d): extractors[d] for d in views})
        self.model = model
        self.views, self.shapes = list(views), {d: tuple(shapes[d]) for d in views}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts, at = [], 0
        for d in self.views:
            w = math.prod(self.shapes[d])
            parts.append(self.ext[str(d)](x[:, at:at + w].reshape(-1, *self.shapes[d])))
            at += w
        return self.model(torch.cat(parts, dim=1))


def local_update(received: ClientModels, data: ClientData, spec: HyFEMModelSpec,
                 cfg: HyFEMConfig, round_index: int, client_id: int = 0,
                 dp: tuple[DPStep, torch.Generator] | None = None) -> tuple[ClientModels, dict]:
    """Q local steps of Eq. (9) (method "avg") or Eq. (6) (method "prox") from ``received``
    (Pi_m theta_0 and theta_{0,d}, which are also the Prox anchors).  Returns the trained models
    (numpy, CPU) and {"loss": mean cross-entropy over the steps, "objective": mean penalised
    loss, "lr", "steps", "n_train"}.

    ``dp`` (a :class:`~fedhet.algorithms.dp_sgd.DPStep` and the private noise generator): every step is
    DP-SGD (record level; everything the client sends comes out of these steps): a Poisson-sampled batch
    (rate ``sampling_rate``), per-sample gradients of the data term clipped jointly over the extractors and
    the inference MLP, Gaussian noise, divided by the expected batch (times n for ``loss_reduction =
    "sum"``); the Prox penalty's gradient (no data) is added after the noise."""
    if dp is not None:
        return _local_update_dp(received, data, spec, cfg, round_index, client_id, dp)
    who, views, dev, xs, y = _prepare_update(received, data, spec, cfg, client_id)
    extractors = {d: extractor_from_flat(spec.extractors[d], received.extractors[d], dev)
                  for d in views}
    model = InferenceMLP.from_layers(received.inference, dev)
    ext_params = [p for d in views for p in extractors[d].parameters()]
    inf_params = list(model.parameters())
    prox = cfg.method == "prox"
    if prox:
        ext_anchor = [p.detach().clone() for p in ext_params]
        inf_anchor = [p.detach().clone() for p in inf_params]
    lr = learning_rate(cfg, round_index)
    opt = _optimizer(ext_params + inf_params, cfg, lr)
    gen = torch.Generator().manual_seed(frozen_seed(cfg.seed, "batches", int(client_id),
                                                    int(round_index)))
    n, bs = data.n, min(cfg.batch_size, data.n)
    perm, pos = torch.randperm(n, generator=gen), 0
    ce_sum = torch.zeros((), device=dev)
    obj_sum = torch.zeros((), device=dev)
    for _ in range(cfg.local_steps):
        if pos + bs > n:   # a fresh pass over the rows; no batch spans two passes
            perm, pos = torch.randperm(n, generator=gen), 0
        idx = perm[pos:pos + bs].to(dev)
        pos += bs
        emb = torch.cat([extractors[d](xs[d][idx]) for d in views], dim=1)
        ce = F.cross_entropy(model(emb), y[idx])
        loss = ce * n if cfg.loss_reduction == "sum" else ce
        if prox:
            loss = loss + cfg.mu * sum(((p - a) ** 2).sum() for p, a in zip(inf_params, inf_anchor))
            loss = loss + cfg.extractor_weight * sum(((p - a) ** 2).sum()
                                                     for p, a in zip(ext_params, ext_anchor))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        ce_sum += ce.detach()
        obj_sum += loss.detach()
    out = ClientModels(views, {d: get_flat(extractors[d]) for d in views}, get_layers(model))
    q = cfg.local_steps
    return out, {"loss": float(ce_sum) / q, "objective": float(obj_sum) / q, "lr": lr,
                 "steps": q, "n_train": n}


def extractor_share(models: ClientModels, view: int, weight: float = 1.0) -> np.ndarray:
    """What client m puts into view d's aggregation (Eq. (7)): weight x theta_{m,d} (float64).
    Eq. (7) is the plain mean, weight 1; a row-count weight gives the weighted mean."""
    if int(view) not in models.extractors:
        raise ValueError(f"the client does not hold view {view} (it holds {list(models.views)})")
    if not weight > 0:
        raise ValueError(f"aggregation weight must be > 0, got {weight!r}")
    return float(weight) * np.asarray(models.extractors[int(view)], dtype=np.float64)


# ------------------------------------------------------------------------------ server side

@dataclass
class ServerState:
    """theta_{0,d} for every view, theta_0, and Pi_m (one int array per hidden layer) and D_m
    for every client."""

    extractors: dict[int, np.ndarray]
    inference: Layers
    assignments: dict[int, Assignment]
    client_views: dict[int, tuple[int, ...]]
    history: list[dict] = field(default_factory=list)   # one entry per matching step


def init_server(spec: HyFEMModelSpec, client_views: Mapping[int, Sequence[int]],
                cfg: HyFEMConfig) -> ServerState:
    """theta_d^0, theta_0^0 (seeded) and Pi_m^0 = the first neurons of theta_0^0 for each client
    (every inference model starts at theta_0^0's hidden width)."""
    if len(client_views) < 1:
        raise ValueError("HyFEM needs at least one client")
    views = {int(m): spec.check_views(v) for m, v in client_views.items()}
    held = set().union(*map(set, views.values()))
    orphan = [d for d in range(spec.n_views) if d not in held]
    if orphan:
        raise ValueError(f"view(s) {orphan} are held by no client")
    all_views = tuple(range(spec.n_views))
    ext = {d: init_extractor(spec.extractors[d], frozen_seed(cfg.seed, "extractor", d))
           for d in all_views}
    inference = init_inference(spec.inference_widths(all_views), frozen_seed(cfg.seed, "inference"))
    assignments = {m: [np.arange(int(h), dtype=np.int64) for h in spec.hidden] for m in views}
    return ServerState(ext, inference, assignments, views)


def message_for_client(state: ServerState, spec: HyFEMModelSpec, client_id: int) -> ClientModels:
    """Algorithm 1's last line for client m: w_m = Pi_m theta_0 (restricted to its views'
    columns) and theta_{m,d} = theta_{0,d} for d in D_m."""
    m = int(client_id)
    if m not in state.client_views:
        raise ValueError(f"unknown client {client_id}; known: {sorted(state.client_views)}")
    views = state.client_views[m]
    w = project(state.inference, state.assignments[m], spec.input_columns(views))
    return ClientModels(views,
                        {d: np.asarray(state.extractors[d], dtype=np.float32).copy() for d in views},
                        [(W.astype(np.float32), b.astype(np.float32)) for W, b in w])


def view_holders(state: ServerState, view: int) -> list[int]:
    """The clients that hold view d (the parties of view d's secure aggregation)."""
    return sorted(m for m, v in state.client_views.items() if int(view) in v)


def sum_view_shares(updates: Mapping[int, ClientModels],
                    weights: Mapping[int, float] | None = None
                    ) -> tuple[dict[int, np.ndarray], dict[int, float]]:
    """Plain aggregation of Eq. (7)'s numerators: per view, the sum of the holders'
    ``extractor_share`` and the sum of their weights.  Secure aggregation computes the same sums
    without showing the server any single share."""
    sums: dict[int, np.ndarray] = {}
    totals: dict[int, float] = {}
    for m in sorted(updates):
        w = 1.0 if weights is None else float(weights[m])
        for d in updates[m].views:
            s = extractor_share(updates[m], d, w)
            sums[d] = s if d not in sums else sums[d] + s
            totals[d] = totals.get(d, 0.0) + w
    return sums, totals


def view_means(sums: Mapping[int, np.ndarray], totals: Mapping[int, float]) -> dict[int, np.ndarray]:
    """theta_{0,d} = sum / total weight (Eq. (7)), float32."""
    out = {}
    for d, s in sums.items():
        t = float(totals[d])
        if not t > 0:
            raise ValueError(f"view {d}: total aggregation weight must be > 0, got {t}")
        out[int(d)] = (np.asarray(s, dtype=np.float64) / t).astype(np.float32)
    return out


def update_extractors(state: ServerState, means: Mapping[int, np.ndarray]) -> ServerState:
    """A new state with theta_{0,d} replaced for the views in ``means`` (the others unchanged)."""
    ext = dict(state.extractors)
    for d, v in means.items():
        d = int(d)
        if d not in ext:
            raise ValueError(f"unknown view {d}")
        v = np.asarray(v, dtype=np.float32)
        if v.shape != ext[d].shape:
            raise ValueError(f"view {d}: mean extractor has shape {v.shape}, expected {ext[d].shape}")
        ext[d] = v.copy()
    return dataclasses.replace(state, extractors=ext)


def match_inference(state: ServerState, spec: HyFEMModelSpec, client_inference: Mapping[int, Layers],
                    cfg: HyFEMConfig, round_index: int) -> tuple[ServerState, MatchResult]:
    """Eq. (8): P passes of Hungarian matching + matched averaging of every client's w_m against
    theta_0, starting from the current Pi_m.  Every client must send its model."""
    ids = sorted(state.client_views)
    missing = [m for m in ids if m not in client_inference]
    extra = [m for m in client_inference if m not in state.client_views]
    if missing or extra:
        raise ValueError(f"matching needs exactly the clients {ids}; missing {missing}, "
                         f"unknown {sorted(extra)}")
    cols = [spec.input_columns(state.client_views[m]) for m in ids]
    for m, c in zip(ids, cols):
        w = np.shape(client_inference[m][0][0])[1]
        if w != len(c):
            raise ValueError(f"client {m}: inference model takes {w} inputs, its views give {len(c)}")
    res = matched_averaging(state.inference, [client_inference[m] for m in ids], cols,
                            assignments=[state.assignments[m] for m in ids],
                            settings=cfg.match_settings(max(spec.hidden)),
                            seed=frozen_seed(cfg.seed, "matching", int(round_index)))
    new_inf = [(W.astype(np.float32), b.astype(np.float32)) for W, b in res.layers]
    assigns = {m: a for m, a in zip(ids, res.assignments)}
    entry = {"round": int(round_index), "picked": [ids[i] for i in res.picked], "cost": res.cost,
             "grown": res.grown, "pruned": res.pruned,
             "global_widths": [int(W.shape[0]) for W, _ in new_inf[:-1]]}
    return dataclasses.replace(state, inference=new_inf, assignments=assigns,
                               history=[*state.history, entry]), res


# ------------------------------------------------------------------------------ evaluation

@torch.no_grad()
def predict_logits(extractors: Mapping[int, np.ndarray], inference: Layers, views: Sequence[int],
                   spec: HyFEMModelSpec, x: Mapping[int, Any], device: str = "cpu",
                   batch_size: int = 2048) -> torch.Tensor:
    """Logits (CPU) of the model made of ``extractors`` for ``views`` and ``inference``."""
    v = spec.check_views(views)
    dev = resolve_device(device)
    nets = {d: extractor_from_flat(spec.extractors[d], extractors[d], dev).eval() for d in v}
    model = InferenceMLP.from_layers(inference, dev).eval()
    n = len(x[v[0]])
    outs = []
    for s in range(0, n, batch_size):
        emb = torch.cat([nets[d](_tensor(x[d][s:s + batch_size], dev, torch.float32)) for d in v],
                        dim=1)
        outs.append(model(emb).cpu())
    return torch.cat(outs) if outs else torch.zeros((0, spec.n_classes))


def _metrics(logits: torch.Tensor, y) -> dict:
    yt = _tensor(y, torch.device("cpu"), torch.long).reshape(-1)
    if yt.numel() != logits.shape[0]:
        raise ValueError(f"{yt.numel()} labels for {logits.shape[0]} rows")
    if yt.numel() == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "n": 0}
    return {"accuracy": float((logits.argmax(1) == yt).float().mean()),
            "loss": float(F.cross_entropy(logits, yt)), "n": int(yt.numel())}


def evaluate_local(models: ClientModels, spec: HyFEMModelSpec, x_test: Mapping[int, object], y_test,
                   device: str = "cpu") -> dict:
    """A client's model on test rows using only its views (paper Sec. 3.1 "local accuracy");
    ``x_test`` may hold every view, only the client's are read.  {"accuracy", "loss", "n"}."""
    views = _check_models(models, spec, "local model")
    return _metrics(predict_logits(models.extractors, models.inference, views, spec, x_test, device),
                    y_test)


def evaluate_global(state: ServerState, spec: HyFEMModelSpec, x_test: Mapping[int, object], y_test,
                    device: str = "cpu") -> dict:
    """theta_0 with every theta_{0,d} on test rows with every view ("global accuracy")."""
    return _metrics(predict_logits(state.extractors, state.inference, tuple(range(spec.n_views)),
                                   spec, x_test, device), y_test)


def average_metrics(results: Sequence[dict]) -> dict:
    """Mean accuracy and loss over clients (the paper's averaged local accuracy)."""
    if not results:
        raise ValueError("no results to average")
    return {"accuracy": float(np.mean([r["accuracy"] for r in results])),
            "loss": float(np.mean([r["loss"] for r in results])), "n_clients": len(results)}


def _prepare_update(received: ClientModels, data: ClientData, spec: HyFEMModelSpec, cfg: HyFEMConfig,
                    client_id: int) -> tuple:
    """A local update's checked inputs: (who, views, device, view tensors, labels)."""
    who = f"client {client_id}"
    views = _check_models(received, spec, who)
    if data.n < 1:
        raise ValueError(f"{who}: no training rows")
    dev = resolve_device(cfg.device)
    xs, y = _data_tensors(data, views, spec, dev, who)
    return who, views, dev, xs, y


def _local_update_dp(received: ClientModels, data: ClientData, spec: HyFEMModelSpec, cfg: HyFEMConfig,
                     round_index: int, client_id: int, dp: tuple[DPStep, torch.Generator]) -> tuple[ClientModels, dict]:
    step, gen = dp
    who, views, dev, xs, y = _prepare_update(received, data, spec, cfg, client_id)
    extractors = {d: extractor_from_flat(spec.extractors[d], received.extractors[d], dev) for d in views}
    inference = InferenceMLP.from_layers(received.inference, dev)
    joint = _Joint(extractors, inference, views,
                   {d: tuple(xs[d].shape[1:]) for d in views})
    x = torch.cat([xs[d].reshape(len(y), -1) for d in views], dim=1)
    params = list(joint.parameters())
    anchor = {k: p.detach().clone() for k, p in joint.named_parameters()} if cfg.method == "prox" else None
    lr = learning_rate(cfg, round_index)
    opt = _optimizer(params, cfg, lr)
    n = data.n
    scale = n if cfg.loss_reduction == "sum" else 1.0
    ce_sum = 0.0
    for _ in range(cfg.local_steps):
        idx = poisson_batch(n, step.sampling_rate, gen).to(dev)
        g = module_clipped_grads(joint, F.cross_entropy, x[idx], y[idx], step.clip)
        opt.zero_grad(set_to_none=True)
        for k, p in joint.named_parameters():
            noise = torch.normal(0.0, step.noise_multiplier * step.clip, size=p.shape, generator=gen).to(p)
            grad = (g[k] + noise) / (step.sampling_rate * n) * scale
            if anchor is not None:   # the Prox penalties' gradients (data-independent)
                w = cfg.extractor_weight if k.startswith("ext.") else cfg.mu
                grad = grad + 2 * w * (p.detach() - anchor[k])
            p.grad = grad
        opt.step()
        if len(idx):
            with torch.no_grad():
                ce_sum += float(F.cross_entropy(joint(x[idx]), y[idx]))
    out = ClientModels(views, {d: get_flat(extractors[d]) for d in views}, get_layers(inference))
    q = cfg.local_steps
    return out, {"loss": ce_sum / q, "objective": ce_sum / q, "lr": lr, "steps": q, "n_train": n}
