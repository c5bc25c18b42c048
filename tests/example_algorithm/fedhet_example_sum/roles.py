"""The two roles of example_sum.  One step: checkpoint 1 is "the numbers were summed" (the summer
keeps the total, an adder nothing), so a run killed after it resumes without sending again."""
from __future__ import annotations

from fedhet.parties.contract import PartyLike

from .messages import Kind
from .settings import Settings


def adder(party: PartyLike, s: Settings, data: float) -> dict:
    start, _ = party.restore()
    if start < 1:
        party.send(party.peer_with_role("summer"), Kind.NUMBER, {"value": data})
        party.checkpoint(1, {})
    return {"sent": data}


def summer(party: PartyLike, s: Settings, data: None) -> dict:
    start, saved = party.restore()
    if start < 1:
        got = party.gather(Kind.NUMBER, frm=party.peers_with_role("adder"))
        saved = {"total": sum(m["value"] for m in got.values()), "adders": len(got)}
        party.checkpoint(1, saved)
    party.metric(total=saved["total"])
    return dict(saved)
