"""CHFL's party roles: one ``server`` and K ``client`` parties (Mori et al., Algorithm 2).

``method = "chfl"``: per mini-batch a client takes one Adam step on its copy of the common column
theta_c with the common-only loss, then one on its unique column and lateral matrices U_k with the
whole network's loss, theta_c fixed (Eq. (6), Eq. (7); :meth:`~fedhet.algorithms.chfl.core.CHFLClient.train_round`).
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

Each role is a sequence of named steps over its state (:class:`ClientState`, :class:`ServerState`:
what the role carries across rounds, ``state()`` for a checkpoint, ``restored(..., saved)`` to begin or
resume).  The paper's equations and the functions that compute them:

=======  ===================================  ==========================================================
eq.      what                                 function
=======  ===================================  ==========================================================
Eq. (1)  theta^(t+1) = mean of the clients'   :meth:`ClientState.submit` (theta_c, weighted by training
         theta_k^t (weighted by training      rows, into the aggregator) -> :meth:`ServerState.average`
         rows: the plain mean of the paper    (secure or plain aggregation; in the clear
         for an even split)                   :func:`~fedhet.algorithms.chfl.core.aggregate`) ->
                                              :func:`receive_global` (back at each client)
Eq. (6)  the lateral connections              :meth:`ClientState.train`
         z_u,k^(i+1) = a(W z_u,k^(i) + b +    (:meth:`~fedhet.algorithms.chfl.core.CHFLClient.train_round`,
         mu U_k z_c,k^(i))                    :class:`~fedhet.algorithms.chfl.models.UniqueColumn`)
Eq. (7)  F = softmax(z_c,k^(L) + z_u,k^(L))   :meth:`ClientState.train` (the whole network's loss),
                                              :meth:`ClientState.evaluate`; a saved part:
                                              :func:`~fedhet.algorithms.chfl.model.score_chfl`
=======  ===================================  ==========================================================

Trained parts (:mod:`.model`): a client saves the network it would deploy -- its selection among the
method's networks (for ``chfl`` every (lr, mu): the better of ``chfl_mu0`` and ``chfl_mu>0``) at the
selected round, kept as training goes (:class:`~fedhet.algorithms.chfl.model.Keeper`) -- with its scaler
(:func:`save_client_part`); the server saves the global common column(s) of the last round.

Checkpoint step k: k rounds done (k averages of theta_c; with ``method = "local"`` k rounds of local
training); a client keeps each trainer's networks, Adam states and batch generator, its kept snapshots,
curves, losses, timings and clip counts; the server keeps the global common column(s), its timings and
its round records.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from fedhet.algorithms.chfl import model
from fedhet.algorithms.chfl import privacy
from fedhet.algorithms.chfl.core import CHFLClient, ClientData, LocalClient, select_per_client
from fedhet.algorithms.chfl.data import ClientRows, own_client_data
from fedhet.algorithms.chfl.messages import Kind
from fedhet.algorithms.chfl.models import init_common_flat
from fedhet.algorithms.chfl.settings import Settings, aggregation_defaults
from fedhet.algorithms.toolkit import Phases, derive_seed, traffic_totals
from fedhet.parties.api import PartyError, PeerFault
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation
from fedhet.protocols.dp_aggregation import DPAggregator

Candidate = tuple[int, str, dict]   # (lr index, curve label, config)
Curves = dict[str, dict[str, list[float]]]   # curve label -> "val"/"test" -> one accuracy per round


def _threads(s: Settings) -> None:
    if s.torch_threads:
        torch.set_num_threads(s.torch_threads)


def _labels(s: Settings) -> list[str]:
    if s.method == "local":
        return ["local"]
    return ["common"] + [f"chfl_mu={m:g}" for m in s.mus]


def _groups(s: Settings) -> dict[str, list[Candidate]]:
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


def _deployed(s: Settings) -> list[Candidate]:
    """The candidates of the network a client deploys (its saved part), in the sweep's order: for
    method chfl every (lr, mu) network (groups chfl_mu0 and chfl_mu>0 together), else the method's group."""
    groups = _groups(s)
    if s.method != "chfl":
        return groups[s.method]
    return sorted(groups.get("chfl_mu0", []) + groups.get("chfl_mu>0", []),
                  key=lambda c: (c[0], s.mus.index(c[2]["mu"])))


