"""Homomorphic-encryption benchmark: packed Paillier vs plain phe, and CKKS vs Paillier, per value.

All Paillier rows use one 2048-bit key (quick mode only times fewer values).
The baseline is python-paillier one value at a time (``public_key.encrypt(float)``,
``private_key.decrypt``), measured in the same run; a phe ciphertext is counted
as its fixed-width 512 bytes (its exponent is not counted, which favours phe).

ratio_speed = values_per_s / baseline values_per_s;
ratio_bytes = baseline bytes_per_value / bytes_per_value (> 1: fewer bytes).

    python -m benchmarks.crypto_he [--quick]

writes benchmarks/results/crypto_he.json and .md (``crypto_he_quick.*`` with --quick; atomically)
and prints the table.
``rows(quick)`` is imported by ``benchmarks/crypto.py``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks import harness

from fedhet.crypto import ckks
from fedhet.crypto.paillier import (
    PackingSpec,
    PaillierContext,
    generate_keypair,
    packed_matmul,
)

KEY_BITS = 2048
FIELDS = ["primitive", "variant", "baseline", "n_values", "seconds", "values_per_s",
          "bytes_per_value", "ratio_speed", "ratio_bytes", "note"]


def _timed(fn, repeats: int):
    """(least wall seconds over ``repeats`` calls, the last call's result)."""
    t = harness.best_of(fn, repeats)
    return t.wall_s, t.result


def _row(primitive, variant, baseline, n_values, seconds, bytes_per_value, note="", base=None):
    vps = n_values / seconds if seconds > 0 else float("inf")
    r = {
        "primitive": primitive, "variant": variant, "baseline": baseline,
        "n_values": int(n_values), "seconds": round(seconds, 6), "values_per_s": vps,
        "bytes_per_value": float(bytes_per_value), "ratio_speed": None, "ratio_bytes": None, "note": note,
    }
    if base is not None:
        r["ratio_speed"] = vps / base["values_per_s"]
        r["ratio_bytes"] = base["bytes_per_value"] / float(bytes_per_value)
    return r


def rows(quick: bool = False) -> list[dict]:
    rng = np.random.default_rng(0)
    reps = 1 if quick else 2
    n_phe = 24 if quick else 120
    spec64 = PackingSpec(frac_bits=16, int_bits=8, slot_bits=64)
    spec128 = PackingSpec(frac_bits=24, int_bits=16, slot_bits=128)
    pk, sk = generate_keypair(KEY_BITS)
    slots64 = spec64.layout(KEY_BITS)[1]
    n_pack = slots64 * (8 if quick else 32)
    width = 2 * KEY_BITS // 8
    out = []

    # ---- baseline: phe, one value per ciphertext
    xs = rng.uniform(-100, 100, n_phe)
    t, encs = _timed(lambda: [pk.encrypt(float(v)) for v in xs], reps)
    phe_enc = _row("paillier", "phe-encrypt", None, n_phe, t, width,
                   "python-paillier public_key.encrypt(float), one value per ciphertext")
    t, _ = _timed(lambda: [sk.decrypt(e) for e in encs], reps)
    phe_dec = _row("paillier", "phe-decrypt", None, n_phe, t, width, "python-paillier private_key.decrypt")
    out += [phe_enc, phe_dec]

    # ---- packed Paillier, in-process
    x = rng.uniform(-200, 200, n_pack)
    pub = PaillierContext(pk, None, workers=1)
    own = PaillierContext(pk, sk, workers=1)  # key owner: CRT obfuscators, CRT decryption
    t, enc = _timed(lambda: pub.encrypt(x, spec64), reps)
    bpv = enc.nbytes / n_pack
    packed_enc = _row("paillier", "packed-encrypt", "phe-encrypt", n_pack, t, bpv,
                      f"{slots64} x 64-bit slots, 16 frac bits; obfuscators r^n computed inline", phe_enc)
    out.append(packed_enc)
    t, _ = _timed(lambda: own.encrypt(x, spec64), reps)
    out.append(_row("paillier", "packed-encrypt-crt", "phe-encrypt", n_pack, t, bpv,
                    "as packed-encrypt, key owner computes r^n mod p^2, q^2 (CRT)", phe_enc))
    n_ct = enc.n_ciphertexts
    t_fill, _ = _timed(lambda: own.prefill(n_ct), 1)
    t, _ = _timed(lambda: own.encrypt(x, spec64), 1)
    out.append(_row("paillier", "packed-encrypt-online", "phe-encrypt", n_pack, t, bpv,
                    f"obfuscators precomputed in a pool beforehand ({t_fill:.3f} s for {n_ct}, CRT, "
                    "not counted): online cost only", phe_enc))
    t, dec = _timed(lambda: own.decrypt(enc), reps)
    assert np.max(np.abs(dec - x)) <= 2.0 ** -17
    out.append(_row("paillier", "packed-decrypt", "phe-decrypt", n_pack, t, bpv,
                    "phe raw_decrypt (CRT) per ciphertext + slot unpacking", phe_dec))

    # ---- worker processes
    with PaillierContext(pk, sk, workers=2) as par:
        par.prefill(4)  # start the worker processes before timing
        par.pool.take(len(par.pool))
        t, enc2 = _timed(lambda: par.encrypt(x, spec64), reps)
        out.append(_row("paillier", "packed-encrypt-crt-2proc", "phe-encrypt", n_pack, t, bpv,
                        "CRT obfuscators computed by 2 worker processes", phe_enc))
        t, dec2 = _timed(lambda: par.decrypt(enc2), reps)
        assert np.array_equal(dec2, own.decrypt(enc2))
        out.append(_row("paillier", "packed-decrypt-2proc", "phe-decrypt", n_pack, t, bpv,
                        "decryption spread over 2 worker processes", phe_dec))

    # ---- wider slots (room for noise masking)
    slots128 = spec128.layout(KEY_BITS)[1]
    n128 = slots128 * (8 if quick else 32)
    x128 = rng.uniform(-1000, 1000, n128)
    t, enc128 = _timed(lambda: pub.encrypt(x128, spec128), reps)
    out.append(_row("paillier", "packed128-encrypt", "phe-encrypt", n128, t, enc128.nbytes / n128,
                    f"{slots128} x 128-bit slots, 24 frac bits, headroom {spec128.headroom_bits(KEY_BITS)} bits; "
                    "inline obfuscators", phe_enc))

    # ---- split-layer matmul Enc(A) @ W, outputs per second
    b, d, k = (slots64, 8, 4) if quick else (slots64, 12, 6)
    A = rng.uniform(-4, 4, (b, d))
    W = rng.normal(0, 1, (d, k))
    encA_phe = [[pk.encrypt(float(A[i, j])) for j in range(d)] for i in range(b)]

    def phe_matmul():
        res = []
        for i in range(b):
            row = []
            for kk in range(k):
                acc = encA_phe[i][0] * float(W[0, kk])
                for j in range(1, d):
                    acc = acc + encA_phe[i][j] * float(W[j, kk])
                row.append(acc)
            res.append(row)
        return res

    t, zp = _timed(phe_matmul, 1)
    phe_mm = _row("paillier", "phe-matmul", None, b * k, t, width,
                  f"Enc(A) @ W with EncryptedNumber * float, A {b}x{d}, W {d}x{k}; values = outputs")
    out.append(phe_mm)
    encAT = own.encrypt(A.T, spec64)
    t, Z = _timed(lambda: packed_matmul(encAT, W, w_frac_bits=16), reps)
    err = np.max(np.abs(own.decrypt(Z).T - A @ W))
    assert err < 1e-3, err
    out.append(_row("paillier", "packed-matmul", "phe-matmul", b * k, t, Z.nbytes / (b * k),
                    f"packed_matmul, signed weights (16 frac bits), max err {err:.1e}", phe_mm))

    # ---- CKKS (TenSEAL "fast": N=8192, 4096 slots, scale 2^40)
    ctx = ckks.make_context("fast", galois_keys=False)
    slots = ckks.slot_count(ctx)
    n_vec = 2 if quick else 8
    xc = rng.uniform(-200, 200, (n_vec, slots))
    t, vecs = _timed(lambda: [ckks.encrypt_vector(ctx, v) for v in xc], reps)
    cbytes = sum(len(ckks.vector_to_bytes(v)) for v in vecs) / xc.size
    out.append(_row("ckks", "ckks-fast-encrypt", "packed-encrypt", xc.size, t, cbytes,
                    f"TenSEAL N=8192, {slots} values per ciphertext, TenSEAL serialisation", packed_enc))
    t, dc = _timed(lambda: [ckks.decrypt_vector(v) for v in vecs], reps)
    assert max(np.max(np.abs(a - v)) for a, v in zip(dc, xc)) <= ckks.ABS_TOL_FRESH
    packed_dec = next(r for r in out if r["variant"] == "packed-decrypt")
    out.append(_row("ckks", "ckks-fast-decrypt", "packed-decrypt", xc.size, t, cbytes,
                    "TenSEAL decrypt + decode", packed_dec))
    cols = ckks.encrypt_columns(ctx, A)
    t, zc = _timed(lambda: ckks.columns_matmul(cols, W), reps)
    zbytes = sum(len(ckks.vector_to_bytes(v)) for v in zc) / (b * k)
    packed_mm = next(r for r in out if r["variant"] == "packed-matmul")
    out.append(_row("ckks", "ckks-fast-matmul", "packed-matmul", b * k, t, zbytes,
                    f"columns_matmul (batch {b} of 4096 slots used, so bytes/value is high)", packed_mm))
    pub.close()
    own.close()
    return out


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def to_markdown(rs: list[dict], meta: dict) -> str:
    lines = [
        "# Homomorphic encryption: packed Paillier vs phe, CKKS vs Paillier",
        "",
        f"Key length {meta['key_bits']} bits; quick={meta['quick']}; {meta['machine']}.",
        "ratio_speed = values/s over the baseline's; ratio_bytes = baseline bytes/value over this row's.",
        "",
        "| " + " | ".join(FIELDS) + " |",
        "|" + "---|" * len(FIELDS),
    ]
    for r in rs:
        lines.append("| " + " | ".join(_fmt(r[f]) for f in FIELDS) + " |")
    env = harness.environment_line(meta.get("environment"))
    if env:
        lines += ["", env]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(ap, quick_help="fewer values (same 2048-bit key)")
    args = ap.parse_args(argv)
    session = harness.Session("crypto_he", __file__, argv)
    rs = rows(args.quick)
    env = session.finish()
    meta = {
        "key_bits": KEY_BITS, "quick": args.quick,
        "machine": f"{env['machine']} {env['cpu_count_os']} CPUs, Python {env['python']}",
        "time": env["started"].replace(" ", "T"), "command": session.command, "environment": env,
    }
    md = to_markdown(rs, meta)
    harness.Output("crypto_he", quick=args.quick, out_dir=args.out).write({"meta": meta, "rows": rs}, md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
