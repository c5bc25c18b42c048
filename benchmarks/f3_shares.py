"""F³ with ``fusion = "shares"`` (the model trained on replicated shares end to end) against trusted fusion: test
accuracy, what the coordinator's attacks recover, and the cost per step.

Per data set and seed the owners pre-train their local LSTMs once (``f3.pretrain_owner``); from those frozen
representations:

* **trusted**: the global GCN of Eq. (8) with h in the clear, Adam (the coordinator role's loop,
  ``f3_mpc_accuracy.train_one``), graph "given" (traffic) or "none" (vowels), as mpc uses;
* **shares**: the three holders in this process (:class:`fedhet.algorithms.f3.shares.InProcessShares`, the
  federation's holder functions in threads), SGD with momentum on shares, the coordinator role's batches and
  early stopping on the opened validation confusion matrix; test macro F1 from the opened test confusion matrix.

Leakage.  What the shares coordinator receives is, per training step, the batch's count of correct predictions,
and per epoch the validation confusion matrix.  Attacks, R² per owner pooled over h^i's dimensions on the
TRAINING rows (``f3_leakage.r2``):
  *label only* (``f3_leakage.label_only``): the class mean of shadow representations: the bound every mode has;
  *learned from the counts*: the project's learned attacker (``f3_leakage``'s attack 3) adapted to what this mode
  opens: shadow LSTMs (``f3_leakage.shadow_representations``) pushed through the attacker's own float64 replica
  of the training (same settings and batch schedule, its own initial weights: the real ones are unknown), a
  ridge regression and an MLP from a row's label and the count of every batch that contained it to its h (the
  attacker keeps the one with the lower error on held-out replica draws), applied to the real counts; the
  table's "beyond the bound" is the largest R²(attack) - R²(label only) over the owners.
Target (the issue's): no owner's R² above the label-only bound, R² of h predicted by its TRUE class mean (what
the labels alone give at best), by more than 0.02.

Cost: one training step in this process (three holder threads) against trusted's (Adam, float32), at several
owner counts on SYNTHETIC representations (tanh of Gaussians: the cost depends on the shapes only), with the
holders' rounds and bytes sent per step; and how they grow with the batch and the hidden width.

Data: Japanese Vowels (REAL, UCI: 12 owners), f3_small (the first 4 sensors of METR-LA, incident windows
SIMULATED on the real road graph).
"""
from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch

from benchmarks import f3_leakage as L
from benchmarks import f3_mpc_accuracy as M
from benchmarks import harness
from fedhet.algorithms import f3
from fedhet.algorithms.f3 import shares as S
from fedhet.algorithms.f3 import training as T
from fedhet.algorithms.f3.data import provenance, traffic_graph
from fedhet.algorithms.f3.models import normalise_adj
from fedhet.parties.settings import parse_settings

TOLERANCE, LEAK_MARGIN = 0.02, 0.02
SETS = {"f3_small": {"settings": {"dataset": "metr_la", "n_sensors": 4, "n_windows": 200, "local_epochs": 20,
                                  "epochs": 10, "patience": 10}, "graph": "given"},
        "f3": {"settings": {"dataset": "vowels", "local_epochs": 60, "epochs": 30, "patience": 30}, "graph": "none"}}
OPTIMIZERS = ("sgd", "lion")    # patience = epochs: the best validation epoch of the whole budget is kept


def adjacency(s: f3.Settings, graph: str, n: int) -> np.ndarray:
    """Â as the coordinator sends it (float32, then float64 at the holders)."""
    if graph == "none":
        return np.eye(n)
    a = normalise_adj((torch.as_tensor(traffic_graph(s)) > 0).float())
    return a.numpy().astype(np.float32).astype(np.float64)


