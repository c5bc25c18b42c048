"""Exact share x public products (crypto.field_matmul) against float64 matmul of the same shapes.

For each shape (R, K) @ (K, N) -- the products F3's holders compute, plus two large square-ish
ones -- the script times, interleaved round by round with BLAS pinned to one thread:

* ``float64``: ``x @ w`` on float64 operands of the same shapes (the reference throughput);
* ``field_matmul``: ``crypto.field_matmul.matmul(shares, M)``, the public API (validates the
  shares), exact mod 2**61 - 1;
* ``shared_array``: ``SharedArray @ w`` through ``protocols.shared_array.matmul`` (encodes the
  float public matrix, computes the public range and error bounds, then the same kernel).

Ratio = float64 time / field time = the fraction of float64 throughput (goal >= 0.25), from the
medians of the interleaved rounds' wall times; the ratios of the least wall times and of the
median CPU times are reported too (the machine is shared: wall times carry the other jobs' load,
and memory-bound passes suffer more from it than the cache-blocked gemm).  Shares are uniform in GF(2**61 - 1); the public matrix is N(0, 0.3)
in fixed point with 16 fractional bits.  Every result is checked against the generic exact
product ``PrimeField.matmul``.

A second table times what F3's holders actually run per training step since the products were
batched (``algorithms/f3/core.py``: ``holder_forward`` / ``holder_backward``, 207 owners, batch 100,
d = D = 16): ``batched_lmatmul_trusted(m, a)``, a different public matrix per batch element,
against float64 ``np.matmul`` of the same stacked shapes; public operands at F3's default
fractional bits (14 forward, 18 backward) with magnitudes like a training step's.  Every batched
result is checked against the per-element :func:`lmatmul_trusted`.

    python -m benchmarks.field_matmul [--quick] [--repeats N]
"""
from __future__ import annotations

import argparse

import numpy as np
from threadpoolctl import threadpool_limits

from benchmarks import harness
from fedhet.crypto import field_matmul as fm
from fedhet.crypto.field import F61, P61
from fedhet.protocols import shared_array as sa

# (R, K, N) with what they are in F3
SHAPES = [
    (100 * 12, 16, 16, "batch 100 x 12 owners, d = 16, @ W0"),
    (2856, 16, 16, "METR-LA windows, d = 16, @ P_i"),
    (100, 207 * 16, 16, "batch 100, 207 owners x 16 stacked, @ (A_hat kron W0)"),
    (4343, 16, 64, "PEMS-BAY windows, d = 16, @ (16, 64)"),
    (1024, 1024, 1024, "large square"),
    (4096, 512, 512, "large, tall"),
]

# F3's batched holder products at 207 owners, batch 100, d = D = 16: (B, J, K) @ (B, K, N), what the
# public operand is, its fractional bits and typical magnitude
N_OWN, BATCH, D = 207, 100, 16
BATCHED = [
    ((N_OWN, D, D), (N_OWN, D, BATCH), "forward: C_i^T h^i[rows]^T per owner (alignment P_i W0)", 14, 0.3),
    ((BATCH, N_OWN, N_OWN), (BATCH, N_OWN, D), "forward: A_hat_b G_b per sample (ICDF graph)", 14, None),
    ((N_OWN, D, BATCH), (N_OWN, BATCH, D), "backward: E_i^T h^i[rows] per owner (dC)", 18, 1e-3),
    ((BATCH, N_OWN, D), (BATCH, D, N_OWN), "backward: dU_b G_b^T per sample (dA_hat)", 18, 1e-3),
]


def _public_batch(rng, shape, frac, scale):
    """Fixed-point public operands as float64 integers (F3 passes them so); ``scale`` None: a
    normalised dense graph per sample, D^-1/2 (A + I) D^-1/2 with A uniform and symmetric."""
    if scale is None:
        B, n, _ = shape
        a = rng.uniform(0, 1, size=shape)
        a = (a + a.transpose(0, 2, 1)) / 2 + np.eye(n)
        dinv = 1 / np.sqrt(a.sum(-1))
        v = a * dinv[:, :, None] * dinv[:, None, :]
    else:
        v = rng.normal(0, scale, size=shape)
    return np.rint(np.ldexp(v, frac))


