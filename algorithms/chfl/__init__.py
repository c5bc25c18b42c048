"""Federated CHFL and its baselines (Mori et al., "Continual Horizontal Federated Learning").

One ``server`` and K ``client`` parties.  Each client holds disjoint rows of one table and the
*common* feature columns plus its own *unique* columns; a client trains a common column theta_c
(averaged across clients, securely by default) and its own unique column with lateral connections
from the common one.  The package:

- :mod:`.settings` -- the ``[algorithm]`` keys (``fedhet presets --describe chfl``);
- :mod:`.data` -- each client's own rows and columns (built-in tables or the client's own file);
- :mod:`.models` -- the two-column network (Eqs. (6)-(7)) and the flat common vector;
- :mod:`.model` -- the trained parts as they leave the run (a client's selected network, the
  server's global columns) and their loader;
- :mod:`.core` -- Algorithm 2's local training, FedAvg's mean, the per-client selection;
- :mod:`.messages` -- the message kinds and their schemas (what may leave a client);
- :mod:`.roles` -- the server and client roles;
- :mod:`.experiments` -- the paper's tables: the roles run in memory (``run_table``, ``sweep``).

Determinism: the models, batches and partition come from ``seed`` (and ``feature_seed``, default
``seed``; ``toolkit.derive_seed``); with plain aggregation the federated run computes the same
numbers as plain FedAvg in one loop (bit-identical: the plain mean is the same float64 weighted
sum as :func:`.core.aggregate`, cast to float32; tested).  Secure aggregation rounds each weighted
input to the grid 2**-f, so its mean differs by at most the returned ``mean_error_bound``.
The device is each party's (``device`` in the federation file: cpu, cuda, auto).
"""
from __future__ import annotations

from fedhet.algorithms.chfl.data import ClientRows, client_rows, load_data, load_table
from fedhet.algorithms.chfl.messages import Kind, declarations, sizes
from fedhet.algorithms.chfl.model import load_model
from fedhet.algorithms.chfl.models import HIDDEN
from fedhet.algorithms.chfl.roles import ROLES
from fedhet.algorithms.chfl.settings import AGGREGATION_DEFAULTS, NAME, Settings
from fedhet.algorithms.predict import with_prediction
from fedhet.algorithms.chfl import predict
from fedhet.parties.contract import Algorithm

__all__ = ["AGGREGATION_DEFAULTS", "ALGORITHM", "HIDDEN", "ClientRows", "Kind", "Settings", "client_rows",
           "declarations", "load_data", "load_table", "sizes"]

ALGORITHM = Algorithm(name=NAME, summary="CHFL: horizontal FL with common and client-unique features "
                      "(Mori et al.), with its Common and Local baselines", roles=ROLES, load_data=load_data,
                      declarations=declarations, settings=Settings, sizes=sizes,
                      headline=("final_test", "final"), load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, "CHFL prediction: each client scores its own new rows with "
                            "its selected network")