def train_shares(s: f3.Settings, reps, y, A, classes: int, hidden: int, record: bool = False,
                 optimizer: str = "sgd") -> dict:
    """The coordinator role's loop (shares_roles.coordinator) over in-process holders: batches from the trusted
    loop's generator, early stopping on the opened validation F1, the best epoch's weights kept on shares."""
    m = S.InProcessShares(reps, y, classes, A, d=s.d, hidden=hidden, align=s.align)
    tr, va, te = f3.n_rows(s)
    pos = np.arange(tr + va + te)
    gen = torch.Generator().manual_seed(s.seed)
    best, since, best_w, hist, steps = -1.0, 0, None, [], []
    t0 = time.perf_counter()
    for epoch in range(s.epochs):
        te0 = time.perf_counter()
        for b in T.batches(tr, s.batch, gen):
            hits = m.step(pos[:tr][b], s.lion_lr if optimizer == "lion" else s.sgd_lr, s.momentum, optimizer)
            steps.append({"rows": pos[:tr][b], "hits": hits, "epoch": epoch})
        conf = m.confusion(pos[tr:tr + va], s.batch)
        f1 = S.macro_f1(conf)
        hist.append({"val_f1": f1, "epoch_s": time.perf_counter() - te0})
        if f1 > best + 1e-9:
            best, since, best_w = f1, 0, [copy.deepcopy(x.w) for x in m.models]
        else:
            since += 1
        if since >= s.patience:
            break
    assert best_w is not None
    for x, w in zip(m.models, best_w):
        x.w = w
    conf = m.confusion(pos[tr + va:], s.batch)
    out = {"mode": "shares", "optimizer": optimizer, "test": {"f1": S.macro_f1(conf), "accuracy": float(np.trace(conf) / conf.sum())},
           "epochs": len(hist), "best_val_f1": best, "epoch_s": float(np.median([h["epoch_s"] for h in hist])),
           "wall_s": time.perf_counter() - t0, "rounds_per_step": m.rounds / max(m.opened.count(("hits", 1)), 1),
           "opened_kinds": sorted({k for k, _ in m.opened})}
    if record:
        out["transcript"] = steps
    return out


# ----------------------------------------------------------------------------------------------- leakage
def replica_counts(s, H: np.ndarray, y: np.ndarray, steps: list[dict], A, classes: int, hidden: int,
                   seed: int) -> np.ndarray:
    """The attacker's replica of the training on shadow rows H (R, n, d) in the real schedule: its float64 SGD
    (shares.plain_step) from its own initial weights; the count of every step."""
    rng = np.random.default_rng(seed)
    shape = S.Shape(H.shape[1], H.shape[2], s.d, hidden, classes, s.align)
    w = {k: sum(rng.uniform(-b / np.sqrt(3), b / np.sqrt(3), sh) for _ in range(3)) for k, (sh, b) in shape.params().items()}
    v = {k: np.zeros_like(x) for k, x in w.items()}
    Y = np.eye(classes)[y]
    Ht = np.ascontiguousarray(H.transpose(1, 0, 2))
    lr = s.lion_lr if s.optimizer == "lion" else s.sgd_lr
    return np.array([S.plain_step(w, v, Ht[:, st["rows"]], Y[st["rows"]], A, lr, s.momentum, s.align, s.optimizer)
                     for st in steps], dtype=np.float64)


def count_features(steps: list[dict], counts: np.ndarray, R: int, y: np.ndarray, classes: int) -> np.ndarray:
    """Per row: its label (one-hot) and, per epoch, the hit fraction of the batch that contained it."""
    E = max(st["epoch"] for st in steps) + 1
    f = np.zeros((R, E))
    for st, c in zip(steps, counts):
        f[st["rows"], st["epoch"]] = c / len(st["rows"])
    return np.concatenate([np.eye(classes)[y], f], 1)


