"""Vertically partitioned data sets for STFL and its baselines (FATE examples + a scikit-learn demo).

STFL's roles (paper §III): the **host** owns the labels and some feature columns; each **guest**
owns other columns of overlapping IDs.  FATE names the parties the other way round: in FATE's
``*_hetero_guest`` files the party with the label ``y`` is called "guest".  Here the label file is
always the STFL *host*:

=========  ==================================  =====================================  ========
name       STFL host (labels)                  STFL guest                             classes
=========  ==================================  =====================================  ========
cancer     breast_hetero_guest (10 cols + y)   breast_hetero_host (20 cols)           2
payment    default_credit_hetero_guest (13+y)  default_credit_hetero_host (10)        2
credit     give_credit_homo_test x0..x4 + y    give_credit_homo_test x5..x9           2
vehicle    vehicle_scale_hetero_guest (9 + y)  vehicle_scale_hetero_host (9)          4
breast_sk  sklearn ``load_breast_cancer``      (same columns as ``cancer``; no files) 2
=========  ==================================  =====================================  ========

*credit*: FATE's full give_credit hetero files (150,000 rows) are not in ``../shared/data``
(over the size kept there).  ``give_credit_hetero_test`` holds only the label owner's 5 columns,
so the 10-feature two-party version is built from ``give_credit_homo_test`` (the same 30,000
rows; its ``x0..x4`` equal the hetero file's) split 5/5: x0..x4 to the host — FATE's own
split — and x5..x9 to the guest.

*breast_sk* is scikit-learn's bundled WDBC table (no ``../shared`` needed, for the demo): host =
the 10 "worst" features (original columns 20..29), guest = the 20 "mean"/"standard error"
features (0..19) — the same column split as FATE's breast files — with synthetic string IDs;
the guest's rows are stored in a shuffled order so that IDs really have to be aligned.

Splits (paper §V-A): a random part of the IDs is the *self-taught* set — the guest keeps those
rows unlabeled, the host's rows for them are dropped; of the rest a random part is the test set and
the remainder the training set.  Default fractions 0.4 / 0.2 (self-taught / test), which gives
the paper's cancer sizes (228 self-taught rows; test 114 vs the paper's 113).

Standardisation is fitted on training rows only, per party (each party can only scale its own
columns): host columns on the host's training rows, guest columns on the guest's self-taught rows
(the guest's own training rows — it trains the VAE on them — and, unlike the host's train/test
split, something a guest knows in the federated run).  The same scaling is used by every method.
"""
from __future__ import annotations

import csv
import gzip
import io
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from fedhet.algorithms.datapath import DatasetNotFound, dataset_path
from fedhet.algorithms.party_table import check_finite
from fedhet.algorithms.toolkit import Scaler, Stream, stream_rng

DATASETS = ("cancer", "payment", "credit", "vehicle", "breast_sk")


# --------------------------------------------------------------------------------------------
# containers


@dataclass
class PartyTable:
    """One party's rows: string IDs, float32 features (n, d), labels (host only)."""

    ids: np.ndarray  # dtype str (numpy unicode)
    x: np.ndarray  # float32 (n, d)
    columns: list[str]
    y: np.ndarray | None = None  # int64 (n,)

    def __post_init__(self) -> None:
        if self.x.ndim != 2 or len(self.ids) != self.x.shape[0]:
            raise ValueError(f"ids ({len(self.ids)}) and features {self.x.shape} do not match")
        if self.y is not None and len(self.y) != len(self.ids):
            raise ValueError(f"ids ({len(self.ids)}) and labels ({len(self.y)}) do not match")

    def labels(self) -> np.ndarray:
        """The labels (the host's table); an error for a table without them."""
        if self.y is None:
            raise ValueError(f"this table ({', '.join(self.columns[:3])}...) has no label column")
        return self.y
        if len(set(self.ids.tolist())) != len(self.ids):
            raise ValueError("duplicate IDs in a party's table")
        if len(self.columns) != self.x.shape[1]:
            raise ValueError(f"{len(self.columns)} column names for {self.x.shape[1]} columns")

    def rows(self, ids: np.ndarray) -> "PartyTable":
        """The rows for ``ids`` in that order (KeyError naming a missing ID)."""
        pos = {v: i for i, v in enumerate(self.ids.tolist())}
        try:
            idx = np.fromiter((pos[v] for v in ids.tolist()), dtype=np.int64, count=len(ids))
        except KeyError as e:
            raise KeyError(f"ID {e.args[0]!r} not in this party's table") from None
        return PartyTable(self.ids[idx], self.x[idx], list(self.columns),
                          None if self.y is None else self.y[idx])


