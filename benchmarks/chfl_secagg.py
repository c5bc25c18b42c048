"""Federated CHFL as real party processes: plain vs secure aggregation, and one row of Table II.

Every party is its own process over CURVE-encrypted ZeroMQ on loopback
(``fedhet.parties.ops.launcher.launch`` of the ``chfl`` preset: 1 server + 5 clients on covertype).

1. **Rounds.**  The same CHFL job (mu = 0.5, lr = 1e-3, E local epochs) with
   ``aggregation = "plain"`` (float64 on the wire, CHFL's default: exactly the in-process mean),
   ``"plain"`` with float32 (the bytes of a 32-bit ring), and ``"secure"`` (Bonawitz et al.,
   complete graph, 32-bit ring), run one after the other with the same seeds.  Per round: the
   server's wall time (broadcast of theta_c to the aggregate in hand), the clients' training time,
   and the aggregation latency = per round the smallest time any client spent in ``submit`` (the
   last client to finish training waits for nobody: it measures the protocol itself).  Round 0 is
   dropped (it pays torch's warm-up); figures are medians over the remaining rounds.  Bytes per
   client per round: what the audit counts on its aggregation messages (up) and on the global
   model plus aggregation messages it received (down).
2. **Table II row.**  Covertype, 5 clients, 30% common, feature split 0, seed 1000 -- the first run
   of ``benchmarks/chfl_tables.py`` -- as processes: one CHFL job carrying the mu = 0 head and every
   mu > 0 head (its common column is the Common baseline) and one Local
   job, each client choosing lr / mu / round on its own validation rows.  With secure aggregation
   and with plain aggregation.  Reference: the same run in ``results/chfl_tables.json`` when it
   is there with the same settings, else computed here by ``chfl_tables.sweep_roles`` (the same CHFL
   roles as threads on the in-memory transport).
   Plain must reproduce the reference exactly; secure differs by the quantisation of the mean
   (at most ``max_mean_error_bound`` per coordinate and round), which training then amplifies.

Every run goes through ``harness.launch_audited`` (the launcher, then ``fedhet audit``); the result
records whether the audit passed.

    python -m benchmarks.chfl_secagg --quick     # 3 rounds x E=1 timing, 3-round Table II row
    python -m benchmarks.chfl_secagg             # 5 rounds x E=5 timing, the full 20-round row

Writes ``benchmarks/results/chfl_secagg{,_quick}.{json,md}`` atomically.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from fedhet.algorithms import chfl as C

RESULTS = harness.RESULTS
GROUPS = ["common", "local", "chfl_mu0", "chfl_mu>0"]
HEAD = {"common": "Common", "local": "Local", "chfl_mu0": "CHFL μ=0", "chfl_mu>0": "CHFL μ>0"}
VARIANTS = {
    "plain": {"aggregation": "plain"},
    "plain-f32": {"aggregation": "plain", "plain_dtype": "float32"},
    "secure": {"aggregation": "secure"},
}
ROW = {"feature_seed": 0, "seed": 1000}
REF_ID = "covertype|K=5|r=0.3|fs=0|s=1000"


def _median(xs):
    return float(statistics.median(xs)) if xs else None


def run_job(overrides: dict, workdir: Path, keep: bool, label: str) -> dict:
    """One audited process run of the chfl preset; returns the server's result, the clients', audit."""
    run = harness.launch_audited("chfl", overrides=overrides, run_dir=workdir / label, timeout=3600)
    res = run.summary["parties"]
    out = {"server": res["server"]["result"],
           "clients": {n: r["result"] for n, r in res.items() if n != "server"},
           "traffic": run.traffic,
           "audit_ok": run.audit_ok, "audit_problems": run.audit_problems[:10], "audit_table": run.audit_table,
           "launch_wall_s": run.wall_s}
    if not keep:
        shutil.rmtree(workdir / label, ignore_errors=True)
    return out


AGG_PREFIXES = ("agg/", "secagg/")


def bytes_per_round(job: dict, rounds: int) -> dict:
    """Per client and round: aggregation bytes sent (up); global model + aggregation received (down)."""
    up, down = [], []
    clients = job["clients"]
    for name in clients:
        rows = [r for r in job["audit_table"] if r["party"] == name]
        up.append(sum(r["sent_bytes"] for r in rows if r["kind"].startswith(AGG_PREFIXES)))
        down.append(sum(r["received_bytes"] for r in rows
                        if r["kind"].startswith(AGG_PREFIXES) or r["kind"] == C.Kind.GLOBAL))
    return {"up": float(np.mean(up)) / rounds, "down": float(np.mean(down)) / rounds}


def timing_section(args, workdir: Path) -> dict:
    base = {"method": "chfl", "mu": 0.5, "lr": 1e-3, "rounds": args.t_rounds,
            "local_epochs": args.t_epochs, **ROW}
    out = {"settings": base, "rows": {}}
    for v in args.variants:
        print(f"[timing] {v}: {args.t_rounds} rounds x E={args.t_epochs}", flush=True)
        job = run_job({**base, **VARIANTS[v]}, workdir, args.keep, f"timing-{v}")
        s = job["server"]
        timed = slice(1, None) if args.t_rounds > 1 else slice(0, None)
        submit = np.asarray(s["client_submit_s"], dtype=float)   # (clients, rounds)
        train = np.asarray(s["client_train_s"], dtype=float)
        row = {
            "round_s": _median(s["round_s"][timed]),
            "train_s": _median(list(np.median(train[:, timed], axis=0))),
            "agg_latency_s": _median(list(submit.min(axis=0)[timed])),
            # the round beyond its slowest client's training: global model transfer, evaluation
            # and aggregation
            "beyond_training_s": _median(list((np.asarray(s["round_s"]) - train.max(axis=0))[timed])),
            "round_s_all": s["round_s"], "bytes": bytes_per_round(job, args.t_rounds),
            "final_test": s["final_test"], "max_mean_error_bound": s["max_mean_error_bound"],
            "max_abs_common": max(c["max_abs_common"] for c in job["clients"].values()),
            "clipped_submissions": sum(c["clipped_submissions"] for c in job["clients"].values()),
            "common_params": s["common_params"], "audit_ok": job["audit_ok"],
            "audit_problems": job["audit_problems"], "launch_wall_s": job["launch_wall_s"],
        }
        out["rows"][v] = row
        print(f"    round {row['round_s']:.3f}s  train {row['train_s']:.3f}s  agg {row['agg_latency_s']:.4f}s"
              f"  up {row['bytes']['up'] / 1e6:.3f} MB  audit {'ok' if job['audit_ok'] else 'FAILED'}",
              flush=True)
    ref = out["rows"].get("plain")
    if ref:
        for v, row in out["rows"].items():
            row["x_plain"] = {
                "round_s": row["round_s"] / ref["round_s"],
                "agg_latency_s": row["agg_latency_s"] / ref["agg_latency_s"],
                "bytes_up": row["bytes"]["up"] / ref["bytes"]["up"],
            }
    return out


def reference(args) -> dict:
    """The in-memory sweep's numbers for this row: chfl_tables.json when it has them, else computed."""
    settings = {"rounds": args.rounds, "epochs": 5, "batch_size": 64, "lr_grid": args.lr_grid,
                "mu_grid": args.mu_grid, "select": "best_round", "hidden": list(C.HIDDEN)}
    path = RESULTS / "chfl_tables.json"
    if path.exists() and not args.quick:
        try:
            doc = json.loads(path.read_text())
            run = doc.get("runs", {}).get(REF_ID)
            if run and run.get("settings") == settings:
                return {"source": f"benchmarks/results/chfl_tables.json run {REF_ID}",
                        "results": run["results"], "settings": settings}
        except (OSError, ValueError):
            pass
    print(f"[table2] computing the in-memory reference (CHFL roles in memory, {args.rounds} rounds)", flush=True)
    import torch

    from chfl_tables import sweep_roles
    from fedhet.algorithms.data_tabular import load_tabular
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    r = sweep_roles(load_tabular("covertype"), K=5, common_ratio=0.3, rounds=args.rounds, seed=ROW["seed"],
                    feature_seed=ROW["feature_seed"], lr_grid=args.lr_grid, mu_grid=args.mu_grid)
    return {"source": "CHFL roles in memory (chfl_tables.sweep_roles) computed in this run", "results": r["results"],
            "settings": settings, "seconds": time.perf_counter() - t0}


