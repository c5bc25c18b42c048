"""CHFL's data: each client's own rows and columns, as the seeded partition cuts them.

Every party computes the same partition of the public row and feature index from the seeds
(:func:`fedhet.algorithms.partition.chfl_partition`), so nothing about the data is exchanged to
set it up.  :func:`load_data` (the contract's) keeps only the client's own rows (train, val,
test) and columns of a built-in table, or reads the client's own file; the server loads nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhet.algorithms.chfl.core import ClientData
from fedhet.algorithms.chfl.settings import FILES, Settings
from fedhet.algorithms.partition import HorizontalSplit, chfl_partition
from fedhet.algorithms.party_table import DataFileError, DataSpecError, TableSpec, check_finite, load_party_table
from fedhet.algorithms.toolkit import Scaler, Stream, stream_rng
from fedhet.parties.contract import PartyContext

SKLEARN_SETS = ("digits", "wine")
PARTS = ("train", "val", "test")


def load_table(name: str, data_dir: str | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """``(X float32, y int64 0..C-1, name)``: scikit-learn's digits/wine, else ``data_tabular``."""
    key = name.strip().lower()
    if key in SKLEARN_SETS:
        from sklearn import datasets
        X, y = getattr(datasets, f"load_{key}")(return_X_y=True)
        _, codes = np.unique(y, return_inverse=True)
        return (np.ascontiguousarray(X, dtype=np.float32), codes.astype(np.int64).reshape(-1), key)
    from fedhet.algorithms.data_tabular import load_tabular
    t = load_tabular(key, data_dir)
    return t.X, t.y, t.name


@dataclass
class ClientRows:
    """One client's own rows, columns common-first then unique, ordered train | val | test."""

    x: np.ndarray          # float32 (n_train + n_val + n_test, n_common + n_unique), raw values
    y: np.ndarray          # int64
    n_parts: tuple[int, int, int]
    n_common: int
    n_classes: int
    index: int
    n_clients: int
    feature_names: tuple[str, ...] = ()   # x's columns in order (what a trained part scores)
    classes: tuple = ()                   # label values, code c is classes[c] (empty: the codes)


def column_names(dataset: str, n_features: int) -> list[str]:
    """The names of a built-in table's columns: scikit-learn's feature names for its sets, else
    ``f0 .. f<n_features - 1>`` (the other tables are loaded without names)."""
    key = dataset.strip().lower()
    if key in SKLEARN_SETS:
        from sklearn import datasets
        return [str(n) for n in getattr(datasets, f"load_{key}")().feature_names]
    return [f"f{c}" for c in range(int(n_features))]


def largest_label(y: np.ndarray) -> int:
    """The largest finite label (-1 for none): NaN / inf labels are reported by client_rows."""
    y = np.asarray(y)
    finite = y[np.isfinite(y)] if y.dtype.kind in "fc" else y
    return int(finite.max()) if finite.size else -1


