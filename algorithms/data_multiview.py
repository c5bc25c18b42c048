"""Multi-view datasets (MMVFL's Table 2, the HyFEM pose views) and balanced splits.

Every loader returns a :class:`MultiView`: ``views`` (list of float32 N x d_k
arrays, rows aligned), ``y`` (int64 labels 0..C-1), ``view_names``, ``name``
and ``kind`` -- ``"real"`` (the paper's dataset), ``"stand-in"`` (a
substitute, said so in every result) or ``"synthetic"``.  Raw values:
scaling is each participant's job on its own training rows.

Stored sets (under :func:`fedhet.algorithms.datapath.data_root`):

- ``handwritten`` -- ``mfeat_handwritten/handwritten.mat`` (UCI mfeat, 2,000 x
  6 views 240/76/216/47/64/6, 10 classes).  ``drop_small=True`` (MMVFL, as in
  the paper) drops the 6-feature morphological view.
- ``isolet`` -- ``isolet/Isolet.mat``: the ASU scikit-feature 1,560-row file
  (60 per letter = Table 2's 40 + 20 per class), 617 features split in column
  order into 3 views of 200/200/217.  ``source="uci_full"`` uses the whole UCI
  set instead (Isolet1..4.mat + isolet5.mat, 7,797 rows).
- ``relathe`` -- ``relathe/RELATHE.mat`` (1,427 x 4,322 term counts, 2
  classes), split in column order into 1,400/1,400/1,522.
- ``msrc_v5`` -- ``msrc_v5_multiview_standin/MSRC-v5.mat``: **stand-in** for
  Caltech7 (not available offline): 210 images, 7 classes, 5 views
  CM 24 / HOG 576 / GIST 512 / LBP 256 / CENTRIST 254.
- ``coil20`` -- ``coil20_multiview_standin/COIL20.mat`` (**stand-in** for
  ModelNet40 multi-view): :func:`load_coil20` returns a :class:`PoseImages`
  (1,440 32x32 images flattened, object 0..19, pose index 0..71 = 5 degrees
  apart) so views at pose offsets can be built by the caller.

Splits (Section 5.1/5.3 and Table 2): :func:`balanced_split` draws
``n_train`` + ``n_val`` rows per class (balanced train and validation sets);
:func:`cv_folds` gives the 5 folds of the paper's cross-validation.  The
paper's two statements do not fit together exactly (Table 2's 120/40 per
class is a 3:1 ratio, "four of five parts for training" 4:1, and Relathe's
400 + 200 per class cannot make five disjoint validation parts out of 648
atheism posts), so the folds are built as follows and documented in every
result: each class's rows are shuffled once (``seed``); fold f takes as
validation the ``n_val`` rows starting at offset ``floor(f n_c / 5)`` of that
order and as training the ``n_train`` rows that follow, cyclically.  When
``5 n_val <= n_c`` the five validation sets are disjoint (a proper 5-fold
CV: Handwritten's 200 per class = 5 x 40 exactly); otherwise they overlap
as little as the counts allow (Isolet's 60 per class, Relathe's 648) and
:attr:`Fold.disjoint_validation` says so.  Train and validation never share
a row within a fold.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from fedhet.algorithms.datapath import dataset_path

__all__ = [
    "MultiView", "PoseImages", "Fold", "DATASETS", "TABLE2_SPLITS", "KINDS",
    "load_multiview", "load_handwritten", "load_isolet", "load_relathe", "load_msrc_v5",
    "load_coil20", "load_digits", "split_columns", "balanced_split", "cv_folds", "make_synthetic",
]

KINDS = ("real", "stand-in", "synthetic")
DATASETS = ("handwritten", "isolet", "relathe", "msrc_v5", "digits")
# Training / validation rows per class (Table 2); MSRC-v5 takes Caltech7's 20 / 5.
TABLE2_SPLITS = {
    "handwritten": (120, 40),
    "isolet": (40, 20),
    "relathe": (400, 200),
    "msrc_v5": (20, 5),
    "digits": (20, 10),   # packaged stand-in (no paper table): small enough for the tests
}
# scikit-learn's 8 x 8 digits cut into its four 4 x 4 quadrants (upper left, upper right, lower left,
# lower right): 16 pixels a view.  It ships with scikit-learn, so needs no data folder.
DIGITS_VIEWS = ("upper_left", "upper_right", "lower_left", "lower_right")
DIGITS_DIMS = (16, 16, 16, 16)
ISOLET_SPLIT = (200, 200, 217)
RELATHE_SPLIT = (1400, 1400, 1522)


@dataclass(frozen=True, eq=False)
class MultiView:
    views: list[np.ndarray]       # float32 (N, d_k), rows aligned across views
    y: np.ndarray                 # int64 (N,), 0..C-1
    view_names: tuple[str, ...]
    name: str
    kind: str                     # "real" | "stand-in" | "synthetic"
    note: str = ""                # what the stand-in replaces, where the file came from

    @property
    def n_rows(self) -> int:
        return int(self.y.shape[0])

    @property
    def n_classes(self) -> int:
        return int(self.y.max()) + 1 if self.y.size else 0

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(int(v.shape[1]) for v in self.views)


@dataclass(frozen=True, eq=False)
class PoseImages:
    images: np.ndarray    # float32 (N, 1024): 32x32 grey images, values in [0, 1]
    object: np.ndarray    # int64 (N,), 0..19
    pose: np.ndarray      # int64 (N,), 0..71 (5 degrees apart, start angle unknown)
    name: str
    kind: str
    note: str = ""


# ---------------------------------------------------------------- validation
def _check_finite(name: str, view: str, X: np.ndarray, path: Path) -> None:
    bad = ~np.isfinite(X)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"{name} ({path}): view {view!r} has {int(bad.sum())} NaN/infinite values, "
                         f"first at row {int(r)}, column {int(c)}")


def _labels(raw, name: str, path: Path, n: int) -> np.ndarray:
    y = np.asarray(raw).reshape(-1)
    if y.shape[0] != n:
        raise ValueError(f"{name} ({path}): {y.shape[0]} labels for {n} rows")
    if not np.issubdtype(y.dtype, np.number) or not np.isfinite(y.astype(np.float64)).all():
        raise ValueError(f"{name} ({path}): labels are not all finite numbers")
    _, codes = np.unique(y, return_inverse=True)
    return codes.astype(np.int64).reshape(-1)


def _finish(name: str, kind: str, views: Sequence[np.ndarray], names: Sequence[str], y_raw,
            path: Path, note: str = "") -> MultiView:
    out = []
    n = None
    for X, vn in zip(views, names):
        X = np.asarray(X)
        if X.ndim != 2:
            raise ValueError(f"{name} ({path}): view {vn!r} is not a matrix (shape {X.shape})")
        if n is None:
            n = X.shape[0]
        elif X.shape[0] != n:
            raise ValueError(f"{name} ({path}): view {vn!r} has {X.shape[0]} rows, the first view {n}")
        X = np.ascontiguousarray(X.astype(np.float32))
        _check_finite(name, vn, X, path)
        out.append(X)
    if n is None:
        raise ValueError(f"{name} ({path}): no views")
    return MultiView(views=out, y=_labels(y_raw, name, path, n), view_names=tuple(names),
                     name=name, kind=kind, note=note)


def _loadmat(path: Path, name: str, keys: Sequence[str]) -> dict:
    from scipy.io import loadmat  # scipy.io is only needed by the loaders
    try:
        m = loadmat(path)
    except Exception as exc:  # noqa: BLE001 - any parse failure is reported with the file
        raise ValueError(f"{name}: cannot read {path} as a MATLAB file ({type(exc).__name__}: {exc})") from None
    missing = [k for k in keys if k not in m]
    if missing:
        raise ValueError(f"{name}: {path} lacks variable(s) {missing}; has {sorted(k for k in m if not k.startswith('__'))}")
    return m


def split_columns(X: np.ndarray, sizes: Sequence[int], name: str = "X") -> list[np.ndarray]:
    """Split X's columns, in order, into consecutive blocks of the given sizes."""
    if sum(sizes) != X.shape[1]:
        raise ValueError(f"{name}: split sizes {tuple(sizes)} sum to {sum(sizes)}, not {X.shape[1]} columns")
    bounds = np.cumsum([0, *sizes])
    return [X[:, bounds[i]:bounds[i + 1]] for i in range(len(sizes))]


