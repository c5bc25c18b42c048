"""KKRT16 PSI: base OTs, OT extension, code, hash, cuckoo hashing, the protocol, the wire, the audit."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from nacl import bindings as sodium

from fedhet.crypto import cuckoo, ot
from fedhet.parties import codec
from fedhet.parties import declare as decl
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.protocols import psi
from fedhet.protocols.psi import kkrt as psi_kkrt

from psi_oracle import (CASES, check_result, intersection_tests, psi_job_as_processes, psi_runner, scan_a_run,
                        declared_envelopes, max_in_flight, two_runs_differ, unkeyed_hashes)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


# ---------------------------------------------------------------- harness
run_psi = psi_runner("psi_kkrt_test", backend="kkrt", timeout=120.0)


def _as(lst):
    return np.frombuffer(b"".join(lst), np.uint8)


# ------------------------------------------------------------ base OT
def test_chou_orlandi_receiver_gets_exactly_the_chosen_key():
    a, A = ot.co_sender_setup()
    c = np.array([0, 1] * 16, dtype=np.uint8)
    B, kc = ot.co_receiver_choose(A, c)
    k0, k1 = ot.co_sender_keys(a, A, B)
    assert B.shape == (32, 32) and kc.shape == k0.shape == k1.shape == (32, 16)
    assert (kc == np.where(c[:, None] == 1, k1, k0)).all()
    assert not (kc == np.where(c[:, None] == 1, k0, k1)).all(axis=1).any()
    assert len({bytes(r) for r in np.concatenate([k0, k1])}) == 64
    assert all(sodium.crypto_core_ed25519_is_valid_point(bytes(b)) for b in B)


def test_chou_orlandi_known_answer_from_fixed_scalars():
    red = sodium.crypto_core_ed25519_scalar_reduce
    a = red(hashlib.sha512(b"a").digest())
    A = sodium.crypto_scalarmult_ed25519_base_noclamp(a)
    bs = [red(hashlib.sha512(bytes([j])).digest()) for j in range(4)]
    B, kc = ot.co_receiver_choose(A, [0, 1, 1, 0], scalars=bs)
    k0, k1 = ot.co_sender_keys(a, A, B)
    # B_1 = A + b_1 G, computed here independently
    assert bytes(B[1]) == sodium.crypto_core_ed25519_add(A, sodium.crypto_scalarmult_ed25519_base_noclamp(bs[1]))
    assert bytes(B[0]) == sodium.crypto_scalarmult_ed25519_base_noclamp(bs[0])
    # k_0^0 = BLAKE2b(index || A || B_0 || b_0 A)
    want = hashlib.blake2b((0).to_bytes(4, "little") + A + bytes(B[0]) + sodium.crypto_scalarmult_ed25519_noclamp(
        bs[0], A), digest_size=16, person=b"fedhet-co-ot").digest()
    assert bytes(k0[0]) == bytes(kc[0]) == want
    # frozen known answer (fixed scalars): catches any change of the key derivation
    assert hashlib.sha256(k0.tobytes() + k1.tobytes()).hexdigest()[:16] == KAT_CO


KAT_CO = "82feb58108bb8c6f"


def test_base_ot_refuses_small_order_and_invalid_points():
    a, A = ot.co_sender_setup()
    with pytest.raises(ot.OTError, match="point A"):
        ot.co_receiver_choose(bytes(32), [0, 1])  # the identity's encoding is refused (small order)
    B, _ = ot.co_receiver_choose(A, [0, 1, 0])
    B[2] = 0
    with pytest.raises(ot.OTError, match="#2"):
        ot.co_sender_keys(a, A, B)


# ------------------------------------------------------------ AES, code, hash, transposition
def test_prg_is_aes_ctr_and_ranges_are_consistent():
    seeds = np.arange(3 * 16, dtype=np.uint8).reshape(3, 16)
    full = ot.prg_columns(seeds, 0, 8)
    for j in range(3):
        enc = Cipher(algorithms.AES(seeds[j].tobytes()), modes.CTR(bytes(16))).encryptor()
        assert full[j].tobytes() == enc.update(bytes(128))
    assert (ot.prg_columns(seeds, 3, 5) == full[:, 48:]).all()


def test_code_is_four_aes_blocks_and_separates_hash_indices():
    code = ot.PseudorandomCode(bytes(range(16)))
    x = np.arange(5 * 16, dtype=np.uint8).reshape(5, 16)
    c1 = code.encode(x, 1)
    for i in range(4):
        enc = Cipher(algorithms.AES(code.keys[1][i]), modes.ECB()).encryptor()
        assert c1[:, 16 * i:16 * i + 16].tobytes() == enc.update(x.tobytes())
    c0 = code.encode(x, 0)
    # pseudorandom: distinct inputs / hash indices are far apart (about 256 of 512 bits)
    dist = np.unpackbits(c0 ^ c1, axis=1).sum(axis=1)
    assert (dist > 180).all()
    assert len({code.keys[j][i] for j in range(3) for i in range(4)}) == 12
    assert ot.PseudorandomCode(bytes(16)).encode(x, 0).tobytes() != c0.tobytes()


def test_code_keys_depend_on_seed_and_hash_context():
    keys = lambda seed, ctx: psi_kkrt.code_for(seed, ctx).keys  # noqa: E731
    assert keys(b"s" * 16, b"") == keys(b"s" * 16, b"")
    assert keys(b"s" * 16, b"emails") != keys(b"s" * 16, b"") != keys(b"t" * 16, b"")


def test_cr_hash_matches_its_definition():
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 256, (7, 64), dtype=np.uint8)
    got = ot.cr_hash(rows, 16)
    enc = Cipher(algorithms.AES(ot._FIXED_KEY), modes.ECB()).encryptor()  # noqa: SLF001 - checking the definition
    for r in range(7):
        acc = np.zeros(16, np.uint8)
        for k in range(4):
            y = rows[r, 16 * k:16 * k + 16] ^ ot._TWEAKS[0, 16 * k:16 * k + 16]  # noqa: SLF001
            acc ^= np.frombuffer(enc.update(y.tobytes()), np.uint8) ^ y
        assert got[r].tobytes() == acc.tobytes()
    assert (ot.cr_hash(rows, 11) == got[:, :11]).all()


@pytest.mark.parametrize("k,m", [(8, 1), (16, 3), (64, 8), (64, 16), (512, 16), (512, 1000), (520, 24)])
def test_transpose_bits_matches_unpackbits(k, m):
    rng = np.random.default_rng(k + m)
    cols = rng.integers(0, 256, (k, m), dtype=np.uint8)
    before = cols.copy()
    rows = ot.transpose_bits(cols)
    assert (cols == before).all()  # the input is left alone
    assert rows.shape == (8 * m, k // 8)
    assert (rows == ot.transpose_bits_reference(cols)).all()
    # and bit by bit, for a few positions: row i bit j == column j bit i
    for i, j in [(0, 0), (8 * m - 1, k - 1), (3, 5 % k)]:
        assert (rows[i, j // 8] >> (j % 8)) & 1 == (cols[j, i // 8] >> (i % 8)) & 1


# ------------------------------------------------------------ OT extension
def _fixed_extension():
    """A complete OT extension from fixed seeds: base OT keys, choice bits, code seed, receiver inputs."""
    g = np.random.default_rng(12345)
    k0 = g.integers(0, 256, (512, 16), dtype=np.uint8)
    k1 = g.integers(0, 256, (512, 16), dtype=np.uint8)
    s = g.integers(0, 2, 512, dtype=np.uint8)
    ks = np.where(s[:, None] == 1, k1, k0)
    code = ot.PseudorandomCode(bytes(range(100, 116)))
    x = g.integers(0, 256, (256, 16), dtype=np.uint8)
    return ot.KkrtReceiver(k0, k1), ot.KkrtSender(s, ks), code, x


def test_ot_extension_correlation_and_oprf():
    recv, send, code, x = _fixed_extension()
    cw = code.encode(x, 2)
    u1, t1 = recv.chunk(cw[:128], 0)
    u2, t2 = recv.chunk(cw[128:], 128)
    q = np.concatenate([send.chunk(u1, 0), send.chunk(u2, 128)])
    t = np.concatenate([t1, t2])
    # t_i = q_i ^ (C(r_i) & s) for every OT instance
    assert (t == q ^ (cw & send.s_mask)).all()
    # the OPRF at the receiver's input equals the receiver's output; elsewhere it does not
    assert (ot.cr_hash(q ^ send.masked(cw), 16) == ot.cr_hash(t, 16)).all()
    other = code.encode(x[::-1], 2)
    assert not (ot.cr_hash(q ^ send.masked(other), 16) == ot.cr_hash(t, 16)).all(axis=1).any()
    assert not (ot.cr_hash(q ^ send.masked(code.encode(x, 0)), 16) == ot.cr_hash(t, 16)).all(axis=1).any()
    # with s_j = 0 the sender's column j is the receiver's t column j, whatever the code
    zero = np.nonzero(send.s_bits == 0)[0]
    tb = np.unpackbits(t, axis=1, bitorder="little")
    qb = np.unpackbits(q, axis=1, bitorder="little")
    assert (tb[:, zero] == qb[:, zero]).all() and not (tb == qb).all()
    with pytest.raises(ValueError, match="multiples of 128"):
        recv.chunk(cw[:100], 0)


def test_ot_extension_known_answer():
    """Frozen outputs for fixed base-OT keys, choice bits, code seed and inputs (256 OTs)."""
    recv, send, code, x = _fixed_extension()
    cw = code.encode(x, 1)
    u, t = recv.chunk(cw, 0)
    q = send.chunk(u, 0)
    digest = hashlib.sha256(u.tobytes() + q.tobytes() + ot.cr_hash(t, 16).tobytes()).hexdigest()[:16]
    assert digest == KAT_OTE
    # the code alone (fixed seed and inputs, all three hash indices)
    assert hashlib.sha256(b"".join(code.encode(x, j).tobytes() for j in range(3))).hexdigest()[:16] == KAT_CODE


KAT_OTE = "4f2da41ab45e3dde"
KAT_CODE = "d007cdc15bfa0b1b"


# ------------------------------------------------------------ cuckoo hashing
def _digests(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, 16), dtype=np.uint8)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 10, 1000, 1 << 14])
def test_cuckoo_places_every_item_in_one_of_its_bins(n):
    d = _digests(n, n)
    seed, m, table, which, attempts = cuckoo.build_table(d)
    assert m == cuckoo.num_bins(n) and m >= 1.27 * n and m % 128 == 0
    full = np.nonzero(table >= 0)[0]
    assert sorted(table[full].tolist()) == list(range(n))
    h = cuckoo.bin_hashes(d, seed, m)
    assert (h[table[full], which[full]] == full).all()
    assert (which[table < 0] == -1).all()


def test_bin_hashes_are_in_range_and_depend_on_the_seed():
    d = _digests(5000)
    h1 = cuckoo.bin_hashes(d, b"a" * 16, 6400)
    assert h1.shape == (5000, 3) and h1.min() >= 0 and h1.max() < 6400
    assert (h1 != cuckoo.bin_hashes(d, b"b" * 16, 6400)).mean() > 0.99
    counts = np.bincount(h1.ravel(), minlength=6400)
    assert counts.max() < 20  # roughly uniform (mean 2.3)


def test_cuckoo_failure_is_detected_and_rehashed_never_a_wrong_table():
    d = _digests(300)
    # too few bins: every attempt fails, and it says so
    with pytest.raises(cuckoo.CuckooFailure, match="300 items into 256 bins"):
        cuckoo.build_table(d, 256, max_attempts=3, max_rounds=50)
    # identical digests share their three bins: four of them can never be placed, whatever the seed
    with pytest.raises(cuckoo.CuckooFailure):
        cuckoo.build_table(np.concatenate([d, d[:1].repeat(3, axis=0)]), max_attempts=4)
    # a seed whose insertion gives up (30 eviction rounds) is replaced by a fresh one
    fails = [bytes([i]) * 16 for i in range(256)
             if cuckoo.insert(cuckoo.bin_hashes(d, bytes([i]) * 16, 384), 384,
                              np.random.default_rng(np.frombuffer(bytes([i]) * 16, np.uint32)), 30) is None]
    assert fails
    seed, m, table, which, attempts = cuckoo.build_table(d, seeds=fails[:3], max_rounds=30, max_attempts=500)
    assert seed not in fails[:3] and attempts > 3
    full = np.nonzero(table >= 0)[0]
    assert sorted(table[full].tolist()) == list(range(300))
    assert (cuckoo.bin_hashes(d, seed, m)[table[full], which[full]] == full).all()


@pytest.mark.federation
def test_protocol_rehashes_when_the_first_cuckoo_seed_fails(monkeypatch):
    calls = []
    real = cuckoo.insert

    def flaky(h, m, rng, max_rounds=cuckoo.MAX_ROUNDS):
        calls.append(m)
        return None if len(calls) <= 2 else real(h, m, rng, max_rounds)

    monkeypatch.setattr(cuckoo, "insert", flaky)
    lo_ids, f_ids = list(range(200)), list(range(100, 400))
    res = run_psi(lo_ids, [f_ids])
    check_result(res, lo_ids, [f_ids])
    assert res["lo"].stats["cuckoo_attempts"] == 3


# --------------------------------------------------------------- protocol
CASES = {
    **CASES,
    "one element each, common": (["x"], [["x"]]),
    "one element each, different": (["x"], [["y"]]),
    "unicode": (["Zoë", "日本", "🙂", "e\u0301", "\u00e9", "a", "\ud800"], [["\u00e9", "🙂", "b", "日本", "日本", "\ud800"]]),
    "large ints": ([2**64, -2**100, 10**300, 7], [[10**300, 2**64 + 1, -2**100, 7]]),
    "many chunks": ([f"a{i}" for i in range(700)], [[f"a{i}" for i in range(350, 1200)]]),
}


test_intersection_equals_python_sets, test_intersection_equals_python_sets_hypothesis = \
    intersection_tests(run_psi, CASES, max_examples=25)


@pytest.mark.federation
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_2_16_random_sets(seed):
    rng = np.random.default_rng(seed)
    a = rng.choice(1 << 20, 1 << 16, replace=False)
    b = np.concatenate([rng.choice(a, 1 << 14, replace=False), rng.choice(1 << 20, (1 << 16) - (1 << 14))])
    lo_ids, f_ids = [f"c{v}" for v in a.tolist()], [f"c{v}" for v in b.tolist()]
    res = run_psi(lo_ids, [f_ids], chunk=1 << 14)
    want = set(lo_ids) & set(f_ids)
    assert set(res["lo"].ids) == want and res["f0"].ids == res["lo"].ids
    assert len(want) >= 1 << 14
    assert [lo_ids[r] for r in res["lo"].rows.tolist()] == res["lo"].ids
    assert [f_ids[r] for r in res["f0"].rows.tolist()[:2000]] == res["lo"].ids[:2000]


@pytest.mark.federation
def test_same_result_as_ecdh_two_party_and_multi_party():
    rng = np.random.default_rng(7)
    lo_ids = [f"u{v}" for v in rng.integers(0, 600, 400)] + [3, 4, b"z"]
    feats = [[f"u{v}" for v in rng.integers(0, 600, 350)] + [4, b"z"] for _ in range(3)]
    for fs in (feats[:1], feats):
        for order in ("sorted", "label_owner"):
            k = run_psi(lo_ids, fs, order=order)
            e = run_psi(lo_ids, fs, order=order, backend="ecdh")
            for name in e:
                assert k[name].ids == e[name].ids and (k[name].rows == e[name].rows).all(), (name, order)
            assert k["lo"].stats["pair_sizes"] == e["lo"].stats["pair_sizes"]
    check_result(run_psi(lo_ids, feats), lo_ids, feats)


@pytest.mark.federation
def test_label_owner_only_mode(wire):
    lo_ids = [9, 3, 7, 3, 1, 8]
    feats = [[1, 3, 8, 9, 2], [8, 9, 3, 1]]
    res = run_psi(lo_ids, feats, reveal=False)
    assert res["lo"].ids == [1, 3, 8, 9]
    assert all(res[f].ids is None and res[f].rows is None and not res[f].revealed for f in ("f0", "f1"))
    kinds = {codec.decode(fr).kind for _, _, fr in wire}
    assert psi.Kind.KKRT_RESULT not in kinds and psi.Kind.KKRT_U in kinds


def test_match_values_agrees_with_a_dict_including_prefix_collisions():
    for seed in range(10):
        rng = np.random.default_rng(seed)
        a = rng.integers(0, 4, (300, 9), dtype=np.uint8)  # small alphabet: equal 8-byte prefixes and rows
        b = rng.integers(0, 4, (900, 9), dtype=np.uint8)
        b[::5] = a[:180]
        ia, ib = psi_kkrt.match_values(a, b)
        where = {}
        for j, r in enumerate(b):
            where.setdefault(r.tobytes(), j)
        assert list(zip(ia.tolist(), ib.tolist())) == [(i, where[r.tobytes()]) for i, r in enumerate(a)
                                                       if r.tobytes() in where]
    assert len(psi_kkrt.match_values(a, b[:0])[0]) == 0
    # every 8-byte prefix equal, rows told apart only by their last byte
    a = np.zeros((50, 10), np.uint8)
    a[:, 9] = np.arange(50)
    ia, ib = psi_kkrt.match_values(a, a[::-1].copy())
    assert ia.tolist() == list(range(50)) and ib.tolist() == list(range(49, -1, -1))


def test_output_length_follows_the_sizes():
    assert psi_kkrt.output_bytes(1 << 20, 1 << 20) == 11  # 40 + 20 + 22 bits
    assert psi_kkrt.output_bytes(0, 0) == 8 and psi_kkrt.output_bytes(1 << 32, 1 << 32) == 14


# ------------------------------------------------------------ on the wire
def _forbidden(raw_ids):
    return unkeyed_hashes(raw_ids, lambda raw, enc: [("blake2b", hashlib.blake2b(raw, digest_size=16).digest()),
                                                     ("digest", psi.common.item_digests([enc]).tobytes())])


@pytest.mark.federation
def test_nothing_on_the_wire_is_a_raw_id_or_an_unkeyed_hash_or_a_bare_codeword(wire):
    scan_a_run(run_psi, wire, _forbidden)
    # U rows are not the label owner's codewords (they are masked by PRG output)
    envs = [codec.decode(fr) for _, _, fr in wire]
    u = np.concatenate([e.payload["u"] for e in envs if e.kind == psi.Kind.KKRT_U])
    bits = np.unpackbits(u).mean()
    assert 0.45 < bits < 0.55


@pytest.mark.federation
def test_fresh_randomness_each_run(wire):
    first, second = two_runs_differ(run_psi, wire, [(psi.Kind.KKRT_U, "u"), (psi.Kind.KKRT_OPRF, "v"),
                                                    (psi.Kind.KKRT_REPLY, "B")])
    seeds = [e.payload["seed"] for e in first + second if e.kind == psi.Kind.KKRT_SETUP]
    assert len(set(seeds)) == 2


@pytest.mark.federation
def test_every_message_matches_the_declarations(wire):
    res = run_psi(list(range(300)), [list(range(50, 330)), list(range(90, 400))], chunk=32)
    assert res["lo"].size == 210
    declared = decl.index(psi.declarations(backend="kkrt"))
    seen = {e.kind for e in declared_envelopes(wire, "kkrt")}
    assert seen == {psi.Kind.KKRT_SETUP, psi.Kind.KKRT_REPLY, psi.Kind.KKRT_U, psi.Kind.KKRT_ACK,
                    psi.Kind.KKRT_OPRF, psi.Kind.KKRT_RESULT}

    def audit(kind, arrays):
        return decl.check_record(declared[kind], arrays)

    assert audit(psi.Kind.KKRT_U, [("u", "|u1", (256, 64))]) is None
    # (a chunk of U that is not a whole number of 128-bin blocks is refused by the receiver)
    for bad in ([("|u1", (256, 32))], [("|u1", (psi_kkrt.MAX_U_ROWS + 128, 64))], [("v", "|u1", (256, 64))]):
        assert audit(psi.Kind.KKRT_U, bad) is not None
    assert audit(psi.Kind.KKRT_OPRF, [("v", "|u1", (5, 3, 11))]) is None
    assert audit(psi.Kind.KKRT_OPRF, [("v", "|u1", (5, 2, 11))]) is not None
    assert audit(psi.Kind.KKRT_OPRF, [("v", "|u1", (5, 3, 17))]) is not None
    assert audit(psi.Kind.KKRT_REPLY, [("B", "|u1", (511, 32))]) is not None


@pytest.mark.federation
def test_u_stream_is_flow_controlled(monkeypatch, wire):
    monkeypatch.setattr(psi_kkrt, "U_WINDOW_BYTES", 1)  # window of 2 chunks of 128 bins
    lo_ids = list(range(2000))
    res = run_psi(lo_ids, [list(range(1000, 3000))], chunk=7)
    assert res["lo"].size == 1000
    # the label owner never had more than 2 chunks unacknowledged
    most, sent = max_in_flight(wire, psi.Kind.KKRT_U, psi.Kind.KKRT_ACK)
    assert sent > 2 and most <= 2          # more chunks than the window, never more than it in flight


# ------------------------------------------------------------ bad input
@pytest.mark.federation
def test_bad_input_is_refused_with_a_clear_error():
    with pytest.raises(FederationFailed, match="'f0'"):
        run_psi([1, 2], [[1, None]])
    with pytest.raises(FederationFailed, match="backend"):
        run_psi([1, 2], [[1, 2]], backend="rsa")


# --------------------------------------------------------- the runnable job
@pytest.mark.federation
def test_psi_job_in_memory_three_parties_kkrt():
    from fedhet.algorithms import psi_job

    cfg = {"n": 400, "seed": 3, "psi_backend": "kkrt"}
    res = run_inmemory(psi_job, [("owner", "label_owner"), ("f1", "feature"), ("f2", "feature")], cfg=cfg)
    assert len({r["ids_sha256"] for r in res.values()}) == 1
    assert all(r["correct"] and r["rows_aligned"] and r["size"] == 200 for r in res.values())
    ecdh = run_inmemory(psi_job, [("owner", "label_owner"), ("f1", "feature"), ("f2", "feature")],
                        cfg=cfg | {"psi_backend": "ecdh"})
    assert {r["ids_sha256"] for r in ecdh.values()} == {r["ids_sha256"] for r in res.values()}


@pytest.mark.processes
def test_psi_job_kkrt_runs_as_processes_and_passes_the_audit(tmp_path):
    rep = psi_job_as_processes(tmp_path / "run", {"n": 500, "psi_backend": "kkrt", "workers": 0},
                               {psi.Kind.KKRT_SETUP, psi.Kind.KKRT_REPLY, psi.Kind.KKRT_U, psi.Kind.KKRT_OPRF,
                                psi.Kind.KKRT_RESULT})
    assert not {row["kind"] for row in rep.table} & {psi.Kind.BLIND_L, psi.Kind.BLIND_F}
