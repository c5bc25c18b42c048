"""RR22-class PSI: GF(2^128), IKNP, the band OKVS, the silent VOLE, the protocol, the wire, the audit."""
from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from fedhet.crypto import gf128, okvs, ot, vole
from fedhet.parties import codec
from fedhet.parties import declare as decl
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.protocols import psi
from fedhet.protocols.psi import common as psi_common
from fedhet.protocols.psi import rr22 as psi_rr22

from psi_oracle import (CASES, check_result, intersection_tests, psi_job_as_processes, psi_runner, scan_a_run,
                        declared_envelopes, max_in_flight, two_runs_differ, unkeyed_hashes)

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

run_psi = psi_runner("psi_rr22_test", backend="rr22", timeout=120.0)
RR22_KINDS = {psi.Kind.RR22_SETUP, psi.Kind.RR22_REPLY, psi.Kind.RR22_U, psi.Kind.RR22_GGM, psi.Kind.RR22_OKVS,
              psi.Kind.RR22_ACK, psi.Kind.RR22_OPRF, psi.Kind.RR22_RESULT}


def _sha(*arrays) -> str:
    return hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()[:16]


def _elements(rng, n):
    return rng.integers(0, 1 << 64, (n, 2), dtype=np.uint64)


# ------------------------------------------------------------ GF(2^128)
@pytest.mark.unit
def test_gf128_kernels_agree_with_the_integer_reference():
    rng = np.random.default_rng(1)
    a, b = _elements(rng, 300), _elements(rng, 300)
    a[0], b[1] = 0, gf128.from_int(1)
    a[2], b[2] = gf128.from_int(1 << 127), gf128.from_int(1 << 127)      # reduction of x^254
    prod = gf128.mul(a, b)
    ints = [(gf128.to_int(x), gf128.to_int(y)) for x, y in zip(a, b)]
    assert [gf128.to_int(p) for p in prod] == [gf128.mul_int(x, y) for x, y in ints]
    assert gf128.to_int(prod[0]) == 0 and gf128.to_int(prod[1]) == gf128.to_int(a[1])
    c = gf128.to_int(b[5])
    assert [gf128.to_int(p) for p in gf128.mul_const(a, c)] == [gf128.mul_int(x, c) for x, _ in ints]
    # distributive and commutative
    assert (gf128.mul(a ^ b, b) == gf128.mul(a, b) ^ gf128.mul(b, b)).all() and (gf128.mul(b, a) == prod).all()
    q = rng.integers(0, 1 << 64, (3, 128, 2), dtype=np.uint64)
    want = [0, 0, 0]
    for g in range(3):
        for k in range(128):
            want[g] ^= gf128.mul_int(gf128.to_int(q[g, k]), 1 << k)
    assert [gf128.to_int(x) for x in gf128.weighted_sum(q)] == want
    # x^128 = x^7 + x^2 + x + 1
    assert gf128.mul_int(1 << 64, 1 << 64) == 0x87
    with pytest.raises(ValueError, match="GF"):
        gf128.mul(np.zeros((2, 3), np.uint64), np.zeros((2, 3), np.uint64))


# ------------------------------------------------------------ IKNP correlated OT
@pytest.mark.unit
def test_iknp_rows_are_correlated_by_delta_and_known_answer():
    rng = np.random.default_rng(2)
    k0, k1 = rng.integers(0, 256, (128, 16), dtype=np.uint8), rng.integers(0, 256, (128, 16), dtype=np.uint8)
    delta_bits = rng.integers(0, 2, 128).astype(np.uint8)
    ks = np.where(delta_bits[:, None] == 1, k1, k0)
    r = rng.integers(0, 2, 1024).astype(np.uint8)
    u, t = ot.iknp_receiver(k0, k1, r)
    q = ot.iknp_sender(delta_bits, ks, u)
    delta = np.packbits(delta_bits, bitorder="little")
    assert u.shape == (128, 128) and t.shape == q.shape == (1024, 16)
    assert (t == (q ^ (r[:, None] * delta))).all()
    assert _sha(u, t) == KAT_IKNP
    with pytest.raises(ValueError, match="multiple of 128"):
        ot.iknp_receiver(k0, k1, r[:100])


