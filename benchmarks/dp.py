"""Differential privacy (issue 47): accuracy against epsilon, distributed against local noise, and cost.

1. **Accuracy against epsilon** (record level): FedAvg on the demo task (scikit-learn's breast-cancer
   set, real, dealt to 3 clients; secure aggregation) with DP-SGD in every client's local steps at
   epsilon in {1, 3, 8}, delta = 1e-5, beside the same run without DP, over seeds (the data shuffle and
   every party's seed; the DP noise comes from the OS).
2. **Distributed against local** (client level, the same epsilon): FedAvg with each client's update
   clipped and noised, K = 10 and K = 50 clients: distributed Skellam shares under secure aggregation
   against each client adding the full Gaussian noise itself, beside no DP; the wall time of the
   in-memory run with and without the distributed noise.
3. **Cost**: one epoch of DP-SGD (torch.func per-sample gradients, fedhet's) and of Opacus (its
   GradSampleModule and DPOptimizer) against plain minibatch SGD on the same MLP (scikit-learn's
   digits, real), and the logistic regression's DP step against its plain step.

    python -m benchmarks.dp            # full
    python -m benchmarks.dp --quick    # 1 seed, fewer rounds
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time

import numpy as np
import torch

from benchmarks import harness

NAME = "dp"
EPSILONS = (1.0, 3.0, 8.0)
DELTA = 1e-5


def fedavg(k: int, cfg: dict, seed: int) -> dict:
    from fedhet.parties.inmemory import run_inmemory

    parties = [("server", "server")] + [(f"client{i}", "client") for i in range(k)]
    t0 = time.perf_counter()
    out = run_inmemory("fedavg_logreg", parties, {**cfg, "seed": seed}, seed=seed, timeout=600)
    wall = time.perf_counter() - t0
    priv = out["client0"].get("privacy") or {}
    return {"test_accuracy": out["server"]["test_accuracy"], "wall_s": wall,
            "epsilon": priv.get("epsilon"), "noise_multiplier": priv.get("noise_multiplier"),
            "server_epsilon": (out["server"].get("privacy") or {}).get("epsilon"),
            "mechanism": priv.get("mechanism")}


def summary(rows: list[dict]) -> dict:
    acc = [r["test_accuracy"] for r in rows]
    return {"mean": statistics.fmean(acc), "std": statistics.pstdev(acc) if len(acc) > 1 else 0.0,
            "seeds": len(acc), "runs": rows}


def accuracy_section(seeds: list[int], rounds: int) -> dict:
    base = {"rounds": rounds, "local_epochs": 5, "lr": 0.5}
    dp = {"dp": "record", "dp_delta": DELTA, "dp_clip": 1.0, "dp_sample_rate": 0.25}
    out = {"settings": {**base, **dp, "clients": 3, "aggregation": "secure"}, "rows": {}}
    for eps in (None, *EPSILONS):
        cfg = base if eps is None else {**base, **dp, "dp_epsilon": eps}
        label = "non-private" if eps is None else f"epsilon={eps:g}"
        rows = [fedavg(3, cfg, s) for s in seeds]
        out["rows"][label] = summary(rows)
        print(f"[accuracy] {label}: {out['rows'][label]['mean']:.4f}", flush=True)
    return out


def distributed_section(seeds: list[int], rounds: int, ks: list[int], eps: float) -> dict:
    base = {"rounds": rounds, "local_epochs": 5, "lr": 0.5}
    dp = {"dp": "client", "dp_epsilon": eps, "dp_delta": DELTA, "dp_clip": 1.0}
    out = {"settings": {**base, **dp}, "rows": {}}
    for k in ks:
        for label, cfg in (("non-private (secure)", base),
                           ("distributed Skellam (secure)", {**dp, **base, "dp_noise": "distributed"}),
                           ("local Gaussian (secure)", {**dp, **base, "dp_noise": "local"})):
            rows = [fedavg(k, cfg, s) for s in seeds]
            out["rows"][f"K={k}|{label}"] = {"k": k, "variant": label, **summary(rows)}
            print(f"[distributed] K={k} {label}: {out['rows'][f'K={k}|{label}']['mean']:.4f}", flush=True)
    return out


def cost_section(repeats: int) -> dict:
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer
    from sklearn.datasets import load_breast_cancer, load_digits

    from fedhet.algorithms.dp_sgd import DPStep, dp_sgd_module_step, poisson_batch, private_generator
    from fedhet.algorithms.fedavg_logreg.core import local_train, local_train_dp
    from fedhet.algorithms.toolkit import mlp

    torch.set_num_threads(1)
    x, y = load_digits(return_X_y=True)
    xt = torch.as_tensor((x - x.mean(0)) / (x.std(0) + 1e-9), dtype=torch.float32)
    yt = torch.as_tensor(y)
    n, batch = len(xt), 64
    q = batch / n
    loss = torch.nn.functional.cross_entropy
    gen = private_generator()

    def plain_epoch():
        m = mlp(64, 10, 2.0, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for idx in torch.randperm(n).split(batch):
            opt.zero_grad()
            loss(m(xt[idx]), yt[idx]).backward()
            opt.step()

    def fedhet_dp_epoch():
        m = mlp(64, 10, 2.0, 1)
        for _ in range(n // batch):
            idx = poisson_batch(n, q, gen)
            dp_sgd_module_step(m, loss, xt[idx], yt[idx], 0.1, DPStep(1.0, 1.0, q), gen, n)

    def opacus_epoch():
        m = GradSampleModule(mlp(64, 10, 2.0, 1))
        opt = DPOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), noise_multiplier=1.0, max_grad_norm=1.0,
                          expected_batch_size=batch)
        for _ in range(n // batch):
            idx = poisson_batch(n, q, gen)
            opt.zero_grad()
            loss(m(xt[idx]), yt[idx]).backward()
            opt.step()

    bx, by = load_breast_cancer(return_X_y=True)
    bx = (bx - bx.mean(0)) / bx.std(0)
    w0 = np.zeros(bx.shape[1] + 1)
    t = harness.best_of_interleaved({
        "mlp: plain SGD": plain_epoch, "mlp: DP-SGD (fedhet, torch.func)": fedhet_dp_epoch,
        "mlp: DP-SGD (Opacus)": opacus_epoch,
        "logreg: plain GD, 100 steps": lambda: local_train(w0, bx, by * 1.0, 100, 0.5, 1e-3),
        "logreg: DP-SGD q=0.25, 100 steps": lambda: local_train_dp(w0, bx, by * 1.0, 100, 0.5, 1e-3,
                                                                   DPStep(1.0, 1.0, 0.25), gen),
    }, repeats)
    rows = {k: {"wall_s": v.wall_s, "cpu_s": v.cpu_s} for k, v in t.items()}
    for k in rows:
        ref = "mlp: plain SGD" if k.startswith("mlp") else "logreg: plain GD, 100 steps"
        rows[k]["x_plain"] = rows[k]["wall_s"] / rows[ref]["wall_s"]
    return {"data": "digits (1,797 x 64) MLP 64-128-10, batch 64 (expected), one epoch; breast cancer "
                    "logistic regression, 100 steps", "rows": rows, "threads": 1}


def cpu_ratio(cost: dict, key: str) -> float:
    """A cost row's CPU time over its plain reference's (the MLP's plain SGD, the logistic regression's GD)."""
    ref = "mlp: plain SGD" if key.startswith("mlp") else "logreg: plain GD, 100 steps"
    return cost["rows"][key]["cpu_s"] / cost["rows"][ref]["cpu_s"]


def markdown(doc: dict) -> str:
    lines = ["# Differential privacy", "", "![accuracy against epsilon; distributed against local](dp.png)", "",
             "## Accuracy against epsilon (record level, DP-SGD; FedAvg demo task: breast cancer, real)", "",
             f"Settings: {doc['accuracy']['settings']}; delta = {DELTA:g}; "
             f"{doc['accuracy']['rows']['non-private']['seeds']} seeds.", "",
             "| privacy | test accuracy (mean ± std) | noise multiplier | epsilon reached |", "|---|---|---|---|"]
    for k, r in doc["accuracy"]["rows"].items():
        z = r["runs"][0]["noise_multiplier"]
        e = r["runs"][0]["epsilon"]
        lines.append(f"| {k} | {r['mean']:.4f} ± {r['std']:.4f} | {'-' if z is None else f'{z:.3f}'} | "
                     f"{'-' if e is None else f'{e:.4f}'} |")
    d = doc["distributed"]
    lines += ["", "## Distributed against local noise (client level, same epsilon; breast cancer, real)", "",
              f"Settings: {d['settings']}.", "",
              "| K | variant | test accuracy (mean ± std) | noise multiplier | client epsilon | server-accounted "
              "epsilon | run wall s |", "|---|---|---|---|---|---|---|"]
    for r in d["rows"].values():
        run = r["runs"][0]
        z, e, se = run["noise_multiplier"], run["epsilon"], run["server_epsilon"]
        lines.append(f"| {r['k']} | {r['variant']} | {r['mean']:.4f} ± {r['std']:.4f} | "
                     f"{'-' if z is None else f'{z:.3f}'} | {'-' if e is None else f'{e:.3f}'} | "
                     f"{'-' if se is None else f'{se:.3f}'} | "
                     f"{statistics.fmean(x['wall_s'] for x in r['runs']):.1f} |")
    c = doc["cost"]
    lines += ["", f"## Cost: DP-SGD against plain SGD ({c['data']}; real data; {c['threads']} thread)", "",
              "x plain: CPU time over the plain variant's (CPU time moves less than wall time with the load of "
              "a shared machine).", "",
              "| variant | wall s | CPU s | x plain (CPU) |", "|---|---|---|---|"]
    for k, r in c["rows"].items():
        lines.append(f"| {k} | {r['wall_s']:.4f} | {r['cpu_s']:.4f} | {cpu_ratio(c, k):.1f} |")
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def figure(doc: dict):
    """Accuracy against epsilon (record level, mean ± std over seeds) with the non-private line, and the
    client-level accuracies of distributed and local noise at K = 10 and 50."""
    plt = harness.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    rows = doc["accuracy"]["rows"]
    eps = [float(k.split("=")[1]) for k in rows if k != "non-private"]
    acc = [rows[f"epsilon={e:g}"] for e in eps]
    a.errorbar(eps, [r["mean"] for r in acc], yerr=[r["std"] for r in acc], marker="o", capsize=3, label="DP-SGD")
    base = rows["non-private"]
    a.axhline(base["mean"], color="gray", ls="--", label="non-private")
    a.set_xscale("log")
    a.set_xticks(eps, [f"{e:g}" for e in eps])
    a.minorticks_off()
    a.set_xlabel("epsilon (delta = 1e-5, record level)")
    a.set_ylabel("test accuracy")
    a.set_title("FedAvg demo task (breast cancer, real)")
    a.legend()
    dist = doc["distributed"]["rows"].values()
    ks = sorted({r["k"] for r in dist})
    variants = sorted({r["variant"] for r in dist})
    width = 0.8 / len(variants)
    for i, v in enumerate(variants):
        ys = [next(r for r in dist if r["k"] == k and r["variant"] == v) for k in ks]
        b.bar([j + i * width for j in range(len(ks))], [r["mean"] for r in ys], width,
              yerr=[r["std"] for r in ys], capsize=3, label=v)
    b.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(ks))], [f"K = {k}" for k in ks])
    b.set_ylabel("test accuracy")
    b.set_ylim(0.4, 1.0)
    b.set_title(f"client level, epsilon = {doc['distributed']['settings']['dp_epsilon']:g}")
    b.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), render_only=True)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--ks", type=int, nargs="*", default=[10, 50])
    ap.add_argument("--client-epsilon", type=float, default=3.0)
    args = ap.parse_args(argv)
    out = harness.Output(NAME, args.quick, args.out)
    if args.render_only:
        harness.render_only(out, markdown, figure)
        return 0
    logging.getLogger("absl").setLevel(logging.ERROR)
    logging.getLogger("fedhet").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    session = harness.Session(NAME, __file__, argv)
    seeds = list(range(1 if args.quick else args.seeds))
    rounds = 5 if args.quick else args.rounds
    doc: dict = {"quick": args.quick, "delta": DELTA}
    doc["cost"] = cost_section(1 if args.quick else 3)
    print(doc["cost"], flush=True)
    doc["accuracy"] = accuracy_section(seeds, rounds)
    doc["distributed"] = distributed_section(seeds, rounds, args.ks, args.client_epsilon)
    return harness.publish(out, doc, markdown, session, figure=figure)


if __name__ == "__main__":
    raise SystemExit(main())
