"""Table I of STFL (Chu & Zhang, arXiv 2102.05883): test accuracy of Centralized, Hierarchical
(plaintext) and STFL, each "(all data)" variant where the paper has one, on cancer / payment /
credit (+ vehicle as a multi-class check, + the scikit-learn breast demo data), mean ± std over
seeds (each seed = a new random self-taught/train/test split and new initialisations).

The HE split-network column (FATE-style hetero NN) is left empty here; another benchmark fills it.

    python -m benchmarks.stfl_table1            # 100 epochs; 3 seeds (10 for the small sets)
    python -m benchmarks.stfl_table1 --quick    # 10 epochs, 2 seeds: a fast look

Writes benchmarks/results/stfl_table1{,_quick}.json and .md (atomically).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from fedhet.algorithms import data_fate
from fedhet.algorithms.datapath import DatasetNotFound
from fedhet.algorithms.stfl import METHODS, Model
from fedhet.parties.settings import parse_settings, settings_dict

# Table I of the paper (accuracy, %); vehicle / breast_sk are not in the paper.
PAPER = {
    "cancer": {"centralized": 91.15, "centralized_all": 92.92, "hierarchical": 92.92,
               "hierarchical_all": 92.92, "he_split": 92.04, "he_split_all": 95.58, "stfl": 92.92},
    "payment": {"centralized": 81.10, "centralized_all": 81.32, "hierarchical": 78.20,
                "hierarchical_all": 78.20, "he_split": 74.87, "he_split_all": 74.85, "stfl": 78.50},
    "credit": {"centralized": 93.16, "centralized_all": 93.39, "hierarchical": 93.54,
               "hierarchical_all": 93.54, "he_split": 93.44, "he_split_all": 93.24, "stfl": 93.41},
}
COLUMNS = ["centralized", "centralized_all", "hierarchical", "hierarchical_all", "he_split", "stfl"]
TITLES = {"centralized": "Centralized", "centralized_all": "Centralized (all data)",
          "hierarchical": "Hierarchical", "hierarchical_all": "Hierarchical (all data)",
          "he_split": "HE split NN", "stfl": "STFL"}
RESULTS = harness.RESULTS


def _stats(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "values": xs}


def run(args) -> dict:
    cfg = parse_settings(Model, {"epochs": args.epochs, "vae_epochs": args.epochs}, "stfl")
    out = {"benchmark": "stfl_table1", "quick": args.quick, "seeds": args.seeds,
           "seeds_small": args.seeds_small,
           "config": {**{k: v for k, v in settings_dict(cfg).items() if k != "seed"}, "device": args.device},
           "selftaught_frac": args.selftaught_frac, "test_frac": args.test_frac,
           "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
           "machine": harness.machine_info()["platform"], "paper": PAPER, "datasets": {}}
    for name in args.datasets:
        try:
            data = data_fate.load(name, data_dir=args.data_dir)
        except DatasetNotFound as e:
            print(f"[skip] {name}: {e}", file=sys.stderr)
            out["datasets"][name] = {"skipped": str(e)}
            continue
        entry = {"notes": data.notes, "n_classes": data.n_classes, "sizes": None,
                 "majority_rate": [], "methods": {m: {"accuracy": [], "seconds": []} for m in METHODS},
                 "stfl_parts_s": {"vae": [], "encode": [], "host": []}}
        n_seeds = args.seeds_small if len(data.common_ids) < 5000 else args.seeds
        entry["seeds"] = list(range(n_seeds))
        for seed in range(n_seeds):
            if name == "breast_sk":  # guest row order depends on the seed
                data = data_fate.load(name, seed=seed)
            v = data_fate.views(data, data_fate.make_split(data, seed, args.selftaught_frac,
                                                           args.test_frac))
            entry["sizes"] = v.sizes()
            y_te = v.host.y_test
            entry["majority_rate"].append(float(np.bincount(y_te).max() / len(y_te)))
            c = replace(cfg, seed=seed)
            for m in args.methods:
                r = METHODS[m](v, c, args.device)
                entry["methods"][m]["accuracy"].append(r["accuracy"])
                entry["methods"][m]["seconds"].append(r["total_s"])
                if m == "stfl":
                    entry["stfl_parts_s"]["vae"].append(sum(r["vae_s"]))
                    entry["stfl_parts_s"]["encode"].append(sum(r["encode_s"]))
                    entry["stfl_parts_s"]["host"].append(r["host_s"])
                print(f"{name:9s} seed={seed} {m:17s} acc={100 * r['accuracy']:6.2f}% "
                      f"{r['total_s']:6.2f}s", flush=True)
        for m in list(entry["methods"]):
            d = entry["methods"][m]
            if not d["accuracy"]:
                del entry["methods"][m]
                continue
            entry["methods"][m] = {"accuracy": _stats(d["accuracy"]), "seconds": _stats(d["seconds"])}
        entry["methods"]["he_split"] = None  # filled by the HE split-network benchmark
        entry["majority_rate"] = _stats(entry["majority_rate"])
        entry["stfl_parts_s"] = {k: _stats(x) for k, x in entry["stfl_parts_s"].items() if x}
        out["datasets"][name] = entry
    return out


def he_column(path: Path = RESULTS / "he_split_table1.json") -> dict:
    """The HE split-network column from ``he_split_table1.py``'s output:
    dataset -> {"accuracy": {mean, std} (fractions), "source", "seeds"};
    encrypted runs where every seed has one, else the plaintext reference."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for r in doc.get("rows", []):
        enc = [e["accuracy"] for e in r.get("encrypted", [])]
        ref = r.get("reference", [])
        vals, src = (enc, "encrypted") if enc and len(enc) == len(ref) else (ref, "reference")
        if vals:
            out[r["dataset"]] = {"accuracy": _stats([v / 100 for v in vals]), "source": src,
                                 "seeds": len(vals), "epochs": doc.get("meta", {}).get("epochs")}
    return out


