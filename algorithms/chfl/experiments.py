"""The paper's experiments: CHFL's roles run in memory (there is no second copy of the round loop).

:func:`run_table` runs the roles on an in-memory table; :func:`sweep` gives Table II's four numbers
of one (feature split, seed).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import numpy as np
import torch

from fedhet.algorithms.chfl import ALGORITHM
from fedhet.algorithms.chfl.data import client_rows, column_names, largest_label, load_table
from fedhet.algorithms.chfl.models import HIDDEN
from fedhet.parties.inmemory import run_inmemory


def run_table(cfg: dict, X: np.ndarray, y: np.ndarray, n_clients: int, *, device: str = "cpu",
              timeout: float = 3600.0) -> dict[str, Any]:
    """CHFL's roles (``server``, ``client1..K``) run in memory on a table the caller holds.

    ``cfg`` is an ``[algorithm]`` table; the table's shape is taken from ``X`` and ``y`` (labels
    0..C-1) unless ``cfg`` gives it.  Each client gets its part of the table as ``load_data``
    would cut it.  Returns party name -> role result (``fedhet.parties.inmemory.run_inmemory``).
    """
    X, y = np.asarray(X), np.asarray(y)
    table = {"dataset": "table", "n_samples": int(X.shape[0]), "n_features": int(X.shape[1]),
             "n_classes": largest_label(y) + 1, **cfg}
    s = ALGORITHM.parse(table)
    names = [f"client{k + 1}" for k in range(int(n_clients))]
    data: dict[str, Any] = {"server": None}
    for k, name in enumerate(names):  # before any thread starts: a bad table fails here
        data[name] = client_rows(s, X, y, k, len(names), party=name, names=column_names(s.dataset, X.shape[1]))
    return run_inmemory(ALGORITHM, [("server", "server")] + [(n, "client") for n in names],
                        cfg=s, seed=s.seed, data=data, device=device, timeout=timeout)


def sweep(dataset: str | Sequence[Any], K: int = 5, common_ratio: float = 0.3, rounds: int = 20, seed: int = 0,
          feature_seed: int | None = None, lr_grid: Sequence[float] = (1e-3, 1e-4),
          mu_grid: Sequence[float] = (0.1, 0.5, 1.0), select: str = "best_round", device: str = "cpu",
          epochs: int = 5, batch_size: int = 64, progress: Callable[..., None] | None = None, *,
          hidden: Sequence[int] = HIDDEN, reset_common_optim: bool = True, standardize: bool = True,
          data_dir: str | None = None, timeout: float = 3600.0) -> dict:
    """Table II's four numbers for one (feature split, seed): Common, Local, CHFL mu=0 and CHFL
    mu>0, each client choosing lr (and mu, round) on its own validation rows.

    Two federations of the roles in memory, with plain aggregation: CHFL with every lr and the
    heads mu = 0 and each of ``mu_grid`` on one shared common column per lr (which is also the
    Common model), and Local.  ``dataset``: a name for :func:`~fedhet.algorithms.chfl.data.load_table`
    or an ``(X, y[, name])`` tuple.  Each party thread uses the caller's torch thread count.
    ``progress(round, rounds, loss=, val=)`` is called per round of each (lr, method) after the runs,
    in the order CHFL lr_1, Local lr_1, CHFL lr_2, ...; ``results[group]`` holds ``test`` (per
    client), ``mean_test`` and ``chosen`` (per client: lr, mu, round).
    """
    if isinstance(dataset, str):
        dataset = load_table(dataset, data_dir)
    X, y = np.asarray(dataset[0]), np.asarray(dataset[1])
    name = str(dataset[2]) if len(dataset) > 2 else "data"
    mus = [float(m) for m in mu_grid]
    if any(not 0 < m <= 1 for m in mus):
        raise ValueError(f"mu_grid must hold values in (0, 1], got {mus}")
    lrs = [float(lr) for lr in lr_grid]
    base = {"dataset": name, "common_ratio": float(common_ratio), "lr": lrs, "rounds": int(rounds),
            "local_epochs": int(epochs), "batch_size": int(batch_size), "hidden": [int(h) for h in hidden],
            "select": select, "seed": int(seed), "standardize": bool(standardize),
            "feature_seed": None if feature_seed is None else int(feature_seed),
            "reset_common_optim": bool(reset_common_optim), "n_clients": int(K),
            "torch_threads": torch.get_num_threads()}
    t0 = time.perf_counter()
    runs = {"chfl": run_table({**base, "mu": [0.0] + mus, "aggregation": "plain"}, X, y, K,
                            device=device, timeout=timeout),
            "local": run_table({**base, "method": "local"}, X, y, K, device=device, timeout=timeout)}
    seconds = time.perf_counter() - t0
    clients = [f"client{k + 1}" for k in range(int(K))]
    if progress is not None:
        last = {"chfl": f"chfl_mu={mus[-1]:g}" if mus else "chfl_mu=0", "local": "local"}
        for j in range(len(lrs)):
            for method in ("chfl", "local"):
                res = [runs[method][c] for c in clients]
                for t in range(int(rounds)):
                    progress(t + 1, int(rounds), loss=float(np.mean([r["train_loss"][t][j] for r in res])),
                             val=float(np.mean([r["curves"][j][last[method]]["val"][t] for r in res])))
    results = {}
    for method, groups in (("chfl", ("common", "chfl_mu0", "chfl_mu>0")), ("local", ("local",))):
        for g in groups:
            sel = runs[method]["server"]["selected"][g]
            results[g] = {"test": sel["test"], "mean_test": sel["mean_test"], "chosen": sel["chosen"]}
    return {"results": {g: results[g] for g in ("common", "local", "chfl_mu0", "chfl_mu>0")},
            "n_common": runs["chfl"]["server"]["n_common"],
            "n_unique": [runs["chfl"][c]["n_unique"] for c in clients], "seconds": seconds}
