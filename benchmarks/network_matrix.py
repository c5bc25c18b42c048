"""Encrypted against plaintext on simulated networks (issue 48): smoke federations at loopback, LAN
and WAN as processes, and the network cost model's prediction from the loopback run.

Each cell (an algorithm's smoke federation, ``algorithms/*/smoke.toml``, with one of its protections:
:data:`CELLS`) runs three times through the real launcher: on loopback, then with ``[federation] network
= "lan"`` (0.5 ms round trip, 1 Gbit/s) and ``"wan"`` (50 ms, 100 Mbit/s), every message crossing the
emulated link after CURVE (:mod:`fedhet.parties.netlink`); every run must pass the audit.  The loopback
run's transcripts go through the cost model (:mod:`fedhet.parties.ops.netmodel`), whose predicted times
stand next to the measured ones.  Every algorithm is in: FedAvg, CHFL and HyFEM with plain and secure
aggregation, STFL, the HE split network with Paillier and with CKKS, MMVFL (secure aggregation of Z),
F³ with fusion "mpc" and "shares", PSI with the ECDH, KKRT16 and RR22 backends, the Shamir job and the
secure-aggregation job.  Left out: F³'s "shamir_linear" and "trusted" fusions (not protections the issue
lists), HE split's "naive" Paillier (the same protection as "paillier", unpacked), MMVFL with plain
aggregation (its smoke's protection is secure aggregation).

Each profile runs ``--repeats`` times, interleaved, and the run of the least span is kept (the noise
of a shared machine only adds time); the model predicts from the loopback run kept.  Two times per run:
``wall`` (the launcher's, process start to the last exit: includes start-up, which no network changes)
and ``span`` (from the moment every party's role ran to the last party's end: ``netmodel.Trace.span_s``).
The model's error is on the span.  The machine is shared: its load is recorded per run, and the compute
inside a span varies with it as much as the network does at LAN.

"What to pick" (:func:`pick`): the model also replays each cell's loopback run over a grid of round
trips (0..1000 ms) and bandwidths (1..10,000 Mbit/s) (:func:`fedhet.parties.ops.netmodel.sweep`), stored
per cell as ``sweep_span_s``; per task (:data:`TASKS`) the tables say which cell is cheapest measured at
each profile and along the sweep, and where one cell overtakes another (or beats it by a factor:
:data:`FACTORS`), all computed from the stored spans (:func:`fedhet.parties.ops.netmodel.crossover`).
The figure (``network_matrix.png``) has a panel per algorithm (span measured and predicted) and one per
task (the model's span against the round trip).

    python -m benchmarks.network_matrix            # every cell
    python -m benchmarks.network_matrix --cells fedavg_plain psi_ecdh
    python -m benchmarks.network_matrix --render-only   # the markdown and the figure from the JSON
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import replace
from importlib import resources
from pathlib import Path

from benchmarks import harness
from fedhet.parties.contract import installed_entry_points
from fedhet.parties.federation import load
from fedhet.parties.ops import netmodel

NAME = "network_matrix"
PROFILES = ("loopback", "lan", "wan")
# cell -> (algorithm, protection shown, [algorithm] keys over its smoke federation)
CELLS: dict[str, tuple[str, str, dict]] = {
    "fedavg_plain": ("fedavg_logreg", "plain aggregation", {"aggregation": "plain"}),
    "fedavg_secure": ("fedavg_logreg", "secure aggregation", {"aggregation": "secure"}),
    "chfl_plain": ("chfl", "plain aggregation", {"aggregation": "plain"}),
    "chfl_secure": ("chfl", "secure aggregation", {"aggregation": "secure"}),
    "hyfem_plain": ("hyfem", "plain aggregation", {"aggregation": "plain"}),
    "hyfem_secure": ("hyfem", "secure aggregation", {"aggregation": "secure"}),
    "stfl": ("stfl", "synthetic latents (one shot)", {}),
    "he_split_paillier": ("he_split", "Paillier HE split", {}),
    "he_split_ckks": ("he_split", "CKKS HE split", {"he": "ckks"}),
    "mmvfl_secure": ("mmvfl", "secure aggregation of Z", {"aggregation": "secure"}),
    "f3_mpc": ("f3", "fusion mpc (replicated shares)", {"fusion": "mpc"}),
    "f3_shares": ("f3", "fusion shares (trained on shares)", {"fusion": "shares"}),
    "psi_ecdh": ("psi", "PSI ECDH", {"psi_backend": "ecdh"}),
    "psi_kkrt": ("psi", "PSI KKRT16", {"psi_backend": "kkrt"}),
    "psi_rr22": ("psi", "PSI RR22", {"psi_backend": "rr22"}),
    "shamir": ("shamir", "Shamir 2-of-3 sharing", {}),
    "secagg": ("secagg_bench", "secure aggregation job", {}),
}
# what each smoke federation loads (real: the paper's data or the same public data; stand-in: real data in
# place of a set not stored; synthetic: generated)
DATA = {"fedavg_logreg": "real: breast cancer (packaged)",
        "chfl": "stand-in: digits (packaged) for the paper's tables",
        "hyfem": "stand-in: digits quadrants (packaged) for ModelNet40",
        "stfl": "real: breast cancer (packaged)",
        "he_split": "real: breast cancer (packaged)",
        "mmvfl": "stand-in: digits quadrants (packaged) for the paper's sets",
        "f3": "synthetic: traffic simulated on a 4 x 4 grid",
        "psi": "synthetic IDs",
        "shamir": "synthetic: seeded random matrices",
        "secagg_bench": "synthetic: uniform random vectors"}
# "what to pick": the cells compared per task
TASKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("horizontal: FedAvg", ("fedavg_plain", "fedavg_secure")),
    ("horizontal: CHFL", ("chfl_plain", "chfl_secure")),
    ("horizontal: HyFEM", ("hyfem_plain", "hyfem_secure")),
    ("vertical training", ("stfl", "he_split_paillier", "he_split_ckks", "mmvfl_secure", "f3_mpc", "f3_shares")),
    ("alignment (PSI)", ("psi_ecdh", "psi_kkrt", "psi_rr22")),
)
# crossovers by a factor: (a, b, k): where a's span is k times below b's
FACTORS: tuple[tuple[str, str, float], ...] = (
    ("stfl", "he_split_paillier", 100.0), ("stfl", "he_split_paillier", 10.0),
    ("fedavg_plain", "fedavg_secure", 2.0), ("chfl_plain", "chfl_secure", 2.0),
    ("hyfem_plain", "hyfem_secure", 2.0),
)
# the sweep's lines the "what to pick" tables read: round trips at these bandwidths, bandwidths at these RTTs
PICK_MBIT = (100.0, 1000.0)
PICK_RTT_MS = (0.5, 50.0)


def smoke(algorithm: str):
    module = installed_entry_points()[algorithm].module
    return load(Path(str(resources.files(module) / "smoke.toml")))


def run_one(fed, network: str) -> tuple[dict, netmodel.Trace]:
    rdir = Path(tempfile.mkdtemp(prefix=f"netmatrix-{fed.algorithm_name}-{network}-"))
    try:
        load0 = harness.loadavg()
        r = harness.launch_audited(replace(fed, network=network), run_dir=rdir)
        if not r.audit_ok:
            raise RuntimeError(f"{network}: the audit failed: {'; '.join(r.audit_problems)[:300]}")
        trace = netmodel.load(rdir)
        parties = r.summary["parties"]
        held = sum((p.get("traffic", {}).get("link") or {}).get("held_s", 0.0) for p in parties.values())
        return {"network": network, "wall_s": r.summary.get("wall_s"), "span_s": trace.span_s,
                "bytes": r.summary.get("bytes_total"), "audit_ok": r.audit_ok,
                "messages": sum(len([x for x in rec if x["dir"] == "send"]) for rec in trace.records.values()),
                "link_held_s": held, "loadavg": [load0, harness.loadavg()]}, trace
    finally:
        shutil.rmtree(rdir, ignore_errors=True)


def measure(cell: str, repeats: int = 1) -> dict:
    algorithm, protection, keys = CELLS[cell]
    fed = smoke(algorithm)
    fed = replace(fed, algorithm={**fed.algorithm, **keys})
    row: dict = {"cell": cell, "algorithm": algorithm, "protection": protection, "data": DATA.get(algorithm, ""),
                 "overrides": keys, "repeats": repeats, "runs": {}, "predicted": {}}
    try:
        # interleaved repeats; per profile the run of the least span (a loaded machine only adds time)
        best: dict[str, tuple[dict, netmodel.Trace]] = {}
        spans: dict[str, list[float]] = {net: [] for net in PROFILES}
        for _ in range(repeats):
            for net in PROFILES:
                m, trace = run_one(fed, net)
                spans[net].append(m["span_s"])
                if net not in best or m["span_s"] < best[net][0]["span_s"]:
                    best[net] = (m, trace)
        base, trace = best["loopback"]
        for net in PROFILES:
            row["runs"][net] = dict(best[net][0], spans_s=spans[net])
        for net in PROFILES[1:]:
            p = netmodel.predict(trace, net)
            row["predicted"][net] = {"wall_s": (base["wall_s"] or 0.0) + p.added_s, "span_s": base["span_s"] + p.added_s,
                                     "added_s": p.added_s, "on_link_s": p.on_link_s}
            m = row["runs"][net]
            pred = row["predicted"][net]["span_s"]
            m["model_error"] = (pred - m["span_s"]) / m["span_s"] if m["span_s"] else None
        # the model over the sweep's grid (rtt x bandwidth), from the loopback run kept
        row["sweep_span_s"] = [[round(x, 6) for x in line] for line in netmodel.sweep(trace)]
    except Exception as e:   # noqa: BLE001 - one cell's failure is a row, not the end of the table
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def over_bound_line(doc: dict, bound: float = 0.15) -> str:
    """Which cells' model error exceeds the issue's bound (15 %), as one sentence."""
    over = [f"{r['cell']} at {net} ({m['model_error']:+.0%})" for r in doc["rows"] for net, m in r["runs"].items()
            if m.get("model_error") is not None and abs(m["model_error"]) > bound]
    n = sum(1 for r in doc["rows"] for m in r["runs"].values() if m.get("model_error") is not None)
    return (f"Cells whose model error exceeds {bound:.0%}: {len(over)} of {n}" + (": " + ", ".join(over) if over else "")
            + ".")


def remeasured_line(doc: dict) -> str:
    """The cells measured apart from the run that wrote the file, with the errors of the rows they replaced."""
    parts = []
    for r in doc["rows"]:
        if not r.get("earlier"):
            continue
        e = r["earlier"][-1]
        errs = ", ".join(f"{n} {x:+.0%}" for n, x in e["model_error"].items() if x is not None)
        load = max((x[0] for x in e["loadavg"].values() if x and x[0] is not None), default=None)
        parts.append(f"{r['cell']} ({r.get('repeats')} repeats, started {(r.get('measured') or {}).get('started')}; "
                     f"the row it replaced, {e.get('repeats')} repeats at load up to {harness.dash(load)}: model error "
                     f"{errs or '-'})")
    return ("Cells re-measured apart from the others: " + "; ".join(parts) + ".") if parts else ""


def markdown(doc: dict) -> str:
    lines = ["# Encrypted against plaintext on simulated networks", "",
             "Smoke federations as processes over CURVE, with every message crossing an emulated link "
             "(`[federation] network`; LAN = 0.5 ms RTT, 1 Gbit/s; WAN = 50 ms RTT, 100 Mbit/s). "
             "wall: launcher, process start to last exit; span: from the moment every party's role ran to the "
             "last party's end; "
             "predicted: the cost model replaying the loopback run's transcripts; error = (predicted - "
             f"measured) / measured span. Each profile ran {doc.get('repeats', 1)} time(s), interleaved; the run of "
             "the least span is shown (and the model predicts from the loopback run of the least span).", "",
             "| cell (data) | network | wall s | span s | predicted span s | error | network share | MB | "
             "messages | load |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        label = f"{r['algorithm']}: {r['protection']} ({r['data']})"
        if "error" in r:
            lines.append(f"| {label} | failed: {r['error']} |||||||||")
        for net in PROFILES:
            m = r["runs"].get(net)
            if m is None:
                continue
            pred = r["predicted"].get(net)
            err = m.get("model_error")
            share = pred["added_s"] / pred["span_s"] if pred and pred["span_s"] else None
            lines.append(
                f"| {label} | {net} | {harness.dash(m['wall_s'], '{:.2f}')} | {m['span_s']:.2f} | "
                f"{harness.dash(pred and pred['span_s'], '{:.2f}')} | {harness.dash(err, '{:+.0%}')} | "
                f"{harness.dash(share, '{:.0%}')} | {(m['bytes'] or 0) / 1e6:.3f} | {m['messages']} | "
                f"{m['loadavg'][0]:.1f} |")
    if doc.get("not_run"):
        lines += ["", "Cells not run: " + ", ".join(doc["not_run"]) + "."]
    lines += ["", over_bound_line(doc), *(["", remeasured_line(doc)] if remeasured_line(doc) else [])]
    lines += ["", f"![span per algorithm, measured and predicted]({NAME}.png)", "", "## What to pick", "",
              *pick_lines(doc)]
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), render_only=True)
    ap.add_argument("--repeats", type=int, default=2, help="runs per profile, interleaved; the least span kept")
    ap.add_argument("--cells", nargs="*", default=None, choices=sorted(CELLS), help="only these (default: all)")
    args = ap.parse_args(argv)
    out = harness.Output(NAME, args.quick, args.out)
    if args.render_only:
        harness.render_only(out, markdown, figure)
        return 0
    session = harness.Session(NAME, __file__, argv)
    cells = args.cells or list(CELLS)
    doc: dict = {"profiles": {"lan": [0.5, 1000], "wan": [50, 100]}, "repeats": args.repeats, "rows": []}
    sweep = {"rtt_ms": list(netmodel.SWEEP_RTT_MS), "mbit_s": list(netmodel.SWEEP_MBIT)}
    if args.cells and out.path("json").is_file():   # re-measure these cells, keep the others' rows
        doc = out.read()
        if doc.get("sweep", sweep) != sweep:   # rows of another grid cannot stand in one table
            raise SystemExit(f"{out.path('json')}: its sweep grid differs from this code's: re-measure every cell")
        env = doc.get("environment") or {}
        for r in doc["rows"]:   # the rows kept say when and at which commit they were measured
            r.setdefault("measured", {"started": env.get("started"), "commit": env.get("git_commit"),
                                      "dirty": env.get("git_dirty")})
    for cell in cells:
        row = dict(measure(cell, args.repeats), measured={"started": harness._now(), **harness.git_commit()})
        old = [r for r in doc["rows"] if r["cell"] == cell]
        if old:   # what the row replaced stays on record: a re-measured cell shows its earlier errors too
            row["earlier"] = [*old[0].get("earlier", []), {
                "measured": old[0].get("measured"), "repeats": old[0].get("repeats", doc.get("repeats")),
                "model_error": {n: m.get("model_error") for n, m in old[0].get("runs", {}).items()},
                "span_s": {n: m.get("span_s") for n, m in old[0].get("runs", {}).items()},
                "loadavg": {n: m.get("loadavg") for n, m in old[0].get("runs", {}).items()}}]
        doc["rows"] = [r for r in doc["rows"] if r["cell"] != cell] + [row]
        doc["rows"].sort(key=lambda r: list(CELLS).index(r["cell"]))
        doc["not_run"] = [c for c in CELLS if c not in {r["cell"] for r in doc["rows"]}]
        print(row, flush=True)
        doc["sweep"] = sweep
        doc["environment"] = session.finish()
        out.write(doc, markdown(doc), figure(doc))
    print(markdown(doc))
    return 0


# ------------------------------------------------------------------------------ what to pick

def curve(doc: dict, cell: str, *, mbit: float | None = None, rtt_ms: float | None = None
          ) -> tuple[list[float], list[float]]:
    """The model's spans of ``cell`` from the stored sweep: along the round trips (ms) at bandwidth ``mbit``,
    or along the bandwidths at round trip ``rtt_ms`` (then x is seconds per Mbit, 1 / Mbit/s, from the
    fastest link to the slowest: a span is linear in it between the model's breakpoints)."""
    grid = doc["sweep"]
    spans = next(r for r in doc["rows"] if r["cell"] == cell)["sweep_span_s"]
    if mbit is not None:
        j = grid["mbit_s"].index(mbit)
        return list(grid["rtt_ms"]), [line[j] for line in spans]
    i = grid["rtt_ms"].index(rtt_ms)
    order = sorted(range(len(grid["mbit_s"])), key=lambda j: -grid["mbit_s"][j])
    return [1.0 / grid["mbit_s"][j] for j in order], [spans[i][j] for j in order]


def _lines() -> list[tuple[str, dict]]:
    """The sweep's lines the tables read: (column title, ``curve`` keywords)."""
    return ([(f"RTT at {m:g} Mbit/s", {"mbit": m}) for m in PICK_MBIT]
            + [(f"bandwidth at {r:g} ms", {"rtt_ms": r}) for r in PICK_RTT_MS])


def _at(x: float, kw: dict) -> str:
    """A point of a line as text: a round trip, or the bandwidth of seconds per Mbit ``x``."""
    return f"{x:.3g} ms" if "mbit" in kw else f"{1.0 / x:.3g} Mbit/s"


def pick(doc: dict) -> dict:
    """The "what to pick" figures, computed from the results: per task, the least measured span at each
    profile and the model's cheapest cell along each of the sweep's lines (with the crossovers between
    them); per ordered pair of a task's cells, where the dearer one at loopback overtakes the other along
    each line; per :data:`FACTORS` entry, where a's span falls ``k`` times below b's."""
    done = {r["cell"]: r for r in doc["rows"] if "sweep_span_s" in r}
    lines = _lines()
    tasks, pairs, factors = [], [], []
    for task, cells in TASKS:
        cells = tuple(c for c in cells if c in done)
        if not cells:
            continue
        measured = {}
        for net in PROFILES:
            spans = sorted((done[c]["runs"][net]["span_s"], c) for c in cells)
            measured[net] = {"cell": spans[0][1], "span_s": spans[0][0],
                             "next": spans[1][1] if len(spans) > 1 else None,
                             "next_ratio": spans[1][0] / spans[0][0] if len(spans) > 1 and spans[0][0] else None}
        along = {}
        for title, kw in lines:
            curves = {c: curve(doc, c, **kw)[1] for c in cells}
            xs = curve(doc, cells[0], **kw)[0]
            along[title] = [{"x": x, "at": _at(x, kw), "cell": c} for x, c in netmodel.cheapest(xs, curves)]
        tasks.append({"task": task, "cells": list(cells), "measured": measured, "cheapest": along})
        for a in cells:
            for b in cells:
                if a == b or done[a]["runs"]["loopback"]["span_s"] <= done[b]["runs"]["loopback"]["span_s"]:
                    continue
                pairs.append({"task": task, "a": a, "b": b, "factor": 1.0, **_crossings(doc, a, b, 1.0, lines)})
    for a, b, k in FACTORS:
        if a in done and b in done:
            factors.append({"a": a, "b": b, "factor": k, **_crossings(doc, a, b, k, lines)})
    return {"tasks": tasks, "pairs": pairs, "factors": factors}


def _crossings(doc: dict, a: str, b: str, k: float, lines) -> dict:
    out, ratios = {}, {}
    for title, kw in lines:
        xs, ya = curve(doc, a, **kw)
        yb = curve(doc, b, **kw)[1]
        x = netmodel.crossover(xs, ya, yb, k)
        out[title] = None if x is None else {"x": x, "at": _at(x, kw), "from_start": x == xs[0]}
        ratios[title] = [yb[0] / ya[0], yb[-1] / ya[-1]]   # b over a at the line's two ends
    return {"crossover": out, "ratio_ends": ratios}


def _where(c: dict | None, kw: dict) -> str:
    if c is None:
        return "never" + (" up to 1000 ms" if "mbit" in kw else " down to 1 Mbit/s")
    if c["from_start"]:
        return "already at " + ("0 ms" if "mbit" in kw else "10,000 Mbit/s")
    return ("from " if "mbit" in kw else "below ") + c["at"]


def pick_lines(doc: dict, only_crossing: bool = False) -> list[str]:
    """The "what to pick" tables as markdown lines (``only_crossing``: of the pairs, only those that cross
    somewhere on the sweep's lines)."""
    if "sweep" not in doc:
        return []
    p = pick(doc)
    lines = _lines()
    head = ["task", *(f"measured at {net}" for net in PROFILES), *(f"model along {t}" for t, _ in lines)]
    rows = []
    for t in p["tasks"]:
        cells = [t["task"]]
        for net in PROFILES:
            m = t["measured"][net]
            nxt = f"; next {m['next']} x{m['next_ratio']:.2f}" if m["next"] else ""
            cells.append(f"{m['cell']} ({m['span_s']:.2f} s{nxt})")
        for title, kw in lines:
            stretch = t["cheapest"][title]
            cells.append("; ".join([stretch[0]["cell"]] + [
                f"{s['cell']} {'from' if 'mbit' in kw else 'below'} {s['at']}" for s in stretch[1:]]))
        rows.append(cells)
    shown = [x for x in p["pairs"] if not only_crossing or any(
        c is not None and not c["from_start"] for c in x["crossover"].values())]
    out = ["Per task: the cell of least span measured at each profile (and how much dearer the next one was), then "
           "the model's cheapest cell along the sweep (the loopback run's transcripts replayed at round trips of "
           "0..1000 ms and bandwidths of 1..10,000 Mbit/s), with the points where the cheapest changes. Cells of "
           "one task can differ in data and model (see each row above): the comparison is of the smoke runs.", "",
           *_md_table(head, rows), "",
           "Crossovers (model): where the cell dearer at loopback (a) becomes no dearer than b, along each line "
           "(b / a: the span ratio at the line's two ends)"
           + (f"; pairs that never cross: {len(p['pairs']) - len(shown)} (in `network_matrix.md`)" if only_crossing
              else "") + ".", ""]
    head2 = ["task", "a", "b", *(t for t, _ in lines), *(f"b / a along {t}" for t, _ in lines)]
    rows2 = [[x["task"], x["a"], x["b"], *(_where(x["crossover"][t], kw) for t, kw in lines),
              *(f"{x['ratio_ends'][t][0]:.2g} .. {x['ratio_ends'][t][1]:.2g}" for t, _ in lines)] for x in shown]
    out += _md_table(head2, rows2)
    if p["factors"]:
        head3 = ["a beats b by", "a", "b", *(t for t, _ in lines), *(f"b / a along {t}" for t, _ in lines)]
        rows3 = [[f"{x['factor']:g}x", x["a"], x["b"], *(_where(x["crossover"][t], kw) for t, kw in lines),
                  *(f"{x['ratio_ends'][t][0]:.2g} .. {x['ratio_ends'][t][1]:.2g}" for t, _ in lines)]
                 for x in p["factors"]]
        out += ["", "Factors (model): where a's span falls k times below b's.", "", *_md_table(head3, rows3)]
    return out


def _md_table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]


