"""CHFL's local training, aggregation and selection: the maths CHFL's roles call (no parties).

Mori et al., "Continual Horizontal Federated Learning for Heterogeneous
Data".  Per mini-batch of client k (Algorithm 2, lines 13-16):

1. one Adam step on the client's local copy of the common column theta_c
   with the common-only loss L(F_{theta_c}(x^c), y);
2. with theta_c fixed (the updated copy), one Adam step on the unique column
   theta_u,k and the lateral matrices U_k with the loss of the whole network
   L(softmax(z_c^(L) + z_u^(L)), y) (Eqs. (6)-(7)).

After E local epochs the client returns theta_c as one flat float32 vector;
the server averages them (Algorithm 2 line 7; :func:`aggregate`, a mean
weighted by training-sample counts -- the plain 1/K mean when the split is
even, as in the paper) and sends the result back.  Baselines (Sec. V-A2):
**Common** = FedAvg of the same MLP on the common features only (exactly the
common column of CHFL, whose training never depends on the unique column);
**Local** = each client alone, one MLP on all its features (common+unique).

The federated role functions (:mod:`fedhet.algorithms.chfl.roles`) are thin
wrappers: a client builds a :class:`CHFLClient`, and per round does
``set_common(v)``, ``train_round()``, sends ``get_common()``; the server
averages (:mod:`fedhet.protocols.aggregation`; :func:`aggregate` is the same
weighted mean in the clear) and broadcasts.  Experiments run those roles in
memory (:mod:`fedhet.algorithms.chfl.experiments`); there is no second round loop.

Choices the paper leaves open (defaults of :class:`~fedhet.algorithms.chfl.settings.Settings`):
- ``rounds`` T: not given in the paper; default 20 rounds of E=5 local
  epochs (100 passes over each client's data), with per-client selection
  of the round on validation (``select="best_round"``, i.e. early stopping;
  ``"last"`` uses round T).
- features are standardised per client with its own training rows' mean
  and std (no statistics leave a client).
- the common column's Adam state is reset each round (clients keep no
  state about the global model, as in plain FedAvg); the unique column's
  and laterals' Adam state persists (they are purely local).
- the evaluated model after round t is (theta_c^(t+1), theta_u,k, U_k):
  the aggregated common column, as the paper defines Theta_k^t.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fedhet.algorithms.chfl.models import HIDDEN, MLPColumn, UniqueColumn, common_to_flat, flat_to_common
from fedhet.algorithms.dp_sgd import DPStep, module_clipped_grads, poisson_batch
from fedhet.algorithms.toolkit import Scaler, derive_seed, seeded, shuffled_batches


def _adam(params: Iterable[torch.nn.Parameter], lr: float) -> torch.optim.Adam:
    params = list(params)
    try:  # the fused kernel is several times faster for these small layers
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.Adam(params, lr=lr, foreach=True)


# ------------------------------------------------------------------- input

@dataclass
class ClientData:
    """One client's rows, split into its common and unique feature blocks."""

    xc: dict[str, torch.Tensor]   # part -> (n, d_common)
    xu: dict[str, torch.Tensor]   # part -> (n, d_unique)
    y: dict[str, torch.Tensor]    # part -> (n,) int64
    n_classes: int
    scaler: Scaler | None = None  # the standardisation of the raw rows (None: taken as they are)

    @property
    def n_train(self) -> int:
        return int(self.y["train"].shape[0])

    @property
    def d_common(self) -> int:
        return int(self.xc["train"].shape[1])

    @property
    def d_unique(self) -> int:
        return int(self.xu["train"].shape[1])


@torch.no_grad()
def _top1(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(1) == y).float().mean().item()) if y.numel() else float("nan")


# ---------------------------------------------------------------- clients

class _Trainer:
    """What a client's trainer checkpoints: its modules' and optimizers' ``state_dict()``s and its
    batch generator's state (the data order), so training goes on as if never stopped."""

    gen: torch.Generator

    def _stateful(self) -> dict[str, Any]:
        """name -> each module and optimizer the trainer holds now."""
        raise NotImplementedError

    def state(self) -> dict:
        return {"parts": {k: v.state_dict() for k, v in self._stateful().items()}, "gen": self.gen.get_state()}

    def load_state(self, state: Mapping[str, Any]) -> None:
        for k, v in self._stateful().items():
            v.load_state_dict(state["parts"][k])
        self.gen.set_state(state["gen"])


