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

from dataclasses import dataclass

import numpy as np

from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.declare import declare
from fedhet.parties.settings import TableView, setting
from fedhet.protocols import aggregation
from fedhet.protocols.aggregation_settings import AggregationSettings

NAME = "fedavg_logreg"
K_MODEL = "fedavg/model"
K_EVAL = "fedavg/eval"

# Secure aggregation's fixed-point range: weights stay far inside [-8, 8] on
# this data, and no client can hold more rows than the 569 of the data set.
AGGREGATION_DEFAULTS = {"aggregation": "secure", "secagg_clip": 8.0, "secagg_max_weight": 569.0}


@dataclass(frozen=True)
class Settings(TableView):
    rounds: int = setting(20, "FedAvg rounds", lo=1)
    local_epochs: int = setting(5, "full-batch gradient steps per client per round", lo=1)
    lr: float = setting(0.5, "gradient step size", lo=0, lo_open=True)
    l2: float = setting(1e-3, "L2 penalty on the weights (not the bias)", lo=0)
    test_fraction: float = setting(0.25, "share of the rows held out for testing", lo=0, lo_open=True, hi=0.9)
    n_features: int = setting(30, "feature count of the data (breast cancer: 30)", lo=1)
    seed: int = setting(0, "shuffles the rows before they are dealt to the clients", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)


def sizes(s: Settings) -> dict:
    return {"n_params": s.n_features + 1}


def declarations(s: Settings) -> list:
    return [
        declare(K_MODEL, "server", "client", "global weights (d+1 floats)",
                payload=sch.Fields({"w": sch.Arr("<f8", ("n_params",))})),
        declare(K_EVAL, "client", "server", "test accuracy counts of the global model (no arrays)",
                payload=sch.Fields({"correct": sch.Int(lo=0), "count": sch.Int(lo=0)})),
    ] + aggregation.declarations(s.n_features + 1, s.n_features + 1, s.agg.table(),
                                 AGGREGATION_DEFAULTS)  # the clients' updates, plain or secure


def load_data(s: Settings, ctx: PartyContext):
    if ctx.role == "server":
        return None
    from sklearn.datasets import load_breast_cancer

    x, y = load_breast_cancer(return_X_y=True)
    rng = np.random.default_rng(s.seed)
    order = rng.permutation(len(y))
    n_test = int(round(len(y) * s.test_fraction))
    test, train = order[:n_test], order[n_test:]
    tr = np.array_split(train, ctx.n_of_role)[ctx.index]
    te = np.array_split(test, ctx.n_of_role)[ctx.index]
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


def server(party, s: Settings, data) -> dict:
    clients = party.peers_with_role("client")
    d = s.n_features
    w = np.zeros(d + 1)
    agg = aggregation.make_aggregator(s.agg.table(), AGGREGATION_DEFAULTS)
    acc = None
    bound = 0.0
    for r in range(s.rounds + 1):
        party.round = r
        party.broadcast(K_MODEL, {"w": w}, to=clients)
        # Clients score the global model they were sent (round r = after r averages).
        evals = party.gather(K_EVAL, frm=clients)
        acc = sum(e["correct"] for e in evals.values()) / max(1, sum(e["count"] for e in evals.values()))
        party.metric(test_accuracy=acc)
        if r == s.rounds:
            break
        res = agg.aggregate(party, clients, round=r, length=d + 1)
        w = res.mean
        bound = max(bound, res.mean_error_bound)
        party.progress(r + 1, s.rounds, acc=round(acc, 4))
    return {"test_accuracy": acc, "weights": w.tolist(), "rounds": s.rounds, "clients": len(clients),
            "aggregation": agg.method, "max_mean_error_bound": bound}


def client(party, s: Settings, data) -> dict:
    srv = party.peers_with_role("server")[0]
    n = len(data["y_train"])
    agg = aggregation.make_aggregator(s.agg.table(), AGGREGATION_DEFAULTS)
    acc = None
    for r in range(s.rounds + 1):
        party.round = r
        w = party.recv(srv, K_MODEL)["w"]
        acc = accuracy(w, data["x_test"], data["y_test"])
        party.send(srv, K_EVAL, {"correct": int(round(acc * len(data["y_test"]))),
                                 "count": len(data["y_test"])})
        if r == s.rounds:
            break
        w = local_train(w, data["x_train"], data["y_train"], s.local_epochs, s.lr, s.l2)
        agg.submit(party, srv, w, weight=n, round=r)
        party.progress(r + 1, s.rounds)
    party.metric(test_accuracy=acc)
    return {"test_accuracy": acc, "weights": w.tolist(), "train_rows": n}


ROLES = {"server": server, "client": client}

ALGORITHM = Algorithm(
    name=NAME, summary="FedAvg logistic regression on breast cancer (the small horizontal job)",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("test_accuracy",))
