"""F³ training loops (f3.txt, Algorithm 1), independent of where the first layer is computed.

Algorithm 1, lines 1-4 (each owner, alone)  -> :func:`train_local`: Eq. (3), LSTM -> h^i -> linear softmax,
                                               Adam, mini-batches, early stopping on the owner's validation loss;
                                               :func:`represent`: the frozen model's h_k^i for every sample
Algorithm 1, lines 5-7 (global model)       -> :func:`train_global`: Eq. (8) by Adam on the coordinator's
                                               parameters (P_i, W_0, W_1, θ), early stopping on validation loss
Algorithm 1, lines 8-10 (inference)         -> :func:`predict`
Metrics (Tables 2, 3)                       -> :func:`scores`: macro F1 and AUC
One owner's lines 1-4 from its settings      -> :func:`pretrain_owner` (the owner role's local stage)

The global loops take a ``first_layer_for(rows)`` callable: for a batch of sample positions it returns
``A -> Â H W_0`` (see :meth:`~fedhet.algorithms.f3.models.GlobalGCN.fuse`).  :func:`plain_first_layer`
computes it from representations held in the clear (the paper's base setting, "trusted" fusion); the
federated coordinator passes one that asks the share holders (:class:`fedhet.algorithms.f3.core.SharedFirstLayer`).  The loops,
seeds and batches are the same, so the two fusion modes differ only by the fixed-point error of the shares.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch

from fedhet.algorithms.f3.models import GlobalGCN, LocalLSTM
from fedhet.algorithms.f3.settings import Settings, n_rows, owner_seed, owner_widths
from fedhet.algorithms.toolkit import as_tensor, resolve_device, seeded

__all__ = ["EarlyStop", "LocalConfig", "GlobalConfig", "train_local", "represent", "local_probabilities", "build_global",
           "plain_first_layer", "train_global", "predict", "scores", "nll", "entropy", "LocalStage", "pretrain_owner"]


@dataclass(frozen=True)
class LocalConfig:
    hidden: int = 16          # d_i: width of h^i
    epochs: int = 200
    patience: int = 20        # early stopping on validation loss
    lr: float = 1e-3
    batch: int = 100
    seed: int = 0
    device: str = "cpu"


@dataclass(frozen=True)
class GlobalConfig:
    d: int = 16               # width of the aligned representations P_i h^i
    hidden: int = 16          # width of W_0's output
    align: str = "soft"
    graph: str = "icdf"
    tau: float = 0.1
    test_samples: int = 10
    epochs: int = 100
    patience: int = 20
    lr: float = 1e-2
    batch: int = 100
    seed: int = 0
    device: str = "cpu"


def nll(probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of class probabilities (the global model outputs probabilities)."""
    return -torch.log(probs.gather(1, y[:, None]).squeeze(1).clamp_min(1e-12)).mean()


def entropy(probs: np.ndarray) -> np.ndarray:
    """Entropy (nats) of each row of class probabilities (Fig. 3)."""
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-12, 1.0)
    return -(p * np.log(p)).sum(1)


def batches(n: int, batch: int, gen: torch.Generator | None) -> list[np.ndarray]:
    order = torch.randperm(n, generator=gen).numpy() if gen is not None else np.arange(n)
    return [order[i:i + batch] for i in range(0, n, batch)]


class EarlyStop:
    """Keep the state of the best validation loss; ``step`` says stop after ``patience`` epochs without one."""

    def __init__(self, model: torch.nn.Module, patience: int):
        self.model, self.patience = model, patience
        self.best, self.since = float("inf"), 0
        self.state = copy.deepcopy(model.state_dict())

    def step(self, val: float) -> bool:
        if val < self.best - 1e-6:
            self.best, self.state, self.since = val, copy.deepcopy(self.model.state_dict()), 0
            return False
        self.since += 1
        return self.since >= self.patience

    def restore(self) -> None:
        self.model.load_state_dict(self.state)


# ------------------------------------------------------------------------------ local (Eq. (3))
def train_local(x: np.ndarray, lengths: np.ndarray | None, y: np.ndarray, x_val: np.ndarray,
                lengths_val: np.ndarray | None, y_val: np.ndarray, n_classes: int, cfg: LocalConfig,
                progress: Callable[[int, float], None] | None = None) -> tuple[LocalLSTM, dict]:
    """Eq. (3): one owner's LSTM + softmax head on its own series (batch, T, 1); best validation state kept."""
    dev = resolve_device(cfg.device)
    with seeded(cfg.seed, dev):
        model = LocalLSTM(n_classes, hidden=cfg.hidden, in_dim=x.shape[-1]).to(dev)
        gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    xt, yt = as_tensor(x, dev), torch.as_tensor(y, dtype=torch.long, device=dev)
    xv, yv = as_tensor(x_val, dev), torch.as_tensor(y_val, dtype=torch.long, device=dev)
    lt = None if lengths is None else np.asarray(lengths)
    lv = None if lengths_val is None else np.asarray(lengths_val)
    stopper, epochs = EarlyStop(model, cfg.patience), 0
    for ep in range(cfg.epochs):
        model.train()
        for b in batches(len(y), cfg.batch, gen):
            opt.zero_grad()
            logits = model(xt[b], None if lt is None else lt[b])
            torch.nn.functional.cross_entropy(logits, yt[b]).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val = float(torch.nn.functional.cross_entropy(model(xv, lv), yv))
        epochs = ep + 1
        if progress:
            progress(epochs, val)
        if stopper.step(val):
            break
    stopper.restore()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)          # frozen (Algorithm 1, line 4)
    return model, {"epochs": epochs, "val_loss": stopper.best}


