"""MMVFL numerical core: l2,1 feature selection with pseudo-labels shared through a server.

Feng, Yu & Zhu, "MMVFL: A Simple Vertical Federated Learning Framework for
Multi-Class Multi-Participant Scenarios" (Sensors 2024).  K participants hold
views X_k (N x d_k) of the same rows; participant 1 (index 0 here) also holds
the one-hot labels Y.  Each learns W_k (d_k x Nc) and a pseudo-label matrix
Z_k (N x Nc); the server keeps Z.  No networking here: every step is a pure
function, so the federated roles and the centralised oracle
(:func:`run_centralized`) run exactly the same code.

Equations (numbering of the paper's Section 3.4 / 5.2) -> functions:

- Eq. (3), the relaxed objective
  ``sum_k ||X_k W_k - Z_k||_F^2 + beta ||W_k||_{2,1} + zeta_k ||Z_k - Z||_F^2
  + eta ||Z_1 - Y||_F^2``  -> :func:`objective_terms` (one participant's
  share; the sum over participants is the objective, so it can be
  aggregated like Z) and :func:`should_stop` (the stopping rule).  (Issue 14
  calls this "Eq. (5)"; the paper's Eq. (5) is the W_k subproblem in trace
  form, ``||X_k W_k - Z_k||^2 + beta Tr(W_k^T A_k W_k)``, whose A_k changes
  every step, so Eq. (3) is what is tracked.)
- Eq. (4)/(5), the reweighting ``A_k = diag(1 / (2 (||W_k^(i)||_2 + eps)))``
  -> :func:`reweighting_diagonal`.
- Eq. (6), ``W_k = (X_k^T X_k + beta A_k)^-1 X_k^T Z_k``, alternated with
  Eq. (4) in an inner loop -> :func:`update_w` (solvers :func:`solve_cholesky`,
  :func:`solve_woodbury`, chosen by :func:`choose_solver`).
- Eq. (7) and the two closed forms under it: ``Z_1 = (X_1 W_1 + zeta Z +
  eta Y) / (1 + zeta + eta)``, ``Z_k = (X_k W_k + zeta Z) / (1 + zeta)``
  -> :func:`update_z_view`.
- Eq. (8), ``Z = sum_k zeta_k Z_k / sum_k zeta_k`` -> :func:`z_contribution`
  (participant: ``zeta_k Z_k``) + :func:`sum_contributions` (what plain or
  secure aggregation computes) + :func:`combine_z` (server: one division).
  With ``fedhet.protocols.secagg`` a participant submits Z_k with weight
  zeta_k; the server gets ``sum zeta_k Z_k`` and ``sum zeta_k`` and calls
  :func:`combine_z` on them.  With zeta = eta = 1000, Z_k is a convex
  combination of Z and Y plus X_k W_k / (1 + zeta + ...), so it stays near
  [0, 1] (measured over every round, Handwritten / Isolet / MSRC-v5 fold 0,
  beta 1e-5 and 10: within [-0.007, 1.0]); a clip of 2 is ample.
- Section 3.2 scores ``S_k^i = ||W_k^(i)||_2`` -> :func:`feature_scores`,
  top p % -> :func:`top_features`; classification -> :func:`knn_predict`,
  :func:`selection_accuracy`.
- Eq. (9) supFL -> :func:`fit_supfl`; Eq. (10) supMVLFL -> :func:`fit_supmvlfl`.

Role-level steps (what a party process calls, in this order per round):
:func:`init_participant` once; per round :func:`participant_z_step`
(returns the contribution to aggregate), server :func:`combine_z`,
:func:`participant_w_step` (returns the objective terms to aggregate),
server :func:`should_stop`.

Choices the paper leaves open (all in :class:`MMVFLSettings`):

- **Order and initialisation.**  W_k^0 is drawn N(0, 1/d_k) from
  ``numpy.random.default_rng([seed, k])`` (each participant can draw its own
  locally); the server starts from Z^0 = 0 (it knows nothing).  One round is:
  Z_k-step (Eq. (7)) with the current W_k and Z, Z-step (Eq. (8)), then the
  W_k-step (Eq. (6), ``inner_iters`` reweighting iterations warm-started from
  the current W_k).  After the W_k-step every participant holds W_k, Z_k and Z,
  so its objective term for the round is computed locally.
- **Rows without labels.**  The label term applies only to rows in the label
  holder's ``label_mask``: Z_1 = (X_1W_1 + zeta Z + eta m Y) / (1 + zeta +
  eta m) row-wise, m in {0, 1}, which is the exact minimiser of Eq. (3) with
  ``eta ||M (Z_1 - Y)||^2``.  By default (``rows="train"``) the optimisation
  runs on the training rows only, all labelled, exactly as in the paper
  (Y is N x Nc there); ``rows="all"`` keeps validation rows in (transductive)
  with m = 0 on them.  With zeta = 1000 unlabelled rows move by ~1/zeta per
  round, so "all" is only useful with a small zeta.
- **eps** (paper: "a small constant") = 1e-8.  Note: the paper writes
  ``1 / (2 (||w|| + eps))``; this is exactly a majorise-minimise step for the
  smoothed penalty ``h(t) = t - eps ln(1 + t/eps)`` (h(t) = g(t^2), g concave,
  g'(s) = 1 / (2 (sqrt(s) + eps))).  So the iteration provably never
  increases Eq. (3) with ``||W||_{2,1}`` replaced by ``sum_i h(||W^(i)||)``
  (``smoothed`` in the trace); Eq. (3) itself differs from it by at most
  ``beta eps sum_i ln(1 + ||W^(i)||/eps)`` (~1e-6 relative), so it can rise
  by that much from one round to the next but not more.  The stopping rule
  uses the smoothed objective.
- **Solver.**  ``"cholesky"``: factor ``X^T X + beta A`` (d x d; X^T X is
  formed once).  ``"woodbury"``: ``(X^T X + beta A)^-1 X^T = A^-1 X^T
  (X A^-1 X^T + beta I)^-1`` (N x N; from ``(X^T X + beta A) A^-1 X^T =
  X^T (X A^-1 X^T + beta I)``).  ``"auto"`` takes Woodbury iff d_k > N
  (:func:`choose_solver`; ``benchmarks/mmvfl_solve.py`` times both on the
  paper's shapes: the rule picked the faster one on all of them).
- **Classifier** (the paper leaves it open): k-NN with Euclidean distance,
  ``knn_k = 1`` by default (no parameter to tune, the usual choice for
  evaluating feature selection), on each participant's selected features of
  its training rows; labels are the true labels for the label holder and the
  baselines, ``argmax Z_k`` (:func:`pseudo_labels`) for the others.
- **Scaling.**  The paper does not say; :func:`fit_standardizer` /
  :func:`standardize` z-score each feature with the participant's own
  training rows (callers apply it before the loop; :func:`run_centralized`
  takes the views as given).
- **supMVLFL (Eq. (10)).**  Read literally, ``sum_k ||X_k W_k - Y||^2 +
  beta ||W_k||_{2,1}`` separates into K independent supFL problems and would be
  identical to supFL, yet the paper reports it differing; we read it as the
  views predicting Y jointly, ``||sum_k X_k W_k - Y||^2 + beta sum_k
  ||W_k||_{2,1}`` (= supFL on the concatenated views, the l2,1 norm of the
  stacked W being the sum of the per-view norms), scored per view.

All arithmetic is float64.  The solves are small: with several party
processes on one machine, limit BLAS to one thread each (threadpoolctl); on
a busy 2-core machine multi-threaded OpenBLAS made them 35x slower.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np
from scipy.linalg import cho_factor, cho_solve

from fedhet.algorithms.party_table import check_finite

__all__ = [
    "MMVFLSettings", "SOLVERS", "ROW_MODES", "OBJECTIVE_FIELDS",
    "ViewSystem", "prepare_view", "solver_costs", "choose_solver",
    "reweighting_diagonal", "solve_cholesky", "solve_woodbury", "solve_w",
    "WUpdate", "update_w", "init_w", "initial_z",
    "update_z_view", "z_contribution", "sum_contributions", "combine_z", "zeta_total",
    "l21_norm", "l21_smoothed", "objective_terms", "should_stop",
    "ParticipantState", "init_participant", "participant_z_step", "participant_w_step",
    "MMVFLResult", "run_centralized", "one_hot",
    "fit_standardizer", "standardize",
    "feature_scores", "n_selected", "top_features", "pseudo_labels",
    "knn_predict", "selection_accuracy",
    "L21Fit", "fit_l21", "fit_supfl", "fit_supmvlfl",
]

SOLVERS = ("auto", "cholesky", "woodbury")
ROW_MODES = ("train", "all")
# The two numbers each participant contributes per round, summed over participants.
OBJECTIVE_FIELDS = ("eq3", "smoothed")


@dataclass(frozen=True)
class MMVFLSettings:
    """Every knob of MMVFL and its evaluation (paper values where it gives them).

    beta, zeta, eta: Eq. (3) (paper: beta in {1e-5 ... 10}, zeta = eta = 1000,
    zeta_k = zeta for all k).  epsilon: Eq. (4).  max_iter / tol: outer rounds
    and relative change of the smoothed objective that stops them.
    inner_iters / inner_tol: reweighting steps per W-update (Eq. (4) <-> 6);
    ``inner_tol > 0`` stops earlier once W changes by less than that
    (relative, Frobenius).  w_tol: the baselines (Eqs. (9), (10)) reweight until W
    moves by at most that, relative, or ``max_iter`` steps (IRLS converges
    linearly: on Relathe / MSRC views with d > N, 1e-4 takes 90-340 steps and
    keeps >= 99 % of the top-10 % features of a 400-step fit; 1e-6 does not
    converge in 400).  solver: "auto" | "cholesky" |
    "woodbury".  seed: W_k^0.  rows: "train" | "all" (see module docstring).
    knn_k: neighbours of the k-NN classifier.
    """

    beta: float = 1e-2
    zeta: float = 1000.0
    eta: float = 1000.0
    epsilon: float = 1e-8
    max_iter: int = 200
    tol: float = 1e-6
    inner_iters: int = 3
    inner_tol: float = 0.0
    w_tol: float = 1e-4
    solver: str = "auto"
    seed: int = 0
    rows: str = "train"
    knn_k: int = 1

    def __post_init__(self):
        for name in ("beta", "zeta", "epsilon"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"MMVFLSettings.{name} must be a finite number > 0, got {v!r}")
        if not (isinstance(self.eta, (int, float)) and math.isfinite(self.eta) and self.eta >= 0):
            raise ValueError(f"MMVFLSettings.eta must be a finite number >= 0, got {self.eta!r}")
        for name in ("max_iter", "inner_iters", "knn_k"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"MMVFLSettings.{name} must be an int >= 1, got {v!r}")
        for name in ("tol", "inner_tol", "w_tol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"MMVFLSettings.{name} must be a finite number >= 0, got {v!r}")
        if self.solver not in SOLVERS:
            raise ValueError(f"MMVFLSettings.solver must be one of {SOLVERS}, got {self.solver!r}")
        if self.rows not in ROW_MODES:
            raise ValueError(f"MMVFLSettings.rows must be one of {ROW_MODES}, got {self.rows!r}")
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and self.seed >= 0):
            raise ValueError(f"MMVFLSettings.seed must be an int >= 0, got {self.seed!r}")


# ---------------------------------------------------------------- helpers
def _as_matrix(a, what: str, rows: int | None = None, cols: int | None = None) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{what} must be a 2-D array, got shape {a.shape}")
    if rows is not None and a.shape[0] != rows:
        raise ValueError(f"{what} has {a.shape[0]} rows, expected {rows}")
    if cols is not None and a.shape[1] != cols:
        raise ValueError(f"{what} has {a.shape[1]} columns, expected {cols}")
    check_finite(a, argument=what)  # DataFileError (a ValueError) naming the row and column
    return a


def one_hot(labels, n_classes: int) -> np.ndarray:
    """Labels 0..n_classes-1 -> float64 one-hot rows."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise ValueError(f"labels must lie in 0..{n_classes - 1}, got {labels.min()}..{labels.max()}")
    out = np.zeros((labels.size, n_classes))
    out[np.arange(labels.size), labels.astype(np.int64)] = 1.0
    return out


