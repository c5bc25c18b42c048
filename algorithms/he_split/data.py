"""The HE split network's data: the host's labelled train/test rows, a guest's own columns.

The simulated split is computed by each party from the whole data set (``data_fate``), but a party
keeps only its own columns (and the host its labels); the host's self-taught rows are dropped, so the
common rows are its train and test rows.
"""
from __future__ import annotations

from fedhet.algorithms import data_fate
from fedhet.algorithms.data_fate import HostView, PartyTable
from fedhet.parties.contract import PartyContext

from .settings import Settings

HOST, GUEST = "host", "guest"


def host_data(s: Settings, data_dir: str | None = None) -> HostView:
    """The host's labelled train/test rows (self-taught rows dropped)."""
    data = data_fate.load(s.dataset, data_dir=data_dir, n_guests=1, seed=s.seed)
    split = data_fate.make_split(data, s.seed, s.selftaught_frac, s.test_frac)
    return data_fate.host_view(data, split, with_selftaught=False)


def guest_data(s: Settings, index: int, n_guests: int, data_dir: str | None = None) -> PartyTable:
    """Guest ``index``'s own columns of the data set split among ``n_guests`` guests (IDs, x, columns)."""
    return data_fate.load(s.dataset, data_dir=data_dir, n_guests=max(1, n_guests), seed=s.seed).guests[index]


def load_data(s: Settings, ctx: PartyContext) -> HostView | PartyTable:
    """A party's own data (the contract's ``load_data``)."""
    if ctx.role == HOST:
        return host_data(s, ctx.data_dir)
    if ctx.role == GUEST:
        return guest_data(s, ctx.index, ctx.n_of_role, ctx.data_dir)
    raise ValueError(f"he_split has roles {HOST}, {GUEST}, not {ctx.role!r}")
