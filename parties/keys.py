"""Party key files: a CURVE key pair for the transport, an Ed25519 pair for transcripts.

Files in the key directory, per party ``N``::

    N.curve.key   Z85 CURVE secret key   (mode 0600)
    N.curve.pub   Z85 CURVE public key
    N.sign.key    Ed25519 private key, raw 32 bytes as hex (mode 0600)
    N.sign.pub    Ed25519 public key, hex

The public halves also go into the federation file, so every party pins
every other party's keys without trusting the network.

:class:`TemporaryKeys` is the launcher's folder of fresh keys for one run: its
secret halves live in anonymous memory files of the launcher (``memfd``), reached
through links, so they never touch a file system and vanish with the launcher,
even when it is killed with SIGKILL.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.utils.z85
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from fedhet.crypto import keys as ck

from .atomic import write_atomic

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no lock, no sweeping
    fcntl = None  # type: ignore[assignment]

TEMP_PREFIX = "fedhet-keys-"  # temporary key folders (in the system's temporary folder)
OWNER_LOCK = ".owner.lock"  # held (flock) by the process that made the folder, for as long as it lives


class KeyError_(FileNotFoundError):
    """A key file is missing or unreadable; the message names it."""


def save_private_key(path: str | os.PathLike, key: ck.PrivateKey, fmt: str = "pem",
                     password: bytes | None = None) -> None:
    """Write a private key file (:func:`fedhet.crypto.keys.private_key_file`) atomically with mode 0600."""
    write_atomic(Path(path), ck.private_key_file(key, fmt, password), 0o600)  # mode set before any secret byte


def save_public_key(path: str | os.PathLike, key: ck.PrivateKey | ck.PublicKey, fmt: str = "pem") -> None:
    """Write a public key file (:func:`fedhet.crypto.keys.public_key_file`) atomically (mode 0644)."""
    write_atomic(Path(path), ck.public_key_file(key, fmt), 0o644)


@dataclass
class PublicKeys:
    curve: str  # Z85
    sign: str   # hex

    def as_dict(self) -> dict:
        return {"public_key": self.curve, "sign_key": self.sign}


def _fresh(d: Path, name: str, write_secret) -> PublicKeys:
    """New CURVE and Ed25519 pairs for ``name``: public halves as files in ``d``, secret halves
    through ``write_secret(path, bytes)``."""
    pub, sec = zmq.curve_keypair()
    write_secret(d / f"{name}.curve.key", sec + b"\n")
    write_atomic(d / f"{name}.curve.pub", pub + b"\n", mode=0o644)
    sk = Ed25519PrivateKey.generate()
    raw = sk.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                           serialization.NoEncryption())
    write_secret(d / f"{name}.sign.key", (raw.hex() + "\n").encode())
    spub = sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()
    write_atomic(d / f"{name}.sign.pub", spub + "\n", mode=0o644)
    return PublicKeys(pub.decode(), spub)


def generate(key_dir: str | os.PathLike, name: str, overwrite: bool = False) -> PublicKeys:
    d = Path(key_dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    secret_files = [d / f"{name}.curve.key", d / f"{name}.sign.key"]
    if not overwrite and any(p.exists() for p in secret_files):
        raise FileExistsError(f"keys for {name!r} already exist in {d} (pass --force to replace them)")
    return _fresh(d, name, lambda path, data: write_atomic(path, data, mode=0o600))


class TemporaryKeys:
    """A private temporary folder of fresh key pairs whose secret halves die with this process.

    Public halves are files.  Each secret half is an anonymous memory file of this process
    (``memfd_create``, close-on-exec) that the folder links to as ``/proc/PID/fd/N``: other
    processes of the user read it through the link while this process lives; its bytes never
    reach a file system; when this process ends, however it ends, the kernel frees them and the
    links dangle.  Where anonymous memory files are unavailable the secrets are files (mode
    0600), removed by :meth:`close`.

    The folder holds a lock (``flock``) for as long as this process lives: making a new one
    first removes the folders of processes that died without :meth:`close` (:func:`sweep_stale`).
    """

    def __init__(self, label: str = "") -> None:
        sweep_stale()
        self.path = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX + (f"{label}-" if label else "")))
        self._lock_fd: int | None = None
        if fcntl is not None:  # locked before it gets its name: a sweeper never sees it free
            self._lock_fd = os.open(self.path / (OWNER_LOCK + ".new"), os.O_CREAT | os.O_RDWR, 0o600)
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            os.rename(self.path / (OWNER_LOCK + ".new"), self.path / OWNER_LOCK)
        self._fds: list[int] = []
        self.in_memory = hasattr(os, "memfd_create") and Path(f"/proc/{os.getpid()}/fd").is_dir()
        with _TEMPORARY_LOCK:
            _TEMPORARY[self.path.resolve()] = self

    def generate(self, name: str) -> PublicKeys:
        return _fresh(self.path, name, self._secret)

    def _secret(self, path: Path, data: bytes) -> None:
        try:
            fd = os.memfd_create(f"fedhet-{path.name}") if self.in_memory else -1  # close-on-exec
        except OSError:  # e.g. out of descriptors (two per party): a file, removed by close or the next sweep
            fd = -1
        if fd < 0:
            write_atomic(path, data, mode=0o600)
            return
        self._fds.append(fd)
        os.fchmod(fd, 0o600)
        os.write(fd, data)
        os.symlink(f"/proc/{os.getpid()}/fd/{fd}", path)

    def close(self) -> None:
        """Remove the folder and free the secrets (idempotent)."""
        with _TEMPORARY_LOCK:
            _TEMPORARY.pop(self.path.resolve(), None)
        shutil.rmtree(self.path, ignore_errors=True)
        for fd in self._fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = []
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


_TEMPORARY: dict[Path, TemporaryKeys] = {}  # this process's open temporary key folders
_TEMPORARY_LOCK = threading.Lock()


def release_temporary(key_dir: str | os.PathLike) -> bool:
    """Close the :class:`TemporaryKeys` at ``key_dir`` if this process made it; False otherwise."""
    with _TEMPORARY_LOCK:
        tk = _TEMPORARY.get(Path(key_dir).resolve())
    if tk is None:
        return False
    tk.close()
    return True


@atexit.register
def _release_all() -> None:
    with _TEMPORARY_LOCK:
        held = list(_TEMPORARY.values())
    for tk in held:
        tk.close()


def sweep_stale(tmp_dir: str | os.PathLike | None = None) -> list[Path]:
    """Remove temporary key folders (ours, in ``tmp_dir``, default the system's) whose owner died.

    A folder is stale when its owner lock can be taken: the process that held it is gone
    (``flock`` locks end with their process, also on SIGKILL, and survive pid reuse).
    Folders without a lock file are left alone.  Returns the folders removed.
    """
    if fcntl is None:
        return []
    removed = []
    root = Path(tmp_dir or tempfile.gettempdir())
    try:
        candidates = [d for d in root.glob(TEMP_PREFIX + "*") if d.is_dir() and not d.is_symlink()]
    except OSError:
        return []
    for d in candidates:
        try:
            if d.stat().st_uid != os.getuid():
                continue
            fd = os.open(d / OWNER_LOCK, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held: its owner is alive
            os.close(fd)
            continue
        try:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


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
