"""A party's trained part, as it leaves the run: ``<party folder>/model/``.

A role hands the runtime what it trained with ``party.save_model(tensors, meta)``:
``tensors``, name -> numpy array (its weights, in the algorithm's own names), and ``meta``,
plain JSON (what the algorithm needs to rebuild the part and score new rows: its network's
shape, the feature names in order, the scaler, the classes, and ``check``, a few input rows
with the outputs the trained part gave them, so a reload can prove it predicts the same).

The runners write it after the role returns, each file atomically:

- ``model.safetensors``: the tensors (safetensors, the format torch, JAX and the hub read);
- ``model.json``: ``meta`` under ``"meta"``, and what the runtime knows of the part: the
  algorithm, the party and its role, the run id, the federation's fingerprint, the settings
  and the fedhet version.

A party's weights are its own: this folder sits in the party's folder, beside its result, and
``fedhet export`` turns it into the files a deployment reads.  ``read_part`` checks what it
reads (names, dtypes, finite values) and names the file on any error.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from .atomic import json_default, write_atomic

TENSORS, META = "model.safetensors", "model.json"
FORMAT = "fedhet-model/1"


class ModelFileError(ValueError):
    """A trained part's files are missing or malformed; the text names the file."""


@dataclass
class TrainedPart:
    """What one party trained: its tensors and the algorithm's metadata (plus, once written or read,
    the runtime's header: algorithm, party, role, run, fingerprint, settings, version)."""

    tensors: dict[str, np.ndarray]
    meta: dict[str, Any]
    header: dict[str, Any] = field(default_factory=dict)


def fedhet_version() -> str:
    try:
        return version("fedhet")
    except PackageNotFoundError:
        return "unknown"


def make_part(tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> TrainedPart:
    """A part from a role's arrays (contiguous copies) and its metadata (checked to be JSON)."""
    out: dict[str, np.ndarray] = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"save_model: tensor names are non-empty strings, got {name!r}")
        arr = np.ascontiguousarray(np.asarray(value))
        if arr.dtype.kind not in "fiub":
            raise ValueError(f"save_model: tensor {name!r} has dtype {arr.dtype}; numbers only")
        out[name] = arr.copy()
    try:
        meta_copy = json.loads(json.dumps(dict(meta), default=json_default))
    except (TypeError, ValueError) as e:
        raise ValueError(f"save_model: meta must be JSON-able: {e}") from None
    return TrainedPart(out, meta_copy)


def write_part(folder: str | Path, part: TrainedPart, header: Mapping[str, Any]) -> Path:
    """Write ``part`` into ``folder`` (the tensors first, then the JSON that names them)."""
    folder = Path(folder)
    head = {"format": FORMAT, "fedhet_version": fedhet_version(), **dict(header)}
    write_atomic(folder / TENSORS, st_save(part.tensors, metadata={"format": FORMAT}))
    doc = {**head, "tensors": {k: {"dtype": v.dtype.str, "shape": list(v.shape)} for k, v in part.tensors.items()},
           "meta": part.meta}
    write_atomic(folder / META, json.dumps(doc, indent=2, sort_keys=True, default=json_default) + "\n")
    part.header = head
    return folder


def read_part(folder: str | Path) -> TrainedPart:
    """The part written in ``folder``; a :class:`ModelFileError` naming the file when it is missing,
    unreadable, or its tensors are not those its JSON lists."""
    folder = Path(folder)
    meta_path, tensor_path = folder / META, folder / TENSORS
    for p in (meta_path, tensor_path):
        if not p.is_file():
            raise ModelFileError(f"{p}: missing (a party's trained part is {META} and {TENSORS} in its model/ folder)")
    try:
        doc = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{meta_path}: not readable JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ModelFileError(f"{meta_path}: not a fedhet model file (format {FORMAT!r} expected)")
    try:
        tensors = dict(st_load(tensor_path.read_bytes()))
    except Exception as e:  # noqa: BLE001 - safetensors raises its own errors on bad bytes
        raise ModelFileError(f"{tensor_path}: not a safetensors file: {e}") from None
    listed = doc.get("tensors") or {}
    if set(listed) != set(tensors):
        raise ModelFileError(f"{tensor_path}: holds {sorted(tensors)}, {meta_path.name} lists {sorted(listed)}")
    for name, arr in tensors.items():
        want = listed[name]
        if arr.dtype.str != want.get("dtype") or list(arr.shape) != list(want.get("shape", [])):
            raise ModelFileError(f"{tensor_path}: tensor {name!r} is {arr.dtype.str}{list(arr.shape)}, "
                                 f"{meta_path.name} says {want.get('dtype')}{want.get('shape')}")
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ModelFileError(f"{tensor_path}: tensor {name!r} holds NaN or infinite values")
    header = {k: v for k, v in doc.items() if k not in ("tensors", "meta")}
    return TrainedPart(tensors, dict(doc.get("meta") or {}), header)