def client_rows(s: Settings, X: np.ndarray, y: np.ndarray, index: int, n_clients: int,
                party: str | None = None, names: list[str] | None = None) -> ClientRows:
    """Client ``index``'s part of the whole table under the seeded CHFL partition.

    ``X`` and ``y`` come from the caller (a built-in table, or arrays handed to ``run_table``):
    the client's rows of them are checked like a party's file, and a NaN or infinite value is an
    error naming the party (``party``, default ``client<index + 1>``), the argument, the row and
    the column of the caller's arrays.  ``names``: the names of X's columns (default ``f0, f1, ...``);
    the client keeps those of its own columns."""
    who = party or f"client{index + 1}"
    X, y = np.asarray(X), np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or len(y) != len(X):
        raise ValueError(f"chfl: party {who!r}: X must be 2-D and y 1-D with one label per row of X, "
                         f"got X {X.shape} and y {y.shape}")
    top = largest_label(y)  # a NaN label is reported below, with its party
    if tuple(X.shape) != tuple(s.shape[:2]) or top + 1 != s.class_count:
        raise ValueError(f"chfl: the {s.dataset} table is {X.shape[0]} x {X.shape[1]} with "
                         f"{top + 1} classes, the configuration says "
                         f"{s.shape[0]} x {s.shape[1]} with {s.class_count} (set n_samples, "
                         "n_features, n_classes to your copy's shape)")
    split = chfl_partition(X.shape[0], X.shape[1], n_clients, s.common_ratio, s.seed,
                           s.feature_seed)
    if len(split.common) != s.n_common:  # the audit's P_c assumes the rule in Settings.n_common
        raise AssertionError(f"partition has {len(split.common)} common features, expected {s.n_common}")
    rows = [split.rows(index, p) for p in PARTS]
    cols = split.features(index)
    r = np.concatenate(rows)
    order = np.argsort(r, kind="stable")  # report the first bad cell in the caller's row order
    check_finite(y[r][order], party=who, argument="y", rows=r[order] + 1, what="label")
    check_finite(X[r][:, cols][order], party=who, argument="X", rows=r[order] + 1,
                 columns=[int(c) + 1 for c in cols])
    n_tr, n_va, n_te = (len(a) for a in rows)
    return ClientRows(np.ascontiguousarray(X[r][:, cols], dtype=np.float32), np.asarray(y[r], np.int64),
                      (n_tr, n_va, n_te), len(split.common), s.class_count, index, n_clients,
                      tuple(str(names[int(c)]) if names is not None else f"f{int(c)}" for c in cols))


def file_rows(s: Settings, ctx: PartyContext) -> ClientRows:
    """A client's own rows from its own file: the common columns by name (the same at every
    client), every other feature column unique to it; train | val | test = 60 | 20 | 20 % of its
    rows in a seeded order.  Errors name the party, file and column before training starts."""
    t = load_party_table(TableSpec.from_dict(dict(ctx.data or {}), party=ctx.name, base_dir=ctx.base_dir,
                                             require=("label", "classes")))
    assert t.classes is not None and t.y is not None  # required above
    if len(t.classes) != s.class_count:
        raise DataSpecError(f"party {ctx.name!r}, file '{t.path}': {len(t.classes)} classes declared "
                            f"({list(t.classes)}) but the federation's n_classes is {s.class_count}",
                            party=ctx.name, path=str(t.path), key="classes")
    named = s.common_features or ()
    missing = [f for f in named if f not in t.feature_names]
    if missing:
        raise DataFileError(f"party {ctx.name!r}, file '{t.path}': common feature column(s) {missing} "
                            f"missing (its feature columns: {list(t.feature_names)})",
                            party=ctx.name, path=str(t.path), column=missing[0])
    common = [t.feature_names.index(f) for f in named]
    unique = [i for i, f in enumerate(t.feature_names) if f not in named]
    if not unique:
        raise DataFileError(f"party {ctx.name!r}, file '{t.path}': no feature column besides the common "
                            f"ones {list(named)}: CHFL needs a client's own features",
                            party=ctx.name, path=str(t.path))
    n = t.n_rows
    if n < 5:
        raise DataFileError(f"party {ctx.name!r}, file '{t.path}': {n} rows; at least 5 are needed for "
                            "train/validation/test", party=ctx.name, path=str(t.path))
    order = stream_rng(s.seed, ctx.index, Stream.CHFL_ROW_ORDER).permutation(n)
    n_tr, n_va = int(round(0.6 * n)), int(round(0.2 * n))
    cols = common + unique
    x = np.ascontiguousarray(t.X[order][:, cols], dtype=np.float32)
    return ClientRows(x, np.asarray(t.y[order], np.int64), (n_tr, n_va, n - n_tr - n_va), len(common),
                      s.class_count, ctx.index, ctx.n_of_role, tuple(str(t.feature_names[c]) for c in cols),
                      tuple(t.classes))


