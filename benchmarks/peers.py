"""fedhet against the libraries users would pick instead: same script, same machine, values checked equal first.

Four comparisons (issue 15), each peer optional: a peer that does not import gives a row
"not installed (pip install X)" and everything else runs; fedhet's rows always run.  No peer
is a dependency of fedhet.  Peer versions are recorded in the results.

1. **Paillier, per ciphertext** (2048-bit keys, each library its own key): encryption and
   decryption of one integer per ciphertext, ciphertexts per second *per core* (process CPU
   seconds, which count every thread a library starts).  The values are signed integers with
   |x| < 2**52 (fedhet's API takes float64 arrays, exact below 2**53; the other libraries take
   the same Python ints).  fedhet: ``PaillierContext.encrypt`` with one value per ciphertext,
   ``obfuscation="short_exponent"`` and ``"standard"``, with the public key only and as the key
   owner (CRT); also its packed form (64-bit slots, values per second).  Peers: ``phe``
   (``encrypt``), FATE 2.x ``fate_utils.paillier`` (``encrypt_encoded`` of an i64 vector), SecretFlow
   HEU (``heu.numpy``, ZPaillier, bigint encoder) and ``pypaillier`` (``encrypt_integers``).
   Every library's decryptions are checked equal to the integers before timing.
2. **Packed interactive layer**: Enc(A) for A 128x16, times a plaintext W 16x16, decrypted: end
   to end (encrypt + matmul + decrypt), CPU seconds of this process.  fedhet:
   ``PaillierContext.encrypt`` (A transposed, packed along the batch, 64-bit slots),
   ``.matmul``, ``.decrypt``, as the key owner (the HE split layer's guest) and with the public
   key only; ``short_exponent``.  Peers, each its natural way: phe ``EncryptedNumber * float``
   and ``+`` per output; fate_utils ``CiphertextVector.matmul`` on f64-encoded vectors; HEU
   ``Evaluator.matmul`` on fixed-point integers (16 + 16 fraction bits); pypaillier
   ``multiply_integers_public`` on every (a_ij, w_jk) pair then ``add_blocks`` per output.  Every
   variant is checked against the float product ``A @ W`` (max error < 1e-3) on 8 rows of A
   before timing, and every timed result is checked too.  phe and fate_utils, ~100x slower,
   are timed once; the others ``3`` times (quick: A is 16x16, 2 times).
3. **Secure aggregation**, K = 10 clients, m = 10**6 (``--quick``: 10**5), one round, every
   party in this process: fedhet through ``benchmarks/secagg.py``'s ``bench_inmemory`` (the
   registered job ``secagg_bench`` as threads on the in-memory transport; plain, secure on the
   complete graph, SecAgg+ on the Harary graph), Flower through its own SecAgg+ code: the
   server's ``SecAggPlusWorkflow`` stages and each client's ``secaggplus_mod``, exchanging
   Flower ``Message`` objects through an in-process ``Grid`` (no network), with fedhet's
   clip (4), max weight (100) and thresholds (complete graph: t = floor(K/2) + 1; the k-regular
   graph: ``num_shares = k + 1`` with fedhet's Harary k and t_local).  Flower's defaults
   otherwise (2**22 quantisation levels, 2**32 ring, SECP384R1 keys, Fernet, pycryptodome
   Shamir).  Every Flower message's content goes through protobuf on its way, as over a
   network (fedhet's in-memory transport runs its codec too).  Reported: total CPU seconds per
   round (all clients + server), bytes per client (fedhet: its encoded frames; Flower: the
   serialised contents of the messages it sent and received), and the aggregate's
   max error against the exact weighted mean, which must be within each protocol's
   quantisation bound.  One warm-up round, then medians over the timed rounds, fedhet and
   Flower interleaved over ``--passes``.
4. **Shamir 3-of-5** over large arrays: fedhet ``crypto.shamir.share`` / ``reconstruct``
   (uint64 arrays, p = 2**61 - 1) vs MPyC ``thresha.random_split`` / ``recombine`` (lists of
   ints) and ``np_random_split`` / ``np_recombine`` (object arrays) over GF(2**61 - 1), elements
   per second per core; reconstruction from 3 of the 5 shares checked equal to the secret first.
5. **PSI**, n x n IDs, half common, two processes: fedhet's RR22 and KKRT backends (the ``psi`` job
   as audited party processes, ``benchmarks/psi_rr22.py``) against SecretFlow SPU's RR22 and KKRT
   (``spu.psi.psi_execute`` over its brpc link, ``benchmarks/spu_psi.py``).  spu pins numpy < 2, so it
   runs under its own interpreter (``--spu-python`` or ``$FEDHET_SPU_PYTHON``); without one the SPU
   rows say so.  Every intersection is checked.  ``--only psi`` alone writes ``peers_psi.*``.

Peers that start thread pools are held to one thread (``RAYON_NUM_THREADS=1``,
``OMP_NUM_THREADS=1`` unless set) so a per-core rate is what it says.  Variants are interleaved
per repeat and medians reported; the machine is shared, so the load average is recorded.

    python -m benchmarks.peers [--quick] [--only paillier layer secagg shamir psi] [--spu-python PY] [--render-only]

Writes benchmarks/results/peers.{json,md} (``peers_quick.*`` with --quick).
"""
from __future__ import annotations

import os

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from importlib import metadata  # noqa: E402
from typing import Any, Callable  # noqa: E402

import numpy as np  # noqa: E402

from benchmarks import harness  # noqa: E402
from fedhet.crypto.field import P61  # noqa: E402
from fedhet.crypto.paillier import PackingSpec, PaillierContext, generate_keypair  # noqa: E402
from fedhet.crypto.shamir import reconstruct, share  # noqa: E402

