"""F³'s baselines and comparison models (f3.txt, Tables 2 and 3), in plaintext and in one process.

Paper -> names
  Alg. 1 lines 1-4, every owner at once   -> :class:`GroupedLSTM` (n independent LocalLSTMs as one module:
                                             stacked weights, batched matmuls) and :func:`train_locals`
                                             (each owner's Eq. (3) training, all owners in one loop;
                                             equal to :func:`~fedhet.algorithms.f3.training.train_local`
                                             per owner: same init, same batch order, same early stopping)
  Table 2, A: horizontal FL               -> :func:`fedavg_locals`: FedAvg of identically-shaped local LSTMs
  Table 2, B / C / D                      -> :func:`majority_vote`, :func:`threshold_vote` (binary),
                                             :func:`best_local` (by validation F1)
  Table 2, E (Eq. (5)) / G                  -> ``models.MeanPool`` / ``models.Concat``
  Table 2, F: Set Transformer             -> :class:`SetTransformer` (Lee et al. 2019: 2 SAB layers, 4 heads,
                                             PMA pooling; shared input projection: invariant to owner order)
  Table 2, L / M: VFL end to end          -> :class:`EndToEndVFL` (GroupedLSTM -> GlobalGCN, gradients into the
                                             local models every step; pre-trained (L) or from scratch (M))
  Table 3, κ-NN graph (Fatemi et al.)     -> :func:`knn_graph`, :class:`KnnGCN`: per sample, κ nearest owners by
                                             cosine similarity of an MLP projection of the node features
  Table 3, Gumbel-softmax graph           -> ``models.gumbel_sample`` / ``GlobalGCN(graph="gumbel")``
  training of the above                   -> :func:`train_model` (Adam, NLL, best-validation state: the loop of
                                             ``training.train_global`` for models that take the rows)
"""
from __future__ import annotations

import copy
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fedhet.algorithms.f3.models import GlobalGCN, LocalLSTM, normalise_adj
from fedhet.algorithms.f3.training import EarlyStop, GlobalConfig, LocalConfig, nll, scores
from fedhet.algorithms.toolkit import as_tensor, resolve_device, seeded

__all__ = ["GroupedLSTM", "train_locals", "fedavg_locals", "majority_vote", "threshold_vote", "best_local",
           "SetTransformer", "knn_graph", "KnnGCN", "EndToEndVFL", "train_model", "predict_model"]