@dataclass
class VerticalData:
    """A vertically partitioned data set: the host (labels) and one or more guests."""

    name: str
    n_classes: int
    host: PartyTable
    guests: list[PartyTable]
    notes: str = ""

    @property
    def common_ids(self) -> np.ndarray:
        """IDs every party holds, sorted (what PSI would find)."""
        s = set(self.host.ids.tolist())
        for g in self.guests:
            s &= set(g.ids.tolist())
        return np.array(sorted(s))


@dataclass
class Split:
    """Disjoint ID sets; every ID in them is held by every party."""

    selftaught: np.ndarray
    train: np.ndarray
    test: np.ndarray
    seed: int

    def sizes(self) -> dict:
        return {"selftaught": len(self.selftaught), "train": len(self.train), "test": len(self.test)}


@dataclass
class HostView:
    """What the host holds in STFL: labeled train and test rows (self-taught rows dropped)."""

    ids_train: np.ndarray
    x_train: np.ndarray
    y_train: np.ndarray
    ids_test: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    # The dropped rows, only for the "(all data)" baselines of Table I; STFL never reads them.
    ids_selftaught: np.ndarray = field(default_factory=lambda: np.array([], dtype=str))
    x_selftaught: np.ndarray | None = None
    y_selftaught: np.ndarray | None = None


@dataclass
class GuestView:
    """What one guest holds: unlabeled self-taught rows and the rows it shares with the host."""

    ids_unlabeled: np.ndarray
    x_unlabeled: np.ndarray
    ids_train: np.ndarray
    x_train: np.ndarray
    ids_test: np.ndarray
    x_test: np.ndarray


# --------------------------------------------------------------------------------------------
# reading


@lru_cache(maxsize=16)
def _read_csv(path: str) -> tuple[list[str], np.ndarray, np.ndarray | None, np.ndarray]:
    """(feature column names, ids as str, y or None, x float32) of one FATE csv (optionally .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", newline="") as fh:
        text = fh.read()
    reader = csv.reader(io.StringIO(text))
    header = next(reader)
    if not header or header[0] != "id":
        raise ValueError(f"{path}: first column must be 'id', got {header[:1]}")
    has_y = len(header) > 1 and header[1] == "y"
    rows = list(reader)
    ids = np.array([r[0] for r in rows])
    start = 2 if has_y else 1
    try:
        x64 = np.array([r[start:] for r in rows], dtype=np.float64)
        y64 = np.array([r[1] for r in rows], dtype=np.float64) if has_y else None
    except ValueError as e:
        raise ValueError(f"{path}: non-numeric value ({e})") from None
    x = x64.astype(np.float32)
    # the FATE files have no blank or multi-line records: data row i is line i + 1.  Checked in
    # float32, so a value beyond float32's range (cast to inf) is caught too.
    check_finite(x, columns=header[start:], path=path, lines=range(2, len(rows) + 2))
    if y64 is not None:
        check_finite(y64, columns=[header[1]], path=path, lines=range(2, len(rows) + 2), what="label")
    y = y64.astype(np.int64) if y64 is not None else None
    return header[start:], ids, y, x


def read_table(path: Path, cols: slice = slice(None), keep_y: bool = True) -> PartyTable:
    names, ids, y, x = _read_csv(str(path))
    return PartyTable(ids.copy(), x[:, cols].copy(), list(names[cols]),
                      None if (y is None or not keep_y) else y.copy())


def labels_to_range(y: np.ndarray) -> tuple[np.ndarray, int]:
    classes = np.unique(y)
    if not np.array_equal(classes, np.arange(len(classes))):
        y = np.searchsorted(classes, y)
    return y.astype(np.int64), len(classes)


def split_guest_columns(data: VerticalData, n_guests: int) -> VerticalData:
    """Cut the (single) guest's columns into ``n_guests`` contiguous blocks, one guest each."""
    if n_guests == len(data.guests):
        return data
    if len(data.guests) != 1:
        raise ValueError(f"{data.name}: can only re-split a single guest, have {len(data.guests)}")
    g = data.guests[0]
    d = g.x.shape[1]
    if not 1 <= n_guests <= d:
        raise ValueError(f"{data.name}: n_guests must be in 1..{d} (guest columns), got {n_guests}")
    blocks = np.array_split(np.arange(d), n_guests)
    guests = [PartyTable(g.ids.copy(), g.x[:, b].copy(), [g.columns[i] for i in b]) for b in blocks]
    return replace(data, guests=guests, notes=data.notes + f" Guest columns split into {n_guests} blocks.")


