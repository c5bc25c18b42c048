"""Users' own per-party data files: the spec, the three formats, and every bad-input message.

Tables are built in tmp_path from known arrays; round trips compare what was read with those
arrays.  Each bad-input test checks that the message names the party, the file, the data row
(1-based, header not counted) and the column.
"""
from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from fedhet.algorithms import data_fate, data_tabular
from fedhet.algorithms.party_table import (
    SPEC_KEYS,
    DataFileError,
    DataSpecError,
    PartyDataError,
    PartyTable,
    TableSpec,
    check_agreement,
    check_features,
    check_finite,
    describe_position,
    format_from_name,
    load_party_table,
)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

PARTY = "client1"

# ------------------------------------------------------------------------------- source table

N = 9
IDS = np.array([f"user-{i:03d}" for i in (5, 3, 8, 1, 0, 7, 2, 6, 4)])
RNG = np.random.default_rng(7)
# float32 values, so writing them as text and reading them back must give them exactly
FEATS = {"age": RNG.normal(40, 9, N).astype(np.float32),
         "income": (RNG.normal(0, 1, N) * 1e4).astype(np.float32),
         "score": RNG.uniform(-1, 1, N).astype(np.float32)}
LABELS = np.array([2, 0, 1, 1, 2, 0, 0, 2, 1])


def _rows(header, cols):
    return [header] + [[_txt(cols[h][i]) for h in header] for i in range(len(cols[header[0]]))]


def _txt(v) -> str:
    if isinstance(v, (np.floating, float)):
        return repr(float(v))
    return str(v)


def _columns():
    return {"id": IDS, **FEATS, "y": LABELS}


def write_csv(path: Path, rows, delimiter=","):
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wt", newline="") as fh:
        csv.writer(fh, delimiter=delimiter).writerows(rows)
    return path


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def write_parquet(path: Path, cols: dict):
    pa = pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (pip install pyarrow)")
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet files need pyarrow (pip install pyarrow)")
    pq.write_table(pa.table({k: (v if isinstance(v, list) else pa.array(v)) for k, v in cols.items()}), path)
    return path


def write_source(tmp_path: Path, kind: str) -> Path:
    """The source table in one of the formats; the header is id, age, income, score, y."""
    cols = _columns()
    header = list(cols)
    if kind == "csv":
        return write_csv(tmp_path / "t.csv", _rows(header, cols))
    if kind == "csv.gz":
        return write_csv(tmp_path / "t.csv.gz", _rows(header, cols))
    if kind == "tsv":
        return write_csv(tmp_path / "t.tsv", _rows(header, cols), delimiter="\t")
    if kind == "parquet":
        return write_parquet(tmp_path / "t.parquet", cols)
    if kind == "npz-columns":
        np.savez(tmp_path / "t.npz", **cols)
        return tmp_path / "t.npz"
    if kind == "npz-matrix":
        # numbers in one 2-D array with their names; the string IDs as their own 1-D array
        data = np.column_stack([FEATS["age"], FEATS["income"], FEATS["score"], LABELS]).astype(np.float64)
        np.savez(tmp_path / "t.npz", data=data, columns=np.array(["age", "income", "score", "y"]), id=IDS)
        return tmp_path / "t.npz"
    raise AssertionError(kind)


FORMAT_KINDS = ["csv", "csv.gz", "tsv", "parquet", "npz-columns", "npz-matrix"]


def spec(path: Path, **keys) -> TableSpec:
    d = {"path": path.name, **keys}
    return TableSpec.from_dict(d, party=PARTY, base_dir=path.parent)


def load(path: Path, **keys) -> PartyTable:
    return load_party_table(spec(path, **keys))


def fails(path: Path, **keys) -> DataFileError:
    with pytest.raises(DataFileError) as ei:
        load(path, **keys)
    return ei.value


def assert_names(err: PartyDataError, path: Path, row: int | None = None, column: str | None = None,
                 line: int | None = None) -> str:
    msg = str(err)
    assert f"party {PARTY!r}" in msg and err.party == PARTY, msg
    assert str(path) in msg and Path(err.path) == path, msg
    if row is not None:
        assert f"data row {row}" in msg and err.row == row, msg
    if line is not None:
        assert f"(line {line})" in msg and err.line == line, msg
    if column is not None:
        assert f"column {column!r}" in msg and err.column == column, msg
    return msg


