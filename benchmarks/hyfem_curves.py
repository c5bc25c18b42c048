"""HyFEM's per-round test curves (the paper's Figs. 3 and 4) and the cost of secure per-view
aggregation.

ModelNet40 is not available offline: UCI Handwritten (mfeat, 6 feature views, 10 classes) is the
stand-in, with an MLP extractor per view.

* Curves: per round, test accuracy and loss of Centralized (one model on all D views and every
  training row: HyFEM's local update of one client that holds everything, fed back its own
  output), HyFEM-Avg, HyFEM-Prox mu = 0.1 and 0.5; for HyFEM both **global** (theta_0 with all
  views) and **local** (each client's own model on all evaluation rows with only its views,
  averaged over clients).  Mean +- std over seeds.  The HyFEM runs are the federated roles of
  ``fedhet.algorithms.hyfem`` on the in-memory transport with plain per-view aggregation (secure
  aggregation gives the same models within its quantisation bound, tests/test_hyfem_federated).
  Fig. 3 setting: 4 clients, D = 4 views, 3 views and 3/4 of the classes each.  Fig. 4 setting:
  8 clients, all 6 views, 3 each, 15/40 of the classes each, 12 % of the training rows unused.
* One row, as processes (every party its own OS process over CURVE ZeroMQ, audited): plain vs
  secure per-view aggregation on the ``hyfem`` preset: the server's round time and each client's
  bytes sent and received.

Full: ``python benchmarks/hyfem_curves.py`` (32 rounds, 3 seeds); ``--quick``: fewer rounds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness
from fedhet.algorithms import hyfem
from fedhet.algorithms import hyfem_steps as H
from fedhet.parties.settings import parse_settings

NAME = "hyfem_curves"
STAND_IN = ("ModelNet40 is not available offline; UCI Handwritten (mfeat, 6 feature views, "
            "10 classes) stands in, with an MLP extractor per view.")
SETTINGS = {"fig3": 4, "fig4": 8}   # scenario -> clients
METHODS = {"HyFEM-Avg": {"method": "avg"},
           "HyFEM-Prox mu=0.1": {"method": "prox", "mu": 0.1},
           "HyFEM-Prox mu=0.5": {"method": "prox", "mu": 0.5}}


def parties(n_clients: int) -> list[tuple[str, str]]:
    return [("server", "server")] + [(f"client{i + 1}", "client") for i in range(n_clients)]


def centralized(cfg: dict, seed: int) -> dict:
    """One model on every view and every training row, trained with HyFEM's local update."""
    s = parse_settings(hyfem.Settings, {**cfg, "seed": seed})
    spec = hyfem.model_spec(s)
    views, y, train, test = hyfem.prepared_views(s)
    allv = tuple(range(spec.n_views))
    hc = s.config("cpu")
    state = H.init_server(spec, {0: allv}, hc)
    data = H.ClientData({d: views[d][train] for d in allv}, y[train])
    x_test = {d: views[d][test] for d in allv}
    acc, loss = [], []
    for r in range(s.rounds + 1):
        g = H.evaluate_global(state, spec, x_test, y[test])
        acc.append(g["accuracy"])
        loss.append(g["loss"])
        if r == s.rounds:
            break
        out, _ = H.local_update(H.message_for_client(state, spec, 0), data, spec, hc, r, 0)
        state = H.update_extractors(state, out.extractors)
        state.inference = [(W.copy(), b.copy()) for W, b in out.inference]
    return {"global_accuracy": acc, "global_loss": loss}


def mean_std(runs: list[list[float]]) -> dict:
    a = np.asarray(runs, dtype=float)
    return {"mean": a.mean(0).tolist(), "std": a.std(0).tolist()}