KEY_BITS = 2048
SECTIONS = ("paillier", "layer", "secagg", "shamir", "psi")
# import name -> (distribution, pip install name)
PEERS = {
    "phe": ("phe", "phe"),
    "fate_utils": ("fate_utils", "fate_utils"),
    "heu": ("sf-heu", "sf-heu"),
    "paillier": ("pypaillier", "pypaillier"),
    "flwr": ("flwr", "flwr"),
    "mpyc": ("mpyc", "mpyc"),
}
PEER_LABEL = {"phe": "phe", "fate_utils": "fate_utils (FATE 2.x)", "heu": "HEU (SecretFlow)",
              "paillier": "pypaillier", "flwr": "Flower SecAgg+", "mpyc": "MPyC"}
INT_BOUND = 1 << 52
INT_SPEC = PackingSpec(frac_bits=0, int_bits=52, slot_bits=None)  # one exact integer per ciphertext
PACKED_SPEC = PackingSpec(16, 8, 64)
LAYER_TOL = 1e-3
FRAC = 16  # fixed-point fraction bits of the integer peers' layer (A and W each)


# ------------------------------------------------------------------------------ peers

def peer(module: str):
    """The peer's module, or None when it does not import."""
    saved, sys.argv = sys.argv, sys.argv[:1]  # MPyC parses the command line when first imported
    try:
        return importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any import failure means "not measured"
        return None
    finally:
        sys.argv = saved


def peer_versions() -> dict[str, dict]:
    out = {}
    for mod, (dist, pip) in PEERS.items():
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            version = None
        ok = peer(mod if mod != "flwr" else "flwr.common.secure_aggregation") is not None
        out[PEER_LABEL[mod]] = {"distribution": dist, "version": version, "importable": ok,
                                "note": None if ok else (f"not installed (pip install {pip})" if version is None
                                                         else "installed but does not import")}
    try:
        out["Flower SecAgg+"]["pycryptodome"] = metadata.version("pycryptodome")
    except metadata.PackageNotFoundError:
        pass
    return out


def missing(mod: str) -> str:
    return f"not installed (pip install {PEERS[mod][1]})"