# ---------------------------------------------------------------- solvers
def solver_costs(n_rows: int, n_features: int, n_classes: int) -> dict[str, float]:
    """Multiply-adds of one reweighting step (Eq. (6)) for each solver.

    cholesky: factor d x d (d^3/6) + solve (d^2 C) + add the diagonal (d^2);
    X^T X (N d^2 / 2) and X^T Z are formed once per W-update, not counted.
    woodbury: X A^-1 X^T (N^2 d / 2, symmetric) + factor N x N (N^3/6) +
    solve (N^2 C) + back-project (N d C)."""
    n, d, c = float(n_rows), float(n_features), float(n_classes)
    return {
        "cholesky": d ** 3 / 6 + d * d * c + d * d,
        "woodbury": n * n * d / 2 + n ** 3 / 6 + n * n * c + n * d * c,
    }


def choose_solver(n_rows: int, n_features: int, n_classes: int, solver: str = "auto") -> str:
    """The solver "auto" resolves to for this shape: Woodbury iff d > N (the smaller system).

    :func:`solver_costs` puts the crossover near d = 1.9 N, but measured
    (``benchmarks/mmvfl_solve.py``, one BLAS thread) a Woodbury step runs
    faster per flop (one symmetric product and a small factorisation against
    one large factorisation): d > N picked the faster solver on all 20 shapes
    there (every view of the four datasets and their concatenations), where
    the flop model missed 4.  ``n_classes`` is accepted for that model."""
    if solver not in SOLVERS:
        raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
    if solver != "auto":
        return solver
    return "woodbury" if n_features > n_rows else "cholesky"