KAT_IKNP = "59a68610556a8897"


# ------------------------------------------------------------ the band OKVS
@pytest.mark.unit
@pytest.mark.parametrize("n", [0, 1, 2, 3, 100, 5000, 1 << 16])
def test_okvs_round_trip_at_the_parameters_in_use(n):
    rng = np.random.default_rng(n)
    keys = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    m = okvs.columns(n)
    assert m == max(okvs.BAND_WIDTH, math.ceil(1.25 * n) + okvs.BAND_WIDTH)
    starts, bands = okvs.hash_rows(keys, b"k" * 16, m)
    assert starts.shape == (n,) and bands.shape == (n, okvs.BAND_WIDTH // 64)
    assert n == 0 or (starts.min() >= 0 and starts.max() <= m - okvs.BAND_WIDTH)
    values = _elements(rng, n)
    p = okvs.encode(starts, bands, values, m)
    assert p.shape == (m, 2) and (okvs.decode(p, starts, bands) == values).all()
    d1, d2 = okvs.decode_two(p, p ^ np.uint64(1), starts, bands)
    assert (d1 == values).all()
    # linear: decoding a sum is the sum of the decodings
    other = _elements(rng, m)
    assert (okvs.decode(p ^ other, starts, bands) == values ^ okvs.decode(other, starts, bands)).all()


@pytest.mark.unit
def test_okvs_failure_bound_is_below_2_to_the_minus_40_for_every_accepted_size():
    for e in range(1, 29):
        assert okvs.failure_log2(1 << e) <= -50
    assert psi_common.RR22_MAX_ITEMS <= okvs.MAX_ITEMS
    # θ solves λ(e^θ - 1) = θ
    lam = 1 / 1.25
    assert abs(lam * math.expm1(okvs.theta()) - okvs.theta()) < 1e-12


@pytest.mark.unit
def test_okvs_failures_at_small_widths_are_detected_and_no_more_frequent_than_the_bound():
    """Bands of 28 bits at n = 2^10 fail often enough to count: every encoding either raises
    OKVSFailure or decodes exactly, and the count stays within the stated bound (fixed seed)."""
    rng = np.random.default_rng(11)
    n, w, trials = 1 << 10, 28, 600
    m = okvs.columns(n, w)
    fails = 0
    for _ in range(trials):
        starts = rng.integers(0, m - w + 1, n, dtype=np.int64)
        bands = rng.integers(0, 1 << w, (n, 1), dtype=np.uint64)
        values = _elements(rng, n)
        try:
            p = okvs.encode(starts, bands, values, m)
        except okvs.OKVSFailure:
            fails += 1
            continue
        assert (okvs.decode(p, starts, bands) == values).all()
    bound = 2 ** okvs.failure_log2(n, w)
    assert 0 < fails <= 2 * bound * trials, (fails, bound * trials)


@pytest.mark.unit
def test_okvs_duplicate_keys_are_dependent_rows():
    keys = np.zeros((2, 16), np.uint8)
    m = okvs.columns(2)
    starts, bands = okvs.hash_rows(keys, bytes(16), m)
    with pytest.raises(okvs.OKVSFailure, match="dependent"):
        okvs.encode(starts, bands, np.array([[1, 0], [2, 0]], np.uint64), m)


@pytest.mark.unit
def test_okvs_known_answer():
    keys = np.arange(64 * 16, dtype=np.uint32).astype(np.uint8).reshape(64, 16)
    keys[:, 15] = np.arange(64)
    m = okvs.columns(64)
    starts, bands = okvs.hash_rows(keys, bytes(range(16)), m)
    values = np.arange(128, dtype=np.uint64).reshape(64, 2)
    p = okvs.encode(starts, bands, values, m)
    assert (_sha(starts, bands), _sha(p)) == KAT_OKVS
    # the rows by their definition: block j of AES_key(key ^ j); start from block 0, band bits from block 1
    enc = Cipher(algorithms.AES(bytes(range(16))), modes.ECB()).encryptor()
    for i in (0, 17, 63):
        blocks = [enc.update((keys[i] ^ np.eye(1, 16, 0, dtype=np.uint8)[0] * j).tobytes()) for j in range(2)]
        assert starts[i] == int.from_bytes(blocks[0][:8], "little") % (m - okvs.BAND_WIDTH + 1)
        assert bands[i].tobytes() == blocks[1]


KAT_OKVS = ("ace840ff2ba076e8", "4df28888c8fa212a")


# ------------------------------------------------------------ the silent VOLE
def _vole(m):
    p = vole.params(m)
    a_, A = ot.co_sender_setup()
    delta_bits = vole.Sender.new_delta_bits()
    B, ks = ot.co_receiver_choose(A, delta_bits)
    k0, k1 = ot.co_sender_keys(a_, A, B)
    rcv, snd = vole.Receiver(p, k0, k1), vole.Sender(delta_bits, ks)
    sums, corr = snd.respond(p, rcv.extension())
    b = snd.finish()
    a, c = rcv.finish(sums, corr)
    return p, a, b, c, snd.delta, (rcv, snd, sums, corr)


@pytest.mark.unit
@pytest.mark.parametrize("m", [1, 10, 1000, 70000])
def test_vole_correlation_holds(m):
    p, a, b, c, delta, _ = _vole(m)
    assert a.shape == b.shape == c.shape == (m, 2)
    assert (c == b ^ gf128.mul_const(a, delta)).all()
    assert p.n >= 2 * m and p.t >= vole.noise_blocks() == 256 and p.cots % 128 == 0
    # a is not degenerate: distinct, non-zero field elements (pseudorandom)
    assert len(np.unique(a[:, 0])) == m and not (a == 0).all(axis=1).any()


@pytest.mark.unit
def test_vole_refuses_messages_of_the_wrong_shape():
    p, *_, (rcv, snd, sums, corr) = _vole(100)
    with pytest.raises(vole.VoleError, match="level sums"):
        rcv.finish(sums[:, :-1], corr)
    with pytest.raises(vole.VoleError, match="IKNP"):
        vole.Sender(snd.delta_bits, snd.ks).respond(p, np.zeros((128, 8), np.uint8))


@pytest.mark.unit
def test_vole_receiver_learns_every_leaf_but_its_punctured_one():
    """The GGM step on its own: R's reconstructed leaves equal S's everywhere except at α."""
    rng = np.random.default_rng(4)
    roots = rng.integers(0, 256, (3, 16), dtype=np.uint8)
    leaves, sums = vole.expand_tree(roots, 4)
    assert leaves.shape == (16, 3, 16) and sums.shape == (3, 4, 2, 16)
    assert (np.bitwise_xor.reduce(leaves, axis=0) == sums[:, -1, 0] ^ sums[:, -1, 1]).all()
    # leaf j goes right at level l when bit l - 1 of j is set: leaf 0b0110 is left, right, right, left
    aes = lambda k, b: np.frombuffer(Cipher(algorithms.AES(k), modes.ECB()).encryptor().update(bytes(b)), np.uint8)  # noqa: E731
    kl, kr = (hashlib.blake2b(lab, digest_size=16).digest() for lab in (b"fedhet GGM left", b"fedhet GGM right"))
    node = roots[1]
    for key in (kl, kr, kr, kl):
        node = aes(key, node) ^ node
    assert (leaves[0b0110, 1] == node).all()
    p, a, b, c, delta, (rcv, *_) = _vole(500)
    e = np.zeros((p.n, 2), np.uint64)
    e.reshape(p.t, 1 << p.depth, 2)[np.arange(p.t), rcv.alpha] = rcv.beta
    (ga,) = vole.code_encode([e], p.m)
    assert (ga == a).all()                     # a = G e for R's sparse noise


def _splitmix_stream(seed):
    mask, state = (1 << 64) - 1, seed
    while True:
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        yield z ^ (z >> 31)


def _code_reference(x, m):
    """The Expand-Convolute code by its definition, on Python integers (slow; small sizes only)."""
    mask = (1 << 64) - 1
    v = [gf128.to_int(r) for r in x]
    head, tail = v[:m], v[m:]
    size = len(tail)
    for seed in (vole.CODE_SEED, vole.CODE_SEED ^ mask):
        taps = _splitmix_stream(seed)
        for i in range(size):
            z = next(taps)
            for k in range(vole.ACC_WEIGHT):
                if (z >> k) & 1:
                    tail[(i + 1 + k) % size] ^= tail[i]
            tail[(i + 1 + vole.ACC_WEIGHT) % size] ^= tail[i]
    cols = _splitmix_stream(vole.CODE_SEED ^ 0x5DEECE66D)
    uni = vole.EXPANDER_WEIGHT // 2
    reg = vole.EXPANDER_WEIGHT - uni
    step = size // reg
    out = []
    for i in range(m):
        acc = head[i]
        for k in range(vole.EXPANDER_WEIGHT):
            hi = next(cols) >> 32
            acc ^= tail[k * step + ((hi * step) >> 32) if k < reg else (hi * size) >> 32]
        out.append(acc)
    return out


@pytest.mark.unit
def test_vole_and_code_known_answers():
    x = np.arange(2 * 4096, dtype=np.uint64).reshape(4096, 2) * np.uint64(0x9E3779B97F4A7C15)
    (y,) = vole.code_encode([x], 1000)
    leaves, sums = vole.expand_tree(np.arange(32, dtype=np.uint8).reshape(2, 16), 3)
    h = vole.cot_hash(np.arange(4), np.arange(64, dtype=np.uint8).reshape(4, 16))
    assert (_sha(y), _sha(leaves, sums), _sha(h)) == KAT_VOLE
    # the code by its definition, and linear: G(x + z) = Gx + Gz, two vectors side by side as one at a time
    small, z = x[:600], x[600:1200] ^ np.uint64(12345)
    (gs,) = vole.code_encode([small], 250)
    assert [gf128.to_int(r) for r in gs] == _code_reference(small, 250)
    g2 = vole.code_encode([small, z], 250)
    assert (g2[0] == gs).all() and (vole.code_encode([small ^ z], 250)[0] == gs ^ g2[1]).all()
    # GGM children and the COT hash by their definitions (fixed-key AES, Matyas-Meyer-Oseas)
    root = np.arange(16, dtype=np.uint8)
    kl, kr, kh = (hashlib.blake2b(lab, digest_size=16).digest() for lab in
                  (b"fedhet GGM left", b"fedhet GGM right", b"fedhet COT hash"))
    aes = lambda k, b: np.frombuffer(Cipher(algorithms.AES(k), modes.ECB()).encryptor().update(bytes(b)), np.uint8)  # noqa: E731
    one, _ = vole.expand_tree(root[None], 1)
    assert (one[0, 0] == aes(kl, root) ^ root).all() and (one[1, 0] == aes(kr, root) ^ root).all()
    x1 = np.arange(16, 32, dtype=np.uint8)
    px = aes(kh, x1)
    tweak = np.zeros(16, np.uint8)
    tweak[0] = 1
    assert (h[1] == aes(kh, px ^ tweak) ^ px).all()


KAT_VOLE = ("3278f6ff08ead853", "bf1ee7fc599f1499", "30552482bd58b857")


# ------------------------------------------------------------ the protocol
test_intersection_equals_python_sets, test_intersection_equals_python_sets_hypothesis = \
    intersection_tests(run_psi, CASES, max_examples=15)


def test_2_16_random_sets():
    rng = np.random.default_rng(0)
    a = rng.choice(1 << 20, 1 << 16, replace=False)
    b = np.concatenate([rng.choice(a, 1 << 14, replace=False), rng.choice(1 << 20, (1 << 16) - (1 << 14))])
    lo_ids, f_ids = [f"c{v}" for v in a.tolist()], [f"c{v}" for v in b.tolist()]
    res = run_psi(lo_ids, [f_ids], chunk=1 << 14)
    want = set(lo_ids) & set(f_ids)
    assert set(res["lo"].ids) == want and res["f0"].ids == res["lo"].ids and len(want) >= 1 << 14
    assert [lo_ids[r] for r in res["lo"].rows.tolist()] == res["lo"].ids
    assert [f_ids[r] for r in res["f0"].rows.tolist()[:2000]] == res["lo"].ids[:2000]


def test_kkrt_ecdh_and_rr22_agree_two_party_and_multi_party():
    rng = np.random.default_rng(7)
    lo_ids = [f"u{v}" for v in rng.integers(0, 600, 400)] + [3, 4, b"z", "Zoë", b"x" * 1024]
    feats = [[f"u{v}" for v in rng.integers(0, 600, 350)] + [4, b"z", "Zoë", b"x" * 1024] for _ in range(3)]
    for fs in (feats[:1], feats):
        for order in ("sorted", "label_owner"):
            r = run_psi(lo_ids, fs, order=order)
            for other in ("kkrt", "ecdh"):
                o = run_psi(lo_ids, fs, order=order, backend=other)
                for name in o:
                    assert r[name].ids == o[name].ids and (r[name].rows == o[name].rows).all(), (name, order, other)
            assert r["lo"].stats["backend"] == "rr22"
    check_result(run_psi(lo_ids, feats), lo_ids, feats)


def test_one_element_and_long_ids():
    check_result(run_psi(["only"], [["only"]]), ["only"], [["only"]])
    long_ids = [bytes([i]) * 1024 for i in range(20)]
    check_result(run_psi(long_ids, [long_ids[5:] + [b"\x00"]]), long_ids, [long_ids[5:] + [b"\x00"]])
    one_byte = [bytes([i]) for i in range(256)]
    check_result(run_psi(one_byte, [one_byte[::3]]), one_byte, [one_byte[::3]])


def test_label_owner_only_mode(wire):
    res = run_psi([9, 3, 7, 3, 1, 8], [[1, 3, 8, 9, 2], [8, 9, 3, 1]], reveal=False)
    assert res["lo"].ids == [1, 3, 8, 9]
    assert all(res[f].ids is None and not res[f].revealed for f in ("f0", "f1"))
    kinds = {codec.decode(fr).kind for _, _, fr in wire}
    assert psi.Kind.RR22_RESULT not in kinds and psi.Kind.RR22_OKVS in kinds


def test_the_okvs_is_rehashed_when_encoding_fails(monkeypatch):
    real, calls = okvs.encode, []

    def flaky(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise okvs.OKVSFailure("injected")
        return real(*a, **k)

    monkeypatch.setattr(okvs, "encode", flaky)
    lo_ids, f_ids = list(range(300)), list(range(200, 500))
    check_result(run_psi(lo_ids, [f_ids]), lo_ids, [f_ids])
    assert len(calls) == 2


@pytest.mark.unit
def test_oprf_output_length_follows_the_sizes():
    assert psi_common.oprf_bytes(1 << 20, 1 << 20) == 10          # 40 + 20 + 20 bits
    assert psi_common.oprf_bytes(0, 0) == 8 and psi_common.oprf_bytes(1 << 40, 1 << 40) == 15


# ------------------------------------------------------------ on the wire
def test_nothing_on_the_wire_is_a_raw_id_or_an_unkeyed_hash(wire):
    scan_a_run(run_psi, wire, lambda raw_ids: unkeyed_hashes(
        raw_ids, lambda raw, enc: [("digest", psi_common.item_digests([enc]).tobytes())]))
    envs = [codec.decode(fr) for _, _, fr in wire]
    masked = np.concatenate([e.payload["p"] for e in envs if e.kind == psi.Kind.RR22_OKVS])
    assert 0.47 < np.unpackbits(masked).mean() < 0.53          # P + a looks uniform (P alone is mostly zero)


def test_fresh_randomness_each_run(wire):
    first, second = two_runs_differ(run_psi, wire, [
        (psi.Kind.RR22_U, "u"), (psi.Kind.RR22_OKVS, "p"), (psi.Kind.RR22_OPRF, "v"), (psi.Kind.RR22_GGM, "sums"),
        (psi.Kind.RR22_REPLY, "B")])
    keys = {e.payload["key"] for e in first + second if e.kind == psi.Kind.RR22_OKVS}
    assert len(keys) == 2


def test_every_message_matches_the_declarations_and_sizes_follow_n(wire, monkeypatch):
    monkeypatch.setattr(psi_rr22, "MAX_OKVS_ROWS", 128)        # several OKVS chunks
    res = run_psi(list(range(300)), [list(range(50, 330)), list(range(90, 400))], chunk=32)
    assert res["lo"].size == 210
    declared = decl.index(psi.declarations(backend="rr22"))
    seen = set()
    m = okvs.columns(300)
    prm = vole.params(m)
    okvs_rows = 0
    for e in declared_envelopes(wire, "rr22"):
        seen.add(e.kind)
        if e.kind == psi.Kind.RR22_U:
            assert e.payload["u"].shape == (128, prm.cots // 8)
        if e.kind == psi.Kind.RR22_GGM:
            assert e.payload["sums"].shape == (prm.t, prm.depth, 2, 16) and e.payload["corr"].shape == (prm.t, 16)
        if e.kind == psi.Kind.RR22_OKVS:
            okvs_rows += len(e.payload["p"])
    assert seen == RR22_KINDS
    assert okvs_rows == 2 * m                                 # one OKVS of m columns per feature party

    def audit(kind, arrays):
        return decl.check_record(declared[kind], arrays)

    assert audit(psi.Kind.RR22_OPRF, [("v", "|u1", (5, 11))]) is None
    assert audit(psi.Kind.RR22_OPRF, [("v", "|u1", (5, 17))]) is not None
    assert audit(psi.Kind.RR22_OKVS, [("p", "|u1", (psi_common.MAX_OKVS_ROWS + 1, 16))]) is not None
    assert audit(psi.Kind.RR22_REPLY, [("B", "|u1", (127, 32))]) is not None
    assert audit(psi.Kind.RR22_U, [("u", "|u1", (129, 8))]) is not None


def test_okvs_stream_is_flow_controlled(monkeypatch, wire):
    monkeypatch.setattr(psi_rr22, "MAX_OKVS_ROWS", 64)
    monkeypatch.setattr(psi_rr22, "OKVS_WINDOW_BYTES", 1)      # window of 2 chunks
    res = run_psi(list(range(2000)), [list(range(1000, 3000))], chunk=7)
    assert res["lo"].size == 1000
    most, sent = max_in_flight(wire, psi.Kind.RR22_OKVS, psi.Kind.RR22_ACK)
    assert sent > 2 and most <= 2          # more chunks than the window, never more than it in flight


def test_a_label_owner_announcing_the_wrong_okvs_size_is_refused(monkeypatch):
    real = psi_rr22.start_vole

    def lying(party, r, n, m, key, timeout):
        return real(party, r, n + 1, m, key, timeout)

    monkeypatch.setattr(psi_rr22, "start_vole", lying)
    with pytest.raises(FederationFailed, match="OKVS columns"):
        run_psi(list(range(300)), [[2, 3]])


def test_a_label_owner_announcing_more_ids_than_memory_allows_is_refused_before_allocating(monkeypatch):
    """The silent VOLE turns a small message into memory proportional to the announced size: a size the
    feature party's machine cannot hold is refused, naming the peer and the figures."""
    monkeypatch.setattr(psi_rr22, "available_bytes", lambda: 1 << 10)      # this "machine" has 1 KiB left
    with pytest.raises(FederationFailed, match=r"'lo'.*announces 300 IDs.*GiB.*0\.0 GiB available"):
        run_psi(list(range(300)), [[2, 3]])
    assert vole.sender_bytes(vole.params(1 << 20)) > 5 * 16 * (1 << 21)


def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(FederationFailed, match="'f0'"):
        run_psi([1, 2], [[1, None]])


# --------------------------------------------------------- the runnable job
def test_psi_job_in_memory_three_parties_rr22():
    from fedhet.algorithms import psi_job

    cfg = {"n": 400, "seed": 3, "psi_backend": "rr22"}
    parties = [("owner", "label_owner"), ("f1", "feature"), ("f2", "feature")]
    res = run_inmemory(psi_job, parties, cfg=cfg)
    assert all(r["correct"] and r["rows_aligned"] and r["size"] == 200 for r in res.values())
    kkrt = run_inmemory(psi_job, parties, cfg=cfg | {"psi_backend": "kkrt"})
    assert {r["ids_sha256"] for r in kkrt.values()} == {r["ids_sha256"] for r in res.values()}


@pytest.mark.processes
def test_psi_job_rr22_runs_as_processes_and_passes_the_audit(tmp_path):
    rep = psi_job_as_processes(tmp_path / "run", {"n": 500, "psi_backend": "rr22", "workers": 0}, RR22_KINDS)
    assert not {row["kind"] for row in rep.table} & {psi.Kind.KKRT_U, psi.Kind.BLIND_L}


# ------------------------------------------------------------ the ID digests (issue 49)
@pytest.mark.unit
def test_id_digests_are_aes_cbc_mac_of_the_length_prepended_encoding():
    """The keyed PRF of the IDs equals AES-128-CBC (zero IV, last block) of len (8 bytes LE) || M || zero
    padding, computed by OpenSSL one message at a time, at every block boundary; strings that differ only
    in trailing zero bytes (the padding) get different values; the key changes every value."""
    from fedhet.crypto import id_prf

    rng = np.random.default_rng(49)
    key = bytes(rng.integers(0, 256, 16, dtype=np.uint8))

    def reference(m: bytes, k: bytes = key) -> bytes:
        data = len(m).to_bytes(8, "little") + m
        data += bytes(-len(data) % 16)
        enc = Cipher(algorithms.AES(k), modes.CBC(bytes(16))).encryptor()
        return (enc.update(data) + enc.finalize())[-16:]

    msgs = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in list(range(0, 60)) + [1000]]
    msgs += [b"", b"\0", b"\0\0", b"a", b"a\0"]
    got = id_prf.cbc_mac_many(key, msgs)
    assert got.shape == (len(msgs), 16) and got.dtype == np.uint8
    assert [bytes(r) for r in got] == [reference(m) for m in msgs]
    assert len({bytes(r) for r in got[-5:]}) == 5
    other = id_prf.cbc_mac_many(bytes(16), msgs)
    assert not (other == got).all(axis=1).any()
    assert id_prf.cbc_mac_many(key, []).shape == (0, 16)
    # one long ID among short ones: packed from the joined bytes instead of a fixed-width copy
    mixed = msgs[:10] + [bytes(rng.integers(0, 256, 3 << 20, dtype=np.uint8))]
    assert [bytes(r) for r in id_prf.cbc_mac_many(key, mixed)] == [reference(m) for m in mixed]
    with pytest.raises(ValueError, match="16-byte key"):
        id_prf.cbc_mac_many(b"short", msgs)


@pytest.mark.parametrize("f_backend", ["rr22", "auto"])
def test_a_version_1_label_owner_is_named_at_once(f_backend):
    """RR22 version 2 digests IDs under the setup's key dk: a label owner of version 1 (SHA-256 digests, no
    dk) would find no common ID without an error, so its first message fails the feature party at once,
    naming both versions, and nobody is blamed."""
    from fedhet.parties.api import ProtocolMismatch
    import types

    def lo(party, cfg, ids):
        party.send("f0", psi.Kind.RR22_SETUP, {"v": 1, "reveal": True, "ctx": b"", "A": bytes(32)})

    algo = types.SimpleNamespace(NAME="psi_rr22_v1", load_data=None, ROLES={
        "label_owner": lo,
        "feature": lambda party, cfg, ids: psi.psi_feature_party(party, ids, "lo", backend=f_backend)})
    with pytest.raises(FederationFailed) as e:
        run_inmemory(algo, [("lo", "label_owner"), ("f0", "feature")], cfg={}, data={"lo": [1], "f0": [1, 2]},
                     timeout=3600.0, clock="virtual")
    err = e.value.failures["f0"]
    assert isinstance(err, ProtocolMismatch), err
    assert f"PSI (rr22) version {psi_common.RR22_VERSION!r}" in str(err) and "'lo' has 1" in str(err)
    assert e.value.verdict["party"] is None