class CHFLClient(_Trainer):
    """Client k of CHFL: a local copy of the common column plus one or more
    unique columns (one per mu; several let a sweep share one common-column
    trajectory, which is identical for every mu since step 1 never sees the
    unique column).  ``mus=()`` is the Common baseline."""

    def __init__(self, data: ClientData, *, mus: Sequence[float] = (0.0,), lr: float = 1e-3,
                 hidden: Sequence[int] = HIDDEN, seed: int = 0, index: int = 0,
                 reset_common_optim: bool = True):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.data = data
        self.lr = float(lr)
        self.mus = [float(m) for m in mus]
        self.hidden = list(hidden)
        self.reset_common_optim = bool(reset_common_optim)
        dev = data.y["train"].device
        C = data.n_classes
        with seeded(derive_seed(seed, "common")):
            self.common = MLPColumn(data.d_common, C, hidden).to(dev)
        # The same W init for every head (laterals drawn after), so mu=0 and
        # mu>0 heads differ only by the lateral term.
        self.heads = []
        for m in self.mus:
            with seeded(derive_seed(seed, index, "unique")):
                self.heads.append(UniqueColumn(data.d_unique, C, hidden, mu=m).to(dev))
        self.opt_common = _adam(self.common.parameters(), self.lr)
        self.opt_heads = [_adam(h.parameters(), self.lr) for h in self.heads]
        self.gen = torch.Generator().manual_seed(derive_seed(seed, index, "batches"))
        self.dp: tuple[DPStep, torch.Generator] | None = None  # record-level DP-SGD of step 1 (roles set it)

    @property
    def n_train(self) -> int:
        return self.data.n_train

    def _stateful(self) -> dict[str, Any]:
        return {"common": self.common, "opt_common": self.opt_common,
                **{f"head{j}": h for j, h in enumerate(self.heads)},
                **{f"opt_head{j}": o for j, o in enumerate(self.opt_heads)}}

    def get_common(self) -> np.ndarray:
        return common_to_flat(self.common)

    def set_common(self, vec: np.ndarray) -> None:
        flat_to_common(self.common, vec)

    def train_round(self, epochs: int = 5, batch_size: int = 64) -> dict:
        """E local epochs of Algorithm 2 (lines 11-18). Returns mean losses.

        With ``self.dp`` (a :class:`~fedhet.algorithms.dp_sgd.DPStep` and the private noise generator), step 1
        -- the only one whose result leaves the client -- is DP-SGD: Poisson-sampled batches (rate
        ``sampling_rate``, ``ceil(n / batch_size)`` per epoch), per-sample gradients clipped, Gaussian noise,
        then Adam on the noised gradient; step 2 (local only) trains on the same batch as usual."""
        if self.reset_common_optim:
            self.opt_common = _adam(self.common.parameters(), self.lr)
        d = self.data
        xc, xu, y = d.xc["train"], d.xu["train"], d.y["train"]
        lc, lh, nb = 0.0, [0.0] * len(self.heads), 0
        for _ in range(int(epochs)):
            for idx in self._batches(d.n_train, int(batch_size)):
                idx = idx.to(y.device)
                bc, bu, by = xc[idx], xu[idx], y[idx]
                # step 1: the common column alone (line 14)
                lc += self._common_step(bc, by, d.n_train)
                nb += 1
                if not self.heads or len(idx) == 0:
                    continue
                # step 2: theta_c fixed; unique column + laterals, whole-net loss (15-16)
                with torch.no_grad():
                    zc = self.common.forward_all(bc)
                for j, (head, opt) in enumerate(zip(self.heads, self.opt_heads)):
                    loss = F.cross_entropy(zc[-1] + head(bu, zc), by)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    lh[j] += float(loss.detach())
        nb = max(nb, 1)
        return {"loss_common": lc / nb, "loss_heads": [v / nb for v in lh]}

    def _batches(self, n: int, batch_size: int) -> Iterable[torch.Tensor]:
        if self.dp is None:
            return shuffled_batches(n, batch_size, self.gen)
        step, gen = self.dp
        return [poisson_batch(n, step.sampling_rate, gen) for _ in range(math.ceil(n / batch_size))]

    def _common_step(self, bc: torch.Tensor, by: torch.Tensor, n: int) -> float:
        """One Adam step of the common column (a DP-SGD gradient with ``self.dp``); returns the batch loss."""
        self.opt_common.zero_grad(set_to_none=True)
        if self.dp is None:
            loss_c = F.cross_entropy(self.common(bc), by)
            loss_c.backward()
            self.opt_common.step()
            return float(loss_c.detach())
        step, gen = self.dp
        g = module_clipped_grads(self.common, F.cross_entropy, bc, by, step.clip)
        for k, p in self.common.named_parameters():
            noise = torch.normal(0.0, step.noise_multiplier * step.clip, size=p.shape, generator=gen,
                                 dtype=p.dtype).to(p.device)
            p.grad = (g[k] + noise) / (step.sampling_rate * n)
        self.opt_common.step()
        with torch.no_grad():
            return float(F.cross_entropy(self.common(bc), by)) if len(bc) else 0.0

    @torch.no_grad()
    def evaluate(self, part: str) -> dict:
        """Accuracy of the common column alone and of each whole network."""
        d = self.data
        zc = self.common.forward_all(d.xc[part])
        return {"common": _top1(zc[-1], d.y[part]),
                "heads": [_top1(zc[-1] + h(d.xu[part], zc), d.y[part]) for h in self.heads]}


