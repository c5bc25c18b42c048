"""The host's training run, shared by the federated role (HE links) and the in-process reference.

:func:`run_reference` trains the same network, batches and initialisation in one process with the
interactive layer in the clear (local links through a ``PlainLinearLayer``): a plaintext split
network, the tests' oracle.  IDs are aligned as PSI's sorted common order does.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from fedhet.algorithms import split_driver
from fedhet.algorithms.split_driver import Checkpoint, HostLink, LocalLink, PlainLinearLayer
from fedhet.algorithms.toolkit import HostRows, align_guest_rows, align_host_rows, sorted_intersection
from fedhet.parties.contract import PartyLike

from .core import HostModel, build_host, guest_bottom, host_part, schedule
from .data import guest_data, host_data
from .settings import Settings


def train_host(s: Settings, model: HostModel, links: Sequence[HostLink], hd: HostRows, n_classes: int,
               party: PartyLike | None = None, resume: Mapping[str, Any] | None = None,
               checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """The host's training and test pass (``split_driver.train_host``) with this network's schedule;
    ``checkpoint`` and ``resume`` as there."""
    out = split_driver.train_host(host_part(s, model), links, hd, n_classes, schedule(s), party, resume, checkpoint)
    del out["t_trained"], out["row_losses"]
    return out


def run_reference(s: Settings, n_guests: int = 1, data_dir: str | None = None,
                  guest_names: list[str] | None = None) -> dict[str, Any]:
    """The same network, batches and initialisation trained in one process with the interactive layer in
    the clear (a plaintext split network; the tests' oracle).  IDs are aligned as PSI's sorted order does."""
    names = guest_names or [f"guest{i + 1}" for i in range(n_guests)]
    hdat = host_data(s, data_dir)
    gdat = [guest_data(s, i, len(names), data_dir) for i in range(len(names))]
    ids = np.concatenate([hdat.ids_train, hdat.ids_test])
    _, (rows, *guest_rows) = sorted_intersection(ids.tolist(), *[np.asarray(g.ids).tolist() for g in gdat])
    hd = align_host_rows(rows, hdat.x_train, hdat.y_train, hdat.x_test, hdat.y_test, order="common")
    bottoms = [guest_bottom(s, align_guest_rows(g.x, r).x_common, nm) for nm, g, r in zip(names, gdat, guest_rows)]
    model, Ws = build_host(s, hdat.x_train.shape[1], [s.guest_bottom_width] * len(names), int(hdat.n_classes))
    links = [LocalLink(b, PlainLinearLayer(W, s.interactive_lr)) for b, W in zip(bottoms, Ws)]
    out = train_host(s, model, links, hd, int(hdat.n_classes))
    out.update({"model": model, "W": [ln.layer.W for ln in links if ln.layer is not None],
                "guest_models": [b.model for b in bottoms], "n_common": hd.n_common})
    return out
