"""One party's own data table: the ``[party.data]`` keys, reading CSV / Parquet / ``.npz``, and
validating every cell before any training starts.

Each party of a federation reads only its own file; the federation file (shared by all parties)
names it in that party's section.  This module knows nothing about any algorithm: it turns the
section into a :class:`TableSpec`, reads the file into a :class:`PartyTable` (IDs, float32
features, label codes) and raises a :class:`DataFileError` naming the party, file, row and column
of the first bad value.  Which roles need an ID or a label column, and which feature counts must
agree between parties, is the algorithm wiring's business (``require=`` of
:meth:`TableSpec.from_dict`, the ``n_features`` key, :func:`check_features`,
:func:`check_agreement`).

Keys (see :data:`SPEC_KEYS`; the user-facing description is ``docs/user_data.md``)::

    [party.data]
    path = "client1.csv"          # relative to the federation file's folder
    id = "id"                     # ID column (vertical algorithms align rows on it)
    label = "y"                   # label column (roles that hold labels)
    classes = [0, 1, 2]           # every label value, in the order that defines codes 0..C-1
    features = "rest"             # or a list of column names
    ignore = ["date"]             # columns "rest" leaves out
    n_features = 12               # the number of feature columns this party must have

Formats, by file suffix or the ``format`` key: ``.csv`` / ``.csv.gz`` / ``.tsv`` (UTF-8 text with
a header line; ``.tsv`` defaults to a tab delimiter), ``.parquet`` / ``.pq`` (through pyarrow), and
NumPy ``.npz`` (each 1-D array is one column named by its key; a 2-D array ``data`` with a 1-D
string array ``columns`` holds several columns at once; both may be mixed).

Positions in messages: **data row N** counts data rows from 1 and does not count the header, so
row 1 is the first row of values (a spreadsheet that shows the header as its row 1 shows data row
N as its row N + 1).  For text files the message also gives the **line** of the file (the header
is line 1).  Columns are named by their header; columns without a name (a 2-D ``.npy`` matrix in
the built-in loaders) are numbered from 1.

:func:`check_finite` is the one NaN/inf check, shared with the built-in loaders
(``data_tabular``, ``data_fate``).
"""
from __future__ import annotations

import csv
import difflib
import gzip
import os
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from fedhet.parties.federation import DATA_KEYS, DataSettings
from fedhet.parties.settings import SettingsError, parse_settings

FORMATS = ("csv", "parquet", "npz")

#: Every key of a party's data section, with a one-line description (docs and error hints): the
#: federation file's own list, so a misspelt key fails when the file is loaded.
SPEC_KEYS: dict[str, str] = DATA_KEYS

_F32_MAX = float(np.finfo(np.float32).max)
_INT64 = (-(2 ** 63), 2 ** 63 - 1)
_SHOW = 40  # at most this many characters of a cell's text are repeated in a message


# --------------------------------------------------------------------------------------------
# errors


class PartyDataError(ValueError):
    """A party's data section or data file is wrong; the message says where and how.

    Attributes (``None`` where they do not apply): ``party``, ``path``, ``row`` (1-based data
    row), ``line`` (1-based line of a text file), ``column`` (name, or 1-based number), ``value``
    (the offending text or value), ``key`` (the offending key of the data section).
    """

    def __init__(self, message: str, *, party: str | None = None, path: str | os.PathLike | None = None,
                 row: int | None = None, line: int | None = None, column: str | int | None = None,
                 value: Any = None, key: str | None = None):
        super().__init__(message)
        self.party, self.path, self.row, self.line = party, path, row, line
        self.column, self.value, self.key = column, value, key


class DataSpecError(PartyDataError):
    """The data section of a party in the federation file is wrong (a key, its type or value)."""


class DataFileError(PartyDataError):
    """A party's data file is missing, unreadable or holds a bad value."""


def _show(v: Any) -> str:
    s = str(v)  # also turns numpy scalars (np.str_('5')) into their plain text
    return repr(s if len(s) <= _SHOW else s[:_SHOW] + "...")


def describe_position(*, party: str | None = None, dataset: str | None = None,
                      path: str | os.PathLike | None = None, row: int | None = None,
                      line: int | None = None, column: str | int | None = None,
                      argument: str | None = None) -> str:
    """``party 'c1', file 'c1.csv', data row 3 (line 4), column 'b'`` (the parts that are given).

    With ``argument`` (an array handed to a Python function) rows and numbered columns also give
    their 0-based index: ``party 'c1', argument 'X', row 3 (index 2), column 5 (index 4)``."""
    parts = []
    if party:
        parts.append(f"party {party!r}")
    if dataset:
        parts.append(f"dataset {dataset!r}")
    if argument:
        parts.append(f"argument {argument!r}")
    if path is not None:
        parts.append(f"file {str(path)!r}")
    if row is not None:
        if argument:
            parts.append(f"row {row} (index {row - 1})")
        else:
            parts.append(f"data row {row}" + (f" (line {line})" if line is not None else ""))
    if column is not None:
        if isinstance(column, int):
            parts.append(f"column {column}" + (f" (index {column - 1})" if argument else ""))
        else:
            parts.append(f"column {column!r}")
    return ", ".join(parts)


