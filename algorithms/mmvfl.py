"""MMVFL as a federation: K participants (one view each, participant 0 holds the labels) and a server.

Feng, Yu & Zhu, "MMVFL" (Sensors 2024); the numerics are
:mod:`fedhet.algorithms.mmvfl_core` (its docstring maps eqs. (3)-(10) to
functions and records the choices the paper leaves open).  This module only
moves the messages, and calls exactly the step functions
:func:`~fedhet.algorithms.mmvfl_core.run_centralized` calls, so the federated
run reproduces the centralised oracle (bit for bit with plain float64
aggregation, within the quantisation bound with secure aggregation).

Roles: ``participant`` (K of them; the first in federation order, index 0, is
the label holder: participant 1 of the paper) and ``server``.

1. **Alignment** (:mod:`fedhet.protocols.psi`, ECDH-PSI): participant 0 is the
   label owner, the others feature parties; IDs are the training rows' row
   numbers.  Each participant lacks ``missing`` of the fold's training rows
   (seeded, disjoint between participants), so the common set is smaller than
   anyone's own and the alignment matters.  Order "sorted": every participant
   ends with the same rows in the same order.
2. **Rounds** r = 0, 1, ... (eq. 7, 8, 6, 3):
   participant: Z_k-step (eq. 7, :func:`participant_z_step`) with its W_k and
   the last Z (Z^0 = 0, known to all); submits Z_k, weight zeta_k, to
   aggregation round 2r.  Server: ``combine_z(sum, weight)`` (eq. 8), sends Z
   (``mmvfl/z``).  Participant: W_k-step (eq. 6, :func:`participant_w_step`),
   submits its two objective terms (eq. 3 and the smoothed one), weight 1, to
   aggregation round 2r+1.  Server: appends the total to the trace and sends
   ``mmvfl/step`` (stop or go on, :func:`should_stop`).
3. **Evaluation**: each participant scores its features (||W_k^(i)||_2), keeps
   the top p % for every p in ``percents`` and classifies its own validation
   rows with k-NN trained on the common training rows (true labels for
   participant 0, argmax Z_k for the others); it sends the server only the
   accuracies (``mmvfl/report``: scalars).

What leaves whom (the declarations say the same; ``fedhet audit`` checks it):

- X_k, W_k and participant 0's labels Y never leave their owner.  The only
  array a participant sends outside PSI is its Z_k (n_rows x n_classes,
  flattened) inside the aggregation; with ``aggregation = "secure"`` (the
  default) that is a masked ring vector, so the server never sees an
  individual Z_k.  The objective terms travel the same way (a 2-vector).
- The server learns, per round, Z = sum zeta_k Z_k / sum zeta_k and
  sum zeta_k (public: zeta is a setting), and the two totals of eq. (3) over
  all participants (never one participant's term); at the end the
  per-participant accuracy scalars.  **Z approximates Y on the training rows
  by design**: MMVFL's purpose is to share label information, so the server
  and every participant (who receive Z) effectively learn the training labels
  (argmax Z).  With plain aggregation the server also sees each Z_k.
- PSI reveals to participant 0 each other participant's common training IDs
  with it, and to everyone the common list (:mod:`fedhet.protocols.psi`).
- The validation labels each participant holds are the experiment's
  evaluation ground truth (the paper scores every view), used only to compute
  its accuracies; they take no part in training and are never sent.

Data: the built-in multi-view sets of :mod:`fedhet.algorithms.data_multiview`
(Table 2; ``msrc_v5`` is a stand-in for Caltech7).  Participant k loads view
k, the fold's rows (``cv_folds``, seed ``split_seed``), standardised with
its own common training rows after PSI.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedhet.algorithms import mmvfl_core as core
from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.declare import MessageDecl, declare
from fedhet.parties.settings import TableView, setting
from fedhet.protocols import aggregation, psi, secagg
from fedhet.protocols.aggregation_settings import AggregationSettings

NAME = "mmvfl"
SERVER, PARTICIPANT = "server", "participant"
K_Z = "mmvfl/z"
K_STEP = "mmvfl/step"
K_REPORT = "mmvfl/report"

# (classes, views, rows) of each built-in data set (views after dropping Handwritten's 6-feature one).
DATASET_SHAPES = {"handwritten": (10, 5, 2000), "isolet": (26, 3, 1560), "relathe": (2, 3, 1427),
                  "msrc_v5": (7, 5, 210), "digits": (10, 4, 1797)}
PAPER_PERCENTS = (2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0)

# Z_k stays within [-0.007, 1.0] with zeta = eta = 1000 (mmvfl_core's docstring): clip 2.  A 64-bit
# ring keeps the quantisation of Z near 1e-14, far below anything the optimisation notices.
Z_CLIP = 2.0
# The objective terms: a 64-bit fixed-point range of +-2^30 (about 1e9; the terms of the four data sets
# stay below ~1e6); the quantiser keeps float64-exact sums, so 5 participants get 19 fraction bits
# (resolution ~2e-6, far below tol x objective).
OBJECTIVE_AGG = {"secagg_clip": float(2 ** 30), "secagg_max_weight": 1.0, "secagg_ring_bits": 64,
                 "secagg_frac_bits": None}


@dataclass(frozen=True)
class Settings(TableView):
    dataset: Literal["handwritten", "isolet", "relathe", "msrc_v5", "digits"] = setting(
        "handwritten", "built-in multi-view data set (msrc_v5 stands in for Caltech7; digits: scikit-learn's, "
                       "4 quadrant views, packaged, needs no data folder)")
    fold: int = setting(0, "cross-validation fold", lo=0)
    n_folds: int = setting(5, "folds of the cross-validation", lo=1)
    split_seed: int = setting(0, "seeds the folds (data_multiview.cv_folds)", lo=0)
    train_per_class: int | None = setting(None, "training rows per class (None: Table 2)", lo=1)
    val_per_class: int | None = setting(None, "validation rows per class (None: Table 2)", lo=1)
    missing: int = setting(2, "training rows each participant lacks (seeded, disjoint): what PSI removes",
                           lo=0)
    percents: list[float] = setting(list(PAPER_PERCENTS), "feature percentages p to evaluate", min_len=1)
    beta: float = setting(1e-2, "l2,1 weight of eq. (3)", lo=0, lo_open=True)
    zeta: float = setting(1000.0, "weight of ||Z_k - Z||^2 (every participant)", lo=0, lo_open=True)
    eta: float = setting(1000.0, "weight of ||Z_1 - Y||^2 (label holder)", lo=0)
    epsilon: float = setting(1e-8, "eps of the reweighting, eq. (4)", lo=0, lo_open=True)
    max_iter: int = setting(200, "outer rounds at most", lo=1)
    tol: float = setting(1e-6, "stop when the smoothed objective changes by <= tol (relative)", lo=0)
    inner_iters: int = setting(3, "reweighting steps per W-update (eq. 4 <-> 6)", lo=1)
    inner_tol: float = setting(0.0, "stop the reweighting earlier below this relative change of W", lo=0)
    solver: Literal["auto", "cholesky", "woodbury"] = setting(
        "auto", "eq. (6) solver; auto: Woodbury iff d_k > rows")
    knn_k: int = setting(1, "neighbours of the k-NN classifier", lo=1)
    report_model: bool = setting(False, "participants put W_k, Z_k (and the server Z) in their OWN result "
                                        "files (tests; nothing more is sent)")
    psi_timeout: float | None = setting(None, "seconds to wait for any one PSI message", lo=0, lo_open=True)
    seed: int = setting(0, "seeds W_k^0 and which rows each participant lacks", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)

    def validate(self):
        if self.fold >= self.n_folds:
            raise ValueError(f"mmvfl: fold {self.fold} must be < n_folds {self.n_folds}")
        bad = [p for p in self.percents if not 0 < p <= 100]
        if bad:
            raise ValueError(f"mmvfl: percents must lie in (0, 100], got {bad}")
        n_train = self.split()[0] * DATASET_SHAPES[self.dataset][0]
        k = DATASET_SHAPES[self.dataset][1]
        if k * self.missing >= n_train:
            raise ValueError(f"mmvfl: {k} participants lacking {self.missing} rows each leave no common "
                             f"training rows out of {n_train}")

    def split(self) -> tuple[int, int]:
        from fedhet.algorithms.data_multiview import TABLE2_SPLITS
        tr, va = TABLE2_SPLITS[self.dataset]
        return (self.train_per_class or tr, self.val_per_class or va)

    def core(self) -> core.MMVFLSettings:
        return core.MMVFLSettings(beta=self.beta, zeta=self.zeta, eta=self.eta, epsilon=self.epsilon,
                                  max_iter=self.max_iter, tol=self.tol, inner_iters=self.inner_iters,
                                  inner_tol=self.inner_tol, solver=self.solver, seed=self.seed,
                                  rows="train", knn_k=self.knn_k)


def n_common_rows(s: Settings) -> int:
    """Training rows common to all participants: Table 2's (or the set) count minus K * missing."""
    n_classes, k, _ = DATASET_SHAPES[s.dataset]
    return s.split()[0] * n_classes - k * s.missing