def curves(scenario: str, rounds: int, seeds: list[int]) -> dict:
    n = SETTINGS[scenario]
    base = {"scenario": scenario, "rounds": rounds, "aggregation": "plain"}
    out = {"clients": n, "partition": list(parse_settings(hyfem.Settings, base).partition()), "methods": {}}
    runs = {k: [centralized(base, sd) for sd in seeds] for k in ("Centralized",)}
    for label, over in METHODS.items():
        res = []
        for sd in seeds:
            r = harness.run_roles("hyfem", parties(n), {**base, **over, "seed": sd}, seed=sd)
            res.append(r.results["server"])
            print(f"  {scenario} {label} seed {sd}: global {res[-1]['global_accuracy'][-1]:.3f} "
                  f"local {res[-1]['local_accuracy'][-1]:.3f} ({r.wall_s:.0f}s)", flush=True)
        runs[label] = res
    for label, res in runs.items():
        m = {k: mean_std([x[k] for x in res]) for k in ("global_accuracy", "global_loss")}
        if label != "Centralized":
            m.update({k: mean_std([x[k] for x in res]) for k in ("local_accuracy", "local_loss")})
            m["final_global_widths"] = [x["global_widths"][-1] for x in res]
        out["methods"][label] = m
    return out


def process_row(rounds: int) -> list[dict]:
    rows = []
    for method in ("plain", "secure"):
        run = harness.launch_audited("hyfem", overrides={"rounds": rounds, "aggregation": method},
                                     timeout=600)
        srv = run.results["server"]
        cl = [v for k, v in run.by_role("client").items()]
        rows.append({"aggregation": method, "rounds": rounds, "audit_ok": run.audit_ok,
                     "round_s_mean": float(np.mean(srv["round_s"])),
                     "bytes_sent_per_client": float(np.mean([c["bytes_sent"] for c in cl])),
                     "bytes_received_per_client": float(np.mean([c["bytes_received"] for c in cl])),
                     "final_global_accuracy": srv["final_global_accuracy"],
                     "max_mean_error_bound": srv["max_mean_error_bound"], "wall_s": run.wall_s})
        print(f"  processes {method}: {rows[-1]}", flush=True)
    return rows


def _fmt(ms: dict, i: int) -> str:
    return f"{ms['mean'][i]:.3f} ± {ms['std'][i]:.3f}"


def markdown(doc: dict) -> str:
    lines = [f"# HyFEM test curves ({'quick' if doc['quick'] else 'full'})", "", f"**{STAND_IN}**", "",
             f"Command: `{doc['environment']['command']}`; rounds {doc['rounds']}, seeds {doc['seeds']}; "
             "in-memory federated roles with plain per-view aggregation (secure gives the same models "
             "within its quantisation bound).", ""]
    for sc, c in doc["curves"].items():
        lines += [f"## {sc} setting: {c['clients']} clients, (views, views/client, classes/client, unused) = "
                  f"{tuple(c['partition'])}", "",
                  "| method | global acc (final) | local acc (final) | global loss (final) | local loss (final) |",
                  "|---|---|---|---|---|"]
        for label, m in c["methods"].items():
            la = _fmt(m["local_accuracy"], -1) if "local_accuracy" in m else "= global"
            ll = _fmt(m["local_loss"], -1) if "local_loss" in m else "= global"
            lines.append(f"| {label} | {_fmt(m['global_accuracy'], -1)} | {la} | "
                         f"{_fmt(m['global_loss'], -1)} | {ll} |")
        lines.append("")
    lines += ["## Plain vs secure per-view aggregation, as processes (`hyfem` preset, audited)", "",
              "| aggregation | rounds | server round s (mean) | bytes sent / client | bytes received / client "
              "| final global acc | audit |", "|---|---|---|---|---|---|---|"]
    for r in doc["processes"]:
        lines.append(f"| {r['aggregation']} | {r['rounds']} | {r['round_s_mean']:.2f} | "
                     f"{r['bytes_sent_per_client']:.0f} | {r['bytes_received_per_client']:.0f} | "
                     f"{r['final_global_accuracy']:.3f} | {'ok' if r['audit_ok'] else 'FAILED'} |")
    lines += ["", "Plain aggregation sends float64 vectors (`plain_dtype` default), secure aggregation "
              "32-bit ring vectors: hence fewer bytes sent with secure aggregation.  Bytes received are "
              "mostly the server's theta_0,d and w_m (float32) in both.", "",
              "Shapes to check (paper): Fig. 3, HyFEM global within a few points of Centralized; "
              "Fig. 4, larger mu trades local accuracy for global accuracy.  "
              + shapes(doc), "",
              harness.environment_line(doc["environment"]), ""]
    return "\n".join(lines)


