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
``MalformedMessage`` with a reason; callers log and drop such messages.  A
reason never quotes more than ``REFLECT_CHARS`` characters of anything the
peer sent (:func:`short`), so hostile headers cannot inflate logs.

Large arrays.  An array of more than ``CHUNK_BYTES`` travels as several data
frames of at most ``chunk_bytes`` each (the header then carries
``"chunk_bytes"``), so no frame on the wire is larger than the chunk size and
a transport can cap every frame (``ZMQ_MAXMSGSIZE``) at that size; the header
itself may not exceed ``MAX_HEADER_BYTES``.  :func:`plan` reads a header alone
and says how many bytes of array data must follow, so a receiver can refuse a
message that exceeds its budget before buffering any of it.

Tensors.  A ``"torch"`` array becomes a ``torch.Tensor`` only where torch is
already imported (the receiving algorithm uses it); elsewhere it is decoded as
the same numpy array.  Importing torch costs a party seconds and ~200 MB, and
a peer must not be able to make a numpy-only receiver pay that.
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
CHUNK_BYTES = 4 << 20  # largest data frame an encoder makes (arrays are split above it)
MAX_HEADER_BYTES = CHUNK_BYTES  # the header is one frame, so it obeys the same per-frame cap
MAX_FRAMES = 8193
MAX_DEPTH = 64
MAX_NAME_CHARS = 128  # run, sender, receiver and kind strings
REFLECT_CHARS = 200  # at most this much of a peer's value is quoted in a reason


def short(value: Any, limit: int = REFLECT_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters: what reasons quote of a peer's data.

    Large containers are cut before ``repr`` runs, so quoting a 2 MB list costs
    no more than quoting a short one.
    """
    if isinstance(value, (list, tuple)) and len(value) > limit:
        value = type(value)(value[:limit])
    elif isinstance(value, dict) and len(value) > limit:
        value = dict(list(value.items())[:limit])
    elif isinstance(value, (str, bytes, bytearray)) and len(value) > limit:
        value = value[:limit]
    try:
        text = repr(value)
    except Exception as e:  # a repr that fails must not turn into a crash
        text = f"<unprintable {type(value).__name__}: {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class MalformedMessage(ValueError):
    """A frame set that is not a valid fedhet envelope; the text says why."""


class MessageTooLarge(MalformedMessage):
    """A well-formed header announcing more than the receiver's budget; ``plan`` says what follows it."""

    def __init__(self, reason: str, plan: "Plan"):
        super().__init__(reason)
        self.plan = plan


@dataclass
class Route:
    """A message's address, as its header names it: run, sender, receiver, kind, sequence, round."""

    run: str
    frm: str
    to: str
    kind: str
    seq: int
    round: int


@dataclass
class Envelope(Route):
    payload: Any
    nbytes: int = 0  # encoded size of all frames
    digest: str = ""  # SHA-256 over all frames, for the transcript
    arrays: list = field(default_factory=list)  # [(dtype, shape)] for the transcript
    fed: dict | None = None  # the sender's federation fingerprint (its first message on the link)


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


def encode(run: str, frm: str, to: str, kind: str, seq: int, payload: Any, round: int = 0,
           chunk_bytes: int | None = None, fed: dict | None = None) -> list:
    """Frames for one message: [header bytes, array data frames...].

    Each array is one frame, or ``ceil(nbytes / chunk_bytes)`` frames when it
    is larger than ``chunk_bytes`` (default ``CHUNK_BYTES``).
    """
    chunk = CHUNK_BYTES if chunk_bytes is None else int(chunk_bytes)
    if chunk < 1:
        raise ValueError(f"chunk_bytes must be positive, got {chunk}")
    arrays: list = []
    bufs: list = []
    body = _flatten(payload, arrays, bufs)
    header = {
        "v": PROTOCOL_VERSION, "run": run, "frm": frm, "to": to, "kind": kind,
        "seq": int(seq), "round": int(round), "body": body, "arrays": arrays,
    }
    # A flat uint8 view of each array: zero-copy, and valid for empty arrays too.
    views = [memoryview(b.reshape(-1).view(np.uint8)) for b in bufs]
    split = any(len(v) > chunk for v in views)
    if split:  # only then: messages of small arrays keep exactly the frames they always had
        header["chunk_bytes"] = chunk
    if fed is not None:  # the federation fingerprint, on a link's first message (Party.send)
        header["fed"] = fed
    head = msgpack.packb(header, use_bin_type=True)
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError(f"message {kind!r}: header of {len(head)} bytes exceeds {MAX_HEADER_BYTES} "
                         "(send large data as numpy arrays, not as lists or bytes in the body)")
    if not split:
        return [head] + views
    frames = [head]
    for v in views:
        frames += [v[i:i + chunk] for i in range(0, len(v), chunk)] if len(v) else [v]
    if len(frames) > MAX_FRAMES:
        raise ValueError(f"message {kind!r} needs {len(frames)} frames, at most {MAX_FRAMES} allowed")
    return frames


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
                raise MalformedMessage(f"bad array reference {short(i)}")
            a = arrays[i]
            arrays[i] = None  # each array is referenced exactly once
            return a
        return {k: _rebuild(v, arrays, depth + 1) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, arrays, depth + 1) for v in obj]
    return obj


