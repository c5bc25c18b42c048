"""Matched averaging of MLPs whose inputs cover different coordinates (HyFEM Eq. (8)).

HyFEM (Zhang, Yin, Hong & Chen, "Hybrid Federated Learning: Algorithms and Implementation")
merges the clients' local inference models w_m into one global model theta_0 by solving

    min_{theta_0, {Pi_m}}  sum_m dist(Pi_m theta_0, w_m),   Pi_m 1 = 1, Pi_m >= 0      (8)

with dist = squared Euclidean distance, by block coordinate descent (Algorithm 1, "Global
Matching Updates"): P passes, each picks a client m' at random, solves Pi_m' layer by layer
with the Hungarian algorithm (``scipy.optimize.linear_sum_assignment``) against the current
theta_0, then recomputes theta_0 given every Pi_m.  This is the matched averaging of PFNM
(Yurochkin et al. 2019) and FedMA (Wang et al. 2020), with a plain distance cost in place of
their Bayesian one.

Equations -> functions:

* Pi_m-step of (8)            -> :func:`match_client` (one client, every hidden layer in turn)
* theta_0-step of (8)         -> :func:`matched_mean`
* the whole block (P passes)  -> :func:`matched_averaging`
* w_m = Pi_m theta_0 (Alg. 1) -> :func:`project`

Representation.  An MLP is a list of layers ``[(W_1, b_1), ..., (W_L, b_L)]`` with ``W_l`` of
shape (out, in) (the torch convention) and an activation after every layer but the last; the
last layer maps to the classes and is never permuted.  Pi_m is stored as one int array per
hidden layer, ``assignment[l][j] = k``: the client's neuron j of hidden layer l is the global
neuron k (row j of Pi_m has its 1 in column k).  Within a client the map is injective.

Hybrid inputs.  The global first layer takes all ``n_inputs`` coordinates (every view's
embedding, concatenated); a client's first layer takes only ``input_columns[m]`` (the global
columns of the views it holds, in that order).  Conceptually the client's model is zero-padded
to the global input width, but a padded coordinate is *not counted*: the average of each weight
runs over the clients that hold that coordinate (per-coordinate counts), so a view held by one
client takes that client's weights instead of being pulled toward zero.  A global weight that no
client covers is left where it was (Eq. (8) does not determine it).

Choices the paper leaves open (its "technical details" were skipped for space):

* cost between client neuron j and global neuron k: squared distance of the neuron's incoming
  weights (over the coordinates the client has) and bias, plus, for the last hidden layer, its
  outgoing weights to the classes (``match_outgoing``; PFNM matches one-hidden-layer nets so);
* dummy neurons: the paper pads "dummy neurons with zero weights".  A client neuron may open a
  new global neuron instead of taking an existing one at the cost ``threshold * |a_j|^2``
  (``threshold_mode="relative"``: the distance to a zero-weight dummy neuron when threshold = 1,
  the default) or at the fixed cost ``threshold`` (``"absolute"``); ``threshold=inf`` never
  grows the layer.  ``max_width`` caps the global width of every hidden layer;
* global neurons that no client maps to after the passes are dropped (``prune``), so theta_0
  is the union of the matched neurons (PFNM's global model);
* P defaults to 2 M; clients that have no assignment yet are matched first, in random order.

Pure numpy/scipy; everything random comes from the ``seed`` given.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from scipy.optimize import linear_sum_assignment

from fedhet.algorithms.toolkit import Stream, stream_rng

Layer = tuple[np.ndarray, np.ndarray]
Layers = list[Layer]
Assignment = list[np.ndarray]  # one int64 array per hidden layer


@dataclass(frozen=True)
class MatchSettings:
    """Settings of the matched averaging (Eq. (8)); see the module docstring."""

    passes: int | None = None          # P; None -> 2 * number of clients
    threshold: float = 1.0             # cost of opening a new (dummy) global neuron
    threshold_mode: str = "relative"   # "relative" (x |a_j|^2) or "absolute"
    max_width: int | None = None       # cap on every global hidden layer's width; None = no cap
    match_outgoing: bool = True        # last hidden layer: include outgoing weights in the cost
    prune: bool = True                 # drop global neurons no client maps to

    def __post_init__(self) -> None:
        if self.passes is not None and (isinstance(self.passes, bool) or int(self.passes) != self.passes
                                        or self.passes < 0):
            raise ValueError(f"matching passes must be an integer >= 0 or None, got {self.passes!r}")
        if not (float(self.threshold) >= 0):
            raise ValueError(f"matching threshold must be >= 0 (inf allowed), got {self.threshold!r}")
        if self.threshold_mode not in ("relative", "absolute"):
            raise ValueError(f"matching threshold_mode must be 'relative' or 'absolute', "
                             f"got {self.threshold_mode!r}")
        if self.max_width is not None and (isinstance(self.max_width, bool)
                                           or int(self.max_width) != self.max_width
                                           or self.max_width < 1):
            raise ValueError(f"matching max_width must be a positive integer or None, "
                             f"got {self.max_width!r}")


@dataclass
class MatchResult:
    """theta_0 after the passes, every client's Pi_m, and what happened."""

    layers: Layers
    assignments: list[Assignment]
    picked: list[int] = field(default_factory=list)   # client matched at each pass, in order
    cost: float = 0.0                                 # sum_m dist(Pi_m theta_0, w_m) at the end
    grown: int = 0                                    # new global neurons opened over the passes
    pruned: int = 0                                   # global neurons dropped at the end


