"""``fedhet audit RUN_DIR``: check what crossed each party boundary.

1. Every transcript verifies: hash chain intact, head signed by the party's
   Ed25519 key from the federation (not from the transcript itself).
2. Every send has exactly one matching receive on the other side (same link,
   sequence number, kind and SHA-256), and every receive a send.  A resumed run's transcripts go
   on across the restart: ``resume`` records split them into incarnations (each numbers its
   messages afresh), every party must go on from the same step, whose checkpoint digest its own
   transcript recorded; in an incarnation a kill cut short, messages only one end recorded were
   in flight and are counted as a warning, not a problem.
3. Every message matches its protocol's declaration (``parties.declare``):
   declared kind, sender and receiver roles as declared, and array dtypes and
   shapes accepted by the declaration's check.

The report is a per-party, per-kind table of messages and bytes plus the list
of problems; any problem makes the audit fail (exit 1).

Trust.  The signing keys that check the transcripts must come from outside
the folder being audited: ``audit(run, federation="fed.toml")`` (``fedhet audit
RUN --federation fed.toml``) takes every party's ``sign_key`` (and role) from
the federation file the auditor trusts, and reports any party whose key or
role in the run's ``config.json`` differs.  Without it the keys come from the
folder's own ``config.json``, which anyone who can edit the folder can replace
(and re-sign every transcript): the report is then *unverified*, and ``fedhet
audit`` exits non-zero unless the auditor accepts the folder's keys
explicitly (``--trust-folder-keys``).

Sequence numbers.  Each link's sends, and its receipts, must be numbered
0..k without a gap: a message deleted from both ends' transcripts (two
colluding parties, each re-signing its own) leaves one (``sequence_gaps``).

Robustness.  Records and config entries of the wrong shape (a ``null`` size,
a list where a kind belongs, ...) are reported as problems naming the party,
record and field; they never crash the audit (``record_problem``,
``config_problems``).
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import runfolder as rf
from . import declare as decl
from .contract import from_module, installed_algorithm, prepare
from .codec import short
from .keys import verify_key
from .transcript import verify


@dataclass
class AuditReport:
    run_dir: Path
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    table: list[dict] = field(default_factory=list)  # party, kind, sent, sent_bytes, received, received_bytes
    messages: int = 0
    keys_trusted: bool = False  # signing keys from a federation file, or the folder's accepted explicitly
    marks: list[dict] = field(default_factory=list)   # {"party", "i", "problem"}: the record a problem is at

    def flag(self, party: str, i: Any, problem: str) -> None:
        """A problem of record ``i`` of ``party``'s transcript: listed, and marked at that record."""
        self.problems.append(problem)
        self.marks.append({"party": party, "i": i, "problem": problem})

    @property
    def ok(self) -> bool:
        """No problem found in the folder (signatures checked against the keys used)."""
        return not self.problems

    @property
    def unverified(self) -> str | None:
        """Why a problem-free report still proves nothing (None when the keys were trusted)."""
        return None if self.keys_trusted else UNVERIFIED

    @property
    def exit_code(self) -> int:
        """``fedhet audit``'s status: 0 only for a problem-free report against trusted keys."""
        return 0 if self.ok and self.keys_trusted else 1


def _declarations(config: dict, lookup: Callable[[str], Any] | None) -> tuple[dict, dict, Any, list[str]]:
    """(declared kinds, sizes, settings, problems) of the run's algorithm, via ``lookup``."""
    name = config.get("algorithm", {}).get("name")
    lookup = lookup or installed_algorithm
    try:
        algo = from_module(lookup(name))
    except (ValueError, TypeError, ImportError) as e:
        return decl.index([]), {}, None, [f"cannot load the declarations of algorithm {name!r}: {e}"]
    try:
        settings, declared, sizes = prepare(algo, config.get("algorithm_cfg", {}))
    except ValueError as e:
        return decl.index([]), {}, None, [f"the run's [algorithm] settings do not parse: {e}"]
    if declared is None:
        return decl.index([]), sizes, settings, [f"algorithm {name!r} declares no message kinds"]
    return declared, sizes, settings, []