def shapes(doc: dict) -> str:
    """What this run shows about the paper's two shapes (from the final means)."""
    out = []
    c3 = doc["curves"].get("fig3", {}).get("methods", {})
    if c3:
        gap = c3["Centralized"]["global_accuracy"]["mean"][-1] - c3["HyFEM-Avg"]["global_accuracy"]["mean"][-1]
        out.append(f"Here, Fig. 3: Centralized minus HyFEM-Avg global accuracy = {gap:+.3f}.")
    c4 = doc["curves"].get("fig4", {}).get("methods", {})
    if c4:
        a, b = c4["HyFEM-Prox mu=0.1"], c4["HyFEM-Prox mu=0.5"]
        dl = b["local_accuracy"]["mean"][-1] - a["local_accuracy"]["mean"][-1]
        dg = b["global_accuracy"]["mean"][-1] - a["global_accuracy"]["mean"][-1]
        out.append(f"Fig. 4: mu 0.1 -> 0.5 changes local accuracy by {dl:+.3f} and global by {dg:+.3f}"
                   + (" (the paper's trade-off)." if dl < 0 < dg else
                      " (not the paper's trade-off: global does not gain)."))
    return " ".join(out)


def figure(doc: dict):
    plt = harness.pyplot()
    fig, axes = plt.subplots(2, len(doc["curves"]), figsize=(6 * len(doc["curves"]), 8), squeeze=False)
    colors = {"Centralized": "k", "HyFEM-Avg": "C0", "HyFEM-Prox mu=0.1": "C1", "HyFEM-Prox mu=0.5": "C2"}
    for j, (sc, c) in enumerate(doc["curves"].items()):
        for i, metric in enumerate(("accuracy", "loss")):
            ax = axes[i][j]
            for label, m in c["methods"].items():
                for part, ls in (("global", "-"), ("local", "--")):
                    key = f"{part}_{metric}"
                    if key not in m:
                        continue
                    mu, sd = np.asarray(m[key]["mean"]), np.asarray(m[key]["std"])
                    x = np.arange(len(mu))
                    ax.plot(x, mu, ls, color=colors[label], label=f"{label} ({part})")
                    ax.fill_between(x, mu - sd, mu + sd, color=colors[label], alpha=0.15)
            ax.set_xlabel("round")
            ax.set_ylabel(f"test {metric}")
            ax.set_title(f"{sc} ({c['clients']} clients) — Handwritten stand-in for ModelNet40", fontsize=9)
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv=None) -> None:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--render-only", action="store_true", help="re-write the markdown and plot from the JSON")
    args = ap.parse_args(argv)
    if args.render_only:
        out = harness.Output(NAME, args.quick, args.out)
        doc = out.read()
        print("wrote", *out.write(doc, markdown(doc), figure(doc)).values())
        return
    rounds = args.rounds or (10 if args.quick else 32)
    seeds = list(range(args.seeds))
    torch.set_num_threads(1)   # as every party does (2 shared cores)
    sess = harness.Session(NAME, __file__, argv)
    print(f"hyfem_curves: {STAND_IN} rounds {rounds}, seeds {seeds}", flush=True)
    doc = {"benchmark": NAME, "quick": args.quick, "note": STAND_IN, "rounds": rounds, "seeds": seeds,
           "curves": {sc: curves(sc, rounds, seeds) for sc in SETTINGS},
           "processes": process_row(3 if args.quick else 8)}
    doc["environment"] = sess.finish()
    out = harness.Output(NAME, args.quick, args.out)
    paths = out.write(doc, markdown(doc), figure(doc))
    print("wrote", *paths.values())


if __name__ == "__main__":
    main()
