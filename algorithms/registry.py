"""Names of the runnable algorithms -> their modules (imported on first use).

An algorithm module exposes ``NAME``, ``ROLES`` (role -> role function),
``load_data(cfg, name, role, index, n_of_role, data_dir)`` and
``DECLARATIONS`` (its message kinds, for the audit).
"""
from __future__ import annotations

import importlib
from types import ModuleType

ALGORITHMS: dict[str, str] = {
    "fedavg_logreg": "fedhet.algorithms.fedavg_logreg",
    "psi": "fedhet.algorithms.psi_job",
    "stfl": "fedhet.algorithms.stfl",
    "he_split": "fedhet.algorithms.he_split",
    "chfl": "fedhet.algorithms.chfl",
    "shamir": "fedhet.algorithms.shamir_job",
}


def get_algorithm(name: str) -> ModuleType:
    try:
        path = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
    mod = importlib.import_module(path)
    for attr in ("NAME", "ROLES", "load_data", "DECLARATIONS"):
        if not hasattr(mod, attr):
            raise TypeError(f"algorithm module {path} lacks {attr}")
    return mod
