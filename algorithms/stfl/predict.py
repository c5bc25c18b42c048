"""STFL's prediction job (``fedhet predict``): what crosses is what training declares.

Vertical (:class:`fedhet.algorithms.predict.Vertical`): the host (label owner) and the guests align
their new rows by PSI; each guest runs its part (its encoder's posterior mean, or its bottom network
in the hierarchical variant) on its common rows and sends the host the codes ``z`` (float32,
common rows x d_latent: ``stfl/predict``, the same array as training's ``stfl/latent`` for the
training rows); the host runs its part on its own rows and the codes and keeps the class
probabilities (one logit: ``[1 - sigmoid, sigmoid]``; else softmax).  Nothing goes back to a guest
but PSI's common list.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from fedhet.algorithms.scoring import score
from fedhet.algorithms.predict import Rows, Vertical
from fedhet.algorithms.stfl.settings import GUEST, HOST, Settings
from fedhet.algorithms.toolkit import class_probabilities
from fedhet.parties import schema as sch


def codes(module: Any, meta: Mapping[str, Any], rows: Rows) -> np.ndarray:
    """A guest's part on its common rows: the codes the host's part takes (float32)."""
    return score(module, meta, rows)


def probabilities(module: Any, meta: Mapping[str, Any], rows: Rows, codes: dict[str, np.ndarray]) -> np.ndarray:
    """The host's part on its rows and the guests' codes (guest name -> codes, in the guests' federation
    order, their guest index): class probabilities."""
    logits = score(module, meta, {**rows, **{f"z{g}": z for g, z in enumerate(codes.values())}})
    return class_probabilities(torch.from_numpy(logits)).numpy()


def schema(s: Settings) -> sch.Spec:
    options = tuple(sch.Arr("<f4", (None, w)) for w in sorted(set(s.latent_widths())))
    return options[0] if len(options) == 1 else sch.OneOf(options)


LAYOUT = Vertical(label_role=HOST, feature_roles=(GUEST,), combine=probabilities, contribution=codes,
                  schema=schema, what="a guest's part's codes z of the common new rows (its encoder's latent means, "
                  "or its bottom network's output): float32 (n_common, d_latent), as training's latent codes",
                  # as training's: declared latent codes (stfl), plaintext bottom-network outputs (hierarchical)
                  protects=lambda s: "derived" if s.variant == "stfl" else "clear")
