"""HyFEM's party roles (Zhang, Yin, Hong & Chen, "Hybrid Federated Learning", Algorithm 1): one
``server`` and M ``client`` parties.

Every step is :mod:`.core`'s; the roles only move its inputs and outputs between parties, each role
a sequence of named steps over its state (:class:`ClientState`, :class:`ServerRoleState`: what the
role carries across rounds, ``state()`` for a checkpoint, ``restored(saved)`` to resume).
Round t (t = 0..T-1; ``round`` = t below):

* server -> client m: theta_{0,d} for each d in D_m (kind ``hyfem/theta<d>``, float32 of the
  view's extractor size) and w_m = Pi_m theta_0 (``hyfem/w``, float32 of ``n_inference``)
  -- ``message_for_client`` (:meth:`ServerRoleState.send_models`, :func:`receive_models`);
* client m: scores what it received on the evaluation rows with its views (``evaluate_local``,
  reported as scalars, ``hyfem/report``), then Q local steps, Eq. (9) (Avg) or Eq. (6) (Prox)
  -- ``local_update``;
* Eq. (7): for each view d, in view order, theta_{m,d} goes into **secure aggregation among the
  clients holding d** (:mod:`fedhet.protocols.aggregation`, aggregation round t*D + d; the server
  sees only the mean).  Secure aggregation needs >= 2 clients (``SecAggConfig.t``); a view with
  fewer holders makes every party refuse to start, unless ``allow_plain_views = true``, which
  sends that view's extractor in the clear (``hyfem/plain_view``, declared disclosure);
  ``aggregation = "plain"`` sends every view in the clear (the reference run);
* Eq. (8): client m sends w_m to the server **in the clear** (``hyfem/inference``: Hungarian
  matching is not linear, so it cannot run on masked sums -- a declared disclosure of the local
  inference model, not of data); the server runs ``match_inference`` (P passes).

The paper's equations and the functions that compute them:

=======  =======================================  ===================================================
eq.      what                                     function
=======  =======================================  ===================================================
Eq. (6)  HyFEM-Prox's local objective: loss +     :meth:`ClientState.train` (``core.local_update``,
         mu dist(Pi_m theta_0, w_m) +             ``method = "prox"``)
         sum_d dist(theta_{m,d}, theta_{0,d})
Eq. (7)  theta_{0,d} = the mean of theta_{m,d}    :meth:`ClientState.send_updates` (secure aggregation
         over the clients holding view d          among the holders) -> :meth:`ServerRoleState.average_views`
                                                  (``core.update_extractors``; in the clear
                                                  ``core.sum_view_shares``, ``core.view_means``)
Eq. (8)  matched averaging: min over theta_0,     :meth:`ClientState.send_updates` (w_m in the clear) ->
         Pi_m of sum_m dist(Pi_m theta_0, w_m)    :meth:`ServerRoleState.match` (``core.match_inference``,
                                                  :mod:`.matching`)
Eq. (9)  HyFEM-Avg's local objective: the loss    :meth:`ClientState.train` (``core.local_update``,
         alone                                    ``method = "avg"``)
=======  =======================================  ===================================================

After T rounds one more model exchange and report give the final local scores.  Nothing else
leaves a client: no features, no labels (a client's messages are the aggregation's masked
vectors, w_m, its view list and scalar reports).

Checkpoint step k: rounds 0..k-1 done (matched averaging of round k-1 over); the server keeps
theta_{0,d}, theta_0, every Pi_m, the clients' indices and views, its curves and timings; a client
keeps its curves, timings and counters (the models it trains it is sent again each round; every
round's batch order and matching picks derive from (seed, client, round), so no RNG state goes on
across rounds).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from fedhet.algorithms.hyfem import core as H
from fedhet.algorithms.dp_sgd import DPStep
from fedhet.algorithms.hyfem import model, privacy
from fedhet.algorithms.hyfem.messages import Kind
from fedhet.algorithms.hyfem.models import HyFEMModelSpec
from fedhet.algorithms.hyfem.settings import AGGREGATION_DEFAULTS, Settings, model_spec
from fedhet.algorithms.toolkit import Phases, traffic_totals
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


# ------------------------------------------------------------------------------ the client

@dataclass
class ClientState:
    """What a client carries across rounds: its local curve, training losses and timings, and the
    largest |theta_{m,d}| it submitted with the count of clipped submissions (the models it trains it
    is sent again each round)."""

    curve: list[dict] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    phases: Phases = field(default_factory=lambda: Phases({"train": []}))
    max_abs: float = 0.0
    clipped: int = 0
    dp: tuple[DPStep, torch.Generator] | None = None   # record-level DP-SGD (not checkpointed: private noise)

    @classmethod
    def restored(cls, saved: dict) -> "ClientState":
        """Round 0's state, or that of the checkpoint ``saved`` (when not empty)."""
        if not saved:
            return cls()
        return cls(saved["curve"], saved["train_loss"], Phases.restored(saved["phases"]), saved["max_abs"],
                   saved["clipped"])

    def state(self) -> dict:
        """The checkpoint: what :meth:`restored` goes on from."""
        return {"curve": self.curve, "train_loss": self.train_loss, "phases": self.phases.state(),
                "max_abs": self.max_abs, "clipped": self.clipped}

    def report(self, party: PartyLike, srv: str, received: H.ClientModels, spec: HyFEMModelSpec, data: dict,
               r: int) -> None:
        """Score the received models on the evaluation rows with the own views (``evaluate_local``)
        and tell the server, as scalars."""
        ev = H.evaluate_local(received, spec, data["x_test"], data["y_test"], party.device)
        self.curve.append({"accuracy": ev["accuracy"], "loss": ev["loss"]})
        rep = {"round": r, "local_accuracy": ev["accuracy"], "local_loss": ev["loss"], "n_test": ev["n"],
               "train_loss": self.train_loss[-1] if self.train_loss else float("nan")}
        party.send(srv, Kind.REPORT, rep)
        party.metric(round=r, local_accuracy=ev["accuracy"])

    def train(self, received: H.ClientModels, train: H.ClientData, spec: HyFEMModelSpec, cfg: H.HyFEMConfig,
              r: int, m: int) -> H.ClientModels:
        """Q local steps from the received models, Eq. (9) (Avg) or Eq. (6) (Prox): ``local_update``."""
        with self.phases.timed("train"):
            trained, info = H.local_update(received, train, spec, cfg, r, m, dp=self.dp)
        self.train_loss.append(info["loss"])
        return trained

    def send_updates(self, party: PartyLike, srv: str, s: Settings, spec: HyFEMModelSpec,
                     agg: aggregation.Aggregator, trained: H.ClientModels, in_clear: dict[int, str], r: int) -> None:
        """Eq. (7): each view's theta_{m,d}, in view order, into the aggregation among its holders
        (round r*D + d; in the clear where ``check_holders`` allowed it); Eq. (8): w_m in the clear."""
        for d in trained.views:   # ascending: every aggregator's rounds increase
            vec = H.extractor_share(trained, d, 1.0)
            if d in in_clear:   # allowed by check_holders (allow_plain_views): in the clear
                party.send(srv, Kind.PLAIN_VIEW, {"round": r, "view": d, "theta": vec.astype(np.float32)})
                continue
            a = float(np.abs(vec).max())
            self.max_abs = max(self.max_abs, a)
            self.clipped += int(a > s.secagg_clip())
            res = agg.submit(party, srv, vec, weight=1.0, round=r * spec.n_views + d)
            if res.status != "ok":
                raise RoundFailed(f"hyfem round {r}: view {d} aggregation {res.status} ({res.reason})")
        party.send(srv, Kind.INFERENCE, {"round": r, "w": flat_layers(trained.inference)})