@dataclass(frozen=True, eq=False)
class ViewSystem:
    """One participant's data prepared for Eq. (6): X (float64), its Gram matrix when needed."""

    X: np.ndarray
    solver: str                      # resolved: "cholesky" | "woodbury"
    gram: np.ndarray | None = None   # X^T X, only for the Cholesky form

    @property
    def n_rows(self) -> int:
        return self.X.shape[0]

    @property
    def n_features(self) -> int:
        return self.X.shape[1]


def prepare_view(X, n_classes: int, solver: str = "auto", name: str = "X") -> ViewSystem:
    """Validate X, resolve the solver for its shape, form X^T X when Cholesky is used."""
    X = np.ascontiguousarray(_as_matrix(X, name))
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {X.shape})")
    resolved = choose_solver(X.shape[0], X.shape[1], n_classes, solver)
    gram = X.T @ X if resolved == "cholesky" else None
    return ViewSystem(X=X, solver=resolved, gram=gram)


def reweighting_diagonal(W: np.ndarray, epsilon: float) -> np.ndarray:
    """Eq. (4): the diagonal of A = 1 / (2 (||W^(i)||_2 + eps))."""
    return 1.0 / (2.0 * (np.linalg.norm(W, axis=1) + epsilon))


def solve_cholesky(system: ViewSystem, XtZ: np.ndarray, a_diag: np.ndarray, beta: float) -> np.ndarray:
    """Eq. (6) by Cholesky: (X^T X + beta diag(a)) W = X^T Z."""
    gram = system.gram if system.gram is not None else system.X.T @ system.X
    M = gram.copy()
    M[np.diag_indices_from(M)] += beta * a_diag
    return cho_solve(cho_factor(M, lower=False, overwrite_a=True, check_finite=False), XtZ,
                     check_finite=False)