def learned_from_counts(s, steps, real_counts, y_train, shadow, shadow_y, A, classes, hidden, draws, seed):
    R, n, d = len(y_train), shadow.shape[1], shadow.shape[2]
    rng = np.random.default_rng(seed)
    X, Yh = [], []
    for k in range(draws):
        pick = rng.choice(len(shadow), R, replace=len(shadow) < R)
        counts = replica_counts(s, L.fixed(shadow[pick], S.H_BITS), shadow_y[pick], steps, A, classes, hidden,
                                seed + k)
        X.append(count_features(steps, counts, R, shadow_y[pick], classes))
        Yh.append(shadow[pick].reshape(R, -1))
    held = max(1, draws // 5) * R                     # the last draws: held out to pick the attacker
    X, Yh = np.concatenate(X), np.concatenate(Yh)
    real = count_features(steps, real_counts, R, y_train, classes)
    mu, sd = X.mean(0), X.std(0) + 1e-9
    Xs, real_s = (X - mu) / sd, (real - mu) / sd
    best: tuple[float, np.ndarray] | None = None
    for alpha in (0.1, 1.0, 10.0, 100.0, 1000.0):      # ridge: linear, so it cannot extrapolate wildly
        from sklearn.linear_model import Ridge
        fit = Ridge(alpha=alpha).fit(Xs[:-held], Yh[:-held])
        score = float(np.mean((fit.predict(Xs[-held:]) - Yh[-held:]) ** 2))
        if best is None or score < best[0]:
            best = (score, fit.predict(real_s))
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(X.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, n * d))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    Xt, Yt = torch.as_tensor(Xs[:-held], dtype=torch.float32), torch.as_tensor(Yh[:-held], dtype=torch.float32)
    for _ in range(60):
        for idx in torch.randperm(len(Xt)).split(256):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(Xt[idx]), Yt[idx]).backward()
            opt.step()
    with torch.no_grad():
        mlp_held = float(torch.nn.functional.mse_loss(net(torch.as_tensor(Xs[-held:], dtype=torch.float32)),
                                                      torch.as_tensor(Yh[-held:], dtype=torch.float32)))
        mlp = net(torch.as_tensor(real_s, dtype=torch.float32)).double().numpy()
    assert best is not None
    # the attacker keeps the model with the lower held-out error (it cannot see the true h)
    chosen = mlp if mlp_held < best[0] else best[1]
    return chosen.reshape(R, n, d), {"ridge": best[1].reshape(R, n, d), "mlp": mlp.reshape(R, n, d),
                                     "chosen": "mlp" if mlp_held < best[0] else "ridge"}


def leakage(name: str, hidden: int, draws: int, log) -> dict:
    plan = SETS[name]
    s = parse_settings(f3.Settings, {**plan["settings"], "graph": plan["graph"], "hidden": hidden,
                                     "fusion": "shares"}, "f3")
    reps, y = L.representations(s, None)
    shadow, shadow_y = L.shadow_representations(s, None)
    classes = 9 if s.dataset == "vowels" else 2
    A = adjacency(s, plan["graph"], len(reps))
    run = train_shares(s, reps, y, A, classes, hidden, record=True, optimizer=s.optimizer)
    steps = run.pop("transcript")
    tr = f3.n_rows(s)[0]
    true = [r[:tr] for r in reps]
    base = L.label_only(shadow, shadow_y, y[:tr])
    r_label = L.owner_r2([base[:, i] for i in range(len(reps))], true)
    est, parts = learned_from_counts(s, steps, np.array([st["hits"] for st in steps], float), y[:tr], shadow,
                                     shadow_y, A, classes, hidden, draws, seed=1)
    r_learn = L.owner_r2([est[:, i] for i in range(len(reps))], true)
    r_parts = {k: L.owner_r2([v[:, i] for i in range(len(reps))], true) for k, v in parts.items() if k != "chosen"}
    # the bound: labels alone at best, each training row's h predicted by its TRUE class mean
    r_bound = L.owner_r2([np.stack([t[y[:tr] == c].mean(0) for c in y[:tr]]) for t in true], true)
    beyond = float(np.max(np.asarray(r_learn) - np.asarray(r_bound)))
    beyond_shadow = float(np.max(np.asarray(r_learn) - np.asarray(r_label)))
    log(f"leakage {name} hidden {hidden}: true class means max {max(r_bound):.3f}, label-only (shadow) max "
        f"{max(r_label):.3f}, learned-from-counts max {max(r_learn):.3f}, beyond the bound {beyond:+.3f}, beyond "
        f"the shadow label-only attack {beyond_shadow:+.3f}")
    return {"size": name, "hidden": hidden, "data": provenance(s), "label_only": L.stats(r_label),
            "bound_true_class_means": L.stats(r_bound), "beyond_shadow_label_only_max": beyond_shadow,
            "learned_counts": L.stats(r_learn, draws=draws, chosen=parts["chosen"]),
            "ridge": L.stats(r_parts["ridge"]), "mlp": L.stats(r_parts["mlp"]), "beyond_labels_max": beyond,
            "met": beyond <= LEAK_MARGIN, "test": run["test"], "optimizer": s.optimizer, "opened_kinds": run["opened_kinds"],
            "observations": {"counts": len(steps), "per_row": "one count per training batch (about batch rows)"}}


