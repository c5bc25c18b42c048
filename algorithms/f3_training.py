"""F³ training loops (f3.txt, Algorithm 1), independent of where the first layer is computed.

Algorithm 1, lines 1-4 (each owner, alone)  -> :func:`train_local`: eq. (3), LSTM -> h^i -> linear softmax,
                                               Adam, mini-batches, early stopping on the owner's validation loss;
                                               :func:`represent`: the frozen model's h_k^i for every sample
Algorithm 1, lines 5-7 (global model)       -> :func:`train_global`: eq. (8) by Adam on the coordinator's
                                               parameters (P_i, W_0, W_1, θ), early stopping on validation loss
Algorithm 1, lines 8-10 (inference)         -> :func:`predict`
Metrics (Tables 2, 3)                       -> :func:`scores`: macro F1 and AUC
Every owner's series at once                -> :func:`owner_data`: the owners' standardised splits, as
                                               ``f3.load_data`` gives them to each owner (for benchmarks)

The global loops take a ``first_layer_for(rows)`` callable: for a batch of sample positions it returns
``A -> Â H W_0`` (see :meth:`~fedhet.algorithms.f3_models.GlobalGCN.fuse`).  :func:`plain_first_layer`
computes it from representations held in the clear (the paper's base setting, "trusted" fusion); the
federated coordinator passes one that asks the share holders (:mod:`fedhet.algorithms.f3`).  The loops,
seeds and batches are the same, so the two fusion modes differ only by the fixed-point error of the shares.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from fedhet.algorithms.f3_models import GlobalGCN, LocalLSTM
from fedhet.algorithms.toolkit import as_tensor, resolve_device, seeded

__all__ = ["EarlyStop", "LocalConfig", "GlobalConfig", "train_local", "represent", "local_probabilities", "build_global",
           "plain_first_layer", "train_global", "predict", "scores", "nll", "entropy", "OwnerData", "owner_data"]


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


def _batches(n: int, batch: int, gen: torch.Generator | None) -> list[np.ndarray]:
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


# ------------------------------------------------------------------------------ local (eq. 3)
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
        for b in _batches(len(y), cfg.batch, gen):
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


# ----------------------------------------------------------------------------- global (eq. 8)
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
                 progress: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Eq. (8) trained by Adam with NLL; ``y`` indexed by position; the best-validation state is kept.

    Batches come from a generator seeded with ``cfg.seed`` and the ICDF graphs from the model's own
    generator (seed + 1), so two runs whose first layers agree draw the same batches and graphs.
    """
    dev = next(model.parameters()).device
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long, device=dev)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    stopper, history = EarlyStop(model, cfg.patience), []
    model.generator = torch.Generator(dev).manual_seed(cfg.seed + 1)
    for ep in range(cfg.epochs):
        t0 = time.perf_counter()
        model.train()
        total, count = 0.0, 0
        for b in _batches(len(train_pos), cfg.batch, gen):
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
        if stopper.step(val):
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


# ------------------------------------------------------------------------ every owner's data
@dataclass
class OwnerData:
    """All owners' splits in one place: ``splits[k] = (x (owners, rows, T, 1), lengths (rows,) or None, y (rows,))``.

    Owner c's series are standardised with the mean and standard deviation of its own training rows
    (Japanese Vowels: the non-padded steps only), exactly as ``f3.load_data`` prepares them for owner c.
    """
    splits: dict
    n_classes: int
    adj: np.ndarray | None          # traffic: the road graph over the kept sensors; vowels: None
    provenance: str

    @property
    def n_owners(self) -> int:
        return self.splits["train"][0].shape[0]

    def labels(self) -> np.ndarray:
        """Labels of every position, in the coordinator's order: train, validation, test."""
        return np.concatenate([self.splits[k][2] for k in ("train", "val", "test")]).astype(np.int64)

    def positions(self) -> dict:
        """Positions of the train / val / test rows in :meth:`labels` order."""
        n = [len(self.splits[k][2]) for k in ("train", "val", "test")]
        return {"train": np.arange(n[0]), "val": np.arange(n[0], n[0] + n[1]),
                "test": np.arange(n[0] + n[1], sum(n))}


def vowels_parts(split_seed: int = 123, val_fraction: float = 0.2, data_dir=None) -> dict:
    """Japanese Vowels' train / val / test as ``{split: (VowelsSplit, row indices)}``: the TRAIN file split
    by a seeded permutation (validation first), the TEST file whole."""
    from fedhet.algorithms.data_vowels import load_vowels
    tr, te = load_vowels(data_dir)
    perm = np.random.RandomState(split_seed).permutation(len(tr.labels))
    n_val = int(round(val_fraction * len(tr.labels)))
    return {"train": (tr, np.sort(perm[n_val:])), "val": (tr, np.sort(perm[:n_val])),
            "test": (te, np.arange(len(te.labels)))}


def standardise_owner(raw: dict, padded: bool) -> dict:
    """One owner's ``{split: (x, lengths, y)}`` scaled by the mean and deviation of its own training series
    (``padded``: zeros are padding, not data, and are left out of the statistics)."""
    x_tr = raw["train"][0]
    real = x_tr[x_tr != 0] if padded else x_tr
    mu, sd = float(real.mean()), float(real.std()) or 1.0
    return {k: ((x - mu) / sd, ln, y) for k, (x, ln, y) in raw.items()}


def owner_data(dataset: str, *, data_seed: int = 0, split_seed: int = 123, val_fraction: float = 0.2,
               n_windows: int | None = None, n_sensors: int | None = None, data_dir=None) -> OwnerData:
    """Every owner's standardised train / val / test series (the settings mean what they mean in ``f3.Settings``)."""
    if dataset == "vowels":
        from fedhet.algorithms.data_vowels import N_CLASSES
        parts = vowels_parts(split_seed, val_fraction, data_dir)
        owners = parts["train"][0].series.shape[1]
        per = [{k: (S.owner(c)[i], S.lengths[i], S.labels[i]) for k, (S, i) in parts.items()} for c in range(owners)]
        n_classes, adj, prov = N_CLASSES, None, "real (UCI Japanese Vowels)"
    elif dataset in ("metr_la", "pems_bay", "grid"):
        from fedhet.algorithms.data_traffic import simulate
        data = simulate(dataset, seed=data_seed, n_windows=n_windows, data_dir=data_dir)
        owners = n_sensors or data.adj.shape[0]
        per = [{k: (data.x[i, c, :, None], None, data.y[i]) for k, i in data.split.items()} for c in range(owners)]
        n_classes, adj, prov = 2, data.adj[:owners, :owners], f"{data.provenance}: {dataset}"
    else:
        raise ValueError(f"unknown F3 data set {dataset!r}; choose vowels, metr_la, pems_bay or grid")
    per = [standardise_owner(r, padded=dataset == "vowels") for r in per]
    splits = {k: (np.stack([r[k][0] for r in per]), per[0][k][1], per[0][k][2]) for k in ("train", "val", "test")}
    return OwnerData(splits, n_classes, adj, prov)