def solve_woodbury(system: ViewSystem, Z: np.ndarray, a_diag: np.ndarray, beta: float) -> np.ndarray:
    """Eq. (6) in Woodbury form: W = A^-1 X^T (X A^-1 X^T + beta I)^-1 Z (an N x N system)."""
    X = system.X
    d_inv = 1.0 / a_diag
    Xs = X * np.sqrt(d_inv)           # X A^-1/2, so Xs Xs^T is the symmetric product
    K = Xs @ Xs.T
    K[np.diag_indices_from(K)] += beta
    S = cho_solve(cho_factor(K, lower=False, overwrite_a=True, check_finite=False), Z,
                  check_finite=False)
    return d_inv[:, None] * (X.T @ S)


def solve_w(system: ViewSystem, Z: np.ndarray, a_diag: np.ndarray, beta: float,
            XtZ: np.ndarray | None = None) -> np.ndarray:
    """One eq.-(6) solve with the system's solver (X^T Z may be passed in when reused)."""
    if system.solver == "woodbury":
        return solve_woodbury(system, Z, a_diag, beta)
    return solve_cholesky(system, system.X.T @ Z if XtZ is None else XtZ, a_diag, beta)


# ---------------------------------------------------------------- objective pieces
def l21_norm(W: np.ndarray) -> float:
    """||W||_{2,1} = sum of the rows' l2 norms."""
    return float(np.linalg.norm(W, axis=1).sum())


def l21_smoothed(W: np.ndarray, epsilon: float) -> float:
    """sum_i h(||W^(i)||), h(t) = t - eps ln(1 + t/eps): the penalty the reweighting decreases."""
    t = np.linalg.norm(W, axis=1)
    return float((t - epsilon * np.log1p(t / epsilon)).sum())


def _w_subproblem(XW: np.ndarray, target: np.ndarray, W: np.ndarray, beta: float,
                  epsilon: float) -> float:
    r = XW - target
    return float(np.einsum("ij,ij->", r, r)) + beta * l21_smoothed(W, epsilon)


# ---------------------------------------------------------------- W update (Eq. (6))
@dataclass(frozen=True, eq=False)
class WUpdate:
    W: np.ndarray
    iterations: int
    objective: float   # smoothed ||XW - target||^2 + beta sum h(||W^(i)||) at the returned W
    converged: bool = False  # stopped by tol (always False when tol == 0)
    XW: np.ndarray | None = None  # X @ W at the returned W (reused by the caller, not recomputed)


def update_w(system: ViewSystem, target, W, beta: float, epsilon: float, max_iters: int,
             tol: float = 0.0) -> WUpdate:
    """Eq. (6) alternated with Eq. (4): ``max_iters`` reweighting steps from W.

    Each step sets A from the current W and solves Eq. (6); the smoothed
    subproblem objective never increases (see the module docstring).  With
    ``tol > 0`` it stops once W moves by at most ``tol`` relative
    (``||W_new - W||_F <= tol ||W_new||_F``).  W, not the objective: with a
    small beta the objective settles after a step or two while the row norms
    -- the feature scores -- are still moving."""
    target = _as_matrix(target, "target Z_k", rows=system.n_rows)
    W = _as_matrix(W, "W_k", rows=system.n_features, cols=target.shape[1])
    if max_iters < 1:
        raise ValueError(f"max_iters must be >= 1, got {max_iters}")
    XtZ = system.X.T @ target if system.solver == "cholesky" else None
    it = 0
    converged = False
    for it in range(1, max_iters + 1):
        W_new = solve_w(system, target, reweighting_diagonal(W, epsilon), beta, XtZ)
        moved = np.linalg.norm(W_new - W)
        W = W_new
        if tol > 0 and moved <= tol * np.linalg.norm(W):
            converged = True
            break
    XW = system.X @ W
    return WUpdate(W=W, iterations=it, objective=_w_subproblem(XW, target, W, beta, epsilon),
                   converged=converged, XW=XW)


