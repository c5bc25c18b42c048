"""ECDH-PSI: the group primitive, the multi-party protocol, what crosses the wire, the audit."""
from __future__ import annotations

import hashlib
import threading
import types

import numpy as np
import pytest

from fedhet.crypto import ecdh_psi as grp
from fedhet.parties import codec
from fedhet.parties import declare as decl
from fedhet.parties.api import PeerTimeout, ProtocolMismatch
from fedhet.parties.inmemory import FederationFailed, InMemoryHub, run_inmemory
from fedhet.protocols import psi
from fedhet.protocols.psi import common as psi_common

from psi_oracle import (CASES, check_result, intersection_tests, leaks, psi_job_as_processes, psi_runner, scan_a_run,
                        unkeyed_hashes)

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

P = 2**255 - 19
A = 486662


# ---------------------------------------------------------------- harness
run_psi = psi_runner("psi_test")


def envelopes(frames):
    return [codec.decode(fr) for _, _, fr in frames]


# -------------------------------------------------------------- primitive
@pytest.mark.unit
def test_encoding_is_canonical_and_keeps_types_apart():
    assert len({grp.encode_item(x) for x in (1, "1", b"1", -1, "-1")}) == 5
    assert grp.encode_item(np.int64(7)) == grp.encode_item(7)
    assert grp.encode_item(np.str_("é")) == grp.encode_item("é") == b"s" + "é".encode()
    assert grp.encode_item("e\u0301") != grp.encode_item("\u00e9")  # no Unicode normalisation
    for bad in (True, 1.0, None, (1,)):
        with pytest.raises(TypeError, match=type(bad).__name__):
            grp.encode_item(bad)
    with pytest.raises(TypeError, match="position 2"):
        grp.encode_items(["a", 3, 2.5])