def _closest(name: str, choices: Iterable[str]) -> str:
    choices = list(choices)
    near = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    if near:
        return f"did you mean {near[0]!r}?"
    shown = ", ".join(repr(c) for c in choices[:20]) + (f", ... ({len(choices)} in all)" if len(choices) > 20 else "")
    return f"columns are: {shown}" if shown else "there are no columns"


# --------------------------------------------------------------------------------------------
# the spec


@dataclass(frozen=True)
class TableSpec:
    """Where one party's table is and which columns play which part (see :data:`SPEC_KEYS`).

    Build it with :meth:`from_dict` from the party's data section, or directly.  Nothing here
    touches the file: the federation file names every party's file, but only the party itself has
    it, so existence and content are checked by :func:`load_party_table`.
    """

    path: Path
    party: str = ""
    format: str = ""
    id: str | None = None
    id_type: str = "str"
    label: str | None = None
    classes: tuple | None = None
    features: tuple[str, ...] | None = None  # None = "rest"
    ignore: tuple[str, ...] = ()
    n_features: int | None = None
    delimiter: str = ""
    section: str = field(default="[party.data]", compare=False)  # how messages name the section

    def __post_init__(self) -> None:
        def bad(key: str, msg: str) -> DataSpecError:
            return DataSpecError(f"party {self.party!r}, {self.section} key {key!r}: {msg}",
                                 party=self.party or None, key=key)

        if not isinstance(self.path, (str, os.PathLike)) or not str(self.path):
            raise bad("path", "must be a non-empty file name")
        path = Path(self.path).expanduser()
        object.__setattr__(self, "path", path)
        fmt = self.format or format_from_name(path)
        if fmt is None:
            raise bad("path", f"cannot tell the format from {path.name!r}; name it .csv, .csv.gz, .tsv, "
                              f".parquet, .pq or .npz, or set format = \"csv\" | \"parquet\" | \"npz\"")
        if fmt not in FORMATS:
            raise bad("format", f"{fmt!r} is not one of {', '.join(FORMATS)}")
        object.__setattr__(self, "format", fmt)
        for key in ("id", "label"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, str) or not v.strip()):
                raise bad(key, "must be a column name (a non-empty string)")
        if self.id_type not in ("str", "int"):
            raise bad("id_type", f"must be \"str\" or \"int\", got {self.id_type!r}")
        if self.id is not None and self.id == self.label:
            raise bad("label", f"{self.label!r} is also the id column")
        if self.classes is not None:
            cl = self.classes
            if isinstance(cl, (str, bytes)) or not isinstance(cl, Iterable):
                raise bad("classes", "must be a list of label values, e.g. [0, 1, 2] or [\"cat\", \"dog\"]")
            cl = tuple(cl.tolist() if isinstance(cl, np.ndarray) else cl)
            if not cl:
                raise bad("classes", "is empty")
            is_int = [isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) for c in cl]
            if all(is_int):
                cl = tuple(int(c) for c in cl)
            elif all(isinstance(c, str) for c in cl):
                if any(not c.strip() for c in cl):
                    raise bad("classes", "holds an empty string")
                cl = tuple(c.strip() for c in cl)
            else:
                raise bad("classes", f"must be all integers or all strings, got {list(cl)!r}")
            dup = _first_duplicate(cl)
            if dup is not None:
                raise bad("classes", f"lists {dup!r} twice")
            if self.label is None:
                raise bad("classes", "is set but there is no label column (key 'label')")
            object.__setattr__(self, "classes", cl)
        if self.features is not None:
            fs = self.features
            if isinstance(fs, str):
                if fs != "rest":
                    raise bad("features", f"must be a list of column names or \"rest\", got {fs!r}")
                fs = None
            else:
                fs = tuple(fs)
                if not fs:
                    raise bad("features", "is an empty list")
                if any(not isinstance(f, str) or not f.strip() for f in fs):
                    raise bad("features", "must hold column names (non-empty strings)")
                dup = _first_duplicate(fs)
                if dup is not None:
                    raise bad("features", f"lists {dup!r} twice")
                for key in ("id", "label"):
                    if getattr(self, key) is not None and getattr(self, key) in fs:
                        raise bad("features", f"{getattr(self, key)!r} is the {key} column, not a feature")
            object.__setattr__(self, "features", fs)
        ig = self.ignore
        if isinstance(ig, str) or not isinstance(ig, Iterable) or any(not isinstance(c, str) for c in ig):
            raise bad("ignore", "must be a list of column names")
        ig = tuple(ig)
        if ig and self.features is not None:
            raise bad("ignore", "only applies with features = \"rest\"; leave the columns out of the features list instead")
        for key in ("id", "label"):
            if getattr(self, key) is not None and getattr(self, key) in ig:
                raise bad("ignore", f"{getattr(self, key)!r} is the {key} column")
        object.__setattr__(self, "ignore", ig)
        nf = self.n_features
        if nf is not None:
            if not isinstance(nf, (int, np.integer)) or isinstance(nf, bool) or nf < 1:
                raise bad("n_features", f"must be a positive integer, got {nf!r}")
            object.__setattr__(self, "n_features", int(nf))
            if self.features is not None and len(self.features) != nf:
                raise bad("n_features", f"is {nf} but features lists {len(self.features)} columns")
        delim = self.delimiter or ("\t" if _strip_gz(path.name.lower()).endswith(".tsv") else ",")
        if not isinstance(delim, str) or len(delim) != 1 or delim in "\"\r\n":
            raise bad("delimiter", f"must be one character (not a quote or line break), got {delim!r}")
        if self.delimiter and fmt != "csv":
            raise bad("delimiter", f"only applies to CSV files, this is {fmt}")
        object.__setattr__(self, "delimiter", delim)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, party: str = "",
                  base_dir: str | os.PathLike | None = None, require: Iterable[str] = (),
                  section: str = "[party.data]") -> "TableSpec":
        """Parse a party's data section (a dict, as TOML gives it).

        ``base_dir`` (the federation file's folder) is where relative paths start.  ``require``
        names keys the caller's role needs (``"id"``, ``"label"``, ``"classes"``, ``"n_features"``).
        Errors name the party and the key; an unknown key names the closest known one.
        """
        def bad(key: str, msg: str) -> DataSpecError:
            return DataSpecError(f"party {party!r}, {section} key {key!r}: {msg}", party=party or None, key=key)

        if not isinstance(d, Mapping):
            raise DataSpecError(f"party {party!r}: {section} must be a table of keys (path = ..., id = ..., ...)",
                                party=party or None)
        for k in d:
            if k not in SPEC_KEYS:
                near = difflib.get_close_matches(str(k), list(SPEC_KEYS), n=1, cutoff=0.5)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise bad(str(k), f"unknown key{hint}; known keys: {', '.join(SPEC_KEYS)}")
        for k in require:
            if k not in SPEC_KEYS:
                raise ValueError(f"require: {k!r} is not a data key")
            if d.get(k) is None:
                raise bad(k, f"is required here ({SPEC_KEYS[k]})")
        if "path" not in d:
            raise bad("path", "is required (the party's data file)")
        try:   # types by the one settings parser; what only the values can say, in __post_init__
            v = parse_settings(DataSettings, dict(d), f"party {party!r}, {section}", ignore=())
        except SettingsError as e:
            raise bad(e.key or "?", e.detail) from None
        if not v.path.strip():
            raise bad("path", f"must be a non-empty string, got {v.path!r}")
        path = Path(v.path).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        return cls(path=path, party=party, format=v.format, id=v.id, id_type=v.id_type, label=v.label,
                   classes=v.classes, features=v.features, ignore=tuple(v.ignore), n_features=v.n_features,
                   delimiter=v.delimiter, section=section)

    def to_dict(self) -> dict[str, Any]:
        """The keys that reproduce this spec (``path`` as given to the spec, resolved)."""
        out: dict[str, Any] = {"path": str(self.path), "format": self.format}
        if self.id is not None:
            out["id"] = self.id
            out["id_type"] = self.id_type
        if self.label is not None:
            out["label"] = self.label
        if self.classes is not None:
            out["classes"] = list(self.classes)
        out["features"] = "rest" if self.features is None else list(self.features)
        if self.ignore:
            out["ignore"] = list(self.ignore)
        if self.n_features is not None:
            out["n_features"] = self.n_features
        if self.format == "csv":
            out["delimiter"] = self.delimiter
        return out