def sizes(s: Settings) -> dict:
    n_classes, k, _ = DATASET_SHAPES[s.dataset]
    return {"n_rows": n_common_rows(s), "n_classes": n_classes, "z_len": n_common_rows(s) * n_classes,
            "n_percents": len(s.percents), "n_participants": k}


def _cfg_get(cfg, key):
    """One key of a run's table (or settings object), its default when unset (None for aggregation keys)."""
    if isinstance(cfg, Settings):
        return getattr(cfg.agg if key in AggregationSettings.__dataclass_fields__ else cfg, key)
    v = cfg.get(key) if hasattr(cfg, "get") else None
    if v is None and key in Settings.__dataclass_fields__:
        return Settings.__dataclass_fields__[key].default
    return v


def _z_length(cfg) -> int:
    """Z_k's length from the run's [algorithm] table (what the audit has)."""
    from fedhet.algorithms.data_multiview import TABLE2_SPLITS
    name = _cfg_get(cfg, "dataset")
    n_classes, k, _ = DATASET_SHAPES[name]
    tr = _cfg_get(cfg, "train_per_class") or TABLE2_SPLITS[name][0]
    return (tr * n_classes - k * int(_cfg_get(cfg, "missing"))) * n_classes


def _vector_check(kind: str):
    """Aggregation vectors may be Z_k-sized (flattened, + the weight in a masked vector) or the
    objective's 2 terms, in the dtype their aggregator uses; nothing else."""
    n_obj = len(core.OBJECTIVE_FIELDS)

    def check(arrays, cfg):
        if len(arrays) != 1:
            return f"expected one vector, got {len(arrays)} arrays"
        dt, shape = arrays[0]
        if len(shape) != 1:
            return f"expected a 1-D vector, got {dt}{list(shape)}"
        z_len = _z_length(cfg)
        if kind == aggregation.Kind.PLAIN:
            if (_cfg_get(cfg, "aggregation") or "secure") != "plain":
                return "a plain (unmasked) update was sent although aggregation is not 'plain'"
            want = "<f4" if _cfg_get(cfg, "plain_dtype") == "float32" else "<f8"
            if shape[0] not in (z_len, n_obj) or dt != want:
                return f"plain update {dt}{list(shape)}: only {want} Z_k ({z_len}) or objective ({n_obj}) vectors"
            return None
        z_bits = _cfg_get(cfg, "secagg_ring_bits") or 64
        allowed = {(z_len + 1, "<u8" if z_bits == 64 else "<u4"), (n_obj + 1, "<u8")}
        if (shape[0], dt) not in allowed:
            return (f"masked vector {dt}{list(shape)}: only Z_k ({z_len} + 1, ring {z_bits}) or the "
                    f"objective ({n_obj} + 1, ring 64)")
        return None
    return check


