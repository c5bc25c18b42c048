"""MMVFL, Figs. 3-6 analogues: accuracy vs p % per view, MMVFL vs supFL vs supMVLFL (mean over folds),
plus iterations to convergence and, as processes, per-iteration time of the local solve and of
plain vs secure aggregation of Z and bytes per participant per iteration.

MMVFL's accuracies come from ``mmvfl.core.run_centralized``, which the federated roles reproduce
exactly (tests/test_mmvfl_federated.py); beta is tuned per p, fold and view over the grid, as the
paper does.  Data: Handwritten, Isolet, Relathe are the paper's (real); MSRC-v5 is a STAND-IN for
Caltech7.  ``--quick``: Handwritten, fold 0, beta in {1e-2, 1}, 20 rounds.
Full: ``python -m benchmarks.mmvfl_figures`` (all four sets, 5 folds, beta 1e-5..10, 200 rounds).

The work is split into units (data set, fold, beta), independent of each other: each runs MMVFL,
supMVLFL and supFL per view and scores every p (``selection_accuracy``).  After every unit the JSON is rewritten atomically (markdown and
PNG after every completed fold); ``--resume`` continues from it, skipping finished units, and
refuses a file written with other settings (betas, rounds, model settings), so runs are never
mixed.  ``--datasets`` / ``--folds`` choose the units of this invocation; the summary covers the
folds whose every beta is done.  ``--jobs N`` runs units in N processes (one BLAS thread each).

    python -m benchmarks.mmvfl_figures --datasets handwritten --skip-processes
    python -m benchmarks.mmvfl_figures --resume --datasets msrc_v5 isolet --jobs 2
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
import json
import time
from pathlib import Path

import numpy as np

from benchmarks import harness

from fedhet.algorithms import mmvfl
from fedhet.algorithms.mmvfl import core
from fedhet.algorithms.data_multiview import DATASETS, TABLE2_SPLITS, cv_folds, load_multiview

PERCENTS = list(mmvfl.PAPER_PERCENTS)
METHODS = ("MMVFL", "supFL", "supMVLFL")
PRIORITY = ("handwritten", "msrc_v5", "isolet", "relathe")
FULL_BETAS = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0]
N_FOLDS = 5
FEW_FEATURES = 10   # "few features": p <= this many percent


def run_settings(quick: bool) -> dict:
    """Everything the numbers depend on; a resumed file must have been written with the same."""
    base = core.MMVFLSettings()
    return {
        "quick": quick,
        "betas": [1e-2, 1.0] if quick else FULL_BETAS,
        "max_iter": 20 if quick else 200,
        "baseline_max_iter": 100,
        "percents": PERCENTS,
        "cv_seed": 0,
        "core": {f: getattr(base, f) for f in ("zeta", "eta", "epsilon", "tol", "inner_iters",
                                               "inner_tol", "w_tol", "solver", "seed", "rows",
                                               "knn_k")},
    }


@functools.lru_cache(maxsize=4)
def fold_data(name: str, f: int, cv_seed: int):
    """(standardised training views, validation views, y_train, y_val, MultiView) of one fold."""
    mv = load_multiview(name)
    tr, va = TABLE2_SPLITS[name]
    fold = cv_folds(mv.y, tr, va, cv_seed)[f]
    Xs, Vs = [], []
    for X in mv.views:
        Xt = np.asarray(X, np.float64)[fold.train]
        m, s = core.fit_standardizer(Xt)
        Xs.append(core.standardize(Xt, m, s))
        Vs.append(core.standardize(np.asarray(X, np.float64)[fold.val], m, s))
    return Xs, Vs, mv.y[fold.train], mv.y[fold.val], mv


def run_unit(name: str, f: int, beta: float, settings: dict) -> dict:
    """One (data set, fold, beta): MMVFL, supMVLFL, supFL per view; accuracy for every view and p."""
    t0 = time.process_time()
    Xs, Vs, ytr, yva, mv = fold_data(name, f, settings["cv_seed"])
    cs = core.MMVFLSettings(beta=beta, max_iter=settings["max_iter"], **settings["core"])
    bs = core.MMVFLSettings(beta=beta, max_iter=settings["baseline_max_iter"], **settings["core"])
    P, knn = settings["percents"], settings["core"]["knn_k"]
    res = core.run_centralized(Xs, ytr, np.arange(ytr.size), cs, mv.n_classes)
    mvl = core.fit_supmvlfl(Xs, ytr, mv.n_classes, bs)
    acc = {m: [] for m in METHODS}
    for k in range(len(Xs)):
        lab = ytr if k == 0 else core.pseudo_labels(res.Z_views[k])
        sup = core.fit_supfl(Xs[k], ytr, mv.n_classes, bs, k)
        for m, labels, W in (("MMVFL", lab, res.W[k]), ("supFL", ytr, sup.W[0]),
                             ("supMVLFL", ytr, mvl.W[k])):
            scores = core.feature_scores(W)
            acc[m].append([core.selection_accuracy(Xs[k], labels, Vs[k], yva, scores, p, knn)
                           for p in P])
    return {"accuracy": acc, "iterations": res.iterations, "converged": res.converged,
            "cpu_s": time.process_time() - t0}


def _init_worker():
    from threadpoolctl import threadpool_limits
    global _LIMITS
    _LIMITS = threadpool_limits(1)   # kept for the worker's life


# ------------------------------------------------------------------ the document
def new_doc(settings: dict) -> dict:
    return {"quick": settings["quick"], "settings": settings, "datasets": {}}


def check_resumable(doc: dict, settings: dict, path: Path) -> None:
    """Refuse to continue a file written with other settings (never mix runs)."""
    old = doc.get("settings") if isinstance(doc, dict) else None
    if old is None:
        raise SystemExit(f"--resume: {path} has no 'settings' (written by an older version of this "
                         f"script); move it away or run without --resume")
    want = json.loads(harness.json_text(settings))
    if old != want:
        diff = sorted(k for k in set(old) | set(want) if old.get(k) != want.get(k))
        details = "; ".join(f"{k}: file {old.get(k)!r}, this run {want.get(k)!r}" for k in diff)
        raise SystemExit(f"--resume: {path} was written with other settings ({details}); "
                         f"refusing to mix runs: use another --out or start without --resume")


def dataset_entry(doc: dict, name: str) -> dict:
    if name not in doc["datasets"]:
        _, _, ytr, yva, mv = fold_data(name, 0, doc["settings"]["cv_seed"])
        doc["datasets"][name] = {"kind": mv.kind, "note": mv.note, "views": list(mv.view_names),
                                 "n_train": int(ytr.size), "n_val": int(yva.size),
                                 "n_classes": int(mv.n_classes), "folds": {}}
    return doc["datasets"][name]


def beta_key(beta: float) -> str:
    return repr(float(beta))


def complete_folds(entry: dict, betas) -> list[int]:
    return sorted(int(f) for f, units in entry["folds"].items()
                  if all(beta_key(b) in units for b in betas))


def summarize(doc: dict) -> None:
    """Per data set, over its complete folds: best beta per p, fold and view, then the fold mean;
    the gaps MMVFL - supFL / supMVLFL per view; iterations to convergence."""
    betas = doc["settings"]["betas"]
    P = np.asarray(doc["settings"]["percents"], float)
    few = P <= FEW_FEATURES
    for name, e in doc["datasets"].items():
        folds = complete_folds(e, betas)
        partial = sorted(int(f) for f in e["folds"] if int(f) not in folds)
        s = {"folds": folds, "incomplete_folds": partial}
        if folds:
            arr = {m: np.array([[e["folds"][str(f)][beta_key(b)]["accuracy"][m] for b in betas]
                                for f in folds]) for m in METHODS}   # fold x beta x view x p
            curves = {m: a.max(axis=1).mean(axis=0) for m, a in arr.items()}
            s["accuracy"] = {m: c.tolist() for m, c in curves.items()}
            s["gap"] = {}
            for base in ("supFL", "supMVLFL"):
                d = curves["MMVFL"] - curves[base]          # view x p
                s["gap"][base] = {
                    "mean_abs_per_view": np.abs(d).mean(axis=1).tolist(),
                    "mean_per_view": d.mean(axis=1).tolist(),
                    "max_abs": float(np.abs(d).max()),
                    "mmvfl_above": int((d > 1e-12).sum()), "mmvfl_below": int((d < -1e-12).sum()),
                    "mmvfl_above_few_features": int((d[:, few] > 1e-12).sum()),
                    "cells": int(d.size), "cells_few_features": int(d[:, few].size)}
            its = [(f, b, e["folds"][str(f)][beta_key(b)]) for f in folds for b in betas]
            s["iterations"] = {
                "per_beta_mean": {beta_key(b): float(np.mean([u["iterations"] for f, bb, u in its if bb == b]))
                                  for b in betas},
                "per_beta_converged": {beta_key(b): sum(u["converged"] for f, bb, u in its if bb == b)
                                       for b in betas},
                "median": float(np.median([u["iterations"] for _, _, u in its])),
                "converged": sum(u["converged"] for _, _, u in its), "runs": len(its)}
            s["cpu_s"] = float(sum(u["cpu_s"] for _, _, u in its))
        e["summary"] = s


def render(doc: dict) -> str:
    st = doc["settings"]
    lines = [f"# MMVFL figures{' (quick)' if doc['quick'] else ''}", "",
             f"Accuracy (k-NN, {st['core']['knn_k']} neighbour) on each view's validation rows with the "
             f"top p % features; beta tuned per p, fold and view over {st['betas']}; mean over folds. "
             f"MMVFL: up to {st['max_iter']} rounds (tol {st['core']['tol']:g} on the smoothed eq. 3); "
             f"supFL / supMVLFL: reweighting to w_tol {st['core']['w_tol']:g} or {st['baseline_max_iter']} "
             f"steps; zeta = {st['core']['zeta']:g}, eta = {st['core']['eta']:g}. View 1 is the label "
             f"holder (its MMVFL k-NN uses the true labels), the others use argmax Z_k.", "",
             "## What is included", "",
             "| data set | kind | complete folds (all betas) | incomplete folds | not run |",
             "|---|---|---|---|---|"]
    for name in PRIORITY:
        e = doc["datasets"].get(name)
        if e is None:
            lines.append(f"| {name} | | none | | all {N_FOLDS} folds |")
            continue
        s = e["summary"]
        inc = "; ".join(f"fold {f}: betas {sorted(float(b) for b in e['folds'][str(f)])}"
                        for f in s["incomplete_folds"]) or "-"
        missing = [f for f in range(N_FOLDS) if str(f) not in e["folds"]]
        lines.append(f"| {name} | {e['kind']} | {s['folds'] or 'none'} | {inc} | "
                     f"{('folds ' + str(missing)) if missing else '-'} |")
    lines.append("")
    for name in PRIORITY:
        e = doc["datasets"].get(name)
        if e is None or not e["summary"]["folds"]:
            continue
        s = e["summary"]
        lines += [f"## {name} ({e['kind']}: {e['note']}), folds {s['folds']}, "
                  f"{e['n_train']} train / {e['n_val']} validation rows, {e['n_classes']} classes", "",
                  "| view | method | " + " | ".join(f"{p:g}%" for p in st["percents"]) + " |",
                  "|---|---|" + "---|" * len(st["percents"])]
        for k, v in enumerate(e["views"]):
            for m in METHODS:
                lines.append(f"| {v} | {m} | " + " | ".join(f"{x:.3f}" for x in s["accuracy"][m][k]) + " |")
        lines += ["", "Shape check, MMVFL minus baseline over the p grid (after tuning and fold mean):", "",
                  "| baseline | " + " | ".join(f"{v}: mean abs gap (mean gap)" for v in e["views"])
                  + " | max abs gap | MMVFL above / below (cells) | above with p <= 10 % |",
                  "|---|" + "---|" * (len(e["views"]) + 3)]
        for base, g in s["gap"].items():
            lines.append(f"| {base} | " + " | ".join(f"{a:.4f} ({m:+.4f})" for a, m in
                                                       zip(g["mean_abs_per_view"], g["mean_per_view"]))
                         + f" | {g['max_abs']:.3f} | {g['mmvfl_above']} / {g['mmvfl_below']} of {g['cells']}"
                         f" | {g['mmvfl_above_few_features']} of {g['cells_few_features']} |")
        it = s["iterations"]
        lines += ["", f"Iterations to convergence (MMVFL rounds, mean over folds per beta; "
                      f"converged = stopped by tol before {st['max_iter']}): " +
                  ", ".join(f"beta {float(b):g}: {it['per_beta_mean'][b]:.1f} "
                            f"({it['per_beta_converged'][b]}/{len(s['folds'])} converged)"
                            for b in it["per_beta_mean"]) +
                  f"; median {it['median']:.0f}, {it['converged']}/{it['runs']} runs converged. "
                  f"CPU time of these units: {s['cpu_s']:.0f} s.", ""]
    if doc.get("processes"):
        lines += ["## Per iteration, as processes (Handwritten, 5 participants + server)", "",
                  "| aggregation | rows | agg Z s | agg objective s | local solve s (median over participants) | "
                  "bytes sent / participant / iter |", "|---|---|---|---|---|---|"]
        for agg, r in doc["processes"].items():
            lines.append(f"| {agg} | {r['n_rows']} | {r['agg_z_s_per_iter']:.4f} | "
                         f"{r['agg_objective_s_per_iter']:.4f} | "
                         f"{np.median(list(r['local_solve_s_per_iter'].values())):.4f} | "
                         f"{np.median(list(r['bytes_sent_per_participant_per_iter'].values())):.0f} |")
        lines.append("")
    else:
        lines += ["Per-iteration process timings: not measured in this file (see "
                  "mmvfl_figures_quick.md).", ""]
    if doc.get("environment"):
        lines += [harness.environment_line(doc["environment"]), ""]
    else:
        lines += ["(Environment of the computing run not recorded: it was stopped before its end.)", ""]
    if doc.get("run_note"):
        lines += [f"Run: {doc['run_note']}", ""]
    return "\n".join(lines)


# Each method's line: supFL solid under MMVFL dashed (the two often coincide: both stay visible),
# supMVLFL dotted; different markers, MMVFL drawn last.
METHOD_STYLE = {"supFL": dict(color="C1", ls="-", marker="o", ms=5, lw=2.2, alpha=0.8, zorder=2),
                "supMVLFL": dict(color="C2", ls=":", marker="s", ms=4, lw=1.8, alpha=0.9, zorder=3),
                "MMVFL": dict(color="C0", ls="--", marker="x", ms=6, mew=1.5, lw=1.6, zorder=4)}


def figure(doc: dict):
    """Per data set (row) and view (column): accuracy against p % of the features, each method's
    mean over the complete folds (``doc["datasets"][name]["summary"]``, see :func:`summarize`)."""
    plt = harness.pyplot()
    sets = [(n, doc["datasets"][n]) for n in PRIORITY
            if n in doc["datasets"] and doc["datasets"][n]["summary"]["folds"]]
    if not sets:
        return None
    K = max(len(e["views"]) for _, e in sets)
    fig, axes = plt.subplots(len(sets), K, figsize=(3.4 * K, 2.9 * len(sets) + 0.9), squeeze=False,
                             layout="constrained")
    P = doc["settings"]["percents"]
    lines = {}
    for r, (name, e) in enumerate(sets):
        for k in range(K):
            ax = axes[r][k]
            if k >= len(e["views"]):
                ax.axis("off")
                continue
            for m in sorted(METHODS, key=lambda m: METHOD_STYLE[m]["zorder"]):
                lines[m], = ax.plot(P, e["summary"]["accuracy"][m][k], label=m, **METHOD_STYLE[m])
            ax.set_title(f"{name}: view {e['views'][k]}", fontsize=11)
            ax.set_xlabel("p (% of features kept)")
            ax.grid(alpha=0.3)
        axes[r][0].set_ylabel(f"accuracy\n(mean of folds {', '.join(map(str, e['summary']['folds']))})")
    harness.figure_legend(fig, [lines[m] for m in METHODS], list(METHODS))
    fig.suptitle("MMVFL vs supFL vs supMVLFL: k-NN accuracy with the top p % features of each view", fontsize=13)
    return fig


def processes(quick):
    """Per-iteration costs as processes: runs of 3 and 6 rounds (tol 0); differences / 3 rounds."""
    over = {"tol": 0.0, "percents": [10, 100]}
    if quick:
        over.update({"train_per_class": 40, "val_per_class": 10})
    out = {}
    for agg in ("plain", "secure"):
        runs = {}
        for n in (3, 6):
            la = harness.launch_audited("mmvfl", overrides={**over, "aggregation": agg, "max_iter": n},
                                        timeout=300)
            assert la.audit_ok, la.audit_problems[:3]
            runs[n] = la
        srv = runs[6].results["server"]
        parts = runs[6].by_role("participant")
        b3 = {p: r["bytes_sent"] for p, r in runs[3].by_role("participant").items()}
        out[agg] = {
            "agg_z_s_per_iter": float(np.median(srv["agg_z_s"])),
            "agg_objective_s_per_iter": float(np.median(srv["agg_objective_s"])),
            "local_solve_s_per_iter": {p: float(np.median(r["solve_s"])) for p, r in parts.items()},
            "bytes_sent_per_participant_per_iter": {p: (r["bytes_sent"] - b3[p]) / 3 for p, r in parts.items()},
            "n_rows": srv["n_rows"], "audit_ok": True}
    return out


def write(out: harness.Output, doc: dict, full: bool) -> None:
    summarize(doc)
    if full:
        out.write(doc, render(doc), figure(doc))
    else:
        out.write(doc)


def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter), render_only=True)
    ap.add_argument("--resume", action="store_true",
                    help="continue the existing JSON (same settings only), skipping finished units")
    ap.add_argument("--datasets", nargs="+", choices=DATASETS, default=None,
                    help="data sets to run now (default: all; --quick: handwritten)")
    ap.add_argument("--folds", nargs="+", type=int, default=None,
                    help=f"folds to run now, 0..{N_FOLDS - 1} (default: all; --quick: 0)")
    ap.add_argument("--jobs", type=int, default=1, help="units run in this many processes")
    ap.add_argument("--skip-processes", action="store_true",
                    help="do not measure the per-iteration process costs now")
    a = ap.parse_args(argv)
    settings = run_settings(a.quick)
    names = a.datasets or (["handwritten"] if a.quick else list(PRIORITY))
    names = [n for n in PRIORITY if n in names]
    folds = a.folds if a.folds is not None else ([0] if a.quick else list(range(N_FOLDS)))
    bad = [f for f in folds if not 0 <= f < N_FOLDS]
    if bad or a.jobs < 1:
        ap.error(f"--folds must lie in 0..{N_FOLDS - 1} (got {bad})" if bad else "--jobs must be >= 1")
    out = harness.Output("mmvfl_figures", a.quick, a.out)
    if a.render_only:
        doc = out.read()
        check_resumable(doc, settings, out.path("json"))
        write(out, doc, full=True)
        return
    if a.resume and out.path("json").exists():
        doc = out.read()
        check_resumable(doc, settings, out.path("json"))
    else:
        doc = new_doc(settings)
    sess = harness.Session("mmvfl_figures", __file__, argv)

    todo = [(n, f, b) for n in names for f in folds for b in settings["betas"]
            if beta_key(b) not in doc["datasets"].get(n, {}).get("folds", {}).get(str(f), {})]
    for n in names:
        dataset_entry(doc, n)
    print(f"mmvfl_figures: {len(todo)} units to run ({len(names)} data sets, folds {folds})", flush=True)

    def store(unit, result):
        n, f, b = unit
        units = doc["datasets"][n]["folds"].setdefault(str(f), {})
        units[beta_key(b)] = result
        doc["environment"] = sess.finish()   # so a run stopped part-way still says where it ran
        fold_done = all(beta_key(bb) in units for bb in settings["betas"])
        print(f"  {n} fold {f} beta {b:g}: {result['iterations']} rounds, {result['cpu_s']:.1f} s CPU"
              f"{' (fold complete)' if fold_done else ''}", flush=True)
        write(out, doc, full=fold_done)

    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        if a.jobs == 1:
            for u in todo:
                store(u, run_unit(*u, settings))
        else:
            with cf.ProcessPoolExecutor(a.jobs, initializer=_init_worker) as ex:
                futs = {ex.submit(run_unit, *u, settings): u for u in todo}
                for fut in cf.as_completed(futs):
                    store(futs[fut], fut.result())
    if not a.skip_processes and "processes" not in doc:
        doc["processes"] = processes(a.quick)
    doc["environment"] = sess.finish()
    doc.setdefault("sessions", []).append(doc["environment"])
    write(out, doc, full=True)


if __name__ == "__main__":
    main()