# ------------------------------------------------------------------------------ checks, helpers

def check_layers(name: str, layers: Sequence[Layer]) -> Layers:
    """float64 copies of ``layers`` after checking the shapes chain; a clear error if not."""
    if len(layers) < 1:
        raise ValueError(f"{name}: an MLP needs at least one layer")
    out: Layers = []
    prev = None
    for i, lay in enumerate(layers):
        if len(lay) != 2:
            raise ValueError(f"{name}: layer {i} must be a (W, b) pair")
        W = np.array(lay[0], dtype=np.float64)
        b = np.array(lay[1], dtype=np.float64)
        if W.ndim != 2 or b.ndim != 1 or b.shape[0] != W.shape[0]:
            raise ValueError(f"{name}: layer {i} has W {W.shape} and b {b.shape}; "
                             "need W (out, in) and b (out,)")
        if prev is not None and W.shape[1] != prev:
            raise ValueError(f"{name}: layer {i} takes {W.shape[1]} inputs but layer {i - 1} "
                             f"gives {prev}")
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise ValueError(f"{name}: layer {i} contains NaN or inf")
        out.append((W, b))
        prev = W.shape[0]
    return out


def hidden_widths(layers: Sequence[Layer]) -> list[int]:
    return [int(W.shape[0]) for W, _ in layers[:-1]]


def forward(layers: Sequence[Layer], x: np.ndarray, activation: str = "relu") -> np.ndarray:
    """The MLP's outputs (logits) on rows ``x``: activation after every layer but the last."""
    acts: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "relu": lambda z: np.maximum(z, 0.0), "tanh": np.tanh, "identity": lambda z: z}
    if activation not in acts:
        raise ValueError(f"unknown activation {activation!r}; choose one of {sorted(acts)}")
    h = np.asarray(x, dtype=np.float64)
    for i, (W, b) in enumerate(layers):
        h = h @ np.asarray(W, dtype=np.float64).T + b
        if i < len(layers) - 1:
            h = acts[activation](h)
    return h


def permute_hidden(layers: Sequence[Layer], perms: Sequence[np.ndarray]) -> Layers:
    """The same function with hidden neurons reordered: new neuron i of hidden layer l is old
    neuron ``perms[l][i]`` (the next layer's columns follow)."""
    lays = check_layers("layers", layers)
    if len(perms) != len(lays) - 1:
        raise ValueError(f"need {len(lays) - 1} permutations (one per hidden layer), got {len(perms)}")
    out = [(W.copy(), b.copy()) for W, b in lays]
    for l, p in enumerate(perms):
        p = np.asarray(p, dtype=np.int64)
        if sorted(p.tolist()) != list(range(out[l][0].shape[0])):
            raise ValueError(f"perms[{l}] is not a permutation of {out[l][0].shape[0]} neurons")
        W, b = out[l]
        out[l] = (W[p], b[p])
        Wn, bn = out[l + 1]
        out[l + 1] = (Wn[:, p], bn)
    return out


def assignment_matrix(assignment: np.ndarray, global_width: int) -> np.ndarray:
    """Pi_m of one layer as the dense 0/1 (local width x global width) matrix of Eq. (8)."""
    a = np.asarray(assignment, dtype=np.int64)
    P = np.zeros((a.shape[0], int(global_width)))
    P[np.arange(a.shape[0]), a] = 1.0
    return P