def pick(s: Settings, curves: list[Curves], cands: list[Candidate]) -> dict:
    """A client's own choice among ``cands`` on its validation curves (lr, mu and, with ``select =
    "best_round"``, the round): :func:`~fedhet.algorithms.chfl.core.select_per_client` on a
    one-client table."""
    c = [{"val": [[v] for v in curves[j][lab]["val"]], "test": [[v] for v in curves[j][lab]["test"]],
          "config": cfgd} for j, lab, cfgd in cands]
    return select_per_client(c, s.select)


# ------------------------------------------------------------------------------ the client

@dataclass
class ClientState:
    """What a client carries across rounds: one trainer per lr (its networks, Adam states and batch
    generator), the kept snapshots of the deployable networks, the curves (per lr and label), the
    training losses, the timings and the largest |theta_c| submitted with the count of clipped ones."""

    models: list[CHFLClient | LocalClient]
    keeper: model.Keeper
    curves: list[Curves]
    losses: list[list[float]] = field(default_factory=list)
    phases: Phases = field(default_factory=lambda: Phases({"train": [], "submit": []}))
    max_abs: float = 0.0
    clipped_rounds: int = 0

    @classmethod
    def restored(cls, s: Settings, cd: ClientData, index: int, saved: dict) -> "ClientState":
        """Round 0's state, or that of the checkpoint ``saved`` (when not empty).  Weights come from
        toolkit.seeded blocks, which parties that are threads of one process (the in-memory
        transport) never enter at once."""
        models: list[CHFLClient | LocalClient] = [
            LocalClient(cd, lr=lr, hidden=s.hidden, seed=s.seed, index=index) if s.method == "local" else
            CHFLClient(cd, mus=s.mus, lr=lr, hidden=s.hidden, seed=s.seed, index=index,
                       reset_common_optim=s.reset_common_optim) for lr in s.lrs]
        st = cls(models, model.Keeper.of(s.select, cd),
                 [{lab: {"val": [], "test": []} for lab in _labels(s)} for _ in s.lrs])
        if saved:
            st.load(saved)
        return st

    def state(self) -> dict:
        """The checkpoint: what :meth:`load` goes on from."""
        return {"models": [m.state() for m in self.models], "keeper": self.keeper.state(),
                "curves": self.curves, "losses": self.losses, "phases": self.phases.state(),
                "max_abs": self.max_abs, "clipped_rounds": self.clipped_rounds}

    def load(self, saved: dict) -> None:
        for m, st in zip(self.models, saved["models"], strict=True):
            m.load_state(st)
        self.keeper.load_state(saved["keeper"])
        self.curves, self.losses = saved["curves"], saved["losses"]
        self.phases = Phases.restored(saved["phases"])
        self.max_abs, self.clipped_rounds = saved["max_abs"], saved["clipped_rounds"]

    @property
    def federated(self) -> list[CHFLClient]:
        """The trainers with a common column to average (none with method local)."""
        return [m for m in self.models if isinstance(m, CHFLClient)]

    def set_global(self, thetas: list[np.ndarray]) -> None:
        for fm, th in zip(self.federated, thetas):
            fm.set_common(th)

    def evaluate(self, s: Settings) -> None:
        """Each trainer's networks on the validation and test rows, onto the curves (Eq. (7)'s F)."""
        for j, m in enumerate(self.models):
            for part in ("val", "test"):
                e = m.evaluate(part)
                if s.method == "local":
                    self.curves[j]["local"][part].append(e["local"])
                else:
                    self.curves[j]["common"][part].append(e["common"])
                    for h, lab in enumerate(_labels(s)[1:]):
                        self.curves[j][lab][part].append(e["heads"][h])

    def keep(self, s: Settings, r: int) -> None:
        """Offer each deployable network of round ``r`` to the keeper (it keeps the selected round's)."""
        for j, m in enumerate(self.models):
            for lab, modules, score in model.candidates(m, s.method):
                self.keeper.offer((j, lab), r, self.curves[j][lab]["val"][-1], modules, score)

    def report_round(self, party: PartyLike, s: Settings, r: int) -> None:
        """Round r-1's metric line and progress (the last lr's last label)."""
        last = self.curves[-1][_labels(s)[-1]]
        party.metric(round=r - 1, loss=float(np.mean(self.losses[-1])), val=last["val"][-1],
                     test=last["test"][-1], train_s=self.phases.last("train"))
        party.progress(r, s.rounds, val=round(last["val"][-1], 4))

    def train(self, s: Settings, device: str) -> None:
        """E local epochs of every trainer (Eq. (6), Eq. (7): Algorithm 2 lines 13-16)."""
        with self.phases.timed("train", device):
            outs = [m.train_round(s.local_epochs, s.batch_size) for m in self.models]
        self.losses.append([o["loss"] if s.method == "local" else o["loss_common"] for o in outs])

    def submit(self, party: PartyLike, s: Settings, agg: aggregation.Aggregator, server: str, r: int,
               n_train: int, sent: list[np.ndarray] | None = None) -> None:
        """Each lr's theta_c, weighted by the training-row count, into aggregation round r*G + j (Eq. (1));
        ``sent`` (client-level DP): the global columns of this round, so that the update theta_c - sent
        goes in instead, with weight 1 (the DP aggregator clips and noises it)."""
        with self.phases.timed("submit"):
            for j, fm in enumerate(self.federated):
                vec = fm.get_common()
                if vec.shape != (s.common_params,):  # never send anything but the common column
                    raise AssertionError(f"common vector has {vec.shape}, expected ({s.common_params},)")
                if sent is not None:   # the DP aggregator clips its L2 norm to dp_clip
                    vec, n_train = vec.astype(np.float64) - sent[j], 1
                else:
                    a = float(np.abs(vec).max())
                    self.max_abs = max(self.max_abs, a)
                    self.clipped_rounds += int(a > s.secagg_clip)
                res = agg.submit(party, server, vec, weight=n_train, round=r * s.G + j)
                if res.status != "ok":
                    party.log.warning("chfl round %d: aggregation %s (%s)", r, res.status, res.reason)


