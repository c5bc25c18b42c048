"""F³'s Tables 2 and 3 and Fig. 3 (f3.txt): baselines A-M and the graph ablation, per data set.

* Data: Japanese Vowels (REAL, UCI: 12 owners, one LPC series each) and incident windows SIMULATED on
  the real METR-LA (207 sensors) / PEMS-BAY (325) road graphs (``fedhet.algorithms.f3.traffic``,
  reference split 70/10/20, seed 123).  The paper's METR-LA / PEMS-BAY numbers (real speeds, their
  labels) stand beside ours for the shape only: the data are not the same.
* Computed in one process in plaintext: fusing Shamir-shared representations gives the trusted
  (plaintext) fusion's model within the fixed-point error (``tests/test_f3.py``; on Vowels the K row
  gave the identical test F1), so the F³ rows are the federation's trusted path
  (``f3.training.train_global`` + ``plain_first_layer``).
* Local pre-training: every owner's LSTM at once (``f3.baselines.train_locals``, equal to training each
  alone), cached per (data set, seed, settings) under ``benchmarks/results/cache`` (git-ignored).
* Rows: A FedAvg of the local LSTMs (each owner uses the global model on its own series; scores
  averaged over owners), B majority vote, C binary thresholding of the vote share (binary only), D best
  local model by validation F1, E mean pooling (eq. 5), F Set Transformer (2 layers, 4 heads, Adam
  lr 1e-3: see SET_TRANSFORMER_LR), G
  concatenation, H F³ without alignment (ICDF graph), J parameter tying (ICDF), K alignment + ICDF,
  L VFL end to end from the pre-trained local models, M the same from scratch.  Table 3: graph none /
  given (traffic) / κ-NN (κ = 10) / ICDF / Gumbel-softmax, without and with (soft) alignment.
* Fig. 3: entropy of the owners' predicted labels per test sample (seed 0).

Full: ``python -m benchmarks.f3_tables`` (see ``--help`` for the traffic budget); ``--quick``: tiny.
"""
from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import harness
from fedhet.algorithms.f3 import OwnerData, owner_data, owner_seed
from fedhet.algorithms.f3 import baselines as B
from fedhet.algorithms.f3 import models as FM
from fedhet.algorithms.f3 import training as T
from fedhet.algorithms.toolkit import as_tensor, seeded

NAME = "f3_tables"
CACHE = harness.RESULTS / "cache"
DATASETS = ("vowels", "metr_la", "pems_bay")
LABELS = {"vowels": "Japanese Vowels (real)", "metr_la": "METR-LA (simulated)", "pems_bay": "PEMS-BAY (simulated)"}
PLAINTEXT = ("Computed in one process in plaintext (trusted fusion): Shamir fusion gives the same model within "
             "the fixed-point error (tests/test_f3.py; on Japanese Vowels row K's test F1 was identical).")
SIMULATED = ("Our METR-LA / PEMS-BAY data are SIMULATED incident windows on the real road graphs "
             "(algorithms/f3/traffic.md), not the real speeds; Japanese Vowels is real (UCI). The paper's "
             "numbers are on the real traffic data and stand beside ours for the shape only. The simulator "
             "was recalibrated in session 5 (incidents now slow a wide connected upstream footprint, so a lone "
             "sensor is a weak witness and the network a strong one; the first version's incidents reached too "
             "few sensors for any local model to learn): traffic rows from before that are void and were dropped.")
LOCAL = ("Local pre-training: all owners' LSTMs (1 -> 16, Adam lr 1e-3, batch 100) trained at once as one stacked "
         "module (f3.baselines.train_locals: per-owner weights, seeds, batch order and early stopping, equal to "
         "training each alone; tests/test_f3_baselines.py). Vowels: <= 200 epochs, patience 20 (the paper's); "
         "traffic: a FIXED small number of epochs with the best-validation state per owner, and fewer seeds and "
         "global epochs than Vowels (2 shared CPU cores) -- see the budgets above; a row with fewer seeds than "
         "listed did not finish. Rows absent ('–') were not computed.")
