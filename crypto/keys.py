"""Key agreement, signatures, sealed messages and key files.

Thin, documented wrappers over ``cryptography`` (OpenSSL):

* **X25519 + HKDF-SHA256** (:func:`agree`): both parties derive the same
  symmetric key from their own private key and the other's public key.  The
  HKDF ``info`` binds a fixed label, both public keys (sorted, so the result
  does not depend on who calls) and a caller context such as a protocol name
  and round, so keys for different purposes are independent.
* **Ed25519** (:func:`sign`, :func:`verify`): 64-byte signatures over bytes.
* **AEAD** (:func:`seal`, :func:`open_sealed`): AES-256-GCM with a random
  96-bit nonce prepended to the ciphertext (``nonce || ciphertext || tag``,
  28 bytes of overhead).  Associated data (e.g. sender, receiver, kind,
  round) is authenticated but not encrypted; tampering with either raises
  :class:`AuthenticationError`.  Random 96-bit nonces are safe for up to
  2**32 messages per key; one message is at most 2**31 - 1 bytes.
* **Raw bytes and files**: 32-byte raw encodings for every key, PEM (PKCS#8 /
  SubjectPublicKeyInfo) or raw key files.  :func:`private_key_file` and
  :func:`public_key_file` give a file's bytes (``fedhet.parties.keys`` writes them
  atomically, private ones with mode 0600); private key files are, by default,
  refused on load when group or others can read them.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Union

from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "KEY_BYTES", "NONCE_BYTES", "TAG_BYTES", "SEAL_OVERHEAD", "AuthenticationError",
    "generate_x25519", "generate_ed25519", "agree",
    "sign", "verify", "seal", "open_sealed", "new_aead_key",
    "public_bytes", "private_bytes", "public_key_from_bytes", "private_key_from_bytes",
    "private_key_file", "load_private_key", "public_key_file", "load_public_key",
]

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
SEAL_OVERHEAD = NONCE_BYTES + TAG_BYTES
_AGREE_LABEL = b"fedhet/x25519-hkdf-sha256/v1"
_KINDS = ("x25519", "ed25519")

PrivateKey = Union[X25519PrivateKey, Ed25519PrivateKey]
PublicKey = Union[X25519PublicKey, Ed25519PublicKey]
_Bytes = (bytes, bytearray, memoryview)


class AuthenticationError(ValueError):
    """A sealed message failed authentication (wrong key, tampered data or associated data)."""


# -- generation and raw bytes -------------------------------------------------
def generate_x25519() -> X25519PrivateKey:
    """A fresh X25519 private key (for :func:`agree`)."""
    return X25519PrivateKey.generate()


def generate_ed25519() -> Ed25519PrivateKey:
    """A fresh Ed25519 private key (for :func:`sign`)."""
    return Ed25519PrivateKey.generate()


def _kind(key) -> str:
    if isinstance(key, (X25519PrivateKey, X25519PublicKey)):
        return "x25519"
    if isinstance(key, (Ed25519PrivateKey, Ed25519PublicKey)):
        return "ed25519"
    raise TypeError(f"expected an X25519 or Ed25519 key, got {type(key).__name__}")


def public_bytes(key: PrivateKey | PublicKey) -> bytes:
    """Raw 32-byte public key of a private or public X25519/Ed25519 key."""
    _kind(key)
    if isinstance(key, (X25519PrivateKey, Ed25519PrivateKey)):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def private_bytes(key: PrivateKey) -> bytes:
    """Raw 32-byte private key (keep it secret)."""
    if not isinstance(key, (X25519PrivateKey, Ed25519PrivateKey)):
        raise TypeError(f"expected an X25519 or Ed25519 private key, got {type(key).__name__}")
    return key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                             serialization.NoEncryption())


def _check_kind(kind: str) -> str:
    if kind not in _KINDS:
        raise ValueError(f"key kind must be one of {_KINDS}, got {kind!r}")
    return kind


def _raw32(data, what: str) -> bytes:
    if not isinstance(data, _Bytes):
        raise TypeError(f"{what} must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) != KEY_BYTES:
        raise ValueError(f"{what} must be {KEY_BYTES} raw bytes, got {len(data)}")
    return data


def public_key_from_bytes(data: bytes, kind: str) -> PublicKey:
    """Public key from its 32 raw bytes; ``kind`` is "x25519" or "ed25519"."""
    data = _raw32(data, f"{kind} public key")
    cls = X25519PublicKey if _check_kind(kind) == "x25519" else Ed25519PublicKey
    return cls.from_public_bytes(data)


def private_key_from_bytes(data: bytes, kind: str) -> PrivateKey:
    """Private key from its 32 raw bytes; ``kind`` is "x25519" or "ed25519"."""
    data = _raw32(data, f"{kind} private key")
    cls = X25519PrivateKey if _check_kind(kind) == "x25519" else Ed25519PrivateKey
    return cls.from_private_bytes(data)


def _as_public(key, kind: str):
    if isinstance(key, _Bytes):
        return public_key_from_bytes(bytes(key), kind)
    if isinstance(key, (X25519PrivateKey, Ed25519PrivateKey)):
        key = key.public_key()
    if _kind(key) != kind:
        raise TypeError(f"expected an {kind} public key, got {type(key).__name__}")
    return key


# -- X25519 + HKDF ---------------------------------------------------------------
def agree(private_key: X25519PrivateKey, peer_public: X25519PublicKey | bytes, info: bytes = b"",
          length: int = 32, salt: bytes | None = None) -> bytes:
    """Shared symmetric key of ``length`` bytes from X25519 then HKDF-SHA256.

    Both sides get the same bytes when they pass the same ``info`` (context:
    protocol, round...) and ``salt``.  Raises ValueError for a peer key of
    low order (the all-zero shared secret).
    """
    if not isinstance(private_key, X25519PrivateKey):
        raise TypeError(f"agree needs an X25519 private key, got {type(private_key).__name__}")
    if not isinstance(info, _Bytes):
        raise TypeError("info must be bytes")
    if not isinstance(length, int) or not 1 <= length <= 255 * 32:
        raise ValueError(f"derived key length must be in [1, 8160] bytes, got {length!r}")
    peer = _as_public(peer_public, "x25519")
    shared = private_key.exchange(peer)  # cryptography rejects an all-zero result
    mine, theirs = public_bytes(private_key), public_bytes(peer)
    lo, hi = sorted((mine, theirs))
    hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=salt,
                info=_AGREE_LABEL + lo + hi + bytes(info))
    return hkdf.derive(shared)


# -- Ed25519 ---------------------------------------------------------------------
def sign(private_key: Ed25519PrivateKey, message: bytes) -> bytes:
    """64-byte Ed25519 signature of ``message``."""
    if not isinstance(private_key, Ed25519PrivateKey):
        raise TypeError(f"sign needs an Ed25519 private key, got {type(private_key).__name__}")
    return private_key.sign(bytes(message))


def verify(public_key: Ed25519PublicKey | bytes, message: bytes, signature: bytes) -> bool:
    """True iff ``signature`` is a valid Ed25519 signature of ``message`` under ``public_key``."""
    key = _as_public(public_key, "ed25519")
    if not isinstance(signature, _Bytes) or len(signature) != 64:
        return False
    try:
        key.verify(bytes(signature), bytes(message))
    except InvalidSignature:
        return False
    return True


# -- AEAD ------------------------------------------------------------------------
def new_aead_key() -> bytes:
    """A fresh random 32-byte AEAD key."""
    return os.urandom(KEY_BYTES)


def seal(key: bytes, plaintext: bytes, aad: bytes = b"") -> bytes:
    """AES-256-GCM encrypt: returns ``nonce || ciphertext || tag``."""
    key = _raw32(key, "AEAD key")
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, bytes(plaintext), bytes(aad))


def open_sealed(key: bytes, sealed: bytes, aad: bytes = b"") -> bytes:
    """Decrypt the output of :func:`seal`; AuthenticationError if anything was altered."""
    key = _raw32(key, "AEAD key")
    sealed = bytes(sealed)
    if len(sealed) < SEAL_OVERHEAD:
        raise AuthenticationError(f"sealed message too short ({len(sealed)} bytes, need >= {SEAL_OVERHEAD})")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], bytes(aad))
    except InvalidTag:
        raise AuthenticationError("sealed message failed authentication (wrong key, or data/aad tampered)") from None


# -- key files -------------------------------------------------------------------
def private_key_file(key: PrivateKey, fmt: str = "pem", password: bytes | None = None) -> bytes:
    """The bytes of a private key file: ``fmt`` "pem" (PKCS#8, optionally encrypted) or "raw"."""
    _kind(key)
    if fmt == "pem":
        enc = (serialization.BestAvailableEncryption(password) if password
               else serialization.NoEncryption())
        data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc)
    elif fmt == "raw":
        if password:
            raise ValueError("raw key files cannot be password-protected; use fmt='pem'")
        data = private_bytes(key)
    else:
        raise ValueError(f"key file format must be 'pem' or 'raw', got {fmt!r}")
    return data


