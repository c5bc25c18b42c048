"""Crypto primitives of fedhet against plain baselines, measured side by side in one run.

Rows (each with element count, best-of-repeats seconds, rate and the ratio to
its baseline row, measured in the same run, variants interleaved):

* Shamir 3-of-5 sharing of a uint64 field array: fedhet (Newton differences,
  AES-CTR randomness, p = 2**61 - 1) vs plain numpy (``default_rng`` coefficients,
  Horner with ``%``, only possible with a smaller prime, p = 2**31 - 1, so the
  products fit in uint64) and vs Python ints (p = 2**61 - 1, ``secrets``); plus
  the memory floor (just writing the 5 output rows) and reconstruction; the
  implementation before issue 15 (``_reference_share``, ``_reference_reconstruct``)
  timed in the same run, and every rate's ratio to a plain numpy copy of the
  secret (``x_copy``: the practical limit), best and median of the repeats.
* PRG output: fedhet PRG (uint64, uint32, mod p) vs raw AES-256-CTR
  (``cryptography`` encryptor on zeros, into a reused buffer and allocating)
  vs numpy ``default_rng`` (not cryptographic).
* Field multiply and exact matmul vs Python ints / float64 BLAS; fixed-point encode.
* Keys: X25519 + HKDF, Ed25519 sign / verify, AEAD seal (AES-256-GCM) vs XChaCha20-Poly1305 (PyNaCl).
* HE rows from ``benchmarks/crypto_he.py`` (``rows(quick) -> list[dict]``) when it imports.

    python -m benchmarks.crypto            # full sizes
    python -m benchmarks.crypto --quick    # small sizes, a fast look

Writes benchmarks/results/crypto.json and crypto.md (``crypto_quick.*`` with
--quick), atomically.  Timings
on a shared machine are noisy: every variant is timed several times,
interleaved with its baseline, and the best time is kept.
"""
from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from benchmarks import harness
from fedhet.crypto import keys
from fedhet.crypto.field import F61, P61
from fedhet.crypto.fixedpoint import FixedPoint
from fedhet.crypto.prg import PRG
from fedhet.crypto.shamir import lagrange_coefficients, reconstruct, share

HERE = Path(__file__).resolve().parent
COLUMNS = ["group", "name", "elements", "seconds", "rate", "unit", "ratio", "baseline", "note"]