def bench_batched(rng, repeats_arg, quick):
    rows = []
    for mshape, ashape, what, frac, scale in (BATCHED[:2] if quick else BATCHED):
        m = _public_batch(rng, mshape, frac, scale)
        a = rng.integers(0, P61, size=ashape, dtype=np.uint64)
        x = rng.normal(size=ashape)
        mi = m.astype(np.int64)
        rowmax = int(np.abs(mi).sum(axis=-1).max())
        got = fm.batched_lmatmul_trusted(m, a, rowmax=rowmax)
        for b in range(0, mshape[0], max(1, mshape[0] // 7)):
            assert np.array_equal(got[b], fm.lmatmul_trusted(mi[b], a[b]))
        B, J, K = mshape
        flops = 2.0 * B * J * K * ashape[-1]
        repeats = repeats_arg or max(5, min(41, int(2e9 / flops)))
        if quick:
            repeats = min(repeats, 11)
        variants = {"float64": lambda: np.matmul(m, x),
                    "field": lambda: fm.batched_lmatmul_trusted(m, a, rowmax=rowmax)}
        walls, cpus = _interleaved(variants, repeats)
        med = {k: _median(v) for k, v in walls.items()}
        cpu = {k: _median(v) for k, v in cpus.items()}
        rows.append({"m_shape": list(mshape), "a_shape": list(ashape), "what": what, "frac_bits": frac,
                     "rowmax_bits": rowmax.bit_length(), "repeats": repeats,
                     "float64_median_s": med["float64"], "field_median_s": med["field"],
                     "float64_cpu_median_s": cpu["float64"], "field_cpu_median_s": cpu["field"],
                     "ratio_median": med["float64"] / med["field"],
                     "ratio_cpu_median": cpu["float64"] / cpu["field"] if cpu["field"] > 0 else None})
        r = rows[-1]
        print(f"batched {mshape} @ {ashape}: float64 {med['float64'] * 1e3:.3f} ms, field "
              f"{med['field'] * 1e3:.3f} ms, ratio {r['ratio_median']:.3f}", flush=True)
    return rows


def _interleaved(variants: dict, repeats: int) -> tuple[dict, dict]:
    """Wall and CPU seconds of every variant over ``repeats`` interleaved rounds.

    One interleaved round per call, so that the CPU time of every round is kept too.
    """
    walls: dict = {k: [] for k in variants}
    cpus: dict = {k: [] for k in variants}
    for _ in range(repeats):
        for k, v in harness.best_of_interleaved(variants, 1).items():
            walls[k].append(v.wall_s)
            cpus[k].append(v.cpu_s)
    return walls, cpus


def _median(walls) -> float:
    return float(np.median(np.asarray(walls)))


def main(argv=None):
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__))
    ap.add_argument("--repeats", type=int, default=0, help="interleaved rounds per shape (default: by size)")
    args = ap.parse_args(argv)
    sess = harness.Session("field_matmul", __file__, argv)
    rng = np.random.default_rng(0)
    rows = []
    shapes = SHAPES[:4] if args.quick else SHAPES
    with threadpool_limits(1):
        for R, K, N, what in shapes:
            a = rng.integers(0, P61, size=(R, K), dtype=np.uint64)
            w = rng.normal(0, 0.3, size=(K, N))
            wi = np.rint(np.ldexp(w, 16)).astype(np.int64)
            x = rng.normal(size=(R, K))
            shares = sa.SharedArray(a, 1, 2, 16, 1 << 30, 0.0, F61)
            assert np.array_equal(fm.matmul(a, wi), F61.matmul(a, F61.from_int(wi)))
            assert np.array_equal((shares @ w).values, fm.matmul(a, wi))
            pl = fm.plan(np.abs(wi))
            flops = 2.0 * R * K * N
            repeats = args.repeats or max(5, min(101, int(2e9 / flops)))
            if args.quick:
                repeats = min(repeats, 21)
            variants = {"float64": lambda: x @ w,
                        "field_matmul": lambda: fm.matmul(a, wi),
                        "shared_array": lambda: shares @ w}
            walls, cpus = _interleaved(variants, repeats)
            med = {k: _median(v) for k, v in walls.items()}
            best = {k: min(v) for k, v in walls.items()}
            cpu = {k: _median(v) for k, v in cpus.items()}
            rows.append({"R": R, "K": K, "N": N, "what": what, "repeats": repeats,
                         "digits": pl.limbs, "k_blocks": pl.blocks,
                         **{f"{k}_median_s": v for k, v in med.items()},
                         **{f"{k}_min_s": v for k, v in best.items()},
                         "ratio_median": med["float64"] / med["field_matmul"],
                         "ratio_min": best["float64"] / best["field_matmul"],
                         **{f"{k}_cpu_median_s": v for k, v in cpu.items()},
                         "ratio_cpu_median": cpu["float64"] / cpu["field_matmul"] if cpu["field_matmul"] > 0 else None,
                         "ratio_shared_array_median": med["float64"] / med["shared_array"],
                         "float64_gflops_median": flops / med["float64"] / 1e9})
            r = rows[-1]
            print(f"{R}x{K}x{N}: float64 {med['float64'] * 1e3:.3f} ms, field {med['field_matmul'] * 1e3:.3f} ms, "
                  f"ratio {r['ratio_median']:.3f} (min-based {r['ratio_min']:.3f})", flush=True)
        batched = bench_batched(rng, args.repeats, args.quick)
    env = sess.finish()
    md = ["# Exact share x public products vs float64 matmul (1 BLAS thread)", "",
          "Ratio = float64 time / exact field time (fraction of float64 throughput; goal >= 0.25), "
          "medians of the wall times of interleaved rounds; beside it the ratio of the least wall times "
          "and of the median CPU times (the machine is shared with other jobs: CPU time is the least "
          "disturbed by them).", "",
          "| R x K x N | what | digits x K-blocks | float64 ms | field_matmul ms | ratio | ratio (min wall) "
          "| ratio (CPU time) | SharedArray @ ms | ratio SharedArray |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['R']} x {r['K']} x {r['N']} | {r['what']} | {r['digits']} x {r['k_blocks']} | "
                  f"{r['float64_median_s'] * 1e3:.3f} | {r['field_matmul_median_s'] * 1e3:.3f} | "
                  f"{r['ratio_median']:.3f} | {r['ratio_min']:.3f} | {r['ratio_cpu_median'] or float('nan'):.3f} | "
                  f"{r['shared_array_median_s'] * 1e3:.3f} | "
                  f"{r['ratio_shared_array_median']:.3f} |")
    md += ["", "Shares uniform in GF(2**61 - 1); public operand N(0, 0.3) weights in fixed point with 16 "
           "fractional bits.  field_matmul validates the shares; SharedArray @ also encodes the float "
           "matrix and computes the public bounds.  Every product is exact (checked against "
           "PrimeField.matmul)."]
    md += ["", "## F3's batched holder products (207 owners, batch 100, d = D = 16)", "",
           "What `holder_forward` / `holder_backward` run per step: `batched_lmatmul_trusted(m, a)` with a "
           "public matrix per batch element, against float64 `np.matmul` of the same stacked shapes; ratio "
           "= float64 time / field time (goal >= 0.25).", "",
           "| m (B, J, K) @ shares (B, K, N) | what | fractional bits / row sum of abs(m) | float64 ms | "
           "field ms | ratio | ratio (CPU time) |", "|---|---|---|---|---|---|---|"]
    for r in batched:
        md.append(f"| {tuple(r['m_shape'])} @ {tuple(r['a_shape'])} | {r['what']} | {r['frac_bits']} / "
                  f"< 2^{r['rowmax_bits']} | {r['float64_median_s'] * 1e3:.3f} | {r['field_median_s'] * 1e3:.3f} | "
                  f"{r['ratio_median']:.3f} | {r['ratio_cpu_median'] or float('nan'):.3f} |")
    if len(batched) > 1:
        # one training step runs each product once: its hot loop's throughput is the ratio of the sums
        f64, fld = (sum(r[k] for r in batched) for k in ("float64_median_s", "field_median_s"))
        f64c, fldc = (sum(r[k] for r in batched) for k in ("float64_cpu_median_s", "field_cpu_median_s"))
        md.append(f"| one step, all of the above | sum of the medians | | {f64 * 1e3:.3f} | {fld * 1e3:.3f} | "
                  f"{f64 / fld:.3f} | {f64c / fldc if fldc > 0 else float('nan'):.3f} |")
    md += ["", "Every batched product is exact (checked against lmatmul_trusted per element).", "",
           harness.environment_line(env), ""]
    harness.Output("field_matmul", args.quick, args.out).write({"rows": rows, "batched": batched, "environment": env}, "\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