@dataclass
class Plan(Route):
    """What a header announces: who sends what, and the data frames that must follow it."""

    header: dict
    specs: list  # [(tag, dtype, shape, nbytes)] per array
    frame_sizes: list  # byte length of each data frame, in order
    chunk: int | None

    @property
    def data_bytes(self) -> int:
        return sum(self.frame_sizes)


def _parse_header(mv: memoryview) -> dict:
    if len(mv) > MAX_HEADER_BYTES:
        raise MalformedMessage(f"header of {len(mv)} bytes, at most {MAX_HEADER_BYTES} allowed")
    try:
        # Container lengths are bounded by the header size itself, so a
        # hostile header cannot make us allocate more than it sent.
        n = len(mv)
        header = msgpack.unpackb(
            mv, raw=False, strict_map_key=False, max_str_len=n, max_bin_len=n,
            max_array_len=n, max_map_len=n, max_ext_len=0,
        )
    except Exception as e:  # msgpack raises several exception types
        raise MalformedMessage(f"header is not msgpack: {type(e).__name__}") from None
    if not isinstance(header, dict):
        raise MalformedMessage("header is not a map")
    return header


def plan(header_frame: Any, max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> Plan:
    """Validate a header frame on its own and say which data frames must follow.

    Raises MalformedMessage when the header is invalid or announces more than
    ``max_bytes`` in all (header included), before any data is received.
    """
    mv = memoryview(header_frame)
    header = _parse_header(mv)
    try:
        v, run, frm, to, kind = (header[k] for k in ("v", "run", "frm", "to", "kind"))
        seq, rnd, specs = (header[k] for k in ("seq", "round", "arrays"))
        header["body"]
    except KeyError as e:
        raise MalformedMessage(f"header lacks field {short(e.args[0])}") from None
    if v != PROTOCOL_VERSION:
        raise MalformedMessage(f"protocol version {short(v)}, expected {PROTOCOL_VERSION}")
    for name, val in (("run", run), ("frm", frm), ("to", to), ("kind", kind)):
        if not isinstance(val, str) or not val or len(val) > MAX_NAME_CHARS:
            raise MalformedMessage(f"header field {name!r} is not a string of 1..{MAX_NAME_CHARS} characters")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise MalformedMessage("bad sequence number")
    if not isinstance(rnd, int) or isinstance(rnd, bool):
        raise MalformedMessage("bad round")
    chunk = header.get("chunk_bytes")
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise MalformedMessage(f"bad chunk_bytes {short(chunk)}")
    if not isinstance(specs, list):
        raise MalformedMessage("header field 'arrays' is not a list")
    if len(specs) >= MAX_FRAMES:
        raise MalformedMessage(f"{len(specs)} arrays, at most {MAX_FRAMES - 1} allowed")
    out: list = []
    sizes: list[int] = []
    total = len(mv)
    for i, spec in enumerate(specs):
        if not isinstance(spec, dict):
            raise MalformedMessage(f"array spec {i} is not a map")
        t, dt, shape = spec.get("t"), spec.get("dtype"), spec.get("shape")
        if t not in ("np", "torch") or not isinstance(dt, str) or dt not in _ALLOWED_DTYPES:
            raise MalformedMessage(f"array {i}: type {short(t)} / dtype {short(dt)} not allowed")
        if (not isinstance(shape, list) or len(shape) > 32
                or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
            raise MalformedMessage(f"array {i}: bad shape {short(shape)}")
        count = int(np.prod(shape, dtype=object)) if shape else 1
        nbytes = count * np.dtype(dt).itemsize
        total += nbytes
        n = 1 if chunk is None or nbytes <= chunk else -(-nbytes // chunk)
        if len(sizes) + n >= MAX_FRAMES:
            if total > max_bytes:
                raise MalformedMessage(f"message of at least {total} bytes exceeds the limit of {max_bytes}")
            raise MalformedMessage(f"message needs more than {MAX_FRAMES} frames")
        if n == 1:
            sizes.append(nbytes)
        else:
            assert chunk is not None  # n > 1 only when chunking
            full, rest = divmod(nbytes, chunk)
            sizes += [chunk] * full + ([rest] if rest else [])
        out.append((t, dt, tuple(shape), nbytes))
    p = Plan(run=run, frm=frm, to=to, kind=kind, seq=seq, round=rnd, header=header, specs=out, frame_sizes=sizes,
             chunk=chunk)
    if total > max_bytes:
        raise MessageTooLarge(f"message of {total} bytes exceeds the limit of {max_bytes}", p)
    return p


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
    p = plan(mvs[0], max_bytes)
    data = mvs[1:]
    if len(data) != len(p.frame_sizes):
        raise MalformedMessage(
            f"header announces {len(p.specs)} arrays in {len(p.frame_sizes)} data frames "
            f"but {len(data)} data frames came"
        )
    for k, (want, mv) in enumerate(zip(p.frame_sizes, data)):
        if len(mv) != want:
            raise MalformedMessage(f"data frame {k}: {len(mv)} bytes where the header announces {want}")
    torch = sys.modules.get("torch")  # tensors only for receivers that already use torch (see top)
    arrays = []
    meta = []
    pos = 0
    for i, (t, dt, shape, nbytes) in enumerate(p.specs):
        dtype = np.dtype(dt)
        n_frames = 1 if p.chunk is None or nbytes <= p.chunk else -(-nbytes // p.chunk)
        parts = data[pos:pos + n_frames]
        pos += n_frames
        # Copy out of the transport's (read-only) buffers: receivers own what they get.
        try:  # an empty frame can still declare dimensions numpy refuses, e.g. [0, 2**64-1]
            if n_frames == 1:
                a = np.frombuffer(parts[0], dtype=dtype).reshape(shape).copy()
            else:
                a = np.empty(nbytes // dtype.itemsize, dtype=dtype)
                flat = a.view(np.uint8)
                at = 0
                for part in parts:
                    flat[at:at + len(part)] = np.frombuffer(part, dtype=np.uint8)
                    at += len(part)
                a = a.reshape(shape)
        except (ValueError, OverflowError) as e:
            raise MalformedMessage(f"array {i}: shape {short(list(shape))} cannot be built: {short(str(e))}") from None
        if t == "torch" and torch is not None:
            if dt not in _torch_dtypes().values():
                raise MalformedMessage(f"array {i}: dtype {dt} is not a torch dtype")
            a = torch.from_numpy(a)
        arrays.append(a)
        meta.append((dt, shape))
    payload = _rebuild(p.header["body"], arrays)
    if any(a is not None for a in arrays):
        raise MalformedMessage("array frames not referenced by the body")
    digest, n = frames_digest(mvs)
    return Envelope(run=p.run, frm=p.frm, to=p.to, kind=p.kind, seq=p.seq, round=p.round,
                    payload=payload, nbytes=n, digest=digest, arrays=meta, fed=_fingerprint(p.header.get("fed")))


def _fingerprint(fed: Any) -> dict | None:
    """A received fingerprint: section -> hex digest, or section -> {key -> hex digest}; bounded."""
    if fed is None:
        return None
    ok = isinstance(fed, dict) and len(fed) <= 16 and all(
        isinstance(k, str) and len(k) <= 64 and (
            (isinstance(v, str) and len(v) <= 64)
            or (isinstance(v, dict) and len(v) <= 512 and all(
                isinstance(a, str) and len(a) <= 64 and isinstance(b, str) and len(b) <= 64 for a, b in v.items())))
        for k, v in fed.items())
    if not ok:
        raise MalformedMessage("federation fingerprint: expected section -> digest (or key -> digest), bounded")
    return fed


def describe(payload: Any) -> list:
    """[(dtype, shape)] of the arrays inside a payload, in encoding order."""
    arrays: list = []
    _flatten(payload, arrays, [])
    return [(a["dtype"], tuple(a["shape"])) for a in arrays]
