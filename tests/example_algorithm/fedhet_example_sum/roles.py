"""The two roles of example_sum."""
from __future__ import annotations

from fedhet.parties.contract import PartyLike

from .messages import Kind
from .settings import Settings


def adder(party: PartyLike, s: Settings, data: float) -> dict:
    summer = party.peers_with_role("summer")[0]
    party.send(summer, Kind.NUMBER, {"value": data})
    return {"sent": data}


def summer(party: PartyLike, s: Settings, data: None) -> dict:
    got = party.gather(Kind.NUMBER, frm=party.peers_with_role("adder"))
    total = sum(m["value"] for m in got.values())
    party.metric(total=total)
    return {"total": total, "adders": len(got)}
