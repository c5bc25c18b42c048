"""How often the random-band OKVS fails to encode, against the bound that fedhet.crypto.okvs states.

A failure (``fedhet.crypto.okvs.OKVSFailure``) is a set of band rows that are
linearly dependent.  ``okvs.failure_log2`` states ``log2 P[fail] <= log2 n -
θ w / ln 2 + 1`` (a union bound with Lundberg's inequality; see the module).
Its probability falls so fast with w that it cannot be counted at the width
in use (w = 128), so this script counts failures at small widths where they
are frequent (bands of w random bits, starts uniform in [0, m - w],
m = okvs.columns(n, w), ε = okvs.EPSILON), for n = 2^12 and 2^14, and sets
each measured rate beside the bound.  Points with fewer than ``MIN_FAIL``
failures are shown but not judged (too few to estimate a rate).

    python -m benchmarks.okvs_failure            # n = 2^12, 2^14; w = 20 .. 40
    python -m benchmarks.okvs_failure --quick    # n = 2^10; w = 16 .. 32

Writes benchmarks/results/okvs_failure.json and .md.
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np

from benchmarks import harness
from fedhet.crypto import okvs

MIN_FAIL = 30


def trial_failures(n: int, w: int, trials: int, rng: np.random.Generator) -> int:
    """Failures of ``trials`` encodings of n random band rows of width w (<= 64) with zero values."""
    m = okvs.columns(n, w)
    mask = np.uint64((1 << w) - 1) if w < 64 else np.uint64(0xFFFFFFFFFFFFFFFF)
    fails = 0
    values = np.zeros((n, 2), dtype=np.uint64)
    for _ in range(trials):
        starts = rng.integers(0, m - w + 1, n, dtype=np.int64)
        bands = (rng.integers(0, 1 << 63, (n, 1), dtype=np.uint64) << np.uint64(1)
                 | rng.integers(0, 2, (n, 1), dtype=np.uint64)) & mask
        try:
            okvs.encode(starts, bands, values, m)
        except okvs.OKVSFailure:
            fails += 1
    return fails


def judged(points: list[dict]) -> dict:
    """The largest excess of a measured log2 rate over the stated bound, over points with enough failures."""
    use = [p for p in points if p["failures"] >= MIN_FAIL and p["failures"] < p["trials"]]
    excess = [math.log2(p["failures"] / p["trials"]) - p["bound_log2"] for p in use]
    return {"points_judged": len(use), "max_excess_bits": max(excess) if excess else None}


def render(res: dict) -> str:
    j = res["judged"]
    lines = ["# Random-band OKVS: measured failure rate against the stated bound", "",
             f"ε = {res['epsilon']}, m = ⌈(1+ε) n⌉ + w columns, random bands; bound = log2 n − θw/ln 2 + 1 "
             f"with θ/ln 2 = {res['theta_bits']:.4f}.  {harness.environment_line(res.get('environment'))}", "",
             "| n | w | trials | failures | measured log2 P | stated bound |", "|---|---|---|---|---|---|"]
    for p in res["points"]:
        lp = f"{math.log2(p['failures'] / p['trials']):.2f}" if p["failures"] else "–"
        lines.append(f"| 2^{int(math.log2(p['n']))} | {p['w']} | {p['trials']} | {p['failures']} | {lp} | "
                     f"{p['bound_log2']:.2f} |")
    if j["max_excess_bits"] is not None:
        lines += ["", f"Over the {j['points_judged']} points with ≥ {MIN_FAIL} failures (and not all failing), the "
                  f"measured rate exceeds the stated bound by at most {j['max_excess_bits']:.2f} bits "
                  "(≤ 0 means it is below the bound everywhere)."]
    lines += ["", "At the width in use (w = {w}, ε = {e}) the bound is 2^{b20:.1f} at n = 2^20 and 2^{b28:.1f} at "
              "n = 2^28.".format(w=res["band_width"], e=res["epsilon"], b20=res["bound_2_20"], b28=res["bound_2_28"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), render_only=True)
    ap.add_argument("--max-trials", type=int, default=20000)
    args = ap.parse_args(argv)
    out = harness.Output("okvs_failure", quick=args.quick, out_dir=args.out)
    if args.render_only:
        harness.render_only(out, render)
        return 0
    session = harness.Session("okvs_failure", __file__, argv)
    rng = np.random.default_rng(20261128)
    sizes = [10] if args.quick else [12, 14]
    widths = range(16, 33, 4) if args.quick else range(20, 41, 4)
    points = []
    for e in sizes:
        n = 1 << e
        for w in widths:
            trials, fails = 0, 0
            while fails < MIN_FAIL and trials < args.max_trials:
                batch = min(args.max_trials - trials, max(200, trials))
                fails += trial_failures(n, w, batch, rng)
                trials += batch
            points.append({"n": n, "w": w, "trials": trials, "failures": fails,
                           "bound_log2": okvs.failure_log2(n, w)})
            print(f"n=2^{e} w={w}: {fails}/{trials}", flush=True)
    doc = {"epsilon": okvs.EPSILON, "theta_bits": okvs.theta() / math.log(2), "band_width": okvs.BAND_WIDTH,
           "points": points, "judged": judged(points), "min_failures": MIN_FAIL,
           "bound_2_20": okvs.failure_log2(1 << 20), "bound_2_28": okvs.failure_log2(1 << 28)}
    return harness.publish(out, doc, render, session)


if __name__ == "__main__":
    sys.exit(main())