def audit(run_dir: str | Path, lookup: Callable[[str], Any] | None = None,
          federation: str | Path | None = None, trust_folder_keys: bool = False) -> AuditReport:
    """Audit a run folder.  ``lookup`` maps the run's algorithm name to its Algorithm (the CLI
    hands the algorithms' registry; by default the installed entry points); ``federation``: the
    federation file whose signing keys the auditor trusts; ``trust_folder_keys``: accept the
    folder's own keys instead (else, without ``federation``, the report is unverified)."""
    run_dir = Path(run_dir)
    rep = AuditReport(run_dir)
    rep.keys_trusted = federation is not None or bool(trust_folder_keys)
    cfg_path = run_dir / rf.CONFIG
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        rep.problems.append(f"cannot read {cfg_path}: {e}")
        return rep
    bad = config_problems(config)
    if bad:
        rep.problems += [f"{cfg_path}: {b}" for b in bad]
        return rep
    sign_keys = trusted_sign_keys(rep, config, federation)
    run_id = config.get("run_id", "")
    roles = {p["name"]: p["role"] for p in config.get("party", [])}
    declared, sizes, alg_cfg, errs = _declarations(config, lookup)
    rep.problems += errs

    sends: dict[tuple, dict] = {}
    recvs: dict[tuple, dict] = {}
    counts: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, 0])
    last_incarnation: dict[str, int] = {}
    restored: dict[int, dict[str, int]] = defaultdict(dict)   # incarnation -> party -> step it resumed from
    for p in config.get("party", []):
        name = p["name"]
        tpath = rf.party_dir(run_dir, name) / rf.TRANSCRIPT
        if not tpath.exists():
            rep.problems.append(f"{name}: transcript missing ({tpath})")
            continue
        v = verify(tpath, name, run_id, sign_keys.get(name))
        rep.problems += [f"{name}: {msg}" for msg in v.problems]
        rep.marks += [{"party": name, "i": i, "problem": f"{name}: record {i}: {t}"} for i, ts in v.at.items() for t in ts]
        inc = 0
        checkpoints: set[tuple] = set()
        order = _Order(rep, declared, name)
        for r in v.records:
            kind_of = r.get("type", "msg")
            if kind_of != "msg":
                inc = _restart_record(rep, name, r, inc, checkpoints, restored)
                if inc != order.inc:   # a new incarnation: the order starts afresh
                    order.reset(inc)
                continue
            fault = record_problem(r)
            if fault is not None:
                rep.flag(name, r.get("i"), f"{name}: record {short(r.get('i'))}: {fault}")
                continue
            order.check(r)
            rep.messages += 1
            c = counts[(name, r.get("kind"))]
            if r.get("dir") == "send":
                key = (inc, name, r.get("peer"), r.get("seq"))
                if key in sends:
                    rep.flag(name, r.get("i"), f"{name}: two sends to {r.get('peer')} with seq {r.get('seq')}{_inc(inc)}")
                sends[key] = r
                c[0] += 1
                c[1] += int(r.get("bytes", 0))
                _check_declared(rep, declared, roles, alg_cfg, sizes, name, r, name, r.get("peer"))
            elif r.get("dir") == "recv":
                key = (inc, r.get("peer"), name, r.get("seq"))
                if key in recvs:
                    rep.flag(name, r.get("i"),
                             f"{name}: two receipts from {r.get('peer')} with seq {r.get('seq')}{_inc(inc)}")
                recvs[key] = r
                c[2] += 1
                c[3] += int(r.get("bytes", 0))
                # Both ends are checked: a receipt re-signed with other shapes must fail too.
                _check_declared(rep, declared, roles, alg_cfg, sizes, name, r, r.get("peer"), name)
            else:
                rep.flag(name, r.get("i"), f"{name}: record {r.get('i')} has direction {r.get('dir')!r}")
        last_incarnation[name] = inc
    final = max(last_incarnation.values(), default=0)
    behind = sorted(n for n, i in last_incarnation.items() if i != final)
    if behind:
        rep.problems.append(f"{', '.join(behind)}: transcript ends in an earlier incarnation than the run's last "
                            f"({final}): not resumed with the others")
    for i, steps in sorted(restored.items()):
        if len(set(steps.values())) > 1:
            rep.problems.append(f"resume {i}: the parties went on from different steps {dict(sorted(steps.items()))}")
    in_flight: dict[int, int] = defaultdict(int)   # a run cut by a kill leaves messages one end recorded
    for key, s in sends.items():
        r = recvs.get(key)
        inc, frm, to, seq = key
        if r is None:
            if inc < final:
                in_flight[inc] += 1
            else:
                rep.flag(frm, s.get("i"), f"{frm} -> {to} seq {seq} ({s.get('kind')}){_inc(inc)}: sent but never received")
        elif (r.get("sha256"), r.get("kind"), r.get("bytes")) != (s.get("sha256"), s.get("kind"), s.get("bytes")):
            text = f"{frm} -> {to} seq {seq}{_inc(inc)}: what was received differs from what was sent"
            rep.flag(frm, s.get("i"), text)
            rep.marks.append({"party": to, "i": r.get("i"), "problem": text})
    for key, r in recvs.items():
        if key not in sends:
            inc, frm, to, seq = key
            if inc < final:
                in_flight[inc] += 1
            else:
                rep.flag(to, r.get("i"), f"{frm} -> {to} seq {seq} ({r.get('kind')}){_inc(inc)}: received but never sent")
    for inc, n in sorted(in_flight.items()):
        rep.warnings.append(f"incarnation {inc} was cut short (the run resumed after it): {n} message(s) only one "
                            "end recorded, in flight when it stopped")
    rep.problems += sequence_gaps(sends, recvs)
    rep.table = [
        {"party": p, "role": roles.get(p, "?"), "kind": k, "sent": c[0], "sent_bytes": c[1],
         "received": c[2], "received_bytes": c[3]}
        for (p, k), c in sorted(counts.items(), key=lambda kv: (kv[0][0], str(kv[0][1])))
    ]
    return rep