# ------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", FORMAT_KINDS)
def test_round_trip_every_format(tmp_path, kind):
    path = write_source(tmp_path, kind)
    t = load(path, id="id", label="y", classes=[0, 1, 2])
    assert t.party == PARTY and t.path == path
    assert t.X.dtype == np.float32 and t.X.flags.c_contiguous and t.X.shape == (N, 3)
    assert t.feature_names == ("age", "income", "score")
    np.testing.assert_array_equal(t.X, np.column_stack(list(FEATS.values())))
    assert t.ids.dtype.kind == "U" and t.ids.tolist() == IDS.tolist()
    assert t.y.dtype == np.int64 and t.y.tolist() == LABELS.tolist()
    assert t.classes == (0, 1, 2) and t.classes_declared and t.n_classes == 3
    assert (t.n_rows, t.n_features) == (N, 3)
    assert "9 rows" in t.describe()


@pytest.mark.parametrize("kind", FORMAT_KINDS)
def test_features_by_name_keep_the_listed_order(tmp_path, kind):
    path = write_source(tmp_path, kind)
    t = load(path, id="id", features=["score", "age"])
    assert t.feature_names == ("score", "age") and t.y is None and t.classes is None
    np.testing.assert_array_equal(t.X, np.column_stack([FEATS["score"], FEATS["age"]]))


def test_rest_leaves_out_id_label_and_ignored(tmp_path):
    path = write_source(tmp_path, "csv")
    t = load(path, id="id", label="y", ignore=["income"])
    assert t.feature_names == ("age", "score")
    # without an id column the id text is not a number: "rest" would take it as a feature
    e = fails(path, label="y")
    assert_names(e, path, row=1, column="id")
    assert "non-numeric value 'user-005'" in str(e)


def test_no_id_and_no_label_give_none(tmp_path):
    path = write_source(tmp_path, "npz-columns")
    t = load(path, ignore=["id", "y"])
    assert t.ids is None and t.y is None and t.feature_names == tuple(FEATS)


def test_declared_class_order_defines_the_codes(tmp_path):
    path = write_source(tmp_path, "csv")
    t = load(path, label="y", classes=[2, 0, 1], ignore=["id"])
    assert t.classes == (2, 0, 1)
    np.testing.assert_array_equal(np.array(t.classes)[t.y], LABELS)


def test_string_classes_and_integral_text_labels(tmp_path):
    names = np.array(["cat", "dog", "eel"])
    path = write_csv(tmp_path / "s.csv", _rows(["a", "y"], {"a": FEATS["age"], "y": names[LABELS]}))
    t = load(path, label="y", classes=["eel", "cat", "dog"])
    assert t.classes == ("eel", "cat", "dog")
    assert np.array(t.classes)[t.y].tolist() == names[LABELS].tolist()
    # integer classes match "1", "1.0" and " 1 " alike
    path = write_text(tmp_path / "f.csv", "a,y\n1,0\n2, 1 \n3,1.0\n4,2.0\n")
    assert load(path, label="y", classes=[0, 1, 2]).y.tolist() == [0, 1, 1, 2]


def test_classes_read_off_the_file_when_not_declared(tmp_path):
    path = write_text(tmp_path / "f.csv", "a,y\n1,3\n2,1\n3,10\n4,3.0\n")
    t = load(path, label="y")
    # integers sort numerically (10 after 3), and the table says the classes were not declared
    assert t.classes == (1, 3, 10) and not t.classes_declared
    assert t.y.tolist() == [1, 0, 2, 1]
    path = write_text(tmp_path / "g.csv", "a,y\n1,dog\n2,cat\n")
    assert load(path, label="y").classes == ("cat", "dog")


@pytest.mark.parametrize("kind", ["csv", "parquet", "npz-columns"])
def test_integer_ids(tmp_path, kind):
    cols = {"id": np.array([10, 2, 2 ** 40, -3]), "a": np.arange(4.0)}
    if kind == "csv":
        path = write_csv(tmp_path / "i.csv", _rows(list(cols), cols))
    elif kind == "parquet":
        path = write_parquet(tmp_path / "i.parquet", cols)
    else:
        np.savez(tmp_path / "i.npz", **cols)
        path = tmp_path / "i.npz"
    t = load(path, id="id", id_type="int")
    assert t.ids.dtype == np.int64 and t.ids.tolist() == cols["id"].tolist()
    # the default, "str", gives the same text whatever the format stored
    assert load(path, id="id").ids.tolist() == [str(v) for v in cols["id"].tolist()]