def init_w(n_features: int, n_classes: int, seed: int, participant: int) -> np.ndarray:
    """W_k^0 ~ N(0, 1/d_k), from ``default_rng([seed, participant])`` (reproducible per participant)."""
    rng = np.random.default_rng([int(seed), int(participant)])
    return rng.standard_normal((n_features, n_classes)) / math.sqrt(n_features)


def initial_z(n_rows: int, n_classes: int) -> np.ndarray:
    """The server's Z^0: zeros (it starts knowing nothing)."""
    return np.zeros((n_rows, n_classes))


# ---------------------------------------------------------------- Z updates (Eqs. (7), (8))
def update_z_view(XW: np.ndarray, Z: np.ndarray, zeta: float, Y: np.ndarray | None = None,
                  eta: float = 0.0, label_mask: np.ndarray | None = None) -> np.ndarray:
    """Eq. (7): a participant's pseudo-labels Z_k given its predictions X_k W_k and the server's Z.

    Without Y: (XW + zeta Z) / (1 + zeta).  With Y (the label holder):
    (XW + zeta Z + eta m Y) / (1 + zeta + eta m) row-wise, m = label_mask
    (all ones when None)."""
    XW = np.asarray(XW, dtype=np.float64)
    Z = np.asarray(Z, dtype=np.float64)
    if XW.shape != Z.shape:
        raise ValueError(f"X_k W_k has shape {XW.shape} but Z has {Z.shape}")
    if Y is None:
        return (XW + zeta * Z) / (1.0 + zeta)
    Y = np.asarray(Y, dtype=np.float64)
    if Y.shape != Z.shape:
        raise ValueError(f"Y has shape {Y.shape} but Z has {Z.shape}")
    if label_mask is None:
        return (XW + zeta * Z + eta * Y) / (1.0 + zeta + eta)
    m = np.asarray(label_mask, dtype=bool)
    if m.shape != (Z.shape[0],):
        raise ValueError(f"label_mask has shape {m.shape}, expected ({Z.shape[0]},)")
    w = np.where(m, eta, 0.0)[:, None]
    return (XW + zeta * Z + w * Y) / (1.0 + zeta + w)


def z_contribution(Z_k: np.ndarray, zeta_k: float) -> np.ndarray:
    """A participant's share of Eq. (8): zeta_k Z_k (secure aggregation applies the weight itself)."""
    return zeta_k * np.asarray(Z_k, dtype=np.float64)


def sum_contributions(contributions: Sequence[np.ndarray]) -> np.ndarray:
    """The plain aggregate, summed in the given order (what secure aggregation computes)."""
    if not contributions:
        raise ValueError("no contributions to sum")
    total = np.array(contributions[0], dtype=np.float64, copy=True)
    for c in contributions[1:]:
        total += c
    return total


def zeta_total(zetas: Sequence[float]) -> float:
    """sum_k zeta_k (public: part of the settings)."""
    return float(sum(float(z) for z in zetas))


def combine_z(weighted_sum: np.ndarray, weight_sum: float) -> np.ndarray:
    """Eq. (8), the server's only step: Z = (sum_k zeta_k Z_k) / (sum_k zeta_k)."""
    if not weight_sum > 0:
        raise ValueError(f"sum of zeta_k must be > 0, got {weight_sum!r}")
    return np.asarray(weighted_sum, dtype=np.float64) / weight_sum


def objective_terms(X: np.ndarray, W: np.ndarray, Z_k: np.ndarray, Z: np.ndarray, beta: float,
                    zeta: float, epsilon: float, Y: np.ndarray | None = None, eta: float = 0.0,
                    label_mask: np.ndarray | None = None, XW: np.ndarray | None = None) -> np.ndarray:
    """One participant's part of Eq. (3), as the vector ``OBJECTIVE_FIELDS`` = (eq3, smoothed).

    ``||X W - Z_k||^2 + beta P(W) + zeta ||Z_k - Z||^2`` (+ ``eta ||M(Z_k - Y)||^2``
    for the label holder), P = ||.||_{2,1} for eq3 and the smoothed penalty
    for smoothed.  Summing the vectors over participants gives the totals."""
    XW = X @ W if XW is None else XW
    r = XW - Z_k
    c = Z_k - Z
    base = float(np.einsum("ij,ij->", r, r)) + zeta * float(np.einsum("ij,ij->", c, c))
    if Y is not None and eta > 0:
        e = Z_k - Y
        if label_mask is not None:
            e = e[np.asarray(label_mask, dtype=bool)]
        base += eta * float(np.einsum("ij,ij->", e, e))
    return np.array([base + beta * l21_norm(W), base + beta * l21_smoothed(W, epsilon)])