# ---------------------------------------------------------------------------------------------- accuracy
def accuracy(name: str, seeds: list[int], log) -> dict:
    plan = SETS[name]
    runs = []
    for seed in seeds:
        s = parse_settings(f3.Settings, {**plan["settings"], "graph": plan["graph"], "seed": seed,
                                         "fusion": "shares"}, "f3")
        reps, y, _ = M.pretrain(s)
        classes = 9 if s.dataset == "vowels" else 2
        adj = traffic_graph(s) if plan["graph"] == "given" else None
        cfg = M.global_config(s, plan["graph"])
        init = T.build_global(len(reps), [r.shape[1] for r in reps], classes, cfg, given=adj).state_dict()
        trusted = M.train_one("trusted", s, cfg, init, reps, y, adj, classes)
        trusted.pop("probs", None)
        run = {"seed": seed, "trusted": trusted}
        for opt in OPTIMIZERS:
            sh = train_shares(s, reps, y, adjacency(s, plan["graph"], len(reps)), classes, s.hidden, optimizer=opt)
            d = sh["test"]["f1"] - trusted["test"]["f1"]
            log(f"accuracy {name} seed {seed}: trusted F1 {trusted['test']['f1']:.4f}, shares ({opt}) "
                f"{sh['test']['f1']:.4f} (Δ {d:+.4f}); epoch {trusted['epoch_s']:.3f} s vs {sh['epoch_s']:.2f} s")
            run[f"shares_{opt}"], run[f"delta_f1_{opt}"] = sh, d
        runs.append(run)
    out = {"size": name, "data": provenance(parse_settings(f3.Settings, plan["settings"], "f3")),
           "settings": {**plan["settings"], "graph": plan["graph"]}, "runs": runs, "seeds": len(runs)}
    for opt in OPTIMIZERS:
        deltas = [r[f"delta_f1_{opt}"] for r in runs]
        out[opt] = {"max_abs_delta_f1": float(np.max(np.abs(deltas))), "mean_delta_f1": float(np.mean(deltas)),
                    "f1_mean": float(np.mean([r[f"shares_{opt}"]["test"]["f1"] for r in runs])),
                    "met": bool(np.max(np.abs(deltas)) <= TOLERANCE)}
    return out