def test_csv_conveniences(tmp_path):
    # byte-order mark, spaces around names, blank lines and a ",," line are all fine
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffid , a\n\nx1, 1.5\n,\nx2,2\n\n".encode("utf-8"))
    t = load(path, id="id")
    assert t.ids.tolist() == ["x1", "x2"] and t.X[:, 0].tolist() == [1.5, 2.0]
    path = write_text(tmp_path / "semi.txt", "id;a\nx1;1\n")
    assert load(path, id="id", delimiter=";").X.tolist() == [[1.0]]


def test_parquet_dictionary_and_string_columns(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (pip install pyarrow)")
    pq = pytest.importorskip("pyarrow.parquet", reason="Parquet files need pyarrow (pip install pyarrow)")
    tbl = pa.table({"id": pa.array(["a", "b", "c"]).dictionary_encode(),
                    "num_as_text": pa.array(["1.5", "2", "-3e2"]),
                    "y": pa.array(["no", "yes", "no"]).dictionary_encode()})
    pq.write_table(tbl, tmp_path / "d.parquet")
    t = load(tmp_path / "d.parquet", id="id", label="y", classes=["no", "yes"])
    assert t.ids.tolist() == ["a", "b", "c"] and t.y.tolist() == [0, 1, 0]
    assert t.X[:, 0].tolist() == [1.5, 2.0, -300.0]


# ------------------------------------------------------------------------------- the spec


def test_relative_paths_start_at_base_dir_and_absolute_ones_stay(tmp_path):
    s = TableSpec.from_dict({"path": "sub/c.csv"}, party=PARTY, base_dir=tmp_path)
    assert s.path == tmp_path / "sub" / "c.csv" and s.format == "csv" and s.features is None
    s = TableSpec.from_dict({"path": "/elsewhere/c.parquet"}, party=PARTY, base_dir=tmp_path)
    assert s.path == Path("/elsewhere/c.parquet") and s.format == "parquet"
    # the spec never looks at the file: other parties' files exist only on their machines
    s = TableSpec.from_dict({"path": "not-here.npz", "id": "id"}, party="other", base_dir=tmp_path)
    assert s.format == "npz"


def test_to_dict_round_trips(tmp_path):
    d = {"path": "c.tsv", "id": "k", "id_type": "int", "label": "y", "classes": ["a", "b"],
         "ignore": ["t"], "n_features": 3}
    s = TableSpec.from_dict(d, party=PARTY, base_dir=tmp_path)
    assert s.delimiter == "\t"
    assert TableSpec.from_dict(s.to_dict(), party=PARTY) == s


def test_every_documented_key_is_in_the_docs():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "user_data.md").read_text()
    for k in SPEC_KEYS:
        assert f"`{k}`" in doc, k