def should_stop(trace: Sequence[float], tol: float, max_iter: int) -> bool:
    """The stopping rule: relative change of the last two objective values <= tol, or max_iter rounds."""
    if len(trace) >= max_iter:
        return True
    if len(trace) < 2:
        return False
    prev, cur = float(trace[-2]), float(trace[-1])
    return abs(prev - cur) <= tol * max(abs(prev), np.finfo(float).tiny)


# ---------------------------------------------------------------- participant / server steps
@dataclass(frozen=True, eq=False)
class ParticipantState:
    """What participant k keeps between rounds (never leaves it: X, W, Y)."""

    index: int
    system: ViewSystem
    W: np.ndarray
    zeta: float
    Y: np.ndarray | None = None            # label holder only: one-hot rows
    label_mask: np.ndarray | None = None   # label holder only: rows whose label is known
    Z_k: np.ndarray | None = None
    inner_iterations: int = 0              # reweighting steps in the last W-update
    XW: np.ndarray | None = None           # X @ W for the current W (None: compute it)


def init_participant(index: int, X, n_classes: int, settings: MMVFLSettings,
                     labels: np.ndarray | None = None, label_mask: np.ndarray | None = None,
                     zeta: float | None = None) -> ParticipantState:
    """Participant ``index`` (0 = the label holder when ``labels`` is given) before round 0.

    ``labels``: int labels per row (only rows in ``label_mask`` are read; the
    others may hold anything, e.g. -1)."""
    system = prepare_view(X, n_classes, settings.solver, name=f"participant {index} X")
    Y = mask = None
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
        if labels.shape[0] != system.n_rows:
            raise ValueError(f"participant {index}: {labels.shape[0]} labels for {system.n_rows} rows")
        mask = np.ones(system.n_rows, dtype=bool) if label_mask is None else np.asarray(label_mask, bool)
        if mask.shape != (system.n_rows,):
            raise ValueError(f"participant {index}: label_mask has shape {mask.shape}, expected ({system.n_rows},)")
        Y = np.zeros((system.n_rows, n_classes))
        Y[mask] = one_hot(labels[mask], n_classes)
    elif label_mask is not None:
        raise ValueError(f"participant {index}: label_mask given without labels")
    return ParticipantState(index=index, system=system,
                            W=init_w(system.n_features, n_classes, settings.seed, index),
                            zeta=settings.zeta if zeta is None else float(zeta),
                            Y=Y, label_mask=mask)


def participant_z_step(state: ParticipantState, Z: np.ndarray,
                       settings: MMVFLSettings) -> tuple[ParticipantState, np.ndarray]:
    """Eq. (7) with the current W_k and the server's Z; returns (state, Z_k).

    What goes to (secure) aggregation is Z_k with weight zeta_k
    (:func:`z_contribution` for the plain weighted vector)."""
    XW = state.system.X @ state.W if state.XW is None else state.XW
    Z_k = update_z_view(XW, Z, state.zeta, state.Y, settings.eta, state.label_mask)
    return replace(state, Z_k=Z_k), Z_k


def participant_w_step(state: ParticipantState, Z: np.ndarray,
                       settings: MMVFLSettings) -> tuple[ParticipantState, np.ndarray]:
    """Eq. (6) (inner reweighting loop) towards this round's Z_k, then the objective terms.

    Returns (state, terms): ``terms`` is this participant's part of Eq. (3)
    (:func:`objective_terms`), computed with the new W_k, its Z_k and the Z
    the server just sent."""
    if state.Z_k is None:
        raise ValueError(f"participant {state.index}: W-step before any Z-step")
    up = update_w(state.system, state.Z_k, state.W, settings.beta, settings.epsilon,
                  settings.inner_iters, settings.inner_tol)
    terms = objective_terms(state.system.X, up.W, state.Z_k, Z, settings.beta, state.zeta,
                            settings.epsilon, state.Y, settings.eta, state.label_mask, XW=up.XW)
    return replace(state, W=up.W, inner_iterations=up.iterations, XW=up.XW), terms


# ---------------------------------------------------------------- the oracle
@dataclass(frozen=True, eq=False)
class MMVFLResult:
    W: list[np.ndarray]          # per participant, d_k x Nc
    Z_views: list[np.ndarray | None]  # per participant Z_k, rows x Nc (set by every round)
    Z: np.ndarray                # the server's Z
    rows: np.ndarray             # row indices (into the views) the matrices refer to
    objective: list[float]       # Eq. (3) after each round
    smoothed: list[float]        # the smoothed objective (the one guaranteed non-increasing)
    iterations: int
    converged: bool              # stopped by tol (False: hit max_iter)
    solvers: list[str]


