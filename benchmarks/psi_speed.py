"""RR22 PSI before and after issue 49, and where ``psi_backend = "auto"`` switches from ECDH to RR22.

Two parts, one script run, every PSI the ``psi`` job as two audited party processes over CURVE
ZeroMQ (``benchmarks/psi_rr22.py``'s :func:`~benchmarks.psi_rr22.one`: a label owner and one
feature party, half of each set common, each party checks its intersection).  Data: generated
ID strings (**synthetic**).

1. **Speed** at 2^16, 2^18, 2^20 (``--sizes``): this tree's RR22 and a baseline's (``--baseline``, a
   git ref, default ``main``: its files exported with ``git archive`` to a temporary folder and run
   from there, so its parties import its own code), interleaved (baseline, this, baseline, this,
   ...; ``--repeats`` at 2^20, median reported).  protocol s, CPU-s, MB and peak RSS as in
   ``psi_rr22.py``; the label owner's stages (``hash_s``: encode, de-duplicate, digest; ``order_s``:
   the agreed sorted order) show where the time went.
2. **auto's threshold** (``--auto-sizes``, default 2^8 .. 2^14): ECDH against RR22 of this tree.
   ``psi_backend = "auto"`` runs inside a party's first PSI call, so RR22's one-time start in a
   fresh process (numba's cached kernels, ``psi.prepare``) counts against it here:
   ``rr22 + start s`` = its protocol s + that start.  The crossing is the smallest size from which RR22
   (with its start) is faster at every measured size; ``fedhet.protocols.psi.AUTO_RR22_FROM`` is
   set from it (rounded to a power of two).

The machine is shared: the load average before and after each run is recorded with it.

    python -m benchmarks.psi_speed                          # against main, 2^16..2^20, auto 2^8..2^14
    python -m benchmarks.psi_speed --baseline 0e7df3e --sizes 20 --repeats 3
    python -m benchmarks.psi_speed --quick                  # 2^12, 2^14; auto 2^8, 2^12

Writes benchmarks/results/psi_speed.json and .md atomically (psi_speed_quick.* with --quick).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import harness
from benchmarks import psi as psi_bench
from benchmarks.psi_rr22 import median_row, one

PACKAGES = ("parties", "crypto", "protocols", "algorithms")
GOAL_S = 2.5
GOAL_MB = 36.0
MARK = "PSI_SPEED_RESULT "


class Baseline:
    """A git ref's files in a temporary folder, laid out so that ``fedhet.*`` imports them (a ``fedhet``
    folder of links on PYTHONPATH ahead of this tree's editable install)."""

    def __init__(self, ref: str):
        self.ref = ref
        self.commit = subprocess.run(["git", "rev-parse", ref], cwd=harness.REPO, capture_output=True, text=True,
                                     check=True).stdout.strip()
        self.tmp = tempfile.TemporaryDirectory(prefix="psi_speed_base_")
        root = Path(self.tmp.name)
        self.src, pkg = root / "src", root / "py" / "fedhet"
        self.src.mkdir()
        pkg.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", self.commit], cwd=harness.REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(self.src)], input=archive.stdout, check=True)
        for d in PACKAGES:
            (pkg / d).symlink_to(self.src / d, target_is_directory=True)
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root / "py"), str(self.src)]))

    def one(self, n: int, chunk: int) -> dict:
        """The baseline's ``benchmarks.psi_rr22.one(n, "rr22", chunk)`` in a process of its own."""
        code = (f"import json; from benchmarks.psi_rr22 import one; "
                f"print({MARK!r} + json.dumps(one({n}, 'rr22', {chunk}), default=str))")
        out = subprocess.run([sys.executable, "-c", code], cwd=self.src, env=self.env, capture_output=True,
                             text=True, timeout=3 * psi_bench.PSI_TIMEOUT_S)
        for line in out.stdout.splitlines():
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
        raise RuntimeError(f"the baseline's run of 2^{n.bit_length() - 1} failed:\n{out.stderr[-3000:]}")

    def close(self) -> None:
        self.tmp.cleanup()


def _stages(r: dict) -> dict:
    return {k: round(v, 3) for k, v in psi_bench.stage_seconds(r["stages"]["label_owner"]).items()
            if k not in ("prepare", "cpu")}


