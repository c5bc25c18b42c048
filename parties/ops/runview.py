"""A run folder as one plain dict: what ``fedhet report`` draws and ``fedhet board`` lists.

:func:`view` reads a finished (or failed) run: the summary (``result.json``, ``config.json``), the
audit (:mod:`fedhet.parties.audit`, with each problem at the record it concerns), the message map
(every kind that crossed a party boundary, from sender role to receiver role, with counts, bytes,
what protects it and what the audit checked), the per-round flow, the training curves
(``metrics.jsonl``) and time and bytes per phase and party.  :func:`status` reads a run that may
still be going: each party's ``status.json``, progress and ETA.  Both only read; neither raises on
a damaged folder (what cannot be read is reported in the dict).
"""
from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from fedhet.parties import runfolder as rf
from fedhet.parties import declare as decl
from fedhet.parties.progress import eta

MAX_ROUNDS = 400        # rounds of the flow kept (the first and last halves of a longer run)
MAX_STEPS = 200         # steps kept per round (consecutive messages of one kind and link are one step)
# Fields of metrics.jsonl that are bookkeeping, not training metrics.
NOT_METRICS = {"party", "round", "epoch", "wall_s", "s", "step"}


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def number(v: Any) -> float | None:
    """``v`` as a finite float, or None (bools and text are not numbers here)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def flatten(key: str, value: Any, most: int = 8) -> list[tuple[str, float]]:
    """A result's numbers under printable names: a number as itself, a dict's numbers as
    ``key.sub``, a list's first ``most`` numbers as ``key[i]`` (headline results are often a
    dict of metrics or one value per setting)."""
    if number(value) is not None:
        return [(key, value)]
    if isinstance(value, dict):
        return [(f"{key}.{k}", v) for k, v in value.items() if number(v) is not None]
    if isinstance(value, list):
        return [(f"{key}[{i}]", v) for i, v in enumerate(value[:most]) if number(v) is not None]
    return []


def phase_of(kind: str) -> str:
    """The phase a message kind belongs to: its prefix (``psi/blind_f`` -> ``psi``)."""
    if kind.startswith("_"):
        return "control"
    return kind.split("/", 1)[0]


# ---------------------------------------------------------------- status (the board)
def _alive(pid_file: Path) -> bool:
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def find_runs(root: str | Path, depth: int = 3) -> list[Path]:
    """Run folders (those with a ``config.json``) under ``root``, at most ``depth`` levels down."""
    root = Path(root)
    out: list[Path] = []

    def walk(d: Path, level: int) -> None:
        if (d / rf.CONFIG).is_file():
            out.append(d)
            return
        if level >= depth:
            return
        try:
            subs = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for p in subs:
            walk(p, level + 1)

    walk(root, 0)
    return out


def status(run_dir: str | Path) -> dict:
    """A run's live state: ``done`` / ``failed`` (its result.json), ``running`` (a party process is
    alive), ``stopped`` (none is, and no result: killed) or ``starting``; and per party its state,
    step, total, current metrics, elapsed time and ETA."""
    run_dir = Path(run_dir)
    config = read_json(run_dir / rf.CONFIG) or {}
    result = read_json(run_dir / rf.RESULT)
    parties = []
    cfg_parties: list = config["party"] if isinstance(config.get("party"), list) else []
    for p in cfg_parties:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str):
            continue
        pdir = rf.party_dir(run_dir, p["name"])
        st = read_json(pdir / rf.STATUS)
        st = st if isinstance(st, dict) else {}
        state = str(st.get("state", "waiting"))
        if state == "running" and not _alive(pdir / rf.LOCK):
            state = "stopped"
        done, total, el = st.get("done", 0), st.get("total", 0), st.get("elapsed_s")
        parties.append({"name": p["name"], "role": p.get("role", "?"), "state": state,
                        "done": done, "total": total, "elapsed_s": number(el),
                        "eta_s": eta(done, total, el) if state == "running" else None,
                        "metrics": {k: v for k, v in (st.get("metrics") or {}).items() if number(v) is not None},
                        "error": st.get("error")})
    if isinstance(result, dict):
        state = "done" if result.get("ok") else "failed"
    elif any(p["state"] == "running" for p in parties):
        state = "running"
    elif any(p["state"] in ("done", "failed", "stopped") for p in parties):
        state = "stopped"
    else:
        state = "starting"
    etas = [p["eta_s"] for p in parties if p["eta_s"] is not None]
    steps = [(p["done"], p["total"]) for p in parties if number(p["total"])]
    frac = (sum(min(float(d or 0), float(t)) for d, t in steps) / sum(float(t) for _, t in steps)) if steps else None
    if state == "done":
        frac = 1.0
    alg = config.get("algorithm")
    return {"run": str(run_dir), "state": state,
            "algorithm": alg.get("name") if isinstance(alg, dict) else None,
            "federation": (config.get("federation") or {}).get("name"),
            "parties": parties, "progress": frac, "eta_s": max(etas) if etas else None,
            "wall_s": number(result.get("wall_s")) if isinstance(result, dict) else None,
            "mtime": _mtime(run_dir)}


def _mtime(run_dir: Path) -> float:
    times = [0.0]
    for f in [run_dir / rf.CONFIG, run_dir / rf.RESULT, *run_dir.glob(f"{rf.PARTIES}/*/{rf.STATUS}")]:
        try:
            times.append(f.stat().st_mtime)
        except OSError:
            pass
    return max(times)


# ---------------------------------------------------------------- the whole view (the report)
def view(run_dir: str | Path, lookup: Callable[[str], Any] | None = None,
         federation: str | Path | None = None) -> dict:
    """Everything the report shows of one run folder.  ``lookup`` maps the run's algorithm name to
    its Algorithm (declarations, headline keys); ``federation``: the federation file whose signing
    keys the auditor trusts (else the folder's own keys, and the verdict says so)."""
    from fedhet.parties.audit import audit
    from fedhet.parties.contract import from_module, installed_algorithm, prepare

    run_dir = Path(run_dir)
    config = read_json(run_dir / rf.CONFIG)
    config = config if isinstance(config, dict) else {}
    result = read_json(run_dir / rf.RESULT)
    result = result if isinstance(result, dict) else {}
    st = status(run_dir)
    alg_name = (config.get("algorithm") or {}).get("name") if isinstance(config.get("algorithm"), dict) else None
    declared: dict = {}
    headline: tuple = ()
    try:
        algo = from_module((lookup or installed_algorithm)(str(alg_name)))
        headline = tuple(algo.headline)
        _, d, _ = prepare(algo, config.get("algorithm_cfg", {}))
        declared = d or {}
    except Exception:   # an unknown algorithm or settings that no longer parse: the audit says which
        declared = decl.index([])
    finished = st["state"] in ("done", "failed")
    rep = audit(run_dir, lookup, federation=federation, trust_folder_keys=federation is None)
    roles_of = {p["name"]: p["role"] for p in config.get("party", []) if isinstance(p, dict) and "name" in p}
    records = _records(run_dir, list(roles_of))
    marks: dict[tuple, list[str]] = defaultdict(list)
    for m in rep.marks:
        marks[(m["party"], m["i"])].append(m["problem"])
    messages = _messages(records, marks, roles_of)
    return {
        "path": str(run_dir),
        "run_id": config.get("run_id"),
        "federation": (config.get("federation") or {}).get("name"),
        "algorithm": alg_name,
        "settings": config.get("algorithm_cfg", {}),
        "insecure": bool(config.get("insecure")),
        "state": st["state"],
        "ok": result.get("ok"),
        "wall_s": number(result.get("wall_s")),
        "bytes_total": number(result.get("bytes_total")),
        "headline": list(headline),
        "parties": _parties(config, result, st, headline),
        "audit": {"ok": rep.ok, "finished": finished, "keys_trusted": federation is not None,
                  "verdict": _verdict(rep, finished, federation is not None),
                  "problems": rep.problems, "warnings": [w for w in rep.warnings if "signing keys taken" not in w],
                  "messages": rep.messages},
        "roles": _roles(config),
        "protections": {**decl.PROTECTIONS, decl.NOT_STATED: "the declaration does not say what protects it",
                        "undeclared": "not declared by the protocol: the audit fails"},
        "kinds": _kinds(messages, declared),
        "flow": _flow(messages),
        "curves": _curves(run_dir / rf.METRICS),
        "phases": _phases(result, messages),
        "network": _network(run_dir, config, finished and result.get("ok") is True),
    }


def _network(run_dir: Path, config: dict, done: bool) -> dict:
    """The run's simulated link (config.json) and, for a finished loopback run, the network cost
    model's wall time at LAN and WAN (:mod:`fedhet.parties.ops.netmodel`)."""
    from fedhet.parties.ops import netmodel

    rec = config.get("network")
    rec = rec if isinstance(rec, dict) else {}
    fed = config.get("federation")
    fed = fed if isinstance(fed, dict) else {}
    out: dict = {"profile": str(rec.get("network") or fed.get("network") or "loopback"),
                 "rtt_ms": number(rec.get("rtt_ms")), "mbit_s": number(rec.get("mbit_s")), "predicted": {},
                 "why_not": ""}
    if out["profile"] != "loopback":
        out["why_not"] = "the model replays loopback runs"
    elif not done:
        out["why_not"] = "the run did not finish"
    else:
        try:
            out["predicted"] = {n: p.wall_s for n, p in netmodel.predict_run(run_dir).items()}
        except (netmodel.ModelError, OSError, KeyError, TypeError, ValueError) as e:
            out["why_not"] = f"{type(e).__name__}: {e}"
    return out


def _verdict(rep: Any, finished: bool, trusted: bool) -> str:
    if not finished and not rep.ok:
        return "in progress: the audit is complete once every party has signed its transcript"
    if not rep.ok:
        return f"audit FAILED: {len(rep.problems)} problem(s)"
    how = ("against the trusted federation file's keys" if trusted
           else "against the run folder's own keys (pass --federation to check them against a file you trust)")
    return (f"audit passed: {rep.messages} records, chains and signatures verified {how}, every send matched a "
            "receive, every message as declared")


def _roles(config: dict) -> list[str]:
    out: list[str] = []
    for p in config.get("party", []):
        if isinstance(p, dict) and isinstance(p.get("role"), str) and p["role"] not in out:
            out.append(p["role"])
    return out


def _parties(config: dict, result: dict, st: dict, headline: tuple) -> list[dict]:
    live = {p["name"]: p for p in st["parties"]}
    summaries: dict = result["parties"] if isinstance(result.get("parties"), dict) else {}
    out = []
    for p in config.get("party", []):
        if not isinstance(p, dict) or "name" not in p:
            continue
        s = summaries.get(p["name"]) or {}
        res: dict = s["result"] if isinstance(s.get("result"), dict) else {}
        tr: dict = s["traffic"] if isinstance(s.get("traffic"), dict) else {}
        out.append({
            "name": p["name"], "role": p.get("role"), "device": s.get("device", p.get("device", "cpu")),
            "state": s.get("state", live.get(p["name"], {}).get("state")),
            "wall_s": number(s.get("wall_s")), "error": s.get("error"),
            "bytes_sent": number(tr.get("bytes_sent_total")), "bytes_received": number(tr.get("bytes_received_total")),
            "headline": {**{name: v for k in headline if k in res for name, v in flatten(k, res[k])},
                         # a party's DP ledger (result.json "privacy"): the epsilon it spent
                         **({"privacy.epsilon": res["privacy"]["epsilon"]} if isinstance(res.get("privacy"), dict)
                            and number(res["privacy"].get("epsilon")) is not None else {})},
            "results": {k: v for k, v in res.items() if number(v) is not None or isinstance(v, str)},
        })
    return out


def _records(run_dir: Path, names: list[str]) -> list[dict]:
    """Every message record of every party's transcript, as read (the audit has checked them)."""
    out = []
    for name in names:
        path = rf.party_dir(run_dir, name) / rf.TRANSCRIPT
        try:
            lines = path.read_bytes().split(b"\n")
        except OSError:
            continue
        for raw in lines:
            try:
                r = json.loads(raw) if raw else None
            except ValueError:
                continue
            if isinstance(r, dict) and r.get("type", "msg") == "msg":
                # a record of the wrong shape (the audit names it) is still drawn: its fields as text
                for f in ("seq", "round"):
                    if not (isinstance(r.get(f), int) and not isinstance(r.get(f), bool)):
                        r[f] = str(r.get(f))
                for f in ("kind", "peer", "dir"):
                    r[f] = str(r.get(f))
                r["_party"] = name
                out.append(r)
    return out


def _messages(records: list[dict], marks: dict, roles_of: dict) -> list[dict]:
    """One entry per message that crossed a boundary: from the sender's record, or from the
    receiver's where the sender recorded none.  Problems of either end's record are attached."""
    sends: dict[tuple, dict] = {}
    recvs: dict[tuple, dict] = {}
    for one in records:
        key = (str(one.get("_party")), str(one.get("peer")), one.get("seq"), one.get("kind"))
        if one.get("dir") == "send":
            sends[key] = one
        elif one.get("dir") == "recv":
            recvs[(str(one.get("peer")), str(one.get("_party")), one.get("seq"), one.get("kind"))] = one
    out = []
    for key in list(sends) + [k for k in recvs if k not in sends]:
        s: dict | None = sends.get(key)
        r: dict | None = recvs.get(key)
        first = s if s is not None else r
        assert first is not None
        rec: dict = first
        probs = []
        if s is not None:
            probs += marks.get((s["_party"], s.get("i")), [])
        if r is not None:
            probs += [p for p in marks.get((r["_party"], r.get("i")), []) if p not in probs]
        t = number(rec.get("t"))
        n_bytes = number(rec.get("bytes"))
        out.append({"from": key[0], "to": key[1], "kind": str(rec.get("kind")), "round": rec.get("round"),
                    "from_role": roles_of.get(key[0], "?"), "to_role": roles_of.get(key[1], "?"),
                    "bytes": int(n_bytes) if n_bytes is not None else 0, "t": t if t is not None else 0.0,
                    "problems": probs})
    out.sort(key=lambda m: m["t"])
    return out


def _kinds(messages: list[dict], declared: dict) -> list[dict]:
    by: dict[str, dict] = {}
    for m in messages:
        k = by.setdefault(m["kind"], {"kind": m["kind"], "links": {}, "count": 0, "bytes": 0, "bad": 0,
                                      "problems": [], "first_t": m["t"]})
        link = k["links"].setdefault((m["from_role"], m["to_role"]), {"from": m["from_role"], "to": m["to_role"],
                                                                       "count": 0, "bytes": 0, "bad": 0})
        link["count"] += 1
        link["bytes"] += m["bytes"]
        link["bad"] += bool(m["problems"])
        k["count"] += 1
        k["bytes"] += m["bytes"]
        if m["problems"]:
            k["bad"] += 1
            k["problems"] += [p for p in m["problems"] if p not in k["problems"]][:20]
    out = []
    for k in sorted(by.values(), key=lambda k: k["first_t"]):
        d = declared.get(k["kind"])
        if d is None:
            protects, what, schema = "undeclared", "not declared by the protocol", None
            checks = ["the kind must be declared by the run's protocol: it is not"]
        else:
            protects = d.protects or decl.NOT_STATED
            what = d.what
            schema = d.payload.render() if d.payload is not None else None
            checks = [
                "both ends' transcripts: hash chain intact, head signed with the party's key",
                "every send matched one receipt on the link (sequence number, SHA-256, size)",
                f"sender's role in {list(d.sender)}, receiver's role in {list(d.receiver)}",
                ("every record's arrays (dtype, shape) against the payload schema" if schema
                 else "no payload schema: only kind and roles checked"),
            ]
        out.append({"kind": k["kind"], "links": list(k["links"].values()), "count": k["count"], "bytes": k["bytes"],
                    "protects": protects, "what": what, "schema": schema, "checks": checks,
                    "bad": k["bad"], "problems": k["problems"]})
    return out


def _flow(messages: list[dict]) -> list[dict]:
    """Per round, the messages in time order, consecutive ones of one kind and link merged."""
    rounds: dict[Any, list[dict]] = defaultdict(list)
    order: list = []
    for m in messages:
        r = m["round"]
        if r not in rounds:
            order.append(r)
        steps = rounds[r]
        last = steps[-1] if steps else None
        if last is not None and (last["kind"], last["from"], last["to"]) == (m["kind"], m["from_role"], m["to_role"]) \
                and bool(last["problems"]) == bool(m["problems"]):
            last["count"] += 1
            last["parties"] = sorted(set(last["parties"]) | {f"{m['from']} -> {m['to']}"})[:12]
            last["bytes"] += m["bytes"]
            last["problems"] += [p for p in m["problems"] if p not in last["problems"]][:10]
        else:
            steps.append({"kind": m["kind"], "from": m["from_role"], "to": m["to_role"], "count": 1,
                          "parties": [f"{m['from']} -> {m['to']}"],
                          "bytes": m["bytes"], "problems": list(m["problems"])})
    keep = order if len(order) <= MAX_ROUNDS else order[:MAX_ROUNDS // 2] + order[-MAX_ROUNDS // 2:]
    return [{"round": r, "steps": rounds[r][:MAX_STEPS], "more": max(0, len(rounds[r]) - MAX_STEPS)} for r in keep]


def _curves(path: Path) -> list[dict]:
    """Per metric of metrics.jsonl, one series per party over rounds (or epochs)."""
    series: dict[str, dict[str, dict]] = defaultdict(dict)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        party = str(row.get("party", "?"))
        x = number(row.get("epoch", row.get("round")))
        for k, v in row.items():
            y = number(v)
            if y is None or k in NOT_METRICS or k.endswith("_s") or k.startswith("bytes") or k.startswith("n_"):
                continue
            s = series[k].setdefault(party, {"party": party, "x": [], "y": []})
            s["x"].append(x if x is not None else len(s["x"]))
            s["y"].append(y)
    return [{"metric": k, "series": list(v.values())} for k, v in series.items()]


def _phases(result: dict, messages: list[dict]) -> dict:
    """Seconds per phase and party (the ``*_s`` results each party reports, and its wall time) and
    bytes sent per phase and party (from the transcripts: a kind's phase is its prefix)."""
    time: dict[str, dict[str, float]] = {}
    parties: dict = result["parties"] if isinstance(result.get("parties"), dict) else {}
    for name, s in parties.items():
        res: dict = s["result"] if isinstance(s, dict) and isinstance(s.get("result"), dict) else {}
        row = {k[:-2]: float(v) for k, v in res.items() if k.endswith("_s") and number(v) is not None}
        if number(s.get("wall_s")) is not None:
            row["wall"] = float(s["wall_s"])
        time[name] = row
    sent: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for m in messages:
        sent[m["from"]][phase_of(m["kind"])] += m["bytes"]
    return {"time": time, "bytes_sent": {p: dict(v) for p, v in sent.items()}}
