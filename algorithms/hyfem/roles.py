"""HyFEM's party roles (Zhang, Yin, Hong & Chen, "Hybrid Federated Learning", Algorithm 1): one
``server`` and M ``client`` parties.

Every step is :mod:`.core`'s; the roles only move its inputs and outputs between parties.
Round t (t = 0..T-1; ``round`` = t below):

* server -> client m: theta_{0,d} for each d in D_m (kind ``hyfem/theta<d>``, float32 of the
  view's extractor size) and w_m = Pi_m theta_0 (``hyfem/w``, float32 of ``n_inference``)
  -- ``message_for_client``;
* client m: scores what it received on the evaluation rows with its views (``evaluate_local``,
  reported as scalars, ``hyfem/report``), then Q local steps, eq. (9) (Avg) or eq. (6) (Prox)
  -- ``local_update``;
* eq. (7): for each view d, in view order, theta_{m,d} goes into **secure aggregation among the
  clients holding d** (:mod:`fedhet.protocols.aggregation`, aggregation round t*D + d; the server
  sees only the mean).  Secure aggregation needs >= 2 clients (``SecAggConfig.t``); a view with
  fewer holders makes every party refuse to start, unless ``allow_plain_views = true``, which
  sends that view's extractor in the clear (``hyfem/plain_view``, declared disclosure);
  ``aggregation = "plain"`` sends every view in the clear (the reference run);
* eq. (8): client m sends w_m to the server **in the clear** (``hyfem/inference``: Hungarian
  matching is not linear, so it cannot run on masked sums -- a declared disclosure of the local
  inference model, not of data); the server runs ``match_inference`` (P passes).

After T rounds one more model exchange and report give the final local scores.  Nothing else
leaves a client: no features, no labels (a client's messages are the aggregation's masked
vectors, w_m, its view list and scalar reports).

Checkpoint step k: rounds 0..k-1 done (matched averaging of round k-1 over); the server keeps
theta_{0,d}, theta_0, every Pi_m, the clients' indices and views and its curves; a client keeps its
curves and counters (the models it trains it is sent again each round; every round's batch order
and matching picks derive from (seed, client, round), so no RNG state goes on across rounds).
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from fedhet.algorithms.hyfem import core as H
from fedhet.algorithms.hyfem import model
from fedhet.algorithms.hyfem.messages import Kind
from fedhet.algorithms.hyfem.settings import AGGREGATION_DEFAULTS, Settings, model_spec
from fedhet.parties.api import PartyError, PeerFault, PeersDisagree, RoundFailed
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation
from fedhet.protocols.secagg import SecAggError


def plain_views(s: Settings, holders: dict[int, list[int]]) -> dict[int, str]:
    """Views whose holders are too few for secure aggregation (SecAggConfig.t) -> why; empty
    unless aggregation is secure."""
    if s.aggregation() != "secure":
        return {}
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    assert isinstance(agg, aggregation.SecureAggregator)
    secagg = agg.config
    out = {}
    for d, h in holders.items():
        try:
            secagg.t(len(h))
        except SecAggError as e:
            out[d] = str(e)
    return out


def check_holders(s: Settings, client_views: list, who: str) -> dict[int, list[int]]:
    """View -> holder indices; refuses views secure aggregation cannot serve (unless allowed)."""
    D = s.partition()[0]
    holders = {d: [m for m, v in enumerate(client_views) if d in v] for d in range(D)}
    if s.allow_plain_views:
        return holders
    for d, e in plain_views(s, holders).items():
        h = holders[d]
        raise PartyError(f"hyfem ({who}): view {d} is held by {len(h)} client(s) {h}; secure "
                         f"aggregation of its extractor is impossible ({e}). Give clients more "
                         f"views, or set allow_plain_views = true to send it in the clear")
    return holders


def _threads(s: Settings) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)


def flat_layers(layers) -> np.ndarray:
    return np.concatenate([np.concatenate([W.reshape(-1), b.reshape(-1)]) for W, b in layers]
                          ).astype(np.float32)


def unflat_layers(vec: np.ndarray, widths: list[int]):
    out, pos = [], 0
    for i, o in zip(widths[:-1], widths[1:]):
        W = vec[pos:pos + i * o].reshape(o, i)
        pos += i * o
        b = vec[pos:pos + o]
        pos += o
        out.append((np.array(W, dtype=np.float32), np.array(b, dtype=np.float32)))
    if pos != vec.size:
        raise PartyError(f"hyfem: inference vector has {vec.size} values, widths {widths} need {pos}")
    return out


def _check_round(party: PartyLike, msg: dict, r: int, kind: str, frm: str) -> None:
    if msg.get("round") != r:
        raise PeerFault(party.name, frm, kind, f"for round {msg.get('round')}, expected {r}")


def client(party: PartyLike, s: Settings, data: dict) -> dict:
    _threads(s)
    srv = party.peer_with_role("server")
    spec = model_spec(s)
    D = spec.n_views
    holders = check_holders(s, data["all_views"], party.name)
    in_clear = plain_views(s, holders)
    views = tuple(data["views"])
    m = int(data["index"])
    cfg = s.config(party.device)
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    clip = s.secagg_clip()
    widths = spec.inference_widths(views)
    train = H.ClientData(data["x_train"], data["y_train"])
    start, saved = party.restore()
    if not start:   # (a resumed run's server kept the indices and views it was told)
        party.send(srv, Kind.HELLO, {"index": m, "views": list(views)})
    curve: list[dict] = saved.get("curve", [])
    train_loss: list[float] = saved.get("train_loss", [])
    train_s: list[float] = saved.get("train_s", [])
    max_abs, clipped = saved.get("max_abs", 0.0), saved.get("clipped", 0)
    for r in range(start, s.rounds + 1):
        party.round = r
        ext = {}
        for d in views:
            msg = party.recv(srv, Kind.theta(d))
            _check_round(party, msg, r, Kind.theta(d), srv)
            ext[d] = np.asarray(msg["theta"], dtype=np.float32)
        msg = party.recv(srv, Kind.W)
        _check_round(party, msg, r, Kind.W, srv)
        received = H.ClientModels(views, ext, unflat_layers(np.asarray(msg["w"]), widths))
        ev = H.evaluate_local(received, spec, data["x_test"], data["y_test"], party.device)
        curve.append({"accuracy": ev["accuracy"], "loss": ev["loss"]})
        rep = {"round": r, "local_accuracy": ev["accuracy"], "local_loss": ev["loss"], "n_test": ev["n"],
               "train_loss": train_loss[-1] if train_loss else float("nan")}
        party.send(srv, Kind.REPORT, rep)
        party.metric(round=r, local_accuracy=ev["accuracy"])
        if r == s.rounds:
            break
        t0 = time.perf_counter()
        trained, info = H.local_update(received, train, spec, cfg, r, m)
        train_s.append(time.perf_counter() - t0)
        train_loss.append(info["loss"])
        for d in views:   # ascending: every aggregator's rounds increase
            vec = H.extractor_share(trained, d, 1.0)
            if d in in_clear:   # allowed by check_holders (allow_plain_views): in the clear
                party.send(srv, Kind.PLAIN_VIEW, {"round": r, "view": d, "theta": vec.astype(np.float32)})
                continue
            a = float(np.abs(vec).max())
            max_abs = max(max_abs, a)
            clipped += int(a > clip)
            res = agg.submit(party, srv, vec, weight=1.0, round=r * D + d)
            if res.status != "ok":
                raise RoundFailed(f"hyfem round {r}: view {d} aggregation {res.status} ({res.reason})")
        party.send(srv, Kind.INFERENCE, {"round": r, "w": flat_layers(trained.inference)})
        party.progress(r + 1, s.rounds, loss=round(info["loss"], 4))
        party.checkpoint(r + 1, {"curve": curve, "train_loss": train_loss, "train_s": train_s,
                                 "max_abs": max_abs, "clipped": clipped})
    # the model it would deploy: the global extractors of its views and w_m, as received last
    party.save_model(*model.part("client", spec, views, received.extractors, received.inference, data["scalers"],
                                 data["x_test_raw"], data["x_test"], dataset=s.dataset))
    if clipped and agg.method == "secure":
        party.log.warning("hyfem: |theta_md| reached %.3g > secagg_clip %g in %d submissions: clipped",
                          max_abs, clip, clipped)
    return {"index": m, "views": list(views), "n_train": train.n, "local_curve": curve,
            "train_loss": train_loss, "max_abs_extractor": max_abs, "clipped_submissions": clipped,
            "train_s": train_s, "bytes_sent": sum(party.bytes_sent.values()),
            "bytes_received": sum(party.bytes_received.values())}


def server(party: PartyLike, s: Settings, data: dict) -> dict:
    _threads(s)
    names = party.peers_with_role("client")
    if len(names) < 1:
        raise PartyError("hyfem: the federation has no client")
    spec = model_spec(s)
    D = spec.n_views
    start, saved = party.restore()
    if start:
        index, client_views = saved["index"], saved["state"]["client_views"]
    else:
        hello = party.gather(Kind.HELLO, frm=names)
        index = {n: int(h["index"]) for n, h in hello.items()}
        client_views = {index[n]: tuple(int(d) for d in hello[n]["views"]) for n in names}
    if sorted(index.values()) != list(range(len(names))):
        raise PeersDisagree(party.name, names, Kind.HELLO, f"client indices {sorted(index.values())} are not "
                            f"0..{len(names) - 1}")
    by_index = {i: n for n, i in index.items()}
    holders = check_holders(s, [client_views[m] for m in range(len(names))], party.name)
    in_clear = plain_views(s, holders)
    orphan = [d for d, h in holders.items() if not h]
    if orphan:   # own: the federation's views, as the clients declare them, leave a view without a holder
        raise PartyError(f"hyfem: view(s) {orphan} are held by no client")
    cfg = s.config(party.device)
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    state = H.ServerState(**saved["state"]) if start else H.init_server(spec, client_views, cfg)
    curves: dict[str, list] = saved.get("curves") or {
        "global_accuracy": [], "global_loss": [], "local_accuracy": [], "local_loss": [],
        "local_accuracy_per_client": [], "train_loss": []}
    round_s, bound, view_method = saved.get("round_s", []), saved.get("bound", 0.0), saved.get("view_method", {})
    for r in range(start, s.rounds + 1):
        party.round = r
        t0 = time.perf_counter()
        for m in range(len(names)):
            msg = H.message_for_client(state, spec, m)
            for d in msg.views:
                party.send(by_index[m], Kind.theta(d), {"round": r, "theta": msg.extractors[d]})
            party.send(by_index[m], Kind.W, {"round": r, "w": flat_layers(msg.inference)})
        reps = party.gather(Kind.REPORT, frm=names)
        g = H.evaluate_global(state, spec, data["x_test"], data["y_test"], party.device)
        loc = [reps[by_index[m]] for m in range(len(names))]
        curves["global_accuracy"].append(g["accuracy"])
        curves["global_loss"].append(g["loss"])
        curves["local_accuracy"].append(float(np.mean([x["local_accuracy"] for x in loc])))
        curves["local_loss"].append(float(np.mean([x["local_loss"] for x in loc])))
        curves["local_accuracy_per_client"].append([x["local_accuracy"] for x in loc])
        if r > 0:
            curves["train_loss"].append(float(np.mean([x["train_loss"] for x in loc])))
        party.metric(round=r, global_accuracy=g["accuracy"], local_accuracy=curves["local_accuracy"][-1])
        if r == s.rounds:
            break
        means = {}
        for d in range(D):
            h = [by_index[m] for m in holders[d]]
            if d in in_clear:
                msg = party.recv(h[0], Kind.PLAIN_VIEW)
                _check_round(party, msg, r, Kind.PLAIN_VIEW, h[0])
                if msg["view"] != d or np.shape(msg["theta"]) != state.extractors[d].shape:
                    raise PeerFault(party.name, h[0], Kind.PLAIN_VIEW, f"a malformed plain view {msg['view']} for view {d}")
                means[d] = np.asarray(msg["theta"], dtype=np.float32)
                view_method[d] = "plain (too few holders)"
                continue
            res = agg.aggregate(party, h, round=r * D + d, length=int(state.extractors[d].size))
            if res.dropped:   # HyFEM's server needs every holder of a view (its policy, not a proof)
                raise RoundFailed(f"hyfem round {r}: view {d} aggregation dropped {res.dropped}")
            means[d] = res.mean.astype(np.float32)
            bound = max(bound, float(res.mean_error_bound))
            view_method[d] = agg.method
        state = H.update_extractors(state, means)
        inf = party.gather(Kind.INFERENCE, frm=names)
        layers = {}
        for n, msg in inf.items():
            _check_round(party, msg, r, Kind.INFERENCE, n)
            layers[index[n]] = unflat_layers(np.asarray(msg["w"]), spec.inference_widths(client_views[index[n]]))
        state, _ = H.match_inference(state, spec, layers, cfg, r)
        round_s.append(time.perf_counter() - t0)
        party.progress(r + 1, s.rounds, global_acc=round(g["accuracy"], 4))
        party.checkpoint(r + 1, {"state": dataclasses.asdict(state), "index": index, "curves": curves,
                                 "round_s": round_s, "bound": bound, "view_method": view_method})
    party.save_model(*model.part("server", spec, tuple(range(D)), state.extractors, state.inference, data["scalers"],
                                 data["x_test_raw"], data["x_test"], dataset=s.dataset))
    models = {}
    if s.return_models:
        models = {"extractors": [state.extractors[d].tolist() for d in range(D)],
                  "inference": [[W.tolist(), b.tolist()] for W, b in state.inference]}
    return {**curves, **models, "rounds": s.rounds, "clients": len(names), "method": s.method, "mu": s.mu,
            "dataset": s.dataset, "scenario": s.scenario, "partition": list(s.partition()),
            "client_views": {str(m): list(v) for m, v in client_views.items()},
            "view_aggregation": {str(d): view_method.get(d) for d in range(D)},
            "max_mean_error_bound": bound, "global_widths": [e["global_widths"] for e in state.history],
            "final_global_accuracy": curves["global_accuracy"][-1],
            "final_local_accuracy": curves["local_accuracy"][-1], "round_s": round_s,
            "note": "ModelNet40 is not available offline; Handwritten / COIL-20 stand in"}


ROLES = {"server": server, "client": client}
