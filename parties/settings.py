"""One parser for the tables a user writes: every algorithm's ``[algorithm]``, and ``[federation]``
and each ``[[party]]`` (:mod:`fedhet.parties.federation`: ``SharedSettings``, ``LocalSettings``,
``LaunchSettings``, ``PartySettings``).  (A party's ``data = {...}`` table is still checked by its own
code, ``algorithms/party_table.TableSpec``.)

An algorithm's settings are a frozen dataclass whose fields are declared with
:func:`setting`: a default, one line of documentation, and optional checks
(``choices``, ``lo``/``hi`` bounds, ``min_len``).  :func:`parse_settings`
builds the dataclass from a plain table (the TOML ``[algorithm]`` section,
``--set`` overrides, or a dict in a test):

- unknown keys are an error that names the closest known key;
- every value is checked against the field's type (``int``, ``float``,
  ``bool``, ``str``, ``Literal[...]``, ``tuple[float, ...]``, ``list[...]``,
  ``X | None``) and its range, and the error names the key, the value and
  what was expected;
- a field whose type is itself a settings dataclass marked ``flatten=True``
  reads its keys from the same flat table (shared groups such as the
  aggregation keys are declared once and reused).

:func:`describe_settings` lists every key with its type, default and
documentation (``fedhet presets --describe NAME`` prints it).
"""
from __future__ import annotations

import dataclasses
import functools
import difflib
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

_MISSING = dataclasses.MISSING


class SettingsError(ValueError):
    """A table that does not parse; the text names the table and the key (``key``; ``detail``: what is
    wrong with it, for callers that name the key their own way)."""

    def __init__(self, message: str, key: str | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.key, self.detail = key, detail if detail is not None else message


def _bad(where: str, key: str, detail: str) -> SettingsError:
    return SettingsError(f"{where}: {key} {detail}", key=key, detail=detail)


def setting(default: Any = _MISSING, doc: str = "", *, choices: tuple | None = None,
            lo: float | None = None, hi: float | None = None, lo_open: bool = False,
            min_len: int | None = None, flatten: bool = False) -> Any:
    """A documented settings field (a ``dataclasses.field`` with metadata).

    Mutable defaults (lists, dicts) are copied per instance.
    """
    meta = {"doc": doc, "choices": choices, "lo": lo, "hi": hi, "lo_open": lo_open,
            "min_len": min_len, "flatten": flatten}
    if isinstance(default, (list, dict, set)):
        return dataclasses.field(default_factory=functools.partial(type(default), default), metadata=meta)
    if default is _MISSING and flatten:
        raise TypeError("a flattened settings group needs a default (its own defaults)")
    return dataclasses.field(default=default, metadata=meta)


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls) -> list[dataclasses.Field]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a settings dataclass")
    return [f for f in dataclasses.fields(cls) if f.init]


def known_keys(cls) -> list[str]:
    """Every key the flat table may hold for ``cls`` (flattened groups included)."""
    out: list[str] = []
    hints = _hints(cls)
    for f in _fields(cls):
        if f.metadata.get("flatten"):
            out += known_keys(hints[f.name])
        else:
            out.append(f.name)
    return out


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join(_type_name(a) for a in get_args(tp))
    if origin in (tuple, list):
        args = [a for a in get_args(tp) if a is not Ellipsis]
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "table"
    if tp is type(None):
        return "none"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, algo: str) -> Any:
    """``value`` checked against ``tp`` (and converted where lossless: int -> float, list -> tuple)."""
    def fail(expected: str) -> SettingsError:
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return _bad(algo, key, f"must be {expected}, got {shown}")

    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin is Literal:
        allowed = get_args(tp)
        v = value.strip().lower() if isinstance(value, str) else value
        if v not in allowed:
            raise fail("one of " + ", ".join(repr(a) for a in allowed))
        return v
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise fail(_type_name(tp))
        errors = []
        # the value's own type first: 15 for ``float | int`` stays the count 15, not the fraction 15.0
        for a in sorted((a for a in args if a is not type(None)), key=lambda a: a is not type(value)):
            try:
                return _coerce(value, a, key, algo)
            except SettingsError as e:
                errors.append(e)
        raise fail(_type_name(tp))
    if tp is bool:
        if not isinstance(value, bool):
            raise fail("true or false")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail("an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise fail("a finite number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise fail("a string")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise fail(f"a {_type_name(tp)}")
        item_args = [a for a in get_args(tp) if a is not Ellipsis]
        item_tp = item_args[0] if item_args else Any
        coerced = [_coerce(v, item_tp, f"{key}[{i}]", algo) for i, v in enumerate(value)]
        return tuple(coerced) if origin is tuple else coerced
    if origin is dict:
        if not isinstance(value, dict):
            raise fail("a table")
        return dict(value)
    if tp is type(None):
        if value is not None:
            raise fail("none")
        return None
    raise TypeError(f"{algo}: settings type {tp!r} of {key} is not supported by the parser")


def _check_range(value: Any, f: dataclasses.Field, key: str, algo: str) -> None:
    m = f.metadata
    vals = value if isinstance(value, (list, tuple)) else [value]
    if m.get("min_len") is not None and isinstance(value, (list, tuple)) and len(value) < m["min_len"]:
        raise _bad(algo, key, f"needs at least {m['min_len']} value(s), got {list(value)}")
    for v in vals:
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float, str)):
            continue
        if m.get("choices") is not None and v not in m["choices"]:
            raise _bad(algo, key, f"must be one of {list(m['choices'])}, got {v!r}")
        if isinstance(v, str):
            continue
        lo, hi = m.get("lo"), m.get("hi")
        if lo is not None and (v < lo or (m.get("lo_open") and v == lo)):
            rel = ">" if m.get("lo_open") else ">="
            raise _bad(algo, key, f"must be {rel} {lo:g}, got {v!r}")
        if hi is not None and v > hi:
            raise _bad(algo, key, f"must be <= {hi:g}, got {v!r}")