def _brief(r: dict) -> dict:
    """A run without its raw stage tables (kept: the label owner's stage seconds)."""
    return {**{k: v for k, v in r.items() if k != "stages"}, "label_owner_stages_s": _stages(r)}


def speed(sizes: list[int], repeats: int, chunk: int, base: Baseline, out: list[dict], save) -> None:
    for e in sizes:
        n = 1 << e
        runs: dict[str, list[dict]] = {"baseline": [], "this": []}
        for _ in range(repeats if e == 20 else 1):
            for which in runs:
                r = base.one(n, chunk) if which == "baseline" else one(n, "rr22", chunk)
                runs[which].append(r)
                print(f"2^{e} rr22 {which}: {r['protocol_s']:.2f} s, {r['bytes_total'] / 1e6:.1f} MB, "
                      f"CPU {r['cpu_s']:.1f} s, load {r['loadavg_before']:.1f}", flush=True)
        for which, acc in runs.items():
            row = _brief(median_row(acc))
            out.append({**row, "log2n": e, "n": n, "code": which})
        save()


def auto_threshold(sizes: list[int], chunk: int, out: list[dict], save) -> None:
    for e in sizes:
        n = 1 << e
        for backend in ("ecdh", "rr22"):
            r = one(n, backend, chunk)
            start = max(r["prepare_s"].values()) if r["prepare_s"] else 0.0
            out.append({**_brief(r), "log2n": e, "n": n, "backend": backend, "start_s": start,
                        "with_start_s": r["protocol_s"] + (start if backend == "rr22" else 0.0)})
            print(f"auto 2^{e} {backend}: {r['protocol_s']:.3f} s (+ start {start:.2f} s), load "
                  f"{r['loadavg_before']:.1f}", flush=True)
        save()


def crossing(rows: list[dict]) -> int | None:
    """The smallest measured size from which RR22 (with its start) beats ECDH at every larger measured size."""
    by = {(r["log2n"], r["backend"]): r["with_start_s"] for r in rows}
    sizes = sorted({r["log2n"] for r in rows})
    wins = [by.get((e, "rr22"), float("inf")) < by.get((e, "ecdh"), 0.0) for e in sizes]
    for i, e in enumerate(sizes):
        if all(wins[i:]):
            return 1 << e
    return None


