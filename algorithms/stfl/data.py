"""STFL's data: each party loads only its own part.

The host: its labelled train/test rows (the self-taught rows dropped), standardised on its train
rows.  A guest: ALL its rows (IDs + raw columns of its block), unmarked; it finds its self-taught
rows through PSI.  Built-in sets (``data_fate``) or, with ``dataset = "files"``, the party's own
table (``[[party]] data = {...}``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.algorithms import data_fate
from fedhet.algorithms.datapath import dataset_path
from fedhet.algorithms.party_table import DataSpecError, TableSpec, check_features, load_party_table
from fedhet.algorithms.stfl.settings import FILES, GUEST, HOST, SHAPES, Settings
from fedhet.algorithms.toolkit import Scaler
from fedhet.parties.contract import PartyContext

_FATE_FILES = {"cancer": ("breast", ".csv"), "payment": ("default_credit", ".csv.gz"),
               "vehicle": ("vehicle_scale", ".csv")}


@dataclass
class GuestData:
    """A guest's own rows: IDs, raw columns (its block), column names and its index among guests."""

    ids: np.ndarray
    x: np.ndarray
    columns: list[str]
    index: int


@dataclass
class HostData(data_fate.HostView):
    """The host's view (``data_fate.host_view``) with what its exported part needs: the
    standardisation of its training rows (the one the view applied), its raw test rows and its
    column names."""

    scaler: Scaler | None = None
    x_test_raw: np.ndarray | None = None
    columns: list[str] | None = None


def host_data(own: data_fate.VerticalData, split: data_fate.Split) -> HostData:
    """``data_fate.host_view`` of the host's own table, without its self-taught rows, kept with its
    scaler and raw test rows (the scaler is refitted on the same rows: the same statistics)."""
    hv = data_fate.host_view(own, split, with_selftaught=False)
    return HostData(**vars(hv), scaler=Scaler.fit(own.host.rows(split.train).x),
                    x_test_raw=own.host.rows(split.test).x, columns=list(own.host.columns))


def _own_table(s: Settings, role: str, index: int, data_dir=None) -> tuple[data_fate.PartyTable, int]:
    """This party's own table (its columns; the host's with labels) and the class count (host)."""
    ds = s.dataset
    n_classes = 0
    if ds == "breast_sk":
        # scikit-learn's one bundled table: the loader keeps only this party's part of it.
        full = data_fate.load_sklearn_breast(seed=s.seed)
        table = full.host if role == HOST else full.guests[0]
        n_classes = full.n_classes
    elif ds == "credit":
        # give_credit_homo_test holds both parties' columns in one file (data_fate's docstring).
        p = dataset_path("fate", "give_credit_homo_test.csv.gz", data_dir=data_dir)
        table = data_fate.read_table(p, slice(0, 5) if role == HOST else slice(5, 10), keep_y=role == HOST)
    else:
        stem, ext = _FATE_FILES[ds]
        # FATE calls the label owner "guest": its *_hetero_guest file is the STFL host's.
        fname = f"{stem}_hetero_{'guest' if role == HOST else 'host'}{ext}"
        table = data_fate.read_table(dataset_path("fate", fname, data_dir=data_dir), keep_y=role == HOST)
    if role == HOST:
        if table.y is None:
            raise ValueError(f"stfl: {ds}: the host's table has no label column")
        if ds != "breast_sk":
            table.y, n_classes = data_fate.labels_to_range(table.labels())
        table.y = table.y.copy()
    rows, dh, dg = SHAPES[ds]
    want = dh if role == HOST else dg
    if table.x.shape != (rows, want):
        raise ValueError(f"stfl: {ds}: the {role}'s table is {table.x.shape}, expected ({rows}, {want}) "
                         "(the audit's declared widths assume it)")
    if role == GUEST:
        block = np.array_split(np.arange(dg), s.n_guests)[index]
        table = data_fate.PartyTable(table.ids.copy(), table.x[:, block].copy(), [table.columns[i] for i in block])
    return table, n_classes


