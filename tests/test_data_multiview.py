"""Multi-view loaders (MMVFL Table 2, COIL-20 poses) and the balanced splits / CV folds."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.io import savemat

from fedhet.algorithms import data_multiview as dm
from fedhet.algorithms.datapath import DatasetNotFound

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


# ---------------------------------------------------------------- splits (no data needed)
def test_balanced_split_counts_disjoint_and_seeded():
    y = np.repeat(np.arange(3), [10, 12, 15])
    tr, va = dm.balanced_split(y, 6, 3, seed=4)
    assert np.bincount(y[tr]).tolist() == [6, 6, 6]
    assert np.bincount(y[va]).tolist() == [3, 3, 3]
    assert not set(tr) & set(va)
    assert np.all(np.diff(tr) > 0) and np.all(np.diff(va) > 0)
    tr2, va2 = dm.balanced_split(y, 6, 3, seed=4)
    assert np.array_equal(tr, tr2) and np.array_equal(va, va2)
    tr3, _ = dm.balanced_split(y, 6, 3, seed=5)
    assert not np.array_equal(tr, tr3)
    with pytest.raises(ValueError, match="class 0 has 10 rows, needs 11"):
        dm.balanced_split(y, 8, 3, seed=0)


def test_cv_folds_disjoint_validation_when_counts_allow():
    y = np.repeat(np.arange(4), 50)
    folds = dm.cv_folds(y, 30, 10, seed=1)
    assert len(folds) == 5 and all(f.disjoint_validation for f in folds)
    seen = []
    for f in folds:
        assert np.bincount(y[f.train]).tolist() == [30] * 4
        assert np.bincount(y[f.val]).tolist() == [10] * 4
        assert not set(f.train) & set(f.val)
        seen.append(f.val)
    allv = np.concatenate(seen)
    assert allv.size == np.unique(allv).size == 200     # every row validated exactly once
    again = dm.cv_folds(y, 30, 10, seed=1)
    assert all(np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val) for a, b in zip(folds, again))


def test_cv_folds_overlap_is_flagged_when_counts_do_not_allow():
    y = np.repeat(np.arange(2), [60, 70])
    folds = dm.cv_folds(y, 40, 20, seed=0)
    assert not folds[0].disjoint_validation
    for f in folds:
        assert np.bincount(y[f.train]).tolist() == [40, 40]
        assert np.bincount(y[f.val]).tolist() == [20, 20]
        assert not set(f.train) & set(f.val)
    assert len({tuple(f.val) for f in folds}) == 5           # still five different validation sets
    with pytest.raises(ValueError, match="needs 71"):
        dm.cv_folds(y, 51, 20, seed=0)


def test_split_columns_and_synthetic():
    X = np.arange(20).reshape(2, 10)
    a, b = dm.split_columns(X, (4, 6))
    assert a.shape == (2, 4) and b.shape == (2, 6) and b[0, 0] == 4
    with pytest.raises(ValueError, match="sum to 9, not 10"):
        dm.split_columns(X, (4, 5))
    s = dm.make_synthetic(n_per_class=5, n_classes=3, dims=(4, 7), informative=(2, 3), seed=0)
    assert s.kind == "synthetic" and s.dims == (4, 7) and s.n_rows == 15 and s.n_classes == 3
    assert all(v.dtype == np.float32 for v in s.views)
    # informative columns separate the classes, the others do not (by construction: zero shift)
    big = dm.make_synthetic(n_per_class=2000, n_classes=3, dims=(6,), informative=2, separation=4, seed=1)
    means = np.stack([big.views[0][big.y == c].mean(axis=0) for c in range(3)])
    assert np.all(means[:, :2].std(axis=0) > 1.5) and np.all(means[:, 2:].std(axis=0) < 0.1)


def test_missing_dataset_and_unknown_name(tmp_path):
    with pytest.raises(DatasetNotFound, match="relathe"):
        dm.load_relathe(tmp_path)
    with pytest.raises(ValueError, match="unknown multi-view dataset"):
        dm.load_multiview("caltech7", tmp_path)
    with pytest.raises(ValueError, match="source must be"):
        dm.load_isolet(tmp_path, source="mp3")


def test_nan_is_reported_with_view_row_column(tmp_path):
    X = np.zeros((6, 4322))
    X[4, 2900] = np.nan           # column 2900 = view relathe_c, column 100
    (tmp_path / "relathe").mkdir()
    savemat(tmp_path / "relathe" / "RELATHE.mat", {"X": X, "Y": np.array([[1], [2]] * 3)})
    with pytest.raises(ValueError, match=r"relathe_c'? has 1 NaN/infinite values, first at row 4, column 100"):
        dm.load_relathe(tmp_path)


def test_wrong_shape_is_reported(tmp_path):
    (tmp_path / "isolet").mkdir()
    savemat(tmp_path / "isolet" / "Isolet.mat", {"X": np.zeros((3, 600)), "Y": np.ones((3, 1))})
    with pytest.raises(ValueError, match="expected 617 feature columns"):
        dm.load_isolet(tmp_path)


# ---------------------------------------------------------------- the stored files
@pytest.mark.parametrize("name,dims,n,classes,kind", [
    ("handwritten", (240, 76, 216, 47, 64), 2000, 10, "real"),
    ("isolet", (200, 200, 217), 1560, 26, "real"),
    ("relathe", (1400, 1400, 1522), 1427, 2, "real"),
    ("msrc_v5", (24, 576, 512, 256, 254), 210, 7, "stand-in"),
])
def test_loaders(shared_data, name, dims, n, classes, kind):
    d = dm.load_multiview(name, shared_data)
    assert d.dims == dims and d.n_rows == n and d.n_classes == classes and d.kind == kind
    assert len(d.view_names) == len(dims)
    assert all(v.dtype == np.float32 and v.flags.c_contiguous and np.isfinite(v).all() for v in d.views)
    assert d.y.dtype == np.int64 and set(np.unique(d.y)) == set(range(classes))
    # Table 2's balanced splits fit, with the fold layout documented in the module
    n_tr, n_val = dm.TABLE2_SPLITS[name]
    folds = dm.cv_folds(d.y, n_tr, n_val, seed=0)
    assert folds[0].disjoint_validation == (name in ("handwritten", "msrc_v5"))
    for f in folds:
        assert np.all(np.bincount(d.y[f.train]) == n_tr) and np.all(np.bincount(d.y[f.val]) == n_val)


def test_handwritten_views_and_labels(shared_data):
    d = dm.load_handwritten(shared_data)
    assert d.view_names == ("pixel", "fourier", "profile", "zer", "kar")
    assert np.bincount(d.y).tolist() == [200] * 10
    full = dm.load_handwritten(shared_data, drop_small=False)
    assert full.dims[-1] == 6 and full.view_names[-1] == "mor"
    # the pixel view is 15x16 images of values 0..6 (UCI mfeat-pix)
    assert d.views[0].min() == 0 and d.views[0].max() == 6


def test_isolet_views_are_column_blocks(shared_data):
    from scipy.io import loadmat
    raw = loadmat(shared_data / "isolet" / "Isolet.mat")["X"]
    d = dm.load_isolet(shared_data)
    np.testing.assert_array_equal(np.hstack(d.views), raw.astype(np.float32))
    full = dm.load_isolet(shared_data, source="uci_full")
    assert full.n_rows == 7797 and full.dims == (200, 200, 217) and full.n_classes == 26


def test_relathe_class_counts(shared_data):
    d = dm.load_relathe(shared_data)
    assert np.bincount(d.y).tolist() == [779, 648]


def test_coil20_poses(shared_data):
    c = dm.load_coil20(shared_data)
    assert c.kind == "stand-in" and c.images.shape == (1440, 1024) and c.images.dtype == np.float32
    assert np.bincount(c.object).tolist() == [72] * 20
    assert np.all(np.bincount(c.pose) == 20)
    # consecutive poses of one object are closer than poses 30 degrees apart (SOURCE.md's check)
    o = c.images[c.object == 3]
    near = np.linalg.norm(o - np.roll(o, -1, axis=0), axis=1).mean()
    far = np.linalg.norm(o - np.roll(o, -6, axis=0), axis=1).mean()
    assert near < far