def load(name: str, data_dir=None, n_guests: int = 1, seed: int = 0) -> VerticalData:
    """Load one data set by name (see the module table). ``seed`` only shuffles breast_sk's guest rows."""
    if name == "breast_sk":
        data = load_sklearn_breast(seed=seed)
    elif name in ("cancer", "payment", "vehicle"):
        stem = {"cancer": "breast", "payment": "default_credit", "vehicle": "vehicle_scale"}[name]
        ext = ".csv.gz" if name == "payment" else ".csv"
        host = read_table(dataset_path("fate", f"{stem}_hetero_guest{ext}", data_dir=data_dir))
        guest = read_table(dataset_path("fate", f"{stem}_hetero_host{ext}", data_dir=data_dir))
        if host.y is None:
            raise DatasetNotFound(f"{stem}_hetero_guest has no label column 'y'")
        y, k = labels_to_range(host.labels())
        host.y = y
        data = VerticalData(name, k, host, [guest],
                            notes=f"host = FATE {stem}_hetero_guest (labels), guest = FATE {stem}_hetero_host.")
    elif name == "credit":
        p = dataset_path("fate", "give_credit_homo_test.csv.gz", data_dir=data_dir)
        names, _, _, x = _read_csv(str(p))
        if x.shape[1] != 10:
            raise ValueError(f"{p}: expected 10 feature columns, got {x.shape[1]}")
        host = read_table(p, slice(0, 5))
        guest = read_table(p, slice(5, 10), keep_y=False)
        y, k = labels_to_range(host.labels())
        host.y = y
        data = VerticalData(
            "credit", k, host, [guest],
            notes="give_credit_homo_test (30,000 rows; the 150,000-row FATE files are not stored) "
                  "split 5/5: host x0..x4 + y (FATE's hetero split), guest x5..x9.")
    else:
        raise ValueError(f"unknown data set {name!r}; choose one of {', '.join(DATASETS)}")
    return split_guest_columns(data, n_guests)


def load_sklearn_breast(seed: int = 0) -> VerticalData:
    """scikit-learn's breast cancer table split like FATE's breast (host 10 cols + y, guest 20)."""
    from sklearn.datasets import load_breast_cancer

    b = load_breast_cancer()
    x = b.data.astype(np.float32)
    ids = np.array([f"patient-{i:04d}" for i in range(len(x))])
    names = [str(n) for n in b.feature_names]
    host = PartyTable(ids.copy(), x[:, 20:30].copy(), names[20:30], b.target.astype(np.int64))
    order = stream_rng(seed, Stream.FATE_ORDER).permutation(len(x))
    guest = PartyTable(ids[order], x[order, :20].copy(), names[:20])
    return VerticalData("breast_sk", 2, host, [guest],
                        notes="sklearn load_breast_cancer; host = 'worst' features 20..29 + label, "
                              "guest = features 0..19 (rows shuffled); synthetic IDs.")