def to_markdown(res: dict) -> str:
    cfg = res["config"]
    lines = [
        "# STFL Table I — test accuracy (%), mean ± std over seeds",
        "",
        f"{'QUICK run (fewer epochs), not the reproduction. ' if res['quick'] else ''}"
        f"epochs={cfg['epochs']} (VAE {cfg['vae_epochs']}), batch={cfg['batch_size']}, "
        f"Adam lr={cfg['lr']}, split self-taught/test = {res['selftaught_frac']}/{res['test_frac']}, "
        f"device={cfg['device']}, torch threads={res['torch_threads']}. Seeds 0..k-1 with k = "
        f"{res['seeds']} (payment, credit) or {res['seeds_small']} (small sets: < 5,000 rows, "
        "test sets of ~100-170 rows); a seed = a new random split + new initialisations.",
        "Paper's value in brackets. 'HE split NN' = FATE-style network, from `he_split_table1.md` "
        "(its own seeds and splits; *enc* = encrypted party-process runs, *ref* = the same network's "
        "plaintext reference, used where encrypted runs take hours).",
        "",
        "| data set | seeds | n self-taught / train / test | majority class | "
        + " | ".join(TITLES[c] for c in COLUMNS) + " |",
        "|---|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for name, e in res["datasets"].items():
        if "skipped" in e:
            lines.append(f"| {name} | | skipped: data not found | | " + " | " * len(COLUMNS))
            continue
        s = e["sizes"]
        cells = []
        for c in COLUMNS:
            m = e["methods"].get(c)
            paper = PAPER.get(name, {}).get(c)
            ptxt = f" [{paper:.2f}]" if paper is not None else ""
            if c == "he_split" and res.get("he_column", {}).get(name):
                h = res["he_column"][name]
                a = h["accuracy"]
                cells.append(f"{100 * a['mean']:.2f} ± {100 * a['std']:.2f} *{h['source'][:3]}*{ptxt}")
            elif m is None:
                cells.append("—" + ptxt)
            else:
                a = m["accuracy"]
                cells.append(f"{100 * a['mean']:.2f} ± {100 * a['std']:.2f}{ptxt}")
        lines.append(f"| {name} | {len(e['seeds'])} | {s['selftaught']} / {s['train']} / {s['test']} | "
                     f"{100 * e['majority_rate']['mean']:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "## Training time (s, mean over seeds; this machine, in process, no crypto)", "",
              "| data set | " + " | ".join(TITLES[c] for c in COLUMNS if c != "he_split")
              + " | STFL: VAE / encode / host |",
              "|---|" + "---|" * (len(COLUMNS))]
    for name, e in res["datasets"].items():
        if "skipped" in e:
            continue
        cells = []
        for c in COLUMNS:
            if c == "he_split":
                continue
            m = e["methods"].get(c)
            cells.append("—" if m is None else f"{m['seconds']['mean']:.2f}")
        p = e["stfl_parts_s"]
        parts = " / ".join(f"{p[k]['mean']:.2f}" for k in ("vae", "encode", "host")) if p else "—"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {parts} |")
    lines += ["", "Notes:"] + [f"- {n}: {e['notes']}" for n, e in res["datasets"].items()
                                if "notes" in e]
    env = harness.environment_line(res.get("environment"))
    if env:
        lines += ["", env]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(ap, quick_help="10 epochs, 2 seeds (a fast look)", render_only=True)
    ap.add_argument("--seeds", type=int, default=None, help="number of seeds (default 3; quick 2)")
    ap.add_argument("--seeds-small", type=int, default=None,
                    help="seeds for the small data sets (< 5,000 rows; default 10; quick 2)")
    ap.add_argument("--epochs", type=int, default=None, help="epochs (default 100; quick 10)")
    ap.add_argument("--datasets", nargs="+", default=["cancer", "payment", "credit", "vehicle", "breast_sk"],
                    choices=data_fate.DATASETS)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--selftaught-frac", type=float, default=0.4)
    ap.add_argument("--test-frac", type=float, default=0.2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1 is fastest for these tiny MLPs)")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    out = harness.Output("stfl_table1", quick=args.quick, out_dir=args.out)
    if args.render_only:  # picks up a newer HE column
        try:
            res = out.read()
        except (OSError, ValueError) as e:
            ap.error(f"--render-only needs {out.path('json')}: {e}")
        res["he_column"] = he_column()
        out.write(res, to_markdown(res), indent=1)
        print(to_markdown(res))
        return 0
    args.seeds = args.seeds or (2 if args.quick else 3)
    args.seeds_small = args.seeds_small or (2 if args.quick else max(10, args.seeds))
    args.epochs = args.epochs or (10 if args.quick else 100)
    if min(args.seeds, args.seeds_small, args.epochs, args.threads) < 1:
        ap.error("--seeds, --seeds-small, --epochs and --threads must be >= 1")
    torch.set_num_threads(args.threads)
    session = harness.Session("stfl_table1", __file__, argv)
    res = run(args)
    res["environment"] = session.finish()
    res["wall_s"] = res["environment"]["elapsed_s"]
    res["he_column"] = he_column()
    md = to_markdown(res)
    out.write(res, md, indent=1)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