def parse_settings(cls, table: dict | None, algo: str = "algorithm", *, ignore: tuple = ("name",)):
    """Build ``cls`` from a flat table; every error names the key (and the closest known one)."""
    raw = {k: v for k, v in dict(table or {}).items() if k not in ignore}
    known = known_keys(cls)
    unknown = sorted(k for k in raw if k not in known)
    if unknown:
        hints = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), known, n=1, cutoff=0.6)
            hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise SettingsError(f"{algo}: unknown setting(s) {', '.join(hints)}; "
                            f"`fedhet presets --describe {algo}` lists the known keys", key=str(unknown[0]))
    return _build(cls, raw, algo)


def _build(cls, raw: dict, algo: str):
    hints = _hints(cls)
    kw = {}
    for f in _fields(cls):
        if f.metadata.get("flatten"):
            kw[f.name] = _build(hints[f.name], raw, algo)
            continue
        if f.name in raw:
            v = _coerce(raw[f.name], hints[f.name], f.name, algo)
        elif f.default is not _MISSING:
            v = f.default
        elif f.default_factory is not _MISSING:  # type: ignore[misc]
            v = f.default_factory()  # type: ignore[misc]
        else:
            raise _bad(algo, f.name, f"is required ({f.metadata.get('doc', '')})")
        _check_range(v, f, f.name, algo)
        kw[f.name] = v
    obj = cls(**kw)
    check = getattr(obj, "validate", None)
    if callable(check):
        try:
            check()
        except SettingsError:
            raise
        except ValueError as e:
            msg = str(e)
            raise SettingsError(msg if msg.startswith(f"{algo}: ") else f"{algo}: {msg}") from None
    return obj


def settings_dict(obj) -> dict:
    """The flat table that parses back to ``obj`` (flattened groups merged in)."""
    out: dict = {}
    for f in _fields(type(obj)):
        v = getattr(obj, f.name)
        if f.metadata.get("flatten"):
            out.update(settings_dict(v))
        else:
            out[f.name] = list(v) if isinstance(v, tuple) else v
    return out


def describe_settings(cls) -> list[dict]:
    """[{key, type, default, doc}] for every key of ``cls``, flattened groups included."""
    hints = _hints(cls)
    rows = []
    for f in _fields(cls):
        if f.metadata.get("flatten"):
            rows += describe_settings(hints[f.name])
            continue
        if f.default is not _MISSING:
            d = f.default
        elif f.default_factory is not _MISSING:  # type: ignore[misc]
            d = f.default_factory()  # type: ignore[misc]
        else:
            d = "(required)"
        m = f.metadata
        rng = []
        if m.get("choices"):
            rng.append("one of " + ", ".join(map(str, m["choices"])))
        if m.get("lo") is not None:
            rng.append(f"{'>' if m.get('lo_open') else '>='} {m['lo']:g}")
        if m.get("hi") is not None:
            rng.append(f"<= {m['hi']:g}")
        rows.append({"key": f.name, "type": _type_name(hints[f.name]),
                     "default": list(d) if isinstance(d, tuple) else d,
                     "doc": m.get("doc", ""), "range": "; ".join(rng)})
    return rows
