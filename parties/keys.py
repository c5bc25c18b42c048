"""Party key files: a CURVE key pair for the transport, an Ed25519 pair for transcripts.

Files in the key directory, per party ``N``::

    N.curve.key   Z85 CURVE secret key   (mode 0600)
    N.curve.pub   Z85 CURVE public key
    N.sign.key    Ed25519 private key, raw 32 bytes as hex (mode 0600)
    N.sign.pub    Ed25519 public key, hex

The public halves also go into the federation file, so every party pins
every other party's keys without trusting the network.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.utils.z85
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .atomic import write_atomic



class KeyError_(FileNotFoundError):
    """A key file is missing or unreadable; the message names it."""


@dataclass
class PublicKeys:
    curve: str  # Z85
    sign: str   # hex

    def as_dict(self) -> dict:
        return {"public_key": self.curve, "sign_key": self.sign}


def generate(key_dir: str | os.PathLike, name: str, overwrite: bool = False) -> PublicKeys:
    d = Path(key_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    secret_files = [d / f"{name}.curve.key", d / f"{name}.sign.key"]
    if not overwrite and any(p.exists() for p in secret_files):
        raise FileExistsError(f"keys for {name!r} already exist in {d} (pass --force to replace them)")
    pub, sec = zmq.curve_keypair()
    write_atomic(d / f"{name}.curve.key", sec + b"\n", mode=0o600)
    write_atomic(d / f"{name}.curve.pub", pub + b"\n", mode=0o644)
    sk = Ed25519PrivateKey.generate()
    raw = sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                           serialization.NoEncryption())
    write_atomic(d / f"{name}.sign.key", raw.hex() + "\n", mode=0o600)
    spub = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    write_atomic(d / f"{name}.sign.pub", spub + "\n", mode=0o644)
    return PublicKeys(pub.decode(), spub)


def exists(key_dir: str | os.PathLike, name: str) -> bool:
    """Whether ``key_dir`` holds all four key files of party ``name``."""
    d = Path(key_dir)
    return all((d / f"{name}.{s}").is_file() for s in ("curve.key", "curve.pub", "sign.key", "sign.pub"))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        raise KeyError_(f"cannot read key file {path}: {e.strerror}") from None


def load_public(key_dir: str | os.PathLike, name: str) -> PublicKeys:
    d = Path(key_dir)
    return PublicKeys(_read(d / f"{name}.curve.pub"), _read(d / f"{name}.sign.pub"))


def load_curve_secret(key_dir: str | os.PathLike, name: str) -> bytes:
    p = Path(key_dir) / f"{name}.curve.key"
    k = _read(p).encode()
    if len(k) != 40:
        raise KeyError_(f"{p} is not a Z85 CURVE secret key (40 characters)")
    _check_private_mode(p)
    return k


def load_signing_key(key_dir: str | os.PathLike, name: str) -> Ed25519PrivateKey:
    p = Path(key_dir) / f"{name}.sign.key"
    try:
        raw = bytes.fromhex(_read(p))
        _check_private_mode(p)
        return Ed25519PrivateKey.from_private_bytes(raw)
    except ValueError:
        raise KeyError_(f"{p} is not a hex Ed25519 private key") from None


def verify_key(hex_public: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(hex_public))
    except ValueError:
        raise ValueError(f"{hex_public!r} is not a hex Ed25519 public key") from None


def curve_public_ok(z85: str) -> bool:
    try:
        return len(zmq.utils.z85.decode(z85.encode())) == 32
    except Exception:
        return False


def _check_private_mode(p: Path) -> None:
    mode = p.stat().st_mode & 0o777
    if mode & 0o077:
        raise PermissionError(f"secret key file {p} has mode {oct(mode)}; it must be 0600 (chmod 600 {p})")
