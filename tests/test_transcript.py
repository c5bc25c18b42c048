"""Transcripts: hash chain and signed head catch every edit, removal and cut."""
import json

import pytest

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fedhet.parties.transcript import Transcript, verify

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def make(tmp_path, n=5):
    key = Ed25519PrivateKey.generate()
    p = tmp_path / "t.jsonl"
    t = Transcript(p, "alice", "run1", key)
    for i in range(n):
        t.record("send" if i % 2 else "recv", "bob", f"k{i}", i, i, 100 + i, "ab" * 32, [("<f4", (2, 3))])
    t.close()
    return p, key.public_key()


def test_clean_transcript_verifies(tmp_path):
    p, pub = make(tmp_path)
    v = verify(p, "alice", "run1", pub)
    assert v.ok, v.problems
    assert [r["kind"] for r in v.records] == [f"k{i}" for i in range(5)]


def test_one_changed_byte_is_detected(tmp_path):
    p, pub = make(tmp_path)
    raw = bytearray(p.read_bytes())
    i = raw.index(b'"bytes":102') + len('"bytes":10')
    raw[i] = ord("9")
    p.write_bytes(bytes(raw))
    assert not verify(p, "alice", "run1", pub).ok


def test_removed_record_is_detected(tmp_path):
    p, pub = make(tmp_path)
    lines = p.read_text().splitlines(True)
    p.write_text("".join(lines[:2] + lines[3:]))
    v = verify(p, "alice", "run1", pub)
    assert not v.ok and any("chain" in m for m in v.problems)


def test_cut_tail_and_forged_head_are_detected(tmp_path):
    p, pub = make(tmp_path)
    lines = p.read_text().splitlines(True)
    p.write_text("".join(lines[:-1]))
    assert any("no signed head" in m for m in verify(p, "alice", "run1", pub).problems)
    # a head re-computed by someone without the key does not verify
    head = json.loads(lines[-1])
    head["sig"] = "00" * 64
    p.write_text("".join(lines[:-1]) + json.dumps(head, sort_keys=True, separators=(",", ":")) + "\n")
    assert any("signature" in m for m in verify(p, "alice", "run1", pub).problems)


def test_wrong_key_or_run_fails(tmp_path):
    p, _ = make(tmp_path)
    other = Ed25519PrivateKey.generate().public_key()
    assert not verify(p, "alice", "run1", other).ok
    p2, pub = make(tmp_path / ".." / tmp_path.name)
    assert not verify(p2, "alice", "run2", pub).ok
