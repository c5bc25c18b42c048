"""Exact share x public products (crypto.field_matmul) against float64 matmul of the same shapes.

Rows: shape, float64 seconds, field_matmul seconds, ratio (float64 / field_matmul = fraction of
float64 throughput; goal >= 0.25), and the shamir_share.matmul path (public API, including its
bound bookkeeping) for comparison.  BLAS limited to one thread; best of interleaved repeats.

    python benchmarks/field_matmul.py [--quick]
"""
from __future__ import annotations

import argparse

import numpy as np
from threadpoolctl import threadpool_limits

import harness
from fedhet.crypto import field_matmul as fm
from fedhet.crypto.field import F61, P61
from fedhet.protocols import shamir_share as ss

SHAPES = [(20700, 16, 16), (2000, 207, 207), (512, 512, 512), (207, 207, 1600)]


def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__))
    args = ap.parse_args(argv)
    sess = harness.Session("field_matmul", __file__, argv)
    rng = np.random.default_rng(0)
    rows = []
    shapes = SHAPES[:2] if args.quick else SHAPES
    with threadpool_limits(1):
        for M, K, N in shapes:
            a = rng.integers(0, P61, size=(M, K), dtype=np.uint64)
            w = rng.normal(0, 0.3, size=(K, N))
            wi = np.rint(np.ldexp(w, 16)).astype(np.int64)
            af = rng.normal(size=(M, K))
            sa = ss.SharedArray(a, 1, 2, 16, 1 << 30, 0.0, F61)
            variants = {"float64": lambda: af @ w, "field_matmul": lambda: fm.matmul(a, wi)}
            if sa is not None:
                variants["shamir_share.matmul"] = lambda: ss.matmul(sa, wi)
            t = {k: v.wall_s for k, v in harness.best_of_interleaved(variants, 3).items()}
            assert np.array_equal(fm.matmul(a, wi), ss.matmul(sa, wi).values)
            rows.append({"M": M, "K": K, "N": N, **{f"{k}_s": v for k, v in t.items()},
                         "ratio_vs_float64": t["float64"] / t["field_matmul"],
                         "speedup_vs_shamir_share": t.get("shamir_share.matmul", float("nan")) / t["field_matmul"]})
    env = sess.finish()
    md = ["# Exact share x public products vs float64 matmul (1 BLAS thread)", "",
          "| M | K | N | float64 s | field_matmul s | shamir_share.matmul s | ratio to float64 | speedup vs shamir_share |",
          "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['M']} | {r['K']} | {r['N']} | {r['float64_s']:.4f} | {r['field_matmul_s']:.4f} | "
                  f"{r.get('shamir_share.matmul_s', float('nan')):.4f} | {r['ratio_vs_float64']:.3f} | "
                  f"{r['speedup_vs_shamir_share']:.2f} |")
    md += ["", "Public operand: fixed-point weights N(0, 0.3) with 16 fractional bits; shares uniform in GF(2**61-1).",
           "", harness.environment_line(env), ""]
    harness.Output("field_matmul", args.quick, args.out).write({"rows": rows, "environment": env}, "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
