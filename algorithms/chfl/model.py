"""CHFL's trained parts as they leave the run: a client's selected network, the server's global columns.

A client's part (``meta["model"] = "chfl/client"``) is the network the client reports as selected,
whole, with its own scaler (its training rows' mean and deviation, applied inside the module) and its
feature order (its common features, then its unique ones, as its data puts them).  It scores the
client's RAW rows alone -- nothing from another party is needed -- and returns the class LOGITS
(float32; ``softmax`` of them is Eq. (7)'s F, their argmax the predicted class code, ``meta["classes"]``
maps codes to labels).  Which network, by ``method``:

- ``"chfl"``: Theta_k = (theta_c, theta_u,k, U_k): the global common column the client received at the
  selected round, with its own unique column and lateral matrices of the selected mu.  The selection is
  the client's, on its validation rows, over every (lr, mu, round) with the run's ``select``
  (``best_round``: each (lr, mu)'s round of highest validation accuracy, the first on ties; ``last``:
  round T), then the (lr, mu) of highest validation accuracy, the first in the sweep's order (lr, then
  mu) on ties.  That is the better of the client's two reported selections ``chfl_mu0`` and
  ``chfl_mu>0``: ``meta["selected"]`` names the group and holds its ``chosen`` lr, mu and round.
  Input ``x``: all the client's features.
- ``"common"``: the global common column of its reported selection ``common`` (lr, round); input ``x``:
  the common features only.
- ``"local"``: its own MLP of its reported selection ``local`` (lr, round); input ``x``: all its features.

The server's part (``"chfl/server"``; none with ``method = "local"``, where there is no global model) is
the global common column after the last round, one per lr (tensors ``columns.lr<j>.*``, ``meta["lrs"]``
maps ``lr<j>`` to the lr).  The server holds no rows and no scaler: its module takes STANDARDISED common
features (a client standardises with its own scaler, so a client's part is what scores raw rows) and
returns logits of shape (rows, lrs, classes); its part has no check rows.

``check`` rows are a client's first test rows (raw), with the outputs the live trained modules gave
them at the selected round (:class:`Keeper`), so a reload proves the rebuild.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.algorithms.chfl.core import CHFLClient, ClientData, LocalClient
from fedhet.algorithms.chfl.data import SKLEARN_SETS, ClientRows, column_names
from fedhet.algorithms.chfl.models import MLPColumn, UniqueColumn, flat_to_common
from fedhet.algorithms.chfl.settings import FILES, Settings
from fedhet.algorithms.partition import split_features
from fedhet.algorithms.toolkit import seeded

CHECK_ROWS = 8   # rows whose outputs a part carries, so a reload can show it scores the same
Score = Callable[[Mapping[str, nn.Module], torch.Tensor, torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------------------ scoring modules

class ClientNet(nn.Module):
    """A client's deployed network on raw rows: standardise, then the CHFL network (``network =
    "chfl"``: common column on the first ``n_common`` inputs, unique column on the rest) or one MLP
    (``"common"``, ``"local"``) on all its inputs; returns logits."""

    scaler_mean: torch.Tensor | None
    scaler_std: torch.Tensor | None

    def __init__(self, network: str, n_inputs: int, n_common: int, n_classes: int, hidden: Sequence[int],
                 mu: float = 0.0, lateral: bool = False, scaler_dtype: torch.dtype | None = None):
        super().__init__()
        self.network, self.n_common = network, int(n_common)
        if network == "chfl":
            self.common = MLPColumn(n_common, n_classes, hidden)
            self.unique = UniqueColumn(n_inputs - n_common, n_classes, hidden, mu, lateral)
        else:
            self.net = MLPColumn(n_inputs, n_classes, hidden)
        for name in ("scaler_mean", "scaler_std"):
            self.register_buffer(name, None if scaler_dtype is None else torch.zeros(n_inputs, dtype=scaler_dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scaler_mean is not None and self.scaler_std is not None:
            # toolkit.Scaler's numpy arithmetic: in the statistics' dtype, cast to float32
            x = ((x.to(self.scaler_mean.dtype) - self.scaler_mean) / self.scaler_std).to(torch.float32)
        if self.network != "chfl":
            return self.net(x)
        xc, xu = x[:, :self.n_common].contiguous(), x[:, self.n_common:].contiguous()
        return score_chfl({"common": self.common, "unique": self.unique}, xc, xu)


class GlobalColumns(nn.Module):
    """The server's global common columns, one per lr: standardised common features -> logits
    (rows, lrs, classes)."""

    def __init__(self, n_common: int, n_classes: int, hidden: Sequence[int], n_lrs: int):
        super().__init__()
        self.columns = nn.ModuleDict({f"lr{j}": MLPColumn(n_common, n_classes, hidden) for j in range(n_lrs)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([col(x) for col in self.columns.values()], dim=1)


def score_chfl(m: Mapping[str, nn.Module], xc: torch.Tensor, xu: torch.Tensor) -> torch.Tensor:
    """Eq. (7)'s logits z_c^(L) + z_u^(L) (as :meth:`CHFLClient.evaluate` forms them)."""
    common, unique = m["common"], m["unique"]
    assert isinstance(common, MLPColumn)
    zc = common.forward_all(xc)
    return zc[-1] + unique(xu, zc)