def cpu_once(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(process CPU seconds, wall seconds, result) of one call."""
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c0, time.perf_counter() - t0, out


def interleaved(variants: dict[str, Callable[[], Any]], reps: int) -> dict[str, dict]:
    """Each variant once per round, ``reps`` rounds: median CPU and wall seconds."""
    cpu = {k: [] for k in variants}
    wall = {k: [] for k in variants}
    for _ in range(reps):
        for k, fn in variants.items():
            c, w, _ = cpu_once(fn)
            cpu[k].append(c)
            wall[k].append(w)
    return {k: {"cpu_s": statistics.median(cpu[k]), "wall_s": statistics.median(wall[k]),
                "samples_cpu_s": cpu[k]} for k in variants}


# --------------------------------------------------------------------- correctness checks

def check_ints(name: str, got, want) -> None:
    """Decrypted integers must equal the plaintexts exactly."""
    got = [int(v) for v in got]
    want = [int(v) for v in want]
    if got != want:
        bad = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b) if len(got) == len(want) else None
        raise AssertionError(f"{name}: decryption differs from the plaintext"
                             + (f" at index {bad}: {got[bad]} != {want[bad]}" if bad is not None
                                else f": {len(got)} values for {len(want)}"))


def check_close(name: str, got, want, tol: float) -> float:
    """A decrypted (or aggregated) float array must match the plain computation within ``tol``."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"{name}: shape {got.shape} differs from the plain result's {want.shape}")
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    if not np.isfinite(err) or err > tol:
        raise AssertionError(f"{name}: max error {err:.3g} against the plain computation exceeds {tol:.3g}")
    return err


def check_shamir(name: str, got, secret) -> None:
    if not np.array_equal(np.asarray(got, dtype=np.uint64).reshape(-1), np.asarray(secret, dtype=np.uint64).reshape(-1)):
        raise AssertionError(f"{name}: reconstruction differs from the secret")


# --------------------------------------------------------------- 1. Paillier per ciphertext

def fedhet_int_encryptors(pk, sk) -> dict[str, Callable]:
    ctxs = {
        "short exponent h^x, public key": PaillierContext(pk, None, obfuscation="short_exponent"),
        "standard r^n, public key": PaillierContext(pk, None, obfuscation="standard"),
        "short exponent h^x, key owner (CRT)": PaillierContext(pk, sk, obfuscation="short_exponent"),
        "standard r^n, key owner (CRT)": PaillierContext(pk, sk, obfuscation="standard"),
    }
    return ctxs


def paillier_rows(n_fast: int, n_slow: int, reps: int) -> tuple[list[dict], dict]:
    rng = np.random.default_rng(1)
    vals = [int(v) for v in rng.integers(-INT_BOUND + 1, INT_BOUND, n_fast)]
    slow = vals[:n_slow]
    rows, keygen = [], {}
    enc, dec, count, labels = {}, {}, {}, {}

    c, _, (pk, sk) = cpu_once(lambda: generate_keypair(KEY_BITS))
    keygen["fedhet / phe (shared key)"] = c
    owner = PaillierContext(pk, sk)
    ctxs = fedhet_int_encryptors(pk, sk)
    xf = np.asarray(vals, dtype=np.float64)
    for name, ctx in ctxs.items():
        e = ctx.encrypt(xf, INT_SPEC)  # builds the fixed-base tables (first call, not timed)
        check_ints(f"fedhet {name}", owner.decrypt(e), vals)
        key = ("fedhet", name)
        enc[key] = (lambda ctx=ctx: ctx.encrypt(xf, INT_SPEC))
        count[key] = len(vals)
    e_int = ctxs["short exponent h^x, public key"].encrypt(xf, INT_SPEC)
    dec[("fedhet", "CRT decrypt")] = (lambda: owner.decrypt(e_int), len(vals))
    xp = rng.uniform(-200, 200, 31 * 8)
    for name in ("short exponent h^x, public key", "short exponent h^x, key owner (CRT)"):
        ctx = ctxs[name]
        e = ctx.encrypt(xp, PACKED_SPEC)
        check_close(f"fedhet packed {name}", owner.decrypt(e), xp, 2.0 ** -(PACKED_SPEC.frac_bits + 1) + 1e-12)
        key = ("fedhet", f"{name}, packed 64-bit slots")
        enc[key] = (lambda ctx=ctx: ctx.encrypt(xp, PACKED_SPEC))
        count[key] = e.n_ciphertexts
        labels[key] = {"values_per_ciphertext": xp.size / e.n_ciphertexts}

    missing_rows = []
    phe = peer("phe")
    if phe is not None:  # phe is fedhet's key type: the same key
        check_ints("phe", [sk.decrypt(pk.encrypt(v)) for v in slow], slow)
        enc[("phe", "encrypt(int)")] = lambda: [pk.encrypt(v) for v in slow]
        count[("phe", "encrypt(int)")] = len(slow)
        cts_phe = [pk.encrypt(v) for v in slow]
        dec[("phe", "decrypt")] = (lambda: [sk.decrypt(c) for c in cts_phe], len(slow))
    else:
        missing_rows.append(("phe", missing("phe")))

    fp = peer("fate_utils.paillier")
    if fp is not None:
        c, _, (fsk, fpk, coder) = cpu_once(lambda: fp.keygen(KEY_BITS))
        keygen["fate_utils"] = c
        v64 = np.asarray(vals, dtype=np.int64)
        check_ints("fate_utils", coder.decode_i64_vec(fsk.decrypt_to_encoded(fpk.encrypt_encoded(coder.encode_i64_vec(v64), True))), vals)
        enc[("fate_utils", "encrypt_encoded(i64 vector)")] = lambda: fpk.encrypt_encoded(coder.encode_i64_vec(v64), True)
        count[("fate_utils", "encrypt_encoded(i64 vector)")] = len(vals)
        ct_f = fpk.encrypt_encoded(coder.encode_i64_vec(v64), True)
        dec[("fate_utils", "decrypt_to_encoded")] = (lambda: coder.decode_i64_vec(fsk.decrypt_to_encoded(ct_f)), len(vals))
    else:
        missing_rows.append(("fate_utils", missing("fate_utils")))

    heu = peer("heu")
    if heu is not None:
        from heu import numpy as hnp
        from heu import phe as hphe
        c, _, kit = cpu_once(lambda: hnp.setup(hphe.SchemaType.ZPaillier, KEY_BITS))
        keygen["HEU ZPaillier"] = c
        henc, hdec = kit.encryptor(), kit.decryptor()
        pa = kit.array(np.asarray(vals, dtype=object), hphe.BigintEncoderParams())
        check_ints("HEU", hdec.decrypt(henc.encrypt(pa)).to_numpy().tolist(), vals)
        enc[("heu", "ZPaillier encrypt(array)")] = lambda: henc.encrypt(pa)
        count[("heu", "ZPaillier encrypt(array)")] = len(vals)
        ct_h = henc.encrypt(pa)
        dec[("heu", "decrypt(array)")] = (lambda: hdec.decrypt(ct_h), len(vals))
    else:
        missing_rows.append(("heu", missing("heu")))

    pyp = peer("paillier")
    if pyp is not None:
        c, _, (ppub, psec) = cpu_once(lambda: pyp.generate_keypair(KEY_BITS))
        keygen["pypaillier"] = c
        check_ints("pypaillier", [m for m, _ in pyp.decrypt_exact_many(psec, pyp.encrypt_integers(ppub, vals))], vals)
        enc[("paillier", "encrypt_integers")] = lambda: pyp.encrypt_integers(ppub, vals)
        count[("paillier", "encrypt_integers")] = len(vals)
        ct_p = pyp.encrypt_integers(ppub, vals)
        dec[("paillier", "decrypt_exact_many")] = (lambda: pyp.decrypt_exact_many(psec, ct_p), len(vals))
    else:
        missing_rows.append(("paillier", missing("paillier")))

    times = interleaved({**{("enc",) + k: f for k, f in enc.items()},
                         **{("dec",) + k: f for k, (f, _) in dec.items()}}, reps)
    for k in enc:
        t = times[("enc",) + k]
        rows.append({"op": "encrypt", "library": PEER_LABEL.get(k[0], k[0]), "variant": k[1],
                     "ciphertexts": count[k], "cpu_s": t["cpu_s"], "wall_s": t["wall_s"],
                     "ct_per_core_s": count[k] / t["cpu_s"], **labels.get(k, {})})
    for k, (_, n) in dec.items():
        t = times[("dec",) + k]
        rows.append({"op": "decrypt", "library": PEER_LABEL.get(k[0], k[0]), "variant": k[1],
                     "ciphertexts": n, "cpu_s": t["cpu_s"], "wall_s": t["wall_s"], "ct_per_core_s": n / t["cpu_s"]})
    ref_enc = next(r for r in rows if r["variant"] == "short exponent h^x, public key")
    ref_dec = next(r for r in rows if r["op"] == "decrypt" and r["library"] == "fedhet")
    for r in rows:
        ref = ref_enc if r["op"] == "encrypt" else ref_dec
        r["rate_vs_fedhet"] = r["ct_per_core_s"] / ref["ct_per_core_s"]
    for mod, note in missing_rows:
        rows.append({"op": "encrypt", "library": PEER_LABEL[mod], "variant": None, "note": note})
    for ctx in list(ctxs.values()) + [owner]:
        ctx.close()
    return rows, keygen


# ------------------------------------------------------------------- 2. the packed layer

def fixed(x, bits: int = FRAC) -> list[int]:
    return [int(v) for v in np.rint(np.asarray(x, dtype=np.float64) * (1 << bits)).astype(np.int64).ravel()]


def layer_data(b: int, d: int, k: int):
    rng = np.random.default_rng(2)
    A = rng.uniform(-4, 4, (b, d))
    W = rng.normal(0, 1, (d, k))
    W[np.abs(W) < 2.0 ** -FRAC] = 2.0 ** -FRAC  # pypaillier refuses a zero scalar
    return A, W


def layer_variants(W: np.ndarray) -> tuple[dict[str, Callable], list[tuple[str, str]], list]:
    """name -> a function of A computing Enc(A) @ W end to end and returning the decrypted float result;
    the peers that are not installed; the contexts to close."""
    d, k = W.shape
    closers = []
    pk, sk = generate_keypair(KEY_BITS)
    owner = PaillierContext(pk, sk, obfuscation="short_exponent")
    public = PaillierContext(pk, None, obfuscation="short_exponent")
    closers += [owner, public]
    out: dict[str, Callable] = {}

    def fedhet(enc_ctx):
        def run(A):
            Z = public.matmul(enc_ctx.encrypt(A.T, PACKED_SPEC), W)
            return owner.decrypt(Z).T
        return run

    out["fedhet|key owner encrypts (CRT), short exponent, 64-bit slots"] = fedhet(owner)
    out["fedhet|public-key encrypt, short exponent, 64-bit slots"] = fedhet(public)
    skipped = []

    if peer("phe") is not None:
        def phe_run(A):
            b = A.shape[0]
            ea = [[pk.encrypt(float(A[i, j])) for j in range(d)] for i in range(b)]
            res = np.empty((b, k))
            for i in range(b):
                for kk in range(k):
                    acc = ea[i][0] * float(W[0, kk])
                    for j in range(1, d):
                        acc = acc + ea[i][j] * float(W[j, kk])
                    res[i, kk] = sk.decrypt(acc)
            return res
        out["phe|EncryptedNumber * float, + (per output)"] = phe_run
    else:
        skipped.append(("phe", missing("phe")))

    fp = peer("fate_utils.paillier")
    if fp is not None:
        fsk, fpk, coder = fp.keygen(KEY_BITS)

        def fate_run(A):
            b = A.shape[0]
            ea = fpk.encrypt_encoded(coder.encode_f64_vec(A.ravel()), True)
            z = ea.matmul(fpk, coder.encode_f64_vec(W.ravel()), (b, d), (d, k))
            return np.asarray(coder.decode_f64_vec(fsk.decrypt_to_encoded(z))).reshape(b, k)
        out["fate_utils|CiphertextVector.matmul (f64 encoding)"] = fate_run
    else:
        skipped.append(("fate_utils", missing("fate_utils")))

    if peer("heu") is not None:
        from heu import numpy as hnp
        from heu import phe as hphe
        kit = hnp.setup(hphe.SchemaType.ZPaillier, KEY_BITS)
        henc, hdec, hev = kit.encryptor(), kit.decryptor(), kit.evaluator()
        Wi = np.asarray(fixed(W), dtype=object).reshape(d, k)

        def heu_run(A):
            b = A.shape[0]
            ea = henc.encrypt(kit.array(np.asarray(fixed(A), dtype=object).reshape(b, d), hphe.BigintEncoderParams()))
            z = hev.matmul(ea, kit.array(Wi, hphe.BigintEncoderParams()))
            return np.asarray(hdec.decrypt(z).to_numpy(), dtype=np.float64) / 2.0 ** (2 * FRAC)
        out["HEU (SecretFlow)|ZPaillier, Evaluator.matmul (fixed point)"] = heu_run
    else:
        skipped.append(("heu", missing("heu")))

    pyp = peer("paillier")
    if pyp is not None:
        ppub, psec = pyp.generate_keypair(KEY_BITS)
        Wq = fixed(W)
        plan = {}

        def pairing(b):
            """pair (i, kk, j) multiplies a_ij by w_jk; output (i, kk) sums its d pairs (built once per b)."""
            if b not in plan:
                plan[b] = ([[(i * k + kk) * d + j for j in range(d)] for i in range(b) for kk in range(k)],
                           [Wq[j * k + kk] for i in range(b) for kk in range(k) for j in range(d)])
            return plan[b]

        def pyp_run(A):
            b = A.shape[0]
            blocks, scal = pairing(b)
            ea = pyp.encrypt_integers(ppub, fixed(A))
            pairs = [ea[i * d + j] for i in range(b) for kk in range(k) for j in range(d)]
            prods = pyp.multiply_integers_public(ppub, pairs, scal)
            sums = pyp.add_blocks(ppub, prods, blocks)
            return np.array([m for m, _ in pyp.decrypt_exact_many(psec, sums)], dtype=np.float64).reshape(b, k) / 2.0 ** (2 * FRAC)
        out["pypaillier|multiply_integers_public + add_blocks"] = pyp_run
    else:
        skipped.append(("paillier", missing("paillier")))
    return out, skipped, closers


def layer_rows(b: int, d: int, k: int, reps: int, slow_reps: int, check_rows: int = 8) -> list[dict]:
    """Every variant checked on the first ``check_rows`` rows of A before timing, then timed on all of A;
    the timed runs' results are checked too (the max error reported is theirs)."""
    A, W = layer_data(b, d, k)
    plain = A @ W
    variants, skipped, closers = layer_variants(W)
    for name, fn in variants.items():
        check_close(name.replace("|", " "), fn(A[:check_rows]), plain[:check_rows], LAYER_TOL)
    errs: dict[str, float] = {}

    def checked(name):
        def run():
            errs[name] = max(errs.get(name, 0.0), check_close(name.replace("|", " "), variants[name](A), plain, LAYER_TOL))
        return run

    # phe and fate_utils encrypt ~100x slower per core than the others: fewer timed runs
    slow = {n for n in variants if n.startswith(("phe|", "fate_utils|"))}
    times = interleaved({n: checked(n) for n in variants if n not in slow}, reps)
    times.update(interleaved({n: checked(n) for n in slow}, slow_reps) if slow else {})
    rows = []
    for name in variants:
        lib, var = name.split("|", 1)
        rows.append({"library": lib, "variant": var, "shape": f"Enc(A {b}x{d}) @ W {d}x{k}",
                     "cpu_s": times[name]["cpu_s"], "wall_s": times[name]["wall_s"],
                     "samples_cpu_s": times[name]["samples_cpu_s"], "max_error": errs[name]})
    ref_owner = next(r for r in rows if r["library"] == "fedhet" and "key owner" in r["variant"])
    ref_pub = next(r for r in rows if r["library"] == "fedhet" and "public-key" in r["variant"])
    for r in rows:
        r["x_fedhet_owner"] = r["cpu_s"] / ref_owner["cpu_s"]
        r["x_fedhet_public"] = r["cpu_s"] / ref_pub["cpu_s"]
    for mod, note in skipped:
        rows.append({"library": PEER_LABEL[mod], "variant": None, "note": note})
    for c in closers:
        c.close()
    return rows


# ------------------------------------------------------------------ 3. secure aggregation

def flower_round_runner(xs: dict, ws: dict, clip: float, max_weight: float):
    """One SecAgg+ round run by Flower's own server workflow and client mod, in this process.

    Every message's content goes through protobuf on its way (as over the network; timed, as fedhet's
    codec is).  Returns ``run(num_shares, threshold) -> dict``: CPU and wall seconds of all parties,
    the aggregate, and the median over clients of the protobuf bytes each sent and received."""
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
    from flwr.compat.common import recorddict_compat as compat
    from flwr.server.client_manager import SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
    from flwr.serverapp.grid import Grid
    from flwr.supercore.task_identity import TaskIdentity

    logging.getLogger("flwr").setLevel(logging.ERROR)  # its per-stage INFO lines and FedAvg warnings
    # What a ServerApp process is given at start: messages it creates carry these ids.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 0, 0, 0

    names = list(xs)
    nid_of = {c: 1000 + i for i, c in enumerate(names)}
    data = {nid_of[c]: (xs[c], int(ws[c])) for c in names}

    class InProcessGrid(Grid):
        """Delivers each message to the addressed client's SecAgg+ mod at once (no network)."""

        def __init__(self):
            self.contexts = {}
            self.bytes = {}

        def set_run(self, run):  # pragma: no cover - not used by the workflow
            pass

        @property
        def run(self):  # pragma: no cover
            return None

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # pragma: no cover
            return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

        def get_node_ids(self):
            return list(data)

        def push_messages(self, messages):  # pragma: no cover
            raise NotImplementedError

        def pull_messages(self, message_ids):  # pragma: no cover
            raise NotImplementedError

        def send_and_receive(self, messages, *, timeout=None):
            replies = []
            for msg in messages:
                nid = msg.metadata.dst_node_id
                down, n_down = wire(msg)
                reply, n_up = wire(secaggplus_mod(down, self.contexts[nid], fit))
                self.bytes[nid] = self.bytes.get(nid, 0) + n_down + n_up
                replies.append(reply)
            return replies

    def wire(msg):
        """The message as the receiver gets it: its content through protobuf (the workflow shares one
        content object between the setup messages, and the mod consumes what it reads)."""
        data = recorddict_to_proto(msg.content).SerializeToString()
        return Message(content=recorddict_from_proto(ProtoRecordDict.FromString(data)), metadata=msg.metadata), len(data)

    def fit(msg, ctxt):
        x, w = data[msg.metadata.dst_node_id]
        res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([x]), w, {})
        return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=msg)

    def run(num_shares, threshold) -> dict:
        grid = InProcessGrid()
        grid.contexts = {nid: Context(run_id=0, node_id=nid, node_config={}, state=RecordDict(), run_config={})
                         for nid in data}
        k = len(data)
        ctx = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=k,
                                            min_available_clients=k),
                            client_manager=SimpleClientManager())
        for nid in data:
            ctx.client_manager.register(GridClientProxy(nid, grid, 0))
        ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
        # The global model sent with FitIns: one number (fedhet's bench sends no model either).
        ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
            ndarrays_to_parameters([np.zeros(1)]), keep_input=True)
        wf = SecAggPlusWorkflow(num_shares, threshold, max_weight=max_weight, clipping_range=clip)
        c0, t0 = time.process_time(), time.perf_counter()
        wf(grid, ctx)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        params = compat.arrayrecord_to_parameters(ctx.state.array_records[MAIN_PARAMS_RECORD], keep_input=True)
        agg = parameters_to_ndarrays(params)[0]
        return {"cpu_s": cpu, "wall_s": wall, "aggregate": agg,
                "bytes_per_client": statistics.median(grid.bytes.values())}

    return run