def builtin_data(s: Settings, ctx: PartyContext) -> HostData | GuestData:
    """A party's part of a built-in data set."""
    if ctx.role == HOST:
        if ctx.n_of_role != 1:
            raise ValueError(f"stfl: exactly one host (label owner) is supported, the federation has {ctx.n_of_role}")
        table, k = _own_table(s, HOST, 0, ctx.data_dir)
        # The experiment drops a seeded random part of the host's rows (they become the guests'
        # self-taught rows).  Every guest holds every ID of these data sets, so the split of the
        # host's IDs alone is data_fate.make_split's split (tested).
        own = data_fate.VerticalData(s.dataset, k, table, [])
        return host_data(own, data_fate.make_split(own, s.seed, s.selftaught_frac, s.test_frac))
    if ctx.role == GUEST:
        table, _ = _own_table(s, GUEST, ctx.index, ctx.data_dir)
        return GuestData(table.ids, table.x, table.columns, ctx.index)
    raise ValueError(f"stfl: unknown role {ctx.role!r} (roles: {HOST}, {GUEST})")


def file_data(s: Settings, ctx: PartyContext) -> HostData | GuestData:
    """A party's own file (dataset "files").  The host: ``id``, ``label`` (with ``classes``) and
    features; its rows are split into train | test (``test_frac``, seeded); it keeps no
    self-taught rows of its own.  A guest: ``id`` and exactly ``guest_features[i]`` feature
    columns; its rows whose IDs the PSI does not match are its unlabelled (self-taught) rows."""
    if not ctx.data:
        raise ValueError(f"stfl: dataset 'files' but party {ctx.name!r} names no data file "
                         "(give its [[party]] a data = { path = ..., id = ... })")
    if ctx.role == HOST:
        t = load_party_table(TableSpec.from_dict(dict(ctx.data or {}), party=ctx.name, base_dir=ctx.base_dir,
                                                 require=("id", "label", "classes")))
        assert t.classes is not None  # required above
        if len(t.classes) != s.n_classes:
            raise DataSpecError(f"party {ctx.name!r}, file '{t.path}': {len(t.classes)} classes declared "
                                f"({list(t.classes)}) but n_classes = {s.n_classes} in [algorithm]",
                                party=ctx.name, path=str(t.path), key="classes")
        table = data_fate.PartyTable(np.asarray(t.ids).astype(str), t.X, list(t.feature_names), t.y)
        own = data_fate.VerticalData(FILES, s.n_classes, table, [])
        return host_data(own, data_fate.make_split(own, s.seed, 0.0, s.test_frac))
    if ctx.role == GUEST:
        t = load_party_table(TableSpec.from_dict(dict(ctx.data or {}), party=ctx.name, base_dir=ctx.base_dir,
                                                 require=("id",)))
        check_features(t, s.guest_widths()[ctx.index], "guest_features in [algorithm]")
        return GuestData(np.asarray(t.ids).astype(str), t.X, list(t.feature_names), ctx.index)
    raise ValueError(f"stfl: unknown role {ctx.role!r} (roles: {HOST}, {GUEST})")


def load_data(s: Settings, ctx: PartyContext) -> HostData | GuestData:
    """The contract's ``load_data``: the party's own file with dataset "files", else its part of a
    built-in data set."""
    if ctx.role == GUEST and ctx.n_of_role != s.n_guests:
        raise ValueError(f"stfl: the federation has {ctx.n_of_role} guest(s) but n_guests = {s.n_guests}; "
                         f"set n_guests = {ctx.n_of_role} in [algorithm]")
    if s.dataset == FILES:
        return file_data(s, ctx)
    if ctx.data:
        raise ValueError(f"stfl: party {ctx.name!r} names a data file: set dataset = \"files\" (and "
                         "guest_features, n_classes) in [algorithm]")
    return builtin_data(s, ctx)
