"""MMVFL's W-update (eq. 6): Cholesky vs Woodbury on the paper's shapes, and what "auto" picks.

For every view of Handwritten, Isolet, Relathe and the MSRC-v5 stand-in, with
Table 2's training rows per class (N = rows x classes), and for the
concatenated views supMVLFL solves: one reweighting step of eq. (6)

    cholesky  (X^T X + beta A) W = X^T Z            d x d system (X^T X formed once)
    woodbury  W = A^-1 X^T (X A^-1 X^T + beta I)^-1 Z   N x N system

is timed on the real (standardised) training rows of fold 0, the best of
``--repeats`` runs (one-off set-up -- X^T X, X^T Z -- timed apart).  Both
answers are compared (max relative difference).  Reported: seconds per step,
the ratio cholesky / woodbury, the choice of ``choose_solver(..., "auto")``
(a flop model) and whether it was the faster one.

BLAS runs on ``--threads`` threads (default 1, via threadpoolctl): on a
shared machine multi-threaded BLAS timings swing by 100x with other jobs'
load, and one thread is what the flop model describes.

    python -m benchmarks.mmvfl_solve            # all shapes, 5 repeats
    python -m benchmarks.mmvfl_solve --quick    # Handwritten + Relathe views, 2 repeats

Writes benchmarks/results/mmvfl_solve.{json,md} (``_quick`` with --quick).
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import scipy
from threadpoolctl import threadpool_info, threadpool_limits

from benchmarks import harness

from fedhet.algorithms import data_multiview as dm
from fedhet.algorithms.mmvfl import core as mc

BETA = 1e-2
EPSILON = 1e-8


def _best(fn, repeats: int) -> tuple[float, np.ndarray]:
    best = float("inf")
    out = None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def time_shape(X: np.ndarray, n_classes: int, labels: np.ndarray, repeats: int) -> dict:
    """One row of the table: both solvers on X (N x d) towards one-hot labels."""
    Z = mc.one_hot(labels, n_classes)
    W = mc.init_w(X.shape[1], n_classes, seed=0, participant=0)
    a = mc.reweighting_diagonal(W, EPSILON)
    t0 = time.perf_counter()
    chol = mc.prepare_view(X, n_classes, "cholesky")
    XtZ = chol.X.T @ Z
    setup_chol = time.perf_counter() - t0
    wood = mc.prepare_view(X, n_classes, "woodbury")
    t_chol, W_chol = _best(lambda: mc.solve_cholesky(chol, XtZ, a, BETA), repeats)
    t_wood, W_wood = _best(lambda: mc.solve_woodbury(wood, Z, a, BETA), repeats)
    diff = float(np.max(np.abs(W_chol - W_wood)) / max(np.max(np.abs(W_chol)), 1e-300))
    auto = mc.choose_solver(X.shape[0], X.shape[1], n_classes, "auto")
    faster = "cholesky" if t_chol <= t_wood else "woodbury"
    costs = mc.solver_costs(X.shape[0], X.shape[1], n_classes)
    return {
        "N": int(X.shape[0]), "d": int(X.shape[1]), "classes": int(n_classes),
        "cholesky_s": t_chol, "woodbury_s": t_wood, "cholesky_setup_s": setup_chol,
        "ratio_chol_over_wood": t_chol / t_wood,
        "flops_cholesky": costs["cholesky"], "flops_woodbury": costs["woodbury"],
        "auto": auto, "faster": faster,
        "flop_model": "woodbury" if costs["woodbury"] < costs["cholesky"] else "cholesky", "auto_is_faster": auto == faster,
        "auto_loss": (t_chol if auto == "cholesky" else t_wood) / min(t_chol, t_wood),
        "max_rel_diff": diff,
    }


def rows_for(name: str, repeats: int, data_dir=None, concatenated: bool = True) -> list[dict]:
    data = dm.load_multiview(name, data_dir=data_dir)
    n_tr, n_val = dm.TABLE2_SPLITS[name]
    fold = dm.cv_folds(data.y, n_tr, n_val, seed=0)[0]
    views = []
    for X in data.views:
        mean, scale = mc.fit_standardizer(X[fold.train])
        views.append(mc.standardize(X[fold.train], mean, scale))
    labels = data.y[fold.train]
    out = []
    shapes = [(vn, X) for vn, X in zip(data.view_names, views)]
    if concatenated:
        shapes.append(("all views (supMVLFL)", np.hstack(views)))
    for vn, X in shapes:
        r = time_shape(X, data.n_classes, labels, repeats)
        r.update({"dataset": name, "kind": data.kind, "view": vn})
        out.append(r)
        print(f"{name:12s} {vn:22s} N={r['N']:5d} d={r['d']:5d}  chol {r['cholesky_s'] * 1e3:9.2f} ms"
              f"  wood {r['woodbury_s'] * 1e3:9.2f} ms  ratio {r['ratio_chol_over_wood']:6.2f}"
              f"  auto={r['auto']:8s} {'ok' if r['auto_is_faster'] else 'SLOWER x%.2f' % r['auto_loss']}"
              f"  diff {r['max_rel_diff']:.1e}", flush=True)
    return out


def to_markdown(rows: list[dict], meta: dict) -> str:
    lines = [
        "# MMVFL W-update: Cholesky vs Woodbury",
        "",
        f"One reweighting step of eq. (6) (beta = {BETA}), best of {meta['repeats']} runs, on fold 0's "
        f"standardised training rows (Table 2 rows per class).  Machine: {meta['machine']}; "
        f"BLAS {', '.join(meta['blas'])} (--threads {meta['threads']}); "
        f"numpy {meta['numpy']}, scipy {meta['scipy']}; load average at start {meta['load_start']}.  "
        f"Command: `{meta['command']}`.",
        "",
        "ratio = Cholesky time / Woodbury time (> 1: Woodbury faster).  auto = `mmvfl.core.choose_solver` "
        "(Woodbury iff d > N); 'flop model' = the cheaper by `mmvfl.core.solver_costs`; "
        "'auto cost' = auto's time / the faster time.  Cholesky's one-off "
        "X^T X is in 'setup' (not per step).  diff = max |W_chol - W_wood| / max |W_chol|.",
        "",
        "| dataset | view | N | d | Cholesky ms | Woodbury ms | ratio | setup ms | auto | flop model | faster | auto cost | diff |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---:|---:|",
    ]
    for r in rows:
        name = r["dataset"] + (" (stand-in)" if r["kind"] == "stand-in" else "")
        lines.append(
            f"| {name} | {r['view']} | {r['N']} | {r['d']} | {r['cholesky_s'] * 1e3:.2f} | "
            f"{r['woodbury_s'] * 1e3:.2f} | {r['ratio_chol_over_wood']:.2f} | {r['cholesky_setup_s'] * 1e3:.1f} | "
            f"{r['auto']} | {r['flop_model']} | {r['faster']} | {r['auto_loss']:.2f} | {r['max_rel_diff']:.1e} |")
    wrong = [r for r in rows if not r["auto_is_faster"]]
    flop_ok = sum(r["flop_model"] == r["faster"] for r in rows)
    lines += ["", f"auto (d > N) picked the faster solver in {len(rows) - len(wrong)} of {len(rows)} shapes"
              + (f"; where not, it cost at most x{max(r['auto_loss'] for r in wrong):.2f}" if wrong else "")
              + f".  The flop model would have picked it in {flop_ok} of {len(rows)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="Handwritten and Relathe views only, 2 repeats")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per solver and shape (best kept)")
    ap.add_argument("--data-dir", default=None, help="folder holding the dataset folders")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (0: leave the library default)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        ap.error("--repeats must be >= 1")
    meta = {
        "quick": args.quick, "repeats": repeats, "beta": BETA, "epsilon": EPSILON,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
        "numpy": np.__version__, "scipy": scipy.__version__,
        "load_start": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    session = harness.Session("mmvfl_solve", __file__, argv)
    meta["command"] = session.command
    names = ("handwritten", "relathe") if args.quick else dm.DATASETS
    rows: list[dict] = []
    with threadpool_limits(limits=args.threads if args.threads > 0 else None, user_api="blas"):
        meta["blas"] = [f"{i.get('internal_api')} {i.get('version')} x{i.get('num_threads')}"
                        for i in threadpool_info() if i.get("user_api") == "blas"]
        meta["threads"] = args.threads
        for name in names:
            rows += rows_for(name, repeats, args.data_dir, concatenated=not args.quick)
    meta["load_end"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    meta["environment"] = session.finish()
    paths = harness.Output("mmvfl_solve", args.quick).write({"meta": meta, "rows": rows}, to_markdown(rows, meta))
    print(f"wrote {paths['json']} and {paths['md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
