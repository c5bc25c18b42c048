"""Names of the runnable algorithms -> their modules (imported on first use).

An algorithm module exposes ``ALGORITHM``, a :class:`fedhet.parties.contract.Algorithm`
(older modules expose ``NAME``, ``ROLES``, ``load_data``, ``DECLARATIONS`` and are adapted).
The CLI hands :func:`get_algorithm` to the runtime and the audit; ``parties/`` itself imports
no algorithm.
"""
from __future__ import annotations

import importlib

from fedhet.parties.contract import Algorithm, from_module

ALGORITHMS: dict[str, str] = {
    "fedavg_logreg": "fedhet.algorithms.fedavg_logreg",
    "psi": "fedhet.algorithms.psi_job",
    "stfl": "fedhet.algorithms.stfl",
    "he_split": "fedhet.algorithms.he_split",
    "chfl": "fedhet.algorithms.chfl",
    "shamir": "fedhet.algorithms.shamir_job",
    "secagg_bench": "fedhet.algorithms.secagg_job",
    "hyfem": "fedhet.algorithms.hyfem",
    "mmvfl": "fedhet.algorithms.mmvfl",
    "f3": "fedhet.algorithms.f3",
}


def names() -> list[str]:
    return sorted(ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    try:
        path = ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}") from None
    return from_module(importlib.import_module(path))
