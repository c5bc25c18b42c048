"""The HE split network's data: the host's labelled train/test rows, a guest's own columns.

The simulated split is computed by each party from the whole data set (``data_fate``), but a party
keeps only its own columns (and the host its labels); the host's self-taught rows are dropped, so the
common rows are its train and test rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from fedhet.algorithms import data_fate
from fedhet.algorithms.data_fate import HostView, PartyTable
from fedhet.algorithms.toolkit import Scaler
from fedhet.parties.contract import PartyContext

from .settings import Settings

HOST, GUEST = "host", "guest"


@dataclass
class HostData(HostView):
    """The host's view and what its exported part needs besides: its column names, its scaler (the
    statistics ``host_view`` standardised with: its training rows') and its raw train/test rows."""

    columns: list[str] = field(default_factory=list)
    scaler: Scaler | None = None
    x_train_raw: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))
    x_test_raw: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))


def host_data(s: Settings, data_dir: str | None = None) -> HostData:
    """The host's labelled train/test rows (self-taught rows dropped), with its columns, scaler and raw rows."""
    data = data_fate.load(s.dataset, data_dir=data_dir, n_guests=1, seed=s.seed)
    split = data_fate.make_split(data, s.seed, s.selftaught_frac, s.test_frac)
    view = data_fate.host_view(data, split, with_selftaught=False)
    train, test = data.host.rows(split.train), data.host.rows(split.test)
    return HostData(**{f.name: getattr(view, f.name) for f in fields(HostView)}, columns=list(data.host.columns),
                    scaler=Scaler.fit(train.x), x_train_raw=train.x, x_test_raw=test.x)


def guest_data(s: Settings, index: int, n_guests: int, data_dir: str | None = None) -> PartyTable:
    """Guest ``index``'s own columns of the data set split among ``n_guests`` guests (IDs, x, columns)."""
    return data_fate.load(s.dataset, data_dir=data_dir, n_guests=max(1, n_guests), seed=s.seed).guests[index]


def load_data(s: Settings, ctx: PartyContext) -> HostData | PartyTable:
    """A party's own data (the contract's ``load_data``)."""
    if ctx.role == HOST:
        return host_data(s, ctx.data_dir)
    if ctx.role == GUEST:
        return guest_data(s, ctx.index, ctx.n_of_role, ctx.data_dir)
    raise ValueError(f"he_split has roles {HOST}, {GUEST}, not {ctx.role!r}")
