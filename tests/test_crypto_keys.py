"""X25519 + HKDF agreement, Ed25519 signatures, AEAD sealing, key (de)serialisation and files."""
from __future__ import annotations

import os
import stat

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from fedhet.crypto import keys
from fedhet.crypto.keys import (SEAL_OVERHEAD, AuthenticationError, agree, generate_ed25519, generate_x25519,
                                load_private_key, load_public_key, new_aead_key, open_sealed, private_bytes,
                                private_key_from_bytes, public_bytes, public_key_from_bytes, seal, sign, verify)
from fedhet.parties.keys import save_private_key, save_public_key

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def test_x25519_both_sides_derive_the_same_key():
    a, b, c = generate_x25519(), generate_x25519(), generate_x25519()
    k_ab = agree(a, b.public_key(), info=b"secagg/round-1")
    k_ba = agree(b, public_bytes(a), info=b"secagg/round-1")
    assert k_ab == k_ba and len(k_ab) == 32
    assert agree(a, b.public_key(), info=b"secagg/round-2") != k_ab
    assert agree(a, c.public_key(), info=b"secagg/round-1") != k_ab
    assert agree(c, b.public_key(), info=b"secagg/round-1") != k_ab
    assert len(agree(a, b.public_key(), length=64)) == 64


def test_agreement_is_hkdf_of_the_raw_exchange():
    # Plain computation of the documented derivation.
    a, b = generate_x25519(), generate_x25519()
    lo, hi = sorted([public_bytes(a), public_bytes(b)])
    ref = HKDF(hashes.SHA256(), 32, salt=b"s", info=b"fedhet/x25519-hkdf-sha256/v1" + lo + hi + b"ctx").derive(
        a.exchange(b.public_key()))
    assert agree(a, b.public_key(), info=b"ctx", salt=b"s") == ref


def test_low_order_peer_key_is_rejected():
    with pytest.raises(ValueError):
        agree(generate_x25519(), bytes(32))


def test_ed25519_sign_verify_and_rejections():
    sk, other = generate_ed25519(), generate_ed25519()
    msg = b"transcript head \x00\x01"
    sig = sign(sk, msg)
    assert len(sig) == 64
    assert verify(sk.public_key(), msg, sig)
    assert verify(public_bytes(sk), msg, sig)
    assert not verify(sk.public_key(), msg + b"!", sig)
    assert not verify(sk.public_key(), b"transcript head \x00\x02", sig)
    flipped = bytes([sig[0] ^ 1]) + sig[1:]
    assert not verify(sk.public_key(), msg, flipped)
    assert not verify(other.public_key(), msg, sig)
    assert not verify(sk.public_key(), msg, sig[:63])
    with pytest.raises(TypeError, match="ed25519"):
        verify(generate_x25519().public_key(), msg, sig)


def test_aead_roundtrip_and_tamper_detection():
    key = new_aead_key()
    msg, aad = os.urandom(1000), b"from=a;to=b;kind=share;round=3"
    sealed = seal(key, msg, aad)
    assert len(sealed) == len(msg) + SEAL_OVERHEAD
    assert open_sealed(key, sealed, aad) == msg
    assert seal(key, msg, aad) != sealed  # fresh nonce each time
    for i in (0, 12, 500, len(sealed) - 1):  # nonce, ciphertext body, tag
        bad = bytearray(sealed)
        bad[i] ^= 0x40
        with pytest.raises(AuthenticationError):
            open_sealed(key, bytes(bad), aad)
    with pytest.raises(AuthenticationError):
        open_sealed(key, sealed, b"from=c;to=b;kind=share;round=3")
    with pytest.raises(AuthenticationError):
        open_sealed(new_aead_key(), sealed, aad)
    with pytest.raises(AuthenticationError, match="too short"):
        open_sealed(key, sealed[:10], aad)
    assert open_sealed(key, seal(key, b""), b"") == b""
    with pytest.raises(ValueError, match="32 raw bytes"):
        seal(b"short", msg)


def test_pairwise_sealed_message_with_agreed_key():
    a, b = generate_x25519(), generate_x25519()
    k_a = agree(a, b.public_key(), info=b"seal")
    k_b = agree(b, a.public_key(), info=b"seal")
    assert open_sealed(k_b, seal(k_a, b"share for b", b"a->b"), b"a->b") == b"share for b"


@pytest.mark.parametrize("kind,gen", [("x25519", generate_x25519), ("ed25519", generate_ed25519)])
def test_raw_bytes_roundtrip(kind, gen):
    sk = gen()
    raw_sk, raw_pk = private_bytes(sk), public_bytes(sk)
    assert len(raw_sk) == 32 and len(raw_pk) == 32
    assert public_bytes(private_key_from_bytes(raw_sk, kind)) == raw_pk
    assert public_bytes(public_key_from_bytes(raw_pk, kind)) == raw_pk
    with pytest.raises(ValueError, match="32 raw bytes"):
        public_key_from_bytes(raw_pk[:31], kind)
    with pytest.raises(ValueError, match="kind"):
        public_key_from_bytes(raw_pk, "rsa")


@pytest.mark.parametrize("fmt", ["pem", "raw"])
@pytest.mark.parametrize("kind,gen", [("x25519", generate_x25519), ("ed25519", generate_ed25519)])
def test_key_files(tmp_path, fmt, kind, gen):
    sk = gen()
    sk_path, pk_path = tmp_path / f"party.{fmt}", tmp_path / f"party.pub.{fmt}"
    save_private_key(sk_path, sk, fmt=fmt)
    save_public_key(pk_path, sk, fmt=fmt)
    assert stat.S_IMODE(os.stat(sk_path).st_mode) == 0o600
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    loaded = load_private_key(sk_path, kind=kind)
    assert private_bytes(loaded) == private_bytes(sk)
    assert public_bytes(load_public_key(pk_path, kind=kind)) == public_bytes(sk)
    if fmt == "raw":
        with pytest.raises(ValueError, match="pass kind"):
            load_private_key(sk_path)
    else:
        assert private_bytes(load_private_key(sk_path)) == private_bytes(sk)
        other = "ed25519" if kind == "x25519" else "x25519"
        with pytest.raises(ValueError, match="expected"):
            load_private_key(sk_path, kind=other)


def test_private_key_file_with_open_permissions_is_refused(tmp_path):
    path = tmp_path / "k.pem"
    save_private_key(path, generate_ed25519())
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        load_private_key(path)
    assert load_private_key(path, check_permissions=False) is not None


def test_password_protected_pem(tmp_path):
    path = tmp_path / "k.pem"
    sk = generate_x25519()
    save_private_key(path, sk, password=b"correct horse")
    assert b"ENCRYPTED" in path.read_bytes()
    assert private_bytes(load_private_key(path, password=b"correct horse")) == private_bytes(sk)
    with pytest.raises((ValueError, TypeError)):
        load_private_key(path, password=b"wrong")
    with pytest.raises(ValueError, match="password"):
        save_private_key(tmp_path / "k.raw", sk, fmt="raw", password=b"x")


def test_argument_type_errors():
    with pytest.raises(TypeError, match="X25519 private key"):
        agree(generate_ed25519(), generate_x25519().public_key())
    with pytest.raises(TypeError, match="Ed25519 private key"):
        sign(generate_x25519(), b"m")
    with pytest.raises(ValueError, match="format"):
        keys.public_key_file(generate_x25519(), fmt="der")
