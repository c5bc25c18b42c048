"""MMVFL's roles: the server and the K participants (participant 0 holds the labels).

Each calls exactly the step functions :func:`~fedhet.algorithms.mmvfl.core.run_centralized` calls,
so the federated run reproduces the centralised oracle (bit for bit with plain float64 aggregation,
within the quantisation bound with secure aggregation); the package docstring lists the rounds and
what leaves whom.

Checkpoint step k: k rounds done (the server's STEP of round k-1 sent and received); the server keeps
Z, the objective traces, the error bound and whether it stopped, a participant its W_k, Z_k (and
X_k W_k), the last Z and its timings, and whether it stopped.  PSI and each round's aggregation
masks are drawn afresh after a resume (PSI gives the same common rows).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import replace
from typing import Any, Callable, ContextManager, Literal

import numpy as np

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


# ---------------------------------------------------------------- roles
def server(party: PartyLike, s: Settings, data: None) -> dict[str, Any]:
    participants = party.peers_with_role(PARTICIPANT)
    sz = sizes(s)
    n_rows, n_classes = sz["n_rows"], sz["n_classes"]
    z_agg = aggregation.make_aggregator(s.agg, z_aggregation_defaults(s))
    o_agg = aggregation.make_aggregator(objective_aggregation(s))
    start, saved = party.restore()
    objective: list[float] = list(saved.get("objective", []))
    smoothed: list[float] = list(saved.get("smoothed", []))
    agg_z_s: list[float] = list(saved.get("agg_z_s", []))
    agg_o_s: list[float] = list(saved.get("agg_o_s", []))
    bound = float(saved.get("bound", 0.0))
    Z = saved.get("Z", core.initial_z(n_rows, n_classes))
    converged, stop = bool(saved.get("converged", False)), bool(saved.get("stopped", False))
    with blas_one_thread():
        for r in range(start, s.max_iter):
            if stop:   # resumed after the last round
                break
            party.round = r
            t0 = time.perf_counter()
            res = z_agg.aggregate(party, participants, round=2 * r, length=n_rows * n_classes)
            agg_z_s.append(time.perf_counter() - t0)
            if res.dropped:
                raise RoundFailed(f"mmvfl round {r}: participants {res.dropped} dropped out of the Z aggregation")
            Z = core.combine_z(res.sum, res.weight).reshape(n_rows, n_classes)
            bound = max(bound, res.mean_error_bound)
            party.broadcast(Kind.Z, {"r": r, "Z": Z}, to=participants)
            t0 = time.perf_counter()
            tot = o_agg.aggregate(party, participants, round=2 * r + 1, length=len(core.OBJECTIVE_FIELDS))
            agg_o_s.append(time.perf_counter() - t0)
            if tot.dropped:
                raise RoundFailed(f"mmvfl round {r}: participants {tot.dropped} dropped out of the objective")
            objective.append(float(tot.sum[0]))
            smoothed.append(float(tot.sum[1]))
            stop = core.should_stop(smoothed, s.tol, s.max_iter)
            converged = core.should_stop(smoothed, s.tol, 2 ** 62)
            party.broadcast(Kind.STEP, {"r": r, "stop": bool(stop)}, to=participants)
            party.metric(objective=objective[-1])
            party.progress(r + 1, s.max_iter, objective=round(objective[-1], 4))
            party.checkpoint(r + 1, {"Z": Z, "objective": objective, "smoothed": smoothed, "agg_z_s": agg_z_s,
                                     "agg_o_s": agg_o_s, "bound": bound, "converged": converged, "stopped": stop})
        reports = party.gather(Kind.REPORT, frm=participants)
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


def participant(party: PartyLike, s: Settings, data: ParticipantData) -> dict[str, Any]:
    srv = party.peers_with_role(SERVER)[0]
    order = participants_in_order(party)
    index = order.index(party.name)
    others = [p for p in order if p != party.name]
    holder = data.y_train is not None
    if holder != (index == 0):
        raise ValueError(f"mmvfl {party.name}: the label holder must be the first participant in federation "
                         f"order ({order[0]!r}); this party is participant {index} and "
                         f"{'holds' if holder else 'lacks'} labels")
    cs = s.core()
    start, saved = party.restore()
    t_psi = time.perf_counter()
    if holder:
        res = psi.psi_label_owner(party, data.ids, others, reveal_to_all=True, order="sorted",
                                  workers=0, timeout=s.psi_timeout)
    else:
        res = psi.psi_feature_party(party, data.ids, order[0], workers=0, timeout=s.psi_timeout)
    psi_s = time.perf_counter() - t_psi
    rows = np.asarray(res.rows, dtype=np.int64)
    n_rows = sizes(s)["n_rows"]
    if rows.size != n_rows:
        raise RuntimeError(f"mmvfl {party.name}: PSI found {rows.size} common training rows, the settings "
                           f"say {n_rows}")
    n_classes = data.n_classes
    X_raw = np.asarray(data.X_train, dtype=np.float64)[rows]
    mean, scale = core.fit_standardizer(X_raw)
    X = core.standardize(X_raw, mean, scale)
    X_val = core.standardize(data.X_val, mean, scale)
    labels = np.asarray(data.y_train)[rows] if data.y_train is not None else None
    z_agg = aggregation.make_aggregator(s.agg, z_aggregation_defaults(s))
    o_agg = aggregation.make_aggregator(objective_aggregation(s))
    solve_s: list[float] = list(saved.get("solve_s", []))
    zstep_s: list[float] = list(saved.get("zstep_s", []))
    with blas_one_thread():
        state = core.init_participant(index, X, n_classes, cs, labels=labels)
        if start:
            state = replace(state, W=saved["W"], Z_k=saved["Z_k"], XW=saved["XW"],
                            inner_iterations=int(saved["inner_iterations"]))
        Z = saved.get("Z", core.initial_z(n_rows, n_classes))
        rounds, stop = start, bool(saved.get("stopped", False))
        for r in range(start, s.max_iter):
            if stop:   # resumed after the last round
                break
            party.round = r
            t0 = time.perf_counter()
            state, Z_k = core.participant_z_step(state, Z, cs)
            zstep_s.append(time.perf_counter() - t0)
            z_agg.submit(party, srv, Z_k.ravel(), weight=state.zeta, round=2 * r)
            msg = party.recv(srv, Kind.Z)
            check_round(party, srv, msg, r, Kind.Z)
            Z = msg["Z"]
            t0 = time.perf_counter()
            state, terms = core.participant_w_step(state, Z, cs)
            solve_s.append(time.perf_counter() - t0)
            o_agg.submit(party, srv, terms, weight=1.0, round=2 * r + 1)
            step = party.recv(srv, Kind.STEP)
            check_round(party, srv, step, r, Kind.STEP)
            rounds, stop = r + 1, bool(step["stop"])
            party.checkpoint(rounds, {"W": state.W, "Z_k": state.Z_k, "XW": state.XW,
                                      "inner_iterations": state.inner_iterations, "Z": Z, "solve_s": solve_s,
                                      "zstep_s": zstep_s, "stopped": stop})
        scores = core.feature_scores(state.W)
        train_labels = labels if labels is not None else core.pseudo_labels(state.Z_k)
        acc = [core.selection_accuracy(X, train_labels, X_val, data.y_val, scores, p, s.knn_k)
               for p in s.percents]
    party.send(srv, Kind.REPORT, {"accuracy": acc, "inner_iterations": int(state.inner_iterations),
                               "n_features": int(X.shape[1]), "solver": state.system.solver})
    party.save_model(*model.participant_part(state.W, mean, scale, X, train_labels, s.percents, s.knn_k, n_classes,
                                             "labels" if holder else "pseudo_labels (argmax Z_k)", data.X_val))
    out = {"index": index, "label_holder": holder, "view": data.view, "data_kind": data.kind,
           "n_rows": n_rows, "n_features": int(X.shape[1]), "rounds": rounds, "solver": state.system.solver,
           "percents": list(s.percents), "accuracy": acc,
           "solve_s": solve_s, "zstep_s": zstep_s, "psi_s": psi_s,
           "bytes_sent": sum(party.bytes_sent.values()), "bytes_received": sum(party.bytes_received.values())}
    if s.report_model:
        out.update({"W": state.W.tolist(), "Z_k": np.asarray(state.Z_k).tolist(),
                    "ids": [int(i) for i in res.ids or []]})
    return out


def participants_in_order(party: PartyLike) -> list[str]:
    """Every participant's name (this party's too) in federation order; the first holds the labels."""
    return [n for n, r in party.roles.items() if r == PARTICIPANT]


def check_round(party: PartyLike, frm: str, msg: dict[str, Any], r: int, kind: str) -> None:
    """PeerFault (naming ``frm``) unless ``msg`` (checked against its schema) is for round ``r``."""
    if msg["r"] != r:
        raise PeerFault(party.name, frm, kind, f"for round {msg['r']}, arrived in round {r}")


ROLES: dict[str, Callable[..., dict[str, Any]]] = {SERVER: server, PARTICIPANT: participant}
