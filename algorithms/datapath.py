"""Where the real datasets live.

The experiments read the datasets gathered in ``../shared/data`` (relative to
the repository root).  ``FEDHET_DATA_DIR`` overrides that, and every loader
also takes an explicit ``data_dir`` (``[federation] data_dir``, or ``--data-dir`` of
``fedhet run`` / ``fedhet party``) for a user's own copy.  Nothing here downloads; loaders that can fetch from a public source
do so themselves and cache under ``FEDHET_CACHE_DIR`` (default
``~/.cache/fedhet``).  ``FEDHET_NO_SHARED=1`` switches the ``../shared/data`` look-up off (a
user's clone has no such folder; the test suite's first pass runs this way, so a test that reads the
data without declaring it fails there).
"""
from __future__ import annotations

import os
from typing import Literal, overload
from pathlib import Path

ENV_DATA_DIR = "FEDHET_DATA_DIR"
ENV_CACHE_DIR = "FEDHET_CACHE_DIR"
ENV_NO_SHARED = "FEDHET_NO_SHARED"


class DatasetNotFound(FileNotFoundError):
    """A dataset's files are not where we looked; the message lists where."""


def _candidates() -> list[Path]:
    env = os.environ.get(ENV_DATA_DIR)
    if env:  # an explicit choice is the only place looked at
        return [Path(env).expanduser()]
    out: list[Path] = []
    if os.environ.get(ENV_NO_SHARED, "").strip().lower() not in ("", "0", "false", "no", "off"):
        return out
    out.append(Path.cwd() / ".." / "shared" / "data")
    # An editable install keeps the source tree: repo_root/algorithms/this file.
    out.append(Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
    return out


@overload
def data_root(data_dir: str | os.PathLike | None = None, required: Literal[True] = True) -> Path: ...
@overload
def data_root(data_dir: str | os.PathLike | None, required: bool) -> Path | None: ...


def data_root(data_dir: str | os.PathLike | None = None, required: bool = True) -> Path | None:
    """The folder that holds the dataset folders (``fate/``, ``covtype_kaggle/`` ...)."""
    if data_dir is not None:
        p = Path(data_dir).expanduser()
        if p.is_dir():
            return p.resolve()
        raise DatasetNotFound(f"data folder {str(p)!r} ([federation] data_dir or --data-dir) is not a directory")
    for p in _candidates():
        if p.is_dir():
            return p.resolve()
    if required:
        tried = ", ".join(str(p) for p in _candidates()) or f"nothing: {ENV_NO_SHARED} is set"
        raise DatasetNotFound(
            f"no dataset folder found (tried {tried}); set {ENV_DATA_DIR}, set data_dir in [federation], "
            "or pass --data-dir to `fedhet run` / `fedhet party`"
        )
    return None


def dataset_path(*parts: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Path of one dataset file or folder; a clear error if it is missing."""
    root = data_root(data_dir)
    if root is None:   # data_root raises when required; this keeps the type exact
        raise DatasetNotFound(f"{'/'.join(parts)}: no dataset folder")
    p = root.joinpath(*parts)
    if not p.exists():
        raise DatasetNotFound(f"{'/'.join(parts)} not found under {root}")
    return p


def cache_dir() -> Path:
    p = Path(os.environ.get(ENV_CACHE_DIR, Path.home() / ".cache" / "fedhet")).expanduser()
    p.mkdir(parents=True, exist_ok=True)
    return p