# ---------------------------------------------------------------- loaders
def load_handwritten(data_dir: str | os.PathLike | None = None, drop_small: bool = True) -> MultiView:
    """UCI mfeat: views pixel 240, fourier 76, profile 216, zer 47, kar 64 (+ mor 6 unless drop_small)."""
    path = dataset_path("mfeat_handwritten", "handwritten.mat", data_dir=data_dir)
    m = _loadmat(path, "handwritten", ("X", "Y"))
    cells = [np.asarray(c) for c in np.asarray(m["X"], dtype=object).reshape(-1)]
    if "feas" in m:
        names = [str(np.asarray(v).reshape(-1)[0]) for v in np.asarray(m["feas"], dtype=object).reshape(-1)]
    else:
        names = [f"view{i}" for i in range(len(cells))]
    if len(cells) != 6 or len(names) != 6:
        raise ValueError(f"handwritten ({path}): expected 6 views, found {len(cells)}")
    if drop_small:
        keep = [i for i, c in enumerate(cells) if c.shape[1] > 6]
        cells = [cells[i] for i in keep]
        names = [names[i] for i in keep]
    return _finish("handwritten", "real", cells, names, m["Y"], path,
                   "UCI Multiple Features (mfeat)" + ("; morphological view dropped" if drop_small else ""))