# -------------------------------------------------------------------------------------------------- cost
def cost_point(n: int, batch: int, hidden: int, steps: int, d: int = 16, classes: int = 2,
               optimizer: str = "lion") -> dict:
    rng = np.random.default_rng(n)
    rows = max(batch * steps, 2 * batch)
    reps = [np.tanh(rng.normal(size=(rows, d))) for _ in range(n)]
    y = rng.integers(0, classes, rows)
    A = normalise_adj((torch.rand(n, n, generator=torch.Generator().manual_seed(n)) > 0.7).float()).double().numpy()
    m = S.InProcessShares(reps, y, classes, A, d=d, hidden=hidden)
    r0, w0 = m.rounds, m.words_sent
    t0 = time.perf_counter()
    for k in range(steps):
        m.step(np.arange(k * batch, (k + 1) * batch) % rows, 0.01 if optimizer == "lion" else 0.5, 0.9, optimizer)
    shares_s = (time.perf_counter() - t0) / steps
    cfg = T.GlobalConfig(d=d, hidden=hidden, align="soft", graph="given", batch=batch, seed=0)
    model = T.build_global(n, [d] * n, classes, cfg, given=(A > 0))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    H = [torch.as_tensor(r, dtype=torch.float32) for r in reps]
    yt = torch.as_tensor(y)

    def trusted_step(k):
        r = np.arange(k * batch, (k + 1) * batch) % rows
        opt.zero_grad()
        lg = model.logits(lambda Ad: Ad @ model.W0(model.stack([h[r] for h in H])), model.adj(len(r)))
        torch.nn.functional.cross_entropy(lg, yt[r]).backward()
        opt.step()
    t0 = time.perf_counter()
    reps_t = max(steps, 5)
    for k in range(reps_t):
        trusted_step(k)
    trusted_s = (time.perf_counter() - t0) / reps_t
    return {"owners": n, "batch": batch, "hidden": hidden, "steps_timed": steps, "optimizer": optimizer, "shares_step_s": shares_s,
            "trusted_step_s": trusted_s, "ratio": shares_s / trusted_s,
            "rounds_per_step": (m.rounds - r0) / steps, "bytes_per_holder_per_step": 8 * (m.words_sent - w0) / steps,
            "loadavg": harness.loadavg()}


def cost(owners: list[int], log) -> dict:
    points = []
    for n in owners:
        points.append(cost_point(n, 100, 16, 2 if n <= 64 else 1))
        p = points[-1]
        log(f"cost n={n}: shares {p['shares_step_s']:.2f} s/step, trusted {p['trusted_step_s'] * 1e3:.1f} ms "
            f"({p['ratio']:.0f}x), {p['rounds_per_step']:.0f} rounds, {p['bytes_per_holder_per_step'] / 1e6:.1f} MB")
    growth = [cost_point(16, b, h, 2) for b, h in ((50, 16), (200, 16), (100, 4), (100, 64))] + \
        [cost_point(16, 100, 16, 2, optimizer="sgd")]
    for p in growth:
        log(f"cost n=16 batch {p['batch']} hidden {p['hidden']}: {p['rounds_per_step']:.0f} rounds, "
            f"{p['bytes_per_holder_per_step'] / 1e6:.2f} MB, {p['shares_step_s']:.2f} s/step")
    return {"data": "synthetic (tanh of Gaussian h; a random graph): the cost depends on the shapes only",
            "points": points, "growth": growth}