# --------------------------------------------------------------------------------------------
# splitting and per-party views


def make_split(data: VerticalData, seed: int, selftaught_frac: float = 0.4,
               test_frac: float = 0.2) -> Split:
    """Random self-taught / train / test ID sets over the IDs all parties share."""
    for nm, f in (("selftaught_frac", selftaught_frac), ("test_frac", test_frac)):
        if not 0.0 <= f < 1.0:
            raise ValueError(f"{nm} must be in [0, 1), got {f}")
    if selftaught_frac + test_frac >= 1.0:
        raise ValueError(f"selftaught_frac + test_frac must be < 1 (got {selftaught_frac + test_frac})")
    ids = data.common_ids
    n = len(ids)
    n_self = int(round(selftaught_frac * n))
    n_test = int(round(test_frac * n))
    if n - n_self - n_test < 2 or n_test < 1:
        raise ValueError(f"{data.name}: {n} shared IDs are too few for this split")
    perm = stream_rng(seed, Stream.FATE_SPLIT).permutation(n)
    return Split(selftaught=ids[perm[:n_self]], test=ids[perm[n_self:n_self + n_test]],
                 train=ids[perm[n_self + n_test:]], seed=seed)


def host_view(data: VerticalData, split: Split, with_selftaught: bool = True) -> HostView:
    """The host's labeled rows; ``with_selftaught=False`` (the federated host) leaves out the
    dropped self-taught rows, which only the "(all data)" baselines read."""
    tr, te = (data.host.rows(s) for s in (split.train, split.test))
    sc = Scaler.fit(tr.x)
    hv = HostView(tr.ids, sc(tr.x), tr.labels(), te.ids, sc(te.x), te.labels(), data.n_classes)
    if with_selftaught:
        st = data.host.rows(split.selftaught)
        hv.ids_selftaught, hv.x_selftaught, hv.y_selftaught = st.ids, sc(st.x), st.y
    return hv


def guest_view(data: VerticalData, split: Split, index: int = 0) -> GuestView:
    if not 0 <= index < len(data.guests):
        raise IndexError(f"{data.name} has {len(data.guests)} guest(s); no guest index {index}")
    g = data.guests[index]
    un, tr, te = (g.rows(s) for s in (split.selftaught, split.train, split.test))
    if len(un.ids) == 0:
        raise ValueError("the guest has no self-taught rows (selftaught_frac = 0); STFL needs some")
    sc = Scaler.fit(un.x)
    return GuestView(un.ids, sc(un.x), tr.ids, sc(tr.x), te.ids, sc(te.x))


@dataclass
class Views:
    """All parties' views for in-process runs (aligned: row i of every array is the same ID)."""

    name: str
    host: HostView
    guests: list[GuestView]
    split: Split

    def sizes(self) -> dict:
        s = self.split.sizes()
        s["host_features"] = int(self.host.x_train.shape[1])
        s["guest_features"] = [int(g.x_train.shape[1]) for g in self.guests]
        return s


def views(data: VerticalData, split: Split) -> Views:
    return Views(data.name, host_view(data, split),
                 [guest_view(data, split, i) for i in range(len(data.guests))], split)


def prepare(name: str, seed: int, data_dir=None, n_guests: int = 1,
            selftaught_frac: float = 0.4, test_frac: float = 0.2) -> Views:
    """Load + split + standardise in one call (the in-process experiments' entry point)."""
    data = load(name, data_dir=data_dir, n_guests=n_guests, seed=seed)
    return views(data, make_split(data, seed, selftaught_frac, test_frac))
