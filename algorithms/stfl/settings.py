"""STFL's ``[algorithm]`` settings: the one parser of its keys (``parse_settings(Settings, table)``).

:class:`Model` holds the training keys (paper §V-A: Adam, batch 128, 100 epochs; what the paper
leaves open is a key); it is a flattened group of :class:`Settings`, so the same typed object
drives the federated roles and the in-process methods of :mod:`.core` (``s.model``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedhet.algorithms.stfl.models import latent_width
from fedhet.algorithms.toolkit import ACTIVATIONS, PSIBackend, psi_backend_setting
from fedhet.parties.settings import setting
from fedhet.protocols.dp_settings import ReleaseDPSettings

HOST, GUEST = "host", "guest"
ALIASES = {"breast_sklearn": "breast_sk"}
# dataset = "files": every party reads its own table ([[party]] data = {...}); the declarations'
# widths then come from guest_features (one input width per guest) and n_classes.
FILES = "files"

# What the experiment fixes about each data set (rows, host columns, guest columns): the audit
# derives the allowed latent widths and the intersection size from it; the loaders verify it.
SHAPES = {
    "breast_sk": (569, 10, 20),
    "cancer": (569, 10, 20),
    "payment": (30000, 13, 10),
    "credit": (30000, 5, 5),
    "vehicle": (846, 9, 9),
}


@dataclass(frozen=True)
class Model:
    """The training keys: the networks' widths, the optimisers and the seed (one group, read by
    the roles and by the in-process methods)."""

    epochs: int = setting(100, "host (or split network) training epochs", lo=1)
    vae_epochs: int = setting(100, "each guest's VAE epochs", lo=1)
    batch_size: int = setting(128, "mini-batch size", lo=1)
    lr: float = setting(1e-3, "Adam's learning rate (host / split network)", lo=0, lo_open=True)
    vae_lr: float = setting(1e-3, "Adam's learning rate of the VAEs", lo=0, lo_open=True)
    weight_decay: float = setting(0.0, "Adam's weight decay", lo=0)
    vae_hidden_mult: float = setting(2.0, "VAE hidden width = input width x this", lo=0, lo_open=True)
    latent_frac: float = setting(0.5, "d_latent = guest input width x this (paper: half)", lo=0, lo_open=True, hi=1)
    host_hidden_mult: float = setting(2.0, "host MLP hidden width = joint width x this", lo=0, lo_open=True)
    central_hidden_mult: float = setting(2.0, "Centralized baseline hidden width multiplier", lo=0, lo_open=True)
    hidden_layers: int = setting(1, "hidden layers of the MLPs", lo=0)
    activation: str = setting("relu", "hidden activation", choices=tuple(ACTIVATIONS))
    kl_weight: float = setting(1.0, "weight of the VAE's KL term (1: the ELBO)", lo=0)
    seed: int = setting(0, "seeds the split, the models and the batches", lo=0)


@dataclass(frozen=True)
class Settings:
    """The ``[algorithm]`` keys of STFL and of the federated Hierarchical split network."""

    variant: Literal["stfl", "hierarchical"] = setting("stfl", "stfl (latent codes once) or hierarchical "
                                                       "(split network trained jointly, plaintext)")
    dataset: str = setting("breast_sk", "breast_sk (scikit-learn; alias breast_sklearn), cancer, payment, credit, "
                           "vehicle, or 'files' (each party's own table: [[party]] data = {...})")
    n_guests: int = setting(1, "guests (the guest columns are cut into this many blocks)", lo=1)
    selftaught_frac: float = setting(0.4, "built-in sets: share of rows whose host rows are dropped (the guests' "
                                     "unlabelled rows)", lo=0, hi=0.95)
    test_frac: float = setting(0.2, "share of the host's rows held out for testing", lo=0, lo_open=True, hi=0.9)
    guest_features: tuple[int, ...] | None = setting(None, "dataset 'files': each guest's feature count", lo=1)
    n_classes: int | None = setting(None, "dataset 'files': the host's number of classes", lo=2)
    psi_order: Literal["sorted", "label_owner"] = setting("sorted", "order of the common ID list")
    psi_backend: PSIBackend = psi_backend_setting()
    psi_workers: int | None = setting(None, "PSI worker processes (None: automatic, 0: inline)", lo=0)
    recv_timeout: float | None = setting(None, "seconds to wait for one message (None: the federation's)",
                                         lo=0, lo_open=True)
    torch_threads: int = setting(1, "torch.set_num_threads per party (0: torch's default)", lo=0)
    return_weights: bool = setting(False, "hierarchical: return the trained weights (tests)")
    model: Model = setting(Model(), flatten=True)
    # STFL: DP on the latents each guest sends once (protocols/dp_settings.ReleaseDPSettings)
    release: ReleaseDPSettings = setting(ReleaseDPSettings(), flatten=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dataset", ALIASES.get(self.dataset, self.dataset))

    def validate(self) -> None:
        """The checks across keys (data set, guests, widths); every error names the key."""
        ds, gf = self.dataset, self.guest_features
        if ds == FILES:
            if not gf:
                raise ValueError(f"dataset 'files' needs guest_features = [input width of each guest], got {gf!r}")
            if len(gf) != self.n_guests:
                raise ValueError(f"guest_features lists {len(gf)} width(s) but n_guests = {self.n_guests}")
            if self.n_classes is None:
                raise ValueError("dataset 'files' needs n_classes (an int >= 2)")
        elif gf is not None or self.n_classes is not None:
            raise ValueError("guest_features and n_classes are only for dataset 'files'")
        if ds != FILES and ds not in SHAPES:
            raise ValueError(f"unknown dataset {ds!r}; choose one of {sorted(SHAPES) + sorted(ALIASES)} or 'files'")
        max_guests = len(gf) if gf else SHAPES[ds][2]
        if not self.n_guests <= max_guests:
            raise ValueError(f"n_guests must be in 1..{max_guests} (guest columns of {ds}), got {self.n_guests}")

    @property
    def seed(self) -> int:
        return self.model.seed

    def guest_widths(self) -> list[int]:
        """Input width of each guest (the guest columns cut into n_guests contiguous blocks)."""
        if self.guest_features is not None:
            return list(self.guest_features)
        return [len(b) for b in np.array_split(np.arange(SHAPES[self.dataset][2]), self.n_guests)]

    def latent_widths(self) -> list[int]:
        """d_latent of each guest: its input width x latent_frac (paper: half), rounded down."""
        return [latent_width(w, self.model.latent_frac) for w in self.guest_widths()]

    def expected_common(self) -> int | None:
        """Size of the intersection: the host's labelled rows (every guest holds every ID); None for
        users' files, whose overlap only the PSI knows."""
        if self.dataset == FILES:
            return None
        n = SHAPES[self.dataset][0]
        return n - int(round(self.selftaught_frac * n))
