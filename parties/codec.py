"""Envelope codec: how one message becomes ZeroMQ frames and back.

A message is a list of frames.  Frame 0 is a msgpack *header*::

    {"v": 1, "run": run_id, "frm": sender, "to": receiver, "kind": kind,
     "seq": n, "round": r, "body": <payload with arrays replaced by refs>,
     "arrays": [{"t": "np"|"torch", "dtype": "<f4", "shape": [..]}, ...]}

and frames 1..k are the raw buffers of the arrays, in order (zero-copy on the
send side).  No pickle is used anywhere: the body is plain msgpack, arrays are
described by dtype string and shape and rebuilt with ``np.frombuffer``.  Only
numeric/bool dtypes are accepted, so a peer can never make us build object
arrays.

Decoding enforces limits (number of frames, header size, total bytes, array
element counts match their buffers, nesting depth) and raises
``MalformedMessage`` with a reason; callers log and drop such messages.
"""
from __future__ import annotations

import functools
import hashlib
import sys
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

# torch is imported lazily: a payload can only hold tensors if the process has
# imported torch already, and importing it costs every party process seconds.

PROTOCOL_VERSION = 1
_REF = "__fedhet_array__"
# Only fixed-width numeric dtypes cross the wire.
_ALLOWED_DTYPES = {
    "|b1", "|i1", "|u1", "<i2", "<u2", "<i4", "<u4", "<i8", "<u8",
    "<f2", "<f4", "<f8", "<c8", "<c16",
}


@functools.lru_cache(maxsize=None)
def _torch_dtypes() -> dict:
    import torch

    return {
        torch.bool: "|b1", torch.int8: "|i1", torch.uint8: "|u1", torch.int16: "<i2",
        torch.int32: "<i4", torch.int64: "<i8", torch.float16: "<f2",
        torch.float32: "<f4", torch.float64: "<f8",
    }

DEFAULT_MAX_MESSAGE_BYTES = 1 << 30  # 1 GiB decoded payload
MAX_FRAMES = 4097
MAX_HEADER_BYTES = 64 << 20
MAX_DEPTH = 64


class MalformedMessage(ValueError):
    """A frame set that is not a valid fedhet envelope; the text says why."""


@dataclass
class Envelope:
    run: str
    frm: str
    to: str
    kind: str
    seq: int
    round: int
    payload: Any
    nbytes: int = 0  # encoded size of all frames
    digest: str = ""  # SHA-256 over all frames, for the transcript
    arrays: list = field(default_factory=list)  # [(dtype, shape)] for the transcript


def _flatten(obj: Any, arrays: list, bufs: list, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise ValueError("payload nested too deeply")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.dtype not in _torch_dtypes():
            raise TypeError(f"torch dtype {t.dtype} cannot be sent")
        a = t.to("cpu").contiguous().numpy()
        arrays.append({"t": "torch", "dtype": _torch_dtypes()[t.dtype], "shape": list(a.shape)})
        bufs.append(a)
        return {_REF: len(arrays) - 1}
    if isinstance(obj, np.ndarray):
        a = obj
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        if not a.flags.c_contiguous:  # (np.ascontiguousarray would turn 0-d into 1-d)
            a = a.copy(order="C")
        dt = a.dtype.str
        if dt not in _ALLOWED_DTYPES:
            raise TypeError(f"numpy dtype {a.dtype} cannot be sent (only numeric dtypes)")
        arrays.append({"t": "np", "dtype": dt, "shape": list(a.shape)})
        bufs.append(a)
        return {_REF: len(arrays) - 1}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise TypeError(f"dict keys must be str or int, got {type(k).__name__}")
            out[k] = _flatten(v, arrays, bufs, depth + 1)
        return out
    if isinstance(obj, (list, tuple)):
        return [_flatten(v, arrays, bufs, depth + 1) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str, bytes)):
        return obj
    raise TypeError(f"cannot send a value of type {type(obj).__name__}")


def encode(run: str, frm: str, to: str, kind: str, seq: int, payload: Any, round: int = 0) -> list:
    """Frames for one message: [header bytes, array buffers...]."""
    arrays: list = []
    bufs: list = []
    body = _flatten(payload, arrays, bufs)
    header = {
        "v": PROTOCOL_VERSION, "run": run, "frm": frm, "to": to, "kind": kind,
        "seq": int(seq), "round": int(round), "body": body, "arrays": arrays,
    }
    # A flat uint8 view of each array: zero-copy, and valid for empty arrays too.
    return [msgpack.packb(header, use_bin_type=True)] + [memoryview(b.reshape(-1).view(np.uint8)) for b in bufs]


def frames_digest(frames: list) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    for f in frames:
        mv = memoryview(f)
        h.update(len(mv).to_bytes(8, "little"))
        h.update(mv)
        n += len(mv)
    return h.hexdigest(), n