def receive_models(party: PartyLike, srv: str, views: tuple[int, ...], widths: list[int], r: int) -> H.ClientModels:
    """Round r's theta_{0,d} for each own view d and w_m = Pi_m theta_0, as the server sent them."""
    ext = {}
    for d in views:
        msg = party.recv(srv, Kind.theta(d))
        _check_round(party, msg, r, Kind.theta(d), srv)
        ext[d] = np.asarray(msg["theta"], dtype=np.float32)
    msg = party.recv(srv, Kind.W)
    _check_round(party, msg, r, Kind.W, srv)
    return H.ClientModels(views, ext, unflat_layers(np.asarray(msg["w"]), widths))


def client(party: PartyLike, s: Settings, data: dict) -> dict:
    """Receive the models, report their local scores, Q local steps, send theta_{m,d} (Eq. (7)) and
    w_m (Eq. (8)), checkpoint; after T rounds one more exchange and report, then save the received models."""
    _threads(s)
    srv = party.peer_with_role("server")
    spec = model_spec(s)
    in_clear = plain_views(s, check_holders(s, data["all_views"], party.name))
    views, m = tuple(data["views"]), int(data["index"])
    cfg = s.config(party.device)
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    train = H.ClientData(data["x_train"], data["y_train"])
    start, saved = party.restore()
    if not start:   # (a resumed run's server kept the indices and views it was told)
        party.send(srv, Kind.HELLO, {"index": m, "views": list(views)})
    st = ClientState.restored(saved)
    ledger = None
    if s.dp.dp == "record":   # every local step is DP-SGD; charged per round before the steps
        ledger, st.dp = privacy.record_plan(s, train.n, party.name)
        if "dp_rounds" in saved:
            ledger.rounds, ledger.steps = list(saved["dp_rounds"]), int(saved["dp_steps"])
    for r in range(start, s.rounds + 1):
        party.round = r
        received = receive_models(party, srv, views, spec.inference_widths(views), r)
        st.report(party, srv, received, spec, data, r)
        if r == s.rounds:
            break
        if ledger is not None:
            party.metric(dp_epsilon=ledger.charge(r))
        trained = st.train(received, train, spec, cfg, r, m)
        st.send_updates(party, srv, s, spec, agg, trained, in_clear, r)
        party.progress(r + 1, s.rounds, loss=round(st.train_loss[-1], 4))
        party.checkpoint(r + 1, {**st.state(), **({"dp_rounds": ledger.rounds, "dp_steps": ledger.steps}
                                                  if ledger is not None else {})})
    # the model it would deploy: the global extractors of its views and w_m, as received last
    party.save_model(*model.part("client", spec, views, received.extractors, received.inference, data["scalers"],
                                 data["x_test_raw"], data["x_test"], dataset=s.dataset))
    if st.clipped and agg.method == "secure":
        party.log.warning("hyfem: |theta_md| reached %.3g > secagg_clip %g in %d submissions: clipped",
                          st.max_abs, s.secagg_clip(), st.clipped)
    return {"index": m, "views": list(views), "n_train": train.n, "local_curve": st.curve,
            "train_loss": st.train_loss, "max_abs_extractor": st.max_abs, "clipped_submissions": st.clipped,
            **st.phases.result(), **traffic_totals(party),
            **({"privacy": ledger.as_dict()} if ledger is not None else {})}