CITE = "Paper: f3.txt (Federated Feature Fusion), Tables 2 and 3; mean with std as superscript in the paper."

TABLE2 = [("A", "Horizontal FL (FedAvg of local LSTMs)"), ("B", "Majority voting"), ("C", "Binary thresholding"),
          ("D", "Best local model (validation)"), ("E", "Mean pooling, eq. (5)"), ("F", "Set Transformer"),
          ("G", "Concatenation"), ("H", "F³ w. no alignment (ICDF)"), ("J", "F³ w. parameter tying (ICDF)"),
          ("K", "F³ w. alignment + ICDF"), ("L", "VFL w. graph/alignment (end to end)"),
          ("M", "VFL w.o. pre-trained local")]
GRAPHS3 = [("none", "No graph"), ("given", "Given graph"), ("knn", "κ-NN graph"), ("icdf", "ICDF"),
           ("gumbel", "Gumbel-softmax")]
ALIGNS3 = [("none", "No align"), ("soft", "Align")]
# Baseline F's Adam rate.  At the global models' 1e-2 the set transformer collapsed to predicting one
# class on METR-LA in 4 of 5 seeds (F1 .368, the majority-class score) and on PEMS-BAY; at 1e-3, the
# usual rate for attention models, seed 0 reached F1 .751 (paper .78).  Rows F measured before this
# change were dropped.
SET_TRANSFORMER_LR = 1e-3
ROW_RUN = {"H": "gcn:none:icdf", "J": "gcn:tied:icdf", "K": "gcn:soft:icdf"}

# f3.txt Table 2 (F1, AUC; None = "-") and Table 3, METR-LA and PEMS-BAY columns: (mean, std)
PAPER2 = {
    "A": {"metr_la": ((.25, .000), None), "pems_bay": ((.33, .000), None)},
    "B": {"metr_la": ((.11, .000), None), "pems_bay": ((.09, .000), None)},
    "C": {"metr_la": ((.69, .000), None), "pems_bay": ((.64, .000), None)},
    "D": {"metr_la": ((.53, .000), (.70, .000)), "pems_bay": ((.55, .000), (.79, .000))},
    "E": {"metr_la": ((.77, .009), (.96, .004)), "pems_bay": ((.74, .012), (.93, .001))},
    "F": {"metr_la": ((.78, .023), (.94, .018)), "pems_bay": ((.72, .045), (.93, .027))},
    "G": {"metr_la": ((.83, .008), (.97, .002)), "pems_bay": ((.80, .066), (.96, .028))},
    "H": {"metr_la": ((.80, .009), (.96, .004)), "pems_bay": ((.75, .009), (.94, .001))},
    "J": {"metr_la": ((.82, .009), (.97, .001)), "pems_bay": ((.75, .009), (.94, .004))},
    "K": {"metr_la": ((.83, .010), (.97, .001)), "pems_bay": ((.86, .005), (.98, .002))},
    "L": {"metr_la": ((.83, .012), (.97, .001)), "pems_bay": ((.86, .014), (.98, .002))},
    "M": {"metr_la": ((.77, .020), (.94, .021)), "pems_bay": ((.77, .014), (.95, .006))},
}
PAPER3 = {   # (align, graph) -> dataset -> (F1, AUC); the text copy lost METR-LA's AUC of "Align, Given graph"
    ("none", "none"): {"metr_la": ((.768, .009), (.957, .004)), "pems_bay": ((.738, .012), (.935, .001))},
    ("none", "given"): {"metr_la": ((.763, .020), (.957, .007)), "pems_bay": ((.742, .024), (.942, .005))},
    ("none", "knn"): {"metr_la": ((.715, .015), (.952, .004)), "pems_bay": ((.695, .013), (.934, .004))},
    ("none", "icdf"): {"metr_la": ((.798, .009), (.963, .004)), "pems_bay": ((.755, .009), (.943, .001))},
    ("soft", "none"): {"metr_la": ((.813, .009), (.970, .002)), "pems_bay": ((.846, .008), (.977, .001))},
    ("soft", "given"): {"metr_la": ((.828, .007), None), "pems_bay": ((.854, .003), (.977, .001))},
    ("soft", "knn"): {"metr_la": ((.803, .020), (.968, .002)), "pems_bay": ((.855, .003), (.973, .002))},
    ("soft", "icdf"): {"metr_la": ((.835, .010), (.975, .001)), "pems_bay": ((.860, .005), (.980, .002))},
}


