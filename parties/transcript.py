"""Signed, hash-chained transcripts of what a party sent and received.

One JSON line per message: time, direction, peer, kind, round, sequence number,
encoded size, the dtypes and shapes of its arrays, and the SHA-256 of its
encoded frames.  Each record carries ``prev``, the hash of the record before
it; a record's own hash is the SHA-256 of its canonical JSON.  At the end of
the run a ``head`` line names the last hash and the record count and is signed
with the party's Ed25519 key, so removing, reordering or editing any record,
or cutting the tail, is detected by ``verify``.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = "0" * 64


def canonical(rec: dict) -> bytes:
    """The exact bytes of a record's line (sorted keys, no spaces, ASCII): what the chain hashes."""
    return json.dumps(rec, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def head_message(run_id: str, party: str, count: int, head: str) -> bytes:
    """What the head signature signs."""
    return f"fedhet-transcript-v1|{run_id}|{party}|{count}|{head}".encode()


def chain_prefix(path: str | Path, party: str) -> list[dict]:
    """The records of ``party``'s transcript at ``path`` up to the first that breaks the chain (a
    line a kill cut short, an edit) or its signed head: what a resumed party continues."""
    records: list[dict] = []
    prev = GENESIS
    for raw in Path(path).read_bytes().split(b"\n"):
        try:
            rec = json.loads(raw)
        except ValueError:
            break
        if (not isinstance(rec, dict) or rec.get("type") == "head" or canonical(rec) != raw
                or rec.get("prev") != prev or rec.get("i") != len(records) or rec.get("party") != party):
            break
        prev = hashlib.sha256(raw).hexdigest()
        records.append(rec)
    return records


class Transcript:
    """Append-only writer; thread-safe; ``close`` signs the chain head.

    ``earlier``: the records of this party's transcript before a restart (:func:`chain_prefix`);
    the new file starts with them and the chain goes on from their last hash (the resumed run's
    ``resume`` record comes next: :meth:`mark`)."""

    def __init__(self, path: str | Path, party: str, run_id: str, signing_key: Ed25519PrivateKey | None,
                 earlier: list[dict] | None = None):
        self.path = Path(path)
        self.party, self.run_id = party, run_id
        self._key = signing_key
        self._prev = GENESIS
        self._count = 0
        self._lock = threading.Lock()
        self._f = open(self.path, "w", encoding="utf-8")
        self._closed = False
        for rec in earlier or []:
            line = canonical(rec)
            self._f.write(line.decode() + "\n")
            self._prev = hashlib.sha256(line).hexdigest()
            self._count += 1
        self._f.flush()

    @property
    def head(self) -> tuple[int, str]:
        """(records so far, the last record's hash)."""
        with self._lock:
            return self._count, self._prev

    def mark(self, type: str, **fields: Any) -> None:
        """A record that is not a message: ``checkpoint`` (a checkpoint's step and SHA-256),
        ``resume`` (a restart: the incarnation it begins) or ``restore`` (the step the parties
        agreed to resume from)."""
        rec: dict[str, Any] = dict(fields, type=type, t=round_t(time.time()), party=self.party)
        self._append(rec)

    def record(self, direction: str, peer: str, kind: str, round: int, seq: int,
               nbytes: int, digest: str, arrays, paths: list[str] | None = None) -> None:
        rec: dict[str, Any] = {
            "type": "msg", "i": self._count, "t": round_t(time.time()), "party": self.party,
            "dir": direction, "peer": peer, "kind": kind, "round": int(round), "seq": int(seq),
            "bytes": int(nbytes), "sha256": digest,
            "arrays": [[dt, list(shape)] for dt, shape in arrays], "prev": self._prev,
        }
        if paths is not None and len(paths) == len(rec["arrays"]):
            rec["paths"] = list(paths)  # each array's field in the payload (the schema's path)
        self._append(rec)

    def _append(self, rec: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            rec["i"], rec["prev"] = self._count, self._prev
            line = canonical(rec)
            self._prev = hashlib.sha256(line).hexdigest()
            self._count += 1
            self._f.write(line.decode() + "\n")
            self._f.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            head = {"type": "head", "party": self.party, "run": self.run_id,
                    "count": self._count, "head": self._prev, "sig": None}
            if self._key is not None:
                head["sig"] = self._key.sign(head_message(self.run_id, self.party, self._count, self._prev)).hex()
            self._f.write(canonical(head).decode() + "\n")
            self._f.flush()
            self._f.close()


def round_t(t: float) -> float:
    return float(f"{t:.6f}")


@dataclass
class Verified:
    party: str
    records: list
    ok: bool
    problems: list
    at: dict = field(default_factory=dict)   # record index -> the problems of that record (line problems)


def verify(path: str | Path, party: str, run_id: str, public_key: Ed25519PublicKey | None) -> Verified:
    """Check a transcript's chain and head signature; returns records and problems found."""
    problems: list[str] = []
    records: list[dict] = []
    prev = GENESIS
    head = None
    try:
        lines = Path(path).read_bytes().split(b"\n")
    except OSError as e:
        return Verified(party, [], False, [f"cannot read transcript: {e}"])
    at: dict[int, list[str]] = {}

    def bad(n: int, text: str, back: int = 0) -> None:
        """A problem of line n + 1, marked at the record numbered len(records) - back."""
        problems.append(f"line {n + 1}: {text}")
        at.setdefault(max(0, len(records) - back), []).append(text)

    for n, raw in enumerate(lines):
        if not raw:
            continue
        if head is not None:
            bad(n, "data after the signed head")
            break
        try:
            rec = json.loads(raw)
        except ValueError:
            bad(n, "not JSON")
            break
        if not isinstance(rec, dict):
            bad(n, "not a record")
            break
        if canonical(rec) != raw:
            bad(n, "not in canonical form (edited?)")
        if rec.get("type") == "head":
            head = rec
            continue
        if rec.get("prev") != prev:
            # the link of this line does not match the hash of the record before it: that record was
            # edited, or records between the two removed or reordered; marked at the one before
            bad(n, "hash chain broken (record removed, reordered or edited)", back=1)
        if rec.get("i") != len(records):
            bad(n, f"record index {rec.get('i')} where {len(records)} was expected")
        if rec.get("party") != party:
            bad(n, f"record of party {rec.get('party')!r} in {party!r}'s transcript")
        prev = hashlib.sha256(raw).hexdigest()
        records.append(rec)
    if head is None:
        problems.append("no signed head (run did not finish, or the tail was cut)")
    else:
        if head.get("count") != len(records) or head.get("head") != prev:
            problems.append("head does not match the chain (records removed or added)")
        if head.get("run") != run_id or head.get("party") != party:
            problems.append(f"head names run {head.get('run')!r} / party {head.get('party')!r}")
        sig = head.get("sig")
        if public_key is None:
            problems.append("no public key to verify the head signature")
        elif not isinstance(sig, str):
            problems.append("head is not signed")
        else:
            try:
                public_key.verify(bytes.fromhex(sig), head_message(run_id, party, len(records), prev))
            except (InvalidSignature, ValueError):
                problems.append("head signature does not verify")
    return Verified(party, records, not problems, problems, at)