# ------------------------------------------------------------------------------ the figure

def figure(doc: dict):
    """One panel per algorithm (span at loopback, LAN and WAN: bars measured, black marks the model's) and
    one per task of the model's span against the round trip at 100 Mbit/s."""
    plt = harness.pyplot()
    rows = [r for r in doc["rows"] if r.get("runs")]
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    groups = [("horizontal", [c for t, cs in TASKS if t.startswith("horizontal") for c in cs]),
              *((t, list(cs)) for t, cs in TASKS if not t.startswith("horizontal"))]
    n = len(algorithms) + len(groups)
    ncol = 4
    fig, axes = plt.subplots((n + ncol - 1) // ncol, ncol, figsize=(4.2 * ncol, 3.4 * ((n + ncol - 1) // ncol)),
                             layout="constrained", squeeze=False)
    flat = list(axes.flat)
    for ax, alg in zip(flat, algorithms):
        mine = [r for r in rows if r["algorithm"] == alg]
        width = 0.8 / len(mine)
        for k, r in enumerate(mine):
            xs = [i + (k - (len(mine) - 1) / 2) * width for i in range(len(PROFILES))]
            ax.bar(xs, [r["runs"][net]["span_s"] for net in PROFILES], width, label=r["protection"])
            pred = [(x, r["predicted"][net]["span_s"]) for x, net in zip(xs, PROFILES) if net in r["predicted"]]
            ax.plot([x for x, _ in pred], [y for _, y in pred], "k_", markersize=14, markeredgewidth=2)
        ax.set_xticks(range(len(PROFILES)), PROFILES)
        ax.set_title(alg)
        ax.set_ylabel("span s")
        ax.legend(fontsize="x-small")
    grid = doc.get("sweep")
    for ax, (title, cells) in zip(flat[len(algorithms):], groups):
        for c in cells:
            if grid and any(r["cell"] == c and "sweep_span_s" in r for r in rows):
                xs, ys = curve(doc, c, mbit=100.0)
                ax.plot(xs[1:], ys[1:], label=c)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("RTT ms (100 Mbit/s)")
        ax.set_ylabel("model span s")
        ax.set_title(f"{title}: the model's sweep")
        if ax.get_lines():
            ax.legend(fontsize="x-small")
        else:
            ax.set_visible(False)
    for ax in flat[n:]:
        ax.set_visible(False)
    fig.suptitle("Span measured (bars) and predicted by the model (black marks) per algorithm; the sweep per task")
    return fig


if __name__ == "__main__":
    raise SystemExit(main())