def check_split(party: PartyLike, data: ClientRows) -> None:
    n_clients = len(party.peers_with_role("client")) + 1
    if data.n_clients != n_clients:
        raise PartyError(f"chfl: data was split for {data.n_clients} clients, the federation has {n_clients}")


def receive_global(party: PartyLike, s: Settings, server: str, r: int) -> list[np.ndarray]:
    """Round r's global common column(s).  The schema has checked G float32 (P_c,) vectors, finite;
    the round is the role's to check."""
    msg = party.recv(server, Kind.GLOBAL, timeout=s.recv_timeout)
    if msg["r"] != r:
        raise PeerFault(party.name, server, Kind.GLOBAL, f"global model for round {msg['r']} in round {r}")
    return msg["theta"]


def final_report(s: Settings, st: ClientState, n_test: int) -> dict:
    """What a client tells the server: its own pick per Table II column (lr / mu / round on its
    validation rows) with that pick's test accuracy, each network's last test accuracy, its timings."""
    selected = {}
    for g, cands in _groups(s).items():
        sel = pick(s, st.curves, cands)
        selected[g] = {"test": sel["test"][0], "chosen": sel["chosen"][0]}
    final = {lab if len(s.lrs) == 1 else f"{lab} lr={lr:g}": st.curves[j][lab]["test"][-1]
             for j, lr in enumerate(s.lrs) for lab in _labels(s)}
    return {"n_test": n_test, "selected": selected, "final": final, **st.phases.result()}


def save_client_part(party: PartyLike, s: Settings, data: ClientRows, cd: ClientData, st: ClientState) -> None:
    """The part: the deployable network this client's selection picks, at its selected round."""
    cands = _deployed(s)
    chosen = pick(s, st.curves, cands)["chosen"][0]
    if chosen is None:
        party.log.warning("chfl: no validation accuracy to select a network by; no trained part saved")
        return
    j, lab, _ = next(c for c in cands if c[2] == {k: v for k, v in chosen.items() if k != "round"})
    snap = st.keeper.best[(j, lab)]
    if snap.round != chosen["round"]:
        raise AssertionError(f"chfl: kept round {snap.round} of {lab}, selected round {chosen['round']}")
    group = s.method if s.method != "chfl" else ("chfl_mu0" if chosen["mu"] == 0 else "chfl_mu>0")
    party.save_model(*model.client_part(s, data, cd, snap, {"group": group, **chosen}))