def _strip_gz(name: str) -> str:
    return name[:-3] if name.endswith(".gz") else name


def format_from_name(path: str | os.PathLike) -> str | None:
    """``csv`` / ``parquet`` / ``npz`` from a file name, or None when the suffix says nothing."""
    name = Path(path).name.lower()
    if _strip_gz(name).endswith((".csv", ".tsv", ".txt")):
        return "csv"
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".npz"):
        return "npz"
    return None


def _first_duplicate(seq: Sequence) -> Any:
    seen: set = set()
    for v in seq:
        if v in seen:
            return v
        seen.add(v)
    return None


# --------------------------------------------------------------------------------------------
# the table


@dataclass
class PartyTable:
    """One party's rows, validated: row ``i`` of ``X``, ``ids`` and ``y`` is data row ``i + 1``."""

    party: str
    path: Path
    X: np.ndarray  # float32 (n, d), C-contiguous, all finite
    feature_names: tuple[str, ...]
    ids: np.ndarray | None = None  # 1-D str (numpy unicode) or int64; unique; None without an id column
    y: np.ndarray | None = None  # int64 codes 0..C-1 into classes; None without a label column
    classes: tuple | None = None  # label values, code c is classes[c]
    classes_declared: bool = False  # False: classes were read off this file (sorted), not declared
    id_column: str | None = None
    label_column: str | None = None

    @property
    def n_rows(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    @property
    def n_classes(self) -> int | None:
        return None if self.classes is None else len(self.classes)

    def describe(self) -> str:
        """One line for logs: rows, features, IDs, classes."""
        s = f"{self.path.name}: {self.n_rows:,} rows, {self.n_features} feature columns"
        if self.ids is not None:
            s += f", IDs ({'int' if self.ids.dtype.kind == 'i' else 'str'}) in {self.id_column!r}"
        if self.classes is not None:
            s += f", labels in {self.label_column!r} ({len(self.classes)} classes"
            s += ")" if self.classes_declared else ", read off the file)"
        return s


# --------------------------------------------------------------------------------------------
# the shared NaN / inf check


def check_finite(X: np.ndarray, *, columns: Sequence[str | int] | None = None, party: str | None = None,
                 dataset: str | None = None, path: str | os.PathLike | None = None,
                 lines: Sequence[int] | None = None, what: str = "value", argument: str | None = None,
                 rows: Sequence[int] | np.ndarray | None = None) -> None:
    """Raise :class:`DataFileError` at the first NaN or infinite cell of ``X`` (1-D or 2-D), in
    row order, naming the data row (1-based; ``lines[i]`` is row i's line in a text file), the
    column (``columns[j]``, else its 1-based number) and how many cells are bad in all.

    Arrays handed to the Python API are checked the same way: ``argument`` names the parameter,
    ``rows[i]`` is the 1-based row of ``X[i]`` in the caller's array when ``X`` is a part of it
    (``columns`` may then hold 1-based column numbers)."""
    a = np.asarray(X)
    if a.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(a)
    if not bad.any():
        return
    a2 = a.reshape(len(a), -1)
    bad2 = bad.reshape(len(a), -1)
    count = int(bad2.sum())
    r, c = (int(v) for v in np.argwhere(bad2)[0])
    v = a2[r, c]
    kind = "NaN (a missing value?)" if np.isnan(v) else ("+inf" if v > 0 else "-inf")
    col: str | int | None
    if a.ndim == 1:
        col = columns[0] if columns is not None and len(columns) == 1 else None
    else:
        col = columns[c] if columns is not None else c + 1
    if isinstance(col, (np.integer,)):
        col = int(col)
    row = r + 1 if rows is None else int(rows[r])
    line = None if lines is None else lines[r]
    where = describe_position(party=party, dataset=dataset, path=path, row=row, line=line, column=col,
                              argument=argument)
    more = f" ({count - 1} more non-finite cells)" if count > 1 else ""
    raise DataFileError(f"{where}: {what} is {kind}; values must be finite numbers{more}",
                        party=party, path=path, row=row, line=line, column=col, value=float(v))


# --------------------------------------------------------------------------------------------
# readers: each gives column names, a row count and the requested columns


@dataclass
class _Col:
    values: Any  # ndarray (numeric or str) or a sequence of str (CSV)
    text: bool  # values are strings
    null: np.ndarray | None = None  # True where the file holds no value (Parquet nulls)
    type_name: str = ""  # for columns that are neither numbers nor text


class _Where:
    """Builds errors for one file (party, path, and the line of each data row when known)."""

    def __init__(self, party: str, path: Path, lines: Sequence[int] | None = None):
        self.party, self.path, self.lines = party, path, lines

    def err(self, msg: str, row_index: int | None = None, column: str | int | None = None,
            value: Any = None) -> DataFileError:
        row = None if row_index is None else row_index + 1
        line = None if (row_index is None or self.lines is None) else self.lines[row_index]
        where = describe_position(party=self.party or None, path=self.path, row=row, line=line, column=column)
        return DataFileError(f"{where}: {msg}", party=self.party or None, path=self.path, row=row,
                             line=line, column=column, value=value)


class _CsvSource:
    def __init__(self, path: Path, delimiter: str, w: _Where):
        opener = gzip.open if path.name.lower().endswith(".gz") else open
        rows: list[list[str]] = []
        lines: list[int] = []
        header: list[str] | None = None
        reader = None
        try:
            # utf-8-sig: spreadsheet programs often start the file with a byte-order mark
            with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:
                reader = csv.reader(fh, delimiter=delimiter)
                prev = 0
                for rec in reader:
                    start, prev = prev + 1, reader.line_num
                    if not rec or (not rec[0].strip() and not any(f.strip() for f in rec)):
                        continue  # blank lines (and ",,," lines spreadsheets append) hold no data
                    if header is None:
                        header = rec
                        self.header_line = start
                        continue
                    rows.append(rec)
                    lines.append(start)
        except UnicodeDecodeError as e:
            raise w.err(f"is not UTF-8 text (byte {e.start} of a line near line "
                        f"{(reader.line_num if reader else 0) + 1}); save it as UTF-8 CSV") from None
        except csv.Error as e:
            raise w.err(f"line {(reader.line_num if reader else 0)}: not valid CSV: {e}") from None
        except (OSError, EOFError) as e:
            raise w.err(f"cannot be read: {type(e).__name__}: {e}") from None
        if header is None:
            raise w.err("is empty (no header line with the column names)")
        self.names = [h.strip() for h in header]
        self.lines = lines
        self.n = len(rows)
        m = len(header)
        for i, r in enumerate(rows):
            if len(r) != m:
                raise _Where(w.party, w.path, lines).err(
                    f"has {len(r)} fields but the header (line {self.header_line}) has {m}"
                    + (" (a trailing delimiter?)" if len(r) == m + 1 and not r[-1].strip() else ""), i)
        self._rows = rows

    def columns(self, names: Sequence[str]) -> dict[str, _Col]:
        idx = {n: j for j, n in enumerate(self.names)}
        cols = list(zip(*self._rows)) if self._rows else [()] * len(self.names)
        return {n: _Col(cols[idx[n]], text=True) for n in names}


class _ParquetSource:
    def __init__(self, path: Path, w: _Where):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise w.err("is Parquet, which needs pyarrow: pip install pyarrow") from None
        try:
            self._file = pq.ParquetFile(path)
            self.names = list(self._file.schema_arrow.names)
            self.n = int(self._file.metadata.num_rows)
        except Exception as e:  # pyarrow raises ArrowInvalid / OSError for files that are not Parquet
            raise w.err(f"cannot be read as Parquet: {type(e).__name__}: {e}") from None
        self.lines = None
        self._w = w

    def columns(self, names: Sequence[str]) -> dict[str, _Col]:
        import pyarrow as pa

        try:
            tbl = self._file.read(columns=list(names))
        except Exception as e:
            raise self._w.err(f"cannot be read as Parquet: {type(e).__name__}: {e}") from None
        out = {}
        for n in names:
            ch = tbl.column(n)
            t = ch.type
            if pa.types.is_dictionary(t):  # categorical columns: their values, not their codes
                ch = ch.cast(t.value_type)
                t = ch.type
            null = ch.is_null().to_numpy(zero_copy_only=False) if ch.null_count else None
            if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
                out[n] = _Col(ch.to_numpy(), text=False, null=null)
            elif pa.types.is_string(t) or pa.types.is_large_string(t):
                out[n] = _Col(ch.to_pylist(), text=True, null=null)
            else:
                out[n] = _Col(None, text=False, null=null, type_name=str(t))
        return out


class _NpzSource:
    def __init__(self, path: Path, w: _Where):
        try:
            z = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
            raise w.err(f"cannot be read as NumPy .npz: {type(e).__name__}: {e}") from None
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise w.err("is a single NumPy array (.npy), not an .npz archive of named columns; "
                        "save with numpy.savez(path, id=..., a=..., ...)")
        arrays: dict[str, np.ndarray] = {}
        with z:
            for k in z.files:
                try:
                    arrays[k] = z[k]
                except ValueError:
                    raise w.err(f"array {k!r} holds Python objects, which are not read (no pickles); "
                                f"save strings as a NumPy string array, e.g. numpy.asarray(ids, dtype=str)") from None
        if not arrays:
            raise w.err("holds no arrays")
        cols: dict[str, np.ndarray] = {}
        names: list[str] = []

        def add(name: str, a: np.ndarray, what: str) -> None:
            if name in cols:
                raise w.err(f"column {name!r} is given twice ({what} and an earlier array)")
            cols[name] = a
            names.append(name)

        if "data" in arrays or "columns" in arrays:
            if "data" not in arrays or "columns" not in arrays:
                raise w.err("arrays 'data' and 'columns' come together: 'data' is a 2-D array and "
                            "'columns' names its columns (a 1-D string array)")
            data, cn = arrays["data"], arrays["columns"]
            if data.ndim != 2:
                raise w.err(f"array 'data' must be 2-D (rows x columns), it has shape {data.shape}")
            if cn.ndim != 1 or cn.dtype.kind not in "US" or len(cn) != data.shape[1]:
                raise w.err(f"array 'columns' must be a 1-D string array of {data.shape[1]} names "
                            f"(one per column of 'data'), it is {cn.dtype} of shape {cn.shape}")
            for j, c in enumerate(cn.astype(str).tolist()):
                add(c.strip(), data[:, j], "'columns'")
        for k, a in arrays.items():
            if k in ("data", "columns"):
                continue
            if a.ndim != 1:
                raise w.err(f"array {k!r} has shape {a.shape}; each array other than 'data' is one "
                            f"column and must be 1-D")
            add(k, a, f"array {k!r}")
        lens = {n: len(a) for n, a in cols.items()}
        if len(set(lens.values())) > 1:
            first = names[0]
            other = next(n for n in names if lens[n] != lens[first])
            raise w.err(f"columns have different lengths: {first!r} has {lens[first]} rows, {other!r} has {lens[other]}")
        self.names = names
        self.n = next(iter(lens.values())) if lens else 0
        self.lines = None
        self._cols = cols
        self._w = w

    def columns(self, names: Sequence[str]) -> dict[str, _Col]:
        out = {}
        for n in names:
            a = self._cols[n]
            if a.dtype.kind == "S":
                try:
                    a = a.astype(str)
                except UnicodeDecodeError:
                    raise self._w.err("holds bytes that are not ASCII; save text as a str array",
                                      column=n) from None
            if a.dtype.kind in "iufb":
                out[n] = _Col(a, text=False)
            elif a.dtype.kind == "U":
                out[n] = _Col(a, text=True)
            else:
                out[n] = _Col(None, text=False, type_name=str(a.dtype))
        return out


# --------------------------------------------------------------------------------------------
# column conversions


def _check_nulls(col: _Col, name: str, w: _Where, what: str) -> None:
    if col.null is not None and col.null.any():
        raise w.err(f"missing {what} (null)", int(np.argmax(col.null)), name)


def _to_float(col: _Col, name: str, w: _Where) -> np.ndarray:
    _check_nulls(col, name, w, "value")
    if col.text:
        vals = col.values
        try:
            a = _parse_floats(vals)
        except (ValueError, TypeError):
            for i, s in enumerate(vals):
                try:
                    float(s)
                except (ValueError, TypeError):
                    if s is None or not str(s).strip():
                        raise w.err("missing value (empty cell); every feature cell needs a number",
                                    i, name, s) from None
                    raise w.err(f"non-numeric value {_show(s)}; feature columns must hold numbers",
                                i, name, s) from None
            raise  # float() and numpy disagree: let the original error through
    elif col.values is not None:
        a = np.asarray(col.values).astype(np.float64)
    else:
        raise w.err(f"has type {col.type_name}; feature columns must hold numbers", column=name)
    fin = np.isfinite(a)
    if not fin.all():
        i = int(np.argmin(fin))
        text = f" {_show(col.values[i])}" if col.text else ""
        kind = "NaN (a missing value?)" if np.isnan(a[i]) else ("+inf" if a[i] > 0 else "-inf")
        raise w.err(f"value{text} is {kind}; values must be finite numbers", i, name, col.values[i])
    big = np.abs(a) > _F32_MAX
    if big.any():
        i = int(np.argmax(big))
        raise w.err(f"value {_show(col.values[i])} is too large for float32 (at most {_F32_MAX:.3g} "
                    f"in magnitude)", i, name, col.values[i])
    return a


def _parse_floats(vals: Sequence[str]) -> np.ndarray:
    """Text cells to float64; ValueError/TypeError if any cell is not a number."""
    try:
        # numpy's C parser, about twice as fast as float() per cell; it skips empty lines, so a
        # short result means an empty cell, which float() below then reports
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "input contained no data" when every cell is empty
            a = np.loadtxt(vals, dtype=np.float64, comments=None, delimiter="\x1f", ndmin=1, encoding=None)
        if a.shape == (len(vals),):
            return a
    except (ValueError, TypeError):
        pass
    return np.fromiter(map(float, vals), dtype=np.float64, count=len(vals))


def _integral(v: Any) -> int | None:
    """The integer a label/ID value stands for (``3``, ``3.0``, ``"3"``, ``" 3.0 "``), else None."""
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s)
        except ValueError:
            try:
                v = float(s)
            except ValueError:
                return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return int(f) if np.isfinite(f) and f == int(f) else None