@pytest.mark.parametrize("d, key, words", [
    ({"path": "c.csv", "lable": "y"}, "lable", "did you mean 'label'?"),
    ({"path": "c.csv", "feature": ["a"]}, "feature", "did you mean 'features'?"),
    ({"id": "id"}, "path", "is required"),
    ({"path": ""}, "path", "non-empty"),
    ({"path": "c.xlsx"}, "path", "cannot tell the format"),
    ({"path": "c.csv", "format": "excel"}, "format", "not one of csv, parquet, npz"),
    ({"path": "c.csv", "id": 3}, "id", "must be str | none, got 3"),
    ({"path": 5}, "path", "must be a string, got 5"),
    ({"path": "c.csv", "ignore": "b"}, "ignore", "must be a list of str, got 'b'"),
    ({"path": "c.csv", "id_type": "uuid", "id": "id"}, "id_type", "\"str\" or \"int\""),
    ({"path": "c.csv", "id": "k", "label": "k"}, "label", "also the id column"),
    ({"path": "c.csv", "label": "y", "classes": [0, "a"]}, "classes", "all integers or all strings"),
    ({"path": "c.csv", "label": "y", "classes": [0, 1, 0]}, "classes", "lists 0 twice"),
    ({"path": "c.csv", "label": "y", "classes": []}, "classes", "is empty"),
    ({"path": "c.csv", "label": "y", "classes": [True, False]}, "classes", "all integers or all strings"),
    ({"path": "c.csv", "classes": [0, 1]}, "classes", "no label column"),
    ({"path": "c.csv", "features": "all"}, "features", "or \"rest\""),
    ({"path": "c.csv", "features": []}, "features", "empty list"),
    ({"path": "c.csv", "features": ["a", "a"]}, "features", "lists 'a' twice"),
    ({"path": "c.csv", "label": "y", "features": ["a", "y"]}, "features", "is the label column"),
    ({"path": "c.csv", "features": ["a"], "ignore": ["b"]}, "ignore", "only applies with features"),
    ({"path": "c.csv", "n_features": 0}, "n_features", "must be >= 1, got 0"),
    ({"path": "c.csv", "features": ["a", "b"], "n_features": 3}, "n_features", "lists 2 columns"),
    ({"path": "c.csv", "delimiter": ";;"}, "delimiter", "one character"),
    ({"path": "c.npz", "delimiter": ";"}, "delimiter", "only applies to CSV"),
])
def test_spec_errors_name_party_and_key(tmp_path, d, key, words):
    with pytest.raises(DataSpecError) as ei:
        TableSpec.from_dict(d, party=PARTY, base_dir=tmp_path)
    msg = str(ei.value)
    assert f"party {PARTY!r}" in msg and f"key {key!r}" in msg and words in msg, msg
    assert ei.value.key == key and ei.value.party == PARTY


def test_require_names_the_missing_key(tmp_path):
    with pytest.raises(DataSpecError, match=r"party 'host', \[party.data\] key 'label': is required"):
        TableSpec.from_dict({"path": "h.csv", "id": "id"}, party="host", require=("id", "label"))


def test_section_must_be_a_table():
    with pytest.raises(DataSpecError, match="party 'p'"):
        TableSpec.from_dict("c.csv", party="p")


def test_format_from_name():
    assert [format_from_name(n) for n in ("A.CSV", "a.csv.gz", "a.tsv", "a.pq", "a.parquet", "a.npz", "a.npy")] == \
        ["csv", "csv", "csv", "parquet", "parquet", "npz", None]


# ------------------------------------------------------------------------------- bad input


def test_missing_file(tmp_path):
    e = fails(tmp_path / "nope.csv")
    assert "not found" in assert_names(e, tmp_path / "nope.csv")


def test_unknown_column_names_the_closest(tmp_path):
    path = write_source(tmp_path, "csv")
    e = fails(path, id="id", label="label")
    assert "no column 'label' (the label key)" in assert_names(e, path, column="label")
    e = fails(path, id="id", features=["age", "incme"])
    assert "did you mean 'income'?" in assert_names(e, path, column="incme")
    e = fails(path, id="zzz")
    assert "columns are: 'id', 'age'" in str(e)


@pytest.mark.parametrize("kind", ["csv", "parquet", "npz-columns"])
def test_non_numeric_feature_value(tmp_path, kind):
    cols = {"id": np.array(["a", "b", "c", "d"]), "x": np.array(["1", "2.5", "1e3", "3"]),
            "z": np.array(["0", "1", "12 kg", "2"])}
    if kind == "csv":
        path = write_csv(tmp_path / "n.csv", _rows(list(cols), cols))
    elif kind == "parquet":
        path = write_parquet(tmp_path / "n.parquet", {k: v.tolist() for k, v in cols.items()})
    else:
        np.savez(tmp_path / "n.npz", **cols)
        path = tmp_path / "n.npz"
    e = fails(path, id="id")
    msg = assert_names(e, path, row=3, column="z")
    assert "non-numeric value '12 kg'" in msg and e.value == "12 kg"
    if kind == "csv":
        assert "(line 4)" in msg and e.line == 4


def test_empty_cell_is_a_missing_value(tmp_path):
    path = write_text(tmp_path / "e.csv", "id,a,b\nr1,1,2\nr2,,3\n")
    e = fails(path, id="id")
    assert "missing value (empty cell)" in assert_names(e, path, row=2, column="a", line=3)


