"""The Shamir job's roles: owners share X_i, holders compute Σ_i X_i P_i on their shares, the coordinator
reconstructs it from any t holders and checks it against the plain computation.

Checkpoint step 1: the shares delivered (an owner keeps its report; a holder keeps its shares, secret, in its
private checkpoint; the coordinator keeps nothing and writes it once it has reconstructed).  After a resume
from it the holders compute and send their result shares again from the same shares, and the coordinator
reconstructs again."""
from __future__ import annotations

import numpy as np

from fedhet.algorithms.shamir_job.data import plain_result, public_matrix
from fedhet.algorithms.shamir_job.messages import COORDINATOR, HOLDER, OWNER, Kind
from fedhet.algorithms.shamir_job.settings import Settings
from fedhet.parties.contract import PartyLike
from fedhet.protocols import shamir_share as ss


def _holders(party: PartyLike) -> list[str]:
    hs = sorted(n for n, r in party.roles.items() if r == HOLDER)
    if not hs:
        raise ValueError("shamir: the federation has no holder")
    return hs


def _owners(party: PartyLike) -> list[str]:
    # owner i is the i-th owner in federation order, as load_data numbers them
    return [n for n, r in party.roles.items() if r == OWNER]


def owner(party: PartyLike, s: Settings, data: dict) -> dict:
    start, saved = party.restore()
    if start >= 1:
        return saved["report"]
    info = ss.share_to_holders(party, data["X"], _holders(party), s.t, Kind.PREFIX, frac_bits=s.frac_bits,
                               max_abs=s.max_abs)
    party.metric(shared_elements=int(data["X"].size))
    out = {"shape": list(info.shape), "points": info.points, "bound": info.bound}
    party.checkpoint(1, {"report": out})
    return out


def holder(party: PartyLike, s: Settings, data: dict) -> dict:
    owners = _owners(party)
    start, saved = party.restore()
    if start >= 1:
        shares = {o: ss.share_from_state(saved["shares"][o]) for o in owners}
    else:
        shares = ss.receive_shares(party, owners, Kind.PREFIX, t=s.t)
        party.checkpoint(1, {"shares": {o: ss.share_state(a) for o, a in shares.items()}})
    y = ss.sum_shares([ss.matmul(shares[o], public_matrix(s, i), frac_bits=s.public_frac_bits)
                       for i, o in enumerate(owners)])
    coordinator = party.peer_with_role(COORDINATOR)
    sent = party.name not in s.drop
    if sent:
        ss.send_to_coordinator(party, coordinator, y, Kind.PREFIX)
    return {"x": y.x, "sent": sent, "frac_bits": y.frac_bits, "shape": list(y.shape)}


def coordinator(party: PartyLike, s: Settings, data: dict) -> dict:
    holders = _holders(party)
    party.restore()   # step 1 holds nothing of its own: it reconstructs from the holders' result shares either way
    rec = ss.reconstruct_at_coordinator(party, holders, s.t, Kind.PREFIX, timeout=s.wait)
    party.checkpoint(1, {})
    plain = plain_result(s, len(_owners(party)))
    max_err = float(np.max(np.abs(rec.value - plain))) if plain.size else 0.0
    # the bound is on exact arithmetic; allow float64 rounding of the plain computation
    slack = 1e-12 * (1.0 + float(np.max(np.abs(plain))) if plain.size else 1.0)
    out = {"correct": max_err <= rec.err + slack, "max_err": max_err, "err_bound": rec.err,
           "frac_bits": rec.frac_bits, "max_abs_bound": rec.max_abs, "used": rec.used, "missing": rec.missing,
           "shape": list(rec.value.shape)}
    party.metric(max_err=max_err, err_bound=rec.err, holders_used=len(rec.used))
    party.log.info("reconstructed %s from %s: max error %.3g (bound %.3g)", rec.value.shape, rec.used, max_err,
                   rec.err)
    return out


ROLES = {OWNER: owner, HOLDER: holder, COORDINATOR: coordinator}
