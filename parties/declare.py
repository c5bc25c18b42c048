"""Declared message kinds: what may cross which party boundary, in what shape.

Every protocol and algorithm lists the kinds it sends as ``MessageDecl``s.
``fedhet audit`` checks each transcript record against them: the kind must be
declared, the sender's and receiver's roles must be the declared ones, and the
record's array dtypes and shapes must match the declaration's payload schema
(built from the run's settings).  The check sees only what the transcript holds
(dtypes and shapes, never values), so it is exactly what an auditor can verify.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from . import schema as sch

# What protects a message's values on the wire beyond CURVE (which every message has), in the
# order of the report's legend.  ``fedhet report`` colours the message map by it; a kind whose
# declaration does not say is shown as "not stated".
PROTECTIONS = {
    "shares": "secret shares (Shamir or replicated): one share alone reveals nothing",
    "paillier": "Paillier ciphertexts: only the key holder can read them",
    "ckks": "CKKS ciphertexts: only the key holder can read them",
    "masked": "masked for secure aggregation: only the sum over the parties is revealed",
    "blinded": "blinded or keyed identifiers (PSI): only the intersection is revealed",
    "derived": "declared latent or derived values (not raw rows; what they reveal is declared)",
    "clear": "values in the clear (beyond the transport's encryption)",
    "control": "control data: no training data or model values",
}
NOT_STATED = "not stated"


@dataclass(frozen=True)
class MessageDecl:
    kind: str
    sender: tuple[str, ...]          # roles allowed to send it
    receiver: tuple[str, ...]        # roles allowed to receive it
    what: str                        # plain words: what the payload is
    payload: sch.Spec | None = field(default=None, compare=False)   # the payload's schema (checked on receipt)
    protects: str | None = None      # a key of PROTECTIONS: what protects the values (None: not stated)
    # The protocol's order: a party sends this kind in a round only after it received one of these
    # kinds in that round (the audit checks every transcript; a message deleted from two
    # transcripts and the rest renumbered still leaves its answer without its cause).
    after: tuple[str, ...] = ()

    def __post_init__(self):
        for attr in ("sender", "receiver", "after"):
            v = getattr(self, attr)
            if isinstance(v, str):
                object.__setattr__(self, attr, (v,))
        if self.protects is not None and self.protects not in PROTECTIONS:
            raise ValueError(f"message kind {self.kind!r}: protects={self.protects!r}, expected one of "
                             f"{', '.join(PROTECTIONS)}")


def declare(kind: str, sender, receiver, what: str, payload: sch.Spec | None = None,
            protects: str | None = None, after: str | tuple[str, ...] = ()) -> MessageDecl:
    """One message kind.  ``payload`` is its schema (:mod:`fedhet.parties.schema`): the
    receiver validates every message against it and the audit checks every record.
    ``protects``: what protects its values (a key of :data:`PROTECTIONS`).  ``after``: the kinds
    one of which the sender must have received in the same round before it sends this one (the
    protocol's order, checked by the audit)."""
    return MessageDecl(kind, sender, receiver, what, payload, protects, (after,) if isinstance(after, str) else after)


ANY_ROLE = "*"
BYE_KIND = "_bye"
ABORT_KIND = "_abort"
RESUME_KIND = "_resume"
MAX_HELD = 64   # checkpoint steps a party may list in its resume offer (it keeps two)

BUILTIN = [
    # The closing barrier every party sends once to every peer; it carries no data.
    declare(BYE_KIND, ANY_ROLE, ANY_ROLE, "end-of-run barrier, empty payload", payload=sch.Null(),
            protects="control"),
    # A failing party tells its peers why, so they stop within seconds and blame the right party.
    declare(ABORT_KIND, ANY_ROLE, ANY_ROLE, "a party failed: its one-line reason (no data)",
            payload=sch.Fields({"reason": sch.Str(max_len=sch.MAX_TEXT)}), protects="control"),
    # A resumed party's first message to every peer: the checkpoint steps it holds (step numbers only,
    # no state); each party resumes from the newest step every party holds.
    declare(RESUME_KIND, ANY_ROLE, ANY_ROLE, "resume offer: the checkpoint steps the party holds, and the "
            "restarts it answered",
            payload=sch.Fields({"held": sch.ListOf(sch.Int(lo=0), max_len=MAX_HELD),
                                "incarnation": sch.Int(lo=1),
                                # the restarts the sender's incarnation answered: its vouch for them
                                "seen": sch.ListOf(sch.Str(max_len=256), max_len=4096)}), protects="control"),
]

BUILTIN_KINDS = frozenset(d.kind for d in BUILTIN)


def index(decls: Iterable[MessageDecl]) -> dict[str, MessageDecl]:
    out: dict[str, MessageDecl] = {}
    for d in list(BUILTIN) + list(decls):
        if d.kind in out and out[d.kind] != d:
            raise ValueError(f"message kind {d.kind!r} declared twice, differently")
        out[d.kind] = d
    return out


def role_ok(role: str, allowed: Sequence[str]) -> bool:
    return ANY_ROLE in allowed or role in allowed


def check_record(d: MessageDecl, arrays: list, sizes: dict | None = None) -> str | None:
    """The audit's check of one record's arrays (``(path, dtype, shape)`` or ``(dtype, shape)``)
    against a declaration's payload schema.  None when it passes."""
    return None if d.payload is None else sch.check_arrays(d.payload, arrays, sizes)
