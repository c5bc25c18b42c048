"""CHFL with record-level DP (issue 47): test accuracy with DP-SGD of the common column at epsilon in
{1, 3, 8}, delta = 1e-5, beside non-private; in memory.  ``--preset chfl_small`` (default): scikit-learn's
digits (real; 3 clients, common ratio 0.3, mu in {0, 0.5}, lr 1e-3, 5 rounds of E = 2, batch 64);
``--preset chfl``: covertype (real, the paper's setting: 5 clients, mu 0.5, E = 5), ``--rounds`` lowering
its 20 rounds to fit the time at hand.  Writes ``chfl_dp.*`` (``chfl_dp_<preset>.*`` for another preset).

    python -m benchmarks.chfl_dp [--seeds 2]
    python -m benchmarks.chfl_dp --preset chfl --rounds 5 --seeds 1
"""
from __future__ import annotations

import argparse
import logging
import statistics
import time

import torch

from benchmarks import harness
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops import presets

NAME = "chfl_dp"
EPSILONS = (1.0, 3.0, 8.0)
PRESET = "chfl_small"


def one(preset: str, cfg: dict, seed: int) -> dict:
    fed = load(presets.path(preset))
    t0 = time.perf_counter()
    out = run_inmemory("chfl", [(p.name, p.role) for p in fed.parties], {**fed.algorithm_cfg(), **cfg, "seed": seed},
                       seed=seed, timeout=3600)
    priv = [out[p.name].get("privacy") for p in fed.parties if p.role == "client"]
    return {"final_test": out["server"]["final_test"], "wall_s": time.perf_counter() - t0,
            "epsilon": [p["epsilon"] for p in priv if p], "noise_multiplier": [p["noise_multiplier"] for p in priv if p]}


def markdown(doc: dict) -> str:
    cols = list(next(iter(doc["rows"].values()))["runs"][0]["final_test"])
    png = (NAME if doc["preset"] == PRESET else f"{NAME}_{doc['preset']}") + ".png"
    lines = [f"# CHFL with record-level DP ({doc['preset']}: {doc.get('data', 'digits, real')}; "
             f"rounds: {doc.get('rounds') or 'the preset'}; {doc['seeds']} seed(s), delta 1e-5)", "",
             f"![test accuracy against epsilon]({png})", "",
             "| privacy | " + " | ".join(f"{c} (test, last round)" for c in cols) + " | noise multiplier per client "
             "| run wall s |", "|---|" + "---|" * (len(cols) + 2)]
    for k, r in doc["rows"].items():
        runs = r["runs"]
        accs = [statistics.fmean(x["final_test"][c] for x in runs) for c in cols]
        z = runs[0]["noise_multiplier"]
        lines.append(f"| {k} | " + " | ".join(f"{a:.4f}" for a in accs) + f" | {', '.join(f'{v:.2f}' for v in z) or '-'}"
                     f" | {statistics.fmean(x['wall_s'] for x in runs):.0f} |")
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def figure(doc: dict):
    """Test accuracy against epsilon per network (mean ± std over the seeds), the non-private runs dashed
    (None before any private row is in)."""
    if all(k == "non-private" for k in doc["rows"]):
        return None
    plt = harness.pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    rows = doc["rows"]
    cols = list(next(iter(rows.values()))["runs"][0]["final_test"])
    eps = [float(k.split("=")[1]) for k in rows if k != "non-private"]
    for i, c in enumerate(cols):
        acc = [[x["final_test"][c] for x in rows[f"epsilon={e:g}"]["runs"]] for e in eps]
        line = ax.errorbar(eps, [statistics.fmean(a) for a in acc], yerr=[statistics.pstdev(a) for a in acc],
                           marker="o", capsize=3, label=f"{c}, DP-SGD")
        if "non-private" in rows:
            base = statistics.fmean(x["final_test"][c] for x in rows["non-private"]["runs"])
            ax.axhline(base, color=line[0].get_color(), ls="--", lw=1, label=f"{c}, non-private")
    ax.set_xscale("log")
    ax.set_xticks(eps, [f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("epsilon (delta = 1e-5, record level)")
    ax.set_ylabel("test accuracy (last round)")
    ax.set_title(f"CHFL, {doc['preset']} ({doc.get('data', 'digits, real')}), {doc['seeds']} seed(s)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), render_only=True)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--preset", default=PRESET)
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args(argv)
    out = harness.Output(NAME if args.preset == PRESET else f"{NAME}_{args.preset}", args.quick, args.out)
    if args.render_only:
        harness.render_only(out, markdown, figure)
        return 0
    logging.getLogger("absl").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    session = harness.Session(NAME, __file__, argv)
    seeds = 1 if args.quick else args.seeds
    doc: dict = {"preset": args.preset, "seeds": seeds, "delta": 1e-5, "rounds": args.rounds, "rows": {},
                 "data": "digits, real" if args.preset == PRESET else "covertype, real" if args.preset == "chfl"
                 else args.preset}
    for eps in (None, *EPSILONS):
        cfg = ({} if eps is None else {"dp": "record", "dp_epsilon": eps, "dp_delta": 1e-5}) | (
            {"rounds": args.rounds} if args.rounds else {})
        label = "non-private" if eps is None else f"epsilon={eps:g}"
        doc["rows"][label] = {"runs": [one(args.preset, cfg, s) for s in range(seeds)]}
        print(label, doc["rows"][label]["runs"][-1]["final_test"], flush=True)
        doc["environment"] = session.finish()
        out.write(doc, markdown(doc))   # after every row: a run cut short keeps what it measured
    return harness.publish(out, doc, markdown, session, figure=figure)


if __name__ == "__main__":
    raise SystemExit(main())
