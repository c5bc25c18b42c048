"""A party's signed statements (fedhet.parties.identity): bound to run, signer and label, checked against
the pinned key; a missing pinned key is the checking party's own problem, never a verdict on anyone."""
from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedhet.parties.api import PartyError
from fedhet.parties.identity import PartyIdentity, statement
from fedhet.parties.inmemory import InMemoryHub

pytestmark = pytest.mark.unit


def test_a_statement_verifies_only_for_its_run_signer_label_and_message():
    ids = PartyIdentity.fresh(["a", "b"])
    sig = ids["a"].sign("run1", "a", "secagg/keys", b"m")
    assert ids["b"].verify("run1", "a", "secagg/keys", b"m", sig) is True
    assert ids["b"].verify("run2", "a", "secagg/keys", b"m", sig) is False   # another run
    assert ids["b"].verify("run1", "b", "secagg/keys", b"m", sig) is False   # claimed for another signer
    assert ids["b"].verify("run1", "a", "other/kind", b"m", sig) is False    # replayed as another statement
    assert ids["b"].verify("run1", "a", "secagg/keys", b"m2", sig) is False  # altered
    assert ids["b"].verify("run1", "a", "secagg/keys", b"m", b"\0" * 64) is False
    assert ids["b"].verify("run1", "nobody", "secagg/keys", b"m", sig) is None  # no key pinned
    # never a transcript head's signed text (which starts "fedhet-transcript-v1|")
    assert not statement("r", "a", "l", b"").startswith(b"fedhet-transcript")


def test_a_key_not_pinned_for_the_signer_fails_verification():
    me = PartyIdentity(Ed25519PrivateKey.generate(), {"a": Ed25519PrivateKey.generate().public_key()})
    other = Ed25519PrivateKey.generate()   # "a" signs with a key the federation does not pin
    forged = PartyIdentity(other, {}).sign("r", "a", "l", b"m")
    assert me.verify("r", "a", "l", b"m", forged) is False


@pytest.mark.federation
def test_parties_sign_with_their_federation_key_and_check_each_other():
    hub = InMemoryHub({"a": "x", "b": "y"}, run_id="run")
    a, b = hub.party("a"), hub.party("b")
    sig = a.sign("lbl", b"hello")
    assert b.verify("a", "lbl", b"hello", sig) and not b.verify("a", "lbl", b"hellp", sig)
    assert not b.verify("b", "lbl", b"hello", sig)
    with pytest.raises(PartyError, match="no sign_key pinned for 'c'"):
        b.verify("c", "lbl", b"hello", sig)
    bare = InMemoryHub({"a": "x", "b": "y"}).party("a", identity=None)
    with pytest.raises(PartyError, match="no federation signing key"):
        bare.sign("lbl", b"x")