# ------------------------------------------------------------------------------ settings
def budget(args, dataset: str) -> dict:
    """Training budgets: the paper's for Vowels; a documented, smaller one for the costly traffic sets."""
    if args.quick:
        return {"local_epochs": 3, "local_patience": 3, "epochs": 3, "patience": 3, "fedavg_rounds": 2,
                "fedavg_local_epochs": 1, "n_windows": 200, "n_sensors": 12}
    if dataset == "vowels":
        return {"local_epochs": 200, "local_patience": 20, "epochs": 100, "patience": 20, "fedavg_rounds": 10,
                "fedavg_local_epochs": 2, "n_windows": None, "n_sensors": None}
    return {"local_epochs": args.traffic_local_epochs, "local_patience": args.traffic_local_epochs,
            "epochs": args.traffic_epochs, "patience": args.traffic_patience, "fedavg_rounds": 5,
            "fedavg_local_epochs": 1, "n_windows": None, "n_sensors": None}


def local_cfgs(seed: int, n: int, b: dict) -> list[T.LocalConfig]:
    # the federation's seeds (f3.owner_seed: seed * F3_OWNER_STRIDE + owner index)
    return [T.LocalConfig(epochs=b["local_epochs"], patience=b["local_patience"], seed=owner_seed(seed, i))
            for i in range(n)]


def global_cfg(seed: int, b: dict, align: str = "soft", graph: str = "icdf") -> T.GlobalConfig:
    return T.GlobalConfig(align=align, graph=graph, epochs=b["epochs"], patience=b["patience"], seed=seed)


# ----------------------------------------------------------------------- pre-training (cached)
def all_rows(data: OwnerData):
    x = np.concatenate([data.splits[k][0] for k in ("train", "val", "test")], 1)
    ln = None if data.splits["train"][1] is None else np.concatenate([data.splits[k][1] for k in ("train", "val", "test")])
    return x, ln


def pretrained(dataset: str, data: OwnerData, seed: int, b: dict, quick: bool) -> dict:
    """Owners' frozen local models: representations and probabilities of every row, and the stacked weights."""
    key = f"{dataset}_s{seed}_le{b['local_epochs']}_lp{b['local_patience']}" + ("_quick" if quick else "")
    path = CACHE / f"f3_local_{key}.npz"
    if path.exists():
        z = np.load(path)
        return {k: z[k] for k in z.files}
    (x, ln, y), (xv, lv, yv) = data.splits["train"], data.splits["val"]
    t0 = time.perf_counter()
    model, infos = B.train_locals(x, ln, y, xv, lv, yv, data.n_classes, local_cfgs(seed, data.n_owners, b),
                                  progress=lambda e, s: print(f"  [{dataset} s{seed}] local epoch {e}: {s} stopped",
                                                              flush=True) if e % 10 == 0 else None)
    xa, la = all_rows(data)
    h, p = B.grouped_outputs(model, xa, la)
    out = {"h": h.astype(np.float32), "p": p, "local_epochs": np.array([i["epochs"] for i in infos]),
           "local_s": np.array(time.perf_counter() - t0),
           **{f"w_{k}": v.detach().cpu().numpy() for k, v in model.state_dict().items()}}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, **out)
    tmp.replace(path)
    return out


