"""FedAvg logistic regression -- the small horizontal job behind ``fedhet demo``.

McMahan et al.'s FedAvg with a logistic-regression model on scikit-learn's breast-cancer set
(:mod:`.data`); the mean goes through :mod:`fedhet.protocols.aggregation`: ``aggregation =
"secure"`` (the default; Bonawitz et al.'s secure aggregation, the server sees only masked
vectors) or ``"plain"``.  Deterministic: the same seed gives bit-identical weights on every
transport (secure aggregation's unmasked sum is exact in the ring and its quantisation
deterministic) -- except under differential privacy (``dp = "record"`` or ``"client"``, :mod:`.privacy`),
whose noise comes from each party's operating system, never from the shared seed.
"""
from __future__ import annotations

from fedhet.algorithms.fedavg_logreg.data import load_data
from fedhet.algorithms.fedavg_logreg.messages import Kind, declarations, sizes
from fedhet.algorithms.fedavg_logreg.model import load_model
from fedhet.algorithms.fedavg_logreg.roles import ROLES, client, server
from fedhet.algorithms.fedavg_logreg.settings import NAME, Settings
from fedhet.algorithms.predict import with_prediction
from fedhet.algorithms.fedavg_logreg import predict
from fedhet.parties.contract import Algorithm

__all__ = ["ALGORITHM", "Kind", "Settings", "client", "declarations", "server", "sizes"]

ALGORITHM = Algorithm(
    name=NAME, summary="FedAvg logistic regression on breast cancer (the small horizontal job)",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("test_accuracy",), load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, 'FedAvg prediction: each client scores its own new rows')