def best_times(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Best wall time of each variant over ``repeats`` rounds, the variants interleaved per round."""
    return {k: t.wall_s for k, t in harness.best_of_interleaved(variants, repeats).items()}


def make_rows(group: str, spec: list[tuple], times: dict[str, float], baseline: str | None) -> list[dict]:
    """spec: (name, elements, unit, scale, note); rate = elements * scale / seconds."""
    rows = []
    rates = {name: elements * scale / times[name] for name, elements, _unit, scale, _note in spec}
    for name, elements, unit, scale, note in spec:
        rows.append({
            "group": group, "name": name, "elements": int(elements), "seconds": times[name],
            "rate": rates[name], "unit": unit,
            "ratio": (rates[name] / rates[baseline]) if baseline else None,
            "baseline": baseline, "note": note,
        })
    return rows


# -- Shamir ----------------------------------------------------------------------
P31 = (1 << 31) - 1


def numpy_share(secret: np.ndarray, n: int, t: int, rng: np.random.Generator, p: int) -> np.ndarray:
    """The plain way: random coefficients from default_rng, Horner's rule with % p."""
    coeffs = rng.integers(0, p, size=(t - 1, secret.size), dtype=np.uint64)
    pu = np.uint64(p)
    out = np.empty((n, secret.size), dtype=np.uint64)
    for i in range(n):
        x = np.uint64(i + 1)
        acc = coeffs[-1].copy()
        for c in coeffs[-2::-1]:
            acc = (acc * x + c) % pu
        out[i] = (acc * x + secret) % pu
    return out


def python_share(secret: list[int], n: int, t: int, p: int) -> list[list[int]]:
    """Python ints, one polynomial per element, coefficients from ``secrets``."""
    out = [[0] * len(secret) for _ in range(n)]
    for j, s in enumerate(secret):
        coeffs = [secrets.randbelow(p) for _ in range(t - 1)]
        for i in range(n):
            x, acc = i + 1, 0
            for c in reversed(coeffs):
                acc = (acc + c) * x % p
            out[i][j] = (acc + s) % p
    return out


def _reference_share(secret: np.ndarray, n: int, t: int, prg: PRG, out: np.ndarray) -> np.ndarray:
    """fedhet's share() before issue 15 (commit 82baf56), kept to time it side by side: p = 2**61 - 1.

    The same Newton differences, but the secret is range-checked in a
    separate pass over memory first.
    """
    F61.asarray(secret, "secret")
    s = secret.reshape(-1)
    N = s.size
    P = np.uint64(P61)
    chunk = min(1 << 15, N)
    rbuf = np.empty((t - 1) * chunk, dtype=np.uint64)
    tmp_buf = np.empty(chunk, dtype=np.uint64)
    for lo in range(0, N, chunk):
        hi = min(N, lo + chunk)
        c = hi - lo
        rand = rbuf[: (t - 1) * c].reshape(t - 1, c)
        prg.fill_mod(rand, P61)
        tmp = tmp_buf[:c]
        D = [s[lo:hi], *rand]
        for x in range(n):
            row = out[x, lo:hi]
            np.add(D[0], D[1], out=row)
            np.subtract(row, P, out=tmp)
            np.minimum(row, tmp, out=row)
            D[0] = row
            if x + 1 < n:
                for k in range(1, t - 1):
                    d = D[k]
                    np.add(d, D[k + 1], out=d)
                    np.subtract(d, P, out=tmp)
                    np.minimum(d, tmp, out=d)
    return out


def _reference_reconstruct(shares: np.ndarray, xs: list[int]) -> np.ndarray:
    """fedhet's reconstruct() before issue 15 (commit 82baf56): a full 61-bit product per share, allocating."""
    F61.asarray(shares, "shares")
    lam = [np.uint64(v) for v in lagrange_coefficients(xs)]
    flat = np.ascontiguousarray(shares).reshape(len(xs), -1)
    N = flat.shape[1]
    out = np.empty(N, dtype=np.uint64)
    step = 1 << 16
    for lo in range(0, N, step):
        acc = F61.mul(flat[0, lo:lo + step], lam[0])
        for i in range(1, len(xs)):
            F61.add(acc, F61.mul(flat[i, lo:lo + step], lam[i]), out=acc)
        out[lo:lo + step] = acc
    return out


def bench_shamir(quick: bool, repeats: int) -> list[dict]:
    n, t = 5, 3
    N = 1 << (20 if quick else 23)
    Npy = 5_000 if quick else 20_000
    secret = F61.random(N, PRG(bytes(32)))
    secret31 = secret % np.uint64(P31)
    prg = PRG(bytes(range(32)))
    rng = np.random.default_rng(0)
    prealloc = np.empty((n, N), dtype=np.uint64)
    prealloc.fill(0)  # fault the pages in once
    ref_buf = np.empty((n, N), dtype=np.uint64)
    ref_buf.fill(0)
    floor_buf = np.empty((n, N), dtype=np.uint64)
    floor_buf.fill(0)
    copy_buf = np.empty(N, dtype=np.uint64)
    copy_buf.fill(0)
    py_secret = [int(v) for v in secret[:Npy]]

    # Correctness on the very data that is timed, old and new paths alike.
    sh = share(secret, n, t, prg)
    assert np.array_equal(reconstruct(sh[[0, 2, 4]], [1, 3, 5]), secret)
    assert np.array_equal(_reference_reconstruct(sh[[0, 2, 4]], [1, 3, 5]), secret)
    assert np.array_equal(reconstruct(_reference_share(secret, n, t, prg, ref_buf)[[1, 2, 3]], [2, 3, 4]), secret)
    ref = numpy_share(secret31, n, t, rng, P31)
    lam31 = [3, P31 - 3, 1]  # Lagrange at 0 for points 1, 2, 3
    assert np.array_equal(sum(int(l) * ref[i].astype(object) for i, l in enumerate(lam31)) % P31,
                          secret31.astype(object))
    del ref
    sub = np.ascontiguousarray(sh[[0, 2, 4]])
    del sh

    base = "numpy Horner % p (p=2^31-1)"
    copy = "numpy copy of the secret (memory limit)"
    variants = {
        "fedhet share (alloc output)": lambda: share(secret, n, t, prg),
        "fedhet share (into out=)": lambda: share(secret, n, t, prg, out=prealloc),
        "previous share (into out=)": lambda: _reference_share(secret, n, t, prg, ref_buf),
        "fedhet reconstruct 3 of 5": lambda: reconstruct(sub, [1, 3, 5]),
        "previous reconstruct 3 of 5": lambda: _reference_reconstruct(sub, [1, 3, 5]),
        copy: lambda: np.copyto(copy_buf, secret),
        "memory floor: write 5 rows": lambda: floor_buf.fill(1),
    }
    timed = harness.best_of_interleaved(variants, repeats)
    times = {k: v.wall_s for k, v in timed.items()}
    medians = {k: statistics.median(v.walls) for k, v in timed.items()}
    times.update(best_times({base: lambda: numpy_share(secret31, n, t, rng, P31)}, max(1, repeats // 2)))
    times["Python ints (p=2^61-1)"] = best_times({"x": lambda: python_share(py_secret, n, t, P61)},
                                                 max(1, repeats // 2))["x"]
    spec = [
        ("fedhet share (alloc output)", N, "M elem/s", 1e-6, "t=3, n=5, p=2^61-1; AES-CTR randomness"),
        ("fedhet share (into out=)", N, "M elem/s", 1e-6, "same, output buffer reused (no page faults)"),
        ("previous share (into out=)", N, "M elem/s", 1e-6, "share() before issue 15, same run"),
        ("fedhet reconstruct 3 of 5", N, "M elem/s", 1e-6, "Lagrange at 0: 31-bit limbs, one fold per 4 shares"),
        ("previous reconstruct 3 of 5", N, "M elem/s", 1e-6, "reconstruct() before issue 15: 61-bit products"),
        (base, N, "M elem/s", 1e-6, "plain numpy; smaller prime so products fit uint64"),
        ("Python ints (p=2^61-1)", Npy, "M elem/s", 1e-6, "secrets.randbelow + Horner"),
        (copy, N, "M elem/s", 1e-6, "np.copyto of the (N,) secret: the practical limit"),
        ("memory floor: write 5 rows", N, "M elem/s", 1e-6, "ndarray.fill of the (5, N) output"),
    ]
    rows = make_rows("shamir 3-of-5", spec, times, base)
    copy_rate = next(r["rate"] for r in rows if r["name"] == copy)
    for r in rows:  # rate / rate of a plain copy of the same array: how far from the memory limit
        r["x_copy"] = r["rate"] / copy_rate
        if r["name"] in medians:
            r["median_rate"] = r["elements"] * 1e-6 / medians[r["name"]]
    return rows


# -- PRG -------------------------------------------------------------------------
def bench_prg(quick: bool, repeats: int) -> list[dict]:
    nbytes = (32 if quick else 256) << 20
    n64 = nbytes // 8
    seed = bytes(range(32))
    prg = PRG(seed)
    out = np.empty(n64, dtype=np.uint64)
    out.fill(0)
    zeros = bytes(nbytes)
    rng = np.random.default_rng(0)

    raw = bytearray(nbytes)
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()

    def raw_aes_alloc():
        Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor().update(zeros)

    variants = {
        "raw AES-256-CTR update_into": lambda: enc.update_into(zeros, raw),
        "raw AES-256-CTR update (alloc)": raw_aes_alloc,
        "fedhet PRG.fill_bytes (into buffer)": lambda: prg.fill_bytes(out),
        "fedhet PRG.uint64": lambda: prg.uint64(n64),
        "fedhet PRG.uint32": lambda: prg.uint32(2 * n64),
        "fedhet PRG.integers_mod(2^61-1)": lambda: prg.integers_mod(n64, P61),
        "fedhet PRG.fill_mod(2^61-1) (into buffer)": lambda: prg.fill_mod(out, P61),
        "numpy default_rng uint64 (not crypto)": lambda: rng.integers(0, 2**64, size=n64, dtype=np.uint64,
                                                                      endpoint=False),
    }
    times = best_times(variants, repeats)
    base = "raw AES-256-CTR update_into"
    notes = {base: "one call over a reused buffer: the ceiling",
             "raw AES-256-CTR update (alloc)": "encryptor.update(zeros) returning new bytes",
             "numpy default_rng uint64 (not crypto)": "PCG64, for scale only"}
    spec = [(name, nbytes, "MB/s", 1e-6 / 1, notes.get(name, "")) for name in variants]
    return make_rows("PRG output", spec, times, base)


# -- field, fixed point ------------------------------------------------------------
def bench_field(quick: bool, repeats: int) -> list[dict]:
    N = 1 << (20 if quick else 22)
    Npy = 50_000
    prg = PRG(bytes(32))
    a, b = F61.random(N, prg), F61.random(N, prg)
    pa, pb = [int(v) for v in a[:Npy]], [int(v) for v in b[:Npy]]
    times = best_times({
        "fedhet mul (61-bit)": lambda: F61.mul(a, b),
        "fedhet add": lambda: F61.add(a, b),
    }, repeats)
    times.update(best_times({"Python ints mul % p": lambda: [x * y % P61 for x, y in zip(pa, pb)]},
                            max(1, repeats // 2)))
    rows = make_rows("field GF(2^61-1)", [
        ("fedhet mul (61-bit)", N, "M elem/s", 1e-6, "32-bit limbs, Mersenne folding"),
        ("fedhet add", N, "M elem/s", 1e-6, ""),
        ("Python ints mul % p", Npy, "M elem/s", 1e-6, "list comprehension"),
    ], times, "Python ints mul % p")

    M, K, Nc = (1024, 256, 64) if quick else (4096, 512, 128)
    A, B = F61.random((M, K), prg), F61.random((K, Nc), prg)
    Af, Bf = np.random.default_rng(0).normal(size=(M, K)), np.random.default_rng(1).normal(size=(K, Nc))
    small = 16
    Ao, Bo = A[:small].astype(object), B.astype(object)
    times = best_times({
        "fedhet matmul (exact mod p)": lambda: F61.matmul(A, B),
        "float64 BLAS matmul (inexact)": lambda: Af @ Bf,
    }, repeats)
    times.update(best_times({"Python ints (object) matmul": lambda: (Ao @ Bo) % P61}, 1))
    madds = M * K * Nc
    rows += make_rows("field matmul", [
        ("fedhet matmul (exact mod p)", madds, "M mul-add/s", 1e-6, f"({M}x{K}) @ ({K}x{Nc}), 16-bit limbs via BLAS"),
        ("float64 BLAS matmul (inexact)", madds, "M mul-add/s", 1e-6, "plaintext float, same shape"),
        ("Python ints (object) matmul", small * K * Nc, "M mul-add/s", 1e-6, f"first {small} rows"),
    ], times, "float64 BLAS matmul (inexact)")

    x = np.random.default_rng(0).normal(size=N)
    codec = FixedPoint(frac_bits=16)
    enc = codec.encode(x)
    times = best_times({
        "fedhet FixedPoint.encode": lambda: codec.encode(x),
        "fedhet FixedPoint.decode": lambda: codec.decode(enc),
        "plain rint(x*2^f).astype(int64)": lambda: np.rint(x * 65536.0).astype(np.int64),
    }, repeats)
    rows += make_rows("fixed point", [
        ("fedhet FixedPoint.encode", N, "M elem/s", 1e-6, "range check + mod p"),
        ("fedhet FixedPoint.decode", N, "M elem/s", 1e-6, ""),
        ("plain rint(x*2^f).astype(int64)", N, "M elem/s", 1e-6, "no range check, no modulus"),
    ], times, "plain rint(x*2^f).astype(int64)")
    return rows


# -- keys ------------------------------------------------------------------------
def bench_keys(quick: bool, repeats: int) -> list[dict]:
    from nacl import bindings as nb

    ops = 200 if quick else 1000
    a, b = keys.generate_x25519(), keys.generate_x25519()
    bpub = b.public_key()
    sk = keys.generate_ed25519()
    pk = sk.public_key()
    msg = os.urandom(64)
    sig = keys.sign(sk, msg)
    times = best_times({
        "X25519 + HKDF (agree)": lambda: [keys.agree(a, bpub, b"bench") for _ in range(ops)],
        "Ed25519 sign (64 B)": lambda: [keys.sign(sk, msg) for _ in range(ops)],
        "Ed25519 verify (64 B)": lambda: [keys.verify(pk, msg, sig) for _ in range(ops)],
    }, repeats)
    rows = make_rows("keys", [
        ("X25519 + HKDF (agree)", ops, "k op/s", 1e-3, ""),
        ("Ed25519 sign (64 B)", ops, "k op/s", 1e-3, ""),
        ("Ed25519 verify (64 B)", ops, "k op/s", 1e-3, ""),
    ], times, None)

    size = (4 if quick else 32) << 20
    data = os.urandom(size)
    key = keys.new_aead_key()
    aad = b"a->b/share/1"
    sealed = keys.seal(key, data, aad)
    nonce = os.urandom(24)
    times = best_times({
        "fedhet seal (AES-256-GCM)": lambda: keys.seal(key, data, aad),
        "fedhet open_sealed": lambda: keys.open_sealed(key, sealed, aad),
        "XChaCha20-Poly1305 (PyNaCl)": lambda: nb.crypto_aead_xchacha20poly1305_ietf_encrypt(data, aad, nonce, key),
    }, repeats)
    rows += make_rows("AEAD", [
        ("fedhet seal (AES-256-GCM)", size, "MB/s", 1e-6, "random 96-bit nonce"),
        ("fedhet open_sealed", size, "MB/s", 1e-6, ""),
        ("XChaCha20-Poly1305 (PyNaCl)", size, "MB/s", 1e-6, "alternative AEAD"),
    ], times, "XChaCha20-Poly1305 (PyNaCl)")
    return rows


# -- HE rows from the sibling benchmark ---------------------------------------------
def he_rows(quick: bool) -> tuple[list[dict], str | None]:
    try:
        from benchmarks import crypto_he  # noqa: PLC0415  (optional sibling module)
    except Exception as exc:  # noqa: BLE001 - any import failure just skips the HE rows
        return [], f"HE rows skipped: benchmarks/crypto_he.py did not import ({type(exc).__name__}: {exc})"
    try:
        rows = list(crypto_he.rows(quick))
    except Exception as exc:  # noqa: BLE001
        return [], f"HE rows skipped: crypto_he.rows() failed ({type(exc).__name__}: {exc})"
    out = []
    for r in rows:
        r = dict(r)
        # crypto_he's field names -> this table's; anything else stays as an extra column.
        for theirs, ours in (("primitive", "group"), ("variant", "name"), ("n_values", "elements"),
                             ("ratio_speed", "ratio")):
            if theirs in r and ours not in r:
                r[ours] = r.pop(theirs)
        if "values_per_s" in r and "rate" not in r:
            r["rate"], r["unit"] = r.pop("values_per_s"), "values/s"
        r.setdefault("group", "HE")
        out.append(r)
    return out, None


# -- output ----------------------------------------------------------------------
def _fmt(v, key: str) -> str:
    if v is None or v == "":
        return ""
    if isinstance(v, float):
        if key == "ratio":
            return f"{v:.2f}x"
        if key == "seconds":
            return f"{v:.4f}"
        return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def columns_for(rows: list[dict]) -> list[str]:
    cols = list(COLUMNS)
    for r in rows:  # keep whatever extra keys the HE rows carry
        for k in r:
            if k not in cols:
                cols.append(k)
    return cols


def to_markdown(rows: list[dict], meta: dict, notes: list[str]) -> str:
    cols = columns_for(rows)
    lines = [
        "# fedhet crypto primitives vs plain baselines",
        "",
        f"{'QUICK run (small sizes). ' if meta['quick'] else ''}Machine: {meta['machine']}; "
        f"Python {meta['python']}, numpy {meta['numpy']}, cryptography {meta['cryptography']}. "
        f"Best of {meta['repeats']} interleaved runs. `ratio` = rate / rate of the `baseline` row of the same group.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c), c) for c in cols) + " |")
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    env = harness.environment_line(meta.get("environment"))
    if env:
        lines += ["", env]
    lines.append("")
    return "\n".join(lines)


def print_table(rows: list[dict], notes: list[str]) -> None:
    cols = columns_for(rows)
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(to_markdown(rows, META, notes))
        return
    table = Table(title="fedhet crypto primitives vs plain baselines")
    for c in cols:
        table.add_column(c, justify="right" if c in ("elements", "seconds", "rate", "ratio") else "left")
    for r in rows:
        table.add_row(*[_fmt(r.get(c), c) for c in cols])
    Console(width=max(200, Console().width)).print(table)
    for n in notes:
        print(n)


META: dict = {}
GROUPS = {"shamir": bench_shamir, "prg": bench_prg, "field": bench_field, "keys": bench_keys}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_common_args(ap, quick_help="small sizes and fewer repeats")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per variant (best is kept)")
    ap.add_argument("--no-he", action="store_true", help="skip the HE rows from crypto_he.py")
    ap.add_argument("--only", choices=sorted(GROUPS), nargs="*",
                    help="run these groups only (no HE rows); results go to crypto_<groups>.{json,md}")
    args = ap.parse_args(argv)
    repeats = args.repeats or (3 if args.quick else 5)
    if repeats < 1:
        ap.error("--repeats must be >= 1")

    session = harness.Session("crypto", __file__, argv)
    env = session.meta
    v = env["versions"]
    META.update({
        "quick": args.quick, "repeats": repeats, "machine": f"{env['machine']}, {env['cpu_count_os']} CPUs",
        "python": env["python"], "numpy": np.__version__, "cryptography": v["cryptography"],
        "time": session.started, "command": session.command,
    })
    rows: list[dict] = []
    notes: list[str] = []
    for name, fn in GROUPS.items():
        if not args.only or name in args.only:
            rows += fn(args.quick, repeats)
    if not args.no_he and not args.only:
        extra, note = he_rows(args.quick)
        rows += extra
        if note:
            notes.append(note)
    print_table(rows, notes)
    META["environment"] = session.finish()
    out = harness.Output("_".join(["crypto", *sorted(args.only or [])]), quick=args.quick, out_dir=args.out)
    out.write({"meta": META, "rows": rows, "notes": notes}, to_markdown(rows, META, notes))
    print(f"wrote {out.path('json')} and {out.path('md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