def score_common(m: Mapping[str, nn.Module], xc: torch.Tensor, xu: torch.Tensor) -> torch.Tensor:
    return m["net"](xc)


def score_local(m: Mapping[str, nn.Module], xc: torch.Tensor, xu: torch.Tensor) -> torch.Tensor:
    return m["net"](torch.cat([xc, xu], 1))


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> nn.Module:
    """A saved part's scoring module (:class:`ClientNet` or :class:`GlobalColumns`), in eval mode."""
    hidden, n_classes = [int(h) for h in meta["hidden"]], int(meta["n_classes"])
    module: nn.Module
    with seeded(0):   # the init is overwritten below; its draws must not move the caller's RNG
        if meta.get("model") == "chfl/server":
            module = GlobalColumns(int(meta["n_common"]), n_classes, hidden, len(meta["lrs"]))
        elif meta.get("model") == "chfl/client":
            dtype = torch.from_numpy(np.asarray(tensors["scaler_mean"])).dtype if meta.get("scaler") else None
            module = ClientNet(str(meta["network"]), int(meta["n_inputs"]), int(meta["n_common"]), n_classes,
                               hidden, float(meta.get("mu", 0.0)), bool(meta.get("lateral")), dtype)
        else:
            raise ValueError(f"chfl: unknown model {meta.get('model')!r} (chfl/client or chfl/server)")
    module.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}, strict=True)
    return module.eval()


# ------------------------------------------------------------------------------ the live model

@dataclass
class Snapshot:
    """One candidate network at one round: its weights and the outputs it gave the check rows."""

    round: int
    val: float
    tensors: dict[str, np.ndarray]
    outputs: np.ndarray | None


def live_outputs(modules: Mapping[str, nn.Module], score: Score, xc: torch.Tensor, xu: torch.Tensor) -> np.ndarray:
    """What the trained ``modules`` give the (standardised) check rows: eval mode, no gradient, on the
    CPU (a copy of modules on another device), each module's train/eval mode restored."""
    on_cpu = all(p.device.type == "cpu" for m in modules.values() for p in m.parameters())
    use = dict(modules) if on_cpu else {k: copy.deepcopy(m).cpu() for k, m in modules.items()}
    modes = {k: m.training for k, m in use.items()}
    try:
        for m in use.values():
            m.eval()
        with torch.no_grad():
            return score(use, xc.cpu(), xu.cpu()).numpy().copy()
    finally:
        for k, m in use.items():
            m.train(modes[k])


@dataclass
class Keeper:
    """Per candidate network (an (lr, mu) of the deployed kind), the snapshot at the round ``select``
    picks so far: ``best_round`` keeps the first round of highest validation accuracy, ``last`` the
    latest.  Copies only: it draws no random numbers and changes no module."""

    select: str
    xc: torch.Tensor          # the check rows, standardised as in training (the first test rows)
    xu: torch.Tensor
    best: dict[Hashable, Snapshot] = field(default_factory=dict)

    @classmethod
    def of(cls, select: str, cd: ClientData) -> "Keeper":
        return cls(select, cd.xc["test"][:CHECK_ROWS], cd.xu["test"][:CHECK_ROWS])

    def offer(self, key: Hashable, round: int, val: float, modules: Mapping[str, nn.Module], score: Score) -> None:
        old = self.best.get(key)
        if old is not None and self.select == "best_round" and not val > old.val:
            return
        tensors = {f"{name}.{k}": v.detach().cpu().numpy().copy()
                   for name, m in modules.items() for k, v in m.state_dict().items()}
        outputs = live_outputs(modules, score, self.xc, self.xu) if len(self.xc) else None
        self.best[key] = Snapshot(round, float(val), tensors, outputs)

    def state(self) -> dict:
        """The snapshots kept so far, for a checkpoint (the check rows come from the data again)."""
        return {key: {"round": s.round, "val": s.val, "tensors": s.tensors, "outputs": s.outputs}
                for key, s in self.best.items()}

    def load_state(self, state: Mapping[Hashable, Mapping[str, Any]]) -> None:
        self.best = {key: Snapshot(int(s["round"]), float(s["val"]), dict(s["tensors"]), s["outputs"])
                     for key, s in state.items()}


