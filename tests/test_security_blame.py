"""Issue 43, item 2: never the honest receiver blamed for a peer's bad message, in every protocol.

For every installed algorithm (its smoke federation, in memory; the PSI job under each of its
three backends) and every kind of message some party sends, one party sends the first message of
that kind with a semantically wrong payload that its schema may still accept: every integer
field moved by one (a chunk index, a step, a round, a size, a version), else every array's
values perturbed, else a flag flipped.  The run either still ends (the change was harmless, or
undetectable by design: a semi-honest protocol) or fails; when it fails, the verdict names the
sender or nobody, never a party that only received (the tamperer's own record aside: a deviating
party's record is only its word).  Timeouts run on the virtual clock: a party
left waiting fails at once, naming nobody.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from algorithm_tools import smoke_federation  # a helper module of tests/
from fedhet.algorithms import registry
from fedhet.parties import declare as decl
from fedhet.parties import failure
from fedhet.parties.api import Party
from fedhet.parties.inmemory import FederationFailed, InMemoryParty, run_inmemory

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

RUN_ID = "blame-test"


def tamper(payload):
    """A wrong payload of the same shape: ints moved by one, else arrays perturbed, else a flag flipped."""
    out, changed = _ints(copy.deepcopy(payload))
    if changed:
        return out
    out, changed = _arrays(copy.deepcopy(payload))
    if changed:
        return out
    out, changed = _flags(copy.deepcopy(payload))
    return out if changed else payload


def _walk(x, leaf):
    if isinstance(x, dict):
        hit = False
        for k in list(x):
            x[k], h = _walk(x[k], leaf)
            hit |= h
        return x, hit
    if isinstance(x, list):
        hit = False
        for i, v in enumerate(x):
            x[i], h = _walk(v, leaf)
            hit |= h
        return x, hit
    return leaf(x)


def _ints(x):
    return _walk(x, lambda v: (v + 1, True) if isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                 else (v, False))


def _arrays(x):
    def leaf(v):
        if isinstance(v, np.ndarray) and v.size:
            w = v.copy()
            flat = w.reshape(-1)
            if w.dtype.kind in "iu":
                flat[0] ^= 1
            elif w.dtype.kind == "f":
                flat[0] = flat[0] + 1.0
            elif w.dtype.kind == "b":
                flat[0] = not flat[0]
            else:
                return v, False
            return w, True
        if isinstance(v, bytes) and v:
            return bytes([v[0] ^ 1]) + v[1:], True
        return v, False
    return _walk(x, leaf)


def _flags(x):
    return _walk(x, lambda v: (not v, True) if isinstance(v, bool) else (v, False))


def federations():
    """(id, algorithm, parties, settings) of every installed algorithm's smoke federation, the PSI
    job once per backend."""
    out = []
    for name in registry.names():
        fed = smoke_federation(name)
        cfg = fed.algorithm_cfg()
        parties = [(p.name, p.role) for p in fed.parties]
        if name == "psi":
            for backend in ("ecdh", "kkrt", "rr22"):
                out.append((f"psi-{backend}", name, parties, dict(cfg, psi_backend=backend)))
        else:
            out.append((name, name, parties, cfg))
    return out


FEDS = {f[0]: f[1:] for f in federations()}
_SENT: dict[str, list[tuple[str, str]]] = {}


def sent_kinds(fid: str) -> list[tuple[str, str]]:
    """(sender, kind) of every kind a clean run sends, in the order first sent."""
    if fid not in _SENT:
        name, parties, cfg = FEDS[fid]
        seen: list[tuple[str, str]] = []
        orig = InMemoryParty.send

        def spy(self, to, kind, payload):
            if kind not in decl.BUILTIN_KINDS and (self.name, kind) not in seen:
                seen.append((self.name, kind))
            return orig(self, to, kind, payload)

        InMemoryParty.send = spy   # type: ignore[method-assign]
        try:
            run_inmemory(registry.get_algorithm(name), parties, cfg, seed=0, run_id=RUN_ID, clock="virtual")
        finally:
            _restore_send(orig)
        _SENT[fid] = seen
    return _SENT[fid]


def _restore_send(orig) -> None:
    """Undo a patch of ``InMemoryParty.send``: it inherits ``Party.send``, so setting the original back on
    the subclass would shadow every later patch of ``Party.send`` in this process (another test's spy)."""
    if orig is Party.send:
        del InMemoryParty.send
    else:
        InMemoryParty.send = orig   # type: ignore[method-assign]


def hostile_run(fid: str, sender: str, kind: str):
    """The federation with ``sender``'s first ``kind`` message tampered; None if it ran to the end,
    else the FederationFailed."""
    name, parties, cfg = FEDS[fid]
    orig = InMemoryParty.send
    done = [False]

    def send(self, to, k, payload):
        if self.name == sender and k == kind and not done[0]:
            done[0] = True
            payload = tamper(payload)
        return orig(self, to, k, payload)

    InMemoryParty.send = send   # type: ignore[method-assign]
    try:
        run_inmemory(registry.get_algorithm(name), parties, cfg, seed=0, run_id=RUN_ID, clock="virtual")
        return None
    except FederationFailed as e:
        return e
    finally:
        _restore_send(orig)


@pytest.mark.parametrize("fid", sorted(FEDS))
def test_a_tampered_message_of_any_kind_never_gets_an_honest_receiver_blamed(fid):
    named = []
    for sender, kind in sent_kinds(fid):
        err = hostile_run(fid, sender, kind)
        if err is None:
            continue
        # the tamperer's own record is its own word (a deviating party may write anything): the
        # verdict is what the others' records prove
        verdict = failure.verdict({n: r for n, r in err.records.items() if n != sender})
        who = verdict["party"]
        if who not in (None, sender):
            named.append(f"{sender} tampered {kind!r}: the verdict names {who!r} ({verdict['reason'][:300]})")
    assert not named, "\n".join(named)


def test_tamper_changes_a_payload_and_keeps_its_shape():
    p = {"i": 3, "v": np.arange(4, dtype=np.uint8), "stop": False}
    t = tamper(p)
    assert t["i"] == 4 and np.array_equal(t["v"], p["v"]) and p["i"] == 3
    q = {"a": np.zeros(3), "key": b"\x00\x01"}
    u = tamper(q)
    assert u["a"][0] == 1.0 and u["a"].shape == (3,) and u["key"] == b"\x01\x01"
    assert tamper({"stop": True}) == {"stop": False}
