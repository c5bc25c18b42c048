"""STFL with DP latents (issue 47): Table I's data sets at a per-row latent epsilon of 1, 4 and 16
(delta 1e-5) beside non-private.

Each guest's latent rows (train and test: the common rows it sends once) are clipped to L2 norm
``sqrt(d_latent)`` (public: the latent width) and get Gaussian noise calibrated by the ledger
(:func:`fedhet.protocols.dp_settings.release_rows`: one Gaussian release per row); the host trains on
them as in STFL.  Per seed the VAEs are fitted once and every epsilon reuses them (the noise is drawn
afresh, seeded per seed and epsilon for a reproducible table).  Data: FATE's breast ("cancer"),
default-credit ("payment") and give-credit ("credit") tables, real, from ``../shared/data``.

    python -m benchmarks.stfl_dp [--seeds 3 --seeds-large 1 --epochs 100]
"""
from __future__ import annotations

import argparse
import logging
import math
import statistics
import sys
from dataclasses import replace

import numpy as np
import torch

from benchmarks import harness
from fedhet.algorithms import data_fate
from fedhet.algorithms.datapath import DatasetNotFound
from fedhet.algorithms.stfl import Model
from fedhet.algorithms.stfl.core import stfl_host, stfl_latents
from fedhet.parties.settings import parse_settings
from fedhet.protocols.dp_settings import ReleaseDPSettings, release_rows

NAME = "stfl_dp"
EPSILONS = (1.0, 4.0, 16.0)
DELTA = 1e-5


def noised(zs: list[np.ndarray], eps: float, rng: np.random.Generator) -> tuple[list[np.ndarray], dict]:
    out, ledger = [], {}
    for z in zs:
        s = ReleaseDPSettings(row_dp_epsilon=eps, row_dp_delta=DELTA, row_dp_clip=math.sqrt(z.shape[1]))
        zn, led = release_rows(s, z, rng=rng)
        out.append(zn.astype(np.float32))
        ledger = led.as_dict()
    return out, ledger


def run(args) -> dict:
    cfg = parse_settings(Model, {"epochs": args.epochs, "vae_epochs": args.epochs}, "stfl")
    out: dict = {"epochs": args.epochs, "delta": DELTA, "datasets": {}}
    for name in args.datasets:
        try:
            data = data_fate.load(name, data_dir=args.data_dir)
        except DatasetNotFound as e:
            print(f"[skip] {name}: {e}", file=sys.stderr)
            out["datasets"][name] = {"skipped": str(e)}
            continue
        n_seeds = args.seeds if len(data.common_ids) < 5000 else args.seeds_large
        rows: dict[str, list[float]] = {"non-private": [], **{f"epsilon={e:g}": [] for e in EPSILONS}}
        noise: dict[str, float] = {}
        for seed in range(n_seeds):
            v = data_fate.views(data, data_fate.make_split(data, seed, 0.4, 0.2))
            c = replace(cfg, seed=seed)
            lat = stfl_latents(v, c)
            rows["non-private"].append(stfl_host(v, lat["z_train"], lat["z_test"], c)[0])
            for e in EPSILONS:
                rng = np.random.default_rng([seed, int(e * 1000)])
                n_rows = [np.concatenate([a, b]) for a, b in zip(lat["z_train"], lat["z_test"])]
                zn, led = noised(n_rows, e, rng)   # one release of every common row
                k = len(lat["z_train"][0])
                acc, _ = stfl_host(v, [z[:k] for z in zn], [z[k:] for z in zn], c)
                rows[f"epsilon={e:g}"].append(acc)
                noise[f"epsilon={e:g}"] = led["noise_multiplier"]
                print(f"{name} seed={seed} eps={e:g}: {acc:.4f} (non-private {rows['non-private'][-1]:.4f})",
                      flush=True)
        out["datasets"][name] = {
            "seeds": n_seeds, "latent_dims": [int(z.shape[1]) for z in lat["z_train"]],
            "rows": {k: {"mean": statistics.fmean(x), "std": statistics.pstdev(x) if len(x) > 1 else 0.0,
                         "values": x, "noise_multiplier": noise.get(k)} for k, x in rows.items()}}
    return out


def markdown(doc: dict) -> str:
    lines = ["# STFL with DP latents (per row, delta 1e-5; FATE tables, real)", "",
             f"Host and VAE epochs: {doc['epochs']}. Each latent row clipped to L2 norm sqrt(d_latent), "
             "Gaussian noise from the ledger's calibration (one release per row).", "",
             "| data set | seeds | non-private | " + " | ".join(f"epsilon = {e:g}" for e in EPSILONS) + " |",
             "|---|---|---|" + "---|" * len(EPSILONS)]
    for name, d in doc["datasets"].items():
        if "skipped" in d:
            lines.append(f"| {name} | skipped: {d['skipped']} |")
            continue
        cells = [f"{d['rows'][k]['mean']:.4f} ± {d['rows'][k]['std']:.4f}"
                 + (f" (z = {d['rows'][k]['noise_multiplier']:.2f})" if d['rows'][k]['noise_multiplier'] else "")
                 for k in ["non-private", *[f"epsilon={e:g}" for e in EPSILONS]]]
        lines.append(f"| {name} | {d['seeds']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ["", harness.environment_line(doc.get("environment"))]) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = harness.add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), render_only=True)
    ap.add_argument("--datasets", nargs="*", default=["cancer", "payment", "credit"])
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the small set (cancer)")
    ap.add_argument("--seeds-large", type=int, default=1, help="seeds of payment and credit")
    ap.add_argument("--epochs", type=int, default=100)
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args(argv)
    out = harness.Output(NAME, args.quick, args.out)
    if args.render_only:
        harness.render_only(out, markdown)
        return 0
    logging.getLogger("absl").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    if args.quick:
        args.epochs, args.seeds, args.seeds_large, args.datasets = 5, 1, 1, ["cancer"]
    session = harness.Session(NAME, __file__, argv)
    doc = run(args)
    return harness.publish(out, doc, markdown, session)


if __name__ == "__main__":
    raise SystemExit(main())
