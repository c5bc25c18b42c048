"""F³ accuracy with ``fusion = "mpc"`` against trusted fusion: does computing the first layer, ReLU and the
pooling on 2-of-3 replicated shares cost any test F1?

Per data set and seed the owners pre-train their local LSTMs ONCE (``f3.pretrain_owner``, the seed in the
settings' ``seed``); from those frozen representations the global GCN of eq. (8) (ReLU, soft alignment) is
trained from ONE initial state twice, with the same batches:

* **trusted**: the representations in the clear at the coordinator (``training.plain_first_layer``);
* **mpc**: the three holders in this process (``mpc.InProcessMpc``, the federation's holder code in threads)
  behind ``mpc.SharedLogits``; the coordinator sees logits and batch-summed gradients only.

Both use the graph mpc supports: "none" (Japanese Vowels has no given graph) or "given" (the METR-LA road
graph).  A third row, trusted with the learned ICDF graph (eq. 9, the preset's), is the reference: what mpc
gives up by not learning the graph.  Target: |F1(mpc) - F1(trusted)| <= 0.02 on every seed.

Data: Japanese Vowels (REAL, UCI: 12 owners) and METR-LA at 207 owners (SYNTHETIC: incident windows simulated
on the real road graph).  Time per epoch is measured in this process (three holder threads), for
information only: the cost of mpc as processes is measured elsewhere.

The results are written after every seed; ``--resume`` keeps the seeds already in the JSON (same settings)
and runs the rest; ``--only NAME`` runs one data set and keeps the other's results; ``--budget-min`` starts no seed that would, by the previous seed's time, end past it.
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from benchmarks import harness

from fedhet.algorithms import f3
from fedhet.algorithms.f3 import mpc
from fedhet.algorithms.f3 import training as T
from fedhet.algorithms.f3.data import provenance, traffic_graph
from fedhet.parties.contract import PartyContext
from fedhet.parties.settings import parse_settings, settings_dict

TOLERANCE = 0.02
MODES = ("trusted", "shamir_linear", "mpc", "trusted_icdf")   # shamir_linear: in the summary where measured
CONTROL = "trusted_rounded"     # trusted on h rounded to mpc's fixed point: how far a tiny perturbation moves F1


def plans(quick: bool, a) -> dict:
    """Per data set: the settings (the presets', cut where noted) and the seeds."""
    if quick:
        return {"vowels": {"settings": {"dataset": "vowels", "local_epochs": 5, "epochs": 3, "patience": 3},
                           "mpc_graph": "none", "seeds": [0]},
                "metr_la": {"settings": {"dataset": "metr_la", "n_sensors": 8, "local_epochs": 2, "epochs": 3,
                                         "patience": 3},
                            "mpc_graph": "given", "seeds": [0]}}
    return {"vowels": {"settings": {"dataset": "vowels", "local_epochs": a.vowels_local_epochs,
                                    "epochs": a.vowels_epochs, "patience": 20},
                       "mpc_graph": "none", "seeds": list(range(a.vowels_seeds))},
            "metr_la": {"settings": {"dataset": "metr_la", "local_epochs": a.metr_local_epochs,
                                     "epochs": a.metr_epochs, "patience": 20},
                        "mpc_graph": "given", "seeds": list(range(a.metr_seeds))}}


def pretrain(s: f3.Settings) -> tuple[list[np.ndarray], np.ndarray, dict]:
    """Every owner's Algorithm 1 lines 1-4, once: the frozen representations and the labels."""
    n = f3.n_owners(s)
    t0 = time.perf_counter()
    reps, y, epochs = [], None, []
    for i in range(n):
        data = f3.load_data(s, PartyContext(f"o{i}", f3.OWNER, i, n))
        st = f3.pretrain_owner(s, data, i, n)
        reps.append(st.reps)
        epochs.append(st.info["epochs"])
        y = st.y if y is None else y
    return reps, y, {"seconds": time.perf_counter() - t0, "local_epochs_mean": float(np.mean(epochs)),
                     "local_epochs_max": int(np.max(epochs))}


def global_config(s: f3.Settings, graph: str) -> T.GlobalConfig:
    """The coordinator role's GlobalConfig (fedhet.algorithms.f3.roles.coordinator) with ``graph``."""
    return T.GlobalConfig(d=s.d, hidden=s.hidden, align=s.align, graph=graph, tau=s.tau,
                          test_samples=s.test_samples, epochs=s.epochs, patience=s.patience, lr=s.lr,
                          batch=s.batch, seed=s.seed)


def train_one(mode: str, s: f3.Settings, cfg: T.GlobalConfig, init: dict, reps, y, adj, n_classes: int) -> dict:
    """Train the global model from ``init`` with the first layer of ``mode``; test scores and timings."""
    widths = [r.shape[1] for r in reps]
    model = T.build_global(len(reps), widths, n_classes, cfg, given=adj if cfg.graph == "given" else None)
    model.load_state_dict(init)
    link = None
    link: mpc.InProcessMpc | f3.InProcessHolders | None = None
    if mode == "mpc":
        link = mpc.InProcessMpc(reps)
        first = mpc.SharedLogits(model, link, widths)
    elif mode == "shamir_linear":
        link = f3.InProcessHolders(reps, s, m=3, seed=s.seed)
        first = f3.SharedFirstLayer(model, link, widths)
    else:
        first = T.plain_first_layer(model, reps)
    tr, va, te = f3.n_rows(s)
    pos = np.arange(tr + va + te)
    t0 = time.perf_counter()
    try:
        hist = T.train_global(model, first, y, pos[:tr], pos[tr:tr + va], cfg)
        probs = T.predict(model, first, pos[tr + va:], cfg.batch)
    except ValueError as e:            # mpc's fixed-point room check: reported, not hidden
        return {"mode": mode, "graph": cfg.graph, "error": str(e)}
    out = {"mode": mode, "graph": cfg.graph, "test": T.scores(probs, y[pos[tr + va:]], n_classes),
           "epochs": len(hist), "best_epoch": int(np.argmin([h["val_loss"] for h in hist])) + 1,
           "best_val_loss": float(min(h["val_loss"] for h in hist)),
           "first_epoch_val_loss": hist[0]["val_loss"],
           "train_s_per_epoch": float(np.median([h["train_s"] for h in hist])),
           "epoch_s": float(np.median([h["epoch_s"] for h in hist])),
           "wall_s": time.perf_counter() - t0, "probs": probs}
    if link is not None:
        out.update({"steps": link.step, "holder_s": link.wait_s})
    return out


def run_seed(name: str, plan: dict, seed: int, log) -> dict:
    s = parse_settings(f3.Settings, {**plan["settings"], "seed": seed}, "f3")
    reps, y, local = pretrain(s)
    log(f"{name} seed {seed}: pre-trained {len(reps)} owners in {local['seconds']:.0f} s")
    n_classes = 9 if s.dataset == "vowels" else 2
    adj = traffic_graph(s) if s.dataset != "vowels" else None
    widths = [r.shape[1] for r in reps]
    cfg = global_config(s, plan["mpc_graph"])
    init = copy.deepcopy(T.build_global(len(reps), widths, n_classes, cfg, given=adj).state_dict())
    modes = {}
    for mode in ("trusted", "shamir_linear", "mpc"):
        modes[mode] = train_one(mode, s, cfg, init, reps, y, adj, n_classes)
        log(f"{name} seed {seed}: {mode} {_brief(modes[mode])}")
    modes["shamir_linear"].pop("probs", None)
    rounded = [np.ldexp(np.rint(np.ldexp(r, mpc.H_BITS)), -mpc.H_BITS) for r in reps]
    modes[CONTROL] = train_one("trusted", s, cfg, init, rounded, y, adj, n_classes)
    modes[CONTROL].pop("probs", None)
    log(f"{name} seed {seed}: trusted on rounded h {_brief(modes[CONTROL])}")
    pt, pm = (modes[m].pop("probs", None) for m in ("trusted", "mpc"))
    prob_diff = float(np.abs(pt - pm).max()) if pt is not None and pm is not None else None
    icfg = global_config(s, "icdf")
    iinit = T.build_global(len(reps), widths, n_classes, icfg).state_dict()
    modes["trusted_icdf"] = train_one("trusted", s, icfg, iinit, reps, y, None, n_classes)
    modes["trusted_icdf"].pop("probs", None)
    log(f"{name} seed {seed}: trusted icdf {_brief(modes['trusted_icdf'])}")
    return {"seed": seed, "local": local, "modes": modes, "max_abs_test_prob_diff": prob_diff}


def _brief(r: dict) -> str:
    if "error" in r:
        return f"ERROR {r['error']}"
    return (f"F1 {r['test']['f1']:.4f} AUC {r['test']['auc']:.4f} epochs {r['epochs']} "
            f"{r['train_s_per_epoch']:.2f} s/epoch (train)")


# ------------------------------------------------------------------------------------- summary
def _f1(r: dict) -> float:
    return float("nan") if "error" in r else r["test"]["f1"]


def summarise(ds: dict) -> dict:
    runs = ds["runs"]
    out = {"seeds": [r["seed"] for r in runs], "modes": {}}
    for m in MODES:
        if not any(m in r["modes"] for r in runs):
            continue
        ok = [r["modes"][m] for r in runs if m in r["modes"] and "error" not in r["modes"][m]]
        f1 = [x["test"]["f1"] for x in ok]
        auc = [x["test"]["auc"] for x in ok]
        out["modes"][m] = {"n": len(ok), "errors": len(runs) - len(ok),
                           "f1_mean": _mean(f1), "f1_std": _std(f1), "auc_mean": _mean(auc), "auc_std": _std(auc),
                           "epochs_mean": _mean([x["epochs"] for x in ok]),
                           "train_s_per_epoch": _mean([x["train_s_per_epoch"] for x in ok]),
                           "epoch_s": _mean([x["epoch_s"] for x in ok])}
    diffs = [_f1(r["modes"]["mpc"]) - _f1(r["modes"]["trusted"]) for r in runs]
    out["delta_f1"] = diffs
    ctrl = [_f1(r["modes"][CONTROL]) - _f1(r["modes"]["trusted"]) for r in runs if CONTROL in r["modes"]]
    out["control_delta_f1"] = ctrl
    out["control_max_abs_delta_f1"] = float(np.max(np.abs(ctrl))) if ctrl else None
    out["max_abs_delta_f1"] = float(np.max(np.abs(diffs))) if diffs else float("nan")
    out["within"] = bool(diffs) and bool(np.all(np.abs(diffs) <= TOLERANCE))   # nan (an error) fails
    t, p = out["modes"]["trusted"], out["modes"]["mpc"]
    out["time_ratio"] = p["train_s_per_epoch"] / t["train_s_per_epoch"] if t["train_s_per_epoch"] else float("nan")
    out["icdf_minus_mpc_f1"] = out["modes"]["trusted_icdf"]["f1_mean"] - p["f1_mean"]
    return out


def _mean(x) -> float:
    return float(np.mean(x)) if len(x) else float("nan")


def _std(x) -> float:
    return float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")


def _pm(m: float, s: float) -> str:
    return f"{m:.4f}" + ("" if np.isnan(s) else f" ± {s:.4f}")


def render(doc: dict) -> str:
    lines = ["# F³ accuracy: mpc fusion vs trusted fusion", "",
             "The global GCN of eq. (8) (ReLU, soft alignment) trained per seed from ONE initial state and the same "
             "frozen local representations, with the first layer, ReLU and pooling in the clear (trusted), the "
             "first layer on Shamir shares (shamir_linear, where measured) or everything up to the logits on "
             "2-of-3 replicated shares (mpc, three holders in this process).  Graph: the one mpc supports (none: "
             "Japanese Vowels has no given graph; given: the road graph).  Reference: trusted with the learned ICDF "
             f"graph (not possible with mpc).  Target: |ΔF1| = |F1(mpc) - F1(trusted)| ≤ {TOLERANCE} on every seed.",
             "", "## Test macro F1 and AUC (mean ± standard deviation over seeds)", "",
             "| data | data set | owners | mode | graph | seeds | F1 | AUC | epochs (mean) | train s / epoch "
             "(median, in process) | epoch s with validation |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, ds in doc["datasets"].items():
        sm = ds.get("summary")
        if not sm:
            continue
        for m in (m for m in MODES if m in sm["modes"]):
            x = sm["modes"][m]
            graph = "icdf" if m == "trusted_icdf" else ds["mpc_graph"]
            label = "trusted (reference)" if m == "trusted_icdf" else m
            lines.append(f"| {ds['data']} | {name} | {ds['n_owners']} | {label} | {graph} | {x['n']}"
                         + (f" ({x['errors']} failed)" if x["errors"] else "")
                         + f" | {_pm(x['f1_mean'], x['f1_std'])} | {_pm(x['auc_mean'], x['auc_std'])} | "
                         f"{x['epochs_mean']:.1f} | {x['train_s_per_epoch']:.3f} | {x['epoch_s']:.3f} |")
    lines += ["", "## Per seed", "",
              "| data | data set | seed | F1 trusted | F1 mpc | ΔF1 (mpc - trusted) | AUC trusted | AUC mpc | "
              f"ΔF1 control (trusted on h rounded to 2^-{mpc.H_BITS} - trusted) | |Δ validation loss| after epoch 1 | max |Δ test probability| | F1 trusted, icdf | epochs (best) trusted / mpc "
              "| local pre-training s |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, ds in doc["datasets"].items():
        for r in ds["runs"]:
            t, p, i = (r["modes"][m] for m in ("trusted", "mpc", "trusted_icdf"))
            lines.append(f"| {ds['data']} | {name} | {r['seed']} | {_cell(t, 'f1')} | {_cell(p, 'f1')} | "
                         f"{_f1(p) - _f1(t):+.4f} | {_cell(t, 'auc')} | {_cell(p, 'auc')} | {_control(r)} | {_first_gap(t, p)} | {_diff(r)} | "
                         f"{_cell(i, 'f1')} | {_epochs(t)} / {_epochs(p)} | {r['local']['seconds']:.0f} |")
    lines += ["", "## Settings", ""]
    for name, ds in doc["datasets"].items():
        st = ds["settings"]
        lines.append(f"- {name} ({ds['data']}, {ds['n_owners']} owners): local pre-training ≤ {st['local_epochs']} "
                     f"epochs (patience {st['local_patience']}), global ≤ {st['epochs']} epochs (patience "
                     f"{st['patience']}), batch {st['batch']}, lr {st['lr']}, d = hidden = {st['hidden']}, "
                     f"align {st['align']}; seeds planned {ds['seeds_planned']}, done {len(ds['runs'])}."
                     + (f"  {ds['note']}" if ds.get("note") else ""))
    lines += ["", "## Reading", ""] + reading(doc) + ["", harness.environment_line(doc.get("environment"))]
    for name, ds in doc["datasets"].items():     # a data set kept from an earlier session (--only, --resume)
        env = ds.get("environment")
        if env and env.get("started") != (doc.get("environment") or {}).get("started"):
            lines += ["", f"{name}: " + harness.environment_line(env)]
    return "\n".join(lines) + "\n"


def _cell(r: dict, key: str) -> str:
    return "error" if "error" in r else f"{r['test'][key]:.4f}"


def _control(r: dict) -> str:
    c = r["modes"].get(CONTROL)
    return "-" if c is None else f"{_f1(c) - _f1(r['modes']['trusted']):+.4f}"


def _first_gap(t: dict, p: dict) -> str:
    if "error" in t or "error" in p:
        return "-"
    return f"{abs(t['first_epoch_val_loss'] - p['first_epoch_val_loss']):.1e}"


def _epochs(r: dict) -> str:
    return "-" if "error" in r else f"{r['epochs']} ({r['best_epoch']})"


def _diff(r: dict) -> str:
    d = r.get("max_abs_test_prob_diff")
    return "-" if d is None else f"{d:.1e}"


def reading(doc: dict) -> list[str]:
    out = []
    for name, ds in doc["datasets"].items():
        sm = ds.get("summary")
        if not sm:
            out.append(f"- {name} ({ds['data']}): no seed finished.")
            continue
        t, p, i = (sm["modes"][m] for m in ("trusted", "mpc", "trusted_icdf"))
        verdict = "within" if sm["within"] else "NOT within"
        line = (f"- {name} ({ds['data']}, {ds['n_owners']} owners, graph {ds['mpc_graph']}, {len(sm['seeds'])} "
                f"seed{'s' if len(sm['seeds']) != 1 else ''}): mpc F1 {p['f1_mean']:.4f} vs trusted "
                f"{t['f1_mean']:.4f}; the largest per-seed |ΔF1| is {sm['max_abs_delta_f1']:.4f}, {verdict} the "
                f"{TOLERANCE} target")
        if len(sm["seeds"]) < len(ds["seeds_planned"]):
            line += f" (only {len(sm['seeds'])} of the {len(ds['seeds_planned'])} planned seeds finished)"
        same = sum(1 for d in sm["delta_f1"] if d == 0.0)
        ok = [r for r in ds["runs"] if "error" not in r["modes"]["trusted"] and "error" not in r["modes"]["mpc"]]
        gap1 = max((abs(r["modes"]["trusted"]["first_epoch_val_loss"] - r["modes"]["mpc"]["first_epoch_val_loss"])
                    for r in ok), default=float("nan"))
        moved = sum(1 for r in ok if r["modes"]["trusted"]["best_epoch"] != r["modes"]["mpc"]["best_epoch"])
        line += (f"; {same} of {len(sm['delta_f1'])} seeds give exactly the same F1.  After the first epoch the "
                 f"two validation losses differ by at most {gap1:.1e} (the fixed point's error); ")
        line += (f"the trajectories then drift apart (Adam, lr {ds['settings']['lr']:g}) and on {moved} of {len(ok)} "
                 "seeds early stopping keeps a different epoch." if moved else
                 "early stopping keeps the same epoch on every seed.")
        if sm.get("control_max_abs_delta_f1") is not None:
            line += (f"  For scale, trusted fusion on h merely rounded to mpc's fixed point (2^-{mpc.H_BITS}) moves "
                     f"F1 by up to {sm['control_max_abs_delta_f1']:.4f} on the same seeds "
                     f"({len(sm['control_delta_f1'])} of them).")
        line += ("  In this process mpc takes "
                 f"{sm['time_ratio']:.0f}x trusted's training time per epoch.  The learned ICDF graph (trusted "
                 f"only) scores {i['f1_mean']:.4f}: ")
        gap = sm["icdf_minus_mpc_f1"]
        line += (f"{gap:+.4f} F1 against mpc's fixed graph, what mpc gives up by not learning the graph."
                 if gap > 0 else f"{gap:+.4f} F1 against mpc's fixed graph: here mpc gives up nothing by not "
                 "learning it.")
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------- main
def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__), render_only=True,
                                 quick_help="vowels 1 seed and METR-LA at 8 sensors, a few epochs")
    ap.add_argument("--resume", action="store_true", help="keep the seeds already in the JSON")
    ap.add_argument("--only", choices=("vowels", "metr_la"), default=None,
                    help="run one data set (from scratch unless --resume); the others' results stay as in the JSON")
    ap.add_argument("--vowels-seeds", type=int, default=5)
    ap.add_argument("--vowels-local-epochs", type=int, default=200)
    ap.add_argument("--vowels-epochs", type=int, default=100)
    ap.add_argument("--metr-seeds", type=int, default=5)
    ap.add_argument("--metr-local-epochs", type=int, default=10)
    ap.add_argument("--metr-epochs", type=int, default=12)
    ap.add_argument("--budget-min", type=float, default=None,
                    help="start no further seed that would end past this many minutes (by the last seed's time)")
    a = ap.parse_args(argv)
    out = harness.Output("f3_mpc_accuracy", a.quick, a.out)
    if a.render_only:
        harness.render_only(out, render)
        return 0
    torch.set_num_threads(1)
    sess = harness.Session("f3_mpc_accuracy", __file__, argv)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:7.0f} s] {msg}", flush=True)

    keep = (a.resume or a.only) and out.path("json").exists()
    old = out.read() if keep else {"datasets": {}}
    doc = {"datasets": {}, "tolerance": TOLERANCE, "quick": a.quick}
    for name, plan in plans(a.quick, a).items():
        if a.only and name != a.only:
            if name in old["datasets"]:
                doc["datasets"][name] = {"environment": old.get("environment"), **old["datasets"][name]}
            continue
        s = parse_settings(f3.Settings, plan["settings"], "f3")
        st = {k: v for k, v in settings_dict(s).items() if k != "seed"}
        prev = old["datasets"].get(name) if a.resume else None
        runs = list(prev["runs"]) if prev and prev["settings"] == st else []
        ds = {"data": provenance(s), "n_owners": f3.n_owners(s), "mpc_graph": plan["mpc_graph"], "settings": st,
              "seeds_planned": plan["seeds"], "runs": runs}
        doc["datasets"][name] = ds
        last_s = None
        for seed in plan["seeds"]:
            if any(r["seed"] == seed for r in runs):
                continue
            elapsed = (time.perf_counter() - t_start) / 60
            if a.budget_min and last_s and elapsed + last_s / 60 > a.budget_min:
                log(f"{name}: seed {seed} would end past the budget of {a.budget_min} min; stopping here")
                ds["note"] = f"Stopped by the time budget ({a.budget_min:g} min) after {len(runs)} seeds."
                break
            t0 = time.perf_counter()
            runs.append(run_seed(name, plan, seed, log))
            last_s = time.perf_counter() - t0
            ds["summary"] = summarise(ds)
            doc["environment"] = ds["environment"] = sess.finish()
            out.write(doc, render(doc))
            log(f"{name} seed {seed} done in {last_s:.0f} s; ΔF1 {ds['summary']['delta_f1'][-1]:+.4f}")
        if runs:
            ds["summary"] = summarise(ds)
    return harness.publish(out, doc, render, sess)


if __name__ == "__main__":
    raise SystemExit(main())