# ----------------------------------------------------------------------------------------------- render
def render(doc) -> str:
    lines = ["# F³ trained on shares (fusion \"shares\") against trusted fusion", "",
             "Generated by `benchmarks/f3_shares.py` from `f3_shares.json`; in-process holders (three threads).", ""]
    if doc.get("accuracy"):
        lines += ["## Accuracy (test macro F1)", "", "| set | data | seeds | trusted F1 (mean) | optimiser on shares | "
                  "shares F1 (mean) | mean ΔF1 | max abs ΔF1 | within 0.02 |", "|---|---|---|---|---|---|---|---|---|"]
        for a in doc["accuracy"]:
            t = np.mean([r["trusted"]["test"]["f1"] for r in a["runs"]])
            for opt in OPTIMIZERS:
                o = a[opt]
                lines.append(f"| {a['size']} | {a['data']} | {a['seeds']} | {t:.4f} | {opt} | {o['f1_mean']:.4f} | "
                             f"{o['mean_delta_f1']:+.4f} | {o['max_abs_delta_f1']:.4f} | "
                             f"{'yes' if o['met'] else 'NO'} |")
        lines.append("")
    if doc.get("leakage"):
        lines += ["## Leakage: the coordinator's R² of h^i (max over owners, training rows)", "",
                  "| set | data | hidden | bound: true class means | label only (shadow) | learned from the opened "
                  "counts | beyond the bound (max over owners) | within 0.02 |", "|---|---|---|---|---|---|---|---|"]
        for r in doc["leakage"]:
            bound = r.get("bound_true_class_means", {}).get("max", float("nan"))
            lines.append(f"| {r['size']} | {r['data']} | {r['hidden']} | {bound:.3f} | "
                         f"{r['label_only']['max']:.3f} | "
                         f"{r['learned_counts']['max']:.3f} | {r['beyond_labels_max']:+.3f} | "
                         f"{'yes' if r['met'] else 'NO'} |")
        lines.append("")
    if doc.get("cost"):
        c = doc["cost"]
        lines += [f"## Cost per training step (batch 100, hidden 16; {c['data']})", "",
                  "| owners | shares s/step | trusted ms/step | ratio | rounds/step | MB per holder per step | load |",
                  "|---|---|---|---|---|---|---|"]
        for p in c["points"]:
            lines.append(f"| {p['owners']} | {p['shares_step_s']:.2f} | {p['trusted_step_s'] * 1e3:.1f} | "
                         f"{p['ratio']:.0f}x | {p['rounds_per_step']:.0f} | {p['bytes_per_holder_per_step'] / 1e6:.2f} "
                         f"| {p['loadavg']:.1f} |")
        lines += ["", "Growth at 16 owners:", "", "| batch | hidden | optimiser | rounds/step | MB per holder per step | "
                  "s/step |", "|---|---|---|---|---|---|"]
        for p in c["growth"]:
            lines.append(f"| {p['batch']} | {p['hidden']} | {p.get('optimizer', 'sgd')} | {p['rounds_per_step']:.0f} | "
                         f"{p['bytes_per_holder_per_step'] / 1e6:.2f} | {p['shares_step_s']:.2f} |")
        lines.append("")
    lines.append(harness.environment_line(doc.get("environment")))
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__), render_only=True,
                                 quick_help="f3_small only, 1 seed, small cost points")
    ap.add_argument("--parts", default="accuracy,leakage,cost")
    ap.add_argument("--sets", default="f3_small")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hiddens", default="4,16")
    ap.add_argument("--draws", type=int, default=20)
    ap.add_argument("--owners", default="4,16,64,207")
    a = ap.parse_args(argv)
    out = harness.Output("f3_shares", a.quick, a.out)
    if a.render_only:
        harness.render_only(out, render)
        return 0
    torch.set_num_threads(1)
    sess = harness.Session("f3_shares", __file__, argv)
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.0f} s] {msg}", flush=True)
    old = out.read() if out.path("json").exists() else {}
    doc = {k: old.get(k) for k in ("accuracy", "leakage", "cost")}
    parts, sets = a.parts.split(","), a.sets.split(",")
    if "accuracy" in parts:
        doc["accuracy"] = [x for x in (doc["accuracy"] or []) if x["size"] not in sets] + \
            [accuracy(name, list(range(1 if a.quick else a.seeds)), log) for name in sets]
    if "leakage" in parts:
        hid = [int(h) for h in a.hiddens.split(",")]
        doc["leakage"] = [x for x in (doc["leakage"] or []) if (x["size"], x["hidden"]) not in
                          {(n, h) for n in sets for h in hid}] + \
            [leakage(name, h, 4 if a.quick else a.draws, log) for name in sets for h in hid]
    if "cost" in parts:
        doc["cost"] = cost([4, 16] if a.quick else [int(x) for x in a.owners.split(",")], log)
    doc["settings"] = {"optimizer": f3.Settings.optimizer, "lion_lr": f3.Settings.lion_lr,
                       "sgd_lr": f3.Settings.sgd_lr, "momentum": f3.Settings.momentum}
    return harness.publish(out, doc, render, sess)


if __name__ == "__main__":
    raise SystemExit(main())