def test_rows_count_data_rows_and_lines_count_the_file(tmp_path):
    # a blank line shifts the line number, not the data row
    path = write_text(tmp_path / "b.csv", "id,a\nr1,1\n\nr2,2\nr3,oops\n")
    e = fails(path, id="id")
    assert_names(e, path, row=3, column="a", line=5)


@pytest.mark.parametrize("kind, bad, word", [
    ("csv", "nan", "NaN"), ("csv", "inf", "+inf"), ("csv", "-Infinity", "-inf"),
    ("npz", np.nan, "NaN"), ("npz", -np.inf, "-inf"), ("parquet", np.inf, "+inf"),
])
def test_nan_and_infinite_values(tmp_path, kind, bad, word):
    b = np.array([1.0, 2.0, 3.0, 4.0], dtype=object)
    b[2] = bad
    cols = {"id": np.array(["r1", "r2", "r3", "r4"]), "a": np.arange(4.0), "b": b}
    if kind == "csv":
        path = write_csv(tmp_path / "f.csv", _rows(list(cols), cols))
    elif kind == "npz":
        np.savez(tmp_path / "f.npz", id=cols["id"], a=cols["a"], b=b.astype(np.float64))
        path = tmp_path / "f.npz"
    else:
        path = write_parquet(tmp_path / "f.parquet", {"id": cols["id"], "a": cols["a"], "b": b.astype(np.float64)})
    e = fails(path, id="id")
    msg = assert_names(e, path, row=3, column="b")
    assert f"is {word}" in msg and "finite" in msg


def test_value_too_large_for_float32(tmp_path):
    path = write_text(tmp_path / "o.csv", "a\n1\n1e39\n")
    e = fails(path)
    assert "too large for float32" in assert_names(e, path, row=2, column="a")


@pytest.mark.parametrize("kind", ["csv", "parquet", "npz"])
def test_duplicate_ids_name_both_rows(tmp_path, kind):
    ids = np.array(["u1", "u2", "u3", "u2", "u1"])
    cols = {"id": ids, "a": np.arange(5.0)}
    if kind == "csv":
        path = write_csv(tmp_path / "d.csv", _rows(list(cols), cols))
    elif kind == "parquet":
        path = write_parquet(tmp_path / "d.parquet", cols)
    else:
        np.savez(tmp_path / "d.npz", **cols)
        path = tmp_path / "d.npz"
    e = fails(path, id="id")
    # the first repeat in the file is u2 at row 4; its first occurrence is row 2
    msg = assert_names(e, path, row=4, column="id")
    assert "duplicate ID 'u2', also in data row 2" in msg
    if kind == "csv":
        assert "data row 2 (line 3)" in msg


def test_duplicate_integer_ids(tmp_path):
    path = write_text(tmp_path / "d.csv", "id,a\n7,1\n8,2\n07,3\n")
    e = fails(path, id="id", id_type="int")  # 7 and 07 are the same integer
    assert "duplicate ID '7', also in data row 1" in assert_names(e, path, row=3, column="id")
    assert load(path, id="id").ids.tolist() == ["7", "8", "07"]  # as text they differ


def test_missing_and_non_integer_ids(tmp_path):
    path = write_text(tmp_path / "m.csv", "id,a\nr1,1\n ,2\n")
    assert "missing ID" in assert_names(fails(path, id="id"), path, row=2, column="id")
    path = write_text(tmp_path / "n.csv", "id,a\n1,1\n2.5,2\n")
    e = fails(path, id="id", id_type="int")
    assert "ID '2.5' is not an integer" in assert_names(e, path, row=2, column="id")
    np.savez(tmp_path / "f.npz", id=np.array([1.0, 2.5]), a=np.zeros(2))
    e = fails(tmp_path / "f.npz", id="id")
    assert "not a whole number" in assert_names(e, tmp_path / "f.npz", row=2, column="id")


@pytest.mark.parametrize("kind", ["csv", "npz", "parquet"])
def test_label_outside_declared_classes(tmp_path, kind):
    cols = {"a": np.arange(5.0), "y": np.array([0, 1, 1, 3, 2])}
    if kind == "csv":
        path = write_csv(tmp_path / "l.csv", _rows(list(cols), cols))
    elif kind == "npz":
        np.savez(tmp_path / "l.npz", **cols)
        path = tmp_path / "l.npz"
    else:
        path = write_parquet(tmp_path / "l.parquet", cols)
    e = fails(path, label="y", classes=[0, 1, 2])
    msg = assert_names(e, path, row=4, column="y")
    assert "label '3' is not one of the declared classes [0, 1, 2]" in msg