def _check_columns(input_columns: Sequence[np.ndarray], n_inputs: int,
                   clients: Sequence[Layers]) -> list[np.ndarray]:
    out = []
    for m, (cols, lays) in enumerate(zip(input_columns, clients)):
        c = np.asarray(cols, dtype=np.int64)
        if c.ndim != 1 or len(np.unique(c)) != len(c):
            raise ValueError(f"client {m}: input_columns must be distinct global column indices")
        if len(c) and (c.min() < 0 or c.max() >= n_inputs):
            raise ValueError(f"client {m}: input_columns outside 0..{n_inputs - 1}")
        if lays[0][0].shape[1] != len(c):
            raise ValueError(f"client {m}: first layer takes {lays[0][0].shape[1]} inputs but "
                             f"input_columns lists {len(c)}")
        out.append(c)
    return out


def _check_assignment(m: int, assign: Assignment, client: Layers, global_layers: Layers) -> None:
    widths = hidden_widths(client)
    gwidths = hidden_widths(global_layers)
    if len(assign) != len(widths):
        raise ValueError(f"client {m}: assignment has {len(assign)} layers, model has {len(widths)} "
                         "hidden layers")
    for l, (a, w, g) in enumerate(zip(assign, widths, gwidths)):
        if a.shape != (w,) or len(np.unique(a)) != w or (w and (a.min() < 0 or a.max() >= g)):
            raise ValueError(f"client {m}: assignment of hidden layer {l} must map its {w} neurons "
                             f"to distinct global neurons in 0..{g - 1}")


# ------------------------------------------------------------------------------ theta_0-step

def matched_mean(global_layers: Sequence[Layer], clients: Sequence[Sequence[Layer]],
                 input_columns: Sequence[np.ndarray], assignments: Sequence[Assignment | None],
                 weights: Sequence[float] | None = None) -> Layers:
    """theta_0 = argmin sum_m dist(Pi_m theta_0, w_m) given every Pi_m (Eq. (8)).

    Each global weight is the (weighted) mean of the client weights mapped onto it, over the
    clients that hold its input coordinate; a weight no client covers keeps its current value.
    Clients whose assignment is ``None`` are left out.
    """
    glob = check_layers("global model", global_layers)
    cl = [check_layers(f"client {m} model", c) for m, c in enumerate(clients)]
    n_inputs = glob[0][0].shape[1]
    cols = _check_columns(input_columns, n_inputs, cl)
    if len(assignments) != len(cl):
        raise ValueError(f"{len(assignments)} assignments for {len(cl)} clients")
    om = np.ones(len(cl)) if weights is None else np.asarray(weights, dtype=np.float64)
    if om.shape != (len(cl),) or (om <= 0).any() or not np.isfinite(om).all():
        raise ValueError(f"weights must be {len(cl)} positive numbers, got {weights!r}")
    L = len(glob)
    out: Layers = []
    for l in range(L):
        G_W, G_b = glob[l]
        num_W, cnt_W = np.zeros_like(G_W), np.zeros_like(G_W)
        num_b, cnt_b = np.zeros_like(G_b), np.zeros_like(G_b)
        for m, (lays, a) in enumerate(zip(cl, assignments)):
            if a is None:
                continue
            if l == 0:
                _check_assignment(m, a, lays, glob)
            rows = a[l] if l < L - 1 else np.arange(G_W.shape[0])
            in_cols = cols[m] if l == 0 else a[l - 1]
            W, b = lays[l]
            # rows and in_cols are each duplicate-free, so fancy-index += adds every entry once.
            num_W[np.ix_(rows, in_cols)] += om[m] * W
            cnt_W[np.ix_(rows, in_cols)] += om[m]
            num_b[rows] += om[m] * b
            cnt_b[rows] += om[m]
        W_new = np.where(cnt_W > 0, num_W / np.where(cnt_W > 0, cnt_W, 1.0), G_W)
        b_new = np.where(cnt_b > 0, num_b / np.where(cnt_b > 0, cnt_b, 1.0), G_b)
        out.append((W_new, b_new))
    return out


# ------------------------------------------------------------------------------ Pi_m-step

def _grow(layers: Layers, l: int, n_new: int) -> Layers:
    """Append ``n_new`` zero-weight (dummy) neurons to hidden layer l."""
    if n_new == 0:
        return layers
    out = list(layers)
    W, b = out[l]
    out[l] = (np.vstack([W, np.zeros((n_new, W.shape[1]))]), np.concatenate([b, np.zeros(n_new)]))
    Wn, bn = out[l + 1]
    out[l + 1] = (np.hstack([Wn, np.zeros((Wn.shape[0], n_new))]), bn)
    return out