# ------------------------------------------------------------------------------ the server

def _empty_curves() -> dict[str, list]:
    return {"global_accuracy": [], "global_loss": [], "local_accuracy": [], "local_loss": [],
            "local_accuracy_per_client": [], "train_loss": []}


@dataclass
class ServerRoleState:
    """What the server carries across rounds: the model (:class:`~fedhet.algorithms.hyfem.core.ServerState`:
    theta_{0,d}, theta_0, every Pi_m, the clients' views, the matching history), the clients' indices,
    the curves, the round timings, the largest error bound of a mean and how each view was aggregated."""

    model: H.ServerState
    index: dict[str, int]
    curves: dict[str, list] = field(default_factory=_empty_curves)
    phases: Phases = field(default_factory=lambda: Phases({"round": []}))
    bound: float = 0.0
    view_method: dict[int, str] = field(default_factory=dict)

    @classmethod
    def restored(cls, saved: dict) -> "ServerRoleState":
        return cls(H.ServerState(**saved["model"]), saved["index"], saved["curves"], Phases.restored(saved["phases"]),
                   saved["bound"], saved["view_method"])

    def state(self) -> dict:
        """The checkpoint: what :meth:`restored` goes on from."""
        return {"model": dataclasses.asdict(self.model), "index": self.index, "curves": self.curves,
                "phases": self.phases.state(), "bound": self.bound, "view_method": self.view_method}

    @property
    def by_index(self) -> dict[int, str]:
        """Client index m -> party name (the indices are 0..M-1: :func:`view_plan` checked them)."""
        return {i: n for n, i in self.index.items()}

    def send_models(self, party: PartyLike, spec: HyFEMModelSpec, r: int) -> None:
        """To each client m: theta_{0,d} for d in D_m and w_m = Pi_m theta_0 (``message_for_client``)."""
        for m, name in sorted(self.by_index.items()):
            msg = H.message_for_client(self.model, spec, m)
            for d in msg.views:
                party.send(name, Kind.theta(d), {"round": r, "theta": msg.extractors[d]})
            party.send(name, Kind.W, {"round": r, "w": flat_layers(msg.inference)})

    def record_scores(self, party: PartyLike, spec: HyFEMModelSpec, data: dict, names: list[str], r: int) -> dict:
        """Round r's curves: the clients' reports (local accuracy, their own views) and theta_0 with every
        view on the evaluation rows (global accuracy, ``evaluate_global``), which it returns."""
        reps = party.gather(Kind.REPORT, frm=names)
        g = H.evaluate_global(self.model, spec, data["x_test"], data["y_test"], party.device)
        loc = [reps[name] for _, name in sorted(self.by_index.items())]
        self.curves["global_accuracy"].append(g["accuracy"])
        self.curves["global_loss"].append(g["loss"])
        self.curves["local_accuracy"].append(float(np.mean([x["local_accuracy"] for x in loc])))
        self.curves["local_loss"].append(float(np.mean([x["local_loss"] for x in loc])))
        self.curves["local_accuracy_per_client"].append([x["local_accuracy"] for x in loc])
        if r > 0:
            self.curves["train_loss"].append(float(np.mean([x["train_loss"] for x in loc])))
        party.metric(round=r, global_accuracy=g["accuracy"], local_accuracy=self.curves["local_accuracy"][-1])
        return g

    def average_views(self, party: PartyLike, agg: aggregation.Aggregator, holders: dict[int, list[int]],
                      in_clear: dict[int, str], r: int) -> None:
        """Eq. (7): theta_{0,d} = the mean of theta_{m,d} over the holders of view d, by aggregation
        among them (round r*D + d), or in the clear where ``check_holders`` allowed it."""
        means, by_index, D = {}, self.by_index, len(holders)   # check_holders: an entry per view
        for d in range(D):
            h = [by_index[m] for m in holders[d]]
            if d in in_clear:
                means[d] = receive_plain_view(party, h[0], d, self.model.extractors[d].shape, r)
                self.view_method[d] = "plain (too few holders)"
                continue
            res = agg.aggregate(party, h, round=r * D + d, length=int(self.model.extractors[d].size))
            if res.dropped:   # HyFEM's server needs every holder of a view (its policy, not a proof)
                raise RoundFailed(f"hyfem round {r}: view {d} aggregation dropped {res.dropped}")
            means[d] = res.mean.astype(np.float32)
            self.bound = max(self.bound, float(res.mean_error_bound))
            self.view_method[d] = agg.method
        self.model = H.update_extractors(self.model, means)

    def match(self, party: PartyLike, spec: HyFEMModelSpec, cfg: H.HyFEMConfig, names: list[str], r: int) -> None:
        """Eq. (8): every client's w_m (in the clear), Hungarian-matched into theta_0 (``match_inference``)."""
        layers = {}
        for n, msg in party.gather(Kind.INFERENCE, frm=names).items():
            _check_round(party, msg, r, Kind.INFERENCE, n)
            m = self.index[n]
            layers[m] = unflat_layers(np.asarray(msg["w"]), spec.inference_widths(self.model.client_views[m]))
        self.model, _ = H.match_inference(self.model, spec, layers, cfg, r)


