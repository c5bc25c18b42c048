"""Frozen known-answer vectors: today's code must reproduce every wire format byte for byte.

The vectors in ``tests/kat/*.json`` were generated once by ``tests/kat/make_vectors.py`` and are
frozen on purpose: parties running different fedhet versions must agree on these bytes (message
envelope, PRG mask stream, PSI hash-to-curve and blinding, Paillier packing and ciphertext
format, fixed-point encodings, the HE layer's masked integers).  A failure here means a wire
format changed; regenerate the vectors only when that change is deliberate (see make_vectors.py).
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from fedhet.crypto import ecdh_psi as ep
from fedhet.crypto.fixedpoint import FixedPoint
from fedhet.crypto.paillier import (
    EncryptedArray,
    PackingSpec,
    PaillierContext,
    ciphertexts_from_bytes,
    ciphertexts_to_bytes,
    public_key_from_bytes,
    public_key_to_bytes,
    unpack_signed,
)
from fedhet.crypto.prg import PRG
from fedhet.parties import codec
from fedhet.protocols import he_interactive as hei

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

KAT = Path(__file__).resolve().parent / "kat"
_spec = importlib.util.spec_from_file_location("fedhet_kat_make_vectors", KAT / "make_vectors.py")
mv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mv)


def load(name: str) -> dict:
    return json.loads((KAT / f"{name}.json").read_text())


def ints(strs) -> list[int]:
    return [int(s) for s in strs]


# ------------------------------------------------------------------------------ envelope codec
CODEC = load("codec")


@pytest.mark.parametrize("case", CODEC["cases"], ids=lambda c: c["name"])
def test_envelope_codec_frames_are_frozen(case):
    assert codec.PROTOCOL_VERSION == CODEC["protocol_version"]
    h = case["envelope"]
    payload = mv.from_json(case["payload"])
    frames = [bytes(f) for f in codec.encode(h["run"], h["frm"], h["to"], h["kind"], h["seq"], payload,
                                             round=h["round"])]
    assert frames[0].hex() == case["header_hex"]
    assert hashlib.sha256(frames[0]).hexdigest() == case["header_sha256"]
    assert [f.hex() for f in frames[1:]] == case["frames_hex"]
    assert codec.frames_digest(frames) == (case["digest"], case["nbytes"])
    # The stored frames decode to the same envelope, and re-encode to the same bytes.
    stored = [bytes.fromhex(case["header_hex"])] + [bytes.fromhex(f) for f in case["frames_hex"]]
    env = codec.decode(stored)
    assert (env.run, env.frm, env.to, env.kind, env.seq, env.round) == (
        h["run"], h["frm"], h["to"], h["kind"], h["seq"], h["round"])
    assert (env.digest, env.nbytes) == (case["digest"], case["nbytes"])
    again = codec.encode(env.run, env.frm, env.to, env.kind, env.seq, env.payload, round=env.round)
    assert [bytes(f) for f in again] == stored


# ------------------------------------------------------------------------------ PRG
PRG_KAT = load("prg")


@pytest.mark.parametrize("case", PRG_KAT["streams"], ids=lambda c: repr(c["stream"]))
def test_prg_stream_is_frozen(case):
    g = PRG(bytes.fromhex(case["seed"]), mv.from_json(case["stream"]))
    assert g.bytes(80).hex() == case["first_bytes"]
    assert [int(v) for v in g.uint32(4)] == case["uint32_next4"]
    assert [int(v) for v in g.uint64(3)] == ints(case["uint64_next3"])
    assert [int(v) for v in g.integers_pow2(4, 20)] == case["bits20_next4"]


@pytest.mark.parametrize("case", PRG_KAT["integers_mod"], ids=lambda c: c["modulus"])
def test_prg_field_elements_are_frozen(case):
    got = PRG(bytes.fromhex(case["seed"]), case["stream"]).integers_mod(12, int(case["modulus"]))
    assert [int(v) for v in got] == ints(case["first12"])


# ------------------------------------------------------------------------------ ECDH-PSI
PSI = load("ecdh_psi")


@pytest.mark.parametrize("case", PSI["cases"], ids=lambda c: c["context_hex"] or "no-context")
def test_hash_to_curve_and_blinding_are_frozen(case):
    context = bytes.fromhex(case["context_hex"])
    items = [mv.item_from_json(t) for t in case["items"]]
    enc = ep.encode_items(items)
    assert [e.hex() for e in enc] == case["encoded_hex"]
    pts = ep.hash_to_points(enc, context)
    assert [p.hex() for p in mv.chunks32(pts)] == case["points_hex"]
    assert ep.hash_to_point(enc[-1], context).hex() == case["points_hex"][-1]
    assert any(mv.first_hash_fails(e, context) for e in enc), "no item exercises the retry path"
    blinded = ep.blind(bytes.fromhex(case["scalar_hex"]), pts)
    assert [b.hex() for b in mv.chunks32(blinded)] == case["blinded_hex"]


# ------------------------------------------------------------------------------ Paillier
PAI = load("paillier")


@pytest.fixture(scope="module")
def kat_ctx():
    from phe import paillier as phe

    k = PAI["key"]
    p, q, n = int(k["p"]), int(k["q"]), int(k["n"])
    assert p * q == n and n.bit_length() == k["key_bits"]
    pk = phe.PaillierPublicKey(n)
    ctx = PaillierContext(pk, phe.PaillierPrivateKey(pk, p, q))
    yield ctx
    ctx.close()


def test_paillier_public_key_bytes_are_frozen(kat_ctx):
    pk = kat_ctx.public_key
    assert public_key_to_bytes(pk).hex() == PAI["key"]["public_key_hex"]
    assert public_key_from_bytes(bytes.fromhex(PAI["key"]["public_key_hex"])).n == pk.n


def _hex(cts, pk) -> list[str]:
    return [row.tobytes().hex() for row in ciphertexts_to_bytes(cts, pk)]


def _wire(case, pk) -> EncryptedArray:
    data = np.array([list(bytes.fromhex(h)) for h in case["ciphertexts_hex"]], dtype=np.uint8)
    return EncryptedArray.from_wire(pk, case["meta"], data)


@pytest.mark.parametrize("case", PAI["cases"], ids=lambda c: c["name"])
def test_paillier_packing_is_frozen(kat_ctx, case):
    """Fixed values -> the same packed plaintexts, which read back as the same signed slots."""
    ctx, n = kat_ctx, int(kat_ctx.public_key.n)
    spec = PackingSpec(*case["spec"])
    slot_bits, slots = spec.layout(ctx.key_bits)
    assert [slot_bits, slots] == case["layout"]
    x = np.array(case["x"], dtype=np.float64)
    residues = ints(case["residues"])
    assert [int(m) for m in ctx.decrypt_raw(ctx.encrypt(x, spec).ciphertexts.ravel())] == residues
    slot_ints = ints(case["slot_ints"])
    assert unpack_signed(residues, n, slot_bits, slots, len(slot_ints)) == slot_ints
    # The documented layout: m = sum_s a_s 2**(s * slot_bits) mod n, slot 0 in the low bits.
    for t, m in enumerate(residues):
        chunk = slot_ints[t * slots:(t + 1) * slots]
        assert sum(a << (s * slot_bits) for s, a in enumerate(chunk)) % n == m
    # Slots are round(x * 2**frac_bits), row by row, padded with zeros.
    rows = x.reshape(-1, x.shape[-1])
    per_row = len(slot_ints) // rows.shape[0]
    for i, row in enumerate(rows):
        want = [int(np.rint(v * 2.0 ** spec.frac_bits)) for v in row]
        assert slot_ints[i * per_row:(i + 1) * per_row] == want + [0] * (per_row - len(want))


@pytest.mark.parametrize("case", PAI["cases"], ids=lambda c: c["name"])
def test_paillier_ciphertext_format_is_frozen(kat_ctx, case):
    """Fixed (m, r) -> the same ciphertext bytes; the wire form decodes and re-encodes exactly."""
    pk = kat_ctx.public_key
    cts = [pk.raw_encrypt(m, r_value=r) for m, r in zip(ints(case["residues"]), ints(case["r"]))]
    assert _hex(cts, pk) == case["ciphertexts_hex"]
    enc = _wire(case, pk)
    meta, data = enc.to_wire()
    assert meta == case["meta"]
    assert [r.tobytes().hex() for r in data] == case["ciphertexts_hex"]
    assert enc.to_wire(include_bound=False)[0] == case["meta_without_bound"]
    assert [int(c) for c in ciphertexts_from_bytes(data, pk)] == cts
    assert kat_ctx.decrypt(enc).tolist() == case["decrypted"]
    assert np.all(np.abs(kat_ctx.decrypt(enc) - np.array(case["x"])) <= 2.0 ** -(case["spec"][0] + 1))


def test_paillier_homomorphic_results_are_frozen(kat_ctx):
    """matmul, add_plain, mul_scalar and negation are deterministic in their inputs: same bytes."""
    case = next(c for c in PAI["cases"] if "ops" in c)
    ops, pk = case["ops"], kat_ctx.public_key
    enc = _wire(case, pk)
    mm = enc.matmul(np.array(ops["W"]), w_frac_bits=ops["w_frac_bits"])
    assert mm.to_wire()[0] == ops["matmul"]["meta"]
    assert _hex(mm.ciphertexts.ravel(), pk) == ops["matmul"]["ciphertexts_hex"]
    ap = enc.add_plain(np.full(enc.shape, ops["add_plain"]["x"]))
    assert ap.to_wire()[0] == ops["add_plain"]["meta"]
    assert _hex(ap.ciphertexts.ravel(), pk) == ops["add_plain"]["ciphertexts_hex"]
    ms = enc.mul_scalar(ops["mul_scalar"]["w"])
    assert ms.to_wire()[0] == ops["mul_scalar"]["meta"]
    assert _hex(ms.ciphertexts.ravel(), pk) == ops["mul_scalar"]["ciphertexts_hex"]
    assert _hex((-enc).ciphertexts.ravel(), pk) == ops["neg"]["ciphertexts_hex"]


# ------------------------------------------------------------------------------ fixed point
@pytest.mark.parametrize("case", load("fixedpoint")["cases"],
                         ids=lambda c: f"f{c['frac_bits']}-q{c['modulus']}-s{c['summands']}")
def test_fixedpoint_encodings_are_frozen(case):
    fp = FixedPoint(case["frac_bits"], int(case["modulus"]), case["summands"])
    enc = fp.encode(np.array(case["x"]))
    assert enc.dtype.str == case["dtype"]
    assert [int(v) for v in enc] == ints(case["encoded"])
    assert fp.decode(enc).tolist() == case["decoded"]


# ------------------------------------------------------------------------------ HE split layer
HE = load("he_encoding")


@pytest.fixture(scope="module")
def he_spec():
    return hei.LayerSpec(**HE["spec"])


def test_he_quantization_is_frozen(he_spec):
    for case in HE["quantize"]:
        got = hei.quantize(np.array(case["x"]), case["frac_bits"])
        assert [int(v) for v in got] == ints(case["ints"])
    qa = HE["quantize_acts"]
    assert [[int(v) for v in r] for r in hei.quantize_acts(np.array(qa["A"]), he_spec)] == \
        [ints(r) for r in qa["ints"]]
    qd = HE["quantize_delta"]
    assert [[int(v) for v in r] for r in hei.quantize_delta(np.array(qd["delta"]), he_spec)] == \
        [ints(r) for r in qd["ints"]]


def test_he_weight_step_is_frozen(he_spec):
    ws = HE["weight_step"]
    X = np.array([ints(r) for r in ws["X"]], dtype=object)
    assert [[int(v) for v in r] for r in hei.weight_step(X, ws["rows"], he_spec)] == [ints(r) for r in ws["step"]]


def test_he_masked_integer_bytes_are_frozen():
    m = HE["masked"]
    assert hei.masked_bytes(m["slot_bits"]) == m["width"]
    vals = np.array([ints(r) for r in m["ints"]], dtype=object)
    assert hei.encode_masked(vals, m["width"]).tobytes().hex() == m["bytes_hex"]
    raw = np.frombuffer(bytes.fromhex(m["bytes_hex"]), dtype=np.uint8).reshape(*vals.shape, m["width"])
    assert (hei.decode_masked(raw, m["width"], vals.shape) == vals).all()