def _neuron_vectors(lays: Layers, l: int, cols: np.ndarray, outgoing: bool,
                    glob: Layers) -> tuple[np.ndarray, np.ndarray]:
    """(client neuron vectors, global neuron vectors over the same coordinates) for layer l."""
    W, b = lays[l]
    G_W, G_b = glob[l]
    a = [W, b[:, None]]
    g = [G_W[:, cols], G_b[:, None]]
    if outgoing:
        a.append(lays[l + 1][0].T)
        g.append(glob[l + 1][0].T)
    return np.hstack(a), np.hstack(g)


def match_client(global_layers: Sequence[Layer], client: Sequence[Layer], input_columns: np.ndarray,
                 settings: MatchSettings = MatchSettings()) -> tuple[Assignment, Layers, int]:
    """Pi_m = argmin dist(Pi_m theta_0, w_m) for one client, hidden layer by hidden layer.

    Layer l is matched on the coordinates the client has: its input columns for l = 0, the
    global neurons its layer l-1 was just matched to otherwise.  Returns (assignment, the global
    layers with any new zero-weight neurons appended, number of neurons opened).  The new
    neurons get their values from the next :func:`matched_mean`.
    """
    glob = check_layers("global model", global_layers)
    lays = check_layers("client model", client)
    cols = _check_columns([input_columns], glob[0][0].shape[1], [lays])[0]
    if lays[-1][0].shape[0] != glob[-1][0].shape[0]:
        raise ValueError(f"client model has {lays[-1][0].shape[0]} outputs, global model "
                         f"{glob[-1][0].shape[0]}")
    if len(lays) != len(glob):
        raise ValueError(f"client model has {len(lays)} layers, global model {len(glob)}")
    L = len(glob)
    assign: Assignment = []
    grown = 0
    prev = cols
    for l in range(L - 1):
        outgoing = settings.match_outgoing and l == L - 2
        a_vec, g_vec = _neuron_vectors(lays, l, prev, outgoing, glob)
        n_local, K = a_vec.shape[0], g_vec.shape[0]
        # |a_j - g_k|^2 without forming the (n_local, K, dim) difference tensor
        cost = ((a_vec ** 2).sum(1)[:, None] + (g_vec ** 2).sum(1)[None, :]
                - 2.0 * a_vec @ g_vec.T)
        cost = np.maximum(cost, 0.0)
        cap = math.inf if settings.max_width is None else int(settings.max_width)
        slots = 0 if math.isinf(settings.threshold) else int(min(n_local, max(cap - K, 0)))
        if K + slots < n_local:
            raise ValueError(f"hidden layer {l}: the client has {n_local} neurons but the global "
                             f"layer has {K} and max_width {settings.max_width} allows no more; "
                             "raise max_width or the threshold")
        if slots:
            if settings.threshold_mode == "relative":
                new_cost = settings.threshold * (a_vec ** 2).sum(1)
            else:
                new_cost = np.full(n_local, float(settings.threshold))
            cost = np.hstack([cost, np.repeat(new_cost[:, None], slots, axis=1)])
        rows, picked = linear_sum_assignment(cost)
        a = np.empty(n_local, dtype=np.int64)
        a[rows] = picked
        new = a >= K
        n_new = int(new.sum())
        # the slots are interchangeable: number the new neurons K, K+1, ... in local order
        a[new] = K + np.arange(n_new)
        glob = _grow(glob, l, n_new)
        grown += n_new
        assign.append(a)
        prev = a
    return assign, glob, grown


def project(global_layers: Sequence[Layer], assignment: Assignment,
            input_columns: np.ndarray) -> Layers:
    """w_m = Pi_m theta_0: the global neurons the client's neurons map to, restricted to the
    input columns the client has (what the server sends back, Algorithm 1's last line)."""
    glob = check_layers("global model", global_layers)
    cols = np.asarray(input_columns, dtype=np.int64)
    L = len(glob)
    if len(assignment) != L - 1:
        raise ValueError(f"assignment has {len(assignment)} layers for {L - 1} hidden layers")
    out: Layers = []
    prev = cols
    for l in range(L):
        W, b = glob[l]
        rows = np.asarray(assignment[l], dtype=np.int64) if l < L - 1 else np.arange(W.shape[0])
        if len(rows) and (rows.min() < 0 or rows.max() >= W.shape[0]):
            raise ValueError(f"assignment of hidden layer {l} points outside the global "
                             f"layer's {W.shape[0]} neurons")
        out.append((W[np.ix_(rows, prev)].copy(), b[rows].copy()))
        prev = rows
    return out


def matching_cost(global_layers: Sequence[Layer], clients: Sequence[Sequence[Layer]],
                  input_columns: Sequence[np.ndarray], assignments: Sequence[Assignment]) -> float:
    """sum_m dist(Pi_m theta_0, w_m) (the objective of Eq. (8), unweighted)."""
    total = 0.0
    for lays, cols, a in zip(clients, input_columns, assignments):
        proj = project(global_layers, a, cols)
        for (W, b), (P, q) in zip(check_layers("client model", lays), proj):
            total += float(((W - P) ** 2).sum() + ((b - q) ** 2).sum())
    return total