def table_section(args, workdir: Path) -> dict:
    ref = reference(args)
    base = {"rounds": args.rounds, "local_epochs": 5, "lr": args.lr_grid, **ROW}
    out = {"reference": ref, "rows": {}}
    local = None
    for agg in args.row_aggregations:
        print(f"[table2] CHFL job (mu = 0 + {args.mu_grid}, lr {args.lr_grid}), {agg} aggregation",
              flush=True)
        ch = run_job({**base, "method": "chfl", "mu": [0.0] + args.mu_grid, "aggregation": agg},
                     workdir, args.keep, f"row-chfl-{agg}")
        if local is None:
            print("[table2] Local job (no aggregation)", flush=True)
            local = run_job({**base, "method": "local"}, workdir, args.keep, "row-local")
        sel = {**ch["server"]["selected"], **local["server"]["selected"]}
        row = {"groups": {}, "audit_ok": ch["audit_ok"] and local["audit_ok"],
               "audit_problems": ch["audit_problems"] + local["audit_problems"],
               "max_mean_error_bound": ch["server"]["max_mean_error_bound"],
               "max_abs_common": max(c["max_abs_common"] for c in ch["clients"].values()),
               "clipped_submissions": sum(c["clipped_submissions"] for c in ch["clients"].values()),
               "chfl_wall_s": ch["launch_wall_s"], "local_wall_s": local["launch_wall_s"],
               "chfl_round_s": _median(ch["server"]["round_s"][1:] or ch["server"]["round_s"])}
        for g in GROUPS:
            got, want = sel[g], ref["results"][g]
            row["groups"][g] = {
                "mean_test": got["mean_test"], "reference": want["mean_test"],
                "diff": got["mean_test"] - want["mean_test"],
                "max_client_diff": float(np.max(np.abs(np.subtract(got["test"], want["test"])))),
                "identical": got["test"] == want["test"] and got["chosen"] == want["chosen"],
                "test": got["test"], "chosen": got["chosen"],
            }
        out["rows"][agg] = row
        print("    " + "  ".join(f"{HEAD[g]} {row['groups'][g]['mean_test']:.4f} "
                                 f"(ref {row['groups'][g]['reference']:.4f})" for g in GROUPS), flush=True)
    return out


