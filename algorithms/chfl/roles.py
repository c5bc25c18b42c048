"""CHFL's party roles: one ``server`` and K ``client`` parties (Mori et al., Algorithm 2).

``method = "chfl"``: per mini-batch a client takes one Adam step on its copy of the common column
theta_c with the common-only loss, then one on its unique column and lateral matrices U_k with the
whole network's loss, theta_c fixed (eqs. 6-7; :meth:`~fedhet.algorithms.chfl.core.CHFLClient.train_round`).
After E local epochs it submits theta_c, one flat float32 vector, weighted by its training-row
count, to the aggregator (:mod:`fedhet.protocols.aggregation`: ``"secure"`` = Bonawitz et al.'s
secure aggregation, the server sees masked ring vectors only; ``"plain"`` = in the clear).  The
server sends the weighted mean back (Algorithm 2 line 7, ``chfl/global``) and the client evaluates
(theta_c^(t+1), theta_u,k, U_k), as the paper defines Theta_k^t.  ``method = "common"``: FedAvg of
the common column alone; ``method = "local"``: each client trains one MLP on all its features
alone, and the server only receives the final scores.

Selection is each client's alone, on its validation rows: lr (one common column per lr, each
aggregated separately), mu and (``select = "best_round"``) the round.  Reported groups:
``common``, ``chfl_mu0``, ``chfl_mu>0``, ``local`` -- the columns of Table II.

Trained parts (:mod:`.model`): a client saves the network it would deploy -- its selection among the
method's networks (for ``chfl`` every (lr, mu): the better of ``chfl_mu0`` and ``chfl_mu>0``) at the
selected round, kept as training goes (:class:`~fedhet.algorithms.chfl.model.Keeper`) -- with its scaler;
the server saves the global common column(s) of the last round.

Checkpoint step k: k rounds done (k averages of theta_c; with ``method = "local"`` k rounds of local
training); a client keeps each trainer's networks, Adam states and batch generator, its kept snapshots,
curves, losses and clip counts; the server keeps the global common column(s) and its round records.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from fedhet.algorithms.chfl import model
from fedhet.algorithms.chfl.core import CHFLClient, LocalClient, select_per_client
from fedhet.algorithms.chfl.data import ClientRows, own_client_data
from fedhet.algorithms.chfl.messages import Kind
from fedhet.algorithms.chfl.models import init_common_flat
from fedhet.algorithms.chfl.settings import Settings, aggregation_defaults
from fedhet.algorithms.toolkit import derive_seed, synchronize
from fedhet.parties.api import PartyError, PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation


def _threads(s: Settings) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)


def _labels(s: Settings) -> list[str]:
    if s.method == "local":
        return ["local"]
    return ["common"] + [f"chfl_mu={m:g}" for m in s.mus]


def _groups(s: Settings) -> dict[str, list[tuple[int, str, dict]]]:
    """Table II's columns -> the (lr index, label, config) candidates each client picks from, in the
    order of the sweep's candidates (lr outer, mu inner; ties keep the first)."""
    out: dict[str, list] = {}
    for j, lr in enumerate(s.lrs):
        if s.method == "local":
            out.setdefault("local", []).append((j, "local", {"lr": lr}))
            continue
        out.setdefault("common", []).append((j, "common", {"lr": lr}))
        for m in s.mus:
            g = "chfl_mu0" if m == 0 else "chfl_mu>0"
            out.setdefault(g, []).append((j, f"chfl_mu={m:g}", {"lr": lr, "mu": m}))
    return out


def _deployed(s: Settings) -> list[tuple[int, str, dict]]:
    """The candidates of the network a client deploys (its saved part), in the sweep's order: for
    method chfl every (lr, mu) network (groups chfl_mu0 and chfl_mu>0 together), else the method's group."""
    groups = _groups(s)
    if s.method != "chfl":
        return groups[s.method]
    return sorted(groups.get("chfl_mu0", []) + groups.get("chfl_mu>0", []),
                  key=lambda c: (c[0], s.mus.index(c[2]["mu"])))