def render(res: dict) -> str:
    lines = ["# RR22 PSI before and after issue 49; auto's ECDH/RR22 threshold", "",
             "Two party processes (label owner, feature party) of the `psi` job over CURVE ZeroMQ; generated ID "
             f"strings (**synthetic**), half of each set common; every run audited and checked. Command: "
             f"`{res['command']}`. Baseline: `{res['baseline']}` ({res['baseline_commit'][:10]}), run from its own "
             "exported files in the same script run, interleaved with this tree's.", "",
             "protocol s = the PSI call's clock in the party that came up last (median of the repeats where "
             "repeated; numba's one-time start excluded); CPU-s = both parties' CPU inside their PSI calls; "
             "MB = payload bytes sent by both; stages = the label owner's (hash: encode, de-duplicate, digest; "
             "order: the agreed sorted order).", "",
             "| n per side | code | protocol s | repeats | CPU-s | MB | RSS L / F MiB | label owner stages s | load |",
             "|---:|---|---:|---|---:|---:|---|---|---|"]
    for r in res["speed"]:
        rss = r.get("rss_mib") or {}
        reps = ", ".join(f"{x:.2f}" for x in r.get("repeats_protocol_s", [r["protocol_s"]]))
        st = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r["label_owner_stages_s"].items()))
        rss_s = " / ".join(f"{rss[p]:.0f}" if rss.get(p) is not None else "–" for p in ("label_owner", "feature"))
        lines.append(f"| 2^{r['log2n']} | {r['code']} | {r.get('median_protocol_s', r['protocol_s']):.2f} | {reps} | "
                     f"{r['cpu_s']:.1f} | {r['bytes_total'] / 1e6:.1f} | {rss_s} | {st} | "
                     f"{r['loadavg_before']:.1f}→{r['loadavg_after']:.1f} |")
    by = {(r["log2n"], r["code"]): r for r in res["speed"]}
    t20, b20 = by.get((20, "this")), by.get((20, "baseline"))
    if t20:
        t = t20.get("median_protocol_s", t20["protocol_s"])
        mb = t20["bytes_total"] / 1e6
        lines += ["", f"Goals of issue 49 at 2^20 x 2^20: protocol {t:.2f} s (goal ≤ {GOAL_S} s: "
                  f"**{'met' if t <= GOAL_S else 'missed'}**), {mb:.1f} MB (goal ≤ {GOAL_MB:.0f} MB: "
                  f"**{'met' if mb <= GOAL_MB else 'missed'}**)"
                  + (f"; the baseline took {b20.get('median_protocol_s', b20['protocol_s']):.2f} s in this run "
                     f"({b20.get('median_protocol_s', b20['protocol_s']) / t:.2f}x)." if b20 else ".")]
    lines += ["", "## auto: ECDH against RR22 at small sizes", "",
              "rr22 + start = RR22's protocol s plus its one-time start in a fresh party process, which a party's "
              "first PSI under `auto` pays.", "",
              "| n per side | backend | protocol s | start s | protocol + start s | load |", "|---:|---|---:|---:|---:|---|"]
    for r in res["auto"]:
        lines.append(f"| 2^{r['log2n']} | {r['backend']} | {r['protocol_s']:.3f} | {r['start_s']:.2f} | "
                     f"{r['with_start_s']:.3f} | {r['loadavg_before']:.1f}→{r['loadavg_after']:.1f} |")
    c = res.get("crossing")
    lines += ["", f"Crossing: RR22 is faster from {c} IDs per side at every measured size above it"
              if c else "Crossing: not within the measured sizes",
              f"(`AUTO_RR22_FROM` in the code: {res['auto_rr22_from']})."]
    env_line = harness.environment_line(res.get("environment"))
    if env_line:
        lines += ["", env_line]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(ap, quick_help="2^12 and 2^14; auto at 2^8 and 2^12", render_only=True)
    ap.add_argument("--baseline", default="main", help="git ref of the code to compare against (default main)")
    ap.add_argument("--sizes", type=int, nargs="*", help="log2 of the speed sizes (default 16 18 20)")
    ap.add_argument("--auto-sizes", type=int, nargs="*", help="log2 of auto's sizes (default 8 .. 14)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each at 2^20 (median reported)")
    ap.add_argument("--chunk", type=int, default=1 << 14, help="OPRF values per message")
    args = ap.parse_args(argv)
    out_file = harness.Output("psi_speed", quick=args.quick, out_dir=args.out)
    if args.render_only:
        harness.render_only(out_file, render)
        return 0
    from fedhet.protocols import psi

    session = harness.Session("psi_speed", __file__, argv)
    sizes = args.sizes if args.sizes is not None else ([12, 14] if args.quick else [16, 18, 20])
    auto_sizes = args.auto_sizes if args.auto_sizes is not None else ([8, 12] if args.quick else list(range(8, 15)))
    base = Baseline(args.baseline)
    res: dict = {"benchmark": "psi_speed", "quick": args.quick, "command": session.command, "baseline": args.baseline,
                 "baseline_commit": base.commit, "sizes": sizes, "auto_sizes": auto_sizes, "speed": [], "auto": [],
                 "goal_s": GOAL_S, "goal_mb": GOAL_MB, "auto_rr22_from": psi.AUTO_RR22_FROM, "data": "synthetic"}

    def save() -> None:
        res["crossing"] = crossing(res["auto"]) if res["auto"] else None
        res["environment"] = session.finish()
        out_file.write(res, render(res))   # partial results survive an interrupted run

    try:
        base.one(1 << 10, args.chunk)   # the baseline's numba kernels compiled once, outside the timings
        one(1 << 10, "rr22", args.chunk)
        auto_threshold(auto_sizes, args.chunk, res["auto"], save)
        speed(sizes, args.repeats, args.chunk, base, res["speed"], save)
    finally:
        base.close()
    res["median_load"] = statistics.median(r["loadavg_before"] for r in res["speed"] + res["auto"]) \
        if res["speed"] or res["auto"] else None
    save()
    return harness.publish(out_file, res, render, session)


if __name__ == "__main__":
    sys.exit(main())
