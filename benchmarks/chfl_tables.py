"""Reproduce CHFL's Table II, Table III and Fig. 4 in one process (Mori et al.).

Table II: Common, Local, CHFL mu=0, CHFL mu>0 per dataset (5 clients, 30%
common features).  Table III: 2/5/10 clients on covertype.  Fig. 4: common
ratio 10..50% on covertype.  Every cell is mean +- std over feature splits x
seeds of the mean test accuracy over clients, each client picking lr (and
mu, and the round) on its own validation rows.  All methods of a row are
measured in the same run on the same partitions.

Every run is the federated CHFL job itself (``fedhet.algorithms.chfl``'s
server and client role functions) on the in-memory transport
(``harness.run_roles``): one job with every lr and the mu = 0 and mu > 0
heads on shared common columns (the Common baseline is that common column),
one Local job, plain aggregation (exactly the in-process mean; the same
numbers ``chfl_local.sweep`` gives, checked by the tests).

    python -m benchmarks.chfl_tables --quick          # ~1 split x 1 seed, 8 rounds
    python -m benchmarks.chfl_tables                  # 3 splits x 3 seeds, 20 rounds
    python -m benchmarks.chfl_tables --only table2 --datasets covertype --resume
    python -m benchmarks.chfl_tables --only fig4 --name part_b   # a second process...
    python -m benchmarks.chfl_tables --resume --only table2 --datasets covertype \
        --import-runs benchmarks/results/part_b.json           # ...merged into the main tables

Writes benchmarks/results/chfl_tables{,_quick}.{json,md,png} atomically
(after every finished run, so an interrupted sweep keeps what it has and
``--resume`` skips it).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from fedhet.algorithms import chfl
from fedhet.algorithms.chfl import Settings
from fedhet.algorithms.data_tabular import load_tabular

PAPER = Settings()  # CHFL's defaults: the paper's E, batch size, widths, selection and T
METHODS = ["common", "local", "chfl_mu0", "chfl_mu>0"]
HEAD = {"common": "Common", "local": "Local", "chfl_mu0": "CHFL μ=0", "chfl_mu>0": "CHFL μ>0"}

# The paper's numbers (mean +- std), for side-by-side reading.
PAPER_T2 = {
    "covertype": [(0.6218, 0.1086), (0.6407, 0.0594), (0.6744, 0.0731), (0.6843, 0.0661)],
    "sensorless": [(0.9762, 0.0024), (0.9526, 0.0046), (0.9855, 0.0017), (0.9863, 0.0020)],
    "aloi": [(0.7352, 0.0366), (0.7093, 0.0165), (0.7927, 0.0196), (0.7954, 0.0197)],
    "helena": [(0.2604, 0.0147), (0.2732, 0.0100), (0.2868, 0.0086), (0.2902, 0.0088)],
    "jannis": [(0.6449, 0.0184), (0.6341, 0.0090), (0.6551, 0.0128), (0.6572, 0.0111)],
}
PAPER_T3 = {
    2: [(0.6420, 0.1098), (0.7649, 0.0144), (0.7475, 0.0356), (0.7748, 0.0224)],
    5: PAPER_T2["covertype"],
    10: [(0.6014, 0.1112), (0.5628, 0.0854), (0.6290, 0.0921), (0.6291, 0.0914)],
}
NOTES = {
    "sensorless": "balanced 2,200-row subset of the 58,509 rows (only part stored)",
    "jannis": "val+test parts of the rtdl split, 30,145 of 83,733 rows (only part stored)",
    "vehicle": "not in the paper; FATE vehicle_scale guest+host joined (846 x 18 x 4)",
    "covertype": "Kaggle train.csv, 15,120 x 54 x 7 (the paper's set)",
}


HOW = ("the federated CHFL server and client roles (`fedhet.algorithms.chfl`) as threads on the in-memory "
       "transport, plain aggregation; one CHFL job (every lr; μ=0 and μ>0 heads) and one Local job per run")


def _fmt(ms) -> str:
    return "—" if ms is None else f"{ms[0]:.4f} ± {ms[1]:.4f}"


def _cell(accs: list[float]):
    if not accs:
        return None
    a = np.asarray(accs, dtype=float)
    return (float(a.mean()), float(a.std(ddof=0)))


def sweep_roles(table, K: int = 5, common_ratio: float = 0.3, rounds: int = 20, seed: int = 0,
                feature_seed: int | None = None, lr_grid=(1e-3, 1e-4), mu_grid=(0.1, 0.5, 1.0),
                select: str = "best_round", device: str = "cpu", threads: int = 1,
                epochs: int = PAPER.local_epochs, batch_size: int = PAPER.batch_size,
                hidden=PAPER.hidden, timeout: float = 3600.0) -> dict:
    """Table II's four numbers for one (feature split, seed) from the federated CHFL roles in memory.

    ``table`` = (X, y, name).  One CHFL job carries every lr and the mu = 0 and mu > 0 heads (its common
    column is the Common baseline), one Local job; each client picks lr / mu / round on its validation
    rows.  Returns ``{"results": {method: {"test", "mean_test", "chosen"}}, "n_common", "n_unique",
    "seconds"}`` (the shape of ``chfl_local.sweep``'s result)."""
    X, y = table[0], table[1]
    name = str(table[2]) if len(table) > 2 else "data"
    mu_grid = [float(m) for m in mu_grid]
    if any(not 0 < m <= 1 for m in mu_grid):
        raise ValueError(f"mu_grid must hold values in (0, 1], got {mu_grid}")
    base = {"dataset": name, "n_samples": int(X.shape[0]), "n_features": int(X.shape[1]),
            "n_classes": int(np.max(y)) + 1, "common_ratio": float(common_ratio), "rounds": int(rounds),
            "local_epochs": int(epochs), "batch_size": int(batch_size), "hidden": [int(h) for h in hidden],
            "lr": [float(x) for x in lr_grid], "select": select, "seed": int(seed), "feature_seed": feature_seed,
            "torch_threads": max(1, int(threads)), "n_clients": int(K)}
    s = chfl.ALGORITHM.parse(base)
    clients = [f"client{k + 1}" for k in range(K)]
    parties = [("server", "server")] + [(c, "client") for c in clients]
    # Each client gets exactly its own rows and columns (what chfl.load_data keeps), cut from the table
    # loaded once here.
    data = {"server": None, **{c: chfl.client_rows(s, X, y, k, K) for k, c in enumerate(clients)}}
    runs = [harness.run_roles(chfl, parties, {**base, **cfg}, seed=seed, data=data, device=device, timeout=timeout)
            for cfg in ({"method": "chfl", "mu": [0.0] + mu_grid, "aggregation": "plain"},
                        {"method": "local"})]
    selected = {**runs[0].results["server"]["selected"], **runs[1].results["server"]["selected"]}
    results = {m: {"test": selected[m]["test"], "mean_test": selected[m]["mean_test"],
                   "chosen": selected[m]["chosen"]} for m in METHODS}
    first = runs[0].results
    return {"results": results, "n_common": int(first[clients[0]]["n_common"]),
            "n_unique": [int(first[c]["n_unique"]) for c in clients],
            "seconds": sum(r.wall_s for r in runs)}


def build_plan(args) -> list[dict]:
    jobs = []

    def add(section, key, dataset, K, ratio):
        for fs in (args.feature_splits if args.feature_splits is not None else range(args.splits)):
            for s in range(args.seeds):
                jobs.append({"section": section, "key": key, "dataset": dataset, "K": K,
                             "ratio": ratio, "feature_seed": fs, "seed": 1000 + s})

    if "table2" in args.only:
        for d in args.datasets:
            add("table2", d, d, 5, 0.3)
    if "table3" in args.only:
        for K in args.clients:
            add("table3", str(K), "covertype", K, 0.3)
    if "fig4" in args.only:
        for r in args.ratios:
            add("fig4", f"{r:g}", "covertype", 5, r)
    return jobs


def run_id(job: dict) -> str:
    return (f"{job['dataset']}|K={job['K']}|r={job['ratio']:g}"
            f"|fs={job['feature_seed']}|s={job['seed']}")


def parse_run_id(rid: str) -> dict:
    """The job fields of a run id (``run_id``'s inverse)."""
    ds, *kv = rid.split("|")
    f = dict(x.split("=", 1) for x in kv)
    return {"dataset": ds, "K": int(f["K"]), "ratio": float(f["r"]),
            "feature_seed": int(f["fs"]), "seed": int(f["s"])}


def summarize(runs: dict, errors: dict) -> dict:
    """Every table row from the finished runs themselves, not from this
    invocation's plan, so runs made by several invocations (``--resume``,
    ``--import-runs``) all count: Table II = 5 clients at 30% per dataset,
    Table III = covertype at 30% per K, Fig. 4 = covertype with 5 clients
    per ratio.  Table III / Fig. 4 appear once a run off the default exists."""
    out: dict = {"table2": {}, "table3": {}, "fig4": {}}
    for rid in sorted(runs):
        j = parse_run_id(rid)
        row = lambda sec, key: out[sec].setdefault(key, {"runs": [], "dataset": j["dataset"],
                                                        "K": j["K"], "ratio": j["ratio"]})
        if j["K"] == 5 and abs(j["ratio"] - 0.3) < 1e-9:
            row("table2", j["dataset"])["runs"].append(rid)
        if j["dataset"] == "covertype" and abs(j["ratio"] - 0.3) < 1e-9:
            row("table3", str(j["K"]))["runs"].append(rid)
        if j["dataset"] == "covertype" and j["K"] == 5:
            row("fig4", f"{j['ratio']:g}")["runs"].append(rid)
    for ds, err in errors.items():
        out["table2"].setdefault(ds, {"runs": [], "dataset": ds, "K": 5, "ratio": 0.3})["error"] = err
    if set(out["table3"]) <= {"5"}:
        out["table3"] = {}
    if set(out["fig4"]) <= {"0.3"}:
        out["fig4"] = {}
    out["table3"] = dict(sorted(out["table3"].items(), key=lambda kv: int(kv[0])))
    out["fig4"] = dict(sorted(out["fig4"].items(), key=lambda kv: float(kv[0])))
    for sec in out.values():
        for row in sec.values():
            js = [parse_run_id(r) for r in row["runs"]]
            row["splits"] = len({j["feature_seed"] for j in js})
            row["seeds"] = len({j["seed"] for j in js})
            cells = {m: _cell([runs[r]["results"][m]["mean_test"] for r in row["runs"]])
                     for m in METHODS}
            row["cells"] = cells
            if all(cells[m] is not None for m in METHODS):
                c = {m: cells[m][0] for m in METHODS}
                row["claim"] = {
                    "mu>0 >= mu=0": c["chfl_mu>0"] >= c["chfl_mu0"],
                    "mu=0 > max(Common, Local)": c["chfl_mu0"] > max(c["common"], c["local"]),
                    "mu>0 > max(Common, Local)": c["chfl_mu>0"] > max(c["common"], c["local"]),
                }
    return out


def write_outputs(out: harness.Output, meta: dict, runs, errors, session: harness.Session | None = None) -> dict:
    summ = summarize(runs, errors)
    doc = {"meta": meta, "summary": summ, "runs": runs, "errors": errors,
           "paper": {"table2": PAPER_T2, "table3": {str(k): v for k, v in PAPER_T3.items()}}}
    if session is not None:
        doc["environment"] = session.finish()
    out.write(doc, render_md(meta, summ, f"{out.stem}.png", doc.get("environment")),
              plot_fig4(summ["fig4"]) if summ["fig4"] else None, indent=1)
    return summ


def render_md(meta: dict, summ: dict, png: str | None = None, env: dict | None = None) -> str:
    L = [f"# CHFL reproduction ({meta['mode']})", "",
         "Commands that made these runs (the last one wrote this file): "
         + "; ".join(f"`{c}`" for c in meta.get("commands", [meta["command"]])) + "  ",
         f"Last started {meta['started']}; "
         f"{meta.get('elapsed_s', 0):.0f} s elapsed; torch threads {meta['threads']}, "
         f"device {meta['device']}.", "",
         f"Per run: "
         f"T={meta['rounds']} rounds x E={meta['epochs']} local epochs, batch "
         f"{meta['batch_size']}, Adam; lr grid {meta['lr_grid']}, μ grid (μ>0) "
         f"{meta['mu_grid']}; each client picks lr/μ/round on its own validation rows "
         f"(select={meta['select']}). Cell = mean ± std over the row's runs (feature splits x "
         "seeds, counted in the last columns) of the mean test accuracy over clients. "
         "Paper numbers beside ours in *italics*.", ""]

    def table(title, sec, first, paper):
        if not sec:
            return
        L.extend([f"## {title}", "",
                  f"| {first} | " + " | ".join(HEAD[m] for m in METHODS)
                  + " | runs (splits x seeds) | μ>0 ≥ μ=0 | μ=0 > max(C,L) |",
                  "|---" * (len(METHODS) + 4) + "|"])
        for key, row in sec.items():
            if "error" in row and not row["runs"]:
                L.append(f"| {key} | " + " | ".join(["n/a"] * len(METHODS))
                         + " | 0 | | | ")
                L.append(f"|  | *{row['error'][:160]}* |" + " |" * (len(METHODS) + 2))
                continue
            cl = row.get("claim", {})
            yes = lambda k: ("yes" if cl[k] else "**no**") if k in cl else ""
            L.append(f"| {key} | " + " | ".join(_fmt(row["cells"][m]) for m in METHODS)
                     + f" | {len(row['runs'])} ({row['splits']} x {row['seeds']}) | {yes('mu>0 >= mu=0')} | "
                       f"{yes('mu=0 > max(Common, Local)')} |")
            p = paper.get(key) if paper else None
            if p:
                L.append("| *paper* | " + " | ".join(f"*{a:.4f} ± {b:.4f}*" for a, b in p)
                         + " | | | |")
        L.append("")

    table("Table II (5 clients, 30% common)", summ["table2"], "dataset", PAPER_T2)
    notes = [f"- {k}: {v}" for k, v in NOTES.items() if k in summ["table2"]]
    if notes:
        L.extend(["Data notes:", *notes, ""])
    table("Table III (covertype, 30% common)", summ["table3"], "clients",
          {str(k): v for k, v in PAPER_T3.items()})
    table("Fig. 4 (covertype, 5 clients)", summ["fig4"], "common ratio", None)
    if summ["fig4"]:
        png = png or ("chfl_tables" + ("_quick" if meta["mode"] == "quick" else "") + ".png")
        L.extend([f"![Fig. 4]({png})", ""])
    if meta.get("how"):
        L.extend([f"How it ran: {meta['how']}.", ""])
    if env:
        L.extend([harness.environment_line(env), ""])
    return "\n".join(L) + "\n"


def plot_fig4(sec: dict):
    """Fig. 4 as a matplotlib figure (None when no cell has a value)."""
    xs = sorted(sec, key=float)
    if not any(sec[x]["cells"].get(m) for x in xs for m in METHODS):
        return None
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for m in METHODS:
        pts = [(float(x) * 100, sec[x]["cells"][m]) for x in xs if sec[x]["cells"].get(m)]
        if pts:
            ax.errorbar([p[0] for p in pts], [p[1][0] for p in pts],
                        yerr=[p[1][1] for p in pts], marker="o", capsize=3, label=HEAD[m])
    ax.set_xlabel("common features (%)")
    ax.set_ylabel("mean test accuracy")
    ax.set_title("CHFL Fig. 4 — covertype, 5 clients")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(ap, quick_help="1 split x 1 seed, 8 rounds, small grids")
    ap.add_argument("--only", default="table2,table3,fig4")
    ap.add_argument("--datasets", default="covertype,sensorless,jannis,vehicle",
                    help="add helena,aloi with your own copy (--data-dir) or network")
    ap.add_argument("--clients", default="2,5,10")
    ap.add_argument("--ratios", default="0.1,0.2,0.3,0.4,0.5")
    ap.add_argument("--splits", type=int)
    ap.add_argument("--seeds", type=int)
    ap.add_argument("--feature-splits", help="explicit feature-split indices, e.g. 1,2 (default: "
                    "0..splits-1); lets processes share one row's runs")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--lr-grid")
    ap.add_argument("--mu-grid")
    ap.add_argument("--select", default=PAPER.select, choices=["best_round", "last"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--data-dir")
    ap.add_argument("--name", help="output base name (default chfl_tables[_quick])")
    ap.add_argument("--resume", action="store_true", help="reuse finished runs from the JSON")
    ap.add_argument("--import-runs", action="append", default=[], metavar="JSON",
                    help="also reuse the finished runs of another output JSON (same settings); "
                         "lets several processes share a sweep, merged here")
    a = ap.parse_args(argv)

    q = a.quick
    a.splits = a.splits or (1 if q else 3)
    a.seeds = a.seeds or (1 if q else 3)
    a.rounds = a.rounds or (8 if q else PAPER.rounds)
    lr_grid = [float(x) for x in (a.lr_grid or ("1e-3" if q else "1e-3,1e-4")).split(",")]
    mu_grid = [float(x) for x in (a.mu_grid or ("0.5" if q else "0.1,0.5,1")).split(",")]
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    if a.feature_splits is not None:
        try:
            a.feature_splits = sorted({int(x) for x in a.feature_splits.split(",") if x.strip()})
        except ValueError:
            ap.error(f"--feature-splits: integers separated by commas, got {a.feature_splits!r}")
        if not a.feature_splits or min(a.feature_splits) < 0:
            ap.error("--feature-splits: at least one index, none negative")
    bad = set(a.only) - {"table2", "table3", "fig4"}
    if bad:
        ap.error(f"--only: unknown {sorted(bad)}")
    a.datasets = [s.strip().lower() for s in a.datasets.split(",") if s.strip()]
    a.clients = [int(x) for x in a.clients.split(",")]
    a.ratios = [float(x) for x in a.ratios.split(",")]
    out = harness.Output(a.name, out_dir=a.out) if a.name else harness.Output("chfl_tables", quick=q, out_dir=a.out)
    session = harness.Session("chfl_tables", __file__, argv)

    meta = {"mode": "quick" if q else "full", "command": session.command,
            "started": session.started, "threads": max(1, a.threads),
            "device": a.device, "splits": a.splits, "seeds": a.seeds, "rounds": a.rounds,
            "epochs": PAPER.local_epochs, "batch_size": PAPER.batch_size,
            "lr_grid": lr_grid, "mu_grid": mu_grid, "select": a.select,
            "hidden": list(PAPER.hidden), "torch": torch.__version__, "how": HOW}
    meta["commands"] = [meta["command"]]
    settings = {k: meta[k] for k in ("rounds", "epochs", "batch_size", "lr_grid", "mu_grid",
                                     "select", "hidden")}
    runs: dict = {}
    sources = ([out.path("json")] if a.resume and out.path("json").exists() else [])
    sources += [Path(p) for p in a.import_runs]
    for src in sources:
        try:
            old = json.loads(src.read_text())
        except (OSError, ValueError) as e:
            ap.error(f"cannot read finished runs from {src}: {e}")
        other = {k: v for k, v in old.get("runs", {}).items() if v.get("settings") != settings}
        if other:  # never drop someone's finished runs on rewrite
            ap.error(f"{src}: {len(other)} finished run(s) were made with other settings than "
                     f"{settings}; use another --name, or the same --rounds/--lr-grid/--mu-grid")
        runs.update(old.get("runs", {}))
        om = old.get("meta", {})
        for c in om.get("commands", [om["command"]] if "command" in om else []):
            if c not in meta["commands"][:-1]:
                meta["commands"].insert(len(meta["commands"]) - 1, c)
        print(f"{src.name}: {len(old.get('runs', {}))} finished runs reused", flush=True)

    torch.set_num_threads(max(1, a.threads))
    jobs = build_plan(a)
    errors: dict = {}
    data: dict = {}
    todo = []
    seen = set()
    for j in jobs:  # Table II covertype == Table III K=5 == Fig. 4 30%: run once
        rid = run_id(j)
        if rid not in runs and rid not in seen:
            todo.append(j)
            seen.add(rid)
    print(f"{len(jobs)} table cells x runs, {len(todo)} runs to do", flush=True)
    t_start = time.perf_counter()
    for i, job in enumerate(todo):
        ds = job["dataset"]
        if ds in errors:
            continue
        if ds not in data:
            try:
                data[ds] = load_tabular(ds, a.data_dir)
            except Exception as e:  # report the missing set in the table, go on
                errors[ds] = f"{type(e).__name__}: {e}"
                print(f"  {ds}: not available ({errors[ds][:200]})", flush=True)
                continue
        rid = run_id(job)
        t0 = time.perf_counter()
        print(f"[{i + 1}/{len(todo)}] {rid}", flush=True)

        res = sweep_roles(data[ds], K=job["K"], common_ratio=job["ratio"], rounds=a.rounds,
                          seed=job["seed"], feature_seed=job["feature_seed"], lr_grid=lr_grid,
                          mu_grid=mu_grid, select=a.select, device=a.device, threads=a.threads)
        res["settings"] = settings
        res["job"] = {k: job[k] for k in ("dataset", "K", "ratio", "feature_seed", "seed")}
        runs[rid] = res
        dt = time.perf_counter() - t0
        el = time.perf_counter() - t_start
        left = len(todo) - i - 1
        print(f"    done in {dt:.0f}s: " + "  ".join(
            f"{HEAD[m]} {res['results'][m]['mean_test']:.4f}" for m in METHODS)
            + f"   (ETA {el / (i + 1) * left / 60:.0f} min)", flush=True)
        meta["elapsed_s"] = el
        write_outputs(out, meta, runs, errors, session)
    meta["elapsed_s"] = time.perf_counter() - t_start
    summ = write_outputs(out, meta, runs, errors, session)
    print(render_md(meta, summ, f"{out.stem}.png"))
    print(f"wrote {out.path('json')} (.md, .png)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
