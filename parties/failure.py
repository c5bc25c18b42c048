"""Failure records and blame: the one set of rules every runner follows.

A party that fails writes one record (its ``error.json``) saying what happened and whom the
evidence names.  ``cause`` is one of:

``own``
    the party failed by itself (its device, data, settings, a bug in it): it names itself.
``peer_fault``
    a peer's own message showed the fault: undeclared, malformed, out of bounds or inconsistent
    (:class:`~fedhet.parties.api.PeerFault`).  Names that peer, with the message's evidence (kind,
    and where the transport knows them its sequence number, round and digest, the same as in both
    parties' signed transcripts).
``peer_abort``
    a peer's abort notice.  A notice is only ever a statement about its own sender ("I failed"):
    it names the sender, never a party its text may mention.
``mismatch``
    a peer's first message carries another federation fingerprint: the two run from different
    federation files.  Which file is wrong is not provable: names nobody, gives both and the sections.
``inconsistent``
    messages of two or more peers contradict each other and nothing shows which one deviated
    (:class:`~fedhet.parties.api.PeersDisagree`): names nobody, gives the peers.
``round_failed``
    a round could not complete (too few parties completed it, or the party running it stopped it)
    and no message proves it against anyone (:class:`~fedhet.parties.api.RoundFailed`): names nobody.
``timeout``
    a peer sent nothing in time.  Silence proves nothing about who is at fault (the peer, the
    network, a third party the peer waits for): ``culprit`` is None, and the evidence says whom the
    party waited for, what that peer did send and what the connection showed.
``local_loss``
    messages of a peer were lost on this party's side (its own connection guard cut their
    connection; :class:`~fedhet.parties.api.MessageLost`): a party's own limit is never evidence
    against a peer.  Names nobody; the evidence gives the peer and the cut.
``stopped``
    stopped from outside (a signal, the launcher).  Names nobody.

:func:`verdict` turns the records of a failed run (and what the launcher saw of its processes)
into the party proven at fault, or ``None`` ("unknown") with the evidence.  It reads what the
records say, never file ages.
"""
from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any, Mapping

from .api import (FederationMismatch, MessageLost, PartyAborted, PeerFault, PeersDisagree, PeerTimeout,
                  RoundFailed)

CAUSES = ("own", "peer_fault", "peer_abort", "mismatch", "inconsistent", "round_failed", "timeout", "local_loss",
          "stopped")