def _traffic(party: PartyLike) -> dict[str, int]:
    return {"bytes_sent": sum(party.bytes_sent.values()),
            "bytes_received": sum(party.bytes_received.values())}


def client(party: PartyLike, s: Settings, data: ClientRows) -> dict:
    _threads(s)
    server_name = party.peer_with_role("server")
    n_clients = len(party.peers_with_role("client")) + 1
    if data.n_clients != n_clients:
        raise PartyError(f"chfl: data was split for {data.n_clients} clients, the federation has {n_clients}")
    cd = own_client_data(data, s, party.device)
    k = data.index
    # Weights come from toolkit.seeded blocks, which parties that are threads of one process (the
    # in-memory transport) never enter at once.
    local = s.method == "local"
    alone = [LocalClient(cd, lr=lr, hidden=s.hidden, seed=s.seed, index=k) for lr in s.lrs] if local else []
    federated = [] if local else [CHFLClient(cd, mus=s.mus, lr=lr, hidden=s.hidden, seed=s.seed, index=k,
                                             reset_common_optim=s.reset_common_optim) for lr in s.lrs]
    models: list[CHFLClient | LocalClient] = [*alone, *federated]
    P = s.common_params
    labels = _labels(s)
    n_train = cd.n_train
    agg = aggregation.make_aggregator(s.agg, aggregation_defaults(s, data.n_clients))
    clip = s.secagg_clip
    curves: list[dict[str, dict[str, list[float]]]] = [
        {lab: {"val": [], "test": []} for lab in labels} for _ in s.lrs]
    losses: list[list[float]] = []
    train_s: list[float] = []
    submit_s: list[float] = []
    max_abs, clipped_rounds = 0.0, 0
    keeper = model.Keeper.of(s.select, cd)   # each deployable network at its selected round so far
    start, saved = party.restore()
    if saved:
        for m, st in zip(models, saved["models"], strict=True):
            m.load_state(st)
        keeper.load_state(saved["keeper"])
        curves, losses, train_s, submit_s = saved["curves"], saved["losses"], saved["train_s"], saved["submit_s"]
        max_abs, clipped_rounds = saved["max_abs"], saved["clipped_rounds"]

    def evaluate() -> None:
        for j, m in enumerate(models):
            for part in ("val", "test"):
                e = m.evaluate(part)
                if s.method == "local":
                    curves[j]["local"][part].append(e["local"])
                else:
                    curves[j]["common"][part].append(e["common"])
                    for h, lab in enumerate(labels[1:]):
                        curves[j][lab][part].append(e["heads"][h])

    for r in range(start, s.rounds + 1):
        party.round = r
        if s.method != "local":
            # The schema has checked G float32 (P_c,) vectors, finite; the round is the role's to check.
            msg = party.recv(server_name, Kind.GLOBAL, timeout=s.recv_timeout)
            if msg["r"] != r:
                raise PeerFault(party.name, server_name, Kind.GLOBAL, f"global model for round {msg['r']} in round {r}")
            for fm, th in zip(federated, msg["theta"]):
                fm.set_common(th)
        if r > 0:  # Theta_k^(r-1) = (theta_c^(r), theta_u,k, U_k)
            evaluate()
            for j, m in enumerate(models):
                for lab, modules, score in model.candidates(m, s.method):
                    keeper.offer((j, lab), r, curves[j][lab]["val"][-1], modules, score)
            last = curves[-1][labels[-1]]
            party.metric(round=r - 1, loss=float(np.mean(losses[-1])), val=last["val"][-1],
                         test=last["test"][-1], train_s=train_s[-1])
            party.progress(r, s.rounds, val=round(last["val"][-1], 4))
        if r == s.rounds:
            break
        t0 = time.perf_counter()
        rl = []
        for m in models:
            out = m.train_round(s.local_epochs, s.batch_size)
            rl.append(out["loss"] if s.method == "local" else out["loss_common"])
        synchronize(party.device)
        train_s.append(time.perf_counter() - t0)
        losses.append(rl)
        if s.method != "local":
            t0 = time.perf_counter()
            for j, fm in enumerate(federated):
                vec = fm.get_common()
                if vec.shape != (P,):  # never send anything but the common column
                    raise AssertionError(f"common vector has {vec.shape}, expected ({P},)")
                a = float(np.abs(vec).max())
                max_abs = max(max_abs, a)
                clipped_rounds += int(a > clip)
                res = agg.submit(party, server_name, vec, weight=n_train, round=r * s.G + j)
                if res.status != "ok":
                    party.log.warning("chfl round %d: aggregation %s (%s)", r, res.status, res.reason)
            submit_s.append(time.perf_counter() - t0)
        party.checkpoint(r + 1, {"models": [m.state() for m in models], "keeper": keeper.state(),
                                 "curves": curves, "losses": losses, "train_s": train_s, "submit_s": submit_s,
                                 "max_abs": max_abs, "clipped_rounds": clipped_rounds})
    if clipped_rounds and agg.method == "secure":
        party.log.warning("chfl: |theta_c| reached %.3g > secagg_clip %g in %d submissions: clipped",
                          max_abs, clip, clipped_rounds)

    # Each client picks lr / mu / round on its own validation rows (select_per_client on a
    # one-client table).
    n_test = int(cd.y["test"].shape[0])
    def pick(cands: list[tuple[int, str, dict]]) -> dict:
        c = [{"val": [[v] for v in curves[j][lab]["val"]], "test": [[v] for v in curves[j][lab]["test"]],
              "config": cfgd} for j, lab, cfgd in cands]
        return select_per_client(c, s.select)

    selected = {}
    for g, cands in _groups(s).items():
        sel = pick(cands)
        selected[g] = {"test": sel["test"][0], "chosen": sel["chosen"][0]}
    final = {lab if len(s.lrs) == 1 else f"{lab} lr={lr:g}": curves[j][lab]["test"][-1]
             for j, lr in enumerate(s.lrs) for lab in labels}
    report = {"n_test": n_test, "selected": selected, "final": final,
              "train_s": train_s, "submit_s": submit_s}
    party.send(server_name, Kind.RESULT, report)
    # The part: the deployable network this client's selection picks, at its selected round.
    cands = _deployed(s)
    chosen = pick(cands)["chosen"][0]
    if chosen is None:
        party.log.warning("chfl: no validation accuracy to select a network by; no trained part saved")
    else:
        j, lab, _ = next(c for c in cands if c[2] == {k: v for k, v in chosen.items() if k != "round"})
        snap = keeper.best[(j, lab)]
        if snap.round != chosen["round"]:
            raise AssertionError(f"chfl: kept round {snap.round} of {lab}, selected round {chosen['round']}")
        group = s.method if s.method != "chfl" else ("chfl_mu0" if chosen["mu"] == 0 else "chfl_mu>0")
        party.save_model(*model.client_part(s, data, cd, snap, {"group": group, **chosen}))
    return {**report, "curves": curves, "train_loss": losses, "n_train": n_train,
            "n_val": int(cd.y["val"].shape[0]), "n_common": cd.d_common, "n_unique": cd.d_unique,
            "common_params": P if s.method != "local" else 0, "max_abs_common": max_abs,
            "clipped_submissions": clipped_rounds, "aggregation": agg.method if s.G else None,
            "device": party.device, **_traffic(party)}