def load_isolet(data_dir: str | os.PathLike | None = None, source: str = "asu") -> MultiView:
    """ISOLET, 617 features split 200/200/217 into 3 views.

    source "asu": Isolet.mat, 1,560 rows (60 per letter); "uci_full": the 5 UCI parts, 7,797 rows."""
    if source == "asu":
        path = dataset_path("isolet", "Isolet.mat", data_dir=data_dir)
        m = _loadmat(path, "isolet", ("X", "Y"))
        X, y = np.asarray(m["X"]), m["Y"]
    elif source == "uci_full":
        parts = ("Isolet1.mat", "Isolet2.mat", "Isolet3.mat", "Isolet4.mat", "isolet5.mat")
        Xs, ys = [], []
        for f in parts:
            p = dataset_path("isolet", f, data_dir=data_dir)
            m = _loadmat(p, "isolet", ("fea", "gnd"))
            Xs.append(np.asarray(m["fea"]))
            ys.append(np.asarray(m["gnd"]).reshape(-1))
        path = dataset_path("isolet", data_dir=data_dir)
        X, y = np.vstack(Xs), np.concatenate(ys)
    else:
        raise ValueError(f"isolet source must be 'asu' or 'uci_full', got {source!r}")
    if X.ndim != 2 or X.shape[1] != sum(ISOLET_SPLIT):
        raise ValueError(f"isolet ({path}): expected 617 feature columns, got shape {X.shape}")
    views = split_columns(X, ISOLET_SPLIT, "isolet")
    return _finish("isolet", "real", views, ("isolet_a", "isolet_b", "isolet_c"), y, path,
                   f"UCI ISOLET ({source}); 617 features split in column order {ISOLET_SPLIT}")


def load_relathe(data_dir: str | os.PathLike | None = None) -> MultiView:
    """RELATHE (20 Newsgroups religion vs atheism, term counts), split 1,400/1,400/1,522."""
    path = dataset_path("relathe", "RELATHE.mat", data_dir=data_dir)
    m = _loadmat(path, "relathe", ("X", "Y"))
    X = m["X"]
    if hasattr(X, "toarray"):   # a user's copy may store it sparse
        X = X.toarray()
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != sum(RELATHE_SPLIT):
        raise ValueError(f"relathe ({path}): expected 4,322 feature columns, got shape {X.shape}")
    views = split_columns(X, RELATHE_SPLIT, "relathe")
    return _finish("relathe", "real", views, ("relathe_a", "relathe_b", "relathe_c"), m["Y"], path,
                   f"ASU RELATHE; 4,322 term columns split in column order {RELATHE_SPLIT}")


