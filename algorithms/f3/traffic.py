"""Traffic incident windows SIMULATED on the real METR-LA (207) / PEMS-BAY (325) sensor graphs.

Everything this module generates is "synthetic (simulated on the real road graph)"
(:data:`PROVENANCE`); the generative process is written in ``traffic.md``.  The graphs are
DCRNN's ``adj_mx.pkl`` / ``adj_mx_bay.pkl`` (``../shared/data/traffic_metr_la_pems_bay``), read
with :func:`load_graph`, a restricted unpickler that only rebuilds builtins and numpy arrays.

``simulate(name, seed)`` -> :class:`TrafficData`: x (windows, sensors, 12) speeds, y (windows,)
0/1 incident label, the adjacency and the reference split (70/10/20, numpy seed 123).
``load_real(h5_path, labels_path)``: the real speeds (``metr-la.h5`` / ``pems-bay.h5``, needs
h5py) cut into 12-step windows, with a user's label file (one 0/1 per window, .npy or text).
"""
from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet.algorithms.datapath import data_root

__all__ = ["PROVENANCE", "GRAPHS", "SIZES", "GENERATED", "load_graph", "grid_graph", "provenance", "simulate",
           "split_indices", "TrafficData", "load_real"]

PROVENANCE = "synthetic (simulated on the real road graph)"
GRAPHS = {"metr_la": "adj_mx.pkl", "pems_bay": "adj_mx_bay.pkl"}
# Generated graphs: need no data folder (tests, first looks); "grid" is a 4 x 4 street grid.
GENERATED = {"grid": 4}
SIZES = {"metr_la": (2856, 207), "pems_bay": (4343, 325), "grid": (600, 16)}
STEPS = 12


class _SafeUnpickler(pickle.Unpickler):
    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("copy_reg", "_reconstructor"), ("copyreg", "_reconstructor"),
               ("__builtin__", "object"), ("builtins", "object")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a graph pickle (only numpy arrays allowed)")


def provenance(name: str) -> str:
    """What a simulation on graph ``name`` is, for every table that shows its results."""
    if name in GENERATED:
        side = GENERATED[name]
        return f"synthetic (simulated on a generated {side} x {side} grid road graph)"
    return PROVENANCE


