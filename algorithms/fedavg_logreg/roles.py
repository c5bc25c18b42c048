"""FedAvg logistic regression's roles (McMahan et al.): each round every client runs
``local_epochs`` full-batch gradient steps from the global weights on its own rows, submits its
weights with its row count as weight, and the server replaces the global weights with the
row-weighted mean (:mod:`fedhet.protocols.aggregation`, secure by default).

Checkpoint step k: k averages done (the server holds the global weights; a client holds nothing
it cannot recompute from the next model it is sent)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from fedhet.algorithms.fedavg_logreg import model
from fedhet.algorithms.fedavg_logreg.core import local_train, share_correct
from fedhet.algorithms.fedavg_logreg.data import feature_names
from fedhet.algorithms.fedavg_logreg.messages import Kind
from fedhet.algorithms.fedavg_logreg.settings import AGGREGATION_DEFAULTS, Settings
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation


def server(party: PartyLike, s: Settings, data: None) -> dict:
    clients = party.peers_with_role("client")
    n = s.n_params
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    acc = None
    start, saved = party.restore()
    w, bound = saved.get("w", np.zeros(n)), saved.get("bound", 0.0)
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
        w = res.mean
        bound = max(bound, res.mean_error_bound)
        party.progress(r + 1, s.rounds, acc=round(acc, 4))
        party.checkpoint(r + 1, {"w": w, "bound": bound})
    party.save_model(*model.part(w, mean=None, std=None, feature_names=feature_names(), check_x=None))
    return {"test_accuracy": acc, "weights": w.tolist(), "rounds": s.rounds, "clients": len(clients),
            "aggregation": agg.method, "max_mean_error_bound": bound}


def client(party: PartyLike, s: Settings, data: dict[str, np.ndarray]) -> dict:
    srv = party.peer_with_role("server")
    n = len(data["y_train"])
    agg = aggregation.make_aggregator(s.agg, AGGREGATION_DEFAULTS)
    acc = None
    start, _ = party.restore()
    for r in range(start, s.rounds + 1):
        party.round = r
        w = party_w = party.recv(srv, Kind.MODEL)["w"]
        acc = share_correct(w, data["x_test"], data["y_test"])
        party.send(srv, Kind.EVAL, {"correct": int(round(acc * len(data["y_test"]))),
                                    "count": len(data["y_test"])})
        if r == s.rounds:
            break
        w = local_train(w, data["x_train"], data["y_train"], s.local_epochs, s.lr, s.l2)
        agg.submit(party, srv, w, weight=n, round=r)
        party.progress(r + 1, s.rounds)
        party.checkpoint(r + 1, {})
    party.metric(test_accuracy=acc)
    # the global model it was last sent, with its own scaler: what this client would deploy
    party.save_model(*model.part(party_w, mean=data["scaler_mean"], std=data["scaler_std"],
                                 feature_names=feature_names(), check_x=data["x_test_raw"]))
    return {"test_accuracy": acc, "weights": w.tolist(), "train_rows": n}


ROLES: dict[str, Callable[..., dict]] = {"server": server, "client": client}
