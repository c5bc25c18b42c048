"""The one message of example_sum, with its schema (checked on receipt and by the audit)."""
from __future__ import annotations

from fedhet.parties import schema as sch
from fedhet.parties.declare import MessageDecl, declare

from .settings import Settings


class Kind:
    NUMBER = "example_sum/number"


def declarations(s: Settings) -> list[MessageDecl]:
    return [declare(Kind.NUMBER, "adder", "summer", "an adder's number",
                    payload=sch.Fields({"value": sch.Float()}), protects="clear")]
