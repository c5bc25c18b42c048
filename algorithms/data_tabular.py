"""Tabular datasets for the horizontal experiments (CHFL Table I).

Every loader returns a :class:`Tabular` ``(X, y, name)``: ``X`` float32 of
shape (n, d) with the raw feature values (scaling is the clients' job, on
their own training rows), ``y`` int64 labels re-coded to ``0..C-1``.

Stored sets (under :func:`fedhet.algorithms.datapath.data_root`):

- ``covertype``  -- ``covtype_kaggle/train.csv.gz``: Kaggle's class-balanced
  15,120 x 54 x 7 training file, the exact set of the paper's Table I.
- ``sensorless`` -- ``sensorless_subset/X.npy, Y.npy``: a balanced 2,200-row
  subset of UCI Sensorless Drive Diagnosis (full set: 58,509 rows).
- ``jannis``     -- ``jannis_partial/``: the val + test parts (30,145 rows) of
  the rtdl split of OpenML 41168 (full set: 83,733 rows).
- ``vehicle``    -- ``fate/vehicle_scale_hetero_{guest,host}.csv`` joined on
  ``id``: 846 x 18 x 4 (not in the paper; a small stored extra).

Not stored (``helena`` = OpenML 41169, ``aloi`` = OpenML 42396): read from a
user's own copy in ``data_dir/<name>/`` (``X.npy`` + ``y.npy``, or the rtdl
layout ``N_{train,val,test}.npy`` + ``y_{...}.npy``, or ``<name>.csv[.gz]``
with the label in a column named ``class``/``target``/``y`` or last), else
fetched from OpenML with :func:`sklearn.datasets.fetch_openml` when the
network allows, cached as ``.npz`` under :func:`datapath.cache_dir`.
"""
from __future__ import annotations

import csv
import gzip
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from fedhet.algorithms.datapath import DatasetNotFound, cache_dir, data_root
from fedhet.algorithms.party_table import check_finite


class Tabular(NamedTuple):
    X: np.ndarray  # float32 (n, d)
    y: np.ndarray  # int64 (n,), values 0..C-1
    name: str

    @property
    def n_classes(self) -> int:
        return int(self.y.max()) + 1 if self.y.size else 0


OPENML_IDS = {"helena": 41169, "aloi": 42396, "jannis": 41168}
STORED = ("covertype", "sensorless", "jannis", "vehicle")
DATASETS = STORED + ("helena", "aloi")


def _finish(X, y, name: str) -> Tabular:
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float32))
    y = np.asarray(y).reshape(-1)
    if X.ndim != 2 or X.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: X {X.shape} and y {y.shape} do not match")
    check_finite(X, dataset=name)  # DataFileError (a ValueError) naming row and column
    # Re-code labels to 0..C-1 in sorted order (covertype is 1..7, UCI style).
    _, codes = np.unique(y, return_inverse=True)
    return Tabular(X, codes.astype(np.int64).reshape(-1), name)


def _read_csv(path: Path) -> tuple[list[str], np.ndarray]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows, lines = [], []
        for r in reader:
            if r:
                rows.append(r)
                lines.append(reader.line_num)
    try:
        arr = np.asarray(rows, dtype=np.float64)
    except ValueError as e:
        raise ValueError(f"{path}: non-numeric value ({e})") from None
    if arr.ndim != 2 or arr.shape[1] != len(header):
        raise ValueError(f"{path}: rows do not all have {len(header)} columns")
    check_finite(arr, columns=header, path=path, lines=lines)
    return header, arr


def _dir(data_dir, *parts: str) -> Path:
    p = data_root(data_dir).joinpath(*parts)
    if not p.exists():
        raise DatasetNotFound(f"{'/'.join(parts)} not found under {data_root(data_dir)}")
    return p


def load_covertype(data_dir=None) -> Tabular:
    path = _dir(data_dir, "covtype_kaggle", "train.csv.gz")
    header, arr = _read_csv(path)
    if "Cover_Type" not in header:
        raise ValueError(f"{path}: no Cover_Type column")
    lab = header.index("Cover_Type")
    feats = [i for i, h in enumerate(header) if h not in ("Id", "Cover_Type")]
    return _finish(arr[:, feats], arr[:, lab].astype(np.int64), "covertype")


def load_sensorless(data_dir=None) -> Tabular:
    d = _dir(data_dir, "sensorless_subset")
    X = np.load(d / "X.npy")
    y = np.load(d / "Y.npy")
    if not np.allclose(y, np.round(y)):
        raise ValueError(f"{d}/Y.npy: labels are not integers")
    return _finish(X, np.round(y).astype(np.int64), "sensorless")


def load_jannis(data_dir=None) -> Tabular:
    # Only the rtdl val + test parts are stored; a user's full copy (with
    # N_train.npy) is used whole when present.
    d = _dir(data_dir, "jannis_partial")
    parts = [p for p in ("train", "val", "test") if (d / f"N_{p}.npy").exists()]
    if not parts:
        raise DatasetNotFound(f"{d}: no N_*.npy files")
    X = np.concatenate([np.load(d / f"N_{p}.npy") for p in parts])
    y = np.concatenate([np.load(d / f"y_{p}.npy") for p in parts])
    return _finish(X, y, "jannis")