def flower_error_bound(ws: dict, clip: float, max_weight: float, target_range: int = 1 << 22) -> float:
    """Flower's quantisation error on the weighted mean: stochastic rounding (one step per client) and
    the weights rounded to ``round(w / max_weight * target_range)``."""
    q = [round(w / max_weight * target_range) for w in ws.values()]
    step = 2 * clip / target_range
    total = sum(q) / target_range
    return len(q) * step / total + 1.0 / min(q) + 1e-12


def secagg_rows(k: int, m: int, rounds: int, passes: int, seed: int = 0) -> tuple[list[dict], dict]:
    from benchmarks import secagg as fsecagg
    from fedhet.protocols.secagg_config import SecAggConfig

    cfg = SecAggConfig()
    t_complete, k_harary, t_local = cfg.t(k), cfg.k(k), cfg.t_local(k)
    xs, ws = fsecagg.make_inputs(k, m, seed)
    exact = fsecagg.exact_mean(xs, ws)
    setup = {"K": k, "m": m, "rounds": rounds, "passes": passes, "t_complete": t_complete,
             "harary_k": k_harary, "t_local": t_local, "clip": fsecagg.CLIP, "max_weight": fsecagg.MAX_WEIGHT}
    res: dict[str, dict] = {}
    fed = {"fedhet|plain (float32, no protection)": "plain", "fedhet|secure, complete graph": "secure",
           f"fedhet|SecAgg+, Harary k={k_harary}": "secure+"}
    for name in fed:
        res[name] = {"cpu": [], "wall": [], "bytes": None, "err": None, "bound": None}
    flwr_ok = peer("flwr.common.secure_aggregation") is not None and peer("flwr.server.workflow") is not None
    flower = {}
    if flwr_ok:
        run = flower_round_runner(xs, ws, fsecagg.CLIP, fsecagg.MAX_WEIGHT)
        flower = {"Flower SecAgg+|complete graph (num_shares = K)": (1.0, t_complete),
                  f"Flower SecAgg+|k = {k_harary} neighbours (num_shares = {k_harary + 1})": (k_harary + 1, t_local)}
        bound = flower_error_bound(ws, fsecagg.CLIP, fsecagg.MAX_WEIGHT)
        for name, (ns, th) in flower.items():  # warm-up, result checked
            out = run(ns, th)
            err = check_close(name.replace("|", " "), out["aggregate"], exact, bound)
            res[name] = {"cpu": [], "wall": [], "bytes": out["bytes_per_client"], "err": err, "bound": bound}
    for _ in range(passes):
        for name, method in fed.items():
            s = fsecagg.bench_inmemory(k, m, method, rounds, seed)
            check_close(name.replace("|", " "), [s["max_mean_error"]], [0.0], s["mean_error_bound"])
            rec = res[name]
            rec["cpu"].append(s["protocol_cpu_total_s"])
            rec["wall"].append(s["wall_s"])
            rec.update(bytes=s["bytes_per_client"], err=s["max_mean_error"], bound=s["mean_error_bound"])
        for name, (ns, th) in flower.items():
            for _ in range(rounds):
                out = run(ns, th)
                check_close(name.replace("|", " "), out["aggregate"], exact, res[name]["bound"])
                res[name]["cpu"].append(out["cpu_s"])
                res[name]["wall"].append(out["wall_s"])
    rows = []
    for name, rec in res.items():
        lib, var = name.split("|", 1)
        rows.append({"library": lib, "variant": var, "cpu_s": statistics.median(rec["cpu"]),
                     "wall_s": statistics.median(rec["wall"]), "samples_cpu_s": rec["cpu"],
                     "bytes_per_client": rec["bytes"], "max_error": rec["err"], "error_bound": rec["bound"]})
    ref = next(r for r in rows if r["variant"] == "secure, complete graph")
    ref_plus = next(r for r in rows if r["variant"].startswith("SecAgg+"))
    plain = next(r for r in rows if r["variant"].startswith("plain"))
    for r in rows:
        r["x_plain_cpu"] = r["cpu_s"] / plain["cpu_s"]
        same = ref_plus if ("neighbours" in r["variant"] or r["variant"].startswith("SecAgg+")) else ref
        r["x_fedhet_cpu"] = r["cpu_s"] / same["cpu_s"]
        r["x_fedhet_bytes"] = r["bytes_per_client"] / same["bytes_per_client"]
        r["fedhet_reference"] = same["variant"]
    if not flwr_ok:
        rows.append({"library": "Flower SecAgg+", "variant": None, "note": missing("flwr")})
    return rows, setup