def _rebuild(obj: Any, arrays: list, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise MalformedMessage("body nested too deeply")
    if isinstance(obj, dict):
        if len(obj) == 1 and _REF in obj:
            i = obj[_REF]
            if not isinstance(i, int) or not 0 <= i < len(arrays) or arrays[i] is None:
                raise MalformedMessage(f"bad array reference {i!r}")
            a = arrays[i]
            arrays[i] = None  # each array is referenced exactly once
            return a
        return {k: _rebuild(v, arrays, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, arrays, depth + 1) for v in obj]
    return obj


def decode(frames: list, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Envelope:
    """Parse frames into an Envelope; raises MalformedMessage with the reason."""
    if not frames:
        raise MalformedMessage("no frames")
    if len(frames) > MAX_FRAMES:
        raise MalformedMessage(f"{len(frames)} frames, at most {MAX_FRAMES} allowed")
    mvs = [memoryview(f) for f in frames]
    total = sum(len(m) for m in mvs)
    if total > max_bytes:
        raise MalformedMessage(f"message of {total} bytes exceeds the limit of {max_bytes}")
    if len(mvs[0]) > MAX_HEADER_BYTES:
        raise MalformedMessage("header too large")
    try:
        # Container lengths are bounded by the header size itself, so a
        # hostile header cannot make us allocate more than it sent.
        n = len(mvs[0])
        header = msgpack.unpackb(
            mvs[0], raw=False, strict_map_key=False, max_str_len=n, max_bin_len=n,
            max_array_len=n, max_map_len=n, max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several exception types
        raise MalformedMessage(f"header is not msgpack: {type(e).__name__}") from None
    if not isinstance(header, dict):
        raise MalformedMessage("header is not a map")
    try:
        v, run, frm, to, kind = (header[k] for k in ("v", "run", "frm", "to", "kind"))
        seq, rnd, body, specs = (header[k] for k in ("seq", "round", "body", "arrays"))
    except KeyError as e:
        raise MalformedMessage(f"header lacks field {e.args[0]!r}") from None
    if v != PROTOCOL_VERSION:
        raise MalformedMessage(f"protocol version {v!r}, expected {PROTOCOL_VERSION}")
    for name, val in (("run", run), ("frm", frm), ("to", to), ("kind", kind)):
        if not isinstance(val, str) or not val or len(val) > 256:
            raise MalformedMessage(f"header field {name!r} is not a short string")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise MalformedMessage("bad sequence number")
    if not isinstance(rnd, int) or isinstance(rnd, bool):
        raise MalformedMessage("bad round")
    if not isinstance(specs, list) or len(specs) != len(mvs) - 1:
        raise MalformedMessage(
            f"header announces {len(specs) if isinstance(specs, list) else '?'} arrays "
            f"but {len(mvs) - 1} data frames came"
        )
    arrays = []
    meta = []
    for i, (spec, mv) in enumerate(zip(specs, mvs[1:])):
        if not isinstance(spec, dict):
            raise MalformedMessage(f"array spec {i} is not a map")
        t, dt, shape = spec.get("t"), spec.get("dtype"), spec.get("shape")
        if t not in ("np", "torch") or not isinstance(dt, str) or dt not in _ALLOWED_DTYPES:
            raise MalformedMessage(f"array {i}: type {t!r} / dtype {dt!r} not allowed")
        if (not isinstance(shape, list) or len(shape) > 32
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise MalformedMessage(f"array {i}: bad shape {shape!r}")
        dtype = np.dtype(dt)
        count = int(np.prod(shape, dtype=object)) if shape else 1
        if count * dtype.itemsize != len(mv):
            raise MalformedMessage(
                f"array {i}: shape {shape} of {dt} needs {count * dtype.itemsize} bytes, frame has {len(mv)}"
            )
        # Copy out of the transport's (read-only) buffer: receivers own what they get.
        try:  # an empty frame can still declare dimensions numpy refuses, e.g. [0, 2**64-1]
            a = np.frombuffer(mv, dtype=dtype).reshape(tuple(shape)).copy()
        except (ValueError, OverflowError) as e:
            raise MalformedMessage(f"array {i}: shape {shape} cannot be built: {e}") from None
        if t == "torch":
            try:
                import torch
            except ImportError:
                raise MalformedMessage("torch tensor received but torch is unavailable") from None
            if dt not in _torch_dtypes().values():
                raise MalformedMessage(f"array {i}: dtype {dt} is not a torch dtype")
            a = torch.from_numpy(a)
        arrays.append(a)
        meta.append((dt, tuple(shape)))
    payload = _rebuild(body, arrays)
    if any(a is not None for a in arrays):
        raise MalformedMessage("array frames not referenced by the body")
    digest, n = frames_digest(mvs)
    return Envelope(run=run, frm=frm, to=to, kind=kind, seq=seq, round=rnd,
                    payload=payload, nbytes=n, digest=digest, arrays=meta)


def describe(payload: Any) -> list:
    """[(dtype, shape)] of the arrays inside a payload, in encoding order."""
    arrays: list = []
    _flatten(payload, arrays, [])
    return [(a["dtype"], tuple(a["shape"])) for a in arrays]