def grouped_from(pre: dict, n_classes: int) -> B.GroupedLSTM:
    g, fourh, ind = pre["w_w_ih"].shape
    m = B.GroupedLSTM(g, n_classes, fourh // 4, ind)
    m.load_state_dict({k[2:]: torch.as_tensor(v) for k, v in pre.items() if k.startswith("w_")})
    return m


# ---------------------------------------------------------------------------------- the rows
def run_key(key: str, data: OwnerData, pre: dict, seed: int, b: dict) -> dict:
    """Test scores (and a few facts) of one row for one seed."""
    y, pos = data.labels(), data.positions()
    trp, vap, tep = pos["train"], pos["val"], pos["test"]
    C, n = data.n_classes, data.n_owners
    yt, yv = y[tep], y[vap]
    probs = pre["p"]
    reps = [pre["h"][i].astype(np.float64) for i in range(n)]
    dims = [reps[0].shape[1]] * n
    if key == "B":
        return T.scores(B.majority_vote(probs[:, tep], C), yt, C)
    if key == "C":
        if C != 2:
            return {"na": "binary tasks only"}
        sc, thr = B.threshold_vote(probs[:, tep], probs[:, vap], yv)
        return {**T.scores(sc, yt, C), "threshold": thr}
    if key == "D":
        g = B.best_local(probs[:, vap], yv, C)
        return {**T.scores(probs[g, tep], yt, C), "owner": g}
    if key == "A":
        (x, ln, ytr), (xv, lv, yvv) = data.splits["train"], data.splits["val"]
        xt, lt, _ = data.splits["test"]
        cfg = T.LocalConfig(seed=owner_seed(seed, 0))
        model, hist = B.fedavg_locals(x, ln, ytr, xv, lv, yvv, C, cfg, rounds=b["fedavg_rounds"],
                                      local_epochs=b["fedavg_local_epochs"])
        per = [T.scores(T.local_probabilities(model, xt[i], lt), yt, C) for i in range(n)]
        return {"f1": float(np.mean([s["f1"] for s in per])), "auc": float(np.nanmean([s["auc"] for s in per])),
                "rounds_kept": int(np.argmin([h["val_loss"] for h in hist]) + 1)}
    if key.startswith("gcn:"):
        _, align, graph = key.split(":")
        gcfg = global_cfg(seed, b, align, graph)
        model = T.build_global(n, dims, C, gcfg, given=data.adj)
        first = T.plain_first_layer(model, reps)
        hist = T.train_global(model, first, y, trp, vap, gcfg)
        return {**T.scores(T.predict(model, first, tep, gcfg.batch), yt, C), "epochs": len(hist)}
    gcfg = global_cfg(seed, b)
    if key in ("L", "M"):
        xa, la = all_rows(data)
        if key == "L":
            local = grouped_from(pre, C)
        else:
            locals_ = []
            for c in local_cfgs(seed, n, b):
                with seeded(c.seed):
                    locals_.append(FM.LocalLSTM(C, hidden=c.hidden, in_dim=xa.shape[-1]))
            local = B.GroupedLSTM.from_locals(locals_)
        model = B.EndToEndVFL(local, T.build_global(n, dims, C, gcfg))
        model.gcn.generator = torch.Generator().manual_seed(seed + 1)
        xt_all = as_tensor(xa)
        lt_all = None if la is None else torch.as_tensor(la)

        def rows_fn(rows):
            r = torch.as_tensor(rows)
            lb = None if lt_all is None else lt_all[r][None].expand(n, -1)
            return model(xt_all[:, r], lb)
        groups = [{"params": list(model.local.parameters()), "lr": T.LocalConfig().lr},
                  {"params": list(model.gcn.parameters()), "lr": gcfg.lr}]
        hist = B.train_model(model, rows_fn, y, trp, vap, gcfg, param_groups=groups)
        return {**T.scores(B.predict_model(model, rows_fn, tep, gcfg.batch), yt, C), "epochs": len(hist)}
    hs = [torch.as_tensor(h, dtype=torch.float32) for h in reps]
    with seeded(seed):
        if key == "E":
            model = FM.MeanPool(dims[0], C)
        elif key == "G":
            model = FM.Concat(dims, C)
        elif key == "F":
            model = B.SetTransformer(dims[0], C, d=16, heads=4, layers=2)
        elif key.startswith("knn:"):
            model = B.KnnGCN(n, dims, gcfg.d, gcfg.hidden, C, align=key.split(":")[1], kappa=10)
        else:
            raise ValueError(f"unknown row {key!r}")

    def fwd(rows):
        r = torch.as_tensor(rows)
        return model([h[r] for h in hs])
    if key == "F":
        gcfg = dataclasses.replace(gcfg, lr=SET_TRANSFORMER_LR)
    hist = B.train_model(model, fwd, y, trp, vap, gcfg)
    return {**T.scores(B.predict_model(model, fwd, tep, gcfg.batch), yt, C), "epochs": len(hist),
            "lr": gcfg.lr}


def keys_for(dataset: str) -> list[str]:
    t2 = [k for k, _ in TABLE2 if k not in ROW_RUN]
    t3 = [f"knn:{a}" if g == "knn" else f"gcn:{a}:{g}" for a, _ in ALIGNS3 for g, _ in GRAPHS3
          if not (g == "given" and dataset == "vowels")]
    keys = t2 + list(ROW_RUN.values()) + t3
    return list(dict.fromkeys(keys))


# ------------------------------------------------------------------------------- rendering
def agg(runs: dict) -> dict:
    out = {}
    for m in ("f1", "auc"):
        v = [r[m] for r in runs.values() if m in r and r[m] == r[m]]
        if v:
            out[m] = (float(np.mean(v)), float(np.std(v)), len(v))
    if runs and all("na" in r for r in runs.values()):
        out["na"] = next(iter(runs.values()))["na"]
    return out


def fmt(a: dict, m: str) -> str:
    if "na" in a:
        return "N/A"
    if m not in a:
        return "–"
    mu, sd, k = a[m]
    return f"{mu:.3f} ± {sd:.3f}" + (f" (n={k})" if k < 5 else "")


def fmt_paper(p, i) -> str:
    if p is None or p[i] is None:
        return "–"
    mu, sd = p[i]
    return f"{mu:.3f} ± {sd:.3f}"


def shape_checks(res: dict) -> list[str]:
    lines = []
    for ds, r in res.items():
        def f1(key):
            a = agg(r["runs"].get(key, {}))
            return a.get("f1", (float("nan"),))[0]
        K, H, E, G, L, M = (f1(ROW_RUN["K"]), f1(ROW_RUN["H"]), f1("E"), f1("G"), f1("L"), f1("M"))
        chk = [f"K ≥ H: {K:.3f} vs {H:.3f} {'yes' if K >= H else 'NO'}",
               f"K ≥ E: {K:.3f} vs {E:.3f} {'yes' if K >= E else 'NO'}",
               f"K ≥ G: {K:.3f} vs {G:.3f} {'yes' if K >= G else 'NO'}"]
        for a in ("none", "soft"):
            i, nn_ = f1(f"gcn:{a}:icdf"), f1(f"gcn:{a}:none")
            chk.append(f"ICDF ≥ no graph ({a} align): {i:.3f} vs {nn_:.3f} {'yes' if i >= nn_ else 'NO'}")
        sdk = agg(r["runs"].get(ROW_RUN["K"], {})).get("f1", (0, 0.0))[1]
        chk.append(f"L ≈ K: {L:.3f} vs {K:.3f} (|Δ| {abs(L - K):.3f}, K's std {sdk:.3f})")
        chk.append(f"M < K: {M:.3f} vs {K:.3f} {'yes' if M < K else 'NO'}")
        chk = [c.replace("NO", "not computed") if "nan" in c else c for c in chk]
        lines.append(f"- **{LABELS[ds]}**: " + "; ".join(chk))
    return lines


def environment_lines(doc: dict) -> list[str]:
    """One 'Measured on' line per data set that ran separately (its own ``environment``), else the doc's."""
    res = doc["datasets"]
    own = [d for d in DATASETS if d in res and res[d].get("environment")]
    if not own:
        return [harness.environment_line(doc.get("environment"))]
    # runs merged from several processes keep the commits they ran from ("commits"); the line is the last's
    return [f"{LABELS[d]}: {harness.environment_line(res[d]['environment'])}"
            + (f" Rows from commits {', '.join(res[d]['commits'])}." if len(res[d].get("commits", [])) > 1 else "")
            for d in own]


def render(doc: dict) -> tuple[str, str]:
    res = doc["datasets"]
    dss = [d for d in DATASETS if d in res]
    head = ["Seeds asked for (n = seeds finished, shown where < 5) and budgets: " + "; ".join(
        f"{LABELS[d]}: seeds {res[d]['seeds']}, {res[d]['budget']}" for d in dss), "", LOCAL, "", PLAINTEXT, "", SIMULATED, "",
        CITE, ""]
    t2 = ["# F³ Table 2 (ours beside the paper)", "", *head,
          "| row | " + " | ".join(f"{LABELS[d]} F1 | AUC" for d in dss) + " | paper METR-LA F1 | AUC | paper PEMS-BAY F1 | AUC |",
          "|---|" + "---|---|" * len(dss) + "---|---|---|---|"]
    for k, label in TABLE2:
        key = ROW_RUN.get(k, k)
        cells = []
        for d in dss:
            a = agg(res[d]["runs"].get(key, {}))
            cells += [fmt(a, "f1"), fmt(a, "auc")]
        p = PAPER2[k]
        cells += [fmt_paper(p["metr_la"], 0), fmt_paper(p["metr_la"], 1), fmt_paper(p["pems_bay"], 0),
                  fmt_paper(p["pems_bay"], 1)]
        t2.append(f"| {k}: {label} | " + " | ".join(cells) + " |")
    t2 += ["", "B's and C's AUC (ours) rank rows by the vote share; the paper gives none. A: each owner uses the "
           "FedAvg model on its own series, F1/AUC averaged over owners. F: Adam lr 1e-3 (SET_TRANSFORMER_LR); "
           "the rows first measured at the global models' 1e-2 collapsed to one class on the traffic sets (F1 "
           ".368 on METR-LA in 4 of 5 seeds) and were dropped.", "",
           "Shape the issue asks for (F1 means):", *shape_checks(res), "", *environment_lines(doc)]
    t3 = ["# F³ Table 3: graph learning with and without alignment (ours beside the paper)", "", *head,
          "| alignment | graph | " + " | ".join(f"{LABELS[d]} F1 | AUC" for d in dss)
          + " | paper METR-LA F1 | AUC | paper PEMS-BAY F1 | AUC |",
          "|---|---|" + "---|---|" * len(dss) + "---|---|---|---|"]
    for a, al in ALIGNS3:
        for g, gl in GRAPHS3:
            key = f"knn:{a}" if g == "knn" else f"gcn:{a}:{g}"
            cells = []
            for d in dss:
                aa = agg(res[d]["runs"].get(key, {})) if not (g == "given" and d == "vowels") else {"na": "no graph"}
                cells += [fmt(aa, "f1"), fmt(aa, "auc")]
            p = PAPER3.get((a, g))
            if p is None:
                cells += ["(not in paper)"] * 4
            else:
                cells += [fmt_paper(p["metr_la"], 0), fmt_paper(p["metr_la"], 1), fmt_paper(p["pems_bay"], 0),
                          fmt_paper(p["pems_bay"], 1)]
            t3.append(f"| {al} | {gl} | " + " | ".join(cells) + " |")
    t3 += ["", "κ-NN: κ = 10 (Vowels: all 11 others) on the cosine similarity of an MLP projection of the node "
           "features, one graph per sample. Gumbel-softmax: binary Concrete with the same θ and τ = 0.1. "
           "The paper's METR-LA AUC for 'Align, Given graph' is not legible in our text copy (–).", "",
           *environment_lines(doc)]
    return "\n".join(t2) + "\n", "\n".join(t3) + "\n"


def figures(doc: dict):
    plt = harness.pyplot()
    res = doc["datasets"]
    dss = [d for d in DATASETS if d in res]
    figs = {}
    # Table 2: one horizontal bar per row A-M, named by its method (on the left, shared by the panels).
    fig, axes = plt.subplots(1, len(dss), figsize=(3.6 + 3.6 * len(dss), 6.4), squeeze=False, sharey=True,
                             layout="constrained")
    y = np.arange(len(TABLE2))
    bars = {}
    for ax, d in zip(axes[0], dss):
        a = [agg(res[d]["runs"].get(ROW_RUN.get(k, k), {})) for k, _ in TABLE2]
        mus = [x.get("f1", (np.nan, 0))[0] for x in a]
        sds = [x.get("f1", (np.nan, 0))[1] for x in a]
        paper = d in ("metr_la", "pems_bay")
        h = 0.4 if paper else 0.7
        bars["ours"] = ax.barh(y - (h / 2 if paper else 0), mus, h, xerr=sds, color="C0", capsize=2)
        if paper:
            bars["paper"] = ax.barh(y + h / 2, [PAPER2[k][d][0][0] for k, _ in TABLE2], h, color="C1", alpha=0.6)
        for yi, x in zip(y, a):
            if "f1" not in x:   # a row this data set does not have (C: binary tasks only) or not computed
                ax.text(0.01, yi, x.get("na", "not computed"), va="center", fontsize=9, color="0.35")
        ax.set_title(f"Table 2, {LABELS[d]}", fontsize=12)
        ax.set_xlabel("macro F1")
        ax.set_xlim(0, 1)
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(y, [f"{k}  {name}" for k, name in TABLE2])
    axes[0][0].invert_yaxis()
    names = {"ours": "ours (mean ± std over seeds)", "paper": "paper (real traffic data)"}
    harness.figure_legend(fig, list(bars.values()), [names[k] for k in bars])
    figs["t2"] = fig
    fig, axes = plt.subplots(1, len(dss), figsize=(5 * len(dss), 3.6), squeeze=False)
    for ax, d in zip(axes[0], dss):
        for j, (a, al) in enumerate(ALIGNS3):
            keys = [f"knn:{a}" if g == "knn" else f"gcn:{a}:{g}" for g, _ in GRAPHS3]
            mus = [agg(res[d]["runs"].get(k, {})).get("f1", (np.nan, 0))[0] for k in keys]
            sds = [agg(res[d]["runs"].get(k, {})).get("f1", (np.nan, 0))[1] for k in keys]
            ax.bar(np.arange(len(keys)) + (j - 0.5) * 0.4, mus, 0.4, yerr=sds, label=al)
        ax.set_xticks(np.arange(len(GRAPHS3)), [g for _, g in GRAPHS3], fontsize=7)
        ax.set_title(f"Table 3, {LABELS[d]}")
        ax.set_ylabel("macro F1")
        ax.legend(fontsize=7)
    fig.tight_layout()
    figs["t3"] = fig
    fig, axes = plt.subplots(1, len(dss), figsize=(4 * len(dss), 3.2), squeeze=False)
    for ax, d in zip(axes[0], dss):
        e = np.asarray(res[d].get("entropy", []))
        ax.hist(e, bins=30)
        ax.set_title(f"{LABELS[d]}: {len(e)} test rows")
        ax.set_xlabel("entropy of the owners' predicted labels (nats)")
    fig.suptitle("Fig. 3: distributions of prediction entropy (seed 0)")
    fig.tight_layout()
    figs["fig3"] = fig
    return figs


def write_all(doc: dict, quick: bool, out: Path) -> None:
    t2, t3 = render(doc)
    figs = figures(doc)
    # Table 3 and Fig. 3 are drawn from f3_table2.json's runs: they name that file's run (commit, machine).
    source = {"environment": doc["environment"]} if "environment" in doc else {}
    harness.Output("f3_table2", quick, out).write(doc, t2, figs["t2"])
    harness.Output("f3_table3", quick, out).write({"see": "f3_table2.json", **source}, t3, figs["t3"])
    harness.Output("f3_fig3", quick, out).write(
        {**{d: {"entropy_summary": _summary(r.get("entropy", []))} for d, r in doc["datasets"].items()}, **source},
        "# F³ Fig. 3: entropy of the owners' predicted labels per test sample\n\n" + "\n".join(
            f"- {LABELS[d]}: " + ", ".join(f"{k} {v:.3f}" for k, v in _summary(r.get("entropy", [])).items())
            for d, r in doc["datasets"].items()) + f"\n\n{SIMULATED}\n", figs["fig3"])


def _summary(e) -> dict:
    e = np.asarray(e, dtype=float)
    if not len(e):
        return {}
    return {"mean": float(e.mean()), "median": float(np.median(e)), "share_above_0.1": float((e > 0.1).mean()),
            "max": float(e.max())}


# ------------------------------------------------------------------------------------ main
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_common_args(ap, render_only=True)
    ap.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=DATASETS)
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="Vowels seeds (default 0-4; quick: 0)")
    ap.add_argument("--traffic-seeds", type=int, nargs="+", default=None, help="traffic seeds (default 0)")
    ap.add_argument("--traffic-local-epochs", type=int, default=10,
                    help="traffic local pre-training: fixed epochs, best-validation state per owner")
    ap.add_argument("--traffic-epochs", type=int, default=30, help="traffic global epochs at most")
    ap.add_argument("--traffic-patience", type=int, default=10)
    ap.add_argument("--only", nargs="+", default=None, help="run only these row keys (see keys_for)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)        # a shared 2-core machine: one thread wastes no time spinning
    out = harness.Output("f3_table2", args.quick, args.out)
    session = harness.Session(NAME, __file__, argv)
    try:
        doc = out.read()
    except (FileNotFoundError, ValueError):
        doc = {"datasets": {}}
    if args.render_only:
        write_all(doc, args.quick, args.out)
        return
    for ds in args.datasets:
        b = budget(args, ds)
        seeds = (args.seeds or ([0] if args.quick else [0, 1, 2, 3, 4])) if ds == "vowels" else \
            (args.traffic_seeds or [0])
        kw = {} if ds == "vowels" else {"n_windows": b["n_windows"], "n_sensors": b["n_sensors"]}
        data = owner_data(ds, **kw)
        r = doc["datasets"].setdefault(ds, {"runs": {}})
        r.update({"provenance": data.provenance, "n_owners": data.n_owners, "budget": b,
                  "seeds": sorted(set(r.get("seeds", [])) | set(seeds))})
        for seed in seeds:
            t0 = time.perf_counter()
            pre = pretrained(ds, data, seed, b, args.quick)
            print(f"[{ds} s{seed}] local models ready in {time.perf_counter() - t0:.0f}s", flush=True)
            if seed == seeds[0]:
                tep = data.positions()["test"]
                r["entropy"] = [float(v) for v in T.entropy(B.majority_vote(pre["p"][:, tep], data.n_classes))]
                r["local_test_f1"] = [T.scores(pre["p"][i, tep], data.labels()[tep], data.n_classes)["f1"]
                                      for i in range(data.n_owners)]
            for key in keys_for(ds):
                if args.only and key not in args.only:
                    continue
                if str(seed) in r["runs"].get(key, {}):
                    continue
                t0 = time.perf_counter()
                res = run_key(key, data, pre, seed, b)
                res["wall_s"] = time.perf_counter() - t0
                r["runs"].setdefault(key, {})[str(seed)] = res
                print(f"[{ds} s{seed}] {key}: {res}", flush=True)
                doc["environment"] = session.finish()
                out.write(doc)
        write_all(doc, args.quick, args.out)
    doc["environment"] = session.finish()
    write_all(doc, args.quick, args.out)


if __name__ == "__main__":
    main()