@torch.no_grad()
def represent(model: LocalLSTM, x: np.ndarray, lengths: np.ndarray | None, device: str = "cpu",
              batch: int = 4096) -> np.ndarray:
    """h_k^i for every sample (float64, (n, d_i)); the LSTM's last hidden state, so |h| < 1."""
    dev = resolve_device(device)
    out = []
    for i in range(0, len(x), batch):
        lb = None if lengths is None else np.asarray(lengths)[i:i + batch]
        out.append(model.represent(as_tensor(x[i:i + batch], dev), lb).double().cpu().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.head.in_features))


@torch.no_grad()
def local_probabilities(model: LocalLSTM, x: np.ndarray, lengths: np.ndarray | None, device: str = "cpu") -> np.ndarray:
    """The local model's class probabilities (baselines B-D, Fig. 3)."""
    dev = resolve_device(device)
    return torch.softmax(model(as_tensor(x, dev), lengths), -1).double().cpu().numpy()


# ----------------------------------------------------------------------------- global (Eq. (8))
def build_global(n: int, dims: list[int], n_classes: int, cfg: GlobalConfig, given=None) -> GlobalGCN:
    dev = resolve_device(cfg.device)
    with seeded(cfg.seed, dev):
        return GlobalGCN(n, dims, cfg.d, cfg.hidden, n_classes, align=cfg.align, graph=cfg.graph, given=given,
                         tau=cfg.tau, test_samples=cfg.test_samples).to(dev)


FirstLayerFor = Callable[[np.ndarray], Callable[[torch.Tensor], torch.Tensor]]


def plain_first_layer(model: GlobalGCN, reps: list[np.ndarray]) -> FirstLayerFor:
    """``rows -> (A -> Â H W_0)`` from representations in the clear (trusted fusion, baselines)."""
    dev = next(model.parameters()).device
    hs = [as_tensor(h, dev) for h in reps]

    def for_rows(rows: np.ndarray):
        idx = torch.as_tensor(rows, dtype=torch.long, device=dev)
        H = model.stack([h[idx] for h in hs])
        return lambda A: A @ model.W0(H)
    return for_rows


def predict(model: GlobalGCN, first_layer_for: FirstLayerFor, positions: np.ndarray, batch: int) -> np.ndarray:
    """Class probabilities (float64) of the samples at ``positions`` (Algorithm 1, lines 8-10)."""
    model.eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(positions), batch):
            rows = positions[i:i + batch]
            out.append(model.fuse(first_layer_for(rows), len(rows)).double().cpu().numpy())
    return np.concatenate(out)


def train_global(model: GlobalGCN, first_layer_for: FirstLayerFor, y: np.ndarray, train_pos: np.ndarray,
                 val_pos: np.ndarray, cfg: GlobalConfig,
                 progress: Callable[[int, dict], None] | None = None,
                 resume: Mapping[str, Any] | None = None,
                 end_epoch: Callable[[int, bool, dict], None] | None = None) -> list[dict]:
    """Eq. (8) trained by Adam with NLL; ``y`` indexed by position; the best-validation state is kept.

    Batches come from a generator seeded with ``cfg.seed`` and the ICDF graphs from the model's own
    generator (seed + 1), so two runs whose first layers agree draw the same batches and graphs.

    ``end_epoch(epoch, last, state)`` is called at the end of every epoch (``last``: training stops
    there): ``state`` is everything the loop needs to go on as if never stopped (model, optimizer, both
    generators, early stopping, history); given back as ``resume``, training goes on after that epoch
    exactly as the uninterrupted loop would.
    """
    dev = next(model.parameters()).device
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long, device=dev)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    stopper, history = EarlyStop(model, cfg.patience), []
    model.generator = torch.Generator(dev).manual_seed(cfg.seed + 1)
    stopped = False
    if resume:
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["optimizer"])
        gen.set_state(resume["batches"])
        model.generator.set_state(resume["graphs"])
        stopper.best, stopper.since, stopper.state = resume["best"], resume["since"], resume["best_state"]
        history, stopped = list(resume["history"]), resume["stopped"]
    for ep in range(len(history), 0 if stopped else cfg.epochs):
        t0 = time.perf_counter()
        model.train()
        total, count = 0.0, 0
        for b in batches(len(train_pos), cfg.batch, gen):
            rows = train_pos[b]
            opt.zero_grad()
            probs = model.fuse(first_layer_for(rows), len(rows))
            loss = nll(probs, yt[torch.as_tensor(rows, device=dev)])
            loss.backward()
            opt.step()
            total, count = total + float(loss.detach()) * len(rows), count + len(rows)
        train_s = time.perf_counter() - t0
        pv = predict(model, first_layer_for, val_pos, cfg.batch)
        val = float(nll(torch.as_tensor(pv), torch.as_tensor(np.asarray(y)[val_pos], dtype=torch.long)))
        rec = {"epoch": ep + 1, "train_loss": total / max(count, 1), "val_loss": val,
               "val_f1": scores(pv, np.asarray(y)[val_pos], pv.shape[1])["f1"], "train_s": train_s,
               "epoch_s": time.perf_counter() - t0}
        history.append(rec)
        if progress:
            progress(ep + 1, rec)
        stopped = stopper.step(val)
        if end_epoch:
            end_epoch(ep + 1, stopped or ep + 1 == cfg.epochs,
                      {"model": model.state_dict(), "optimizer": opt.state_dict(), "batches": gen.get_state(),
                       "graphs": model.generator.get_state(), "best": stopper.best, "since": stopper.since,
                       "best_state": stopper.state, "history": history, "stopped": stopped})
        if stopped:
            break
    stopper.restore()
    return history