def client(party: PartyLike, s: Settings, data: ClientRows) -> dict:
    """Receive theta_c, evaluate and keep round r-1's networks, train, submit theta_c, checkpoint;
    after T rounds report the own selection to the server and save the selected network."""
    _threads(s)
    server_name = party.peer_with_role("server")
    check_split(party, data)
    cd = own_client_data(data, s, party.device)
    dpa = privacy.client_aggregator(s, data.n_clients, party.name) if s.dp.dp == "client" else None
    agg = dpa or aggregation.make_aggregator(s.agg, aggregation_defaults(s, data.n_clients))
    start, saved = party.restore()
    st = ClientState.restored(s, cd, data.index, saved)
    ledger = dpa.ledger if dpa is not None else \
        privacy.record_ledger(s, cd.n_train, party.name) if s.dp.dp == "record" else None
    if ledger is not None:
        if dpa is None:
            privacy.use_dp(st.federated, s, cd.n_train, ledger)
        if "dp_rounds" in saved:
            ledger.rounds, ledger.steps = list(saved["dp_rounds"]), int(saved["dp_steps"])
    sent: list[np.ndarray] | None = None
    for r in range(start, s.rounds + 1):
        party.round = r
        if s.method != "local":
            sent = receive_global(party, s, server_name, r)
            st.set_global(sent)
        if r > 0:  # Theta_k^(r-1) = (theta_c^(r), theta_u,k, U_k)
            st.evaluate(s)
            st.keep(s, r)
            st.report_round(party, s, r)
        if r == s.rounds:
            break
        if ledger is not None and dpa is None:  # charged before the steps: the run stops rather than pass it
            party.metric(dp_epsilon=ledger.charge(r))
        st.train(s, party.device)
        if s.method != "local":   # client level: the DP aggregator charges each release before it leaves
            st.submit(party, s, agg, server_name, r, cd.n_train, sent if dpa is not None else None)
            if dpa is not None:
                party.metric(dp_epsilon=dpa.ledger.spent)
        party.checkpoint(r + 1, {**st.state(), **({"dp_rounds": ledger.rounds, "dp_steps": ledger.steps}
                                                  if ledger is not None else {})})
    if st.clipped_rounds and agg.method == "secure":
        party.log.warning("chfl: |theta_c| reached %.3g > secagg_clip %g in %d submissions: clipped",
                          st.max_abs, s.secagg_clip, st.clipped_rounds)
    report = final_report(s, st, int(cd.y["test"].shape[0]))
    party.send(server_name, Kind.RESULT, report)
    save_client_part(party, s, data, cd, st)
    return {**report, "curves": st.curves, "train_loss": st.losses, "n_train": cd.n_train,
            "n_val": int(cd.y["val"].shape[0]), "n_common": cd.d_common, "n_unique": cd.d_unique,
            "common_params": s.common_params if s.method != "local" else 0, "max_abs_common": st.max_abs,
            "clipped_submissions": st.clipped_rounds, "aggregation": agg.method if s.G else None,
            "device": party.device, **traffic_totals(party),
            **({"privacy": ledger.as_dict()} if ledger is not None else {})}


# ------------------------------------------------------------------------------ the server

@dataclass
class ServerState:
    """What the server carries across rounds: the global common column(s) (one per lr; none with
    method local), its timings, the largest error bound of a mean and the clients each round dropped."""

    thetas: list[np.ndarray]
    phases: Phases = field(default_factory=lambda: Phases({"round": [], "aggregate": []}))
    bound: float = 0.0
    dropped: dict[int, list[str]] = field(default_factory=dict)

    @classmethod
    def restored(cls, s: Settings, saved: dict) -> "ServerState":
        """theta_c^0 (seeded, the same at every client) per lr, or the checkpoint ``saved``'s state."""
        if saved:
            return cls(saved["thetas"], Phases.restored(saved["phases"]), saved["bound"], saved["dropped"])
        if s.method == "local":
            return cls([])
        return cls([init_common_flat(s.n_common, s.class_count, s.hidden, derive_seed(s.seed, "theta0"))] * s.G)

    def state(self) -> dict:
        """The checkpoint: what :meth:`restored` goes on from."""
        return {"thetas": self.thetas, "phases": self.phases.state(), "bound": self.bound, "dropped": self.dropped}

    def average(self, party: PartyLike, s: Settings, agg: aggregation.Aggregator, clients: list[str],
                r: int) -> None:
        """Eq. (1): each lr's weighted mean of the clients' theta_c (aggregation round r*G + j); under
        client-level DP the clients sent updates: the global column plus their noised mean."""
        new = []
        with self.phases.timed("aggregate"):
            for j in range(s.G):
                res = agg.aggregate(party, clients, round=r * s.G + j, length=s.common_params)
                mean = self.thetas[j] + res.mean if isinstance(agg, DPAggregator) else res.mean
                new.append(mean.astype(np.float32))
                self.bound = max(self.bound, float(res.mean_error_bound))
                if res.dropped:
                    self.dropped[r] = sorted(set(self.dropped.get(r, [])) | set(res.dropped))
        self.thetas = new


def federation_clients(party: PartyLike, s: Settings) -> list[str]:
    clients = party.peers_with_role("client")
    if not clients:
        raise PartyError("chfl: the federation has no client")
    if s.n_clients is not None and s.n_clients != len(clients):
        raise PartyError(f"chfl: n_clients = {s.n_clients} but the federation has {len(clients)} clients")
    return clients


