"""CHFL's prediction job (``fedhet predict``): each client scores its own new rows with the network
it reports as selected (its part: common and unique columns behind its own scaler); the server's
global columns score nothing alone.  No messages: the softmax of the part's logits."""
from __future__ import annotations

from fedhet.algorithms.predict import Horizontal, softmax

LAYOUT = Horizontal(scoring_role="client", probabilities=softmax)