def run_centralized(views: Sequence[np.ndarray], y, train_idx, settings: MMVFLSettings,
                    n_classes: int | None = None) -> MMVFLResult:
    """The oracle: all X_k and Y in one process, the same step functions as the federated run.

    ``views[0]`` is the label holder.  Only ``y[train_idx]`` is read.  With
    ``settings.rows == "train"`` the matrices cover ``train_idx`` (in that
    order); with ``"all"`` they cover every row and only ``train_idx`` is
    labelled."""
    if len(views) < 1:
        raise ValueError("run_centralized needs at least one view")
    n = np.asarray(views[0]).shape[0]
    for k, X in enumerate(views):
        if np.asarray(X).ndim != 2 or np.asarray(X).shape[0] != n:
            raise ValueError(f"view {k} has shape {np.asarray(X).shape}; every view needs {n} rows")
    y = np.asarray(y).reshape(-1)
    if y.shape[0] != n:
        raise ValueError(f"y has {y.shape[0]} entries for {n} rows")
    train_idx = np.asarray(train_idx, dtype=np.int64).reshape(-1)
    if train_idx.size == 0 or train_idx.min() < 0 or train_idx.max() >= n:
        raise ValueError(f"train_idx must be non-empty row indices in 0..{n - 1}")
    if np.unique(train_idx).size != train_idx.size:
        raise ValueError("train_idx has repeated rows")
    y_train = y[train_idx]
    if n_classes is None:
        n_classes = int(y_train.max()) + 1
    if y_train.min() < 0 or y_train.max() >= n_classes:
        raise ValueError(f"training labels must lie in 0..{n_classes - 1}")

    if settings.rows == "train":
        rows = train_idx
        labels = y_train
        mask = None
    else:
        rows = np.arange(n)
        mask = np.zeros(n, dtype=bool)
        mask[train_idx] = True
        labels = np.full(n, -1, dtype=np.int64)
        labels[train_idx] = y_train

    states = [init_participant(k, np.asarray(X)[rows], n_classes, settings,
                               labels=labels if k == 0 else None,
                               label_mask=mask if k == 0 else None)
              for k, X in enumerate(views)]
    weight_sum = zeta_total([s.zeta for s in states])
    Z = initial_z(rows.size, n_classes)
    objective: list[float] = []
    smoothed: list[float] = []
    converged = False
    for _ in range(settings.max_iter):
        contributions = []
        for k, s in enumerate(states):
            states[k], Z_k = participant_z_step(s, Z, settings)
            contributions.append(z_contribution(Z_k, s.zeta))
        Z = combine_z(sum_contributions(contributions), weight_sum)
        terms = []
        for k, s in enumerate(states):
            states[k], t = participant_w_step(s, Z, settings)
            terms.append(t)
        total = sum_contributions(terms)
        objective.append(float(total[0]))
        smoothed.append(float(total[1]))
        if should_stop(smoothed, settings.tol, max_iter=2 ** 62):
            converged = True
            break
    return MMVFLResult(W=[s.W for s in states], Z_views=[s.Z_k for s in states], Z=Z, rows=rows,
                       objective=objective, smoothed=smoothed, iterations=len(smoothed),
                       converged=converged, solvers=[s.system.solver for s in states])


# ---------------------------------------------------------------- scaling
def fit_standardizer(X_train) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and scale of a participant's own training rows (constant features: scale 1)."""
    X_train = _as_matrix(X_train, "training rows")
    mean = X_train.mean(axis=0)
    scale = X_train.std(axis=0)
    scale[scale <= 1e-12 * max(1.0, float(np.abs(mean).max(initial=0.0)))] = 1.0
    return mean, scale