def test_label_errors_text(tmp_path):
    path = write_text(tmp_path / "l.csv", "a,y\n1,cat\n2,dgo\n3,\n")
    e = fails(path, label="y", classes=["cat", "dog"])
    assert "label 'dgo' is not one of the declared classes" in assert_names(e, path, row=2, column="y", line=3)
    e = fails(path, label="y")
    assert "missing label" in assert_names(e, path, row=3, column="y")
    path = write_text(tmp_path / "f.csv", "a,y\n1,0\n2,0.5\n")
    e = fails(path, label="y", classes=[0, 1])
    assert "label '0.5'" in assert_names(e, path, row=2, column="y")
    np.savez(tmp_path / "f.npz", a=np.zeros(2), y=np.array([0.0, 0.5]))
    e = fails(tmp_path / "f.npz", label="y")
    assert "not an integer or text" in assert_names(e, tmp_path / "f.npz", row=2, column="y")


@pytest.mark.parametrize("text, words", [
    ("id,a,y\n", "no data rows (only a header)"),
    ("", "is empty (no header line"),
    ("\n\n", "is empty (no header line"),
])
def test_empty_table(tmp_path, text, words):
    path = write_text(tmp_path / "e.csv", text)
    assert words in assert_names(fails(path), path)


def test_empty_npz_and_parquet(tmp_path):
    np.savez(tmp_path / "e.npz", a=np.zeros(0), y=np.zeros(0, dtype=np.int64))
    assert "no data rows" in assert_names(fails(tmp_path / "e.npz", label="y"), tmp_path / "e.npz")
    path = write_parquet(tmp_path / "e.parquet", {"a": np.zeros(0)})
    assert "no data rows" in assert_names(fails(path), path)


def test_no_feature_columns(tmp_path):
    path = write_text(tmp_path / "e.csv", "id,y\nr1,0\n")
    assert "no feature columns" in assert_names(fails(path, id="id", label="y"), path)


def test_feature_count_declared_in_the_config(tmp_path):
    path = write_source(tmp_path, "csv")
    assert load(path, id="id", label="y", n_features=3).n_features == 3
    e = fails(path, id="id", label="y", n_features=4)
    msg = assert_names(e, path)
    assert "has 3 feature columns (age, income, score), but n_features = 4 in the federation file" in msg


def test_check_features_count_and_names(tmp_path):
    t = load(write_source(tmp_path, "csv"), id="id", label="y")
    check_features(t, 3)
    check_features(t, ["age", "income", "score"])
    with pytest.raises(DataFileError) as ei:
        check_features(t, 5, source="[algorithm] d_unique")
    msg = assert_names(ei.value, t.path)
    assert "has 3 feature columns" in msg and "[algorithm] d_unique expects 5" in msg
    with pytest.raises(DataFileError, match="feature column 2 is 'income', but the federation file expects 'salary'"):
        check_features(t, ["age", "salary", "score"])
    with pytest.raises(DataFileError, match="in another order"):
        check_features(t, ["score", "income", "age"])


def test_check_agreement_names_both_parties(tmp_path):
    a = write_source(tmp_path, "csv")
    b = write_csv(tmp_path / "b.csv", _rows(["id", "age", "y"], _columns()))
    ta = load_party_table(TableSpec.from_dict({"path": a.name, "id": "id", "label": "y"}, party="c1", base_dir=tmp_path))
    tb = load_party_table(TableSpec.from_dict({"path": b.name, "id": "id", "label": "y"}, party="c2", base_dir=tmp_path))
    check_agreement([ta, ta])
    check_agreement({"c1": ta, "c2": tb}, on="classes")
    with pytest.raises(DataFileError) as ei:
        check_agreement({"c1": ta, "c2": tb}, on="n_features", what="clients share the model's input layer")
    msg = str(ei.value)
    assert msg.startswith(f"party 'c2', file {str(b)!r}: n_features is 1, but party 'c1' (file {str(a)!r}) has 3")
    assert "clients share the model's input layer" in msg and ei.value.party == "c2"
    with pytest.raises(DataFileError, match="feature_names is"):
        check_agreement([ta, tb], on="feature_names")
    with pytest.raises(ValueError, match="on must be one of"):
        check_agreement([ta, tb], on="rows")


