"""HyFEM, hybrid federated learning by matched averaging (Zhang, Yin, Hong & Chen, "Hybrid
Federated Learning", Algorithm 1), as a fedhet algorithm: one ``server`` and M ``client`` parties.

Each client holds some rows and some views; per view a feature extractor theta_d is averaged by
secure aggregation among the clients holding it (Eq. (7)), and the clients' inference models are
merged by Hungarian-matched averaging (Eq. (8), :mod:`.matching`).

Modules: ``settings`` (the ``[algorithm]`` keys, the scenarios, the networks' shapes), ``data``
(views, split, each client's part), ``models`` (extractors, inference MLP), ``model`` (each
party's trained part as it leaves the run), ``matching``
(Eq. (8)), ``core`` (one function per step of Algorithm 1), ``messages`` (the kinds and their
schemas), ``roles`` (``server``, ``client``).

``scenario = "fig3"``: D = 4 views (the first four), 3 per client, 3/4 of the classes, no unused
rows (the paper's Fig. 3 with M = 4); ``"fig4"``: D = 6, 3 per client, 15/40 of the classes,
12 % unused rows (Fig. 4 with M = 8); ``"custom"``: ``n_views``, ``views_per_client``,
``classes_per_client``, ``unused_fraction`` as given (they override fig3/fig4 when set).
"""
from __future__ import annotations

from fedhet.algorithms.hyfem.data import (coil_image_sets, coil_sample_images, load_data, load_views, make_partition,
                                          prepared_views, split_rows)
from fedhet.algorithms.hyfem.messages import Kind, declarations
from fedhet.algorithms.hyfem.model import load_model
from fedhet.algorithms.hyfem.roles import ROLES
from fedhet.algorithms.hyfem.settings import Settings, model_spec, sizes
from fedhet.algorithms.predict import with_prediction
from fedhet.algorithms.hyfem import predict
from fedhet.parties.contract import Algorithm

ALGORITHM = Algorithm(
    name="hyfem", summary="HyFEM: hybrid FL by matched averaging (per-view extractors with secure "
                          "per-view aggregation, Hungarian-matched inference models)",
    roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings, sizes=sizes,
    headline=("final_global_accuracy", "final_local_accuracy"), load_model=load_model)
ALGORITHM = with_prediction(ALGORITHM, predict.LAYOUT, "HyFEM prediction: each client scores its own new rows with "
                            "the model it would deploy")

__all__ = ["ALGORITHM", "Kind", "Settings", "coil_image_sets", "coil_sample_images", "declarations", "load_data",
           "load_views", "make_partition", "model_spec", "prepared_views", "sizes", "split_rows"]