def scores(probs: np.ndarray, y: np.ndarray, n_classes: int) -> dict:
    """Macro F1, AUC (binary: of class 1; multi-class: one-vs-rest macro) and accuracy."""
    from sklearn.metrics import f1_score, roc_auc_score
    y = np.asarray(y)
    pred = np.asarray(probs).argmax(1)
    out = {"f1": float(f1_score(y, pred, average="macro", labels=list(range(n_classes)), zero_division=0)),
           "accuracy": float((pred == y).mean()) if len(y) else float("nan")}
    try:
        if n_classes == 2:
            out["auc"] = float(roc_auc_score(y, probs[:, 1]))
        else:
            p = np.clip(probs, 1e-12, None)
            out["auc"] = float(roc_auc_score(y, p / p.sum(1, keepdims=True), multi_class="ovr",
                                             labels=list(range(n_classes))))
    except ValueError:            # one class only in y
        out["auc"] = float("nan")
    return out


# ------------------------------------------------------------ one owner's Algorithm 1, lines 1-4
@dataclass
class LocalStage:
    """One owner's Algorithm 1 lines 1-4: its frozen model's representations of every sample and more."""
    reps: np.ndarray           # (n_rows, d_i): train, validation, test rows in that order
    y: np.ndarray              # the owner's labels of the same rows
    test_probabilities: np.ndarray
    info: dict
    seconds: float
    model: LocalLSTM | None = None   # the frozen local model itself (what the owner's part exports)


def pretrain_owner(s: Settings, data: dict, index: int, n_owners: int, device: str = "cpu",
                   progress: Callable[[int, float], None] | None = None) -> LocalStage:
    """Eq. (3) on owner ``index``'s own series (``load_data``'s output), alone, then h_k^i for every sample."""
    width = owner_widths(s, n_owners)[index]
    sp = data["splits"]
    (x, ln, y), (xv, lv, yv), (xt, lt, yt) = sp["train"], sp["val"], sp["test"]
    cfg = LocalConfig(hidden=width, epochs=s.local_epochs, patience=s.local_patience, lr=s.local_lr,
                      batch=s.local_batch, seed=owner_seed(s.seed, index), device=device)
    t0 = time.perf_counter()
    model, info = train_local(x, ln, y, xv, lv, yv, data["n_classes"], cfg, progress=progress)
    reps = np.concatenate([represent(model, a, b, device) for a, b in ((x, ln), (xv, lv), (xt, lt))])
    pt = local_probabilities(model, xt, lt, device)
    return LocalStage(reps, np.concatenate([y, yv, yt]).astype(np.int64), pt, {**info, "width": width},
                      time.perf_counter() - t0, model)


def class_count(s: Settings, y: np.ndarray) -> int:
    """Vowels: its 9 speakers (more if the labels say so); the traffic data sets: an incident or none."""
    return max(int(y.max()) + 1, 9) if s.dataset == "vowels" else 2


def global_config(s: Settings, device: str) -> GlobalConfig:
    return GlobalConfig(d=s.d, hidden=s.hidden, align=s.align, graph=s.graph, tau=s.tau, test_samples=s.test_samples,
                        epochs=s.epochs, patience=s.patience, lr=s.lr, batch=s.batch, seed=s.seed, device=device)


def sample_positions(s: Settings) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The training, validation and test samples' positions in the shared arrays (in that order)."""
    tr, va, te = n_rows(s)
    pos = np.arange(tr + va + te)
    return pos[:tr], pos[tr:tr + va], pos[tr + va:]
