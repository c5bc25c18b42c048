"""Test helper: rewrite a party's transcript as someone who can edit a run folder would."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedhet.parties.transcript import GENESIS, canonical, head_message


def public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def resign(run: Path, party: str, edit=None, key: Ed25519PrivateKey | None = None) -> str:
    """Rewrite ``party``'s transcript (after ``edit(records)``, which may change the list in place) as a
    valid chain signed by ``key`` (default: a NEW key), and put that key into config.json.  Returns the
    public key."""
    key = key or Ed25519PrivateKey.generate()
    cfg = json.loads((run / "config.json").read_text())
    path = run / "parties" / party / "transcript.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines() if line]
    head = recs.pop()
    assert head["type"] == "head"
    if edit is not None:
        edit(recs)
    prev, lines = GENESIS, []
    for i, r in enumerate(recs):
        r["i"], r["prev"] = i, prev
        line = canonical(r)
        prev = hashlib.sha256(line).hexdigest()
        lines.append(line)
    head.update(count=len(recs), head=prev, sig=key.sign(head_message(cfg["run_id"], party, len(recs), prev)).hex())
    lines.append(canonical(head))
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    pub = public_hex(key)
    for p in cfg["party"]:
        if p["name"] == party:
            p["sign_key"] = pub
    (run / "config.json").write_text(json.dumps(cfg))
    return pub
