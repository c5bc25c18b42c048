"""Generate the frozen known-answer vectors in this folder (``tests/kat/*.json``).

The vectors pin the byte formats that parties running different fedhet versions must agree
on, and the fixed-point encodings those formats carry:

* ``codec.json``       the message envelope (``fedhet.parties.codec.encode``): header bytes,
                       array frames and the transcript digest for fixed payloads, run id, seq;
* ``prg.json``         the AES-256-CTR stream of ``fedhet.crypto.prg.PRG`` (pairwise masks);
* ``ecdh_psi.json``    hash-to-curve and X25519 blinding of ``fedhet.crypto.ecdh_psi``;
* ``paillier.json``    Paillier slot packing (packed plaintexts for fixed values and slot
                       specs), the ciphertext byte format with a fixed key (p, q) and fixed
                       obfuscator bases r, the ``EncryptedArray`` wire metadata, and packed
                       matmul / add_plain / mul_scalar results (deterministic given inputs);
* ``fixedpoint.json``  field / ring fixed-point encodings (``fedhet.crypto.fixedpoint``);
* ``he_encoding.json`` the HE split layer's integer encodings: quantization, delta clipping,
                       weight steps and masked two's complement bytes.

Every file holds its inputs next to the expected outputs, so
``tests/test_known_answers.py`` recomputes each output from today's code and compares exactly.

Regenerate ONLY on a deliberate wire-format change (which breaks compatibility with parties on
older versions; say so in the commit)::

    python tests/kat/make_vectors.py            # rewrites tests/kat/*.json

Values that JSON cannot hold directly are tagged: ``{"$bytes": hex}``,
``{"$nd": [dtype, shape, hex]}`` (a C-ordered numpy array), ``{"$torch": [dtype, shape, hex]}``,
``{"$map": [[key, value], ...]}`` (a dict with int keys); big integers are decimal strings.
Everything is derived from fixed constants: nothing random.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import gmpy2
import numpy as np

HERE = Path(__file__).resolve().parent
SEED = bytes(range(32))


# ------------------------------------------------------------------------------ JSON tagging
def to_json(obj):
    """A payload value -> JSON-able value with tags (inverse of :func:`from_json`)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        a = obj.numpy()
        return {"$torch": [a.dtype.str, list(a.shape), a.tobytes().hex()]}
    if isinstance(obj, np.ndarray):
        return {"$nd": [obj.dtype.str, list(obj.shape), np.ascontiguousarray(obj).tobytes().hex()]}
    if isinstance(obj, (bytes, bytearray)):
        return {"$bytes": bytes(obj).hex()}
    if isinstance(obj, dict):
        if any(not isinstance(k, str) for k in obj):
            return {"$map": [[k, to_json(v)] for k, v in obj.items()]}
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj


def from_json(obj):
    """Tagged JSON value -> the payload value it stands for."""
    if isinstance(obj, dict):
        if set(obj) == {"$bytes"}:
            return bytes.fromhex(obj["$bytes"])
        if set(obj) == {"$nd"} or set(obj) == {"$torch"}:
            dt, shape, hx = obj.get("$nd") or obj["$torch"]
            a = np.frombuffer(bytes.fromhex(hx), dtype=np.dtype(dt)).reshape(shape).copy()
            if "$torch" in obj:
                import torch

                return torch.from_numpy(a)
            return a
        if set(obj) == {"$map"}:
            return {k: from_json(v) for k, v in obj["$map"]}
        return {k: from_json(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [from_json(v) for v in obj]
    return obj


def _det_int(label: str, bits: int) -> int:
    """A fixed ``bits``-bit integer (top bit set) from SHA-512 of a label: reproducible constants."""
    out = b""
    i = 0
    while len(out) * 8 < bits:
        out += hashlib.sha512(f"fedhet-kat/{label}/{i}".encode()).digest()
        i += 1
    v = int.from_bytes(out, "big") >> (len(out) * 8 - bits)
    return v | (1 << (bits - 1))


# ------------------------------------------------------------------------------ codec
def codec_payloads() -> list[tuple[str, dict, object]]:
    """(name, envelope fields, payload) of the frozen envelope cases."""
    import torch

    hdr = dict(run="kat-run-0001", frm="alice", to="bob", kind="kat/msg", seq=7, round=3)
    return [
        ("scalars", hdr, {"i": 1, "neg": -2 ** 40, "big": 2 ** 63 - 1, "f": 0.1, "t": True, "n": None,
                          "s": "héllo", "b": b"\x00\x01\xfe\xff", "l": [1, "x", [2.5, False]],
                          "d": {"nested": {"deep": [None]}}}),
        ("numpy", dict(hdr, seq=0, round=0, kind="psi/points"), {
            "f32": np.arange(6, dtype=np.float32).reshape(2, 3) / 4,
            "f64": np.array([np.pi, -0.0, 1e300]),
            "i64": np.array(-5, dtype=np.int64),
            "u8": np.frombuffer(bytes(range(0, 256, 17)), dtype=np.uint8).reshape(4, 4),
            "bool": np.array([True, False, True]),
            "empty": np.zeros((0, 4), dtype=np.int32),
            "list": [np.array([1, 2], dtype=np.uint64), 3],
        }),
        ("torch", dict(hdr, frm="host", to="guest", kind="split/acts", seq=123456, round=-1), {
            "acts": torch.tensor([[0.5, -1.25], [3.0, 1e-3]], dtype=torch.float32),
            "ids": torch.tensor([3, 1, 2], dtype=torch.int64),
        }),
        ("int_keys", dict(hdr, seq=2 ** 40), {1: "one", 2: np.array([2.0], dtype=np.float16)}),
        ("empty", dict(hdr, seq=1), {}),
    ]


def make_codec() -> dict:
    from fedhet.parties import codec

    cases = []
    for name, h, payload in codec_payloads():
        frames = [bytes(f) for f in codec.encode(h["run"], h["frm"], h["to"], h["kind"], h["seq"],
                                                  payload, round=h["round"])]
        digest, nbytes = codec.frames_digest(frames)
        cases.append({"name": name, "envelope": h, "payload": to_json(payload),
                      "header_hex": frames[0].hex(), "frames_hex": [f.hex() for f in frames[1:]],
                      "header_sha256": hashlib.sha256(frames[0]).hexdigest(),
                      "digest": digest, "nbytes": nbytes})
    return {"protocol_version": codec.PROTOCOL_VERSION, "cases": cases}


# ------------------------------------------------------------------------------ PRG
def make_prg() -> dict:
    from fedhet.crypto.field import P61
    from fedhet.crypto.prg import PRG

    cases = []
    for stream in (0, 7, 2 ** 64 - 1, {"$bytes": b"round\x00\x00\x01".hex()}):
        sid = from_json(stream)
        g = PRG(SEED, sid)
        c = {"seed": SEED.hex(), "stream": stream, "first_bytes": g.bytes(80).hex()}
        # Each draw continues the same stream, in this order.
        c["uint32_next4"] = [int(v) for v in g.uint32(4)]
        c["uint64_next3"] = [str(int(v)) for v in g.uint64(3)]
        c["bits20_next4"] = [int(v) for v in g.integers_pow2(4, 20)]
        cases.append(c)
    mods = []
    for modulus in (P61, 2 ** 32 + 1, 1000003, 2 ** 64, 2):
        vals = PRG(SEED, 5).integers_mod(12, modulus)
        mods.append({"seed": SEED.hex(), "stream": 5, "modulus": str(modulus),
                     "first12": [str(int(v)) for v in vals]})
    return {"streams": cases, "integers_mod": mods}


# ------------------------------------------------------------------------------ ECDH-PSI
def first_hash_fails(encoded: bytes, context: bytes) -> bool:
    """Whether the first BLAKE2b attempt of the documented hash-to-curve gives no curve point."""
    p, a = 2 ** 255 - 19, 486662
    salt = hashlib.blake2b(context, digest_size=16, person=b"fedhet-psi-ctx").digest()
    h = hashlib.blake2b(encoded, digest_size=64, person=b"fedhet-psi-u" + bytes(4), salt=salt).digest()
    for half in (h[:32], h[32:]):
        u = int.from_bytes(half, "little") & ((1 << 255) - 1)
        if u < p and gmpy2.legendre(gmpy2.mpz(u * (u * (u + a) + 1) % p), p) == 1:
            return False
    return True


def psi_items(context: bytes) -> list:
    """Fixed IDs of every kind, plus the smallest int ID whose hash needs a second attempt."""
    from fedhet.crypto import ecdh_psi as ep

    slow = next(i for i in range(10_000) if first_hash_fails(ep.encode_item(i), context))
    return ["alice", "", "élan", "1", 0, 1, -1, 2 ** 80 + 3, b"\x00\xff", slow]


def item_to_json(x) -> list:
    if isinstance(x, bytes):
        return ["bytes", x.hex()]
    return [type(x).__name__, str(x) if isinstance(x, int) else x]


def item_from_json(t: list):
    kind, v = t
    return {"bytes": bytes.fromhex, "int": int, "str": str}[kind](v)


def make_ecdh() -> dict:
    from fedhet.crypto import ecdh_psi as ep

    out = []
    scalar = hashlib.sha256(b"fedhet-kat/psi-scalar").digest()
    for context in (b"", b"fedhet-kat/psi-context"):
        items = psi_items(context)
        enc = ep.encode_items(items)
        pts = ep.hash_to_points(enc, context)
        out.append({"context_hex": context.hex(), "scalar_hex": scalar.hex(),
                    "items": [item_to_json(x) for x in items],
                    "encoded_hex": [e.hex() for e in enc],
                    "points_hex": [h.hex() for h in chunks32(pts)],
                    "blinded_hex": [b.hex() for b in chunks32(ep.blind(scalar, pts))]})
    return {"cases": out}


def chunks32(b: bytes, n: int = 32) -> list[bytes]:
    return [b[i:i + n] for i in range(0, len(b), n)]


# ------------------------------------------------------------------------------ Paillier
KAT_KEY_BITS = 1024


def kat_key():
    """A fixed 1024-bit Paillier key from two deterministic 512-bit primes (phe objects)."""
    from phe import paillier as phe

    half = KAT_KEY_BITS // 2
    p = int(gmpy2.next_prime(_det_int("paillier-p", half) | (1 << (half - 2))))
    q = int(gmpy2.next_prime(_det_int("paillier-q", half) | (1 << (half - 2))))
    n = p * q
    assert n.bit_length() == KAT_KEY_BITS and p != q
    pk = phe.PaillierPublicKey(n)
    return pk, phe.PaillierPrivateKey(pk, p, q)


def kat_r(label: str, i: int, n: int) -> int:
    """Fixed obfuscator base r (a unit mod n) for ciphertext ``i`` of case ``label``."""
    r = _det_int(f"paillier-r/{label}/{i}", n.bit_length() - 1)
    while math.gcd(r, n) != 1:
        r += 1
    return r


def paillier_cases():
    """(name, x, PackingSpec fields) of the frozen packing cases."""
    x_default = np.array([[0.0, 1.0, -1.0, 0.5, -0.5, 255.99, -255.99, 1e-5, -1e-5, 3.14159265,
                           2 ** -17, -(2 ** -17), 3 * 2 ** -17, 100.0, -100.0, 7.25, -7.25, 42.0, 0.1, -0.1],
                          [float(v) for v in np.linspace(-200, 200, 20)]])
    x_tight = np.array([float(v) for v in np.linspace(-7.9, 7.9, 120)])
    x_ints = np.array([[0, 1, -1, 2 ** 17, -(2 ** 17), 262143, -262143, 12345]], dtype=np.float64)
    return [
        ("default_2x20", x_default, (16, 8, 64)),
        ("unpacked", np.array([1.25, -3.5, 0.0]), (16, 8, None)),
        ("tight_9bit_slots", x_tight, (4, 3, 9)),
        ("int_slots_160", x_ints, (0, 18, 160)),
    ]


def _ct_hex(cts, pk) -> list[str]:
    from fedhet.crypto.paillier import ciphertexts_to_bytes

    return [row.tobytes().hex() for row in ciphertexts_to_bytes(cts, pk)]


def make_paillier() -> dict:
    from fedhet.crypto.paillier import (EncryptedArray, PackingSpec, PaillierContext, public_key_to_bytes,
                                        unpack_signed)

    pk, sk = kat_key()
    out = {"key": {"p": str(sk.p), "q": str(sk.q), "n": str(pk.n), "key_bits": KAT_KEY_BITS,
                   "public_key_hex": public_key_to_bytes(pk).hex()},
           "note": "ciphertext i = (1 + m_i n) r_i**n mod n**2 (fixed r_i), big-endian, ceil(bits(n**2)/8) bytes",
           "cases": []}
    with PaillierContext(pk, sk) as ctx:
        for name, x, fields in paillier_cases():
            spec = PackingSpec(*fields)
            enc = ctx.encrypt(x, spec)
            residues = [int(m) for m in ctx.decrypt_raw(enc.ciphertexts.ravel())]
            slot_bits, slots = spec.layout(KAT_KEY_BITS)
            slot_ints = unpack_signed(residues, int(pk.n), slot_bits, slots, len(residues) * slots)
            rs = [kat_r(name, i, pk.n) for i in range(len(residues))]
            cts = [pk.raw_encrypt(m, r_value=r) for m, r in zip(residues, rs)]
            grid = np.array(cts, dtype=object).reshape(enc.ciphertexts.shape)
            fixed = EncryptedArray(pk, grid, enc.shape, spec, enc.frac_bits, enc.bound)
            meta, data = fixed.to_wire()
            case = {"name": name, "x": x.tolist(), "shape": list(x.shape), "spec": list(fields),
                    "layout": [slot_bits, slots], "residues": [str(m) for m in residues],
                    "slot_ints": [str(v) for v in slot_ints], "r": [str(r) for r in rs],
                    "ciphertexts_hex": _ct_hex(cts, pk),
                    "meta": meta, "decrypted": ctx.decrypt(fixed).tolist()}
            meta_nb, _ = fixed.to_wire(include_bound=False)
            case["meta_without_bound"] = meta_nb
            if name == "default_2x20":
                W = np.array([[0.75, -1.5, 0.0], [-2.0, 0.125, 3.0]])
                mm = fixed.matmul(W, w_frac_bits=8)
                ap = fixed.add_plain(np.full(x.shape, -0.25))
                ms = fixed.mul_scalar(-3)
                neg = -fixed
                case["ops"] = {
                    "W": W.tolist(), "w_frac_bits": 8,
                    "matmul": {"meta": mm.to_wire()[0], "ciphertexts_hex": _ct_hex(mm.ciphertexts.ravel(), pk)},
                    "add_plain": {"x": -0.25, "meta": ap.to_wire()[0],
                                  "ciphertexts_hex": _ct_hex(ap.ciphertexts.ravel(), pk)},
                    "mul_scalar": {"w": -3, "meta": ms.to_wire()[0],
                                   "ciphertexts_hex": _ct_hex(ms.ciphertexts.ravel(), pk)},
                    "neg": {"ciphertexts_hex": _ct_hex(neg.ciphertexts.ravel(), pk)},
                }
            out["cases"].append(case)
    return out


# ------------------------------------------------------------------------------ fixed point
FIXEDPOINT_X = [0.0, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 2 ** -17, 3 * 2 ** -17, -(3 * 2 ** -17),
                1e-5, -1e-5, 3.14159265358979, -2.718281828459045, 1234.5678, -32767.99]


def make_fixedpoint() -> dict:
    from fedhet.crypto.field import P61
    from fedhet.crypto.fixedpoint import FixedPoint

    cases = []
    for frac_bits, modulus, summands in ((16, P61, 1), (16, 2 ** 32, 1), (16, 2 ** 64, 1), (20, P61, 8),
                                         (0, 2 ** 32, 1)):
        fp = FixedPoint(frac_bits, modulus, summands)
        x = np.array(FIXEDPOINT_X)
        x = x[np.abs(x) <= fp.max_abs]
        enc = fp.encode(x)
        cases.append({"frac_bits": frac_bits, "modulus": str(modulus), "summands": summands,
                      "x": x.tolist(), "dtype": enc.dtype.str, "encoded": [str(int(v)) for v in enc],
                      "decoded": fp.decode(enc).tolist()})
    return {"cases": cases}


# ------------------------------------------------------------------------------ HE split-layer encodings
def make_he_encoding() -> dict:
    from fedhet.protocols import he_interactive as hei

    spec = hei.LayerSpec(key_bits=1024, batch_size=32, lr=0.3)
    x = np.array(FIXEDPOINT_X + [2.0 ** 40 + 0.5, -(2.0 ** 45), 0.49999999999999994])
    out = {"spec": {"a_int_bits": spec.a_int_bits, "a_frac_bits": spec.a_frac_bits,
                    "w_frac_bits": spec.w_frac_bits, "d_int_bits": spec.d_int_bits,
                    "d_frac_bits": spec.d_frac_bits, "lr": spec.lr, "lr_frac_bits": spec.lr_frac_bits,
                    "batch_size": spec.batch_size, "key_bits": spec.key_bits}}
    out["quantize"] = [{"x": x.tolist(), "frac_bits": f, "ints": [str(int(v)) for v in hei.quantize(x, f)]}
                       for f in (0, 12, 16)]
    acts = np.array([[0.0, 1.0, -1.0], [63.99, -63.99, 0.000123]])
    out["quantize_acts"] = {"A": acts.tolist(),
                            "ints": [[str(int(v)) for v in r] for r in hei.quantize_acts(acts, spec)]}
    delta = np.array([[0.0, 3.9, -3.9], [4.0, -4.0, 100.0], [1e-6, -1e-6, 0.123456]])
    out["quantize_delta"] = {"delta": delta.tolist(),
                             "ints": [[str(int(v)) for v in r] for r in hei.quantize_delta(delta, spec)]}
    g = np.array([[0, 1, -1, 2 ** 70 + 12345], [-(2 ** 70) - 99, 123456789, -987654321, 2 ** 33]], dtype=object)
    out["weight_step"] = {"X": [[str(v) for v in r] for r in g], "rows": 17,
                          "step": [[str(int(v)) for v in r] for r in hei.weight_step(g, 17, spec)]}
    width = hei.masked_bytes(160)
    top = 2 ** (8 * width - 1)
    vals = np.array([[0, 1, -1, 2 ** 160, -(2 ** 160)], [top - 1, -top, 255, -256, 7]], dtype=object)
    out["masked"] = {"slot_bits": 160, "width": width, "ints": [[str(v) for v in r] for r in vals],
                     "bytes_hex": hei.encode_masked(vals, width).tobytes().hex()}
    return out


# ------------------------------------------------------------------------------ main
MAKERS = {"codec": make_codec, "prg": make_prg, "ecdh_psi": make_ecdh, "paillier": make_paillier,
          "fixedpoint": make_fixedpoint, "he_encoding": make_he_encoding}


def main() -> None:
    from fedhet.parties.atomic import write_atomic

    for name, make in MAKERS.items():
        # Key order is kept (not sorted): payload dicts must revive in the order they were encoded.
        path = write_atomic(HERE / f"{name}.json", json.dumps(make(), indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