# ----------------------------------------------------------------------------- 4. Shamir

def shamir_rows(n_fed: int, n_mpyc: int, reps: int) -> list[dict]:
    rng = np.random.default_rng(3)
    secret = rng.integers(0, P61, n_fed, dtype=np.uint64)
    xs = [1, 3, 5]
    sh = share(secret, 5, 3)
    check_shamir("fedhet", reconstruct(sh[[x - 1 for x in xs]], xs), secret)
    check_shamir("fedhet (points 1, 2, 3)", reconstruct(sh[:3], [1, 2, 3]), secret)
    out = np.empty((5, n_fed), dtype=np.uint64)
    three = np.ascontiguousarray(sh[[x - 1 for x in xs]])
    variants = {("fedhet", "share", n_fed): lambda: share(secret, 5, 3, out=out),
                ("fedhet", "reconstruct", n_fed): lambda: reconstruct(three, xs)}
    notes = {}
    th = peer("mpyc.thresha")
    if th is not None:
        from mpyc.finfields import GF
        field = GF(P61)
        small = [int(v) for v in secret[:n_mpyc]]
        shl = th.random_split(field, small, 2, 5)
        check_shamir("MPyC recombine", [v % P61 for v in th.recombine(field, [(x, shl[x - 1]) for x in xs])], small)
        sa = field.array(np.asarray(small, dtype=object))
        shn = th.np_random_split(field, sa, 2, 5)
        check_shamir("MPyC np_recombine", th.np_recombine(field, [(x, shn[x - 1]) for x in xs]).value, small)
        variants[("MPyC", "random_split (lists)", n_mpyc)] = lambda: th.random_split(field, small, 2, 5)
        # recombine on ints returns the unreduced sums: the reduction mod p is part of the work
        variants[("MPyC", "recombine (lists)", n_mpyc)] = lambda: [v % P61 for v in th.recombine(
            field, [(x, shl[x - 1]) for x in xs])]
        variants[("MPyC", "np_random_split (object arrays)", n_mpyc)] = lambda: th.np_random_split(field, sa, 2, 5)
        variants[("MPyC", "np_recombine (object arrays)", n_mpyc)] = lambda: th.np_recombine(
            field, [(x, shn[x - 1]) for x in xs])
    else:
        notes["MPyC"] = missing("mpyc")
    times = interleaved(variants, reps)
    rows = []
    for (lib, op, n), t in times.items():
        rows.append({"library": lib, "op": op, "elements": n, "cpu_s": t["cpu_s"], "wall_s": t["wall_s"],
                     "elements_per_core_s": n / t["cpu_s"]})
    ref = {op: r for r in rows if r["library"] == "fedhet" for op in [r["op"]]}
    for r in rows:
        base = ref["share"] if ("split" in r["op"] or r["op"] == "share") else ref["reconstruct"]
        r["rate_vs_fedhet"] = r["elements_per_core_s"] / base["elements_per_core_s"]
    for lib, note in notes.items():
        rows.append({"library": lib, "op": None, "note": note})
    return rows