def _to_ids(col: _Col, name: str, id_type: str, w: _Where) -> np.ndarray:
    _check_nulls(col, name, w, "ID")
    vals = col.values
    if vals is None:
        raise w.err(f"has type {col.type_name}; IDs must be text or integers", column=name)
    if col.text:
        s = [str(v).strip() for v in vals]
        empty = next((i for i, v in enumerate(s) if not v), None)
        if empty is not None:
            raise w.err("missing ID (empty cell)", empty, name, vals[empty])
        if id_type == "str":
            return np.array(s, dtype=str)
        try:
            return np.fromiter(map(int, s), dtype=np.int64, count=len(s))
        except (ValueError, OverflowError):
            for i, v in enumerate(s):
                try:
                    k = int(v)
                except ValueError:
                    raise w.err(f"ID {_show(v)} is not an integer (id_type = \"int\")", i, name, v) from None
                if not _INT64[0] <= k <= _INT64[1]:
                    raise w.err(f"ID {_show(v)} does not fit in 64 bits (id_type = \"int\"; use \"str\")",
                                i, name, v) from None
            raise
    a = np.asarray(vals)
    if a.dtype.kind == "b":
        raise w.err("IDs must be text or integers, this column is true/false", column=name)
    if a.dtype.kind == "f":
        bad = ~np.isfinite(a) | (a != np.round(a))
        if bad.any():
            i = int(np.argmax(bad))
            raise w.err(f"ID {a[i]!r} is not a whole number", i, name, a[i])
        if np.abs(a).max() >= 2.0 ** 53:
            i = int(np.argmax(np.abs(a) >= 2.0 ** 53))
            raise w.err(f"ID {a[i]!r} is beyond 2**53, where floats lose digits; store IDs as integers or text",
                        i, name, a[i])
    if a.dtype.kind == "u" and a.size and a.max() > _INT64[1]:
        i = int(np.argmax(a > _INT64[1]))
        raise w.err(f"ID {a[i]} does not fit in a signed 64-bit integer", i, name, a[i])
    a = a.astype(np.int64)
    return a if id_type == "int" else a.astype(str)


