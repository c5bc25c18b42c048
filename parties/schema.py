"""Payload schemas: what a message of one kind holds, field by field.

A declaration (:mod:`fedhet.parties.declare`) names its payload with these
specs, and the same spec serves three checks:

- on receipt (:meth:`Spec.validate`): the decoded payload must match, or the
  receive fails with :class:`SchemaError` naming sender, kind and field (the
  party API adds sender and kind);
- in the transcript (:func:`describe`): every array is recorded with its
  field path, dtype and shape, never its values;
- in the audit (:func:`check_arrays`): each recorded array must sit at a path
  the schema allows, with an allowed dtype and shape, on both ends.

Shapes are tuples whose entries are an exact ``int``, a *symbol* (a string
such as ``"n_common"`` resolved from the run's sizes, see
``Algorithm.sizes``) or ``None`` (any length).  An unresolved symbol matches
any length but still prints by name in ``fedhet messages``.  Every container
has a length bound, so a declared message can never grow without limit.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

Sizes = Mapping[str, int]
Dim = "int | str | None"

# Containers without an explicit bound still have one: no message kind of
# fedhet needs more entries than this, and a hostile peer gets no more.
DEFAULT_MAX_ITEMS = 1 << 20
MAX_TEXT = 200  # reflected values in error messages are cut to this


class SchemaError(ValueError):
    """A payload that does not match its declaration; ``path`` is the field."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"field {path or '(payload)'!r}: {msg}")
        self.path, self.msg = path, msg