def public_key_file(key: PrivateKey | PublicKey, fmt: str = "pem") -> bytes:
    """The bytes of a public key file: "pem" (SubjectPublicKeyInfo) or "raw"."""
    _kind(key)
    if isinstance(key, (X25519PrivateKey, Ed25519PrivateKey)):
        key = key.public_key()
    if fmt == "pem":
        data = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    elif fmt == "raw":
        data = public_bytes(key)
    else:
        raise ValueError(f"key file format must be 'pem' or 'raw', got {fmt!r}")
    return data


def _check_private_mode(path: Path) -> None:
    if os.name != "posix":
        return
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise PermissionError(
            f"private key file {path} has mode {mode:#o}: group/others can access it; run chmod 600 on it"
        )


def load_private_key(path, kind: str | None = None, password: bytes | None = None,
                     check_permissions: bool = True) -> PrivateKey:
    """Read a private key file written by :func:`save_private_key`.

    PEM files carry their type; raw 32-byte files need ``kind``.  With
    ``check_permissions`` a file readable by group or others is refused.
    """
    path = Path(path)
    if check_permissions:
        _check_private_mode(path)
    data = path.read_bytes()
    if data.lstrip().startswith(b"-----BEGIN"):
        key = serialization.load_pem_private_key(data, password=password)
        if not isinstance(key, (X25519PrivateKey, Ed25519PrivateKey)):
            raise ValueError(f"{path}: not an X25519 or Ed25519 private key ({type(key).__name__})")
        if kind is not None and _kind(key) != _check_kind(kind):
            raise ValueError(f"{path}: holds an {_kind(key)} key, expected {kind}")
        return key
    if kind is None:
        raise ValueError(f"{path}: raw key file, pass kind='x25519' or 'ed25519'")
    return private_key_from_bytes(data, kind)


def load_public_key(path, kind: str | None = None) -> PublicKey:
    """Read a public key file (PEM, or raw 32 bytes with ``kind``)."""
    path = Path(path)
    data = path.read_bytes()
    if data.lstrip().startswith(b"-----BEGIN"):
        key = serialization.load_pem_public_key(data)
        if not isinstance(key, (X25519PublicKey, Ed25519PublicKey)):
            raise ValueError(f"{path}: not an X25519 or Ed25519 public key ({type(key).__name__})")
        if kind is not None and _kind(key) != _check_kind(kind):
            raise ValueError(f"{path}: holds an {_kind(key)} key, expected {kind}")
        return key
    if kind is None:
        raise ValueError(f"{path}: raw key file, pass kind='x25519' or 'ed25519'")
    return public_key_from_bytes(data, kind)
