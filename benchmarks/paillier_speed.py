"""Paillier encryption speed and the HE split network per epoch: today's path vs the short-exponent path, one run.

Encryption (2048-bit key, packed 64-bit slots, obfuscators computed inline, one process): ciphertexts
per second *per core* (CPU seconds of this process), old = ``obfuscation="standard"`` (``r**n``; CRT
for the key owner: the code path before this change), new = ``"short_exponent"`` (DJN ``h**x``,
256-bit ``x``, fixed-base tables; CRT for the key owner).  Decryptions are checked equal (ours and
phe's) before anything is timed; old and new are interleaved and the median is reported.

HE split network (cancer: ``--epochs`` epochs; payment: ``--batches`` batches, s/epoch extrapolated; 2048-bit key, no test pass): s/epoch of the host as
party processes.  old = the whole code tree at ``--old-ref`` (the commit before this change, run
from a ``git archive`` copy), new = this tree (default ``obfuscation="short_exponent"``), and this
tree with ``obfuscation="standard"`` (what the matmul change alone buys).  Interleaved, medians.

    python -m benchmarks.paillier_speed [--quick] [--old-ref REF]

Writes benchmarks/results/paillier_speed.{json,md} (``_quick`` with --quick).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import harness
from fedhet.crypto.paillier import PackingSpec, PaillierContext, generate_keypair

KEY_BITS = 2048
OLD_REF = "82baf56"
RUNNER = r'''
import json, sys
from benchmarks import harness
over = json.loads(sys.argv[1])
run = harness.launch_audited("he_split", overrides=over, audit=False)
host = next(p for p in run.summary["parties"].values() if p["role"] == "host")
print("RESULT " + json.dumps({"s_per_epoch": host["result"]["s_per_epoch"], "cpu_s": run.cpu_s, "wall_s": run.wall_s}))
'''


def encryption_rows(reps: int, n_values: int) -> list[dict]:
    pk, sk = generate_keypair(KEY_BITS)
    spec = PackingSpec(16, 8, 64)
    x = np.random.default_rng(0).uniform(-200, 200, n_values)
    ctxs = {
        ("public key", "old: standard r^n"): PaillierContext(pk, None, obfuscation="standard"),
        ("public key", "new: short exponent h^x"): PaillierContext(pk, None, obfuscation="short_exponent"),
        ("key owner (CRT)", "old: standard r^n, CRT"): PaillierContext(pk, sk, obfuscation="standard"),
        ("key owner (CRT)", "new: short exponent h^x, CRT"): PaillierContext(pk, sk, obfuscation="short_exponent"),
    }
    dec = PaillierContext(pk, sk)
    setup = {}
    for key, c in ctxs.items():  # correctness first (and the tables get built: timed apart)
        t0 = time.process_time()
        enc = c.encrypt(x, spec)
        setup[key] = time.process_time() - t0
        assert np.array_equal(dec.decrypt(enc), dec.decrypt(ctxs[("public key", "old: standard r^n")].encrypt(x, spec)))
        assert sk.raw_decrypt(int(enc.ciphertexts[0, 0])) == dec.decrypt_raw([enc.ciphertexts[0, 0]])[0]
    samples = {k: [] for k in ctxs}
    n_ct = None
    for _ in range(reps):
        for key, c in ctxs.items():
            t0 = time.process_time()
            enc = c.encrypt(x, spec)
            samples[key].append(time.process_time() - t0)
            n_ct = enc.n_ciphertexts
    phe_t = []
    for _ in range(reps):
        t0 = time.process_time()
        for v in range(8):
            pk.encrypt(v)
        phe_t.append((time.process_time() - t0) / 8)
    rows = [{"who": "public key", "variant": "phe.paillier encrypt(int), reference", "ct_per_core_s":
             1 / statistics.median(phe_t), "median_cpu_s": statistics.median(phe_t), "n_ciphertexts": 1}]
    for (who, var), ts in samples.items():
        med = statistics.median(ts)
        rows.append({"who": who, "variant": var, "ct_per_core_s": n_ct / med, "median_cpu_s": med,
                     "n_ciphertexts": n_ct, "first_call_cpu_s": setup[(who, var)], "samples_cpu_s": ts})
    for who in ("public key", "key owner (CRT)"):
        old = next(r for r in rows if r["who"] == who and r["variant"].startswith("old"))
        new = next(r for r in rows if r["who"] == who and r["variant"].startswith("new"))
        new["speedup_vs_old"] = new["ct_per_core_s"] / old["ct_per_core_s"]
    for c in list(ctxs.values()) + [dec]:
        c.close()
    return rows


def old_tree(ref: str, tmp: Path) -> Path:
    """``git archive REF`` under tmp, importable as ``fedhet`` through a PYTHONPATH entry."""
    src = tmp / "src"
    src.mkdir()
    arch = subprocess.run(["git", "archive", ref], cwd=harness.REPO, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=arch, check=True)
    pkg = tmp / "pkg"
    pkg.mkdir()
    (pkg / "fedhet").symlink_to(src)
    return src


def he_run(tree: Path, pythonpath: str | None, over: dict) -> dict:
    env = dict(os.environ)
    env["FEDHET_DATA_DIR"] = str((harness.REPO / ".." / "shared" / "data").resolve())
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    p = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(over)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=1800)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if p.returncode or line is None:
        raise RuntimeError(f"he_split run failed in {tree}: {p.stderr[-2000:]}")
    return json.loads(line[7:])


def he_rows(ref: str, reps: int, epochs: int, dataset: str = "cancer", batches: int = 5) -> list[dict]:
    """cancer: ``epochs`` whole epochs; payment: ``batches`` batches of one epoch, s/epoch extrapolated from
    s/batch by the host (its ``max_batches`` budget, the same in the old tree)."""
    base = dict(dataset=dataset, epochs=epochs, evaluate=False, key_bits=KEY_BITS)
    if dataset != "cancer":
        base.update(epochs=1, max_batches=batches)
    out = {"old": [], "new": [], "new_standard": []}
    with tempfile.TemporaryDirectory(prefix="fedhet-old-") as tmp:
        src = old_tree(ref, Path(tmp))
        for _ in range(reps):
            out["old"].append(he_run(src, str(Path(tmp) / "pkg"), base))
            out["new"].append(he_run(harness.REPO, None, base))
            out["new_standard"].append(he_run(harness.REPO, None, dict(base, obfuscation="standard")))
    label = {"old": f"old: tree at {ref} (standard r^n, per-power matmul)",
             "new": "new: short exponent h^x + multi-exponentiation matmul (default)",
             "new_standard": "new, obfuscation=standard (matmul change only)"}
    rows = []
    for k, runs in out.items():
        rows.append({"dataset": dataset, "variant": label[k], "key": k,
                     "s_per_epoch": statistics.median(r["s_per_epoch"] for r in runs),
                     "samples_s_per_epoch": [r["s_per_epoch"] for r in runs],
                     "cpu_s_all_processes": statistics.median(r["cpu_s"] for r in runs)})
    old = rows[0]["s_per_epoch"]
    for r in rows:
        r["speedup_vs_old"] = old / r["s_per_epoch"]
    return rows


def markdown(doc: dict) -> str:
    m = doc["meta"]
    out = ["# Paillier speed: short exponent and CRT vs today's path", "",
           f"{m['machine']}; {m['when']}; command `{m['command']}`. 2048-bit key. The machine is shared "
           "(2 cores, other jobs running): old and new were interleaved, medians reported.", "",
           "## Encryption, ciphertexts per second per core", "",
           "Packed 64-bit slots, obfuscators computed inline in one process (CPU seconds of that process); "
           "decryptions checked equal (ours and phe's) before timing. First call (tables built) not counted.", "",
           "| who encrypts | variant | ciphertexts/s per core | x old |", "|---|---|---:|---:|"]
    for r in doc["encryption"]:
        sp = f"{r['speedup_vs_old']:.1f}" if "speedup_vs_old" in r else ""
        out.append(f"| {r['who']} | {r['variant']} | {r['ct_per_core_s']:.0f} | {sp} |")
    for ds in dict.fromkeys(r.get("dataset", "cancer") for r in doc.get("he_split", [])):
        how = (f"{doc['args']['epochs']} epochs" if ds == "cancer" else
               f"{doc['args'].get('batches', 5)} batches of one epoch, s/epoch extrapolated from s/batch")
        out += ["", f"## HE split network, {ds}, s/epoch ({how}, party processes, no test pass)", "",
                "| variant | s/epoch (median) | runs | CPU s all processes | x old |", "|---|---:|---|---:|---:|"]
        for r in doc["he_split"]:
            if r.get("dataset", "cancer") != ds:
                continue
            out.append(f"| {r['variant']} | {r['s_per_epoch']:.2f} | "
                       f"{', '.join(f'{v:.2f}' for v in r['samples_s_per_epoch'])} | {r['cpu_s_all_processes']:.1f} | "
                       f"{r['speedup_vs_old']:.1f} |")
    if doc.get("note"):
        out += ["", f"**Note:** {doc['note']}"]
    out += ["", "Goals: encryption >= 10x ciphertexts/s per core; HE split network >= 3x faster per epoch on cancer and on payment.",
            "", "The short form rests on the DJN short-exponent assumption (see `crypto/paillier_keys.py`).", ""]
    env = harness.environment_line(m.get("environment"))
    if env:
        out += [env]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(ap, quick_help="fewer repeats", render_only=True)
    ap.add_argument("--old-ref", default=OLD_REF, help="git ref of the old code path (default: before this change)")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--he-reps", type=int, default=3)
    ap.add_argument("--he-datasets", nargs="+", default=["cancer", "payment"], choices=["cancer", "payment"])
    ap.add_argument("--batches", type=int, default=5, help="payment: training batches timed per run")
    ap.add_argument("--no-he", action="store_true", help="encryption only")
    args = ap.parse_args(argv)
    out = harness.Output("paillier_speed", quick=args.quick, out_dir=args.out)
    if args.render_only:
        harness.render_only(out, markdown)
        return 0
    session = harness.Session("paillier_speed", __file__, argv)
    meta = session.header()
    reps = 3 if args.quick else 7
    doc = {"meta": meta, "args": {k: v for k, v in vars(args).items() if k != "out"},
           "encryption": encryption_rows(reps, 31 * (4 if args.quick else 16))}
    if not args.no_he:
        doc["he_split"] = [r for ds in args.he_datasets
                           for r in he_rows(args.old_ref, 1 if args.quick else args.he_reps, args.epochs, ds,
                                            2 if args.quick else args.batches)]
    return harness.publish(out, doc, markdown, session, into=meta)


if __name__ == "__main__":
    sys.exit(main())
