"""STFL, self-taught vertical federated learning (Chu & Zhang, arXiv 2102.05883, Algorithm 3), and
the federated plaintext Hierarchical split network, as a fedhet algorithm.

``variant = "stfl"``: each guest trains a VAE on its self-taught rows (Eq. (5)) and sends ONCE the
encoder's latent means of the intersected rows (Eq. (7)); the host trains its MLP on
[own features || z_1 || ... || z_G] with its labels (Eq. (6)).  ``variant = "hierarchical"``: the
same network trained jointly by backprop as a plaintext split network (paper §V-A's baseline).

Modules: ``settings`` (the ``[algorithm]`` keys), ``data`` (each party's own part), ``models``
(the networks), ``model`` (each party's trained part as it leaves the run), ``core`` (the training, in process: STFL and Table I's baselines), ``messages``
(the kinds and their schemas), ``roles`` (``host``, ``guest``).

Determinism: every model's weights come from its own seed ``toolkit.frozen_seed(seed, ...)``
(the same seeds federated and in process), the host's batch order from ``seed``.  Federated STFL
equals ``core.stfl`` on the same rows in the same order.

Results: host ``test_accuracy``, ``train_s`` (from the end of PSI to the trained model),
``epochs``, ``s_per_epoch``, ``psi_s``, ``warmup_s`` (torch's one-time optimizer import, paid
before PSI), ``total_s``, ``n_common``, ``sizes`` and bytes; guests ``train_s``, ``vae_s``,
``n_common``, ``n_selftaught`` (their ``test_accuracy`` is None: they never see labels).
"""
from __future__ import annotations

from fedhet.algorithms.stfl.core import METHODS, encode, fit_vae, train_vae
from fedhet.algorithms.stfl.data import load_data
from fedhet.algorithms.stfl.messages import Kind, declarations
from fedhet.algorithms.stfl.model import load_model
from fedhet.algorithms.stfl.roles import ROLES
from fedhet.algorithms.stfl.settings import Model, Settings
from fedhet.algorithms.predict import with_prediction
from fedhet.algorithms.stfl import predict
from fedhet.parties.contract import Algorithm

ALGORITHM = Algorithm(name="stfl", summary="STFL: self-taught vertical FL (guests send VAE latent codes once), "
                      "and the hierarchical split network", roles=ROLES, load_data=load_data,
                      declarations=declarations, settings=Settings, headline=("test_accuracy",),
                      load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, "STFL prediction: guests send the host their parts' codes of "
                            "the PSI-aligned new rows")

__all__ = ["ALGORITHM", "METHODS", "Kind", "Model", "Settings", "encode", "fit_vae", "train_vae"]