# ------------------------------------------------------------------------ n local LSTMs at once
class GroupedLSTM(nn.Module):
    """G independent LSTM(in -> hidden) + linear heads with stacked weights (PyTorch's gate order i, f, g, o).

    Group g's output depends only on group g's weights and inputs, so gradients (and Adam, which is
    elementwise) stay per owner: training the stack is training every owner alone.
    """

    def __init__(self, groups: int, n_classes: int, hidden: int = 16, in_dim: int = 1):
        super().__init__()
        H = hidden
        self.hidden = hidden
        self.w_ih = nn.Parameter(torch.zeros(groups, 4 * H, in_dim))
        self.w_hh = nn.Parameter(torch.zeros(groups, 4 * H, H))
        self.b_ih = nn.Parameter(torch.zeros(groups, 4 * H))
        self.b_hh = nn.Parameter(torch.zeros(groups, 4 * H))
        self.head_w = nn.Parameter(torch.zeros(groups, n_classes, H))
        self.head_b = nn.Parameter(torch.zeros(groups, n_classes))

    @classmethod
    def from_locals(cls, models: list[LocalLSTM]) -> "GroupedLSTM":
        m0 = models[0]
        g = cls(len(models), m0.head.out_features, m0.lstm.hidden_size, m0.lstm.input_size)
        g.load_locals(models)
        return g.to(m0.head.weight.device)

    def load_locals(self, models: list[LocalLSTM]) -> None:
        with torch.no_grad():
            for name, get in self._MAP.items():
                getattr(self, name).copy_(torch.stack([get(m).detach() for m in models]))

    _MAP = {"w_ih": lambda m: m.lstm.weight_ih_l0, "w_hh": lambda m: m.lstm.weight_hh_l0,
            "b_ih": lambda m: m.lstm.bias_ih_l0, "b_hh": lambda m: m.lstm.bias_hh_l0,
            "head_w": lambda m: m.head.weight, "head_b": lambda m: m.head.bias}

    def to_locals(self) -> list[LocalLSTM]:
        """One frozen LocalLSTM per group (for ``training.represent`` and friends)."""
        out = []
        for g in range(self.w_ih.shape[0]):
            m = LocalLSTM(self.head_w.shape[1], self.hidden, self.w_ih.shape[2]).to(self.w_ih.device)
            with torch.no_grad():
                for name, get in self._MAP.items():
                    get(m).copy_(getattr(self, name)[g])
            m.eval()
            for p in m.parameters():
                p.requires_grad_(False)
            out.append(m)
        return out

    def represent(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """x (G, B, T, in) -> h (G, B, hidden): the hidden state at each sample's last step (``lengths`` (G, B))."""
        G, B, T, _ = x.shape
        h = x.new_zeros(G, B, self.hidden)
        c = x.new_zeros(G, B, self.hidden)
        bias = (self.b_ih + self.b_hh)[:, None]
        wi, wh = self.w_ih.transpose(1, 2), self.w_hh.transpose(1, 2)
        outs = []
        for t in range(T):
            gates = torch.bmm(x[:, :, t], wi) + torch.bmm(h, wh) + bias
            i, f, g, o = gates.chunk(4, -1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        if lengths is None:
            return h
        out = torch.stack(outs, 2)                                   # (G, B, T, H)
        idx = (lengths.to(x.device).long() - 1).clamp(min=0)
        return out.gather(2, idx[:, :, None, None].expand(G, B, 1, self.hidden)).squeeze(2)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.head_b[:, None], h, self.head_w.transpose(1, 2))

    def forward(self, x, lengths=None):
        return self.logits(self.represent(x, lengths))


def _rows(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """Per-group rows: x (G, N, ...) and idx (G, B) -> (G, B, ...)."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], idx]


def _grouped_loss(model: GroupedLSTM, x, ln, y, idx=None) -> torch.Tensor:
    """(G,) mean cross-entropy of every group on its rows ``idx`` (None: all rows)."""
    if idx is not None:
        x, y = _rows(x, idx), _rows(y, idx)
        ln = None if ln is None else _rows(ln, idx)
    logits = model(x, ln)
    G, B, C = logits.shape
    return F.cross_entropy(logits.reshape(G * B, C), y.reshape(-1), reduction="none").view(G, B).mean(1)


def _grouped_tensors(x, lengths, y, G, dev):
    xt = as_tensor(x, dev)
    yt = torch.as_tensor(np.broadcast_to(np.asarray(y), (G, len(y))).copy(), dtype=torch.long, device=dev)
    lt = None if lengths is None else torch.as_tensor(
        np.broadcast_to(np.asarray(lengths), (G, len(lengths))).copy(), dtype=torch.long, device=dev)
    return xt, lt, yt


def train_locals(x: np.ndarray, lengths: np.ndarray | None, y: np.ndarray, x_val: np.ndarray,
                 lengths_val: np.ndarray | None, y_val: np.ndarray, n_classes: int, cfgs: list[LocalConfig],
                 progress: Callable[[int, int], None] | None = None) -> tuple[GroupedLSTM, list[dict]]:
    """Eq. (3) for every owner at once: x (owners, rows, T, 1); owner g uses ``cfgs[g]`` (its seed).

    Owner g's initial weights, batch order (a generator seeded with its seed) and early stopping
    (its own validation loss, patience, best state kept) are those of ``train_local``; an owner that
    has stopped keeps its best state while the others go on.  Widths, epochs, lr and batch must agree.
    """
    c0 = cfgs[0]
    if any((c.hidden, c.epochs, c.patience, c.lr, c.batch) != (c0.hidden, c0.epochs, c0.patience, c0.lr, c0.batch)
           for c in cfgs):
        raise ValueError("train_locals: every owner needs the same hidden, epochs, patience, lr and batch")
    G, dev = len(cfgs), resolve_device(c0.device)
    if x.shape[0] != G:
        raise ValueError(f"train_locals: x holds {x.shape[0]} owners' series, {G} configs given")
    locals_ = []
    for c in cfgs:
        with seeded(c.seed, dev):
            locals_.append(LocalLSTM(n_classes, hidden=c.hidden, in_dim=x.shape[-1]).to(dev))
    model = GroupedLSTM.from_locals(locals_)
    gens = [torch.Generator().manual_seed(c.seed) for c in cfgs]
    opt = torch.optim.Adam(model.parameters(), lr=c0.lr)
    xt, lt, yt = _grouped_tensors(x, lengths, y, G, dev)
    xv, lv, yv = _grouped_tensors(x_val, lengths_val, y_val, G, dev)
    N = len(y)
    best = torch.full((G,), float("inf"), dtype=torch.float64)
    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    since = np.zeros(G, dtype=int)
    stopped = np.zeros(G, dtype=bool)
    epochs = np.zeros(G, dtype=int)
    for ep in range(c0.epochs):
        model.train()
        orders = torch.stack([torch.randperm(N, generator=g) for g in gens]).to(dev)
        for s in range(0, N, c0.batch):
            opt.zero_grad()
            _grouped_loss(model, xt, lt, yt, orders[:, s:s + c0.batch]).sum().backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val = _grouped_loss(model, xv, lv, yv).double().cpu()
        live = ~stopped
        epochs[live] = ep + 1
        better = live & (val.numpy() < best.numpy() - 1e-6)
        if better.any():
            bi = torch.as_tensor(np.flatnonzero(better))
            best[bi] = val[bi]
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    best_state[k][bi.to(v.device)] = v[bi.to(v.device)]
            since[better] = 0
        worse = live & ~better
        since[worse] += 1
        stopped |= worse & (since >= c0.patience)
        if progress:
            progress(ep + 1, int(stopped.sum()))
        if stopped.all():
            break
    model.load_state_dict(best_state)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, [{"epochs": int(e), "val_loss": float(b)} for e, b in zip(epochs, best)]


@torch.no_grad()
def grouped_outputs(model: GroupedLSTM, x: np.ndarray, lengths: np.ndarray | None,
                    batch: int = 2048) -> tuple[np.ndarray, np.ndarray]:
    """(h (owners, rows, hidden) float64, class probabilities (owners, rows, C) float64) of a trained stack."""
    dev = model.w_ih.device
    hs, ps = [], []
    for i in range(0, x.shape[1], batch):
        xb = as_tensor(x[:, i:i + batch], dev)
        lb = None if lengths is None else torch.as_tensor(
            np.broadcast_to(np.asarray(lengths)[i:i + batch], xb.shape[:2]).copy(), device=dev)
        h = model.represent(xb, lb)
        hs.append(h.double().cpu().numpy())
        ps.append(torch.softmax(model.logits(h), -1).double().cpu().numpy())
    return np.concatenate(hs, 1), np.concatenate(ps, 1)


# --------------------------------------------------------------------------- A: horizontal FL
def fedavg_locals(x: np.ndarray, lengths: np.ndarray | None, y: np.ndarray, x_val: np.ndarray,
                  lengths_val: np.ndarray | None, y_val: np.ndarray, n_classes: int, cfg: LocalConfig,
                  rounds: int = 10, local_epochs: int = 2) -> tuple[LocalLSTM, list[dict]]:
    """Baseline A: FedAvg over the owners, each training one shared LSTM on its own series.

    Every round each owner starts from the global weights, runs ``local_epochs`` epochs of Adam (fresh
    state) on its own rows (batch order from a generator seeded with cfg.seed + owner), and the server
    averages the weights (equal row counts: plain mean).  The round with the least mean validation
    loss of the global model over the owners is kept.
    """
    G, dev = x.shape[0], resolve_device(cfg.device)
    with seeded(cfg.seed, dev):
        glob = LocalLSTM(n_classes, hidden=cfg.hidden, in_dim=x.shape[-1]).to(dev)
    model = GroupedLSTM.from_locals([glob] * G)
    gens = [torch.Generator().manual_seed(cfg.seed + g) for g in range(G)]
    xt, lt, yt = _grouped_tensors(x, lengths, y, G, dev)
    xv, lv, yv = _grouped_tensors(x_val, lengths_val, y_val, G, dev)
    N = len(y)
    best, best_state, history = float("inf"), None, []
    for r in range(rounds):
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        model.train()
        for _ in range(local_epochs):
            orders = torch.stack([torch.randperm(N, generator=g) for g in gens]).to(dev)
            for s in range(0, N, cfg.batch):
                opt.zero_grad()
                _grouped_loss(model, xt, lt, yt, orders[:, s:s + cfg.batch]).sum().backward()
                opt.step()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.mean(0, keepdim=True).expand_as(p))       # the server's average, sent back
        model.eval()
        with torch.no_grad():
            val = float(_grouped_loss(model, xv, lv, yv).mean())
        history.append({"round": r + 1, "val_loss": val})
        if val < best - 1e-6:
            best, best_state = val, copy.deepcopy(model.state_dict())
    assert best_state is not None, "fedavg_locals: no round gave a finite validation loss"
    model.load_state_dict(best_state)
    return model.to_locals()[0], history


# -------------------------------------------------------------------------------- B, C, D
def majority_vote(probs: np.ndarray, n_classes: int) -> np.ndarray:
    """Baseline B: every owner votes its argmax; returns the vote shares (rows, C) (argmax: ties to the lowest class)."""
    votes = probs.argmax(-1)                                    # (owners, rows)
    return np.stack([(votes == c).mean(0) for c in range(n_classes)], 1)


def threshold_vote(probs: np.ndarray, probs_val: np.ndarray, y_val: np.ndarray) -> tuple[np.ndarray, float]:
    """Baseline C (binary): class 1 when the share of owners voting 1 exceeds a threshold tuned on validation F1.

    Returns two-column scores whose argmax is that decision (and whose column 1 ranks rows by the share,
    for the AUC) and the threshold.
    """
    share, share_v = (probs.argmax(-1) == 1).mean(0), (probs_val.argmax(-1) == 1).mean(0)
    cands = np.unique(np.concatenate([[-1.0], share_v]))
    f1s = [scores(_two(share_v, t), y_val, 2)["f1"] for t in cands]
    t = float(cands[int(np.argmax(f1s))])
    return _two(share, t), t


def _two(share: np.ndarray, t: float) -> np.ndarray:
    p1 = 1.0 / (1.0 + np.exp(-20.0 * (share - t)))      # > 0.5 exactly when share > t (a tie goes to class 0)
    return np.stack([1 - p1, p1], 1)


def best_local(probs_val: np.ndarray, y_val: np.ndarray, n_classes: int) -> int:
    """Baseline D: the owner whose local model has the best validation macro F1 (ties: the least validation loss)."""
    keys = []
    for g in range(probs_val.shape[0]):
        p = probs_val[g]
        loss = -np.log(np.clip(p[np.arange(len(y_val)), y_val], 1e-12, None)).mean()
        keys.append((scores(p, y_val, n_classes)["f1"], -loss))
    return int(max(range(len(keys)), key=lambda g: keys[g]))


# ----------------------------------------------------------------------- F: Set Transformer
class _MAB(nn.Module):
    """Multihead attention block (Lee et al. 2019, with layer norm): H = LN(X + MHA(X, Y, Y)); LN(H + rFF(H))."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.att = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.ln0, self.ln1 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, X, Y):
        H = self.ln0(X + self.att(X, Y, Y, need_weights=False)[0])
        return self.ln1(H + self.ff(H))


class SetTransformer(nn.Module):
    """Baseline F: owners' representations as a set -> shared projection -> ``layers`` SABs -> PMA -> softmax.

    The projection and blocks are shared by all owners, so the output does not depend on the owners' order.
    """

    def __init__(self, d_in: int, n_classes: int, d: int = 16, heads: int = 4, layers: int = 2):
        super().__init__()
        self.proj = nn.Linear(d_in, d)
        self.sab = nn.ModuleList([_MAB(d, heads) for _ in range(layers)])
        self.seed_vec = nn.Parameter(torch.randn(1, 1, d) * d ** -0.5)
        self.pma = _MAB(d, heads)
        self.head = nn.Linear(d, n_classes)

    def forward(self, hs):
        X = self.proj(torch.stack(hs, 1))
        for blk in self.sab:
            X = blk(X, X)
        pooled = self.pma(self.seed_vec.expand(X.shape[0], 1, -1), X)[:, 0]
        return torch.softmax(self.head(pooled), -1)


# -------------------------------------------------------------------------- Table 3: κ-NN graph
def knn_graph(feats: torch.Tensor, kappa: int) -> torch.Tensor:
    """(batch, n, d) node features -> (batch, n, n): row i keeps its κ most cosine-similar other nodes,
    weighted by ReLU(similarity) (Fatemi et al. 2021's kNN learner); not yet symmetrised or normalised."""
    f = F.normalize(feats, dim=-1)
    sim = f @ f.transpose(-1, -2)
    n = sim.shape[-1]
    k = min(int(kappa), n - 1)
    eye = torch.eye(n, dtype=torch.bool, device=sim.device)
    vals, idx = sim.masked_fill(eye, float("-inf")).topk(k, dim=-1)
    return torch.zeros_like(sim).scatter(-1, idx, torch.relu(vals))


class KnnGCN(GlobalGCN):
    """Eq. (8) with a κ-NN graph per sample over MLP(P_i h^i) (Table 3, "κ-NN Graph").

    The graph depends on the representations themselves, so unlike the ICDF graph it could not be
    public in the federation; here (plaintext) it is a comparison only.
    """

    def __init__(self, n: int, dims, d: int, hidden: int, n_classes: int, align: str = "soft", kappa: int = 10):
        super().__init__(n, dims, d, hidden, n_classes, align=align, graph="none")
        self.graph, self.kappa = "knn", kappa
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))

    def forward(self, hs):
        H = self.stack(hs)
        A = normalise_adj(knn_graph(self.mlp(H), self.kappa))
        Z = torch.relu(A @ self.W0(H))
        return torch.softmax(self.W1((A @ Z).mean(1)), -1)


