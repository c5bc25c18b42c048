"""The peer comparison benchmark's correctness checks (``benchmarks/peers.py``), whatever peers are installed.

The benchmark times nothing before its checks pass; these tests make sure the checks can fail:
a wrong decryption, a result off by more than the tolerance, a NaN, a wrong shape, a tampered
Shamir share are all rejected, and the fedhet paths the benchmark times pass them.  Missing peers
give None and a "pip install" note, never an error.  No timing here.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

from benchmarks import peers
from fedhet.crypto.field import P61
from fedhet.crypto.paillier import PaillierContext, generate_keypair
from fedhet.crypto.shamir import reconstruct, share

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def test_check_ints_rejects_a_wrong_or_missing_value():
    vals = [3, -(1 << 51), 7]
    peers.check_ints("ok", np.array(vals, dtype=np.float64), vals)
    with pytest.raises(AssertionError, match="at index 1"):
        peers.check_ints("off by one", [3, -(1 << 51) + 1, 7], vals)
    with pytest.raises(AssertionError, match="2 values for 3"):
        peers.check_ints("short", vals[:2], vals)


def test_check_close_rejects_error_beyond_tolerance_nan_and_shape():
    want = np.arange(6.0).reshape(2, 3)
    assert peers.check_close("ok", want + 1e-4, want, 1e-3) == pytest.approx(1e-4)
    with pytest.raises(AssertionError, match="exceeds"):
        peers.check_close("far", want + 2e-3, want, 1e-3)
    bad = want.copy()
    bad[0, 0] = np.nan
    with pytest.raises(AssertionError, match="exceeds"):
        peers.check_close("nan", bad, want, 1e-3)
    with pytest.raises(AssertionError, match="shape"):
        peers.check_close("shape", want.T, want, 1e-3)


def test_check_shamir_passes_fedhet_and_rejects_a_tampered_share():
    secret = np.random.default_rng(0).integers(0, P61, 1000, dtype=np.uint64)
    sh = share(secret, 5, 3)
    peers.check_shamir("fedhet", reconstruct(sh[[0, 2, 4]], [1, 3, 5]), secret)
    sh[2, 17] = (int(sh[2, 17]) + 1) % P61
    with pytest.raises(AssertionError, match="differs from the secret"):
        peers.check_shamir("tampered", reconstruct(sh[[0, 2, 4]], [1, 3, 5]), secret)


@pytest.mark.parametrize("obfuscation", ["short_exponent", "standard"])
@pytest.mark.parametrize("owner", [False, True])
def test_fedhet_integer_path_decrypts_exactly_and_a_wrong_plaintext_is_caught(obfuscation, owner):
    pk, sk = generate_keypair(512)
    vals = [0, 1, -1, peers.INT_BOUND - 1, -(peers.INT_BOUND - 1), 123456789]
    dec = PaillierContext(pk, sk)
    with PaillierContext(pk, sk if owner else None, obfuscation=obfuscation) as ctx:
        enc = ctx.encrypt(np.asarray(vals, dtype=np.float64), peers.INT_SPEC)
        assert enc.n_ciphertexts == len(vals)  # one integer per ciphertext
        got = dec.decrypt(enc)
    dec.close()
    peers.check_ints("fedhet", got, vals)
    with pytest.raises(AssertionError):
        peers.check_ints("fedhet", got, vals[:-1] + [vals[-1] + 1])


def test_layer_weights_never_quantise_to_zero_and_fixed_point_round_trips():
    _, W = peers.layer_data(8, 16, 16)
    assert all(v != 0 for v in peers.fixed(W))  # pypaillier refuses a zero scalar
    assert peers.fixed([1.5, -0.25]) == [3 << (peers.FRAC - 1), -(1 << (peers.FRAC - 2))]


def test_flower_error_bound_shrinks_with_finer_quantisation():
    ws = {"a": 10.0, "b": 100.0, "c": 1.0}
    coarse = peers.flower_error_bound(ws, 4.0, 100.0, 1 << 16)
    fine = peers.flower_error_bound(ws, 4.0, 100.0, 1 << 22)
    assert 0 < fine < coarse < 1


def test_a_missing_peer_is_none_with_a_pip_note_and_argv_is_kept():
    argv = list(sys.argv)
    assert peers.peer("fedhet_no_such_peer_module") is None
    assert sys.argv == argv
    assert peers.missing("heu") == "not installed (pip install sf-heu)"
    versions = peers.peer_versions()
    assert set(versions) == set(peers.PEER_LABEL.values())
    for v in versions.values():
        assert v["importable"] or "pip install" in v["note"] or v["note"] == "installed but does not import"


def test_psi_section_sets_each_spu_row_against_fedhets_and_says_when_spu_is_missing():
    meta = {"machine": "m", "when": "w", "command": "c"}
    rows = [{"library": "fedhet", "protocol": "RR22", "log2n": 20, "seconds": 5.0, "cpu_s": 9.0, "mb": 34.4,
             "what": "PSI call"},
            {"library": "spu 0.9.5", "protocol": "RR22", "log2n": 20, "seconds": 10.0, "cpu_s": 17.0, "mb": 36.6,
             "what": "psi_execute"},
            {"library": "spu 0.9.5", "protocol": "KKRT", "log2n": 20, "note": "failed (exit 1): boom"}]
    md = peers.markdown({"meta": meta, "args": {}, "peers": {}, "psi": rows})
    assert "| spu 0.9.5 | RR22 | 2^20 | 10.00 | 17.0 | 36.6 | 2.00 | 1.06 | psi_execute |" in md
    assert "failed (exit 1): boom" in md and "SPU not measured" not in md
    md = peers.markdown({"meta": meta, "args": {}, "peers": {}, "psi": rows[:1], "spu_note": "spu is not importable"})
    assert "SPU not measured: spu is not importable." in md


def test_spu_python_prefers_the_flag_then_the_environment(monkeypatch):
    monkeypatch.setenv("FEDHET_SPU_PYTHON", "/env/python")
    assert peers.spu_python("/flag/python") == "/flag/python"
    assert peers.spu_python(None) == "/env/python"
    monkeypatch.delenv("FEDHET_SPU_PYTHON")
    monkeypatch.setattr(peers, "peer", lambda module: None)
    assert peers.spu_python(None) is None
