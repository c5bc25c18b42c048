"""Checkpoints: one party's own state at a round boundary, so a killed run resumes where it was.

A role calls ``party.checkpoint(step, state)`` at each round or epoch boundary (every role of an
algorithm at the same steps) and ``party.restore()`` once before its first message; the party
writes every ``checkpoint_every``-th step here, in the party's **private** folder::

    RUN_DIR/parties/N/private/checkpoints/step-000012.ckpt    (mode 0600, folder 0700)

Each file is one safetensors file: the state's arrays as its tensors, and in its metadata the
JSON of everything else (the state's structure, Python numbers and strings, big integers such as
a PCG64 generator's 128-bit state, and the party's own header: run, party, step, transcript head).
No pickle: reading a checkpoint builds arrays and JSON values only.  A write is atomic (a reader,
or a kill, never sees half a file) and only the newest ``keep`` (two) are kept.  The SHA-256 of
each file goes into the party's signed transcript (a ``checkpoint`` record), so a resumed run can
show which state it restarted from.

Checkpoints hold secrets (HE secret keys, Shamir shares, a model before aggregation): they stay on
the party's machine and never go to an auditor, who gets the run folder without ``private/``.
"""
from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
from safetensors.numpy import load as _load_arrays, save as _save_arrays   # at import: not in a round's time

from .atomic import write_atomic
from .runfolder import PRIVATE