def load_msrc_v5(data_dir: str | os.PathLike | None = None) -> MultiView:
    """MSRC-v5, 5 views (CM, HOG, GIST, LBP, CENTRIST), 7 classes: STAND-IN for Caltech7."""
    path = dataset_path("msrc_v5_multiview_standin", "MSRC-v5.mat", data_dir=data_dir)
    m = _loadmat(path, "msrc_v5", ("X", "y"))
    cells = [np.asarray(c) for c in np.asarray(m["X"], dtype=object).reshape(-1)]
    names = ("CM", "HOG", "GIST", "LBP", "CENTRIST")
    if len(cells) != len(names):
        raise ValueError(f"msrc_v5 ({path}): expected {len(names)} views, found {len(cells)}")
    return _finish("msrc_v5", "stand-in", cells, names, m["y"], path,
                   "MSRC-v5 (7 classes x 30 images) standing in for Caltech101-7, which is not stored")


def load_coil20(data_dir: str | os.PathLike | None = None) -> PoseImages:
    """COIL-20 (32x32), with object and pose index per row: STAND-IN for ModelNet40 multi-view."""
    path = dataset_path("coil20_multiview_standin", "COIL20.mat", data_dir=data_dir)
    m = _loadmat(path, "coil20", ("fea", "gnd"))
    X = np.asarray(m["fea"])
    if X.ndim != 2 or X.shape[1] != 1024:
        raise ValueError(f"coil20 ({path}): expected 1,024 pixel columns, got shape {X.shape}")
    X = np.ascontiguousarray(X.astype(np.float32))
    _check_finite("coil20", "images", X, path)
    obj = _labels(m["gnd"], "coil20", path, X.shape[0])
    # Rows are in contiguous object blocks, in pose order within each (SOURCE.md).
    counts = np.bincount(obj)
    if not (np.all(np.diff(obj) >= 0) and np.all(counts == 72)):
        raise ValueError(f"coil20 ({path}): expected 72 rows per object in contiguous blocks")
    pose = np.arange(X.shape[0], dtype=np.int64) % 72
    return PoseImages(images=X, object=obj, pose=pose, name="coil20", kind="stand-in",
                      note="COIL-20 (20 objects x 72 poses) standing in for ModelNet40 multi-view")


def load_digits(data_dir: str | os.PathLike | None = None) -> MultiView:
    """scikit-learn's digits (1,797 rows, 10 classes, 8 x 8 pixels 0..16) as four views, the image's
    4 x 4 quadrants (:data:`DIGITS_VIEWS`), scaled to [0, 1].  Packaged with scikit-learn: the
    smallest multi-view set every test and first look can use without ``../shared/data``; it stands
    in for Handwritten (``data_dir`` is accepted for a uniform loader signature and not read)."""
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    img = np.asarray(d.images, dtype=np.float32) / 16.0           # (N, 8, 8)
    quads = [img[:, r:r + 4, c:c + 4].reshape(len(img), 16) for r in (0, 4) for c in (0, 4)]
    return _finish("digits", "stand-in", quads, DIGITS_VIEWS, d.target, Path("sklearn.datasets.load_digits"),
                   "scikit-learn digits (UCI optdigits test set), 4 x 4 quadrant views, standing in for Handwritten")


_LOADERS = {
    "digits": load_digits,
    "handwritten": load_handwritten,
    "isolet": load_isolet,
    "relathe": load_relathe,
    "msrc_v5": load_msrc_v5,
}


def load_multiview(name: str, data_dir: str | os.PathLike | None = None, **kwargs) -> MultiView:
    """One of :data:`DATASETS` by name (keyword arguments go to its loader)."""
    try:
        loader = _LOADERS[name]
    except KeyError:
        raise ValueError(f"unknown multi-view dataset {name!r}; known: {DATASETS}") from None
    return loader(data_dir=data_dir, **kwargs)


# ---------------------------------------------------------------- splits
@dataclass(frozen=True, eq=False)
class Fold:
    index: int
    train: np.ndarray             # row indices, sorted
    val: np.ndarray               # row indices, sorted
    disjoint_validation: bool     # the folds' validation sets do not overlap