# ----------------------------------------------------------------------------- output

def spu_python(given: str | None) -> str | None:
    """The interpreter that has ``spu``: ``--spu-python``, else $FEDHET_SPU_PYTHON, else this one if it
    imports spu, else None."""
    for cand in (given, os.environ.get("FEDHET_SPU_PYTHON")):
        if cand:
            return cand
    return sys.executable if peer("spu") is not None else None


def psi_rows(sizes: list[int], spu: str | None, chunk: int = 1 << 14) -> list[dict]:
    """fedhet's RR22 and KKRT backends (the ``psi`` job as two audited party processes,
    benchmarks/psi_rr22.py's ``one``) and SPU's RR22 and KKRT (``benchmarks/spu_psi.py`` under the
    interpreter that has spu), size by size, interleaved; every intersection checked (n/2)."""
    import json
    import subprocess
    from pathlib import Path

    from benchmarks import psi_rr22

    driver = Path(__file__).with_name("spu_psi.py")
    rows: list[dict] = []
    for e in sizes:
        n = 1 << e
        for backend in ("rr22", "kkrt"):
            r = psi_rr22.one(n, backend, chunk)
            rows.append({"library": "fedhet", "protocol": backend.upper(), "log2n": e, "seconds": r["protocol_s"],
                         "cpu_s": r["cpu_s"], "mb": r["bytes_total"] / 1e6, "what": "PSI call; payload bytes"})
            print(f"psi 2^{e} fedhet {backend}: {r['protocol_s']:.2f} s, {r['bytes_total'] / 1e6:.1f} MB", flush=True)
            if spu is None:
                continue
            proc = subprocess.run([spu, str(driver), backend.upper(), str(n)], capture_output=True, text=True,
                                  timeout=1800)
            line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
            if proc.returncode != 0 or line is None:
                rows.append({"library": "spu", "protocol": backend.upper(), "log2n": e,
                             "note": f"failed (exit {proc.returncode}): {proc.stderr.strip()[-300:]}"})
                continue
            d = json.loads(line)
            rows.append({"library": f"spu {d.get('version', '')}".strip(), "protocol": backend.upper(), "log2n": e,
                         "seconds": max(x["wall_s"] for x in d["ranks"]), "cpu_s": sum(x["cpu_s"] for x in d["ranks"]),
                         "mb": d["loopback_bytes"] / 1e6, "what": "psi_execute (CSV in and out); loopback bytes"})
            print(f"psi 2^{e} spu {backend}: {rows[-1]['seconds']:.2f} s, {rows[-1]['mb']:.1f} MB", flush=True)
    return rows


