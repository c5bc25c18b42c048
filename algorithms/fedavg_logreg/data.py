"""FedAvg logistic regression's data: scikit-learn's breast-cancer set (FATE's "breast"),
shuffled with the run seed, split train/test, both parts dealt evenly to the clients; each client
standardises with statistics of its own training rows."""
from __future__ import annotations

import numpy as np

from fedhet.algorithms.fedavg_logreg.settings import Settings
from fedhet.parties.contract import PartyContext


def load_data(s: Settings, ctx: PartyContext) -> dict[str, np.ndarray] | None:
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
            "x_test": (x[te] - mu) / sd, "y_test": y[te].astype(np.float64),
            # what a deployment of the model needs: the raw test rows, the scaler, the feature order
            "x_test_raw": x[te], "scaler_mean": mu, "scaler_std": sd}


def feature_names() -> list[str]:
    """The 30 features in the order the model takes them (scikit-learn's breast-cancer names)."""
    from sklearn.datasets import load_breast_cancer

    return [str(n) for n in load_breast_cancer().feature_names]