def receive_plain_view(party: PartyLike, sender: str, d: int, shape: tuple[int, ...], r: int) -> np.ndarray:
    """View d's extractor sent in the clear by its only holder (``allow_plain_views``)."""
    msg = party.recv(sender, Kind.PLAIN_VIEW)
    _check_round(party, msg, r, Kind.PLAIN_VIEW, sender)
    if msg["view"] != d or np.shape(msg["theta"]) != shape:
        raise PeerFault(party.name, sender, Kind.PLAIN_VIEW, f"a malformed plain view {msg['view']} for view {d}")
    return np.asarray(msg["theta"], dtype=np.float32)


def hello(party: PartyLike, names: list[str]) -> tuple[dict[str, int], dict[int, tuple[int, ...]]]:
    """The clients' indices and views, as each declares them."""
    msgs = party.gather(Kind.HELLO, frm=names)
    index = {n: int(h["index"]) for n, h in msgs.items()}
    return index, {index[n]: tuple(int(d) for d in msgs[n]["views"]) for n in names}


def view_plan(party: PartyLike, s: Settings, names: list[str], index: dict[str, int],
              client_views: dict[int, tuple[int, ...]]) -> tuple[dict[int, list[int]], dict[int, str]]:
    """Each view's holders and the views sent in the clear, after checking the clients' declarations:
    indices 0..M-1, every view held, each view aggregatable (or allowed in the clear)."""
    if sorted(index.values()) != list(range(len(names))):
        raise PeersDisagree(party.name, names, Kind.HELLO, f"client indices {sorted(index.values())} are not "
                            f"0..{len(names) - 1}")
    holders = check_holders(s, [client_views[m] for m in range(len(names))], party.name)
    in_clear = plain_views(s, holders)
    orphan = [d for d, h in holders.items() if not h]
    if orphan:   # own: the federation's views, as the clients declare them, leave a view without a holder
        raise PartyError(f"hyfem: view(s) {orphan} are held by no client")
    return holders, in_clear