def gather_reports(party: PartyLike, s: Settings, clients: list[str]) -> dict[str, dict]:
    """Every client's final report.  Local clients train alone for all rounds before reporting:
    allow each round the timeout."""
    wait = (s.recv_timeout or party.timeout) * (s.rounds + 1 if s.method == "local" else 1)
    return {c: party.recv(c, Kind.RESULT, timeout=wait) for c in clients}


def summarise_reports(s: Settings, reports: dict[str, dict], clients: list[str]) -> dict:
    """Table II's numbers: per column the clients' own picks and their mean test accuracy; each
    network's last test accuracy averaged over clients; the clients' counts and timings."""
    selected = {}
    for g in _groups(s):
        tests = [float(reports[c]["selected"][g]["test"]) for c in clients]
        selected[g] = {"mean_test": float(np.mean(tests)), "test": tests,
                       "chosen": [reports[c]["selected"][g]["chosen"] for c in clients]}
    final_keys = list(reports[clients[0]]["final"])
    final = {lab: float(np.mean([reports[c]["final"][lab] for c in clients])) for lab in final_keys}
    return {"selected": selected, "final_test": final, "n_test": [int(reports[c]["n_test"]) for c in clients],
            "client_train_s": [reports[c]["train_s"] for c in clients],
            "client_submit_s": [reports[c]["submit_s"] for c in clients]}


def server(party: PartyLike, s: Settings, data: None) -> dict:
    """Broadcast theta_c, average the clients' new theta_c (Eq. (1)), checkpoint; after T rounds
    gather the clients' reports and save the last global column(s)."""
    _threads(s)
    clients = federation_clients(party, s)
    t_start = time.perf_counter()
    dpa = privacy.client_aggregator(s, len(clients), party.name) if s.dp.dp == "client" else None
    agg = dpa or aggregation.make_aggregator(s.agg, aggregation_defaults(s, len(clients)))
    start, saved = party.restore()
    st = ServerState.restored(s, saved)
    if dpa is not None and "dp_rounds" in saved:
        dpa.ledger.rounds, dpa.ledger.steps = list(saved["dp_rounds"]), int(saved["dp_steps"])
    if s.method == "local":
        # The server takes part in no round of local training: its state is the same at every step,
        # so it holds steps 1..T from the start (the last two kept: a local run resumes from step
        # T-1 or T, or starts over).
        for r in range(start, s.rounds):
            party.checkpoint(r + 1, st.state())
    else:
        for r in range(start, s.rounds + 1):
            party.round = r
            t0 = time.perf_counter()
            party.broadcast(Kind.GLOBAL, {"r": r, "theta": st.thetas}, to=clients)
            if r == s.rounds:
                break
            st.average(party, s, agg, clients, r)
            st.phases.add("round", time.perf_counter() - t0)
            eps = {"dp_epsilon": dpa.ledger.spent} if dpa is not None else {}
            party.metric(round=r, round_s=st.phases.last("round"), aggregate_s=st.phases.last("aggregate"), **eps)
            party.progress(r + 1, s.rounds, **{k: round(v, 4) for k, v in eps.items()})
            party.checkpoint(r + 1, {**st.state(), **({"dp_rounds": dpa.ledger.rounds, "dp_steps": dpa.ledger.steps}
                                                      if dpa is not None else {})})
    reports = gather_reports(party, s, clients)
    round_s = st.phases.seconds["round"]
    out = {
        "method": s.method, "dataset": s.dataset, "clients": clients, "rounds": s.rounds,
        "local_epochs": s.local_epochs, "lrs": list(s.lrs), "mus": list(s.mus), "seed": s.seed,
        "feature_seed": s.seed if s.feature_seed is None else s.feature_seed,
        "aggregation": agg.method if s.G else None, "n_common": s.n_common,
        "common_params": s.common_params if s.G else 0, **summarise_reports(s, reports, clients),
        **st.phases.result(), "mean_round_s": float(np.mean(round_s)) if round_s else None,
        "max_mean_error_bound": st.bound, "dropped": {str(k): v for k, v in st.dropped.items()},
        "wall_s": time.perf_counter() - t_start, **traffic_totals(party),
        **({"privacy": dpa.ledger.as_dict()} if dpa is not None else {}),
    }
    if s.return_weights:
        out["theta"] = [t.tolist() for t in st.thetas]
    if st.thetas:   # the global common column(s) after the last round
        party.save_model(*model.server_part(s, st.thetas, len(clients)))
    return out


ROLES: dict[str, Callable[..., dict]] = {"server": server, "client": client}