class _Order:
    """The protocols' order in one party's transcript: a kind declared ``after`` others is never sent
    more often than its causes were received before it, within an incarnation (``declare``'s
    ``after``).  Two colluders who delete a matched message from both transcripts and renumber what
    follows keep every chain, signature and sequence intact, but not this."""

    def __init__(self, rep: AuditReport, declared: dict, name: str) -> None:
        self.rep, self.declared, self.name = rep, declared, name
        self.reset(0)

    def reset(self, inc: int) -> None:
        self.inc = inc
        self.got: Counter = Counter()
        self.sent: Counter = Counter()

    def check(self, r: dict) -> None:
        kind = r.get("kind")
        if r.get("dir") == "recv":
            self.got[kind] += 1
            return
        d = self.declared.get(kind)
        self.sent[kind] += 1
        if d is None or not getattr(d, "after", ()):
            return
        causes = sum(self.got[a] for a in d.after)
        if self.sent[kind] > causes:
            self.rep.flag(self.name, r.get("i"),
                          f"{self.name}: impossible order: {kind} #{self.sent[kind]}{_inc(self.inc)} sent after only "
                          f"{causes} {' or '.join(d.after)} received (a message it answers is missing from the "
                          "transcript)")


def _inc(inc: int) -> str:
    return f" (after resume {inc})" if inc else ""


def _restart_record(rep: AuditReport, name: str, r: dict, inc: int, checkpoints: set,
                    restored: dict[int, dict[str, int]]) -> int:
    """Check one ``checkpoint`` / ``resume`` / ``restore`` record of ``name``'s transcript; returns
    the incarnation the records after it belong to."""
    t, where = r.get("type"), f"{name}: record {short(r.get('i'))}"
    step, digest = r.get("step"), r.get("sha256")
    if t == "checkpoint":
        if not (isinstance(step, int) and step > 0 and isinstance(digest, str) and len(digest) == 64):
            rep.problems.append(f"{where}: checkpoint record without a step and SHA-256")
        checkpoints.add((step, digest))
    elif t == "resume":
        if r.get("incarnation") != inc + 1:
            rep.problems.append(f"{where}: resume record of incarnation {short(r.get('incarnation'))} after "
                                f"incarnation {inc}")
        return inc + 1
    elif t == "restore":
        if r.get("incarnation") != inc or inc == 0:
            rep.problems.append(f"{where}: restore record outside its resume (incarnation {short(r.get('incarnation'))})")
        elif step != 0 and (step, digest) not in checkpoints:
            rep.problems.append(f"{where}: resumed from step {short(step)}, whose checkpoint (SHA-256 "
                                f"{short(digest)}) this transcript never recorded")
        restored[inc][name] = step if isinstance(step, int) else -1
    else:
        rep.problems.append(f"{where}: record of unknown type {short(t)}")
    return inc