def candidates(m: CHFLClient | LocalClient, method: str) -> list[tuple[str, dict[str, nn.Module], Score]]:
    """The networks of one lr's trainer a client may deploy: (curve label, modules, scoring)."""
    if isinstance(m, LocalClient):
        return [("local", {"net": m.net}, score_local)]
    if method == "common":
        return [("common", {"net": m.common}, score_common)]
    return [(f"chfl_mu={mu:g}", {"common": m.common, "unique": h}, score_chfl) for mu, h in zip(m.mus, m.heads)]


# ------------------------------------------------------------------------------ the parts

def _names_from(s: Settings) -> str:
    if s.dataset == FILES:
        return "the client's file header"
    if s.dataset in SKLEARN_SETS:
        return "scikit-learn's feature names"
    return "f<column index in the whole table> (the table is loaded without names)"


def client_part(s: Settings, rows: ClientRows, cd: ClientData, snap: Snapshot,
                selected: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and metadata ``party.save_model`` takes for a client's selected network ``snap``
    (``selected``: its group and chosen lr, mu, round)."""
    network = "local" if s.method == "local" else ("common" if s.method == "common" else "chfl")
    dc, d = rows.n_common, rows.x.shape[1]
    n_in = dc if network == "common" else d
    names = list(rows.feature_names) or [f"f{c}" for c in range(d)]
    ntr, nva, _ = rows.n_parts
    tensors = dict(snap.tensors)
    mu = float(selected.get("mu", 0.0))
    meta: dict[str, Any] = {
        "model": "chfl/client", "method": s.method, "network": network, "selected": dict(selected),
        "selected_val": snap.val, "n_inputs": n_in, "n_common": dc, "n_classes": rows.n_classes,
        "hidden": list(s.hidden), "mu": mu, "lateral": any(k.startswith("unique.laterals.") for k in tensors),
        "feature_names": names[:n_in], "feature_names_from": _names_from(s),
        "classes": list(rows.classes) or list(range(rows.n_classes)),
        "inputs": [{"name": "x", "shape": [None, n_in], "dtype": "float32", "scaled": False}],
        "outputs": ["logits"]}
    if cd.scaler is not None:
        tensors["scaler_mean"] = np.asarray(cd.scaler.mean)[:n_in].copy()
        tensors["scaler_std"] = np.asarray(cd.scaler.std)[:n_in].copy()
        meta["scaler"] = {"kind": "z-score", "tensors": ["scaler_mean", "scaler_std"],
                          "fitted_on": "the client's training rows"}
    if snap.outputs is not None:
        raw = rows.x[ntr + nva:ntr + nva + CHECK_ROWS, :n_in]
        meta["check"] = {"inputs": {"x": raw.tolist()}, "outputs": snap.outputs.tolist()}
    return tensors, meta


def common_names(s: Settings, n_clients: int) -> list[str]:
    """The common features' names, from the settings alone (the server holds no data)."""
    if s.common_features:
        return list(s.common_features)
    fseed = s.seed if s.feature_seed is None else s.feature_seed
    common, _ = split_features(s.shape[1], n_clients, s.common_ratio, fseed)
    names = column_names(s.dataset, s.shape[1])
    return [names[int(c)] for c in common]


def server_part(s: Settings, thetas: Sequence[np.ndarray], n_clients: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The tensors and metadata of the server's global common columns (one flat vector per lr)."""
    tensors: dict[str, np.ndarray] = {}
    for j, theta in enumerate(thetas):
        with seeded(0):   # a column to unflatten into; its init draws stay inside the block
            col = MLPColumn(s.n_common, s.class_count, s.hidden)
        flat_to_common(col, theta)
        tensors.update({f"columns.lr{j}.{k}": v.detach().numpy().copy() for k, v in col.state_dict().items()})
    meta = {"model": "chfl/server", "method": s.method, "round": s.rounds,
            "lrs": {f"lr{j}": lr for j, lr in enumerate(s.lrs)}, "n_common": s.n_common,
            "n_classes": s.class_count, "hidden": list(s.hidden),
            "feature_names": common_names(s, n_clients), "feature_names_from": _names_from(s),
            "classes": list(range(s.class_count)), "classes_are": "class codes (a client's part maps them to labels)",
            "inputs": [{"name": "x", "shape": [None, s.n_common], "dtype": "float32", "scaled": True}],
            "outputs": ["logits"], "output_shape": [None, len(thetas), s.class_count]}
    return tensors, meta
