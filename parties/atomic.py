"""Atomic file writes: a reader (or a crash) never sees a half-written file."""
from __future__ import annotations

import errno
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any


def _umask() -> int:
    """The process umask, read without changing it (os.umask would race with other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


FD_RETRY_S = 30.0  # how long a write waits for descriptors to free up (idle strangers are shut within seconds)


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int | None = None,
                 fd_wait_s: float = FD_RETRY_S) -> Path:
    """Write ``data`` to ``path`` via a temporary file and a rename.

    ``mode=None`` gives the permissions a plain ``open(path, "w")`` would
    (0o666 less the umask; mkstemp alone would leave results 0o600); secret
    files pass ``mode=0o600``, which is set before any byte is written.  While
    the process is out of file descriptors (connections from strangers, which
    the transport sheds within seconds) the write is retried for ``fd_wait_s``,
    never given up at once: a checkpoint or result is not lost to a flood."""
    deadline = time.monotonic() + fd_wait_s
    while True:
        try:
            return _write_atomic(Path(path), data, mode)
        except OSError as e:
            if e.errno not in (errno.EMFILE, errno.ENFILE) or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _write_atomic(path: Path, data: bytes | str, mode: int | None) -> Path:
    if mode is None:
        mode = 0o666 & ~_umask()
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def write_json_atomic(path: str | os.PathLike, obj: Any, mode: int | None = None,
                      fd_wait_s: float = FD_RETRY_S) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n", mode,
                        fd_wait_s)


def json_default(o: Any):
    """The ``json.dumps(default=...)`` hook of every JSON file fedhet writes: numpy arrays and
    scalars as plain lists and numbers, paths as strings."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON-serialisable: {type(o).__name__}")