FORMAT = "fedhet-checkpoint-v1"
KEEP = 2
_NAME = re.compile(r"^step-(\d{6,})\.ckpt$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be written or read back; the text names the file and why."""


def private_dir(party_dir: str | os.PathLike) -> Path:
    """The party folder's secret part (:meth:`Checkpoints.write` makes it, mode 0700)."""
    return Path(party_dir) / PRIVATE


# ------------------------------------------------------------ state <-> file
def _pack(obj: Any, arrays: dict[str, np.ndarray], where: str, copy: bool = False) -> Any:
    """``obj`` as JSON, its arrays moved to ``arrays`` (named by position; ``copy``: copies, which
    the caller may change at once, as a role's optimizer changes its tensors in place)."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return {"int": str(obj)} if abs(obj) >= 1 << 53 else obj   # beyond a double: as text
    if isinstance(obj, float):
        return obj if np.isfinite(obj) else {"float": repr(obj)}
    if isinstance(obj, bytes):
        return {"bytes": obj.hex()}
    if isinstance(obj, Mapping):
        return {"map": [[_pack(k, arrays, where), _pack(v, arrays, f"{where}.{k}", copy)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"tuple" if isinstance(obj, tuple) else "list": [_pack(v, arrays, f"{where}[{i}]", copy)
                                                                for i, v in enumerate(obj)]}
    if isinstance(obj, np.generic):
        obj, kind = np.asarray(obj), "scalar"
    elif isinstance(obj, np.ndarray):
        kind = "np"
    elif type(obj).__module__.startswith("torch") and hasattr(obj, "detach"):
        kind, obj = "torch", obj.detach().cpu().numpy()
    else:
        raise CheckpointError(f"checkpoint state at {where or 'the top'}: a {type(obj).__name__} cannot be "
                              "checkpointed (arrays, tensors, numbers, strings, bytes, lists and dicts only)")
    if obj.dtype == object:
        raise CheckpointError(f"checkpoint state at {where}: an object array cannot be checkpointed")
    name = str(len(arrays))
    arrays[name] = np.array(obj, order="C") if copy or not obj.flags.c_contiguous else obj   # (0-d stays 0-d)
    return {kind: name}


def _unpack(obj: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if not isinstance(obj, dict):
        return obj
    (kind, v), = obj.items()
    if kind == "int":
        return int(v)
    if kind == "float":
        return float(v)
    if kind == "bytes":
        return bytes.fromhex(v)
    if kind == "map":
        return {_unpack(k, arrays): _unpack(x, arrays) for k, x in v}
    if kind in ("list", "tuple"):
        out = [_unpack(x, arrays) for x in v]
        return tuple(out) if kind == "tuple" else out
    a = arrays[v]
    if kind == "scalar":
        return a[()]
    if kind == "torch":
        import torch

        return torch.from_numpy(a.copy())
    return a.copy()


def snapshot(state: Mapping[str, Any], header: Mapping[str, Any], copy: bool = False
             ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """``state`` taken apart for a file: its arrays (copies with ``copy``) and the JSON of the rest."""
    arrays: dict[str, np.ndarray] = {}
    body = _pack(dict(state), arrays, "", copy)
    return arrays, {"format": FORMAT, "header": json.dumps(dict(header), sort_keys=True),
                    "state": json.dumps(body, separators=(",", ":"))}


def encode(state: Mapping[str, Any], header: Mapping[str, Any]) -> bytes:
    """A checkpoint file's bytes: ``state`` (the role's and the party's) with ``header``."""
    arrays, meta = snapshot(state, header)
    return _save_arrays(arrays, metadata=meta)


def decode(raw: bytes, path: str | os.PathLike = "<bytes>") -> tuple[dict, dict]:
    """(state, header) of a checkpoint file's bytes; :class:`CheckpointError` naming ``path``."""
    try:
        arrays = _load_arrays(raw)
        n = int.from_bytes(raw[:8], "little")
        meta = json.loads(raw[8:8 + n]).get("__metadata__") or {}
        if meta.get("format") != FORMAT:
            raise CheckpointError(f"{path}: not a fedhet checkpoint (format {meta.get('format')!r})")
        return _unpack(json.loads(meta["state"]), arrays), json.loads(meta["header"])
    except CheckpointError:
        raise
    except Exception as e:   # noqa: BLE001 - a damaged file, whatever broke in it
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None


# ------------------------------------------------------------ the store
class Checkpoints:
    """One party's checkpoint folder: atomic writes, the newest ``keep`` kept.

    ``background``: :meth:`submit` encodes the state at once (the role may change it right after)
    and leaves the write (with its fsync) to one writer thread, so a round waits only for the
    encoding; a second checkpoint waits for the first's write (at most one is pending)."""

    def __init__(self, folder: str | os.PathLike, keep: int = KEEP, background: bool = False) -> None:
        self.folder = Path(folder)
        self.keep = max(1, int(keep))
        self._pending: queue.Queue | None = queue.Queue(maxsize=1) if background else None
        self._writer: threading.Thread | None = None
        self._failed: BaseException | None = None

    def path(self, step: int) -> Path:
        return self.folder / f"step-{int(step):06d}.ckpt"

    def steps(self) -> list[int]:
        """The steps whose files are present, oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(int(m.group(1)) for f in os.listdir(self.folder) if (m := _NAME.match(f)))

    def write(self, step: int, state: Mapping[str, Any], header: Mapping[str, Any]) -> tuple[str, int]:
        """Write step ``step`` atomically, drop all but the newest ``keep``; (sha256, bytes)."""
        return self._store(step, encode(state, dict(header, step=int(step))))

    def submit(self, step: int, state: Mapping[str, Any], header: Mapping[str, Any],
               done: Callable[[str, int, float], None]) -> None:
        """Take step ``step``'s state now (with ``background``, a copy of its arrays: the rest, the
        file's encoding, its write and fsync, happen on the writer thread) and write it; then call
        ``done(sha256, bytes, seconds the write took)``.  A write that failed on the writer thread
        is raised here, at the next submit (or at :meth:`flush`)."""
        if self._pending is None:
            t0 = time.perf_counter()
            digest, n = self._store(step, encode(state, dict(header, step=int(step))))
            done(digest, n, time.perf_counter() - t0)
            return
        taken = snapshot(state, dict(header, step=int(step)), copy=True)
        self._raise_failure()
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name=f"checkpoints-{self.folder}", daemon=True)
            self._writer.start()
        self._pending.put((step, taken, done))

    def flush(self) -> None:
        """Wait until every submitted checkpoint is written (and its ``done`` called)."""
        if self._pending is not None:
            self._pending.join()
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self._failed is not None:
            err, self._failed = self._failed, None
            raise err

    def _write_loop(self) -> None:
        assert self._pending is not None
        while True:
            step, (arrays, meta), done = self._pending.get()
            try:
                t0 = time.perf_counter()
                digest, n = self._store(step, _save_arrays(arrays, metadata=meta))
                done(digest, n, time.perf_counter() - t0)
            except BaseException as e:   # noqa: BLE001 - handed to the role's thread
                self._failed = e
            finally:
                self._pending.task_done()

    def _store(self, step: int, raw: bytes) -> tuple[str, int]:
        for d in (self.folder.parent, self.folder):   # private/ and checkpoints/: the owner's only
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.path(step), raw, mode=0o600)
        for old in self.steps()[:-self.keep]:
            self.path(old).unlink(missing_ok=True)
        return hashlib.sha256(raw).hexdigest(), len(raw)

    def digests(self) -> dict[int, str]:
        """step -> SHA-256 of each file present."""
        out = {}
        for s in self.steps():
            try:
                out[s] = hashlib.sha256(self.path(s).read_bytes()).hexdigest()
            except OSError:
                continue
        return out

    def offer(self, records: list[dict] | None = None) -> dict[int, str]:
        """step -> SHA-256 of the checkpoints this party can resume from: the files present, and
        with ``records`` (its transcript's) only those whose digest a ``checkpoint`` record names
        (a file written just before a kill, with no record yet, is not offered)."""
        have = self.digests()
        if records is None:
            return have
        recorded = {(r.get("step"), r.get("sha256")) for r in records if r.get("type") == "checkpoint"}
        return {s: d for s, d in have.items() if (s, d) in recorded}

    def read(self, step: int, digest: str | None = None) -> tuple[dict, dict]:
        """(state, header) of step ``step``; with ``digest``, the file must have that SHA-256."""
        p = self.path(step)
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise CheckpointError(f"{p}: cannot read the checkpoint of step {step}: {e}") from None
        if digest is not None and hashlib.sha256(raw).hexdigest() != digest:
            raise CheckpointError(f"{p}: its SHA-256 is not the one the party's transcript recorded for step "
                                  f"{step} (the file was changed or replaced)")
        state, header = decode(raw, p)
        if header.get("step") != step:
            raise CheckpointError(f"{p}: holds step {header.get('step')!r}, not {step}")
        return state, header
