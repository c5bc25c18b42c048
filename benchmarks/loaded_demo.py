"""The demo federation (FedAvg, secure aggregation, four processes over CURVE) for many rounds beside
busy loops, one per core (issue 43): every run must pass, with bit-identical trained weights, and
the connection guard of every party reports how many connections it cut (goal: none of a listed
party's, so no honest message lost).

    python -m benchmarks.loaded_demo                      # 5 runs of 8,000 rounds beside 2 busy loops
    python -m benchmarks.loaded_demo --quick              # 2 runs of 400 rounds
    python -m benchmarks.loaded_demo --summarize DIR --runs-commit REV   # run folders made before

Results: ``benchmarks/results/loaded_demo{,_quick}.{json,md}`` (each run: exit code, wall time, the
highest 1-minute load seen, the weights' digest, guard cuts by party and reason, rounds that went on
without a party).  Synthetic data: scikit-learn's breast-cancer set split across three clients.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.harness import Output, Session, add_common_args, environment_line, loadavg, publish


def busy_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["bash", "-c", "while :; do :; done"]) for _ in range(n)]


def one_run(folder: Path, rounds: int) -> dict:
    peak = [loadavg() or 0.0]
    done = threading.Event()

    def watch():
        while not done.wait(10):
            peak[0] = max(peak[0], loadavg() or 0.0)

    threading.Thread(target=watch, daemon=True).start()
    t0 = time.perf_counter()
    rc = subprocess.run([sys.executable, "-m", "fedhet.parties.ops.cli", "run", "demo", "--set", f"rounds={rounds}",
                         "--out", str(folder), "--no-progress"], capture_output=True, text=True).returncode
    done.set()
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "peak_load": peak[0], **summarize_run(folder)}


def summarize_run(folder: Path) -> dict:
    """What one run folder says: the weights' digest, the guard's cuts, exclusions, the results."""
    from safetensors.numpy import load_file

    digest = hashlib.sha256()
    for f in sorted(glob.glob(str(folder / "parties" / "*" / "model" / "*.safetensors"))):
        tensors = load_file(f)
        for k in sorted(tensors):
            digest.update(Path(f).parent.parent.name.encode() + k.encode() + tensors[k].tobytes())
    cuts, listed, exclusions, accuracy = {}, {}, {}, {}
    for f in sorted(glob.glob(str(folder / "parties" / "*" / "result.json"))):
        doc = json.loads(Path(f).read_text())
        name = doc["party"]
        guard = doc["traffic"].get("guard_cuts", {})
        cuts[name] = guard.get("total", 0)
        listed.update({f"{name} cut {who}": n for who, n in guard.get("listed", {}).items()})
        exclusions[name] = doc.get("rounds_with_exclusions", 0)
        if "test_accuracy" in doc["result"]:
            accuracy[name] = doc["result"]["test_accuracy"]
    return {"weights_sha256": digest.hexdigest(), "guard_cuts": cuts, "listed_cuts": listed,
            "rounds_with_exclusions": exclusions, "test_accuracy": accuracy,
            "parties_done": len(cuts)}


def markdown(doc: dict) -> str:
    runs = doc["runs"]
    lines = [f"# The demo federation beside {doc['busy_loops']} busy loops: {doc['rounds']:,} rounds, "
             f"{len(runs)} runs (synthetic data: breast cancer split)", "",
             f"Runs made at commit `{doc['runs_commit']}`.", "",
             "| run | exit | wall | peak load | weights (sha256) | guard cuts | listed peers cut | rounds with exclusions |",
             "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        wall = f"{r['wall_s']:.0f} s" if r.get("wall_s") is not None else "-"
        lines.append(f"| {i} | {r['rc']} | {wall} | {r['peak_load']:.1f} | `{r['weights_sha256'][:16]}` | "
                     f"{sum(r['guard_cuts'].values())} | {sum(r['listed_cuts'].values())} | "
                     f"{sum(r['rounds_with_exclusions'].values())} |")
    same = len({r["weights_sha256"] for r in runs}) == 1
    lines += ["", f"Every run passed: {all(r['rc'] == 0 for r in runs)}; weights bit-identical across runs: {same}.",
              "", environment_line(doc.get("environment"))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 2, help="busy loops beside the runs")
    ap.add_argument("--summarize", type=Path, help="a folder of run folders run1, run2, ... made before")
    ap.add_argument("--runs-commit", help="with --summarize: the commit the runs were made at")
    ap.add_argument("--walls", help="with --summarize: each run's wall seconds, comma separated")
    ap.add_argument("--peaks", help="with --summarize: each run's peak 1-minute load, comma separated")
    args = ap.parse_args(argv)
    runs_n = args.runs or (2 if args.quick else 5)
    rounds = args.rounds or (400 if args.quick else 8000)
    shown = list(sys.argv[1:] if argv is None else argv)
    if args.summarize:   # the record names the folder of run folders, not where it was on this machine
        shown[shown.index(str(args.summarize)) if str(args.summarize) in shown else 0] = args.summarize.name
    session = Session("loaded_demo", __file__, shown)
    out = Output("loaded_demo", args.quick, args.out)
    if args.summarize:
        folders = sorted(args.summarize.glob("run*"), key=lambda p: int(p.name[3:]))
        walls = [float(w) for w in args.walls.split(",")] if args.walls else [None] * len(folders)
        peaks = [float(w) for w in args.peaks.split(",")] if args.peaks else [0.0] * len(folders)
        runs = [{"rc": 0 if (f / "parties").is_dir() and all(
                    json.loads(s.read_text()).get("state") == "done" for s in (f / "parties").glob("*/status.json"))
                 else 1, "wall_s": w, "peak_load": p, **summarize_run(f)} for f, w, p in zip(folders, walls, peaks)]
        commit = args.runs_commit or "unknown"
    else:
        loops = busy_loops(args.busy)
        try:
            root = Path(os.environ.get("TMPDIR", "/tmp")) / f"loaded_demo-{os.getpid()}"
            runs = [one_run(root / f"run{i}", rounds) for i in range(1, runs_n + 1)]
        finally:
            for p in loops:
                p.kill()
        commit = session.meta.get("git_commit")
    doc = {"rounds": rounds, "busy_loops": args.busy, "runs_commit": commit, "runs": runs}
    return publish(out, doc, markdown, session)


if __name__ == "__main__":
    raise SystemExit(main())