def short(v: Any, n: int = 60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _dtype_of(v: Any) -> str | None:
    if isinstance(v, np.ndarray):
        return v.dtype.newbyteorder("<").str if v.dtype.byteorder == ">" else v.dtype.str
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        return np.dtype(str(v.dtype).replace("torch.", "")).str if v.dtype != torch.bfloat16 else "bf16"
    return None


def _resolve(d: Any, sizes: Sizes | None) -> int | None:
    if isinstance(d, int):
        return d
    if isinstance(d, str) and sizes and d in sizes and sizes[d] is not None:
        return int(sizes[d])
    return None


class Spec:
    """Base of every payload spec."""

    def validate(self, v: Any, path: str = "", sizes: Sizes | None = None) -> None:
        raise NotImplementedError

    def at(self, token: str | int) -> "Spec | None":
        """The spec of a child (field name or list index); None if no such child."""
        return None

    def render(self) -> str:
        raise NotImplementedError

    def has_arrays(self) -> bool:
        return False


@dataclass(frozen=True)
class Arr(Spec):
    """A numpy array (or torch tensor) of one of ``dtype`` and this ``shape``.

    ``finite`` (default): a floating-point array must hold no NaN or infinity (checked on
    receipt, so the receive fails naming the sender); ``finite=False`` for the rare payload
    where they mean something.  ``max_elems`` bounds the element count whatever the shape.
    """

    dtype: str | tuple[str, ...]
    shape: tuple = ()
    doc: str = ""
    max_elems: int | None = None
    finite: bool = True

    @property
    def dtypes(self) -> tuple[str, ...]:
        return (self.dtype,) if isinstance(self.dtype, str) else tuple(self.dtype)

    def check_meta(self, dt: str, shape: Sequence[int], path: str, sizes: Sizes | None) -> None:
        if dt not in self.dtypes:
            raise SchemaError(path, f"dtype {dt} where {'/'.join(self.dtypes)} is declared")
        if len(shape) != len(self.shape):
            raise SchemaError(path, f"shape {list(shape)} where {self._shape_text(sizes)} is declared")
        for got, want in zip(shape, self.shape):
            w = _resolve(want, sizes)
            if w is not None and int(got) != w:
                raise SchemaError(path, f"shape {list(shape)} where {self._shape_text(sizes)} is declared")
        if self.max_elems is not None and math.prod(shape) > self.max_elems:
            raise SchemaError(path, f"{math.prod(shape)} elements, at most {self.max_elems} declared")

    def validate(self, v, path="", sizes=None):
        dt = _dtype_of(v)
        if dt is None:
            raise SchemaError(path, f"expected an array, got {type(v).__name__}")
        self.check_meta(dt, tuple(v.shape), path, sizes)
        if self.finite:
            check_finite(v, path)

    def _shape_text(self, sizes: Sizes | None = None) -> str:
        parts = []
        for d in self.shape:
            if d is None:
                parts.append("*")
            elif isinstance(d, str):
                r = _resolve(d, sizes)
                parts.append(d if r is None else f"{d}={r}")
            else:
                parts.append(str(d))
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def render(self) -> str:
        return f"{'|'.join(np.dtype(d).name for d in self.dtypes)}{self._shape_text()}"

    def has_arrays(self) -> bool:
        return True


def check_finite(v: Any, path: str = "") -> None:
    """SchemaError naming the first NaN or infinity of a floating-point array (others pass)."""
    if isinstance(v, np.ndarray):
        if v.dtype.kind not in "fc" or v.size == 0:
            return
        finite = np.isfinite(v)
        if finite.all():
            return
        bad = np.unravel_index(int(np.argmin(finite.reshape(-1))), v.shape)
        at = int(bad[0]) if v.ndim == 1 else [int(i) for i in bad]
        raise SchemaError(path, f"contains NaN or inf (first at index {at}: {v[bad]})")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
        finite = torch.isfinite(v)
        if not bool(finite.all()):
            i = int(torch.argmin(finite.reshape(-1).to(torch.uint8)))
            raise SchemaError(path, f"contains NaN or inf (first at flat index {i}: {v.reshape(-1)[i].item()})")


@dataclass(frozen=True)
class Int(Spec):
    lo: int | None = None
    hi: int | None = None

    def validate(self, v, path="", sizes=None):
        if isinstance(v, bool) or not isinstance(v, int):
            raise SchemaError(path, f"expected an integer, got {short(v)}")
        if (self.lo is not None and v < self.lo) or (self.hi is not None and v > self.hi):
            raise SchemaError(path, f"{v} outside [{self.lo}, {self.hi}]")

    def render(self):
        return "int" if self.lo is None and self.hi is None else f"int[{self.lo}..{self.hi}]"


@dataclass(frozen=True)
class Float(Spec):
    finite: bool = True

    def validate(self, v, path="", sizes=None):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise SchemaError(path, f"expected a number, got {short(v)}")
        if self.finite and not math.isfinite(v):
            raise SchemaError(path, f"expected a finite number, got {v}")

    def render(self):
        return "float"


@dataclass(frozen=True)
class Bool(Spec):
    def validate(self, v, path="", sizes=None):
        if not isinstance(v, bool):
            raise SchemaError(path, f"expected true/false, got {short(v)}")

    def render(self):
        return "bool"


@dataclass(frozen=True)
class Str(Spec):
    max_len: int = 256
    choices: tuple[str, ...] | None = None

    def validate(self, v, path="", sizes=None):
        if not isinstance(v, str):
            raise SchemaError(path, f"expected a string, got {short(v)}")
        if len(v) > self.max_len:
            raise SchemaError(path, f"string of {len(v)} characters, at most {self.max_len}")
        if self.choices is not None and v not in self.choices:
            raise SchemaError(path, f"{short(v)} is not one of {list(self.choices)}")

    def render(self):
        return "str" if self.choices is None else "|".join(repr(c) for c in self.choices)


@dataclass(frozen=True)
class Bytes(Spec):
    length: int | None = None
    max_len: int = 1 << 20

    def validate(self, v, path="", sizes=None):
        if not isinstance(v, (bytes, bytearray)):
            raise SchemaError(path, f"expected bytes, got {type(v).__name__}")
        if self.length is not None and len(v) != self.length:
            raise SchemaError(path, f"{len(v)} bytes, {self.length} declared")
        if len(v) > self.max_len:
            raise SchemaError(path, f"{len(v)} bytes, at most {self.max_len}")

    def render(self):
        return f"bytes[{self.length}]" if self.length is not None else "bytes"


@dataclass(frozen=True)
class Null(Spec):
    def validate(self, v, path="", sizes=None):
        if v is not None:
            raise SchemaError(path, f"expected nothing (null), got {short(v)}")

    def render(self):
        return "null"


@dataclass(frozen=True)
class Scalars(Spec):
    """Any msgpack value without arrays (numbers, strings, lists, tables): result reports.

    Bounded in depth and item count like everything else.
    """

    max_items: int = 100_000
    doc: str = ""

    def validate(self, v, path="", sizes=None):
        count = [0]

        def walk(x, p, depth):
            count[0] += 1
            if count[0] > self.max_items:
                raise SchemaError(p, f"more than {self.max_items} values")
            if depth > 32:
                raise SchemaError(p, "nested too deeply")
            if _dtype_of(x) is not None:
                raise SchemaError(p, "an array where only scalars are declared")
            if isinstance(x, dict):
                for k, y in x.items():
                    walk(y, f"{p}.{k}" if p else str(k), depth + 1)
            elif isinstance(x, (list, tuple)):
                for i, y in enumerate(x):
                    walk(y, f"{p}[{i}]", depth + 1)
            elif not (x is None or isinstance(x, (bool, int, float, str, bytes))):
                raise SchemaError(p, f"unexpected {type(x).__name__}")

        walk(v, path, 0)

    def at(self, token):
        return self

    def render(self):
        return "scalars (no arrays)"


@dataclass(frozen=True)
class ListOf(Spec):
    item: Spec
    length: int | str | None = None
    max_len: int = DEFAULT_MAX_ITEMS

    def validate(self, v, path="", sizes=None):
        if not isinstance(v, (list, tuple)):
            raise SchemaError(path, f"expected a list, got {type(v).__name__}")
        n = _resolve(self.length, sizes)
        if n is not None and len(v) != n:
            raise SchemaError(path, f"{len(v)} items where {self.length}={n} is declared")
        if len(v) > self.max_len:
            raise SchemaError(path, f"{len(v)} items, at most {self.max_len}")
        for i, x in enumerate(v):
            self.item.validate(x, f"{path}[{i}]", sizes)

    def at(self, token):
        return self.item if isinstance(token, int) else None

    def render(self):
        n = "" if self.length is None else f" x {self.length}"
        return f"[{self.item.render()}]{n}"

    def has_arrays(self):
        return self.item.has_arrays()


@dataclass(frozen=True)
class MapOf(Spec):
    """A table with free keys (party names, labels) and values of one spec."""

    value: Spec
    max_len: int = 10_000

    def validate(self, v, path="", sizes=None):
        if not isinstance(v, dict):
            raise SchemaError(path, f"expected a table, got {type(v).__name__}")
        if len(v) > self.max_len:
            raise SchemaError(path, f"{len(v)} entries, at most {self.max_len}")
        for k, x in v.items():
            if not isinstance(k, (str, int)):
                raise SchemaError(path, f"key {short(k)} is not a string")
            self.value.validate(x, f"{path}.{k}" if path else str(k), sizes)

    def at(self, token):
        return self.value

    def render(self):
        return f"{{name: {self.value.render()}}}"

    def has_arrays(self):
        return self.value.has_arrays()


@dataclass(frozen=True)
class Fields(Spec):
    """A table with exactly these fields (those in ``optional`` may be absent)."""

    fields: dict = field(default_factory=dict)
    optional: tuple[str, ...] = ()

    def validate(self, v, path="", sizes=None):
        if not isinstance(v, dict):
            raise SchemaError(path, f"expected a table with fields {sorted(self.fields)}, got {type(v).__name__}")
        extra = [k for k in v if k not in self.fields]
        if extra:
            raise SchemaError(f"{path}.{extra[0]}" if path else str(extra[0]),
                              f"undeclared field (declared: {sorted(self.fields)})")
        for k, spec in self.fields.items():
            p = f"{path}.{k}" if path else k
            if k not in v:
                if k in self.optional:
                    continue
                raise SchemaError(p, "missing")
            spec.validate(v[k], p, sizes)

    def at(self, token):
        return self.fields.get(token) if isinstance(token, str) else None

    def render(self):
        inner = ", ".join(f"{k}{'?' if k in self.optional else ''}: {s.render()}" for k, s in self.fields.items())
        return "{" + inner + "}"

    def has_arrays(self):
        return any(s.has_arrays() for s in self.fields.values())


@dataclass(frozen=True)
class OneOf(Spec):
    options: tuple[Spec, ...]

    def validate(self, v, path="", sizes=None):
        errs = []
        for o in self.options:
            try:
                o.validate(v, path, sizes)
                return
            except SchemaError as e:
                errs.append(e.msg)
        raise SchemaError(path, "matches none of: " + "; ".join(errs))

    def at(self, token):
        for o in self.options:
            s = o.at(token)
            if s is not None:
                return s
        return None

    def render(self):
        return " | ".join(o.render() for o in self.options)

    def has_arrays(self):
        return any(o.has_arrays() for o in self.options)


def Optional(spec: Spec) -> OneOf:  # noqa: N802 - reads as a type
    return OneOf((spec, Null()))


# ------------------------------------------------------------------ transcript side

def describe(payload: Any) -> list[tuple[str, str, tuple]]:
    """[(path, dtype, shape)] of every array in ``payload`` (what the transcript records)."""
    out: list = []

    def walk(x, p, depth):
        if depth > 64:
            return
        dt = _dtype_of(x)
        if dt is not None:
            out.append((p, dt, tuple(int(s) for s in x.shape)))
        elif isinstance(x, dict):
            for k, y in x.items():
                walk(y, f"{p}.{k}" if p else str(k), depth + 1)
        elif isinstance(x, (list, tuple)):
            for i, y in enumerate(x):
                walk(y, f"{p}[{i}]", depth + 1)

    walk(payload, "", 0)
    return out


_TOKEN = re.compile(r"\[(\d+)\]|\.?([^.\[\]]+)")


def _tokens(path: str) -> list[str | int]:
    out: list[str | int] = []
    for m in _TOKEN.finditer(path):
        out.append(int(m.group(1)) if m.group(1) is not None else m.group(2))
    return out


def spec_at(spec: Spec, path: str) -> Spec | None:
    s: Spec | None = spec
    for t in _tokens(path):
        if s is None:
            return None
        s = s.at(t)
    return s


def check_arrays(spec: Spec | None, arrays: Sequence, sizes: Sizes | None = None) -> str | None:
    """Audit check: every recorded array ``(path, dtype, shape)`` is allowed by ``spec``.

    Returns a problem description or None.  Records without paths (older
    transcripts) are matched against any array the schema declares.
    """
    if spec is None:
        return None
    for rec in arrays:
        if len(rec) == 3:
            path, dt, shape = rec
            leaf = spec_at(spec, path)
            if leaf is None:
                return f"array at undeclared field {path!r}"
            cands = [leaf] if isinstance(leaf, Arr) else [o for o in getattr(leaf, "options", ()) if isinstance(o, Arr)]
            if not cands:
                return f"array at field {path!r}, which is declared {leaf.render()}"
            errs: list[str] = []
            for c in cands:
                try:
                    c.check_meta(dt, shape, path, sizes)
                    errs = []
                    break
                except SchemaError as e:
                    errs.append(str(e))
            if errs:
                return errs[0]
        else:
            dt, shape = rec
            leaves = _array_leaves(spec)
            if not leaves:
                return f"array {dt}{list(shape)} where the payload declares none"
            if not any(_meta_ok(a, dt, shape, sizes) for a in leaves):
                return f"array {dt}{list(shape)} matches no declared array ({', '.join(a.render() for a in leaves)})"
    return None


def _meta_ok(a: Arr, dt, shape, sizes) -> bool:
    try:
        a.check_meta(dt, shape, "", sizes)
        return True
    except SchemaError:
        return False


def _array_leaves(spec: Spec) -> list[Arr]:
    if isinstance(spec, Arr):
        return [spec]
    if isinstance(spec, Fields):
        return [a for s in spec.fields.values() for a in _array_leaves(s)]
    if isinstance(spec, (ListOf,)):
        return _array_leaves(spec.item)
    if isinstance(spec, MapOf):
        return _array_leaves(spec.value)
    if isinstance(spec, OneOf):
        return [a for o in spec.options for a in _array_leaves(o)]
    return []