def server_result(s: Settings, st: ServerRoleState, D: int, n_clients: int) -> dict:
    """The server's result: the curves, the settings, how each view was aggregated, the matched
    widths per round, the timings (and with ``return_models`` the final models)."""
    models = {}
    if s.return_models:
        models = {"extractors": [st.model.extractors[d].tolist() for d in range(D)],
                  "inference": [[W.tolist(), b.tolist()] for W, b in st.model.inference]}
    return {**st.curves, **models, "rounds": s.rounds, "clients": n_clients, "method": s.method, "mu": s.mu,
            "dataset": s.dataset, "scenario": s.scenario, "partition": list(s.partition()),
            "client_views": {str(m): list(v) for m, v in st.model.client_views.items()},
            "view_aggregation": {str(d): st.view_method.get(d) for d in range(D)},
            "max_mean_error_bound": st.bound, "global_widths": [e["global_widths"] for e in st.model.history],
            "final_global_accuracy": st.curves["global_accuracy"][-1],
            "final_local_accuracy": st.curves["local_accuracy"][-1], **st.phases.result(),
            "note": "ModelNet40 is not available offline; Handwritten / COIL-20 stand in"}


def server(party: PartyLike, s: Settings, data: dict) -> dict:
    """Send each client its models, record the scores, average each view's extractor (Eq. (7)), match
    the inference models (Eq. (8)), checkpoint; after T rounds one more exchange, then save the models."""
    _threads(s)
    names = party.peers_with_role("client")
    if len(names) < 1:
        raise PartyError("hyfem: the federation has no client")
    spec = model_spec(s)
    start, saved = party.restore()
    index, client_views = (saved["index"], saved["model"]["client_views"]) if start else hello(party, names)
    holders, in_clear = view_plan(party, s, names, index, client_views)
    cfg = s.config(party.device)
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    st = ServerRoleState.restored(saved) if start else ServerRoleState(H.init_server(spec, client_views, cfg), index)
    for r in range(start, s.rounds + 1):
        party.round = r
        t0 = time.perf_counter()
        st.send_models(party, spec, r)
        g = st.record_scores(party, spec, data, names, r)
        if r == s.rounds:
            break
        st.average_views(party, agg, holders, in_clear, r)
        st.match(party, spec, cfg, names, r)
        st.phases.add("round", time.perf_counter() - t0)
        party.progress(r + 1, s.rounds, global_acc=round(g["accuracy"], 4))
        party.checkpoint(r + 1, st.state())
    party.save_model(*model.part("server", spec, tuple(range(spec.n_views)), st.model.extractors, st.model.inference,
                                 data["scalers"], data["x_test_raw"], data["x_test"], dataset=s.dataset))
    return server_result(s, st, spec.n_views, len(names))


ROLES = {"server": server, "client": client}