def record(exc: BaseException, party: str, role: str, transport: Any = None, stopped: bool = False) -> dict:
    """The failure record of ``party`` failing with ``exc``.  ``transport`` (the party object, when it
    was up) adds the evidence it holds: the offending message's sequence number and digest."""
    reason = f"{type(exc).__name__}: {exc}"
    evidence: dict[str, Any] = {}
    if stopped:
        cause, culprit = "stopped", None
    elif isinstance(exc, PeerFault):
        cause, culprit = "peer_fault", exc.peer
        evidence = {"kind": exc.kind, "reason": exc.reason}
        last = getattr(transport, "last_received", None)
        if callable(last):
            evidence.update(last(exc.peer, exc.kind) or {})
    elif isinstance(exc, FederationMismatch):
        cause, culprit = "mismatch", None
        evidence = {"peer": exc.peer, "sections": exc.sections}
    elif isinstance(exc, PartyAborted):
        cause, culprit = "peer_abort", exc.peer
        evidence = {"notice": str(exc)}
    elif isinstance(exc, PeersDisagree):
        cause, culprit = "inconsistent", None
        evidence = {"peers": exc.peers, "kind": exc.kind, "detail": exc.reason}
    elif isinstance(exc, RoundFailed):
        cause, culprit = "round_failed", None
        evidence = {"detail": str(exc)}
    elif isinstance(exc, MessageLost):
        cause, culprit = "local_loss", None
        evidence = {"peer": exc.peer, "kind": exc.kind, "detail": exc.reason}
    elif isinstance(exc, PeerTimeout):
        cause, culprit = "timeout", None
        evidence = {"waited_for": exc.peer, "kind": exc.kind, "timeout_s": exc.timeout, "detail": str(exc)}
    else:
        cause, culprit = "own", party
    return {"party": party, "role": role, "error": reason, "cause": cause, "culprit": culprit,
            "evidence": evidence, "stopped": cause == "stopped", "time": time.time(),
            "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))}


def output_tail(out: Path) -> str:
    """The last non-blank line of a process's output file ("" if none)."""
    try:
        lines = [ln for ln in out.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1] if lines else ""


def exit_record(party: str, role: str, code: int, detail: str = "", how: str = "",
                evidence: dict | None = None) -> dict:
    """What the launcher saw of a party process that ended without a record of its own: killed by a
    signal, or exited non-zero (it crashed before it could write one).  ``how`` replaces "killed by
    signal ..." where the engine saw something else (a Ray host lost with its node), and ``evidence``
    adds what it saw."""
    import signal

    if how:
        pass
    elif code < 0:
        try:
            how = f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            how = f"killed by signal {-code}"
    else:
        how = f"exited with code {code}"
    return {"party": party, "role": role, "error": how + (f": {detail}" if detail else ""), "cause": "own",
            "culprit": party, "evidence": {"exit_code": code, "seen_by": "launcher", **(evidence or {})},
            "stopped": False,
            "killed": code < 0, "time": None}


def verdict(records: Mapping[str, dict | None]) -> dict:
    """The failed run's verdict from every party's record (None: the party has none).

    Returns ``{"party": name or None, "reason": str, "proven": bool, "cause": ..., "evidence": [...]}``:

    1. a peer's message proven bad (``peer_fault``) names that peer: proof outranks everything;
    2. else a party that failed on its own (``own``; a process killed by a signal first, then the
       earliest by the record's own time);
    3. else the sender of an abort notice that its own record does not explain: an honest party
       sends a notice only after failing on its own, on proof, on a mismatch or a timeout, never
       after being stopped by a notice or from outside; so a sender with no record, or one whose
       record says it was stopped, is named by its own notice (a forger), and a sender whose record
       explains the notice is judged by that record;
    4. else nobody is proven: ``party`` is None and the reason says "unknown", with the evidence
       (who waited for whom).
    """
    recs = {n: r for n, r in records.items() if isinstance(r, dict)}
    evidence = [_line(n, r) for n, r in sorted(recs.items(), key=lambda kv: _when(kv[1]))
                if r.get("cause") != "stopped"]

    faults = [(r, n) for n, r in recs.items() if r.get("cause") == "peer_fault" and r.get("culprit")]
    if faults:
        r, n = min(faults, key=lambda x: _when(x[0]))
        culprit = r["culprit"]
        others = sorted({x[0]["culprit"] for x in faults} - {culprit})
        ev = r.get("evidence") or {}
        why = f"{n!r} refused its {ev.get('kind', 'message')!r} message: {ev.get('reason') or r.get('error')}"
        if others:
            why += f" (also named by evidence: {others})"
        return {"party": culprit, "reason": why, "proven": True, "cause": "peer_fault", "evidence": evidence}

    own = [(n, r) for n, r in recs.items() if r.get("cause") == "own"]
    if own:
        n, r = min(own, key=lambda x: (not x[1].get("killed"), _when(x[1])))
        return {"party": n, "reason": str(r.get("error")), "proven": True, "cause": "own", "evidence": evidence}

    notices = [(r["culprit"], r) for r in recs.values() if r.get("cause") == "peer_abort" and r.get("culprit")]
    unexplained = [(s, r) for s, r in notices
                   if s not in recs or (recs[s] or {}).get("cause") in ("peer_abort", "stopped")]
    if unexplained:
        sender, r = min(unexplained, key=lambda x: _when(x[1]))
        return {"party": sender, "reason": f"its abort notice is not explained by a failure of its own: "
                                          f"{(r.get('evidence') or {}).get('notice') or r.get('error')}",
                "proven": True, "cause": "peer_abort", "evidence": evidence}

    mism = [(n, r) for n, r in recs.items() if r.get("cause") == "mismatch"]
    if mism:
        n, r = min(mism, key=lambda x: _when(x[1]))
        ev = r.get("evidence") or {}
        return {"party": None, "reason": f"unknown which file is wrong: {n!r} and {ev.get('peer')!r} run from "
                                        f"different federation files ({', '.join(ev.get('sections') or [])} differ)",
                "proven": False, "cause": "mismatch", "evidence": evidence}

    waits = [r for r in recs.values() if r.get("cause") == "timeout"]
    if waits:
        why = "unknown: no party's own messages show a fault; " + "; ".join(
            str((r.get("evidence") or {}).get("detail") or r.get("error")) for r in sorted(waits, key=_when))
    elif evidence:
        why = "unknown: " + "; ".join(evidence)
    else:
        why = "unknown: no party left a failure record"
    return {"party": None, "reason": why, "proven": False, "cause": "unknown", "evidence": evidence}


def _when(r: dict) -> float:
    t = r.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else float("inf")


def _line(name: str, r: dict) -> str:
    c = r.get("cause")
    if c == "peer_fault":
        return f"{name}: refused a message of {r.get('culprit')!r}: {r.get('error')}"
    if c == "peer_abort":
        return f"{name}: stopped by the abort notice of {r.get('culprit')!r}"
    if c == "timeout":
        return f"{name}: {(r.get('evidence') or {}).get('detail') or r.get('error')}"
    return f"{name}: {r.get('error')}"