def test_ragged_row(tmp_path):
    path = write_text(tmp_path / "r.csv", "id,a,b\nr1,1,2\nr2,3\n")
    e = fails(path, id="id")
    assert "has 2 fields but the header (line 1) has 3" in assert_names(e, path, row=2, line=3)
    path = write_text(tmp_path / "t.csv", "id,a\nr1,1,\n")
    assert "trailing delimiter" in str(fails(path, id="id"))


def test_header_problems(tmp_path):
    path = write_text(tmp_path / "u.csv", ",id,a\n0,r1,1\n")  # pandas' unnamed index column
    assert "column 1 has no name" in assert_names(fails(path, id="id"), path)
    path = write_text(tmp_path / "d.csv", "id,a,b,a\nr1,1,2,3\n")
    assert "column name 'a' appears twice (columns 2 and 4)" in assert_names(fails(path, id="id"), path)


def test_unreadable_files(tmp_path):
    path = tmp_path / "bin.csv"
    path.write_bytes(b"id,a\n\xff\xfe,1\n")
    assert "not UTF-8" in assert_names(fails(path), path)
    path = tmp_path / "bad.csv.gz"
    path.write_bytes(b"not gzip at all")
    assert "cannot be read" in assert_names(fails(path), path)
    path = write_text(tmp_path / "bad.npz", "not a zip")
    assert "cannot be read as NumPy .npz" in assert_names(fails(path), path)
    path = write_text(tmp_path / "bad.parquet", "not parquet")
    pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (pip install pyarrow)")
    assert "cannot be read as Parquet" in assert_names(fails(path), path)
    (tmp_path / "dir.csv").mkdir()
    assert "is a folder" in str(fails(tmp_path / "dir.csv"))


def test_npz_layout_errors(tmp_path):
    np.save(tmp_path / "one.npy", np.zeros((3, 2)))
    (tmp_path / "one.npy").rename(tmp_path / "one.npz")
    assert "single NumPy array" in str(fails(tmp_path / "one.npz"))
    np.savez(tmp_path / "obj.npz", id=np.array(["a", None], dtype=object), a=np.zeros(2))
    assert "holds Python objects" in assert_names(fails(tmp_path / "obj.npz", id="id"), tmp_path / "obj.npz")
    np.savez(tmp_path / "nocols.npz", data=np.zeros((2, 2)))
    assert "'data' and 'columns' come together" in str(fails(tmp_path / "nocols.npz"))
    np.savez(tmp_path / "wrong.npz", data=np.zeros((2, 2)), columns=np.array(["a", "b", "c"]))
    assert "1-D string array of 2 names" in str(fails(tmp_path / "wrong.npz"))
    np.savez(tmp_path / "twice.npz", data=np.zeros((2, 1)), columns=np.array(["a"]), a=np.zeros(2))
    assert "column 'a' is given twice" in str(fails(tmp_path / "twice.npz"))
    np.savez(tmp_path / "len.npz", a=np.zeros(2), b=np.zeros(3))
    assert "'a' has 2 rows, 'b' has 3" in str(fails(tmp_path / "len.npz"))
    np.savez(tmp_path / "2d.npz", a=np.zeros((2, 2)))
    assert "array 'a' has shape (2, 2)" in str(fails(tmp_path / "2d.npz"))
    np.savez(tmp_path / "dt.npz", a=np.array(["2024-01-01"], dtype="datetime64[D]"))
    assert "has type datetime64[D]" in assert_names(fails(tmp_path / "dt.npz"), tmp_path / "dt.npz", column="a")