class LocalClient(_Trainer):
    """The Local baseline: one MLP on the client's common+unique features."""

    def __init__(self, data: ClientData, *, lr: float = 1e-3, hidden: Sequence[int] = HIDDEN,
                 seed: int = 0, index: int = 0):
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.data = data
        self.x = {p: torch.cat([data.xc[p], data.xu[p]], 1) for p in data.xc}
        with seeded(derive_seed(seed, index, "local")):
            self.net = MLPColumn(self.x["train"].shape[1], data.n_classes, hidden).to(data.y["train"].device)
        self.opt = _adam(self.net.parameters(), float(lr))
        self.gen = torch.Generator().manual_seed(derive_seed(seed, index, "batches"))

    def _stateful(self) -> dict[str, Any]:
        return {"net": self.net, "opt": self.opt}

    def train_round(self, epochs: int = 5, batch_size: int = 64) -> dict:
        x, y = self.x["train"], self.data.y["train"]
        tot, nb = 0.0, 0
        for _ in range(int(epochs)):
            for idx in shuffled_batches(x.shape[0], int(batch_size), self.gen):
                idx = idx.to(y.device)
                loss = F.cross_entropy(self.net(x[idx]), y[idx])
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                tot += float(loss.detach())
                nb += 1
        return {"loss": tot / max(nb, 1)}

    @torch.no_grad()
    def evaluate(self, part: str) -> dict:
        return {"local": _top1(self.net(self.x[part]), self.data.y[part])}


# ------------------------------------------------------------- aggregation

def aggregate(vectors: Sequence[np.ndarray], weights: Sequence[float] | None = None) -> np.ndarray:
    """FedAvg's server step: sum_k w_k v_k / sum_k w_k (float64 sum, float32 out).

    With ``weights=None`` (or equal weights) this is Eq. (1)'s plain mean."""
    if len(vectors) == 0:
        raise ValueError("aggregate needs at least one vector")
    vs = [np.asarray(v) for v in vectors]
    n = vs[0].shape
    if len(n) != 1 or any(v.shape != n for v in vs):
        raise ValueError(f"vectors must be 1-D and of equal length, got {[v.shape for v in vs]}")
    w = np.ones(len(vs)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (len(vs),) or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be {len(vs)} non-negative numbers with a positive sum")
    acc = np.zeros(n, dtype=np.float64)
    for wi, v in zip(w, vs):
        acc += wi * v.astype(np.float64)
    return (acc / w.sum()).astype(np.float32)


# --------------------------------------------------------------- selection

def select_per_client(candidates: Sequence[dict], select: str = "best_round") -> dict:
    """Each client picks, on ITS OWN validation accuracy, one candidate
    (a hyper-parameter setting: ``{"val": (T,K), "test": (T,K), "config": ...}``)
    and -- with ``best_round`` -- the round; returns the chosen test
    accuracies and their mean over clients (the paper's metric)."""
    if select not in ("best_round", "last"):
        raise ValueError(f"select must be best_round or last, got {select!r}")
    if not candidates:
        raise ValueError("no candidates to select from")
    K = len(candidates[0]["val"][0])
    chosen_test: list[float | None] = []
    chosen_cfg: list[dict | None] = []
    for k in range(K):
        best: tuple[float, float | None, dict | None] = (-math.inf, None, None)
        for c in candidates:
            val = np.asarray(c["val"])[:, k]
            test = np.asarray(c["test"])[:, k]
            r = int(np.argmax(val)) if select == "best_round" else len(val) - 1
            if val[r] > best[0]:
                best = (float(val[r]), float(test[r]), {**c.get("config", {}), "round": r + 1})
        chosen_test.append(best[1])
        chosen_cfg.append(best[2])
    return {"test": chosen_test, "mean_test": float(np.mean(np.asarray(chosen_test, dtype=np.float64))), "chosen": chosen_cfg}