def standardize(X, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (np.asarray(X, dtype=np.float64) - mean) / scale


# ---------------------------------------------------------------- selection and classification
def feature_scores(W) -> np.ndarray:
    """Section 3.2: S^i = ||W^(i)||_2, one score per feature (row of W)."""
    return np.linalg.norm(np.asarray(W, dtype=np.float64), axis=1)


def n_selected(n_features: int, percent: float) -> int:
    """How many features "top p %" keeps: round(p d / 100) half up, at least 1, at most d."""
    if not (0 < percent <= 100):
        raise ValueError(f"percentage of features must be in (0, 100], got {percent!r}")
    return int(min(n_features, max(1, math.floor(percent * n_features / 100.0 + 0.5))))


def top_features(scores, percent: float) -> np.ndarray:
    """Indices of the top p % features by score, best first (ties: lower index first)."""
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(-scores, kind="stable")
    return order[:n_selected(scores.size, percent)]


def pseudo_labels(Z_k) -> np.ndarray:
    """argmax of each row of Z_k (ties: the lower class)."""
    return np.argmax(np.asarray(Z_k), axis=1).astype(np.int64)


def knn_predict(X_train, labels, X_query, k: int = 1, chunk: int = 2048) -> np.ndarray:
    """k-NN with Euclidean distance; votes tied between classes go to the class of the nearest tied
    neighbour (neighbours ordered by distance, then by training row)."""
    X_train = np.asarray(X_train, dtype=np.float64)
    X_query = np.asarray(X_query, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if X_train.ndim != 2 or X_query.ndim != 2 or X_train.shape[1] != X_query.shape[1]:
        raise ValueError(f"k-NN: training {X_train.shape} and query {X_query.shape} do not match")
    if labels.shape[0] != X_train.shape[0] or X_train.shape[0] == 0:
        raise ValueError(f"k-NN: {labels.shape[0]} labels for {X_train.shape[0]} training rows")
    k = min(int(k), X_train.shape[0])
    n_classes = int(labels.max()) + 1
    tn = np.einsum("ij,ij->i", X_train, X_train)
    out = np.empty(X_query.shape[0], dtype=np.int64)
    for s in range(0, X_query.shape[0], chunk):
        q = X_query[s:s + chunk]
        d2 = tn[None, :] - 2.0 * (q @ X_train.T)   # + ||q||^2, constant per row
        if k == 1:
            out[s:s + chunk] = labels[np.argmin(d2, axis=1)]
            continue
        nn = np.argsort(d2, axis=1, kind="stable")[:, :k]
        nl = labels[nn]
        for r in range(nl.shape[0]):
            votes = np.bincount(nl[r], minlength=n_classes)
            best = np.flatnonzero(votes == votes.max())
            out[s + r] = best[0] if best.size == 1 else next(c for c in nl[r] if c in best)
    return out


def selection_accuracy(X_train, train_labels, X_val, y_val, scores, percent: float,
                       knn_k: int = 1) -> float:
    """Accuracy on validation rows of k-NN trained on the top p % features (by ``scores``)."""
    idx = top_features(scores, percent)
    pred = knn_predict(np.asarray(X_train)[:, idx], train_labels, np.asarray(X_val)[:, idx], knn_k)
    return float(np.mean(pred == np.asarray(y_val).reshape(-1)))


# ---------------------------------------------------------------- baselines (Eqs. (9), (10))
@dataclass(frozen=True, eq=False)
class L21Fit:
    W: list[np.ndarray]     # per view (one entry for supFL)
    iterations: int
    objective: float        # smoothed objective at the end
    converged: bool
    solver: str


def fit_l21(X, target, beta: float, settings: MMVFLSettings, participant: int = 0) -> L21Fit:
    """min ||X W - target||^2 + beta ||W||_{2,1} by reweighting until W moves by <= w_tol (relative)
    or max_iter steps."""
    target = _as_matrix(target, "target")
    system = prepare_view(X, target.shape[1], settings.solver)
    W0 = init_w(system.n_features, target.shape[1], settings.seed, participant)
    up = update_w(system, target, W0, beta, settings.epsilon, settings.max_iter, settings.w_tol)
    return L21Fit(W=[up.W], iterations=up.iterations, objective=up.objective,
                  converged=up.converged, solver=system.solver)


def fit_supfl(X_k, y_train, n_classes: int, settings: MMVFLSettings, participant: int = 0) -> L21Fit:
    """Eq. (9), supFL: participant k alone with the true labels of its (training) rows."""
    return fit_l21(X_k, one_hot(np.asarray(y_train).reshape(-1), n_classes), settings.beta, settings,
                   participant)


def fit_supmvlfl(views: Sequence[np.ndarray], y_train, n_classes: int,
                 settings: MMVFLSettings) -> L21Fit:
    """Eq. (10), supMVLFL: ||sum_k X_k W_k - Y||^2 + beta sum_k ||W_k||_{2,1} (all views jointly,
    with labels), solved on the concatenated views; W comes back split per view."""
    if not views:
        raise ValueError("supMVLFL needs at least one view")
    mats = [_as_matrix(X, f"view {k}") for k, X in enumerate(views)]
    n = mats[0].shape[0]
    for k, X in enumerate(mats):
        if X.shape[0] != n:
            raise ValueError(f"view {k} has {X.shape[0]} rows, view 0 has {n}")
    fit = fit_l21(np.hstack(mats), one_hot(np.asarray(y_train).reshape(-1), n_classes),
                  settings.beta, settings)
    bounds = np.cumsum([0] + [X.shape[1] for X in mats])
    W = fit.W[0]
    return replace(fit, W=[W[bounds[k]:bounds[k + 1]] for k in range(len(mats))])
