"""HyFEM's prediction job (``fedhet predict``): each client scores its own new rows, of the views it
holds, with the model it would deploy (the global extractors of its views and its matched inference
model); no messages: the softmax of the part's logits.  Its file names a view's columns
``view<d>.f<j>``."""
from __future__ import annotations

from fedhet.algorithms.predict import Horizontal, softmax

LAYOUT = Horizontal(scoring_role="client", probabilities=softmax)