def grid_graph(side: int = 4, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """A generated road graph: ``side`` x ``side`` intersections with a sensor each, two-way roads
    between grid neighbours of seeded lengths (0.5 to 1.5 miles), weighted as DCRNN weights its
    graphs, exp(-(d / sigma)^2) with sigma the lengths' standard deviation, self loops 1."""
    n = side * side
    rng = np.random.default_rng([seed, side])
    adj = np.eye(n)
    for r in range(side):
        for c in range(side):
            i = r * side + c
            for j in ((i + 1) if c + 1 < side else None, (i + side) if r + 1 < side else None):
                if j is not None:
                    adj[i, j] = adj[j, i] = rng.uniform(0.5, 1.5)
    d = adj[(adj > 0) & ~np.eye(n, dtype=bool)]
    sigma = float(d.std()) or 1.0
    off = (adj > 0) & ~np.eye(n, dtype=bool)
    adj[off] = np.exp(-(adj[off] / sigma) ** 2)
    return [f"g{i}" for i in range(n)], adj


def load_graph(name: str = "metr_la", data_dir=None) -> tuple[list[str], np.ndarray]:
    """(sensor ids, adjacency float64 (n, n)); adj[i, j] > 0: a road edge i -> j, weight from distance."""
    if name in GENERATED:
        return grid_graph(GENERATED[name])
    if name not in GRAPHS:
        raise ValueError(f"unknown traffic graph {name!r}; choose one of {sorted(GRAPHS) + sorted(GENERATED)}")
    path = Path(data_root(data_dir)) / "traffic_metr_la_pems_bay" / GRAPHS[name]
    with open(path, "rb") as f:
        obj = _SafeUnpickler(io.BytesIO(f.read()), encoding="latin1").load()
    if not (isinstance(obj, list) and len(obj) == 3):
        raise ValueError(f"{path}: expected [sensor_ids, id_to_index, adj], got {type(obj).__name__}")
    ids, _idx, adj = obj
    adj = np.asarray(adj, dtype=np.float64)
    if adj.shape != (len(ids), len(ids)):
        raise ValueError(f"{path}: adjacency {adj.shape} does not match {len(ids)} sensor ids")
    return [str(i) for i in ids], adj


def split_indices(n: int, seed: int = 123) -> dict[str, np.ndarray]:
    """The reference split: one permutation (numpy seed 123), first 70% train, next 10% val, last 20% test."""
    perm = np.random.RandomState(seed).permutation(n)
    a, b = int(round(0.7 * n)), int(round(0.8 * n))
    return {"train": perm[:a], "val": perm[a:b], "test": perm[b:]}


@dataclass
class TrafficData:
    x: np.ndarray            # (windows, sensors, 12) speeds, mph
    y: np.ndarray            # (windows,) 1 = an incident is active in the window
    adj: np.ndarray          # (sensors, sensors)
    split: dict
    provenance: str = PROVENANCE


def simulate(name: str = "metr_la", seed: int = 0, n_windows: int | None = None, data_dir=None,
             incident_rate: float = 0.2, severity: tuple = (0.15, 0.35), decay: float = 0.9,
             hops: tuple | int = (3, 8), noise: float = 5.0, decoy_rate: float = 0.05) -> TrafficData:
    """Seeded simulation on the real graph (process and calibration in traffic.md)."""
    _ids, adj = load_graph(name, data_dir)
    n = adj.shape[0]
    W = n_windows or SIZES[name][0]
    T = W * STEPS
    lo_hops, hi_hops = (int(hops), int(hops)) if isinstance(hops, (int, float, np.number)) else (int(hops[0]), int(hops[1]))
    rng = np.random.default_rng(seed)
    free = np.asarray(rng.uniform(55, 70, n))
    depth = rng.uniform(0.05, 0.35, (n, 2))
    hour = (np.arange(T) * 5 / 60.0) % 24
    prof = (depth[:, :1] * np.exp(-0.5 * ((hour - 8) / 1.2) ** 2)[None]
            + depth[:, 1:] * np.exp(-0.5 * ((hour - 17.5) / 1.5) ** 2)[None])   # (n, T)
    drop = np.zeros((n, T))
    label = np.zeros(W, dtype=np.int64)
    up = [np.flatnonzero((adj[:, j] > 0) & (np.arange(n) != j)) for j in range(n)]
    for w in np.flatnonzero(rng.random(W) < incident_rate):
        s, t0 = int(rng.integers(n)), w * STEPS + int(rng.integers(0, STEPS))
        dur = int(rng.integers(6, 25))
        sev = rng.uniform(*severity)
        reach = int(rng.integers(lo_hops, hi_hops + 1))
        # the queue grows upstream one hop per step and clears everywhere when the incident does, so a sensor
        # h hops away is slowed from t0 + h to t0 + dur (a wide, connected footprint: what lone decoys lack)
        level, seen = [s], {s}
        for h in range(reach + 1):
            a, b = t0 + h, t0 + dur
            if a < b and level:
                drop[level, a:b] = np.maximum(drop[level, a:b], sev * decay ** h)
            nxt = []
            for i in level:
                for u in up[i]:
                    if int(u) not in seen:
                        seen.add(int(u))
                        nxt.append(int(u))
            level = nxt
        label[t0 // STEPS: min(W, (t0 + dur - 1) // STEPS + 1)] = 1
    # decoys: isolated slowdowns at single sensors (a decoy_rate share of sensor-windows) that do not
    # propagate and are not incidents -- a lone sensor cannot tell them from its part of an incident
    for _ in range(int(rng.binomial(n * W, decoy_rate))):
        k, start, dur = rng.integers(n), rng.integers(T), int(rng.integers(3, 13))
        drop[k, start:start + dur] = np.maximum(drop[k, start:start + dur], rng.uniform(*severity))
    speed = free[:, None] * (1 - prof) * (1 - drop) + rng.normal(0, noise, (n, T))
    x = np.clip(speed, 0, 85).reshape(n, W, STEPS).transpose(1, 0, 2)
    return TrafficData(x, label, adj, split_indices(W), provenance(name))


def load_real(h5_path, labels_path, name: str = "metr_la", data_dir=None) -> TrafficData:
    """Real speeds (DCRNN's metr-la.h5 / pems-bay.h5, pandas HDF 'df') in 12-step windows + a user label file."""
    try:
        import h5py  # noqa: F401
        import pandas as pd
    except ImportError as e:
        raise ImportError(f"reading {h5_path} needs h5py and pandas (pip install h5py pandas tables): {e}") from None
    df = pd.read_hdf(h5_path)
    v = df.to_numpy(dtype=np.float64)
    _ids, adj = load_graph(name, data_dir)
    if v.shape[1] != adj.shape[0]:
        raise ValueError(f"{h5_path}: {v.shape[1]} sensors, the {name} graph has {adj.shape[0]}")
    W = v.shape[0] // STEPS
    x = v[:W * STEPS].reshape(W, STEPS, -1).transpose(0, 2, 1)
    lp = Path(labels_path)
    y = np.load(lp) if lp.suffix == ".npy" else np.loadtxt(lp)
    y = np.asarray(y).astype(np.int64).reshape(-1)
    if y.shape[0] != W:
        raise ValueError(f"{labels_path}: {y.shape[0]} labels, the speeds give {W} windows of {STEPS} steps")
    return TrafficData(x, y, adj, split_indices(W), provenance="real speeds, user-given labels")
