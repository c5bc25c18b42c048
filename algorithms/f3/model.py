"""F³'s trained parts as they leave the run: an owner's frozen local model, the coordinator's fusion model.

owner        :func:`owner_part` -> :class:`OwnerScorer`: its frozen LSTM (Eq. (3)) with the standardisation
             of its own training series inside, so it takes RAW series: ``forward(x[, lengths])`` is the
             representation h^i (float32, (rows, d_i)), what it shares in the federation; its local head is
             in the part too (:meth:`OwnerScorer.local_probabilities`, the local model's class
             probabilities).  It scores alone: it needs nothing from the other parties.
coordinator  :func:`coordinator_part` -> :class:`FusionScorer`: the global model of Eq. (8) as the coordinator
             holds it (P_i, W_0, W_1, the learned graph's θ, or the given graph), taking every owner's h^i as
             an input (``forward(h_<owner 1>, ..., h_<owner n>)`` -> class probabilities).  It cannot score
             alone: it needs each owner's h^i of the same sample (an owner's part makes it from the owner's
             series).  In a shamir run the coordinator never held any h (the first layer ran on the holders'
             shares), so running this part on h in the clear is federated prediction's business (a later
             item); with fusion "trusted" it is how the coordinator scored.  Its check rows are therefore
             SYNTHETIC h in (-1, 1) (an LSTM's range), seeded, never an owner's representations.
             The run drew a fresh ICDF graph per sample and averaged ``test_samples`` of them; a deployed
             model must answer the same for the same row, so the part carries ``test_samples`` graphs drawn
             once from the learned θ (a seeded generator of its own, ``graph_seed``) and normalised (Â), and
             averages over those; θ is in the part as well.  Graph "none" / "given": the one Â the run used.
holder       fusion "shares" only: :func:`holder_part` -> :class:`SharedPart`: ITS pair of the 2-of-3 replicated
             shares of the trained weights (P, W_0, W_1 as uint64 words, 20 fractional bits; never the opened
             weights) and the public Â the run used.  It cannot score alone: ``fedhet predict`` runs the training
             forward on shares with the two other holders' parts (:mod:`fedhet.algorithms.f3.predict`).  With the
             other fusions a holder saves no part: it holds shares of the owners' h only, no trained weights.
"""
from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import nn

from fedhet.protocols import replicated as rs

from fedhet.algorithms.f3.shares import F, Shape, SharedModel
from fedhet.algorithms.f3.models import GlobalGCN, LocalLSTM, gumbel_sample, icdf_sample, normalise_adj

CHECK_ROWS = 8     # rows whose outputs a part carries, so a reload can show it scores the same
GRAPH_SEED = 0     # seed of the exported graph draws (a generator of their own: the run's RNGs are untouched)


@contextlib.contextmanager
def _scoring(module: nn.Module) -> Iterator[None]:
    """No gradients, eval mode, the module's mode restored afterwards."""
    was = module.training
    module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        module.train(was)


