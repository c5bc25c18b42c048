"""FATE-style split network with a homomorphically encrypted interactive layer (the STFL paper's HE baseline).

The STFL paper (Chu & Zhang, arXiv 2102.05883) compares against FATE's heterogeneous NN (§V-A, "FATE":
bottom models per party, an interactive layer, a top model; its refs [10], [11]; Algorithms 1 and 2
of §II-A2 describe the encrypted forward and the noise-masked backward) and reports 1,737 s for 100
epochs on cancer (Table III, about 17 s per epoch) and 92.04% test accuracy (Table I).

Roles use STFL's names: ``host`` = the label owner (trains the interactive layer's own part, the top
model and the loss; FATE calls this party "guest"), ``guest`` = a passive feature party (bottom model
only; FATE's "host").  FATE's names are the reverse.

Modules, one idea each:

* :mod:`.settings`: the ``[algorithm]`` keys (:class:`Settings`; ``fedhet presets --describe he_split``
  lists them), the HE layer's settings derived from them (``Settings.layer``) and the number of
  training batches an auto slot width is sized for (``he_max_steps``, :func:`default_max_steps`);
* :mod:`.data`: the host's labelled train/test rows and a guest's own columns (``data_fate``);
* :mod:`.core`: the network (bottom models, the host's part of the interactive layer, the top model),
  its seeds, optimisers and batch schedule;
* :mod:`.training`: the host's training run and :func:`run_reference`, the same network trained in one
  process with the interactive layer in the clear (the tests' oracle);
* :mod:`.roles`: the host and guest roles (PSI, then ``split_driver``'s loops over HE links);
* :mod:`.messages`: the kinds and their schemas;
* :mod:`.model`: each party's trained part as it leaves the run (its own share of the interactive
  layer, never the whole weight) and the modules that score with it.

Each guest's part ``W_g`` of the interactive layer is protected by
:mod:`fedhet.protocols.he_interactive` (read it for the per-batch protocol, what each party learns, and
the fixed-point and masking parameters; ``he`` picks the scheme: ``paillier`` (packed, batched,
default), ``naive`` (python-paillier one value at a time) or ``ckks``).  The guest learns which common
rows are batched for training and which for evaluation (as in FATE, where the label owner sends batch
indices).
"""
from __future__ import annotations

from fedhet.algorithms.predict import with_prediction
from fedhet.parties.contract import Algorithm

from . import predict

from .data import host_data, load_data
from .messages import Kind, declarations
from .model import load_model
from .roles import ROLES
from .settings import MAX_ROWS_PLANNED, NAME, Settings, default_max_steps
from .training import run_reference

__all__ = ["ALGORITHM", "Settings", "Kind", "declarations", "run_reference", "host_data", "default_max_steps",
           "MAX_ROWS_PLANNED"]

ALGORITHM = Algorithm(name=NAME, summary="FATE-style hetero NN: a packed Paillier (or phe, CKKS) interactive "
                      "layer between guests' bottom models and the host's top model", roles=ROLES,
                      load_data=load_data, declarations=declarations, settings=Settings,
                      headline=("test_accuracy",), load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, "HE split prediction: the encrypted layer's forward half on "
                            "the PSI-aligned new rows, probabilities at the host")