def server(party: PartyLike, s: Settings, data: None) -> dict:
    _threads(s)
    clients = party.peers_with_role("client")
    if not clients:
        raise PartyError("chfl: the federation has no client")
    if s.n_clients is not None and s.n_clients != len(clients):
        raise PartyError(f"chfl: n_clients = {s.n_clients} but the federation has {len(clients)} clients")
    t_start = time.perf_counter()
    P = s.common_params
    agg = aggregation.make_aggregator(s.agg, aggregation_defaults(s, len(clients)))
    start, saved = party.restore()
    round_s: list[float] = saved.get("round_s", [])
    agg_s: list[float] = saved.get("agg_s", [])
    bound: float = saved.get("bound", 0.0)
    dropped: dict[int, list[str]] = saved.get("dropped", {})
    thetas: list[np.ndarray] = []
    if s.method == "local":
        # The server takes part in no round of local training: its state is the same at every step,
        # so it holds steps 1..T from the start (the last two kept: a local run resumes from step
        # T-1 or T, or starts over).
        for r in range(start, s.rounds):
            party.checkpoint(r + 1, {})
    else:
        theta0 = init_common_flat(s.n_common, s.class_count, s.hidden, derive_seed(s.seed, "theta0"))
        thetas = saved["thetas"] if saved else [theta0] * s.G
        for r in range(start, s.rounds + 1):
            party.round = r
            t0 = time.perf_counter()
            party.broadcast(Kind.GLOBAL, {"r": r, "theta": thetas}, to=clients)
            if r == s.rounds:
                break
            new = []
            ta = 0.0
            for j in range(s.G):
                t1 = time.perf_counter()
                res = agg.aggregate(party, clients, round=r * s.G + j, length=P)
                ta += time.perf_counter() - t1
                new.append(res.mean.astype(np.float32))
                bound = max(bound, float(res.mean_error_bound))
                if res.dropped:
                    dropped[r] = sorted(set(dropped.get(r, [])) | set(res.dropped))
            thetas = new
            round_s.append(time.perf_counter() - t0)
            agg_s.append(ta)
            party.metric(round=r, round_s=round_s[-1], aggregate_s=ta)
            party.progress(r + 1, s.rounds)
            party.checkpoint(r + 1, {"thetas": thetas, "round_s": round_s, "agg_s": agg_s, "bound": bound,
                                     "dropped": dropped})
    # Local clients train alone for all rounds before reporting: allow each round the timeout.
    wait = (s.recv_timeout or party.timeout) * (s.rounds + 1 if s.method == "local" else 1)
    reports = {c: party.recv(c, Kind.RESULT, timeout=wait) for c in clients}
    out_sel = {}
    for g in _groups(s):
        tests = [float(reports[c]["selected"][g]["test"]) for c in clients]
        out_sel[g] = {"mean_test": float(np.mean(tests)), "test": tests,
                      "chosen": [reports[c]["selected"][g]["chosen"] for c in clients]}
    final_keys = list(reports[clients[0]]["final"])
    final = {lab: float(np.mean([reports[c]["final"][lab] for c in clients])) for lab in final_keys}
    n_test = [int(reports[c]["n_test"]) for c in clients]
    train_s = [reports[c]["train_s"] for c in clients]
    out = {
        "method": s.method, "dataset": s.dataset, "clients": clients, "rounds": s.rounds,
        "local_epochs": s.local_epochs, "lrs": list(s.lrs), "mus": list(s.mus), "seed": s.seed,
        "feature_seed": s.seed if s.feature_seed is None else s.feature_seed,
        "aggregation": agg.method if s.G else None, "n_common": s.n_common,
        "common_params": P if s.G else 0,
        "selected": out_sel, "final_test": final, "n_test": n_test,
        "round_s": round_s, "aggregate_s": agg_s,
        "mean_round_s": float(np.mean(round_s)) if round_s else None,
        "client_train_s": train_s, "client_submit_s": [reports[c]["submit_s"] for c in clients],
        "max_mean_error_bound": bound, "dropped": {str(k): v for k, v in dropped.items()},
        "wall_s": time.perf_counter() - t_start, **_traffic(party),
    }
    if s.return_weights:
        out["theta"] = [t.tolist() for t in thetas]
    if thetas:   # the global common column(s) after the last round
        party.save_model(*model.server_part(s, thetas, len(clients)))
    return out


ROLES: dict[str, Callable[..., dict]] = {"server": server, "client": client}