def _as_participant(d: MessageDecl) -> MessageDecl:
    """An aggregation kind with its "client" role renamed to this algorithm's participant; the two
    vector kinds checked against Z_k's and the objective's sizes (the others: their own checks)."""
    def role(t):
        return tuple(PARTICIPANT if r == "client" else r for r in t)
    check = d.check
    if d.kind in (aggregation.Kind.PLAIN, secagg.Kind.MASKED):
        check = _vector_check(d.kind)
    return declare(d.kind, role(d.sender), role(d.receiver), d.what, check, d.payload)


def declarations(s: Settings) -> list:
    return [
        declare(K_Z, SERVER, PARTICIPANT, "the combined pseudo-labels Z = sum zeta_k Z_k / sum zeta_k (eq. 8) "
                "of the common training rows; approximates the labels Y by design",
                payload=sch.Fields({"r": sch.Int(lo=0), "Z": sch.Arr("<f8", ("n_rows", "n_classes"))})),
        declare(K_STEP, SERVER, PARTICIPANT, "go on or stop (from the aggregated objective); no arrays",
                payload=sch.Fields({"r": sch.Int(lo=0), "stop": sch.Bool()})),
        declare(K_REPORT, PARTICIPANT, SERVER, "a participant's validation accuracy for each p, its "
                "reweighting steps and solver; scalars only",
                payload=sch.Fields({"accuracy": sch.ListOf(sch.Float(), length="n_percents"),
                                    "inner_iterations": sch.Int(lo=0), "n_features": sch.Int(lo=1),
                                    "solver": sch.Str(max_len=16)})),
    ] + psi.declarations(PARTICIPANT, PARTICIPANT) + [
        _as_participant(d) for d in aggregation.declarations(
            None, max(sizes(s)["z_len"], len(core.OBJECTIVE_FIELDS)))]