# ------------------------------------------------------- trust and robustness
_RECORD_FIELDS = {  # field -> (test, what it must be)
    "dir": (lambda v: v in ("send", "recv"), '"send" or "recv"'),
    "peer": (lambda v: isinstance(v, str) and 0 < len(v) <= 256, "a party name"),
    "kind": (lambda v: isinstance(v, str) and 0 < len(v) <= 256, "a message kind"),
    "seq": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    "round": (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    "bytes": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "a non-negative integer"),
    "sha256": (lambda v: isinstance(v, str) and len(v) == 64, "a SHA-256 hex digest"),
    "arrays": (lambda v: isinstance(v, list) and all(
        isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], list)
        and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in a[1]) for a in v),
        "a list of [dtype, shape] pairs"),
}


def record_problem(r: dict) -> str | None:
    """What is wrong with a transcript record's fields (None: every field has the right type)."""
    for name, (ok, what) in _RECORD_FIELDS.items():
        if name not in r:
            return f"field {name!r} is missing"
        if not ok(r[name]):
            return f"field {name!r} is {short(r[name])}, expected {what}"
    return None


def config_problems(config) -> list[str]:
    """What is wrong with the shape of a run's config.json (the parts the audit reads)."""
    if not isinstance(config, dict):
        return [f"is {type(config).__name__}, expected a JSON object"]
    out = []
    parties = config.get("party")
    if not isinstance(parties, list) or not parties:
        return ["has no list of parties"]
    for i, p in enumerate(parties):
        if not isinstance(p, dict):
            out.append(f"party #{i + 1} is {short(p)}, expected an object")
            continue
        for k in ("name", "role"):
            if not isinstance(p.get(k), str) or not p.get(k):
                out.append(f"party #{i + 1}: field {k!r} is {short(p.get(k))}, expected a string")
        if not isinstance(p.get("sign_key", ""), str):
            out.append(f"party #{i + 1}: field 'sign_key' is {short(p.get('sign_key'))}, expected a hex string")
    names = [p.get("name") for p in parties if isinstance(p, dict)]
    if len(set(map(str, names))) != len(names):
        out.append("names a party twice")
    for k, typ in (("run_id", str), ("algorithm", dict), ("algorithm_cfg", dict)):
        if k in config and not isinstance(config[k], typ):
            out.append(f"field {k!r} is {short(config[k])}, expected {typ.__name__}")
    return out


UNVERIFIED = ("unverified: the signing keys come from the run folder itself; pass --federation fed.toml "
              "(the file you trust) or accept the folder's keys with --trust-folder-keys")
UNTRUSTED_KEYS_WARNING = (
    "signing keys taken from the audited folder's own config.json: whoever can edit the folder can replace "
    "them and re-sign every transcript, so the signatures prove nothing here. Pass the federation file you "
    "trust: fedhet audit RUN --federation fed.toml")


def trusted_sign_keys(rep: AuditReport, config: dict, federation: str | Path | None) -> dict:
    """party name -> Ed25519 public key (None where there is no valid one), from the trusted file if given.

    Differences between the trusted file and the run's config.json are problems.
    """
    keys: dict = {}
    parties = config["party"]
    if federation is None:
        rep.warnings.append(UNTRUSTED_KEYS_WARNING)
        for p in parties:
            try:
                keys[p["name"]] = verify_key(p.get("sign_key", ""))
            except ValueError:
                keys[p["name"]] = None
        return keys
    from .federation import FederationError, load

    try:
        fed = load(federation)
    except FederationError as e:
        rep.problems.append(f"trusted federation file: {e}")
        return {p["name"]: None for p in parties}
    trusted = {p.name: p for p in fed.parties}
    for p in parties:
        name = p["name"]
        t = trusted.get(name)
        keys[name] = None
        if t is None:
            rep.problems.append(f"{name}: not a party of the trusted federation file {federation}")
            continue
        if t.role != p["role"]:
            rep.problems.append(f"{name}: role {p['role']!r} in config.json, {t.role!r} in {federation}")
        if not t.sign_key:
            rep.problems.append(f"{name}: no sign_key in the trusted federation file {federation}")
            continue
        try:
            keys[name] = verify_key(t.sign_key)
        except ValueError as e:
            rep.problems.append(f"{name}: sign_key in {federation}: {e}")
            continue
        if p.get("sign_key", "") != t.sign_key:
            rep.problems.append(f"{name}: config.json names a different signing key than {federation} "
                                "(replaced in the run folder?)")
    for name in sorted(set(trusted) - {p["name"] for p in parties}):
        rep.problems.append(f"{name}: party of {federation} missing from the run")
    return keys