def _duplicate_rows(ids: np.ndarray) -> tuple[int, int] | None:
    """(first, second) 0-based rows of the duplicate whose second occurrence comes first."""
    if len(ids) < 2:
        return None
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if not len(dup):
        return None
    k = dup[np.argmin(order[dup + 1])]
    rows = np.flatnonzero(ids == s[k])
    return int(rows[0]), int(rows[1])


def _to_labels(col: _Col, name: str, classes: tuple | None, w: _Where) -> tuple[np.ndarray, tuple, bool]:
    _check_nulls(col, name, w, "label")
    vals = col.values
    if vals is None:
        raise w.err(f"has type {col.type_name}; labels must be integers or text", column=name)
    arr = np.asarray(vals)
    uniq, inv = np.unique(arr, return_inverse=True)
    inv = inv.reshape(-1)

    def first_row(k: int) -> int:
        return int(np.argmax(inv == k))

    def key_of(u: Any) -> Any:
        if col.text:
            s = str(u).strip()
            if not s:
                return None
            if classes is None or isinstance(classes[0], int):
                k = _integral(s)
                return k if k is not None else (s if classes is None else None)
            return s
        k = _integral(u)
        if classes is not None and isinstance(classes[0], str):
            return str(k) if k is not None else str(u)
        return k

    keys = [key_of(u) for u in uniq.tolist()]
    if classes is None:
        for k, key in enumerate(keys):
            if key is None:
                raise w.err("missing label (empty cell)" if col.text else
                            f"label {uniq[k]!r} is not an integer or text", first_row(k), name, uniq[k])
        if all(isinstance(k, int) for k in keys):
            found = tuple(sorted(set(keys)))
        else:
            keys = [str(k) for k in keys]
            found = tuple(sorted(set(keys)))
        lookup = {c: i for i, c in enumerate(found)}
        declared = False
    else:
        lookup = {c: i for i, c in enumerate(classes)}
        misses = [k for k, key in enumerate(keys) if key not in lookup]
        if misses:
            rows = [first_row(k) for k in misses]
            j = int(np.argmin(rows))
            k = misses[j]
            raw = uniq[k]
            if col.text and not str(raw).strip():
                raise w.err("missing label (empty cell)", rows[j], name, raw)
            shown = list(classes) if len(classes) <= 20 else list(classes[:20]) + ["..."]
            raise w.err(f"label {_show(raw)} is not one of the declared classes {shown}", rows[j], name,
                        raw.item() if hasattr(raw, "item") else raw)
        found = classes
        declared = True
    lut = np.array([lookup[k] for k in keys], dtype=np.int64)
    return lut[inv], found, declared


