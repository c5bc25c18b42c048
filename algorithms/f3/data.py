"""F³'s data: each owner's standardised series (one sensor or one LPC channel per owner), the road graph.

:func:`load_data` gives a party what it holds: an owner its own splits (train, validation, test) of its own
series, scaled by the statistics of its own training rows; the coordinator the road graph when the
consensus graph is the given one; a holder nothing.  :func:`owner_data` gives every owner's splits at once
(benchmarks, baselines).  Japanese Vowels: :mod:`fedhet.algorithms.f3.vowels` (real, UCI); traffic:
:mod:`fedhet.algorithms.f3.traffic` (simulated on the real road graphs).
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numpy as np

from fedhet.algorithms.f3 import traffic
from fedhet.algorithms.f3.messages import COORDINATOR, HOLDER, OWNER
from fedhet.algorithms.f3.model import CHECK_ROWS
from fedhet.algorithms.f3.settings import Settings, n_rows
from fedhet.algorithms.f3.vowels import N_CLASSES, load_vowels
from fedhet.parties.contract import PartyContext, resolve_data_path

_TRAFFIC_LOCK = threading.Lock()


def _traffic_once(*key):
    # the owners of one host process are threads: simulate once per process, not once per owner at a time
    with _TRAFFIC_LOCK:
        return _traffic(*key)


@functools.lru_cache(maxsize=2)
def _traffic(name: str, seed: int, n_windows: int | None, data_dir: str | None, speeds: str | None = None,
             labels: str | None = None):
    if speeds is not None:
        return traffic.load_real(speeds, labels, name, data_dir)
    return traffic.simulate(name, seed=seed, n_windows=n_windows, data_dir=data_dir)


def provenance(s: Settings) -> str:
    if s.dataset == "vowels":
        return "real (UCI Japanese Vowels)"
    if s.speeds_file is not None:
        return f"real speeds ({s.speeds_file}) with user-given labels ({s.labels_file}): {s.dataset}"
    return f"{traffic.provenance(s.dataset)}: {s.dataset}"


def traffic_graph(s: Settings, data_dir: str | None = None) -> np.ndarray:
    adj = traffic.load_graph(s.dataset, data_dir)[1]
    k = s.n_sensors or adj.shape[0]
    return adj[:k, :k]


def n_owners(s: Settings, data_dir: str | None = None) -> int:
    if s.dataset == "vowels":
        return 12
    return s.n_sensors or traffic_graph(s, data_dir).shape[0]


def _path(p: str | None, ctx: PartyContext) -> str | None:
    """A user's file, relative to the federation file's folder."""
    return None if p is None else str(resolve_data_path(ctx, p))


def load_data(s: Settings, ctx: PartyContext) -> dict:
    if ctx.role in (HOLDER, COORDINATOR):
        return {"adj": traffic_graph(s, ctx.data_dir) if (ctx.role == COORDINATOR and s.graph == "given") else None}
    if ctx.role != OWNER:
        raise ValueError(f"f3: unknown role {ctx.role!r} (roles: {OWNER}, {HOLDER}, {COORDINATOR})")
    want = n_owners(s, ctx.data_dir)
    if ctx.n_of_role != want:
        raise ValueError(f"f3: data set {s.dataset!r} has {want} owners' series (n_sensors for traffic), the "
                         f"federation has {ctx.n_of_role} owners")
    c = ctx.index
    if s.dataset == "vowels":
        parts = vowels_parts(s.split_seed, s.val_fraction, ctx.data_dir)
        raw = {k: (S.owner(c)[i], S.lengths[i], S.labels[i]) for k, (S, i) in parts.items()}
        n_classes = N_CLASSES
    else:
        data = _traffic_once(s.dataset, s.data_seed, s.n_windows, ctx.data_dir, _path(s.speeds_file, ctx),
                             _path(s.labels_file, ctx))
        if s.speeds_file is not None and len(data.y) != sum(n_rows(s)):
            raise ValueError(f"f3: {s.speeds_file} gives {len(data.y)} windows; set n_windows = {len(data.y)} so "
                             "every party agrees on the split sizes")
        raw = {k: (data.x[i, c, :, None], None, data.y[i]) for k, i in data.split.items()}
        n_classes = 2
    padded = s.dataset == "vowels"
    mu, sd = owner_scaler(raw, padded)
    xt, lt = raw["test"][0][:CHECK_ROWS], raw["test"][1]
    return {"splits": standardise_owner(raw, padded), "n_classes": n_classes, "index": c, "scaler": (mu, sd),
            "raw_test": (xt, None if lt is None else lt[:CHECK_ROWS]), "feature_names": feature_names(s, c, ctx.data_dir)}


def feature_names(s: Settings, c: int, data_dir: str | None = None) -> list[str]:
    """Owner c's one channel: Japanese Vowels' LPC coefficient (the set names no columns: ``lpc_<k>``, in its
    order); traffic: the speed at its sensor (``speed_<sensor id>``, the road graph's ids)."""
    if s.dataset == "vowels":
        return [f"lpc_{c + 1}"]
    return [f"speed_{traffic.load_graph(s.dataset, data_dir)[0][c]}"]


# ------------------------------------------------------------------------ every owner's data
@dataclass
class OwnerData:
    """All owners' splits in one place: ``splits[k] = (x (owners, rows, T, 1), lengths (rows,) or None, y (rows,))``.

    Owner c's series are standardised with the mean and standard deviation of its own training rows
    (Japanese Vowels: the non-padded steps only), exactly as :func:`load_data` prepares them for owner c.
    """
    splits: dict
    n_classes: int
    adj: np.ndarray | None          # traffic: the road graph over the kept sensors; vowels: None
    provenance: str

    @property
    def n_owners(self) -> int:
        return self.splits["train"][0].shape[0]

    def labels(self) -> np.ndarray:
        """Labels of every position, in the coordinator's order: train, validation, test."""
        return np.concatenate([self.splits[k][2] for k in ("train", "val", "test")]).astype(np.int64)

    def positions(self) -> dict:
        """Positions of the train / val / test rows in :meth:`labels` order."""
        n = [len(self.splits[k][2]) for k in ("train", "val", "test")]
        return {"train": np.arange(n[0]), "val": np.arange(n[0], n[0] + n[1]),
                "test": np.arange(n[0] + n[1], sum(n))}


def vowels_parts(split_seed: int = 123, val_fraction: float = 0.2, data_dir=None) -> dict:
    """Japanese Vowels' train / val / test as ``{split: (VowelsSplit, row indices)}``: the TRAIN file split
    by a seeded permutation (validation first), the TEST file whole."""
    tr, te = load_vowels(data_dir)
    perm = np.random.RandomState(split_seed).permutation(len(tr.labels))
    n_val = int(round(val_fraction * len(tr.labels)))
    return {"train": (tr, np.sort(perm[n_val:])), "val": (tr, np.sort(perm[:n_val])),
            "test": (te, np.arange(len(te.labels)))}


def owner_scaler(raw: dict, padded: bool) -> tuple[float, float]:
    """The mean and deviation of one owner's own training series (``padded``: zeros are padding, not data,
    and are left out)."""
    x_tr = raw["train"][0]
    real = x_tr[x_tr != 0] if padded else x_tr
    return float(real.mean()), float(real.std()) or 1.0


def standardise_owner(raw: dict, padded: bool) -> dict:
    """One owner's ``{split: (x, lengths, y)}`` scaled by :func:`owner_scaler`."""
    mu, sd = owner_scaler(raw, padded)
    return {k: ((x - mu) / sd, ln, y) for k, (x, ln, y) in raw.items()}


def owner_data(dataset: str, *, data_seed: int = 0, split_seed: int = 123, val_fraction: float = 0.2,
               n_windows: int | None = None, n_sensors: int | None = None, data_dir=None) -> OwnerData:
    """Every owner's standardised train / val / test series (the settings mean what they mean in ``f3.Settings``)."""
    if dataset == "vowels":
        parts = vowels_parts(split_seed, val_fraction, data_dir)
        owners = parts["train"][0].series.shape[1]
        per = [{k: (S.owner(c)[i], S.lengths[i], S.labels[i]) for k, (S, i) in parts.items()} for c in range(owners)]
        n_classes, adj, prov = N_CLASSES, None, "real (UCI Japanese Vowels)"
    elif dataset in ("metr_la", "pems_bay", "grid"):
        data = traffic.simulate(dataset, seed=data_seed, n_windows=n_windows, data_dir=data_dir)
        owners = n_sensors or data.adj.shape[0]
        per = [{k: (data.x[i, c, :, None], None, data.y[i]) for k, i in data.split.items()} for c in range(owners)]
        n_classes, adj, prov = 2, data.adj[:owners, :owners], f"{data.provenance}: {dataset}"
    else:
        raise ValueError(f"unknown F3 data set {dataset!r}; choose vowels, metr_la, pems_bay or grid")
    per = [standardise_owner(r, padded=dataset == "vowels") for r in per]
    splits = {k: (np.stack([r[k][0] for r in per]), per[0][k][1], per[0][k][2]) for k in ("train", "val", "test")}
    return OwnerData(splits, n_classes, adj, prov)