def sequence_gaps(sends: dict, recvs: dict) -> list[str]:
    """Gaps in each link's sequence numbers: a link's sends (and its receipts) must be 0..k.

    Every message on a link takes the next sequence number, so a number missing from both ends
    is a message deleted from both transcripts (by two colluding parties, each re-signing its
    own); one missing from one end only is already reported as sent but never received (or the
    reverse), and is not repeated here.
    """
    links: dict[tuple, set[int]] = defaultdict(set)
    for *link, seq in list(sends) + list(recvs):   # keys (frm, to, seq), or (incarnation, frm, to, seq)
        links[tuple(link)].add(seq)
    out = []
    for link, have in sorted(links.items()):
        frm, to = link[-2:]
        missing = [q for q in range(max(have) + 1) if q not in have]
        if missing:
            shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
            out.append(f"{frm} -> {to}: sequence number(s) {shown} of 0..{max(have)} missing from both ends' "
                       "transcripts: message(s) deleted from both")
    return out


def _check_declared(rep: AuditReport, declared: dict, roles: dict, cfg: Any, sizes: dict, name: str, r: dict,
                    sender: str, receiver: str) -> None:
    kind = r.get("kind")
    d = declared.get(kind)
    where = f"{name}: {sender} -> {receiver} seq {r.get('seq')} ({kind}, {r.get('dir')} record)"
    if d is None:
        rep.flag(name, r.get("i"), f"{where}: message kind not declared by the protocol")
        return
    srole, rrole = roles.get(sender, "?"), roles.get(receiver, "?")
    if not decl.role_ok(srole, d.sender):
        rep.flag(name, r.get("i"), f"{where}: sent by role {srole!r}, declared only for {list(d.sender)}")
    if not decl.role_ok(rrole, d.receiver):
        rep.flag(name, r.get("i"), f"{where}: received by role {rrole!r}, declared only for {list(d.receiver)}")
    arrays = r.get("arrays", [])
    paths = r.get("paths")
    try:
        recs: list = [(dt, tuple(shape)) for dt, shape in arrays]
        if isinstance(paths, list) and len(paths) == len(recs):
            recs = [(str(p), dt, shape) for p, (dt, shape) in zip(paths, recs)]
        msg = decl.check_record(d, recs, sizes)
    except Exception as e:  # a malformed record or a broken check is a failed check, not a crash
        msg = f"arrays cannot be checked ({type(e).__name__}: {e})"
    if msg:
        rep.flag(name, r.get("i"), f"{where}: {msg}")


def render(rep: AuditReport, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    from rich.markup import escape
    from rich.text import Text

    console = console or Console()
    t = Table(title=Text(f"audit of {rep.run_dir}", style="italic"))
    for col in ("party", "role", "kind", "sent", "sent bytes", "received", "received bytes"):
        t.add_column(col, justify="right" if "sent" in col or "received" in col else "left")
    for row in rep.table:
        t.add_row(*(Text(str(v)) for v in (row["party"], row["role"], row["kind"], row["sent"],
                                             f"{row['sent_bytes']:,}", row["received"], f"{row['received_bytes']:,}")))
    console.print(t)
    for w in rep.warnings:
        console.print(f"[bold red]WARNING[/bold red]: {escape(str(w))}", highlight=False)
    if rep.ok and rep.unverified:
        console.print(f"[red]audit UNVERIFIED[/red]: {rep.messages} records consistent, but "
                      f"{escape(str(rep.unverified))}", highlight=False, soft_wrap=True)
    elif rep.ok:
        console.print(f"[green]audit passed[/green]: {rep.messages} records, chains and signatures verified, "
                      "every send matched a receive, every message as declared"
                      + (" (signatures against the folder's own keys: see the warning)"
                         if UNTRUSTED_KEYS_WARNING in rep.warnings else ""))
    else:
        console.print(f"[red]audit FAILED[/red]: {len(rep.problems)} problem(s)")
        for p in rep.problems[:200]:
            console.print(f"  - {p}", markup=False)
        if len(rep.problems) > 200:
            console.print(f"  ... and {len(rep.problems) - 200} more")