# ---------------------------------------------------------------- data
def fold_rows(s: Settings, y: np.ndarray):
    """(train, val) row numbers of the configured fold (sorted)."""
    from fedhet.algorithms.data_multiview import cv_folds
    tr, va = s.split()
    f = cv_folds(y, tr, va, s.split_seed, s.n_folds)[s.fold]
    return f.train, f.val


def missing_rows(s: Settings, train: np.ndarray, n_participants: int) -> list[np.ndarray]:
    """The training rows each participant lacks: disjoint blocks of one seeded permutation."""
    perm = np.random.default_rng([s.seed, 7919]).permutation(train)
    return [np.sort(perm[k * s.missing:(k + 1) * s.missing]) for k in range(n_participants)]


def common_rows(s: Settings, train: np.ndarray, n_participants: int) -> np.ndarray:
    """What PSI must find: the training rows nobody lacks, sorted (the centralised reference uses it)."""
    gone = np.concatenate(missing_rows(s, train, n_participants))
    return np.setdiff1d(train, gone)


def load_data(s: Settings, ctx: PartyContext):
    if ctx.role == SERVER:
        return None
    if ctx.role != PARTICIPANT:
        raise ValueError(f"mmvfl: unknown role {ctx.role!r} (roles: {SERVER}, {PARTICIPANT})")
    from fedhet.algorithms.data_multiview import load_multiview
    mv = load_multiview(s.dataset, data_dir=ctx.data_dir)
    if ctx.n_of_role != len(mv.views):
        raise ValueError(f"mmvfl: data set {s.dataset!r} has {len(mv.views)} views, so it needs "
                         f"{len(mv.views)} participants; the federation has {ctx.n_of_role}")
    train, val = fold_rows(s, mv.y)
    lack = missing_rows(s, train, ctx.n_of_role)[ctx.index]
    own_train = np.setdiff1d(train, lack)
    X = mv.views[ctx.index]
    out = {"ids": own_train.tolist(), "X_train": X[own_train], "X_val": X[val],
           "y_val": mv.y[val],  # evaluation only (module docstring)
           "view": mv.view_names[ctx.index], "kind": mv.kind, "n_classes": mv.n_classes}
    if ctx.index == 0:
        out["y_train"] = mv.y[own_train]
    return out


