"""MMVFL, Figs. 3-6 analogues: accuracy vs p % per view, MMVFL vs supFL vs supMVLFL (mean over folds),
plus iterations to convergence and, as processes, per-iteration time of the local solve and of
plain vs secure aggregation of Z and bytes per participant per iteration.

MMVFL's accuracies come from ``mmvfl_core.run_centralized``, which the federated roles reproduce
exactly (tests/test_mmvfl_federated.py); beta is tuned per p, fold and view over the grid, as the
paper does.  Data: Handwritten, Isolet, Relathe are the paper's (real); MSRC-v5 is a STAND-IN for
Caltech7.  ``--quick``: Handwritten, fold 0, beta in {1e-2, 1}, 20 rounds.
Full: ``python benchmarks/mmvfl_figures.py`` (all four sets, 5 folds, beta 1e-5..10).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

from fedhet.algorithms import mmvfl, mmvfl_core as core  # noqa: E402
from fedhet.algorithms.data_multiview import TABLE2_SPLITS, cv_folds, load_multiview  # noqa: E402

PERCENTS = list(mmvfl.PAPER_PERCENTS)


def evaluate(name, folds, betas, max_iter):
    mv = load_multiview(name)
    tr, va = TABLE2_SPLITS[name]
    K = len(mv.views)
    acc = {m: np.zeros((len(folds), len(betas), K, len(PERCENTS))) for m in ("MMVFL", "supFL", "supMVLFL")}
    iters = []
    for fi, f in enumerate(folds):
        fold = cv_folds(mv.y, tr, va, 0)[f]
        Xs, Vs = [], []
        for X in mv.views:
            Xt = np.asarray(X, np.float64)[fold.train]
            m, s = core.fit_standardizer(Xt)
            Xs.append(core.standardize(Xt, m, s))
            Vs.append(core.standardize(np.asarray(X, np.float64)[fold.val], m, s))
        ytr, yva = mv.y[fold.train], mv.y[fold.val]
        for bi, beta in enumerate(betas):
            cs = core.MMVFLSettings(beta=beta, max_iter=max_iter)
            res = core.run_centralized(Xs, ytr, np.arange(ytr.size), cs, mv.n_classes)
            iters.append({"fold": f, "beta": beta, "iterations": res.iterations, "converged": res.converged})
            mvl = core.fit_supmvlfl(Xs, ytr, mv.n_classes, core.MMVFLSettings(beta=beta, max_iter=100))
            for k in range(K):
                lab = ytr if k == 0 else core.pseudo_labels(res.Z_views[k])
                sup = core.fit_supfl(Xs[k], ytr, mv.n_classes, core.MMVFLSettings(beta=beta, max_iter=100), k)
                for pi, p in enumerate(PERCENTS):
                    acc["MMVFL"][fi, bi, k, pi] = core.selection_accuracy(
                        Xs[k], lab, Vs[k], yva, core.feature_scores(res.W[k]), p)
                    acc["supFL"][fi, bi, k, pi] = core.selection_accuracy(
                        Xs[k], ytr, Vs[k], yva, core.feature_scores(sup.W[0]), p)
                    acc["supMVLFL"][fi, bi, k, pi] = core.selection_accuracy(
                        Xs[k], ytr, Vs[k], yva, core.feature_scores(mvl.W[k]), p)
    # tuned per p, fold and view (best beta), then the mean over folds
    curves = {m: a.max(axis=1).mean(axis=0).tolist() for m, a in acc.items()}
    return {"dataset": name, "kind": mv.kind, "note": mv.note, "views": list(mv.view_names),
            "folds": list(folds), "betas": list(betas), "percents": PERCENTS, "accuracy": curves,
            "iterations": iters}


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


def render(doc):
    lines = [f"# MMVFL figures{' (quick)' if doc['quick'] else ''}", "",
             "Accuracy (k-NN, 1 neighbour) on each view's validation rows with the top p % features; "
             "beta tuned per p, fold and view; mean over folds.", ""]
    for d in doc["datasets"]:
        lines += [f"## {d['dataset']} ({d['kind']}: {d['note']}) folds {d['folds']}, betas {d['betas']}", ""]
        lines += ["| view | method | " + " | ".join(f"{p:g}%" for p in d["percents"]) + " |",
                  "|---|---|" + "---|" * len(d["percents"])]
        for k, v in enumerate(d["views"]):
            for m, a in d["accuracy"].items():
                lines.append(f"| {v} | {m} | " + " | ".join(f"{x:.3f}" for x in a[k]) + " |")
        it = [r["iterations"] for r in d["iterations"]]
        lines += ["", f"Iterations to convergence (tol 1e-6): {it} "
                      f"(converged: {[r['converged'] for r in d['iterations']]})", ""]
    lines += ["## Per iteration, as processes (Handwritten, 5 participants + server)", "",
              "| aggregation | rows | agg Z s | agg objective s | local solve s (median over participants) | "
              "bytes sent / participant / iter |", "|---|---|---|---|---|---|"]
    for agg, r in doc["processes"].items():
        lines.append(f"| {agg} | {r['n_rows']} | {r['agg_z_s_per_iter']:.4f} | {r['agg_objective_s_per_iter']:.4f} | "
                     f"{np.median(list(r['local_solve_s_per_iter'].values())):.4f} | "
                     f"{np.median(list(r['bytes_sent_per_participant_per_iter'].values())):.0f} |")
    lines += ["", harness.environment_line(doc["environment"]), ""]
    return "\n".join(lines)


def figure(doc):
    plt = harness.pyplot()
    d = doc["datasets"][0]
    K = len(d["views"])
    fig, axes = plt.subplots(1, K, figsize=(3.2 * K, 3), squeeze=False)
    for k, ax in enumerate(axes[0]):
        for m, a in d["accuracy"].items():
            ax.plot(d["percents"], a[k], marker="o", ms=3, label=m)
        ax.set_title(f"{d['dataset']}: {d['views'][k]}")
        ax.set_xlabel("p %")
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__))
    a = ap.parse_args(argv)
    sess = harness.Session("mmvfl_figures", __file__, argv)
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        if a.quick:
            sets = [evaluate("handwritten", [0], [1e-2, 1.0], 20)]
        else:
            betas = [1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0]
            sets = [evaluate(n, range(5), betas, 200) for n in ("handwritten", "isolet", "relathe", "msrc_v5")]
    doc = {"quick": a.quick, "datasets": sets, "processes": processes(a.quick)}
    doc["environment"] = sess.finish()
    harness.Output("mmvfl_figures", a.quick, a.out).write(doc, render(doc), figure(doc))


if __name__ == "__main__":
    main()