# --------------------------------------------------------------------------------------------
# loading


def load_party_table(spec: TableSpec) -> PartyTable:
    """Read and validate one party's table; :class:`DataFileError` names the first problem."""
    path = spec.path
    w = _Where(spec.party, path)
    if not path.exists():
        raise w.err("not found" + ("" if path.is_absolute() else f" (relative to {os.getcwd()})"))
    if path.is_dir():
        raise w.err("is a folder, not a file")
    if spec.format == "csv":
        src: Any = _CsvSource(path, spec.delimiter, w)
    elif spec.format == "parquet":
        src = _ParquetSource(path, w)
    else:
        src = _NpzSource(path, w)
    names = list(src.names)
    for j, n in enumerate(names):
        if not n:
            raise w.err(f"column {j + 1} has no name; give every column a name in the header "
                        f"(pandas writes an unnamed index column unless to_csv(index=False))")
    for j, n in enumerate(names):
        if n in names[:j]:
            raise w.err(f"column name {n!r} appears twice (columns {names.index(n) + 1} and {j + 1})")

    def must_exist(col: str, key: str) -> None:
        if col not in names:
            err = w.err(f"no column {col!r} (the {key} key); {_closest(col, names)}", column=col)
            err.key = key
            raise err

    if spec.id is not None:
        must_exist(spec.id, "id")
    if spec.label is not None:
        must_exist(spec.label, "label")
    for c in spec.ignore:
        must_exist(c, "ignore")
    if spec.features is not None:
        for c in spec.features:
            must_exist(c, "features")
        feats = list(spec.features)
    else:
        skip = {spec.id, spec.label, *spec.ignore}
        feats = [n for n in names if n not in skip]
    if not feats:
        raise w.err("has no feature columns (every column is the id, the label or ignored)")
    if src.n == 0:
        raise w.err("has no data rows" + (" (only a header)" if spec.format == "csv" else ""))
    if spec.n_features is not None and len(feats) != spec.n_features:
        raise w.err(f"has {len(feats)} feature columns ({_list(feats)}), but n_features = {spec.n_features} "
                    f"in the federation file; the parties' tables must agree")

    w = _Where(spec.party, path, src.lines)
    wanted = feats + [c for c in (spec.id, spec.label) if c is not None and c not in feats]
    cols = src.columns(wanted)
    ids = None
    if spec.id is not None:
        ids = _to_ids(cols[spec.id], spec.id, spec.id_type, w)
        dup = _duplicate_rows(ids)
        if dup is not None:
            a, b = dup
            row_a = f"data row {a + 1}" + (f" (line {src.lines[a]})" if src.lines else "")
            raise w.err(f"duplicate ID {_show(ids[b].item())}, also in {row_a}", b, spec.id, ids[b].item())
    y = classes = None
    declared = False
    if spec.label is not None:
        y, classes, declared = _to_labels(cols[spec.label], spec.label, spec.classes, w)
    X = np.empty((src.n, len(feats)), dtype=np.float32)
    for j, f in enumerate(feats):
        X[:, j] = _to_float(cols[f], f, w)
    return PartyTable(party=spec.party, path=path, X=X, feature_names=tuple(feats), ids=ids, y=y,
                      classes=classes, classes_declared=declared, id_column=spec.id,
                      label_column=spec.label)