def _blas_one_thread():
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(1)
    except ImportError:  # pragma: no cover - optional
        import contextlib
        return contextlib.nullcontext()


# ---------------------------------------------------------------- roles
def server(party, s: Settings, data) -> dict:
    participants = party.peers_with_role(PARTICIPANT)
    sz = sizes(s)
    n_rows, n_classes = sz["n_rows"], sz["n_classes"]
    z_agg = aggregation.make_aggregator(s.agg.table(), z_aggregation_defaults(s))
    o_agg = aggregation.make_aggregator(objective_aggregation_cfg(s))
    objective, smoothed, agg_z_s, agg_o_s = [], [], [], []
    bound = 0.0
    Z = core.initial_z(n_rows, n_classes)
    converged = False
    with _blas_one_thread():
        for r in range(s.max_iter):
            party.round = r
            t0 = time.perf_counter()
            res = z_agg.aggregate(party, participants, round=2 * r, length=n_rows * n_classes)
            agg_z_s.append(time.perf_counter() - t0)
            if res.dropped:
                raise RuntimeError(f"mmvfl round {r}: participants {res.dropped} dropped out of the Z aggregation")
            Z = core.combine_z(res.sum, res.weight).reshape(n_rows, n_classes)
            bound = max(bound, res.mean_error_bound)
            party.broadcast(K_Z, {"r": r, "Z": Z}, to=participants)
            t0 = time.perf_counter()
            tot = o_agg.aggregate(party, participants, round=2 * r + 1, length=len(core.OBJECTIVE_FIELDS))
            agg_o_s.append(time.perf_counter() - t0)
            if tot.dropped:
                raise RuntimeError(f"mmvfl round {r}: participants {tot.dropped} dropped out of the objective")
            objective.append(float(tot.sum[0]))
            smoothed.append(float(tot.sum[1]))
            stop = core.should_stop(smoothed, s.tol, s.max_iter)
            converged = core.should_stop(smoothed, s.tol, 2 ** 62)
            party.broadcast(K_STEP, {"r": r, "stop": bool(stop)}, to=participants)
            party.metric(objective=objective[-1])
            party.progress(r + 1, s.max_iter, objective=round(objective[-1], 4))
            if stop:
                break
        reports = party.gather(K_REPORT, frm=participants)
    out = {"iterations": len(smoothed), "converged": converged, "objective": objective,
           "smoothed": smoothed, "n_rows": n_rows, "n_classes": n_classes, "percents": list(s.percents),
           "accuracy": {p: reports[p]["accuracy"] for p in participants},
           "solvers": {p: reports[p]["solver"] for p in participants},
           "aggregation": z_agg.method, "max_mean_error_bound": bound,
           "agg_z_s": agg_z_s, "agg_objective_s": agg_o_s,
           "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())}
    if s.report_model:
        out["Z"] = Z.tolist()
    return out


def z_aggregation_defaults(s: Settings) -> dict:
    """Z's aggregation: secure by default, clip 2, weights up to zeta, a 64-bit ring."""
    return {"aggregation": "secure", "secagg_clip": Z_CLIP, "secagg_max_weight": float(s.zeta),
            "secagg_ring_bits": 64}


def objective_aggregation_cfg(s: Settings) -> dict:
    """The objective's aggregation: the method and graph of the settings, its own fixed-point range."""
    t = {k: v for k, v in s.agg.table().items() if not k.startswith(("secagg_clip", "secagg_max_weight",
                                                                      "secagg_ring_bits", "secagg_frac_bits"))}
    t.setdefault("aggregation", "secure")
    return {**t, **{k: v for k, v in OBJECTIVE_AGG.items() if v is not None}}


def participant(party, s: Settings, data) -> dict:
    srv = party.peers_with_role(SERVER)[0]
    order = participants_in_order(party)
    index = order.index(party.name)
    others = [p for p in order if p != party.name]
    holder = data.get("y_train") is not None
    if holder != (index == 0):
        raise ValueError(f"mmvfl {party.name}: the label holder must be the first participant in federation "
                         f"order ({order[0]!r}); this party is participant {index} and "
                         f"{'holds' if holder else 'lacks'} labels")
    cs = s.core()
    t_psi = time.perf_counter()
    if holder:
        res = psi.psi_label_owner(party, data["ids"], others, reveal_to_all=True, order="sorted",
                                  workers=0, timeout=s.psi_timeout)
    else:
        res = psi.psi_feature_party(party, data["ids"], order[0], workers=0, timeout=s.psi_timeout)
    psi_s = time.perf_counter() - t_psi
    rows = np.asarray(res.rows, dtype=np.int64)
    n_rows = sizes(s)["n_rows"]
    if rows.size != n_rows:
        raise RuntimeError(f"mmvfl {party.name}: PSI found {rows.size} common training rows, the settings "
                           f"say {n_rows}")
    n_classes = data["n_classes"]
    X_raw = np.asarray(data["X_train"], dtype=np.float64)[rows]
    mean, scale = core.fit_standardizer(X_raw)
    X = core.standardize(X_raw, mean, scale)
    X_val = core.standardize(data["X_val"], mean, scale)
    labels = np.asarray(data["y_train"])[rows] if holder else None
    z_agg = aggregation.make_aggregator(s.agg.table(), z_aggregation_defaults(s))
    o_agg = aggregation.make_aggregator(objective_aggregation_cfg(s))
    solve_s, zstep_s = [], []
    with _blas_one_thread():
        state = core.init_participant(index, X, n_classes, cs, labels=labels)
        Z = core.initial_z(n_rows, n_classes)
        rounds = 0
        for r in range(s.max_iter):
            party.round = r
            t0 = time.perf_counter()
            state, Z_k = core.participant_z_step(state, Z, cs)
            zstep_s.append(time.perf_counter() - t0)
            z_agg.submit(party, srv, Z_k.ravel(), weight=state.zeta, round=2 * r)
            msg = party.recv(srv, K_Z)
            _check_round(msg, r, K_Z)
            Z = msg["Z"]
            t0 = time.perf_counter()
            state, terms = core.participant_w_step(state, Z, cs)
            solve_s.append(time.perf_counter() - t0)
            o_agg.submit(party, srv, terms, weight=1.0, round=2 * r + 1)
            step = party.recv(srv, K_STEP)
            _check_round(step, r, K_STEP)
            rounds = r + 1
            if step["stop"]:
                break
        scores = core.feature_scores(state.W)
        train_labels = labels if holder else core.pseudo_labels(state.Z_k)
        acc = [core.selection_accuracy(X, train_labels, X_val, data["y_val"], scores, p, s.knn_k)
               for p in s.percents]
    party.send(srv, K_REPORT, {"accuracy": acc, "inner_iterations": int(state.inner_iterations),
                               "n_features": int(X.shape[1]), "solver": state.system.solver})
    out = {"index": index, "label_holder": holder, "view": data["view"], "data_kind": data["kind"],
           "n_rows": n_rows, "n_features": int(X.shape[1]), "rounds": rounds, "solver": state.system.solver,
           "percents": list(s.percents), "accuracy": acc,
           "solve_s": solve_s, "zstep_s": zstep_s, "psi_s": psi_s,
           "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())}
    if s.report_model:
        out.update({"W": state.W.tolist(), "Z_k": state.Z_k.tolist(),
                    "ids": [int(i) for i in res.ids]})
    return out


def participants_in_order(party) -> list[str]:
    """Every participant's name (this party's too) in federation order; the first holds the labels."""
    return [n for n, r in party.roles.items() if r == PARTICIPANT]


def _check_round(msg, r, kind):
    if msg["r"] != r:
        raise RuntimeError(f"mmvfl: {kind} for round {msg['r']} arrived in round {r}")


ROLES = {SERVER: server, PARTICIPANT: participant}

ALGORITHM = Algorithm(
    name=NAME, summary="MMVFL: multi-participant multi-class VFL with l2,1 feature selection; pseudo-labels "
                       "combined by secure aggregation",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("accuracy",))