# ----------------------------------------------------------------------------- L, M: end to end
class EndToEndVFL(nn.Module):
    """Baselines L / M: local LSTMs (a :class:`GroupedLSTM`) feeding a :class:`GlobalGCN`, trained jointly.

    In a federation every step would send h^i forward and dL/dh^i back (representations in the clear
    per step, unlike F³'s single upload); here everything runs in one process.
    """

    def __init__(self, local: GroupedLSTM, gcn: GlobalGCN):
        super().__init__()
        self.local, self.gcn = local, gcn
        for p in self.local.parameters():
            p.requires_grad_(True)

    def forward(self, x, lengths=None):
        h = self.local.represent(x, lengths)               # (owners, B, hidden)
        return self.gcn(list(h.unbind(0)))


# ------------------------------------------------------------------------------ training loop
def train_model(model: nn.Module, forward_rows: Callable[[np.ndarray], torch.Tensor], y: np.ndarray,
                train_pos: np.ndarray, val_pos: np.ndarray, cfg: GlobalConfig, param_groups=None) -> list[dict]:
    """``training.train_global``'s loop (Adam, NLL of probabilities, batches from a generator seeded with
    cfg.seed, best validation loss kept, early stopping) for any model whose rows give probabilities."""
    dev = next(model.parameters()).device
    yt = torch.as_tensor(np.asarray(y), dtype=torch.long, device=dev)
    opt = torch.optim.Adam(param_groups or model.parameters(), lr=cfg.lr)
    gen = torch.Generator().manual_seed(cfg.seed)
    stopper, history = EarlyStop(model, cfg.patience), []
    for ep in range(cfg.epochs):
        model.train()
        order = torch.randperm(len(train_pos), generator=gen).numpy()
        for i in range(0, len(order), cfg.batch):
            rows = train_pos[order[i:i + cfg.batch]]
            opt.zero_grad()
            nll(forward_rows(rows), yt[torch.as_tensor(rows, device=dev)]).backward()
            opt.step()
        pv = predict_model(model, forward_rows, val_pos, cfg.batch)
        val = float(nll(torch.as_tensor(pv), torch.as_tensor(np.asarray(y)[val_pos], dtype=torch.long)))
        history.append({"epoch": ep + 1, "val_loss": val})
        if stopper.step(val):
            break
    stopper.restore()
    return history


def predict_model(model: nn.Module, forward_rows: Callable[[np.ndarray], torch.Tensor], positions: np.ndarray,
                  batch: int) -> np.ndarray:
    model.eval()
    with torch.no_grad():
        return np.concatenate([forward_rows(positions[i:i + batch]).double().cpu().numpy()
                               for i in range(0, len(positions), batch)])