def markdown(doc: dict) -> str:
    m = doc["meta"]
    out = [f"# fedhet vs peer libraries{' (quick)' if doc['args'].get('quick') else ''}", "",
           f"{m['machine']}; {m['when']}; command `{m['command']}`. The machine is shared (other jobs running): "
           "rates are per core from process CPU time, variants interleaved, medians. Every library's results are "
           "checked equal to a plain computation before timing. 2048-bit Paillier keys.", "",
           "## Peers", "", "| library | distribution | version | measured |", "|---|---|---|---|"]
    for lib, v in doc["peers"].items():
        out.append(f"| {lib} | {v['distribution']} | {v['version'] or '-'} | "
                   f"{'yes' if v['importable'] else v['note']} |")
    if doc.get("paillier"):
        out += ["", "## 1. Paillier per ciphertext (one integer |x| < 2^52 per ciphertext)", "",
                "| op | library | variant | ciphertexts/s per core | x fedhet |", "|---|---|---|---:|---:|"]
        for r in doc["paillier"]:
            if r.get("note"):
                out.append(f"| {r['op']} | {r['library']} | {r['note']} | | |")
                continue
            extra = (f" ({r['values_per_ciphertext']:.0f} values/ct: "
                     f"{r['ct_per_core_s'] * r['values_per_ciphertext']:.0f} values/s)" if "values_per_ciphertext" in r else "")
            out.append(f"| {r['op']} | {r['library']} | {r['variant']}{extra} | {r['ct_per_core_s']:.0f} | "
                       f"{r['rate_vs_fedhet']:.2f} |")
        out += ["", "x fedhet: rate / fedhet's rate (encryption: short exponent, public key; decryption: CRT). "
                "Key generation CPU s: " + ", ".join(f"{k} {v:.2f}" for k, v in doc.get("keygen", {}).items()) + "."]
    if doc.get("layer"):
        out += ["", f"## 2. Packed interactive layer, {doc['layer'][0]['shape']}, encrypt + matmul + decrypt", "",
                "| library | variant | CPU s | wall s | max error | x fedhet (key owner) | x fedhet (public key) |",
                "|---|---|---:|---:|---:|---:|---:|"]
        for r in doc["layer"]:
            if r.get("note"):
                out.append(f"| {r['library']} | {r['note']} | | | | | |")
                continue
            out.append(f"| {r['library']} | {r['variant']} | {r['cpu_s']:.3f} | {r['wall_s']:.3f} | "
                       f"{r['max_error']:.1e} | {r['x_fedhet_owner']:.1f} | {r['x_fedhet_public']:.1f} |")
        out += ["", "x fedhet: the peer's CPU seconds / fedhet's (> 1: fedhet is faster)."]
    if doc.get("secagg"):
        s = doc["secagg_setup"]
        out += ["", f"## 3. Secure aggregation, K = {s['K']}, m = {s['m']:.0e}, one round", "",
                f"{s['passes']} pass(es) of {s['rounds']} timed rounds each after a warm-up; clip {s['clip']}, "
                f"max weight {s['max_weight']}; complete graph t = {s['t_complete']}, k-regular graph "
                f"k = {s['harary_k']}, t_local = {s['t_local']}. CPU = all clients + server.", "",
                "| library | variant | CPU s (all parties) | x plain | x fedhet | bytes/client | x fedhet bytes | "
                "max error | bound |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in doc["secagg"]:
            if r.get("note"):
                out.append(f"| {r['library']} | {r['note']} | | | | | | | |")
                continue
            out.append(f"| {r['library']} | {r['variant']} | {r['cpu_s']:.3f} | {r['x_plain_cpu']:.2f} | "
                       f"{r['x_fedhet_cpu']:.2f} | {r['bytes_per_client'] / 1e6:.3f} MB | {r['x_fedhet_bytes']:.2f} | "
                       f"{r['max_error']:.1e} | {r['error_bound']:.1e} |")
        out += ["", "x fedhet: against fedhet's row of the same graph (complete / k-regular). fedhet's CPU is its "
                "protocol threads' CPU (`protocol_cpu_total_s` of benchmarks/secagg.py); Flower's is this process's "
                "CPU over its workflow and mods, message contents through protobuf included. Bytes: fedhet's encoded "
                "frames; Flower's serialised message contents. At K = 10 fedhet's default Harary degree is K - 1 "
                "(the complete graph), and Flower's num_shares = K likewise."]
    if doc.get("shamir"):
        out += ["", "## 4. Shamir 3-of-5, p = 2^61 - 1", "",
                "| library | op | elements | elements/s per core | x fedhet |", "|---|---|---:|---:|---:|"]
        for r in doc["shamir"]:
            if r.get("note"):
                out.append(f"| {r['library']} | {r['note']} | | | |")
                continue
            out.append(f"| {r['library']} | {r['op']} | {r['elements']} | {r['elements_per_core_s'] / 1e6:.3f} M | "
                       f"{r['rate_vs_fedhet']:.4f} |")
    if doc.get("psi"):
        out += ["", "## 5. PSI, n x n, half common, two processes", "",
                "| library | protocol | n | s | CPU s | MB | x fedhet time | x fedhet bytes | measured |",
                "|---|---|---|---:|---:|---:|---:|---:|---|"]
        base = {(r["protocol"], r["log2n"]): r for r in doc["psi"] if r["library"] == "fedhet" and "seconds" in r}
        for r in doc["psi"]:
            if r.get("note"):
                out.append(f"| {r['library']} | {r['protocol']} | 2^{r['log2n']} | {r['note']} | | | | | |")
                continue
            b = base.get((r["protocol"], r["log2n"]))
            xt = f"{r['seconds'] / b['seconds']:.2f}" if b else "-"
            xb = f"{r['mb'] / b['mb']:.2f}" if b else "-"
            out.append(f"| {r['library']} | {r['protocol']} | 2^{r['log2n']} | {r['seconds']:.2f} | {r['cpu_s']:.1f} | "
                       f"{r['mb']:.1f} | {xt} | {xb} | {r['what']} |")
        if not any(r["library"].startswith("spu") for r in doc["psi"]):
            out += ["", "SPU not measured: " + doc.get("spu_note", "spu not found") + "."]
        out += ["", "x fedhet: against fedhet's row of the same protocol and size (> 1: fedhet is faster / "
                "smaller). fedhet: the PSI call's clock in the party that came up last, payload bytes; SPU: "
                "psi_execute's wall time, which also reads its input CSV and writes the result, and every byte on "
                "the loopback interface (TCP/IP headers included)."]
    env = harness.environment_line(m.get("environment"))
    if env:
        out += ["", env]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_common_args(ap, quick_help="small sizes, fewer repeats (about 2 minutes)", render_only=True)
    ap.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    ap.add_argument("--passes", type=int, default=None, help="secagg: interleaved passes (default 2, quick 1)")
    ap.add_argument("--spu-python", default=None,
                    help="psi: a Python interpreter that has spu (default $FEDHET_SPU_PYTHON, else this one if it can)")
    args = ap.parse_args(argv)
    # `--only psi` alone writes its own file, so the other sections' results are kept
    out = harness.Output("peers_psi" if args.only == ["psi"] else "peers", quick=args.quick, out_dir=args.out)
    if args.render_only:
        harness.render_only(out, markdown)
        return 0
    session = harness.Session("peers", __file__, argv)
    q = args.quick
    # the interpreter's path is this machine's business, not the results' (spu's version is recorded per row)
    doc: dict = {"meta": session.header(), "args": {k: v for k, v in vars(args).items() if k not in ("out", "spu_python")},
                 "peers": peer_versions()}
    for name, v in doc["peers"].items():
        print(f"peer {name}: {v['version'] or '-'} {'ok' if v['importable'] else v['note']}", flush=True)
    if "paillier" in args.only:
        t0 = time.perf_counter()
        doc["paillier"], doc["keygen"] = paillier_rows(32 if q else 128, 8 if q else 24, 3 if q else 7)
        print(f"paillier done ({time.perf_counter() - t0:.0f} s)", flush=True)
    if "layer" in args.only:
        t0 = time.perf_counter()
        doc["layer"] = layer_rows(16 if q else 128, 16, 16, 2 if q else 3, 1)
        print(f"layer done ({time.perf_counter() - t0:.0f} s)", flush=True)
    if "secagg" in args.only:
        t0 = time.perf_counter()
        doc["secagg"], doc["secagg_setup"] = secagg_rows(10, 10**5 if q else 10**6, 2 if q else 3,
                                                         args.passes or (1 if q else 2))
        print(f"secagg done ({time.perf_counter() - t0:.0f} s)", flush=True)
    if "psi" in args.only:
        t0 = time.perf_counter()
        spu = spu_python(args.spu_python)
        if spu is None:
            doc["spu_note"] = ("spu is not importable here (pip install spu: it pins numpy < 2, so install it in a "
                               "venv of its own and pass --spu-python or set FEDHET_SPU_PYTHON)")
        doc["psi"] = psi_rows([14] if q else [16, 20], spu)
        print(f"psi done ({time.perf_counter() - t0:.0f} s)", flush=True)
    if "shamir" in args.only:
        t0 = time.perf_counter()
        doc["shamir"] = shamir_rows(1 << (20 if q else 22), 1 << (12 if q else 14), 3 if q else 5)
        print(f"shamir done ({time.perf_counter() - t0:.0f} s)", flush=True)
    return harness.publish(out, doc, markdown, session, into=doc["meta"])


if __name__ == "__main__":
    sys.exit(main())
