"""The Shamir job's synthetic matrices: owner i's private X_i and the public P_i, from the seed alone."""
from __future__ import annotations

import numpy as np

from fedhet.algorithms.streams import Stream, stream_rng
from fedhet.algorithms.shamir_job.messages import COORDINATOR, HOLDER, OWNER
from fedhet.algorithms.shamir_job.settings import Settings
from fedhet.parties.contract import PartyContext


def public_matrix(s: Settings, i: int) -> np.ndarray:
    """Owner i's public alignment matrix P_i, (d_in + i) x d_out, from the run seed."""
    rng = stream_rng(s.seed, Stream.SHAMIR_PUBLIC_MATRIX, i)
    return rng.normal(size=(s.d_in + i, s.d_out)) / np.sqrt(s.d_in + i)


def owner_matrix(s: Settings, i: int) -> np.ndarray:
    """Owner i's private matrix X_i (synthetic, deterministic from the seed)."""
    rng = stream_rng(s.seed, Stream.SHAMIR_OWNER_MATRIX, i)
    return rng.uniform(-s.max_abs, s.max_abs, size=(s.rows, s.d_in + i))


def plain_result(s: Settings, n_owners: int) -> np.ndarray:
    """Σ_i X_i P_i in plain float64: the coordinator's test oracle, not part of the protocol."""
    return sum(owner_matrix(s, i) @ public_matrix(s, i) for i in range(n_owners))


def load_data(s: Settings, ctx: PartyContext) -> dict:
    if ctx.role not in (OWNER, HOLDER, COORDINATOR):
        raise ValueError(f"shamir: unknown role {ctx.role!r} (roles: {OWNER}, {HOLDER}, {COORDINATOR})")
    if ctx.role == OWNER:
        return {"index": ctx.index, "X": owner_matrix(s, ctx.index)}
    return {"index": ctx.index}
