"""FedAvg logistic regression — the small horizontal job behind ``fedhet demo``.

McMahan et al.'s FedAvg with a logistic-regression model: each round every
client runs ``local_epochs`` full-batch gradient steps from the global weights
on its own rows, submits its weights with its row count as weight, and the
server replaces the global weights with the row-weighted mean.  The mean goes
through :mod:`fedhet.protocols.aggregation`: ``aggregation = "secure"`` (the
default; Bonawitz et al.'s secure aggregation, the server sees only masked
vectors) or ``"plain"``.  Data: scikit-learn's breast-cancer
set (the same data as FATE's "breast"), shuffled with the run seed, 75/25
train/test, both parts dealt evenly to the clients; each client standardises
with statistics of its own training rows.  Deterministic: the same seed gives
bit-identical weights on every transport (secure aggregation's unmasked sum
is exact in the ring and its quantisation deterministic).
"""
from __future__ import annotations

import numpy as np

from fedhet.parties.declare import arrays_where, declare
from fedhet.protocols import aggregation

NAME = "fedavg_logreg"

DEFAULTS = {"rounds": 20, "local_epochs": 5, "lr": 0.5, "l2": 1e-3, "test_fraction": 0.25}
# Secure aggregation's fixed-point range: weights stay far inside [-8, 8] on
# this data, and no client can hold more rows than the 569 of the data set.
AGGREGATION_DEFAULTS = {"aggregation": "secure", "secagg_clip": 8.0, "secagg_max_weight": 569.0}


def _vector_length(cfg):
    return int(cfg.get("n_features", 30)) + 1


def _weights_only(dt, shape, cfg):
    return dt == "<f8" and len(shape) == 1


DECLARATIONS = [
    declare("fedavg/model", "server", "client", "global weights (d+1 floats)",
            arrays_where(_weights_only, "a float64 weight vector")),
    declare("fedavg/eval", "client", "server", "test accuracy counts of the global model (no arrays)",
            lambda arrays, cfg: None if not arrays else "evaluation message carries arrays"),
] + aggregation.declarations(_vector_length)  # the clients' updates, plain or secure


def load_data(cfg: dict, name: str, role: str, index: int, n_of_role: int, data_dir=None):
    if role == "server":
        return None
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(int(cfg.get("seed", 0)))
    order = rng.permutation(len(y))
    n_test = int(round(len(y) * float(cfg.get("test_fraction", DEFAULTS["test_fraction"]))))
    test, train = order[:n_test], order[n_test:]
    tr = np.array_split(train, n_of_role)[index]
    te = np.array_split(test, n_of_role)[index]
    mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-9
    return {"x_train": (x[tr] - mu) / sd, "y_train": y[tr].astype(np.float64),
            "x_test": (x[te] - mu) / sd, "y_test": y[te].astype(np.float64)}


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _augment(x):
    return np.hstack([x, np.ones((len(x), 1))])


def local_train(w, x, y, epochs, lr, l2):
    xa = _augment(x)
    for _ in range(epochs):
        g = xa.T @ (_sigmoid(xa @ w) - y) / len(y) + l2 * np.r_[w[:-1], 0.0]
        w = w - lr * g
    return w


def accuracy(w, x, y):
    return float(np.mean((_sigmoid(_augment(x) @ w) > 0.5) == (y > 0.5)))


def _cfg(cfg):
    return {k: cfg.get(k, v) for k, v in DEFAULTS.items()}


def server(party, cfg, data):
    c = _cfg(cfg)
    rounds = int(c["rounds"])
    clients = party.peers_with_role("client")
    d = int(cfg.get("n_features", 30))
    w = np.zeros(d + 1)
    agg = aggregation.make_aggregator(cfg, AGGREGATION_DEFAULTS)
    acc = None
    bound = 0.0
    for r in range(rounds + 1):
        party.round = r
        party.broadcast("fedavg/model", {"w": w}, to=clients)
        # Clients score the global model they were sent (round r = after r averages).
        evals = party.gather("fedavg/eval", frm=clients)
        acc = sum(e["correct"] for e in evals.values()) / max(1, sum(e["count"] for e in evals.values()))
        party.metric(test_accuracy=acc)
        if r == rounds:
            break
        res = agg.aggregate(party, clients, round=r, length=d + 1)
        w = res.mean
        bound = max(bound, res.mean_error_bound)
        party.progress(r + 1, rounds, acc=round(acc, 4))
    return {"test_accuracy": acc, "weights": w.tolist(), "rounds": rounds, "clients": len(clients),
            "aggregation": agg.method, "max_mean_error_bound": bound}


def client(party, cfg, data):
    c = _cfg(cfg)
    rounds = int(c["rounds"])
    srv = party.peers_with_role("server")[0]
    n = len(data["y_train"])
    agg = aggregation.make_aggregator(cfg, AGGREGATION_DEFAULTS)
    acc = None
    for r in range(rounds + 1):
        party.round = r
        w = party.recv(srv, "fedavg/model")["w"]
        acc = accuracy(w, data["x_test"], data["y_test"])
        party.send(srv, "fedavg/eval", {"correct": int(round(acc * len(data["y_test"]))),
                                        "count": len(data["y_test"])})
        if r == rounds:
            break
        w = local_train(w, data["x_train"], data["y_train"], int(c["local_epochs"]), float(c["lr"]), float(c["l2"]))
        agg.submit(party, srv, w, weight=n, round=r)
        party.progress(r + 1, rounds)
    party.metric(test_accuracy=acc)
    return {"test_accuracy": acc, "weights": w.tolist(), "train_rows": n}


ROLES = {"server": server, "client": client}