def _list(names: Sequence[str], k: int = 8) -> str:
    return ", ".join(names[:k]) + (f", ... ({len(names)} in all)" if len(names) > k else "")


# --------------------------------------------------------------------------------------------
# agreement between parties


def check_features(table: PartyTable, expected: int | Sequence[str], source: str = "the federation file") -> None:
    """The table must have ``expected`` feature columns (a count, or the names in order), as
    declared in ``source``; a :class:`DataFileError` names party, file, expected and found."""
    w = _Where(table.party, table.path)
    found = list(table.feature_names)
    if isinstance(expected, bool):
        raise TypeError(f"{source}: the expected features are a count or a list of names, got {expected!r}")
    if isinstance(expected, (int, np.integer)):
        if len(found) != int(expected):
            raise w.err(f"has {len(found)} feature columns ({_list(found)}), but {source} expects {int(expected)}")
        return
    exp = list(expected)
    if found != exp:
        if len(found) != len(exp):
            msg = f"has {len(found)} feature columns ({_list(found)}), but {source} expects {len(exp)} ({_list(exp)})"
        elif sorted(found) == sorted(exp):
            msg = f"has the expected feature columns in another order: {_list(found)} (expected {_list(exp)})"
        else:
            j = next(i for i, (a, b) in enumerate(zip(found, exp)) if a != b)
            msg = f"feature column {j + 1} is {found[j]!r}, but {source} expects {exp[j]!r}"
        raise w.err(msg)


def check_agreement(tables: Sequence[PartyTable] | Mapping[str, PartyTable], on: str = "n_features",
                    what: str = "") -> None:
    """Tables that must agree (e.g. the clients of a horizontal federation, when one process holds
    them all, as in tests and local runs) do: ``on`` is ``"n_features"``, ``"feature_names"`` or
    ``"classes"``.  The error names the first party that differs from the first table, both files,
    what was expected and what was found.  ``what`` adds why they must agree."""
    ts = list(tables.values()) if isinstance(tables, Mapping) else list(tables)
    getters = {"n_features": lambda t: t.n_features, "feature_names": lambda t: list(t.feature_names),
               "classes": lambda t: None if t.classes is None else list(t.classes)}
    if on not in getters:
        raise ValueError(f"on must be one of {', '.join(getters)}, got {on!r}")
    if not ts:
        return
    ref, get = ts[0], getters[on]
    for t in ts[1:]:
        if get(t) != get(ref):
            why = f" ({what})" if what else ""
            raise _Where(t.party, t.path).err(
                f"{on} is {get(t)!r}, but party {ref.party!r} (file {str(ref.path)!r}) has {get(ref)!r}; "
                f"they must agree{why}")
