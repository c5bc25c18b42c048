"""MMVFL's prediction job (``fedhet predict``): the label holder scores alone.

Vertical (:class:`fedhet.algorithms.predict.Vertical`): the participants align their new rows by
PSI (participant 0, the label holder, as label owner), so the label holder learns which of its rows
the others lack (``missing.csv``); then it classifies its common rows with its own part (k-NN on
its top-p % features, the largest p of ``percents``).  No participant sends anything but PSI (MMVFL's
parts score alone), and the server only closes the run.  k-NN gives a class, not a score: the
probability columns are the class's indicator (1 for the class, 0 elsewhere).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedhet.algorithms.scoring import score
from fedhet.algorithms.predict import Rows, Vertical


def probabilities(module: Any, meta: Mapping[str, Any], rows: Rows, contributions: dict[str, np.ndarray]) -> np.ndarray:
    """One-hot of the k-NN class on the selection of the largest ``percents`` entry."""
    classes = score(module, meta, rows)                          # (rows, len(percents)) int64
    pick = int(np.argmax(np.asarray(meta["percents"], dtype=np.float64)))
    out = np.zeros((len(classes), len(meta["classes"])), dtype=np.float64)
    out[np.arange(len(classes)), classes[:, pick]] = 1.0
    return out


LAYOUT = Vertical(label_role="participant", feature_roles=("participant",), combine=probabilities)