def prune_unmatched(global_layers: Sequence[Layer],
                    assignments: Sequence[Assignment | None]) -> tuple[Layers, list[Assignment | None], int]:
    """Drop global hidden neurons that no client maps to; renumber the assignments."""
    glob = check_layers("global model", global_layers)
    L = len(glob)
    assigns = [None if a is None else [np.asarray(x, dtype=np.int64).copy() for x in a]
               for a in assignments]
    dropped = 0
    for l in range(L - 1):
        used = np.zeros(glob[l][0].shape[0], dtype=bool)
        for a in assigns:
            if a is not None:
                used[a[l]] = True
        if used.all():
            continue
        keep = np.flatnonzero(used)
        renum = np.full(used.shape[0], -1, dtype=np.int64)
        renum[keep] = np.arange(len(keep))
        W, b = glob[l]
        glob[l] = (W[keep], b[keep])
        Wn, bn = glob[l + 1]
        glob[l + 1] = (Wn[:, keep], bn)
        for a in assigns:
            if a is not None:
                a[l] = renum[a[l]]
        dropped += int((~used).sum())
    return glob, assigns, dropped


# ------------------------------------------------------------------------------ the block

def matched_averaging(global_layers: Sequence[Layer] | None, clients: Sequence[Sequence[Layer]],
                      input_columns: Sequence[np.ndarray], n_inputs: int | None = None,
                      assignments: Sequence[Assignment | None] | None = None,
                      settings: MatchSettings = MatchSettings(), seed: int = 0,
                      weights: Sequence[float] | None = None) -> MatchResult:
    """The global matching updates of Algorithm 1 (Eq. (8)).

    ``global_layers`` is the current theta_0 (None: start from nothing; ``n_inputs`` then gives
    the global input width).  ``assignments[m]`` is client m's current Pi_m (None: not matched
    yet; such clients are matched first).  Then P passes: pick a client at random, re-solve its
    Pi_m against theta_0 (:func:`match_client`), recompute theta_0 (:func:`matched_mean`).
    """
    M = len(clients)
    if M < 1:
        raise ValueError("matched averaging needs at least one client model")
    cl = [check_layers(f"client {m} model", c) for m, c in enumerate(clients)]
    if len(input_columns) != M:
        raise ValueError(f"{len(input_columns)} input_columns for {M} clients")
    if global_layers is None:
        if n_inputs is None:
            raise ValueError("n_inputs is needed when there is no global model yet")
        n_out = cl[0][-1][0].shape[0]
        widths = [0] * (len(cl[0]) - 1)
        dims = [int(n_inputs)] + widths + [n_out]
        glob = [(np.zeros((dims[i + 1], dims[i])), np.zeros(dims[i + 1])) for i in range(len(dims) - 1)]
    else:
        glob = check_layers("global model", global_layers)
        if n_inputs is not None and glob[0][0].shape[1] != n_inputs:
            raise ValueError(f"global model takes {glob[0][0].shape[1]} inputs, n_inputs={n_inputs}")
    cols = _check_columns(input_columns, glob[0][0].shape[1], cl)
    assigns: list[Assignment | None] = (
        [None] * M if assignments is None
        else [None if a is None else [np.asarray(x, dtype=np.int64) for x in a] for a in assignments])
    if len(assigns) != M:
        raise ValueError(f"{len(assigns)} assignments for {M} clients")
    for m, a in enumerate(assigns):
        if a is not None:
            _check_assignment(m, a, cl[m], glob)
    rng = stream_rng(seed, Stream.MATCHING_TIES)
    P = 2 * M if settings.passes is None else int(settings.passes)
    first = [int(m) for m in rng.permutation(M) if assigns[m] is None]
    order = first + [int(m) for m in rng.integers(0, M, size=P)]
    grown = 0
    for m in order:
        a, glob, n_new = match_client(glob, cl[m], cols[m], settings)
        grown += n_new
        assigns[m] = a
        glob = matched_mean(glob, cl, cols, assigns, weights)
    pruned = 0
    if settings.prune:
        glob, assigns, pruned = prune_unmatched(glob, assigns)
    done = [a for a in assigns if a is not None]
    assert len(done) == M  # every client unmatched at the start is matched first
    cost = matching_cost(glob, cl, cols, done)
    return MatchResult(glob, done, order, cost, grown, pruned)