def load_vehicle(data_dir=None) -> Tabular:
    d = _dir(data_dir, "fate")
    hg, g = _read_csv(d / "vehicle_scale_hetero_guest.csv")
    hh, h = _read_csv(d / "vehicle_scale_hetero_host.csv")
    if "id" not in hg or "y" not in hg or "id" not in hh:
        raise ValueError(f"{d}: vehicle files need 'id' (both) and 'y' (guest) columns")
    gid, hid = g[:, hg.index("id")], h[:, hh.index("id")]
    if len(np.unique(gid)) != len(gid) or set(gid.tolist()) != set(hid.tolist()):
        raise ValueError(f"{d}: vehicle guest and host ids differ or repeat")
    order_g, order_h = np.argsort(gid, kind="stable"), np.argsort(hid, kind="stable")
    gf = [i for i, c in enumerate(hg) if c not in ("id", "y")]
    hf = [i for i, c in enumerate(hh) if c != "id"]
    X = np.hstack([g[order_g][:, gf], h[order_h][:, hf]])
    y = g[order_g, hg.index("y")].astype(np.int64)
    return _finish(X, y, "vehicle")


# ---------------------------------------------------------------- not stored

def _from_user_copy(folder: Path, name: str) -> Tabular | None:
    if (folder / "X.npy").exists():
        ypath = folder / "y.npy" if (folder / "y.npy").exists() else folder / "Y.npy"
        if not ypath.exists():
            raise DatasetNotFound(f"{folder}: X.npy without y.npy")
        return _finish(np.load(folder / "X.npy"), np.load(ypath), name)
    parts = [p for p in ("train", "val", "test") if (folder / f"N_{p}.npy").exists()]
    if parts:
        X = np.concatenate([np.load(folder / f"N_{p}.npy") for p in parts])
        y = np.concatenate([np.load(folder / f"y_{p}.npy") for p in parts])
        return _finish(X, y, name)
    for fn in (f"{name}.csv", f"{name}.csv.gz"):
        for base in (folder, folder.parent):
            if (base / fn).exists():
                header, arr = _read_csv(base / fn)
                low = [h.strip().lower() for h in header]
                lab = next((low.index(c) for c in ("class", "target", "y", "label") if c in low),
                           len(header) - 1)
                feats = [i for i in range(len(header)) if i != lab]
                return _finish(arr[:, feats], arr[:, lab], name)
    return None


def _fetch_openml(name: str) -> Tabular:
    cache = cache_dir() / "openml"
    cache.mkdir(parents=True, exist_ok=True)
    npz = cache / f"{name}.npz"
    if npz.exists():
        z = np.load(npz)
        return _finish(z["X"], z["y"], name)
    try:
        from sklearn.datasets import fetch_openml
        b = fetch_openml(data_id=OPENML_IDS[name], as_frame=False, parser="liac-arff",
                         n_retries=2, data_home=str(cache))
    except Exception as e:  # network, missing parser, server errors
        raise DatasetNotFound(
            f"{name} is not stored with the project and could not be fetched from OpenML "
            f"(data_id {OPENML_IDS[name]}): {type(e).__name__}: {e}. Put your copy in "
            f"<data_dir>/{name}/ as X.npy + y.npy (or rtdl N_*.npy/y_*.npy, or {name}.csv) "
            f"and pass data_dir / set FEDHET_DATA_DIR."
        ) from None
    X = np.asarray(b.data, dtype=np.float32)
    t = _finish(X, np.asarray(b.target), name)
    tmp = npz.with_suffix(".tmp.npz")
    np.savez_compressed(tmp, X=t.X, y=t.y)
    os.replace(tmp, npz)
    return t


def load_openml_set(name: str, data_dir=None) -> Tabular:
    """helena / aloi: a user's copy first, else OpenML (cached)."""
    if name not in ("helena", "aloi"):
        raise ValueError(f"{name!r} is not an OpenML-only set (helena, aloi)")
    root = data_root(data_dir, required=data_dir is not None)
    if root is not None and (root / name).exists():
        got = _from_user_copy(root / name, name)
        if got is None:
            raise DatasetNotFound(f"{root / name}: no X.npy+y.npy, N_*.npy or {name}.csv inside")
        return got
    if root is not None:
        got = _from_user_copy(root, name) if (root / f"{name}.csv").exists() or (
            root / f"{name}.csv.gz").exists() else None
        if got is not None:
            return got
    return _fetch_openml(name)


_LOADERS = {
    "covertype": load_covertype,
    "sensorless": load_sensorless,
    "jannis": load_jannis,
    "vehicle": load_vehicle,
    "helena": lambda data_dir=None: load_openml_set("helena", data_dir),
    "aloi": lambda data_dir=None: load_openml_set("aloi", data_dir),
}


def load_tabular(name: str, data_dir: str | os.PathLike | None = None) -> Tabular:
    """Load one of :data:`DATASETS` by name."""
    key = name.strip().lower()
    if key not in _LOADERS:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    return _LOADERS[key](data_dir=data_dir)
