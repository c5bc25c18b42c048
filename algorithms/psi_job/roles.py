"""The PSI job's roles: the label owner and the feature parties run the chosen PSI protocol and check the
common list they end with against the one the settings imply.

Checkpoint step 1: the PSI run (each role keeps what it ended with: the common IDs and their rows where
revealed to it, and the run's statistics).  A PSI cut by a kill is run again after the resume with fresh
secret exponents (drawn from the OS for every run; none is checkpointed)."""
from __future__ import annotations

from typing import Callable

from fedhet.algorithms.psi_job.data import expected_common, ids_digest
from fedhet.algorithms.psi_job.messages import FEATURE, LABEL_OWNER
from fedhet.algorithms.psi_job.settings import Settings
from fedhet.parties.contract import PartyLike
from fedhet.protocols import psi


def _once(party: PartyLike, backend: str, run: Callable[[], psi.PSIResult]) -> psi.PSIResult:
    """The PSI's result: run now, or, on a run resumed after it, the one checkpointed then (step 1).

    The backend's one-time start (:func:`psi.prepare`) comes first and is reported apart
    (``prepare_s``), like the process's own start-up: the PSI's clock is the protocol's.
    """
    start, saved = party.restore()
    if start >= 1:
        return psi.PSIResult(**saved["psi"])
    warm = psi.prepare(backend)
    res = run()
    res.stats["prepare_s"] = warm
    party.checkpoint(1, {"psi": {"role": res.role, "ids": res.ids, "rows": res.rows, "revealed": res.revealed,
                                 "stats": res.stats}})
    return res


def _report(party: PartyLike, s: Settings, res: psi.PSIResult, data: dict, n_features: int) -> dict:
    out = {"revealed": res.revealed, "psi_backend": res.stats["backend"], "stats": res.stats}
    if res.ids is not None:
        assert res.rows is not None   # the rows of the common IDs come with them
        exp = expected_common(s, n_features)
        aligned = all(data["ids"][r] == i for r, i in zip(res.rows.tolist(), res.ids))
        first = all(data["ids"].index(i) == r for r, i in zip(res.rows.tolist()[:50], res.ids[:50]))
        out.update({"size": len(res.ids), "expected_size": len(exp), "correct": set(res.ids) == exp,
                    "rows_aligned": aligned and first, "ids_sha256": ids_digest(res.ids),
                    "first_ids": res.ids[:5]})
        party.metric(psi_size=len(res.ids), psi_s=res.stats["total_s"], correct=out["correct"])
    else:
        party.metric(psi_s=res.stats["total_s"])
    party.log.info("PSI done: %s", {k: v for k, v in out.items() if k != "first_ids"})
    return out


def label_owner(party: PartyLike, s: Settings, data: dict) -> dict:
    peers = party.peers_with_role(FEATURE)
    res = _once(party, s.psi_backend, lambda: psi.psi_label_owner(party, data["ids"], peers, reveal_to_all=s.reveal, order=s.order,
                                                   chunk=s.chunk, workers=s.workers, timeout=s.psi_timeout,
                                                   backend=s.psi_backend))
    return _report(party, s, res, data, len(peers))


def feature(party: PartyLike, s: Settings, data: dict) -> dict:
    owners = party.peers_with_role(LABEL_OWNER)
    if len(owners) != 1:
        raise ValueError(f"psi: needs exactly one label_owner party, found {owners}")
    res = _once(party, s.psi_backend, lambda: psi.psi_feature_party(party, data["ids"], owners[0], chunk=s.chunk,
                                                     workers=s.workers, timeout=s.psi_timeout,
                                                     backend=s.psi_backend))
    n_features = sum(1 for r in party.roles.values() if r == FEATURE)
    return _report(party, s, res, data, n_features)


ROLES = {LABEL_OWNER: label_owner, FEATURE: feature}
