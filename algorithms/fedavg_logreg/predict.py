"""FedAvg logistic regression's prediction job (``fedhet predict``): each client scores its own new
rows with the global model it was last sent (its part, behind its own scaler); no messages."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from fedhet.algorithms.predict import Horizontal


def probabilities(meta: Mapping[str, Any], out: np.ndarray) -> np.ndarray:
    return np.asarray(out, dtype=np.float64)     # the part gives [1 - p, p]


LAYOUT = Horizontal(scoring_role="client", probabilities=probabilities)