@pytest.mark.unit
def test_hash_lands_on_the_curve_is_deterministic_and_domain_separated():
    enc = grp.encode_items(list(range(300)) + ["x", "ü", ""])
    pts = grp.hash_to_points(enc)
    assert len(pts) == 32 * len(enc)
    us = [int.from_bytes(pts[i:i + 32], "little") for i in range(0, len(pts), 32)]
    # Euler's criterion, computed independently of the module's gmpy2 path
    assert all(u < P and pow((u * u * u + A * u * u + u) % P, (P - 1) // 2, P) == 1 for u in us)
    assert len(set(us)) == len(us)
    assert grp.hash_to_points(enc) == pts
    other = grp.hash_to_points(enc, context=b"emails")
    assert not set(us) & {int.from_bytes(other[i:i + 32], "little") for i in range(0, len(other), 32)}


def _edwards_y(u: int) -> bytes:
    return ((u - 1) * pow(u + 1, P - 2, P) % P).to_bytes(32, "little")


@pytest.mark.unit
def test_blinding_commutes_and_lands_in_the_prime_order_subgroup():
    from nacl.bindings import crypto_core_ed25519_is_valid_point as in_main_subgroup

    pts = grp.hash_to_points(grp.encode_items(range(64)))
    a, b = grp.new_scalar(), grp.new_scalar()
    assert a != b
    ab = grp.blind(b, grp.blind(a, pts))
    assert ab == grp.blind(a, grp.blind(b, pts))
    assert ab != grp.blind(a, pts) != pts
    # libsodium's check (on the curve, in the subgroup of order l, not small order), on the
    # Edwards form y = (u-1)/(u+1): the raw hashes mostly carry a torsion part, the blinded never do.
    def frac(flat):
        return np.mean([in_main_subgroup(_edwards_y(int.from_bytes(flat[i:i + 32], "little")))
                        for i in range(0, len(flat), 32)])
    assert frac(pts) < 0.5
    assert frac(grp.blind(a, pts)) == 1.0 and frac(ab) == 1.0


@pytest.mark.unit
def test_blinding_refuses_small_order_and_malformed_points():
    a = grp.new_scalar()
    pts = bytearray(grp.hash_to_points(grp.encode_items(["a", "b", "c"])))
    pts[32:64] = bytes(32)  # u = 0: the point of order 2
    with pytest.raises(grp.PointError, match="#1"):
        grp.blind(a, bytes(pts))
    with pytest.raises(ValueError, match="multiple of 32"):
        grp.blind(a, b"\x01" * 33)
    with pytest.raises(ValueError, match=r"shape \(n, 32\)"):
        grp.blind(a, np.zeros((2, 31), np.uint8))


@pytest.mark.unit
def test_process_pool_gives_the_inline_results():
    enc = grp.encode_items([f"id{i}" for i in range(500)])
    a = grp.new_scalar()
    inline = grp.BlindPool(0)
    with grp.BlindPool(2) as pool:
        fa = [pool.submit_hash_blind(a, enc[s:s + 100], b"ctx") for s in range(0, 500, 100)]
        got = b"".join(f.result() for f in fa)
        assert got == inline.submit_hash_blind(a, enc, b"ctx").result()
        b = grp.new_scalar()
        assert pool.submit_blind(b, grp.as_array(got)).result() == grp.blind(b, got)
        with pytest.raises(grp.PointError):
            pool.submit_blind(b, bytes(32)).result()


@pytest.mark.unit
def test_match_rows_agrees_with_a_dict_including_prefix_collisions():
    rng = np.random.default_rng(0)
    b = rng.integers(0, 256, (500, 32), dtype=np.uint8)
    a = rng.integers(0, 256, (300, 32), dtype=np.uint8)
    a[::3] = b[rng.permutation(500)[:100]]
    a[1] = b[7]
    a[1, 20] ^= 1  # same first 8 bytes as b[7], different row
    for bb in (b, np.concatenate([b, b[7:8] ^ np.r_[np.zeros(8, np.uint8), np.ones(24, np.uint8)]])):
        ia, ib = psi.match_rows(a, bb)
        where = {bytes(r): j for j, r in reversed(list(enumerate(bb)))}
        want = [(i, where[bytes(r)]) for i, r in enumerate(a) if bytes(r) in where]
        assert list(zip(ia.tolist(), ib.tolist())) == want
    assert len(psi.match_rows(a, b[:0])[0]) == 0


# --------------------------------------------------------------- protocol
test_intersection_equals_python_sets, test_intersection_equals_python_sets_hypothesis = \
    intersection_tests(run_psi, CASES, max_examples=30)


def test_multi_party_everyone_ends_with_the_same_ordered_list():
    rng = np.random.default_rng(1)
    lo_ids = [f"u{v}" for v in rng.integers(0, 400, 300)]
    feats = [[f"u{v}" for v in rng.integers(0, 400, 250)] for _ in range(3)]
    res = run_psi(lo_ids, feats)
    check_result(res, lo_ids, feats)
    assert res["lo"].stats["pair_sizes"] == {f"f{j}": len(set(lo_ids) & set(f)) for j, f in enumerate(feats)}


def test_label_owner_order_and_label_owner_only_mode(wire):
    lo_ids = [9, 3, 7, 3, 1, 8]
    feats = [[1, 3, 8, 9, 2], [8, 9, 3, 1]]
    res = run_psi(lo_ids, feats, order="label_owner")
    want = [9, 3, 1, 8]  # the label owner's first-occurrence order
    assert all(r.ids == want for r in res.values())
    assert res["f0"].rows.tolist() == [3, 1, 0, 2]
    wire.clear()
    res = run_psi(lo_ids, feats, reveal=False)
    assert res["lo"].ids == [1, 3, 8, 9]
    assert all(res[f].ids is None and res[f].rows is None and not res[f].revealed for f in ("f0", "f1"))
    kinds = {e.kind for e in envelopes(wire)}
    assert psi.Kind.RESULT not in kinds and psi.Kind.BLIND_L in kinds


def test_process_pool_protocol_streams_many_chunks():
    lo_ids = [f"a{i}" for i in range(700)]
    f_ids = [f"a{i}" for i in range(350, 1200)]
    res = run_psi(lo_ids, [f_ids], workers=2, chunk=64)
    check_result(res, lo_ids, [f_ids])
    assert res["lo"].stats["workers"] == 2


# ------------------------------------------------------------ on the wire
def _forbidden(raw_ids):
    """Raw ID bytes and every unkeyed hash of an ID a careless implementation might send."""
    return unkeyed_hashes(raw_ids, lambda raw, enc: [
        ("sha256(enc)", hashlib.sha256(enc).digest()), ("blake2b", hashlib.blake2b(raw, digest_size=32).digest()),
        ("blake2b(enc)", hashlib.blake2b(enc, digest_size=32).digest()), ("curve point", grp.hash_to_point(enc))])


def test_nothing_on_the_wire_is_a_raw_id_or_an_unkeyed_hash(wire):
    lo_ids, f_ids, bad = scan_a_run(run_psi, wire, _forbidden)
    # the scan itself finds a leak when there is one
    assert leaks([("x", "y", [b"..." + lo_ids[3].encode() + b"..."])], bad)
    assert leaks([("x", "y", [grp.hash_to_point(grp.encode_item(f_ids[0]))])], bad)


def _points_of(frames, kind):
    return [bytes(r) for e in envelopes(frames) if e.kind == kind for r in e.payload["pts"]]


def test_fresh_scalars_and_shuffles_each_run(wire, monkeypatch):
    lo_ids, f_ids = [f"id{i}" for i in range(200)], [f"id{i}" for i in range(100, 300)]
    run_psi(lo_ids, [f_ids])
    first = {k: _points_of(wire, k) for k in (psi.Kind.BLIND_L, psi.Kind.BLIND_F, psi.Kind.DOUBLE_L)}
    wire.clear()
    run_psi(lo_ids, [f_ids])
    for k, pts in first.items():
        assert len(pts) == 200 and not set(pts) & set(_points_of(wire, k)), k
    # With the scalars pinned, the same values reappear, but in a fresh order: the shuffle is real.
    # (one fixed scalar per party, told apart by run_inmemory's thread names)
    monkeypatch.setattr(grp, "new_scalar", lambda: (b"\x11" if threading.current_thread().name == "party-lo"
                                                    else b"\x22") * 32)
    runs = []
    for _ in range(2):
        wire.clear()
        run_psi(lo_ids, [f_ids])
        runs.append(_points_of(wire, psi.Kind.BLIND_L))
    assert set(runs[0]) == set(runs[1]) and runs[0] != runs[1]
    # ... and the order is not the input order
    assert runs[0] != [grp.blind(b"\x11" * 32, grp.hash_to_points(grp.encode_items([x])))
                       for x in lo_ids]


def test_every_message_matches_the_declarations(wire):
    res = run_psi(list(range(100)), [list(range(50, 130)), list(range(90, 200))], chunk=32)
    assert res["lo"].size == 10
    roles = {"lo": "label_owner", "f0": "feature", "f1": "feature"}
    declared = decl.index(psi.DECLARATIONS)
    seen = set()
    for e in envelopes(wire):
        d = declared[e.kind]
        assert decl.role_ok(roles[e.frm], d.sender) and decl.role_ok(roles[e.to], d.receiver)
        assert decl.check_record(d, e.arrays, {}) is None, (e.kind, e.arrays)
        seen.add(e.kind)
    assert seen == {psi.Kind.SETUP, psi.Kind.SIZE, psi.Kind.BLIND_L, psi.Kind.BLIND_F, psi.Kind.DOUBLE_L,
                    psi.Kind.RESULT}
    blind_l = declared[psi.Kind.BLIND_L]
    assert decl.check_record(blind_l, [("pts", "|u1", (5, 32))], {}) is None
    for bad in ([("|u1", (5, 31))], [("<f8", (5, 32))], [("|u1", (psi.MAX_CHUNK + 1, 32))],
                [("idx", "|u1", (5, 32))]):
        assert decl.check_record(blind_l, bad, {}) is not None
    assert decl.check_record(declared[psi.Kind.RESULT], [("<i8", (3,))], {}) is not None
    assert decl.check_record(declared[psi.Kind.SETUP], [("|u1", (1, 32))], {}) is not None
    # the role names can be those of the algorithm using PSI
    assert {d.sender for d in psi.declarations("host", "guest")} == {("host",), ("guest",)}


# ------------------------------------------------------------ bad input
def test_bad_input_is_refused_with_a_clear_error():
    hub = InMemoryHub({"lo": "label_owner", "f": "feature"})
    p = hub.party("lo", timeout=1.0)
    with pytest.raises(ValueError, match="at least one"):
        psi.psi_label_owner(p, [1], [])
    with pytest.raises(ValueError, match="not peers"):
        psi.psi_label_owner(p, [1], ["nobody"])
    with pytest.raises(ValueError, match="order"):
        psi.psi_label_owner(p, [1], ["f"], order="random")
    with pytest.raises(ValueError, match="chunk"):
        psi.psi_label_owner(p, [1], ["f"], chunk=0)
    with pytest.raises(TypeError, match="label owner 'lo'.*position 1.*float"):
        psi.psi_label_owner(p, [1, 2.5], ["f"])
    with pytest.raises(TypeError, match="not a single str"):
        psi.psi_label_owner(p, "abc", ["f"])
    with pytest.raises(FederationFailed, match="'f0'"):
        run_psi([1, 2], [[1, None]])


# --------------------------------------------------------- the runnable job
def test_psi_job_in_memory_three_parties():
    from fedhet.algorithms import psi_job

    cfg = {"n": 400, "seed": 3}
    res = run_inmemory(psi_job, [("owner", "label_owner"), ("f1", "feature"), ("f2", "feature")], cfg=cfg)
    assert {r["ids_sha256"] for r in res.values()} != set()
    assert len({r["ids_sha256"] for r in res.values()}) == 1
    assert all(r["correct"] and r["rows_aligned"] and r["size"] == 200 for r in res.values())
    one = run_inmemory(psi_job, [("owner", "label_owner"), ("f1", "feature")], cfg=cfg | {"id_type": "int"})
    assert all(r["correct"] and r["size"] == 240 for r in one.values())  # core + the pair block


@pytest.mark.processes
@pytest.mark.smoke   # make test's process run of this family
def test_psi_preset_runs_as_processes_and_passes_the_audit(tmp_path):
    psi_job_as_processes(tmp_path / "run", {"n": 500},
                         {psi.Kind.BLIND_L, psi.Kind.BLIND_F, psi.Kind.DOUBLE_L, psi.Kind.RESULT}, timeout=120)


def test_integer_id_too_long_for_python_is_named_with_party_and_position():
    """Issue 11 item 11: an int ID of more than 4,300 digits used to fail inside str() with
    Python's own message, naming neither the party nor the ID's position."""
    huge = 10 ** 5000
    with pytest.raises(ValueError, match=r"ID at position 3: an integer ID of about 5001 digits.*at most 4300"):
        grp.encode_items([1, 2, 3, huge])
    with pytest.raises(ValueError, match="at most 4300 digits"):
        grp.encode_item(huge)
    with pytest.raises(FederationFailed) as ei:
        run_psi([1, 2, 3], [[4, 2, "x", huge, 1]])
    err = ei.value.failures["f0"]
    assert isinstance(err, ValueError)
    assert "feature party 'f0'" in str(err) and "position 3" in str(err) and "str or bytes" in str(err)
    # the same ID as a string works
    text = "1" + "0" * 5000
    res = run_psi([1, text], [[text, 2]])
    assert res["lo"].ids == [text]


def test_backend_switch_refuses_an_unknown_backend_and_both_backends_agree():
    """Issue 16: ``backend`` selects ECDH (default) or KKRT16; an unknown name is refused up front."""
    hub = InMemoryHub({"lo": "label_owner", "f": "feature"})
    with pytest.raises(ValueError, match="backend.*'rsa'"):
        psi.psi_label_owner(hub.party("lo", timeout=1.0), [1], ["f"], backend="rsa")
    with pytest.raises(ValueError, match="backend"):
        psi.psi_feature_party(hub.party("f", timeout=1.0), [1], "lo", backend="")

    def run(backend):
        algo = types.SimpleNamespace(NAME="psi_backend_test", load_data=None, ROLES={
            "label_owner": lambda party, cfg, ids: psi.psi_label_owner(
                party, ids, party.peers_with_role("feature"), workers=0, backend=backend),
            "feature": lambda party, cfg, ids: psi.psi_feature_party(
                party, ids, "lo", workers=0, backend=backend)})
        return run_inmemory(algo, [("lo", "label_owner"), ("f0", "feature")], cfg={},
                            data={"lo": [5, "a", 9, 3, b"x"], "f0": [b"x", 3, "a", 4]}, timeout=30.0)

    e, k, r = run("ecdh"), run("kkrt"), run("rr22")
    assert k["lo"].stats["backend"] == "kkrt" and e["lo"].stats["backend"] == e["f0"].stats["backend"] == "ecdh"
    assert [x.ids for x in e.values()] == [x.ids for x in k.values()] == [x.ids for x in r.values()] == [[3, b"x", "a"]] * 2
    for res in (e, k, r):   # every timing in the project's one convention, <phase>_s (what the report reads)
        for side in res.values():
            assert "total_s" in side.stats and not [t for t in side.stats if "seconds" in t], side.stats


@pytest.mark.parametrize("lo_backend,f_backend", [("kkrt", "ecdh"), ("rr22", "ecdh"), ("ecdh", "rr22"),
                                                  ("kkrt", "rr22"), ("kkrt", "auto"), ("auto", "kkrt")])
def test_a_backend_mismatch_through_the_api_fails_at_once_naming_both(lo_backend, f_backend):
    """Issue 43, item 9: a label owner on one backend and a feature party on another, through the Python
    API (no federation file, so no fingerprint): each side used to wait out its timeout and call the
    other silent.  The feature party's first receive takes any backend's setup and names both
    backends at once; nobody is blamed (which side is misconfigured is not provable).  The timeout
    is an hour, on the virtual clock: a run that waits for it fails the test's own check below."""
    algo = types.SimpleNamespace(NAME="psi_mismatch_test", load_data=None, ROLES={
        "label_owner": lambda party, cfg, ids: psi.psi_label_owner(
            party, ids, party.peers_with_role("feature"), workers=0, backend=lo_backend),
        "feature": lambda party, cfg, ids: psi.psi_feature_party(party, ids, "lo", workers=0, backend=f_backend)})
    with pytest.raises(FederationFailed) as e:
        run_inmemory(algo, [("lo", "label_owner"), ("f0", "feature")], cfg={},
                     data={"lo": [1, 2, 3], "f0": [2, 3, 4]}, timeout=3600.0, clock="virtual")
    err = e.value.failures["f0"]
    assert isinstance(err, ProtocolMismatch), err
    lo_sent = psi.choose_backend(3) if lo_backend == "auto" else lo_backend   # the backend its first message names
    assert f"PSI backend {f_backend!r}" in str(err) or "PSI backend 'auto (ecdh or rr22)'" in str(err), err
    assert repr(lo_sent) in str(err)
    assert e.value.verdict["party"] is None
    assert not any(isinstance(x, PeerTimeout) for x in e.value.failures.values()), e.value.failures


@pytest.mark.parametrize("f_backend", ["auto", "ecdh", "rr22"])
def test_auto_lets_the_label_owner_choose_by_its_size_and_the_feature_parties_follow(f_backend, monkeypatch):
    """Issue 49: ``backend="auto"``: the label owner runs rr22 from AUTO_RR22_FROM IDs (lowered here to keep
    the sets small), ecdh below; its first message names the choice and a feature party on ``"auto"``
    runs the same; one that named a backend explicitly runs with an "auto" label owner when they agree
    (and fails at once naming both when not).  Every party ends with Python's intersection and records
    the backend in force."""
    monkeypatch.setattr(psi_common, "AUTO_RR22_FROM", 12)
    assert [psi.choose_backend(n) for n in (0, 11, 12, psi_common.RR22_MAX_ITEMS, psi_common.RR22_MAX_ITEMS + 1)] \
        == ["ecdh", "ecdh", "rr22", "rr22", "ecdh"]
    algo = types.SimpleNamespace(NAME="psi_auto_test", load_data=None, ROLES={
        "label_owner": lambda party, cfg, ids: psi.psi_label_owner(
            party, ids, party.peers_with_role("feature"), workers=0, backend="auto"),
        "feature": lambda party, cfg, ids: psi.psi_feature_party(party, ids, "lo", workers=0, backend=f_backend)})
    for lo_ids, want in ((list(range(5)), "ecdh"), (list(range(30)), "rr22")):
        feats = [[3, 4, 1, 99, 2], list(range(2, 40, 3))]
        if f_backend not in ("auto", want):
            with pytest.raises(FederationFailed) as e:
                run_inmemory(algo, [("lo", "label_owner"), ("f0", "feature"), ("f1", "feature")], cfg={},
                             data={"lo": lo_ids, "f0": feats[0], "f1": feats[1]}, timeout=3600.0, clock="virtual")
            assert isinstance(e.value.failures["f0"], ProtocolMismatch) and repr(want) in str(e.value.failures["f0"])
            continue
        res = run_inmemory(algo, [("lo", "label_owner"), ("f0", "feature"), ("f1", "feature")], cfg={},
                           data={"lo": lo_ids, "f0": feats[0], "f1": feats[1]}, timeout=60.0)
        check_result(res, lo_ids, feats)
        assert {r.stats["backend"] for r in res.values()} == {want}
        assert res["lo"].stats["backend_setting"] == "auto"
        assert ("backend_setting" in res["f0"].stats) == (f_backend == "auto")


def test_auto_declares_the_kinds_of_both_backends_it_may_choose_and_describes_itself():
    kinds = {d.kind for d in psi.declarations("lo", "f", backend="auto")}
    assert kinds == {d.kind for d in psi.declarations("lo", "f", backend="ecdh")} | \
        {d.kind for d in psi.declarations("lo", "f", backend="rr22")}
    assert not kinds & {d.kind for d in psi.declarations("lo", "f", backend="kkrt")}
    assert str(psi.AUTO_RR22_FROM) in psi.describe_backend("auto")
    assert "rr22" in psi.describe_backend("rr22") and "every size" in psi.describe_backend("ecdh")
    with pytest.raises(ValueError, match="'fast'"):
        psi.describe_backend("fast")
