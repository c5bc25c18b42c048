"""Encrypted against plaintext on simulated networks (issue 48): smoke federations at loopback, LAN
and WAN as processes, and the network cost model's prediction from the loopback run.

Each cell (an algorithm with one protection) runs three times through the real launcher: on
loopback, then with ``[federation] network = "lan"`` (0.5 ms round trip, 1 Gbit/s) and ``"wan"``
(50 ms, 100 Mbit/s), every message crossing the emulated link after CURVE
(:mod:`fedhet.parties.netlink`).  The loopback run's transcripts go through the cost model
(:mod:`fedhet.parties.ops.netmodel`), whose predicted times stand next to the measured ones.

Each profile runs ``--repeats`` times, interleaved, and the run of the least span is kept (the noise
of a shared machine only adds time); the model predicts from the loopback run kept.  Two times per run: ``wall`` (the launcher's, process start to the last exit: includes start-up, which
no network changes) and ``span`` (from the moment every party's role ran to the last party's end:
``netmodel.Trace.span_s``).  The model's error is on the span.  The machine is shared: its load is recorded per run, and
the compute inside a span varies with it as much as the network does at LAN.

    python -m benchmarks.network_matrix            # every cell
    python -m benchmarks.network_matrix --cells fedavg_plain psi_ecdh
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
    "stfl": ("stfl", "synthetic latents (one shot)", {}),
    "he_split_paillier": ("he_split", "Paillier HE split", {}),
    "psi_ecdh": ("psi", "PSI ECDH", {"psi_backend": "ecdh"}),
}
DATA = {"fedavg_logreg": "real: breast cancer (packaged)", "stfl": "real: breast cancer (packaged)",
        "he_split": "real: breast cancer (packaged)", "psi": "synthetic IDs"}


def smoke(algorithm: str):
    module = installed_entry_points()[algorithm].module
    return load(Path(str(resources.files(module) / "smoke.toml")))


def run_one(fed, network: str) -> tuple[dict, netmodel.Trace]:
    rdir = Path(tempfile.mkdtemp(prefix=f"netmatrix-{fed.algorithm_name}-{network}-"))
    try:
        load0 = harness.loadavg()
        r = harness.launch_audited(replace(fed, network=network), run_dir=rdir)
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
                 "overrides": keys, "runs": {}, "predicted": {}}
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
    except Exception as e:   # noqa: BLE001 - one cell's failure is a row, not the end of the table
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


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
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), render_only=True)
    ap.add_argument("--repeats", type=int, default=2, help="runs per profile, interleaved; the least span kept")
    ap.add_argument("--cells", nargs="*", default=None, choices=sorted(CELLS), help="only these (default: all)")
    args = ap.parse_args(argv)
    out = harness.Output(NAME, args.quick, args.out)
    if args.render_only:
        harness.render_only(out, markdown)
        return 0
    session = harness.Session(NAME, __file__, argv)
    cells = args.cells or list(CELLS)
    doc: dict = {"profiles": {"lan": [0.5, 1000], "wan": [50, 100]}, "repeats": args.repeats, "rows": []}
    if args.cells and out.path("json").is_file():   # re-measure these cells, keep the others' rows
        doc = out.read()
        env = doc.get("environment") or {}
        for r in doc["rows"]:   # the rows kept say when and at which commit they were measured
            r.setdefault("measured", {"started": env.get("started"), "commit": env.get("git_commit"),
                                      "dirty": env.get("git_dirty")})
    for cell in cells:
        row = dict(measure(cell, args.repeats), measured={"started": harness._now(), **harness.git_commit()})
        doc["rows"] = [r for r in doc["rows"] if r["cell"] != cell] + [row]
        doc["rows"].sort(key=lambda r: list(CELLS).index(r["cell"]))
        doc["not_run"] = [c for c in CELLS if c not in {r["cell"] for r in doc["rows"]}]
        print(row, flush=True)
        doc["environment"] = session.finish()
        out.write(doc, markdown(doc))
    return harness.publish(out, doc, markdown, session)


if __name__ == "__main__":
    raise SystemExit(main())
