"""F³ as a federation (f3.txt, Algorithm 1): n owners, m share holders, one coordinator.

Roles: ``owner`` (n; the first in federation order is the label owner), ``holder`` (m, fusion =
"shamir_linear" or "mpc") and ``coordinator`` (:mod:`.roles`).  Modules: :mod:`.settings` (the one parser),
:mod:`.data` (with :mod:`.vowels`, :mod:`.traffic`), :mod:`.models` (Eqs. (3), (8), (9)), :mod:`.training` (the
loops), :mod:`.core` (the first layer on shares), :mod:`.messages` (kinds and schemas), :mod:`.roles`,
:mod:`.baselines` (Tables 2 and 3, plaintext), :mod:`.model` (the trained parts as they leave the run: an owner's
frozen LSTM with its scaler, raw series -> h; the coordinator's fusion model taking every owner's h; a holder
saves none, it holds shares of h only, but with fusion "shares" its pair of the trained weights).

Paper -> functions
  Eq. (3), Alg. 1 lines 1-4   owner: :func:`~fedhet.algorithms.f3.training.train_local` on its own series
                              (LSTM -> h^i -> softmax; Adam, early stopping), frozen; h_k^i for every sample
  Alg. 1 line 5 (one round)   owner -> holders: t-of-m Shamir shares of [h^i_train; h^i_val; h^i_test]
                              (``f3/share``, :func:`fedhet.protocols.shamir_share.share_to_holders`), or,
                              with ``fusion = "trusted"``, h^i in the clear to the coordinator (``f3/rep``)
  Eq. (8), Alg. 1 lines 6-7   coordinator: :func:`~fedhet.algorithms.f3.training.train_global` with the
                              first layer Â H W_0 computed by the holders (:class:`~.core.SharedFirstLayer`,
                              :func:`~.core.holder_forward`, :func:`~.core.holder_backward`); ReLU, Â(.), mean over owners,
                              W_1 and softmax at the coordinator
  Eq. (9)                     ICDF graph: :func:`~fedhet.algorithms.f3.models.icdf_sample`, a fresh Â per sample
  Alg. 1 lines 8-10           inference: the same share -> holders -> coordinator path
                              (:func:`~fedhet.algorithms.f3.training.predict`)

What runs on shares: :mod:`fedhet.algorithms.f3.core` (``fusion = "shamir_linear"``: the linear first layer) and
:mod:`fedhet.algorithms.f3.mpc` (``fusion = "mpc"``: the first layer, ReLU, pooling and W_1, three holders computing
together on 2-of-3 replicated shares; the coordinator receives only each sample's logits and batch-summed gradients).

What the coordinator learns with ``fusion = "shamir_linear"`` follows; for "mpc" see :mod:`.mpc`.

What the coordinator learns (stated honestly; ``benchmarks/f3_leakage.py`` measures it).  U_b = Â_b G_b
for every sample of every training step and of inference; Â_b is invertible in practice (self-loops,
normalised), so the coordinator obtains G_b[i] = h_b^i P_iᵀ W_0ᵀ, a linear image of each owner's
representation through a public d_i x hidden matrix that changes every step.  When hidden >= d_i and
that matrix has full rank it recovers h_b^i exactly (least squares over any one step).  The Shamir
protection is therefore against the *holders* (fewer than t of them see uniformly random shares) and
against anyone outside; it does not hide h from the coordinator beyond what a rank-deficient first
layer (hidden < d_i) or a fresh re-parametrisation would.  dC_i adds nothing beyond dP_i when W_0 has
full row rank (hidden <= d); dÂ_b adds nothing beyond U_b (the coordinator can form δ_b G_bᵀ itself).
In trusted mode the coordinator sees h^i directly (the paper's base setting).  Labels (train, validation
and test: the last two for model selection and scoring) reach the coordinator from the label owner
(``f3/labels``, declared).  The owners' series, local models and their predictions never leave them.

Data: Japanese Vowels (UCI, real: 12 owners, one LPC series each, lengths 7-29) or incident windows
*simulated* on the real METR-LA / PEMS-BAY road graphs (:mod:`fedhet.algorithms.f3.traffic`; one
sensor per owner, ``n_sensors`` keeps the first sensors and their subgraph).  Every owner holds every
sample (the owners observe the same events), so no PSI is needed: samples are aligned by index.
"""

from __future__ import annotations

from fedhet.algorithms.f3.core import InProcessHolders, SharedFirstLayer
from fedhet.algorithms.f3.data import OwnerData, load_data, n_owners, owner_data
from fedhet.algorithms.f3.messages import COORDINATOR, HOLDER, OWNER, Kind, declarations
from fedhet.algorithms.f3.model import load_model
from fedhet.algorithms.f3.roles import ROLES
from fedhet.algorithms.f3.settings import NAME, Settings, n_rows, owner_seed, owner_widths
from fedhet.algorithms.f3.training import pretrain_owner
from fedhet.algorithms.f3 import predict
from fedhet.algorithms.predict import with_prediction
from fedhet.parties.contract import Algorithm

__all__ = ["ALGORITHM", "COORDINATOR", "HOLDER", "InProcessHolders", "Kind", "OWNER", "OwnerData", "Settings",
           "SharedFirstLayer", "declarations", "load_data", "n_owners", "n_rows", "owner_data", "owner_seed", "owner_widths",
           "pretrain_owner"]

ALGORITHM = Algorithm(
    name=NAME, summary="F³: frozen local LSTMs, representations secret-shared to holders, a GCN over a consensus "
                       "graph trained by the coordinator on what the holders compute on shares",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, headline=("test",),
    load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, "F³ prediction: training's inference path on the owners' "
                            "PSI-aligned new series, probabilities (fusion shares: the class) at the first owner")
