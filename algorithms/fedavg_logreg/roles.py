"""FedAvg logistic regression's roles (McMahan et al.): each round every client runs
``local_epochs`` full-batch gradient steps from the global weights on its own rows, submits its
weights with its row count as weight, and the server replaces the global weights with the
row-weighted mean (:mod:`fedhet.protocols.aggregation`, secure by default).

Checkpoint step k: k averages done (the server holds the global weights; a client holds nothing
it cannot recompute from the next model it is sent)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from fedhet.algorithms.dp_sgd import DPStep, private_generator
from fedhet.algorithms.fedavg_logreg import model, privacy
from fedhet.algorithms.fedavg_logreg.core import local_train, local_train_dp, share_correct
from fedhet.algorithms.fedavg_logreg.data import feature_names
from fedhet.algorithms.fedavg_logreg.messages import Kind
from fedhet.algorithms.fedavg_logreg.settings import AGGREGATION_DEFAULTS, Settings
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation
from fedhet.protocols.dp_ledger import Ledger


def _restore_ledger(ledger: Ledger | None, saved: dict) -> None:
    if ledger is not None and "dp_rounds" in saved:
        ledger.rounds, ledger.steps = list(saved["dp_rounds"]), int(saved["dp_steps"])


def _ledger_state(ledger: Ledger | None) -> dict:
    return {} if ledger is None else {"dp_rounds": ledger.rounds, "dp_steps": ledger.steps}


def server(party: PartyLike, s: Settings, data: None) -> dict:
    clients = party.peers_with_role("client")
    n = s.n_params
    dpa = privacy.client_aggregator(s, len(clients), party.name) if s.dp.dp == "client" else None
    agg = dpa or aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    ledger = dpa.ledger if dpa is not None else None
    acc = None
    start, saved = party.restore()
    w, bound = saved.get("w", np.zeros(n)), saved.get("bound", 0.0)
    _restore_ledger(ledger, saved)
    for r in range(start, s.rounds + 1):
        party.round = r
        party.broadcast(Kind.MODEL, {"w": w}, to=clients)
        # Clients score the global model they were sent (round r = after r averages).
        evals = party.gather(Kind.EVAL, frm=clients)
        acc = sum(e["correct"] for e in evals.values()) / max(1, sum(e["count"] for e in evals.values()))
        party.metric(test_accuracy=acc)
        if r == s.rounds:
            break
        res = agg.aggregate(party, clients, round=r, length=n)
        w = w + res.mean if dpa is not None else res.mean  # client level: the mean update
        bound = max(bound, res.mean_error_bound)
        eps = {"dp_epsilon": ledger.spent} if ledger is not None else {}
        if eps:
            party.metric(**eps)
        party.progress(r + 1, s.rounds, acc=round(acc, 4), **{k: round(v, 4) for k, v in eps.items()})
        party.checkpoint(r + 1, {"w": w, "bound": bound, **_ledger_state(ledger)})
    party.save_model(*model.part(w, mean=None, std=None, feature_names=feature_names(), check_x=None))
    return {"test_accuracy": acc, "weights": w.tolist(), "rounds": s.rounds, "clients": len(clients),
            "aggregation": agg.method, "max_mean_error_bound": bound,
            **({"privacy": ledger.as_dict()} if ledger is not None else {})}


def client(party: PartyLike, s: Settings, data: dict[str, np.ndarray]) -> dict:
    srv = party.peer_with_role("server")
    n = len(data["y_train"])
    dpa = privacy.client_aggregator(s, len(party.peers_with_role("client")) + 1, party.name) \
        if s.dp.dp == "client" else None
    agg = dpa or aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    ledger = dpa.ledger if dpa is not None else privacy.record_ledger(s, party.name) if s.dp.dp == "record" else None
    gen = private_generator() if s.dp.dp == "record" else None
    acc = None
    start, saved = party.restore()
    _restore_ledger(ledger, saved)
    for r in range(start, s.rounds + 1):
        party.round = r
        w = party_w = party.recv(srv, Kind.MODEL)["w"]
        acc = share_correct(w, data["x_test"], data["y_test"])
        party.send(srv, Kind.EVAL, {"correct": int(round(acc * len(data["y_test"]))),
                                    "count": len(data["y_test"])})
        if r == s.rounds:
            break
        if gen is not None and ledger is not None:  # record level: charged before the steps are taken
            ledger.charge(r)
            w = local_train_dp(w, data["x_train"], data["y_train"], s.local_epochs, s.lr, s.l2,
                               DPStep(s.dp.dp_clip, ledger.mechanism.noise, s.dp.dp_sample_rate), gen)
        else:
            w = local_train(w, data["x_train"], data["y_train"], s.local_epochs, s.lr, s.l2)
        if dpa is not None:  # client level: the update (clipped, noised, weight 1; charged by the aggregator)
            agg.submit(party, srv, w - party_w, weight=1.0, round=r)
        else:
            agg.submit(party, srv, w, weight=n, round=r)
        eps = {"dp_epsilon": ledger.spent} if ledger is not None else {}
        if eps:
            party.metric(**eps)   # the report draws it over rounds; the board shows the epsilon spent
        party.progress(r + 1, s.rounds, **{k: round(v, 4) for k, v in eps.items()})
        party.checkpoint(r + 1, _ledger_state(ledger))
    party.metric(test_accuracy=acc)
    # the global model it was last sent, with its own scaler: what this client would deploy
    party.save_model(*model.part(party_w, mean=data["scaler_mean"], std=data["scaler_std"],
                                 feature_names=feature_names(), check_x=data["x_test_raw"]))
    return {"test_accuracy": acc, "weights": w.tolist(), "train_rows": n,
            **({"privacy": ledger.as_dict()} if ledger is not None else {})}


ROLES: dict[str, Callable[..., dict]] = {"server": server, "client": client}
