"""The Shamir job's message kinds: the Shamir protocol's two, under the job's prefix."""
from __future__ import annotations

from fedhet.algorithms.shamir_job.settings import Settings
from fedhet.parties.declare import MessageDecl
from fedhet.protocols import shamir_share as ss

OWNER, HOLDER, COORDINATOR = "owner", "holder", "coordinator"


class Kind:
    """The job's kinds (:func:`fedhet.protocols.shamir_share.declarations` extends the prefix)."""

    PREFIX = "shamir"
    SHARE = "shamir/share"      # owner -> holder: one holder's share of X_i
    RESULT = "shamir/result"    # holder -> coordinator: its share of Σ_i X_i P_i


def declarations(s: Settings) -> list[MessageDecl]:
    """Owner i's shares are (rows, d_in + i) (any width here), the result shares (rows, d_out)."""
    return ss.declarations(Kind.PREFIX, OWNER, HOLDER, COORDINATOR, share_shape=(s.rows, None),
                           result_shape=(s.rows, s.d_out))
