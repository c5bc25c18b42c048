"""F³ at 207 and 325 owners as real parties (presets f3_metr_la, f3_pems_bay: owners in 4 host processes,
coordinator and holders in their own), shamir vs trusted fusion side by side, every run audited.

Reported per run: upload wall time (slowest owner: share + send, or send in the clear), bytes each owner
sent and the total, peak RSS per process (hosts' own reports, the coordinator's and holders' from the
launcher's summary where available) and in total, and the coordinator's fusion time per epoch (training
steps only, ``train_s``, and with validation, ``epoch_s``).  Goals of issue 12: shamir ≤ 5x trusted per
epoch at 207 owners; upload bytes ≤ m x plaintext + 5 %.  The traffic windows are SIMULATED on the real
road graphs; local pre-training is cut short (``--local-epochs``) because only the fusion is measured.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks import harness

PRESETS = {207: "f3_metr_la", 325: "f3_pems_bay"}


def one(n: int, fusion: str, local_epochs: int, epochs: int, graph: str) -> dict:
    fed = harness.preset(PRESETS[n])
    if fusion == "trusted":
        from dataclasses import replace
        fed = replace(fed, parties=[p for p in fed.parties if p.role != "holder"])
    over = {"fusion": fusion, "local_epochs": local_epochs, "epochs": epochs, "patience": epochs, "graph": graph,
            "test_samples": 2}
    import tempfile
    rdir = Path(tempfile.mkdtemp(prefix=f"f3-scale-{n}-{fusion}-"))
    run = harness.launch_audited(fed, overrides=over, run_dir=rdir, timeout=3600)
    res = run.results
    owners = {k: v for k, v in res.items() if k.startswith("s")}
    coord = res["coordinator"]
    hosts = {}
    for f in sorted((rdir / "hosts").glob("*.json")):
        try:
            h = json.loads(f.read_text())
        except ValueError:
            continue
        hosts[f.stem] = h
    rss_hosts = {k: _rss_mb(h) for k, h in hosts.items()}
    sent = [o["bytes_sent"] for o in owners.values()]
    return {"n_owners": n, "fusion": fusion, "graph": graph, "audit_ok": run.audit_ok,
            "audit_problems": run.audit_problems[:5], "wall_s": run.wall_s, "cpu_s": run.cpu_s,
            "upload_max_s": max(o["upload_s"] for o in owners.values()),
            "bytes_per_owner": float(np.mean(sent)), "bytes_owners_total": int(np.sum(sent)),
            "train_s_per_epoch": float(np.mean([h["train_s"] for h in coord["history"]])),
            "epoch_s": float(np.mean(coord["epoch_s"])), "test_f1": coord["test"]["f1"],
            "test_auc": coord["test"]["auc"], "max_fixed_point_err": coord.get("max_fixed_point_err"),
            "rss_mb_hosts": rss_hosts, "rss_mb_total_hosts": float(sum(v for v in rss_hosts.values() if v))}


def _rss_mb(h: dict) -> float | None:
    for k in ("peak_rss_mb", "rss_mb", "peak_rss_mib"):
        if k in h:
            return float(h[k])
    if "peak_rss_bytes" in h:
        return h["peak_rss_bytes"] / 2 ** 20
    return None


def render(doc) -> str:
    lines = ["# F³ at scale: shamir vs trusted fusion as processes", "",
             "Traffic windows SIMULATED on the real METR-LA (207) / PEMS-BAY (325) road graphs (synthetic data); "
             f"owners in 4 host processes; local pre-training {doc['local_epochs']} epochs, global "
             f"{doc['epochs']} epochs, graph {doc['graph']}, batch 100, 2-of-3 Shamir.  Accuracy is incidental "
             "here (short training); the tables of merit are benchmarks/results/f3_tables.md.", "",
             "| owners | fusion | upload (slowest owner) s | bytes / owner | bytes all owners | fusion train s / epoch | "
             "epoch s (with validation) | RSS of owner hosts, total MiB | audit |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["runs"]:
        lines.append(f"| {r['n_owners']} | {r['fusion']} | {r['upload_max_s']:.2f} | {r['bytes_per_owner']:,.0f} | "
                     f"{r['bytes_owners_total']:,} | {r['train_s_per_epoch']:.2f} | {r['epoch_s']:.2f} | "
                     f"{r['rss_mb_total_hosts']:.0f} | {'ok' if r['audit_ok'] else r['audit_problems']} |")
    lines.append("")
    if doc.get("note"):
        lines += [f"**Note:** {doc['note']}", ""]
    for n in sorted({r["n_owners"] for r in doc["runs"]}):
        by = {r["fusion"]: r for r in doc["runs"] if r["n_owners"] == n}
        if {"shamir_linear", "trusted"} <= set(by):
            s, t = by["shamir_linear"], by["trusted"]
            lines.append(f"- {n} owners: shamir / trusted fusion time per epoch {s['train_s_per_epoch'] / t['train_s_per_epoch']:.2f}x "
                         f"(goal ≤ 5x); upload bytes per owner {s['bytes_per_owner'] / t['bytes_per_owner']:.3f}x the "
                         "plaintext upload (goal ≤ m + 5 % = 3.15x)")
    lines += ["", harness.environment_line(doc["environment"])]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__), render_only=True)
    ap.add_argument("--owners", type=int, nargs="+", default=None, choices=sorted(PRESETS))
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--graph", default="icdf", choices=("none", "given", "icdf"))
    a = ap.parse_args(argv)
    out = harness.Output("f3_scale", a.quick, a.out)
    if a.render_only:
        doc = out.read()
        out.write(doc, render(doc))
        return
    sess = harness.Session("f3_scale", __file__, argv)
    owners = a.owners or ([207] if a.quick else [207, 325])
    doc = {"local_epochs": a.local_epochs, "epochs": a.epochs, "graph": a.graph, "runs": [],
           "data": "synthetic (simulated on the real road graph)"}
    try:   # keep the other owner counts' rows measured with the same budgets
        old = out.read()
        if all(old.get(k) == doc[k] for k in ("local_epochs", "epochs", "graph")):
            doc["runs"] = [r for r in old.get("runs", []) if r["n_owners"] not in owners]
            if doc["runs"]:   # the note describes rows measured before; it goes when they all are re-measured
                doc["note"] = old.get("note")
    except (FileNotFoundError, ValueError):
        pass
    for n in owners:
        for fusion in ("trusted", "shamir_linear"):
            doc["runs"].append(one(n, fusion, a.local_epochs, a.epochs, a.graph))
            doc["runs"].sort(key=lambda r: (r["n_owners"], r["fusion"] != "trusted"))
            doc["environment"] = sess.finish()
            out.write(doc, render(doc))        # partial results survive an interrupted sweep
            print(render(doc), flush=True)


if __name__ == "__main__":
    main()
