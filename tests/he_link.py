"""One link of the HE interactive layer run in memory: the helper of the HE-split tests
(``test_he_split.py``, ``test_he_slots.py``); a helper module of tests/."""
from __future__ import annotations

import types

import numpy as np

from fedhet.parties.inmemory import run_inmemory
from fedhet.protocols import he_interactive as hei

def run_pair(host_spec, guest_spec, A, W_g, eps, delta=None, steps=1, box=None):
    """Both sides of one link in memory, the host holding W_g and the guest eps (true weight W_g + eps);
    ``box`` fills as steps complete (``Z``: the host's forward results, ``grad``: the guest's
    gradients, ``h`` / ``g``: the two layer objects)."""
    d, K = W_g.shape
    box = {} if box is None else box
    box.update(Z=[], grad=[])

    def host(party, cfg, data):
        h = hei.host_layer(party, "g", host_spec, np.zeros((d, K)))
        box["h"] = h
        h.W = W_g.copy()
        h.setup()
        try:
            for _ in range(steps):
                h.recv_acts()
                h.send_forward()
                box["Z"].append(h.recv_forward())
                if delta is not None:
                    h.send_gradient(delta)
                    h.finish_backward()
        finally:
            h.close()
        return {}

    def guest(party, cfg, data):
        g = hei.guest_layer(party, "h", guest_spec, d, K)
        box["g"] = g
        g.setup()
        g.eps = eps.copy()
        try:
            for _ in range(steps):
                g.forward(A, delta is not None)
                if delta is not None:
                    box["grad"].append(g.backward())
        finally:
            g.close()
        return {}

    mod = types.SimpleNamespace(NAME="hei-test", ROLES={"host": host, "guest": guest}, load_data=None,
                                DECLARATIONS=hei.declarations(guest_spec, d, K))
    run_inmemory(mod, [("h", "host"), ("g", "guest")], data={"h": None, "g": None})
    return box
