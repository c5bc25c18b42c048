"""MMVFL's roles: the server and the K participants (participant 0 holds the labels).

Each calls exactly the step functions :func:`~fedhet.algorithms.mmvfl.core.run_centralized` calls,
so the federated run reproduces the centralised oracle (bit for bit with plain float64 aggregation,
within the quantisation bound with secure aggregation); the package docstring lists the rounds and
what leaves whom.

Equation -> function (the paper's numbering, as :mod:`~fedhet.algorithms.mmvfl.core`'s docstring gives it):

====================================  ============================================================================
Eq. (7), the Z_k-step                 :meth:`ParticipantRun.z_step` (:func:`~fedhet.algorithms.mmvfl.core.participant_z_step`)
Eq. (8), the Z-step                   :meth:`ParticipantRun.z_step` submits Z_k, weight zeta_k (aggregation round 2r);
                                      :meth:`ServerState.combine_z` (:func:`~fedhet.algorithms.mmvfl.core.combine_z`)
Eq. (6) with Eq. (4), the W_k-step    :meth:`ParticipantRun.w_step` (:func:`~fedhet.algorithms.mmvfl.core.participant_w_step`)
Eq. (3), the objective                :meth:`ParticipantRun.w_step` submits its terms (aggregation round 2r+1);
                                      :meth:`ServerState.total_objective` sums them and decides whether to stop
                                      (:func:`~fedhet.algorithms.mmvfl.core.should_stop`)
Section 3.2, scores and selection     :func:`selection_accuracies` (:func:`~fedhet.algorithms.mmvfl.core.feature_scores`,
                                      :func:`~fedhet.algorithms.mmvfl.core.selection_accuracy`)
====================================  ============================================================================

Checkpoint step k: k rounds done (the server's STEP of round k-1 sent and received); the server keeps
Z, the objective traces, the error bound and whether it stopped (:class:`ServerState`), a participant
its W_k, Z_k (and X_k W_k), the last Z and its timings, and whether it stopped (:class:`ParticipantRun`).
PSI and each round's aggregation masks are drawn afresh after a resume (PSI gives the same common rows).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace
from typing import Any, Callable, ContextManager, Literal

import numpy as np

from fedhet.algorithms.toolkit import Phases, role_members, traffic_totals
from fedhet.parties.api import PeerFault, RoundFailed
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation, psi
from fedhet.protocols.aggregation_settings import AggregationSettings

from . import core, model
from .data import ParticipantData
from .messages import Kind
from .settings import PARTICIPANT, SERVER, Settings, sizes

# Z_k stays within [-0.007, 1.0] with zeta = eta = 1000 (core's docstring): clip 2.  A 64-bit
# ring keeps the quantisation of Z near 1e-14, far below anything the optimisation notices.
Z_CLIP = 2.0
# The objective terms: a 64-bit fixed-point range of +-2^30 (about 1e9; the terms of the four data sets
# stay below ~1e6); the quantiser keeps float64-exact sums, so 5 participants get 19 fraction bits
# (resolution ~2e-6, far below tol x objective).
OBJECTIVE_CLIP = float(2 ** 30)
OBJECTIVE_RING_BITS: Literal[32, 64] = 64


def blas_one_thread() -> ContextManager[Any]:
    """BLAS limited to one thread in the block (core's docstring: several parties share the cores)."""
    try:
        from threadpoolctl import threadpool_limits
        return threadpool_limits(1)
    except ImportError:  # pragma: no cover - optional
        return contextlib.nullcontext()


def z_aggregation_defaults(s: Settings) -> AggregationSettings:
    """Z's aggregation: secure by default, clip 2, weights up to zeta, a 64-bit ring."""
    return AggregationSettings(aggregation="secure", secagg_clip=Z_CLIP, secagg_max_weight=float(s.zeta),
                               secagg_ring_bits=64)


def objective_aggregation(s: Settings) -> AggregationSettings:
    """The objective's aggregation: the method and graph of the settings (secure when unset), its own
    fixed-point range (clip 2^30, weight 1, a 64-bit ring, the most fraction bits it allows, whatever the
    run's clip, weight, ring and fraction bits)."""
    return replace(s.agg, secagg_clip=OBJECTIVE_CLIP, secagg_max_weight=1.0, secagg_ring_bits=OBJECTIVE_RING_BITS,
                   secagg_frac_bits=None).over(AggregationSettings(aggregation="secure"))


@dataclass(frozen=True)
class Aggregations:
    """A round's two aggregations: Z_k (round 2r, weight zeta_k) and the objective terms (round 2r+1, weight 1)."""

    z: aggregation.Aggregator
    objective: aggregation.Aggregator

    @classmethod
    def of(cls, s: Settings) -> "Aggregations":
        return cls(aggregation.make_aggregator(s.agg, z_aggregation_defaults(s)),
                   aggregation.make_aggregator(objective_aggregation(s)))


# ---------------------------------------------------------------- the server
@dataclass
class ServerState:
    """What the server carries across rounds (its checkpoint): Z, the objective traces (Eq. (3) and the
    smoothed one), the largest mean error bound of Z's aggregation, whether the run converged and whether it
    stopped, and the seconds of each round's two aggregations (``agg_z_s``, ``agg_objective_s``)."""

    Z: np.ndarray
    objective: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    bound: float = 0.0
    converged: bool = False
    stopped: bool = False
    phases: Phases = field(default_factory=lambda: Phases({"agg_z": [], "agg_objective": []}))

    def state(self) -> dict[str, Any]:
        return {"Z": self.Z, "objective": self.objective, "smoothed": self.smoothed, "bound": self.bound,
                "converged": self.converged, "stopped": self.stopped, "phases": self.phases.state()}

    @classmethod
    def restored(cls, saved: dict[str, Any], n_rows: int, n_classes: int) -> "ServerState":
        """The checkpoint ``saved``'s state, or round 0's (Z^0 = 0) when it is empty."""
        if not saved:
            return cls(core.initial_z(n_rows, n_classes))
        return cls(saved["Z"], list(saved["objective"]), list(saved["smoothed"]), float(saved["bound"]),
                   bool(saved["converged"]), bool(saved["stopped"]), Phases.restored(saved["phases"]))

    def combine_z(self, party: PartyLike, participants: list[str], aggs: Aggregations, r: int) -> None:
        """Eq. (8): Z from the participants' aggregated zeta_k Z_k (aggregation round 2r), sent to them all."""
        n_rows, n_classes = self.Z.shape
        with self.phases.timed("agg_z"):
            res = aggs.z.aggregate(party, participants, round=2 * r, length=n_rows * n_classes)
        if res.dropped:
            raise RoundFailed(f"mmvfl round {r}: participants {res.dropped} dropped out of the Z aggregation")
        self.Z = core.combine_z(res.sum, res.weight).reshape(n_rows, n_classes)
        self.bound = max(self.bound, res.mean_error_bound)
        party.broadcast(Kind.Z, {"r": r, "Z": self.Z}, to=participants)

    def total_objective(self, party: PartyLike, participants: list[str], aggs: Aggregations, s: Settings,
                        r: int) -> None:
        """Eq. (3) summed over the participants (aggregation round 2r+1) onto the traces; the stopping rule's
        verdict sent to them all."""
        with self.phases.timed("agg_objective"):
            tot = aggs.objective.aggregate(party, participants, round=2 * r + 1, length=len(core.OBJECTIVE_FIELDS))
        if tot.dropped:
            raise RoundFailed(f"mmvfl round {r}: participants {tot.dropped} dropped out of the objective")
        self.objective.append(float(tot.sum[0]))
        self.smoothed.append(float(tot.sum[1]))
        self.stopped = core.should_stop(self.smoothed, s.tol, s.max_iter)
        self.converged = core.should_stop(self.smoothed, s.tol, 2 ** 62)
        party.broadcast(Kind.STEP, {"r": r, "stop": bool(self.stopped)}, to=participants)


def server(party: PartyLike, s: Settings, data: None) -> dict[str, Any]:
    participants = party.peers_with_role(PARTICIPANT)
    sz = sizes(s)
    aggs = Aggregations.of(s)
    start, saved = party.restore()
    state = ServerState.restored(saved, sz["n_rows"], sz["n_classes"])
    with blas_one_thread():
        for r in range(start, s.max_iter):
            if state.stopped:   # resumed after the last round
                break
            party.round = r
            state.combine_z(party, participants, aggs, r)
            state.total_objective(party, participants, aggs, s, r)
            party.metric(objective=state.objective[-1])
            party.progress(r + 1, s.max_iter, objective=round(state.objective[-1], 4))
            party.checkpoint(r + 1, state.state())
        reports = party.gather(Kind.REPORT, frm=participants)
    out = {"iterations": len(state.smoothed), "converged": state.converged, "objective": state.objective,
           "smoothed": state.smoothed, "n_rows": sz["n_rows"], "n_classes": sz["n_classes"],
           "percents": list(s.percents), "accuracy": {p: reports[p]["accuracy"] for p in participants},
           "solvers": {p: reports[p]["solver"] for p in participants},
           "aggregation": aggs.z.method, "max_mean_error_bound": state.bound,
           **state.phases.result(), **traffic_totals(party)}
    if s.report_model:
        out["Z"] = state.Z.tolist()
    return out


# ---------------------------------------------------------------- a participant
@dataclass(frozen=True, eq=False)
class CommonView:
    """A participant's view of the common training rows PSI found (in PSI's sorted order), standardised with
    their own statistics, its validation rows likewise, and (label holder only) the rows' labels."""

    X: np.ndarray
    X_val: np.ndarray
    labels: np.ndarray | None
    mean: np.ndarray
    scale: np.ndarray


def common_view(party: PartyLike, s: Settings, data: ParticipantData, rows: np.ndarray) -> CommonView:
    if rows.size != sizes(s)["n_rows"]:
        raise RuntimeError(f"mmvfl {party.name}: PSI found {rows.size} common training rows, the settings "
                           f"say {sizes(s)['n_rows']}")
    X_raw = np.asarray(data.X_train, dtype=np.float64)[rows]
    mean, scale = core.fit_standardizer(X_raw)
    labels = np.asarray(data.y_train)[rows] if data.y_train is not None else None
    return CommonView(core.standardize(X_raw, mean, scale), core.standardize(data.X_val, mean, scale), labels,
                      mean, scale)


@dataclass
class ParticipantRun:
    """What a participant carries across rounds (its checkpoint): its step state (W_k, Z_k, X_k W_k and the
    inner iterations of the last W-update), the server's last Z, the rounds done, whether the server stopped
    the run, and the seconds of its Z_k- and W_k-steps (``zstep_s``, ``solve_s``)."""

    step: core.ParticipantState
    Z: np.ndarray
    rounds: int = 0
    stopped: bool = False
    phases: Phases = field(default_factory=lambda: Phases({"solve": [], "zstep": []}))

    def state(self) -> dict[str, Any]:
        return {"W": self.step.W, "Z_k": self.step.Z_k, "XW": self.step.XW,
                "inner_iterations": self.step.inner_iterations, "Z": self.Z, "stopped": self.stopped,
                "phases": self.phases.state()}

    @classmethod
    def restored(cls, start: int, saved: dict[str, Any], fresh: core.ParticipantState) -> "ParticipantRun":
        """The state of the checkpoint ``saved`` of step ``start`` over round 0's ``fresh`` one (``fresh`` itself
        with Z^0 = 0 when ``start`` is 0)."""
        if not start:
            return cls(fresh, core.initial_z(fresh.system.n_rows, fresh.W.shape[1]))
        step = replace(fresh, W=saved["W"], Z_k=saved["Z_k"], XW=saved["XW"],
                       inner_iterations=int(saved["inner_iterations"]))
        return cls(step, saved["Z"], start, bool(saved["stopped"]), Phases.restored(saved["phases"]))

    def z_step(self, party: PartyLike, srv: str, aggs: Aggregations, cs: core.MMVFLSettings, r: int) -> None:
        """Eq. (7) with the last Z; Z_k to Eq. (8)'s aggregation (round 2r, weight zeta_k); the server's new Z."""
        with self.phases.timed("zstep"):
            self.step, Z_k = core.participant_z_step(self.step, self.Z, cs)
        aggs.z.submit(party, srv, Z_k.ravel(), weight=self.step.zeta, round=2 * r)
        self.Z = receive_round(party, srv, r, Kind.Z)["Z"]

    def w_step(self, party: PartyLike, srv: str, aggs: Aggregations, cs: core.MMVFLSettings, r: int) -> None:
        """Eq. (6) towards Z_k; Eq. (3)'s terms to the objective's aggregation (round 2r+1); the server's
        verdict."""
        with self.phases.timed("solve"):
            self.step, terms = core.participant_w_step(self.step, self.Z, cs)
        aggs.objective.submit(party, srv, terms, weight=1.0, round=2 * r + 1)
        self.stopped = bool(receive_round(party, srv, r, Kind.STEP)["stop"])
        self.rounds = r + 1


def participant(party: PartyLike, s: Settings, data: ParticipantData) -> dict[str, Any]:
    srv = party.peer_with_role(SERVER)
    order = role_members(party, PARTICIPANT)
    index = check_label_holder(party, order, data)
    cs = s.core()
    start, saved = party.restore()
    psi_time = Phases()
    with psi_time.timed("psi"):
        res = align_rows(party, s, data, order)
    view = common_view(party, s, data, np.asarray(res.rows, dtype=np.int64))
    aggs = Aggregations.of(s)
    with blas_one_thread():
        run = ParticipantRun.restored(start, saved, core.init_participant(index, view.X, data.n_classes, cs,
                                                                          labels=view.labels))
        for r in range(start, s.max_iter):
            if run.stopped:   # resumed after the last round
                break
            party.round = r
            run.z_step(party, srv, aggs, cs, r)
            run.w_step(party, srv, aggs, cs, r)
            party.checkpoint(run.rounds, run.state())
        train_labels = view.labels if view.labels is not None else core.pseudo_labels(run.step.Z_k)
        acc = selection_accuracies(s, data, view, run.step.W, train_labels)
    party.send(srv, Kind.REPORT, {"accuracy": acc, "inner_iterations": int(run.step.inner_iterations),
                                  "n_features": int(view.X.shape[1]), "solver": run.step.system.solver})
    party.save_model(*model.participant_part(run.step.W, view.mean, view.scale, view.X, train_labels, s.percents,
                                             s.knn_k, data.n_classes,
                                             "labels" if index == 0 else "pseudo_labels (argmax Z_k)", data.X_val))
    out = {"index": index, "label_holder": index == 0, "view": data.view, "data_kind": data.kind,
           "n_rows": sizes(s)["n_rows"], "n_features": int(view.X.shape[1]), "rounds": run.rounds,
           "solver": run.step.system.solver, "percents": list(s.percents), "accuracy": acc,
           **run.phases.result(), "psi_backend": res.stats["backend"], "psi_s": psi_time.last("psi"), **traffic_totals(party)}
    if s.report_model:
        out.update({"W": run.step.W.tolist(), "Z_k": np.asarray(run.step.Z_k).tolist(),
                    "ids": [int(i) for i in res.ids or []]})
    return out


def check_label_holder(party: PartyLike, order: list[str], data: ParticipantData) -> int:
    """This participant's index in federation order, after checking that it holds labels iff it is the first."""
    index = order.index(party.name)
    holder = data.y_train is not None
    if holder != (index == 0):
        raise ValueError(f"mmvfl {party.name}: the label holder must be the first participant in federation "
                         f"order ({order[0]!r}); this party is participant {index} and "
                         f"{'holds' if holder else 'lacks'} labels")
    return index


def align_rows(party: PartyLike, s: Settings, data: ParticipantData, order: list[str]) -> psi.PSIResult:
    """ECDH-PSI over the training rows' IDs, sorted, revealed to every participant (participant 0 the label
    owner, the others feature parties)."""
    if data.y_train is not None:
        others = [p for p in order if p != party.name]
        return psi.psi_label_owner(party, data.ids, others, reveal_to_all=True, order="sorted",
                                   workers=0, timeout=s.psi_timeout, backend=s.psi_backend)
    return psi.psi_feature_party(party, data.ids, order[0], workers=0, timeout=s.psi_timeout, backend=s.psi_backend)


def selection_accuracies(s: Settings, data: ParticipantData, view: CommonView, W: np.ndarray,
                         train_labels: np.ndarray) -> list[float]:
    """Section 3.2: the features scored by ||W_k^(i)||_2, the top p % kept for each p in ``percents``, its
    validation rows classified by k-NN over the common training rows."""
    scores = core.feature_scores(W)
    return [core.selection_accuracy(view.X, train_labels, view.X_val, data.y_val, scores, p, s.knn_k)
            for p in s.percents]


def receive_round(party: PartyLike, frm: str, r: int, kind: str) -> dict[str, Any]:
    """The next ``kind`` from ``frm`` (checked against its schema), a PeerFault unless it is for round ``r``."""
    msg = party.recv(frm, kind)
    check_round(party, frm, msg, r, kind)
    return msg


def check_round(party: PartyLike, frm: str, msg: dict[str, Any], r: int, kind: str) -> None:
    """PeerFault (naming ``frm``) unless ``msg`` (checked against its schema) is for round ``r``."""
    if msg["r"] != r:
        raise PeerFault(party.name, frm, kind, f"for round {msg['r']}, arrived in round {r}")


ROLES: dict[str, Callable[..., dict[str, Any]]] = {SERVER: server, PARTICIPANT: participant}