def _class_rows(y: np.ndarray, n_need: int, what: str) -> list[np.ndarray]:
    y = np.asarray(y).reshape(-1)
    if y.size == 0:
        raise ValueError(f"{what}: no labels")
    out = []
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        if rows.size < n_need:
            raise ValueError(f"{what}: class {c} has {rows.size} rows, needs {n_need}")
        out.append(rows)
    return out


def balanced_split(y, n_train_per_class: int, n_val_per_class: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint balanced training and validation rows: ``n_train`` + ``n_val`` drawn per class.

    Returns (train, val), each sorted."""
    if n_train_per_class < 1 or n_val_per_class < 0:
        raise ValueError(f"need n_train_per_class >= 1 and n_val_per_class >= 0, got "
                         f"{n_train_per_class}, {n_val_per_class}")
    rng = np.random.default_rng(seed)
    train, val = [], []
    for rows in _class_rows(y, n_train_per_class + n_val_per_class, "balanced_split"):
        perm = rng.permutation(rows)
        train.append(perm[:n_train_per_class])
        val.append(perm[n_train_per_class:n_train_per_class + n_val_per_class])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def cv_folds(y, n_train_per_class: int, n_val_per_class: int, seed: int,
             n_folds: int = 5) -> list[Fold]:
    """The paper's ``n_folds``-fold cross-validation with balanced classes (module docstring)."""
    if n_train_per_class < 1 or n_val_per_class < 1 or n_folds < 1:
        raise ValueError(f"need n_train_per_class, n_val_per_class, n_folds >= 1, got "
                         f"{n_train_per_class}, {n_val_per_class}, {n_folds}")
    rng = np.random.default_rng(seed)
    per_class = [rng.permutation(rows)
                 for rows in _class_rows(y, n_train_per_class + n_val_per_class, "cv_folds")]
    disjoint = all(n_folds * n_val_per_class <= r.size for r in per_class)
    folds = []
    for f in range(n_folds):
        train, val = [], []
        for perm in per_class:
            n_c = perm.size
            start = (f * n_c) // n_folds
            take = (start + np.arange(n_val_per_class + n_train_per_class)) % n_c
            val.append(perm[take[:n_val_per_class]])
            train.append(perm[take[n_val_per_class:]])
        folds.append(Fold(index=f, train=np.sort(np.concatenate(train)),
                          val=np.sort(np.concatenate(val)), disjoint_validation=disjoint))
    return folds


# ---------------------------------------------------------------- synthetic
def make_synthetic(n_per_class: int = 40, n_classes: int = 4, dims: Sequence[int] = (20, 30, 25),
                   informative: Sequence[int] | int = 5, separation: float = 3.0,
                   seed: int = 0) -> MultiView:
    """Gaussian classes seen through several views: in view k only the first ``informative[k]``
    columns carry the class (class means differ there, spread ``separation / 2`` noise standard
    deviations across classes); the others are pure N(0, 1) noise."""
    rng = np.random.default_rng(seed)
    inf = [informative] * len(dims) if isinstance(informative, int) else list(informative)
    if len(inf) != len(dims) or any(i < 0 or i > d for i, d in zip(inf, dims)):
        raise ValueError(f"informative {informative!r} does not fit dims {tuple(dims)}")
    y = np.repeat(np.arange(n_classes, dtype=np.int64), n_per_class)
    views = []
    for d, m in zip(dims, inf):
        X = rng.standard_normal((y.size, d))
        if m and n_classes > 1:
            # every informative column separates the classes: class means centred per column,
            # their spread (std across classes) = separation / 2 noise standard deviations
            means = rng.standard_normal((n_classes, m))
            means -= means.mean(axis=0)
            means *= (separation / 2) / means.std(axis=0).clip(1e-12)
            X[:, :m] += means[y]
        views.append(X.astype(np.float32))
    return MultiView(views=views, y=y, view_names=tuple(f"view{k}" for k in range(len(dims))),
                     name="synthetic", kind="synthetic",
                     note=f"seed {seed}; informative columns per view {tuple(inf)}")