def render(doc: dict) -> str:
    m = doc["meta"]
    L = [f"# Federated CHFL as processes: plain vs secure aggregation ({m['mode']})", "",
         f"Command: `{m['command']}`  ",
         f"{m['machine']}; {m['started']}; {m['elapsed_s']:.0f} s. Every party its own process "
         "(CURVE ZeroMQ on loopback), torch 1 thread per party, device cpu. The machine is shared "
         "with other work, so times are noisy; ratios are from runs made one after the other.", ""]
    t = doc.get("timing")
    if t:
        s = t["settings"]
        L += ["## Time and bytes per round (covertype, 5 clients, CHFL μ=0.5)", "",
              f"{s['rounds']} rounds x E={s['local_epochs']} local epochs; medians over rounds "
              "1.. (round 0 pays torch's warm-up). Aggregation latency = per round the least time any "
              "client spent in `submit` (the last to finish training waits for no one; a plain `submit` "
              "only sends). Round − slowest training: global model transfer, evaluation and "
              "aggregation.", "",
              "| aggregation | round (s) | x plain | client training (s) | round − slowest training (s) "
              "| aggregation latency (s) | x plain | bytes/client/round up | down | x plain (up) "
              "| max mean err bound | audit |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for v, r in t["rows"].items():
            x = r.get("x_plain", {})
            L.append(f"| {v} | {r['round_s']:.3f} | {x.get('round_s', float('nan')):.2f} | "
                     f"{r['train_s']:.3f} | {r['beyond_training_s']:.3f} | {r['agg_latency_s']:.4f} | "
                     f"{x.get('agg_latency_s', float('nan')):.2f} | {r['bytes']['up'] / 1e6:.3f} MB | "
                     f"{r['bytes']['down'] / 1e6:.3f} MB | {x.get('bytes_up', float('nan')):.3f} | "
                     f"{r['max_mean_error_bound']:.2e} | {'ok' if r['audit_ok'] else '**failed**'} |")
        any_row = next(iter(t["rows"].values()))
        L += ["", f"Common column: {any_row['common_params']:,} parameters (the only vector a client "
              f"sends); largest |θ_c| seen {max(r['max_abs_common'] for r in t['rows'].values()):.3f} "
              f"(secure clip {C.AGGREGATION_DEFAULTS.secagg_clip:g}; clipped submissions: "
              f"{sum(r['clipped_submissions'] for r in t['rows'].values())}).", ""]
    tb = doc.get("table2")
    if tb:
        ref = tb["reference"]
        st = ref["settings"]
        L += ["## Table II row as processes (covertype, 5 clients, 30% common, feature split 0, seed 1000)", "",
              f"T={st['rounds']} rounds x E=5, lr grid {st['lr_grid']}, μ grid (μ>0) {st['mu_grid']}, "
              f"per-client selection on validation ({st['select']}). Reference: {ref['source']}.", "",
              "| run | " + " | ".join(HEAD[g] for g in GROUPS) + " | identical to reference | audit |",
              "|---" * (len(GROUPS) + 3) + "|",
              "| in-memory reference | " + " | ".join(f"{ref['results'][g]['mean_test']:.4f}" for g in GROUPS)
              + " | | |"]
        for agg, r in tb["rows"].items():
            same = [HEAD[g] for g in GROUPS if r["groups"][g]["identical"]]
            L.append(f"| processes, {agg} | " + " | ".join(
                f"{r['groups'][g]['mean_test']:.4f} ({r['groups'][g]['diff']:+.4f})" for g in GROUPS)
                + f" | {', '.join(same) if same else 'none'} | {'ok' if r['audit_ok'] else '**failed**'} |")
        L += ["", "In brackets: difference from the reference (mean over clients of the chosen test "
              "accuracy). Local sends no parameters, so it is the same job for both rows. "
              "Secure aggregation's mean is within the bound below of the plain one each round; "
              "training amplifies that difference over the rounds.", ""]
        for agg, r in tb["rows"].items():
            L.append(f"- {agg}: largest per-client difference "
                     + ", ".join(f"{HEAD[g]} {r['groups'][g]['max_client_diff']:.4f}" for g in GROUPS)
                     + f"; max mean error bound {r['max_mean_error_bound']:.2e}; CHFL job "
                     f"{r['chfl_wall_s']:.0f} s ({r['chfl_round_s']:.2f} s/round), Local job "
                     f"{r['local_wall_s']:.0f} s.")
        L.append("")
    env = harness.environment_line(doc.get("environment"))
    if env:
        L += [env, ""]
    return "\n".join(L) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(ap, quick_help="short timing runs and a 3-round Table II row", render_only=True)
    ap.add_argument("--only", default="timing,table2")
    ap.add_argument("--variants", default="plain,plain-f32,secure")
    ap.add_argument("--t-rounds", type=int, help="timing: rounds (default 5; quick 3)")
    ap.add_argument("--t-epochs", type=int, help="timing: local epochs (default 5; quick 1)")
    ap.add_argument("--rounds", type=int, help="Table II row: rounds (default 20; quick 3)")
    ap.add_argument("--lr-grid", help="Table II row (default 1e-3)")
    ap.add_argument("--mu-grid", help="Table II row, mu > 0 values (default 0.5,1)")
    ap.add_argument("--row-aggregations", default="secure,plain")
    ap.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    a = ap.parse_args(argv)
    q = a.quick
    a.t_rounds = a.t_rounds or (3 if q else 5)
    a.t_epochs = a.t_epochs or (1 if q else 5)
    a.rounds = a.rounds or (3 if q else 20)
    a.lr_grid = [float(x) for x in (a.lr_grid or "1e-3").split(",")]
    a.mu_grid = [float(x) for x in (a.mu_grid or ("0.5" if q else "0.5,1")).split(",")]
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    a.row_aggregations = [v.strip() for v in a.row_aggregations.split(",") if v.strip()]
    only = {s.strip() for s in a.only.split(",") if s.strip()}
    out = harness.Output("chfl_secagg", quick=q, out_dir=a.out)
    if a.render_only:
        doc = out.read()
        out.write(doc, render(doc))
        print(render(doc))
        return 0
    bad = (only - {"timing", "table2"}) | (set(a.variants) - set(VARIANTS)) | (
        set(a.row_aggregations) - {"secure", "plain"})
    if bad:
        ap.error(f"unknown section/variant/aggregation {sorted(bad)}")
    from fedhet.algorithms.datapath import data_root
    if data_root(required=False) is None:
        ap.error("covertype needs ../shared/data (set FEDHET_DATA_DIR)")

    session = harness.Session("chfl_secagg", __file__, argv)
    t_start = time.perf_counter()
    doc = {"meta": {"mode": "quick" if q else "full", "command": session.command,
                    "started": session.started, "machine": harness.machine_label(session.meta)}}
    workdir = Path(tempfile.mkdtemp(prefix="chfl_secagg_"))
    if a.keep:
        print(f"run folders in {workdir}", flush=True)

    def save():
        doc["meta"]["elapsed_s"] = time.perf_counter() - t_start
        doc["environment"] = session.finish()
        out.write(doc, render(doc))

    try:
        if "timing" in only:
            doc["timing"] = timing_section(a, workdir)
            save()
        if "table2" in only:
            doc["table2"] = table_section(a, workdir)
            save()
    finally:
        if not a.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    save()
    print(render(doc))
    print(f"wrote {out.path('json')} and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
