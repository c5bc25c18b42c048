"""MMVFL as a federation: K participants (one view each, participant 0 holds the labels) and a server.

Feng, Yu & Zhu, "MMVFL" (Sensors 2024).  Modules, one idea each:

* :mod:`.core`: the numerics (its docstring maps Eqs. (3)-(10) to functions and
  records the choices the paper leaves open), no parties;
* :mod:`.settings`: the ``[algorithm]`` keys (:class:`Settings`) and the sizes
  the schemas use;
* :mod:`.data`: a participant's view, fold and the rows it lacks;
* :mod:`.roles`: the server and the participants, which only move the
  messages and call exactly the step functions
  :func:`~fedhet.algorithms.mmvfl.core.run_centralized` calls, so the federated
  run reproduces the centralised oracle (bit for bit with plain float64
  aggregation, within the quantisation bound with secure aggregation);
* :mod:`.messages`: the kinds and their schemas;
* :mod:`.model`: a participant's trained part as it leaves the run (its W_k, scaler and k-NN
  reference set: what it scores its own rows with, alone; the server holds none).

Roles: ``participant`` (K of them; the first in federation order, index 0, is
the label holder: participant 1 of the paper) and ``server``.

1. **Alignment** (:mod:`fedhet.protocols.psi`, ECDH-PSI): participant 0 is the
   label owner, the others feature parties; IDs are the training rows' row
   numbers.  Each participant lacks ``missing`` of the fold's training rows
   (seeded, disjoint between participants), so the common set is smaller than
   anyone's own and the alignment matters.  Order "sorted": every participant
   ends with the same rows in the same order.
2. **Rounds** r = 0, 1, ... (Eqs. (7), (8), (6), (3)):
   participant: Z_k-step (Eq. (7), :func:`participant_z_step`) with its W_k and
   the last Z (Z^0 = 0, known to all); submits Z_k, weight zeta_k, to
   aggregation round 2r.  Server: ``combine_z(sum, weight)`` (Eq. (8)), sends Z
   (``mmvfl/z``).  Participant: W_k-step (Eq. (6), :func:`participant_w_step`),
   submits its two objective terms (Eq. (3) and the smoothed one), weight 1, to
   aggregation round 2r+1.  Server: appends the total to the trace and sends
   ``mmvfl/step`` (stop or go on, :func:`should_stop`).
3. **Evaluation**: each participant scores its features (||W_k^(i)||_2), keeps
   the top p % for every p in ``percents`` and classifies its own validation
   rows with k-NN trained on the common training rows (true labels for
   participant 0, argmax Z_k for the others); it sends the server only the
   accuracies (``mmvfl/report``: scalars).

What leaves whom (the declarations say the same; ``fedhet audit`` checks it):

- X_k, W_k and participant 0's labels Y never leave their owner.  The only
  array a participant sends outside PSI is its Z_k (n_rows x n_classes,
  flattened) inside the aggregation; with ``aggregation = "secure"`` (the
  default) that is a masked ring vector, so the server never sees an
  individual Z_k.  The objective terms travel the same way (a 2-vector).
- The server learns, per round, Z = sum zeta_k Z_k / sum zeta_k and
  sum zeta_k (public: zeta is a setting), and the two totals of Eq. (3) over
  all participants (never one participant's term); at the end the
  per-participant accuracy scalars.  **Z approximates Y on the training rows
  by design**: MMVFL's purpose is to share label information, so the server
  and every participant (who receive Z) effectively learn the training labels
  (argmax Z).  With plain aggregation the server also sees each Z_k.
- PSI reveals to participant 0 each other participant's common training IDs
  with it, and to everyone the common list (:mod:`fedhet.protocols.psi`).
- The validation labels each participant holds are the experiment's
  evaluation ground truth (the paper scores every view), used only to compute
  its accuracies; they take no part in training and are never sent.

Data: the built-in multi-view sets of :mod:`fedhet.algorithms.data_multiview`
(Table 2; ``msrc_v5`` is a stand-in for Caltech7).  Participant k loads view
k, the fold's rows (``cv_folds``, seed ``split_seed``), standardised with
its own common training rows after PSI.
"""
from __future__ import annotations

from fedhet.algorithms.predict import with_prediction
from fedhet.algorithms.mmvfl import predict
from fedhet.parties.contract import Algorithm

from . import core
from .data import ParticipantData, common_rows, fold_rows, load_data, missing_rows
from .messages import Kind, declarations
from .model import load_model
from .roles import ROLES
from .settings import DATASET_SHAPES, NAME, PAPER_PERCENTS, Settings, n_common_rows, sizes

__all__ = ["ALGORITHM", "Settings", "Kind", "ParticipantData", "core", "declarations", "sizes", "n_common_rows",
           "fold_rows", "missing_rows", "common_rows", "DATASET_SHAPES", "PAPER_PERCENTS"]

ALGORITHM = Algorithm(
    name=NAME, summary="MMVFL: multi-participant multi-class VFL with l2,1 feature selection; pseudo-labels "
                       "combined by secure aggregation",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("accuracy",), load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, "MMVFL prediction: PSI-aligned new rows, the label holder's "
                            "own k-NN part")
