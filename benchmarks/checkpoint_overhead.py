"""What checkpoints cost: each algorithm's preset as audited processes, with a checkpoint every step
and with none, side by side.

Per algorithm: the steps each party checkpointed, the bytes of one checkpoint (the largest party's),
the seconds spent writing them (the party's ``result.json`` ``checkpoints``: encode, atomic write
with fsync, transcript record) against the seconds its role ran, and the role wall time of the run
without checkpoints.  The overhead is the most any party spent on checkpoints as a share of its
role's time: the issue's bound is 5 % of a round.  Data: packaged (scikit-learn's sets) or
generated, as each preset says; presets that need ``../shared`` are labelled and skipped without it.

    python -m benchmarks.checkpoint_overhead             # each algorithm's preset
    python -m benchmarks.checkpoint_overhead --quick     # each algorithm's smoke federation
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from importlib import resources
from pathlib import Path

from benchmarks import harness
from fedhet.algorithms import registry
from fedhet.parties.contract import installed_entry_points
from fedhet.parties.federation import load
from fedhet.parties.ops.presets import path as preset_path

NAME = "checkpoint_overhead"
BOUND = 0.05
# algorithm -> (preset, what its data is, [algorithm] keys changed to keep the run short: the per-step
# overhead depends on the model and data sizes, which stay the preset's, not on the number of steps)
PRESETS: dict[str, tuple[str, str, dict]] = {
    "fedavg_logreg": ("demo", "real: breast cancer (packaged)", {}),
    "chfl": ("chfl_small", "real: digits (packaged)", {}),
    "hyfem": ("hyfem_digits", "real: digits (packaged)", {}),
    "mmvfl": ("mmvfl_digits", "real: digits (packaged)", {}),
    "stfl": ("stfl_cancer", "real: breast cancer (packaged)", {}),
    "he_split": ("he_split", "real: breast cancer (packaged)", {"epochs": 3}),
    "f3": ("f3_small", "synthetic: traffic simulated on the METR-LA road graph", {}),
    "psi": ("psi", "synthetic", {}),
    "shamir": ("shamir", "synthetic", {}),
    "secagg_bench": ("secagg", "synthetic", {}),
}


def federation_of(name: str, quick: bool):
    if quick or name not in PRESETS:
        module = installed_entry_points()[name].module
        return load(Path(str(resources.files(module) / "smoke.toml"))), "smoke federation (as its smoke.toml)"
    preset, data, shorter = PRESETS[name]
    fed = load(preset_path(preset))
    note = "".join(f", {k} = {v}" for k, v in shorter.items())
    return replace(fed, algorithm={**fed.algorithm, **shorter}), f"preset {preset}{note}; {data}"


def measure(name: str, quick: bool) -> dict:
    fed, what = federation_of(name, quick)
    if len(fed.parties) >= 4:
        fed = replace(fed, hosts=2)
    row: dict = {"algorithm": name, "federation": what}
    try:
        on = harness.launch_audited(replace(fed, checkpoint_every=1))
        off = harness.launch_audited(replace(fed, checkpoint_every=0))
    except Exception as e:   # noqa: BLE001 - one algorithm's failure is a row, not the end of the table
        row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        return row
    parties = on.summary["parties"]
    share = {p: r["checkpoints"]["seconds"] / max(r["role_wall_s"], 1e-9) for p, r in parties.items()}
    worst = max(share, key=share.__getitem__)
    ck = parties[worst]["checkpoints"]
    row.update({
        "steps": max(r["checkpoints"]["written"] for r in parties.values()),
        "checkpoint_bytes": max(r["checkpoints"]["bytes"] / max(1, r["checkpoints"]["written"])
                                for r in parties.values()),
        "worst_party": worst, "checkpoint_s": ck["seconds"], "role_s": parties[worst]["role_wall_s"],
        "overhead": share[worst],
        "role_s_without": off.summary["parties"][worst]["role_wall_s"],
        "audit_ok": on.audit_ok,
    })
    return row


def markdown(doc: dict) -> str:
    lines = [f"# Checkpoint overhead ({'smoke federations' if doc['quick'] else 'presets'})", "",
             f"Each party checkpoints every step; overhead = the seconds the most burdened party spent "
             f"writing checkpoints / the seconds its role ran (bound: {BOUND:.0%}). Without: the same "
             "party's role time in a run with `checkpoint_every = 0`.", "",
             "| algorithm | federation (data) | steps | bytes / checkpoint | party | checkpoint s | role s | "
             "overhead | role s without | within bound |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['algorithm']} | {r['federation']} | failed: {r['error']} |||||||")
            continue
        lines.append(f"| {r['algorithm']} | {r['federation']} | {r['steps']} | {r['checkpoint_bytes']:,.0f} | "
                     f"{r['worst_party']} | {r['checkpoint_s']:.3f} | {r['role_s']:.2f} | {r['overhead']:.1%} | "
                     f"{r['role_s_without']:.2f} | {'yes' if r['overhead'] <= BOUND else 'NO'} |")
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]),
                                 quick_help="each algorithm's smoke federation instead of its preset")
    ap.add_argument("--algorithms", nargs="*", default=None, help="only these (default: every installed one)")
    args = ap.parse_args(argv)
    session = harness.Session(NAME, __file__, argv)
    out = harness.Output(NAME, args.quick, args.out)
    doc = {"quick": args.quick, "rows": [], "bound": BOUND}
    for name in args.algorithms or registry.names():
        doc["rows"].append(measure(name, args.quick))
        print(doc["rows"][-1], flush=True)
        doc["environment"] = session.finish()
        out.write(doc, markdown(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
