"""A party's federation identity: statements it signs with its pinned Ed25519 key, that any peer checks.

Every party of a federation has an Ed25519 signing key (``fedhet keys``) whose public half, its
``sign_key``, is pinned in the federation file that every machine holds: the same key signs the
party's transcript.  A protocol that must let a party's statement travel through another party
(secure aggregation's advertised keys, relayed by the server) has it signed here and checked by the
final receiver against the pinned key, so the relaying party can neither forge nor alter it.

What is signed is ``msgpack([LABEL, run id, signer, label, message])``: the run and the signer are
always bound, and ``label`` (one per kind of statement) keeps one protocol's statement from being
replayed as another's.  A transcript head's signed text starts with ``fedhet-transcript-v1|``,
never with a msgpack array, so no statement is a valid transcript signature or the reverse.

In-memory federations (threads, tests) get fresh keys for every party (:meth:`PartyIdentity.fresh`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import msgpack
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["PartyIdentity", "statement", "STATEMENT_LABEL"]

STATEMENT_LABEL = "fedhet/party-statement/v1"


def statement(run_id: str, signer: str, label: str, message: bytes) -> bytes:
    """The bytes a party's signature on ``message`` covers."""
    return msgpack.packb([STATEMENT_LABEL, str(run_id), str(signer), str(label), bytes(message)])


@dataclass(frozen=True)
class PartyIdentity:
    """This party's signing key and every party's pinned verification key (name -> key)."""

    signing_key: Ed25519PrivateKey
    verify_keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)

    @staticmethod
    def fresh(names: list[str] | tuple[str, ...]) -> dict[str, "PartyIdentity"]:
        """New keys for every party of an in-memory federation, each pinned for all the others."""
        keys = {n: Ed25519PrivateKey.generate() for n in names}
        pinned = {n: k.public_key() for n, k in keys.items()}
        return {n: PartyIdentity(k, pinned) for n, k in keys.items()}

    def sign(self, run_id: str, me: str, label: str, message: bytes) -> bytes:
        return self.signing_key.sign(statement(run_id, me, label, message))

    def verify(self, run_id: str, signer: str, label: str, message: bytes, signature: bytes) -> bool | None:
        """True / False: the signature is / is not ``signer``'s on ``message``; None: no key is pinned
        for ``signer`` (this party's federation file lacks it: nothing can be concluded about anyone)."""
        key = self.verify_keys.get(signer)
        if key is None:
            return None
        try:
            key.verify(bytes(signature), statement(run_id, signer, label, message))
            return True
        except (InvalidSignature, ValueError):
            return False