# ------------------------------------------------------------------------------------------- owner
class OwnerScorer(nn.Module):
    """Raw series (rows, T, 1) float64 -> standardised as in training -> the frozen LSTM's h (float32)."""

    mean: torch.Tensor
    std: torch.Tensor

    def __init__(self, local: LocalLSTM, mean: float, std: float) -> None:
        super().__init__()
        self.local = local
        self.register_buffer("mean", torch.tensor([mean], dtype=torch.float64))
        self.register_buffer("std", torch.tensor([std], dtype=torch.float64))

    def represent(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        xs = ((x.double() - self.mean) / self.std).float()
        out, _ = self.local.lstm(xs)
        if lengths is None:
            return out[:, -1]
        # each row's last real step (lengths - 1, at least 0): a gather, the live model's indexing
        idx = (lengths.long() - 1).clamp(min=0).reshape(-1, 1, 1).expand(-1, 1, out.shape[-1])
        return out.gather(1, idx).squeeze(1)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        return self.represent(x, lengths)

    def local_probabilities(self, x: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """The local model's class probabilities (its softmax head on h)."""
        return torch.softmax(self.local.head(self.represent(x, lengths)), -1)


def owner_part(model: LocalLSTM, *, mean: float, std: float, n_classes: int, feature_names: list[str],
               raw_x: np.ndarray, std_x: np.ndarray, lengths: np.ndarray | None,
               dataset: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """An owner's part: its frozen LSTM and head, its scaler; checked on its own test rows (``raw_x`` raw,
    ``std_x`` the same rows as it trained on them, standardised)."""
    tensors = {f"local.{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    tensors["scaler_mean"], tensors["scaler_std"] = np.array([mean]), np.array([std])
    hidden, in_dim = model.lstm.hidden_size, model.lstm.input_size
    steps = int(raw_x.shape[1])
    inputs: list[dict[str, Any]] = [{"name": "x", "shape": [None, steps, in_dim], "dtype": "float64", "scaled": False}]
    if lengths is not None:
        inputs.append({"name": "lengths", "shape": [None], "dtype": "float64",
                       "note": "each row's number of real steps (the rest of x is zero padding)"})
    meta: dict[str, Any] = {
        "model": "f3/owner", "dataset": dataset, "feature_names": feature_names,
        "series": {"steps": steps, "channels": in_dim}, "hidden": hidden, "n_classes": n_classes,
        "classes": list(range(n_classes)), "classes_of": "the local head (local_probabilities)",
        "scaler": {"kind": "z-score, one mean and deviation for the whole series (the owner's training rows)",
                   "tensors": ["scaler_mean", "scaler_std"]},
        "inputs": inputs, "outputs": ["h"],
        "h": "the frozen LSTM's last hidden state at each row's last real step: what the owner shares"}
    rows_std = np.asarray(std_x)[:CHECK_ROWS]
    ln = None if lengths is None else np.asarray(lengths)[:CHECK_ROWS]
    with _scoring(model):   # the live trained model, on the rows as it trained on them
        xt = torch.as_tensor(rows_std, dtype=torch.float32)
        h = model.represent(xt, ln)
        probs = torch.softmax(model.head(h), -1)
    check_inputs: dict[str, Any] = {"x": np.asarray(raw_x)[:CHECK_ROWS].tolist()}
    if ln is not None:
        check_inputs["lengths"] = ln.astype(np.float64).tolist()
    meta["check"] = {"inputs": check_inputs, "outputs": h.numpy().tolist()}
    meta["check_local"] = probs.numpy().tolist()
    return tensors, meta


def _state(tensors: Mapping[str, np.ndarray], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: torch.as_tensor(np.array(v)) for k, v in tensors.items() if k.startswith(prefix)}


@contextlib.contextmanager
def _own_rng() -> Iterator[None]:
    """Building a module draws its initial weights: from torch's RNG forked here, so the caller's is untouched."""
    with torch.random.fork_rng(devices=[]):
        yield


def load_owner(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> OwnerScorer:
    with _own_rng():
        local = LocalLSTM(int(meta["n_classes"]), hidden=int(meta["hidden"]), in_dim=int(meta["series"]["channels"]))
    local.load_state_dict(_state(tensors, "local."))
    scorer = OwnerScorer(local, float(tensors["scaler_mean"][0]), float(tensors["scaler_std"][0]))
    return scorer.eval()


# ------------------------------------------------------------------------------------- coordinator
class FusionScorer(nn.Module):
    """Eq. (8) on every owner's h^i, averaged over the part's fixed graphs Â_k ((K, n, n))."""

    graphs: torch.Tensor

    def __init__(self, gcn: GlobalGCN, graphs: torch.Tensor) -> None:
        super().__init__()
        self.gcn = gcn
        self.register_buffer("graphs", graphs)

    def forward(self, *hs: torch.Tensor) -> torch.Tensor:
        g = self.gcn
        XW = g.W0(g.stack(list(hs)))              # H W_0, (rows, n, hidden)
        return self.fused(lambda A: A @ XW)

    def fused(self, first: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Eq. (8) from its first layer ``first(Â_k) = Â_k H W_0`` (here, or on shares by the holders; or the
        logits, mpc: :meth:`GlobalGCN.logits`)."""
        g = self.gcn
        out: torch.Tensor | int = 0
        for k in range(self.graphs.shape[0]):
            out = out + torch.softmax(g.logits(first, self.graphs[k]), -1)
        assert isinstance(out, torch.Tensor)
        return out / self.graphs.shape[0]


def fixed_graphs(model: GlobalGCN, seed: int = GRAPH_SEED) -> torch.Tensor:
    """The graphs a part scores with: ``test_samples`` normalised draws from θ (generator seeded with ``seed``),
    or the one Â of graph "none" / "given"."""
    with torch.no_grad():
        if model.graph in ("icdf", "gumbel"):
            sample = gumbel_sample if model.graph == "gumbel" else icdf_sample
            gen = torch.Generator(model.theta.device).manual_seed(seed)
            return normalise_adj(sample(model.theta, model.tau, gen, batch=model.test_samples)).detach().cpu()
        return model.adj(1).detach().cpu().reshape(1, model.n, model.n).clone()


def coordinator_part(model: GlobalGCN, *, owners: Sequence[str], widths: Sequence[int], n_classes: int,
                     fusion: str, dataset: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The coordinator's part: the global model's parameters (and buffers), the graphs it scores with."""
    graphs = fixed_graphs(model)
    tensors = {f"gcn.{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    tensors["graphs"] = graphs.numpy()
    names = [f"h_{o}" for o in owners]
    meta: dict[str, Any] = {
        "model": "f3/coordinator", "dataset": dataset, "fusion": fusion, "owners": list(owners),
        "widths": [int(w) for w in widths], "d": int(model.W0.in_features), "hidden": int(model.W0.out_features),
        "n_classes": n_classes, "classes": list(range(n_classes)), "align": model.align, "graph": model.graph,
        "tau": model.tau, "test_samples": model.test_samples, "graph_seed": GRAPH_SEED,
        "graphs": f"{graphs.shape[0]} normalised graph(s) Â_k the part averages over (tensor 'graphs')",
        "feature_names": [f"{o}.h{j}" for o, w in zip(owners, widths) for j in range(int(w))],
        "feature_names_note": "the inputs are the owners' representations h (no column names): owner.h<j>",
        "inputs": [{"name": nm, "shape": [None, int(w)], "dtype": "float32", "from": o}
                   for nm, o, w in zip(names, owners, widths)],
        "outputs": ["probabilities"],
        "needs": "every owner's h of the same rows (its own part computes it from its series)"}
    rng = np.random.default_rng(GRAPH_SEED)   # synthetic check rows: the coordinator holds no h of its own
    rows = [rng.uniform(-1, 1, (CHECK_ROWS, int(w))).astype(np.float32) for w in widths]
    live = FusionScorer(model, graphs.to(model.W0.weight.device))
    with _scoring(model):
        out = live(*[torch.as_tensor(r, device=model.W0.weight.device) for r in rows]).cpu().numpy()
    meta["check"] = {"inputs": {nm: r.tolist() for nm, r in zip(names, rows)}, "outputs": out.tolist()}
    meta["check_inputs"] = "synthetic h, uniform in (-1, 1), seeded: never an owner's representations"
    return tensors, meta


def load_coordinator(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> FusionScorer:
    widths = [int(w) for w in meta["widths"]]
    n = len(widths)
    with _own_rng():
        gcn = GlobalGCN(n, widths, int(meta["d"]), int(meta["hidden"]), int(meta["n_classes"]), align=meta["align"],
                        graph=meta["graph"], given=np.ones((n, n)), tau=float(meta["tau"]),
                        test_samples=int(meta["test_samples"]))
    gcn.load_state_dict(_state(tensors, "gcn."))
    return FusionScorer(gcn, torch.as_tensor(np.array(tensors["graphs"]))).eval()


# ------------------------------------------------------------------------------ holder (fusion "shares")
HOLDER_PART = "f3/holder-shares"


@dataclass(frozen=True)
class SharedPart:
    """A holder's trained part with fusion "shares": its pairs of the weights, the model's public sizes, Â."""
    model: SharedModel
    shape: Shape
    A: np.ndarray

    def digest(self, component: str) -> bytes:
        """SHA-256 of one component (``"a"`` or ``"b"``) of every weight, with Â and the shapes: holder i's ``"b"``
        is holder i+1's ``"a"`` (the same words), so two holders compare their parts without revealing anything
        the receiver does not hold."""
        d = hashlib.sha256(np.asarray(self.A, dtype=np.float64).tobytes())
        for k in sorted(self.model.w):
            x = np.ascontiguousarray(getattr(self.model.w[k], component), dtype=np.uint64)
            d.update(f"{k}{x.shape}".encode())
            d.update(x.tobytes())
        return d.digest()


def holder_part(model: SharedModel, shape: Shape, A: np.ndarray, *, owners: Sequence[str], holder: int,
                dataset: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A holder's part: its pair (``w.<name>.a``, ``w.<name>.b``, uint64) of every trained weight, and the public
    Â (``graph``, float64); no momentum (prediction needs none), no check rows (it scores only with the two
    other holders)."""
    tensors: dict[str, np.ndarray] = {}
    for k, x in model.w.items():
        tensors[f"w.{k}.a"], tensors[f"w.{k}.b"] = x.a.astype(np.uint64), x.b.astype(np.uint64)
    tensors["graph"] = np.asarray(A, dtype=np.float64)
    meta: dict[str, Any] = {
        "model": HOLDER_PART, "dataset": dataset, "owners": list(owners), "holder": int(holder),
        "widths": [shape.width] * shape.n, "d": shape.d, "hidden": shape.hidden, "n_classes": shape.classes,
        "classes": list(range(shape.classes)), "align": shape.align, "frac_bits": F,
        "weights": sorted(model.w),
        "holds": "this holder's pair of a 2-of-3 replicated sharing over Z_2^64 of each trained weight (uniform "
                 "words alone: never the opened weights) and the public normalised graph Â",
        "needs": "the two other holders' parts and the owners' h as replicated shares (fedhet predict)"}
    return tensors, meta


def load_holder(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> SharedPart:
    widths = [int(w) for w in meta["widths"]]
    shape = Shape(len(widths), widths[0], int(meta["d"]), int(meta["hidden"]), int(meta["n_classes"]),
                  str(meta["align"]))
    want = shape.params()
    w = {}
    for k in meta["weights"]:
        a, b = np.asarray(tensors[f"w.{k}.a"]), np.asarray(tensors[f"w.{k}.b"])
        if k not in want or a.shape != want[k][0] or b.shape != a.shape or a.dtype != np.uint64:
            raise ValueError(f"f3: holder part's weight {k!r}: {a.dtype} {a.shape}, expected uint64 "
                             f"{want[k][0] if k in want else 'no such weight'}")
        w[k] = rs.Rss(a, b)
    if set(w) != set(want):
        raise ValueError(f"f3: holder part holds weights {sorted(w)}, the model needs {sorted(want)}")
    A = np.asarray(tensors["graph"], dtype=np.float64)
    if A.shape != (shape.n, shape.n):
        raise ValueError(f"f3: holder part's graph {A.shape}, expected ({shape.n}, {shape.n})")
    return SharedPart(SharedModel(w, {}), shape, A)


def load_model(meta: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> Any:
    """The scoring module of an F³ part (``meta["model"]``: "f3/owner", "f3/coordinator"; or "f3/holder-shares",
    a holder's shares, which score only on shares with the other holders')."""
    kind = meta.get("model")
    if kind == "f3/owner":
        return load_owner(meta, tensors)
    if kind == "f3/coordinator":
        return load_coordinator(meta, tensors)
    if kind == HOLDER_PART:
        return load_holder(meta, tensors)
    raise ValueError(f"f3: unknown part {kind!r} (f3/owner, f3/coordinator, {HOLDER_PART})")