def load_data(s: Settings, ctx: PartyContext) -> ClientRows | None:
    """The contract's ``load_data``: nothing for the server; for a client its own file when its
    section names one, else its part of a built-in table (the rest of the table is dropped here)."""
    if ctx.role == "server":
        return None
    if ctx.role != "client":
        raise ValueError(f"chfl: unknown role {ctx.role!r}")
    if s.n_clients is not None and s.n_clients != ctx.n_of_role:
        raise ValueError(f"chfl: n_clients = {s.n_clients} but the federation has {ctx.n_of_role} clients")
    if ctx.data:
        if s.dataset != FILES:
            raise ValueError(f"chfl: party {ctx.name!r} names a data file, so set dataset = \"files\" and "
                             "common_features in [algorithm]")
        return file_rows(s, ctx)
    if s.dataset == FILES:
        raise ValueError(f"chfl: dataset 'files' but party {ctx.name!r} has no data file in the federation "
                         "(give its [[party]] a data = { path = ..., label = ..., classes = [...] })")
    X, y, _ = load_table(s.dataset, ctx.data_dir)
    return client_rows(s, X, y, ctx.index, ctx.n_of_role, party=ctx.name, names=column_names(s.dataset, X.shape[1]))


def client_data(X: np.ndarray, y: np.ndarray, split: HorizontalSplit, k: int,
                n_classes: int | None = None, standardize: bool = True,
                device: str | torch.device = "cpu") -> ClientData:
    """Client k's view of (X, y) under ``split``, scaled with its own
    training statistics."""
    if not 0 <= k < split.n_clients:
        raise ValueError(f"client index {k} out of range for {split.n_clients} clients")
    if X.shape[0] != split.n_samples or X.shape[1] != split.n_features:
        raise ValueError(f"X is {X.shape}, the split is for "
                         f"({split.n_samples}, {split.n_features})")
    cols = split.features(k)
    r = np.sort(np.concatenate([split.rows(k, p) for p in ("train", "val", "test")]))
    who = f"client{k + 1}"
    check_finite(np.asarray(y)[r], party=who, argument="y", rows=r + 1, what="label")
    check_finite(np.asarray(X)[r][:, cols], party=who, argument="X", rows=r + 1, columns=[int(c) + 1 for c in cols])
    dc = len(split.common)
    parts = {p: np.asarray(X[split.rows(k, p)][:, cols], dtype=np.float32)
             for p in ("train", "val", "test")}
    scale = None
    if standardize:  # a column constant on this client's rows (std <= 1e-6) is centred only
        scale = Scaler.fit(parts["train"], min_std=1e-6)
        parts = {p: scale(v) for p, v in parts.items()}
    dev = torch.device(device)
    t = {p: torch.from_numpy(np.ascontiguousarray(v)).to(dev) for p, v in parts.items()}
    return ClientData(
        xc={p: v[:, :dc].contiguous() for p, v in t.items()},
        xu={p: v[:, dc:].contiguous() for p, v in t.items()},
        y={p: torch.from_numpy(np.asarray(y[split.rows(k, p)], dtype=np.int64)).to(dev)
           for p in ("train", "val", "test")},
        n_classes=int(n_classes if n_classes is not None else int(y.max()) + 1),
        scaler=scale,
    )




def own_client_data(rows: ClientRows, s: Settings, device: str | torch.device) -> ClientData:
    """:class:`~fedhet.algorithms.chfl.core.ClientData` from the client's own rows: ``client_data``
    on a one-client split of them (the same values and scaling as on the whole table)."""
    ntr, nva, nte = rows.n_parts
    d = rows.x.shape[1]
    own = HorizontalSplit(common=np.arange(rows.n_common), unique=[np.arange(rows.n_common, d)],
                          train=[np.arange(ntr)], val=[np.arange(ntr, ntr + nva)],
                          test=[np.arange(ntr + nva, ntr + nva + nte)], n_features=d,
                          n_samples=len(rows.y))
    return client_data(rows.x, rows.y, own, 0, rows.n_classes, s.standardize, device)