def test_parquet_nulls_and_types(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (pip install pyarrow)")
    path = write_parquet(tmp_path / "n.parquet", {"id": ["a", "b", "c"], "x": pa.array([1.0, None, 2.0])})
    assert "missing value (null)" in assert_names(fails(path, id="id"), path, row=2, column="x")
    path = write_parquet(tmp_path / "i.parquet", {"id": ["a", None, "c"], "x": np.zeros(3)})
    assert "missing ID (null)" in assert_names(fails(path, id="id"), path, row=2, column="id")
    path = write_parquet(tmp_path / "y.parquet", {"x": np.zeros(3), "y": pa.array([0, 1, None])})
    assert "missing label (null)" in assert_names(fails(path, label="y"), path, row=3, column="y")
    path = write_parquet(tmp_path / "t.parquet", {"x": pa.array([b"a", b"b"])})
    assert "has type binary" in assert_names(fails(path), path, column="x")


# ------------------------------------------------------------------------------- shared check


def test_check_finite_names_first_bad_cell_in_row_order():
    X = np.ones((4, 3), dtype=np.float32)
    X[3, 0] = np.nan
    X[1, 2] = np.inf
    check_finite(np.ones((2, 2)))
    check_finite(np.array([[1, 2]]))  # integers are always finite
    with pytest.raises(DataFileError) as ei:
        check_finite(X, columns=["a", "b", "c"], dataset="demo", lines=[2, 3, 5, 6])
    e = ei.value
    assert str(e) == ("dataset 'demo', data row 2 (line 3), column 'c': value is +inf; values must be "
                      "finite numbers (1 more non-finite cells)")
    assert (e.row, e.line, e.column) == (2, 3, "c")
    with pytest.raises(DataFileError, match=r"data row 4, column 1: value is NaN"):
        check_finite(X[:, :1])
    with pytest.raises(DataFileError, match=r"data row 3: label is -inf"):
        check_finite(np.array([0.0, 1.0, -np.inf]), what="label")


def test_describe_position():
    assert describe_position(party="p", path="f.csv", row=3, line=4, column="c") == \
        "party 'p', file 'f.csv', data row 3 (line 4), column 'c'"
    assert describe_position(dataset="d", column=2) == "dataset 'd', column 2"


# ------------------------------------------------------------------------------- built-in loaders


def test_builtin_tabular_loader_names_row_and_column_of_nan(tmp_path):
    X = np.ones((5, 4), dtype=np.float32)
    X[2, 3] = np.nan
    (tmp_path / "helena").mkdir()
    np.save(tmp_path / "helena" / "X.npy", X)
    np.save(tmp_path / "helena" / "y.npy", np.arange(5) % 2)
    with pytest.raises(DataFileError) as ei:
        data_tabular.load_tabular("helena", data_dir=tmp_path)
    assert "dataset 'helena', data row 3, column 4: value is NaN" in str(ei.value)
    # a CSV copy is checked as it is read, naming the file, its line and the column
    (tmp_path / "helena" / "X.npy").unlink()
    write_text(tmp_path / "helena" / "helena.csv", "f1,f2,class\n1,2,0\n3,inf,1\n")
    with pytest.raises(DataFileError) as ei:
        data_tabular.load_tabular("helena", data_dir=tmp_path)
    msg = str(ei.value)
    assert "helena.csv" in msg and "data row 2 (line 3), column 'f2': value is +inf" in msg


def test_builtin_fate_loader_names_row_and_column_of_nan(tmp_path):
    (tmp_path / "fate").mkdir()
    write_text(tmp_path / "fate" / "breast_hetero_guest.csv", "id,y,x0,x1\n1,0,0.5,1\n2,1,0.1,2\n3,0,0.2,3\n")
    write_text(tmp_path / "fate" / "breast_hetero_host.csv", "id,x2\n1,0.3\n2,nan\n3,0.1\n")
    with pytest.raises(DataFileError) as ei:
        data_fate.load("cancer", data_dir=tmp_path)
    msg = str(ei.value)
    assert "breast_hetero_host.csv" in msg and "data row 2 (line 3), column 'x2': value is NaN" in msg
    # data_fate caches files by path, so the second case uses another folder
    (tmp_path / "b" / "fate").mkdir(parents=True)
    write_text(tmp_path / "b" / "fate" / "breast_hetero_host.csv", "id,x2\n1,0.3\n2,0.4\n3,0.1\n")
    write_text(tmp_path / "b" / "fate" / "breast_hetero_guest.csv", "id,y,x0,x1\n1,0,0.5,1\n2,nan,0.1,2\n3,0,0.2,3\n")
    with pytest.raises(DataFileError, match=r"data row 2 \(line 3\), column 'y': label is NaN"):
        data_fate.load("cancer", data_dir=tmp_path / "b")
