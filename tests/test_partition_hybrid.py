"""HyFEM's hybrid partition: samples x views x classes per client."""
from __future__ import annotations

import numpy as np
import pytest

from fedhet.algorithms.partition import hybrid_partition

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def labels_like_handwritten():
    return np.repeat(np.arange(10), 200)   # 10 classes x 200 rows, like mfeat


@pytest.mark.parametrize("M, D, v, c, unused", [
    (4, 4, 3, 0.75, 0.0),     # Fig. 3 setting on a 10-class set: 3 of 4 views, 3/4 of the classes
    (8, 6, 3, 15 / 40, 0.12),  # Fig. 4 setting: 8 clients, 3 views each, 15/40 of the classes
    (3, 5, 2, 4, 0.3),
])
def test_hybrid_partition_properties(M, D, v, c, unused):
    y = labels_like_handwritten()
    rng = np.random.default_rng(0)
    y = y[rng.permutation(len(y))]     # labels in any order
    s = hybrid_partition(y, M, D, v, c, unused_fraction=unused, seed=3)
    n_cls = c if isinstance(c, int) else int(round(c * 10))
    assert s.n_clients == M and s.n_views == D and s.n_samples == len(y)
    # each client: v distinct views, n_cls distinct classes, only rows of its classes
    for m in range(M):
        assert len(s.views[m]) == v and len(np.unique(s.views[m])) == v
        assert s.views[m].min() >= 0 and s.views[m].max() < D
        assert len(s.classes[m]) == n_cls and len(np.unique(s.classes[m])) == n_cls
        assert set(np.unique(y[s.rows[m]])) == set(s.classes[m].tolist())
    # disjoint rows, and rows + unused cover every row exactly once
    every = np.concatenate(s.rows + [s.unused])
    assert len(every) == len(y) and len(np.unique(every)) == len(y)
    # every view and every class is held by some client
    assert set(np.concatenate(s.views).tolist()) == set(range(D))
    assert set(np.concatenate(s.classes).tolist()) == set(range(10))
    # the unused fraction, per class (rounded)
    for k in range(10):
        n_k = int((y == k).sum())
        assert int((y[s.unused] == k).sum()) == int(round(unused * n_k))
    # rows of a class are spread evenly over the clients holding it
    for k in range(10):
        sizes = [int((y[s.rows[m]] == k).sum()) for m in range(M) if k in s.classes[m]]
        assert max(sizes) - min(sizes) <= 1
    counts = s.view_class_counts(y)
    assert counts.shape == (D, 10)
    assert counts.sum() == M * v * n_cls
    for d in range(D):
        assert s.holders_of_view(d) == [m for m in range(M) if d in s.views[m]]


def test_fig3_setting_gives_each_client_a_different_missing_view():
    s = hybrid_partition(labels_like_handwritten(), 4, 4, 3, 0.75, seed=0)
    missing = [set(range(4)) - set(v.tolist()) for v in s.views]
    assert sorted(next(iter(x)) for x in missing) == [0, 1, 2, 3]
    # each class is held by 3 clients, which miss 3 different views: every (view, class)
    # cell has training rows at 2 or 3 clients
    counts = s.view_class_counts(labels_like_handwritten())
    assert counts.min() >= 2 and counts.max() <= 3


def test_hybrid_partition_is_seeded():
    y = labels_like_handwritten()
    a = hybrid_partition(y, 4, 6, 3, 0.5, unused_fraction=0.1, seed=7)
    b = hybrid_partition(y, 4, 6, 3, 0.5, unused_fraction=0.1, seed=7)
    c = hybrid_partition(y, 4, 6, 3, 0.5, unused_fraction=0.1, seed=8)
    for x, z in zip(a.rows + a.views + a.classes, b.rows + b.views + b.classes):
        np.testing.assert_array_equal(x, z)
    assert any(not np.array_equal(x, z) for x, z in zip(a.rows, c.rows))


def test_hybrid_partition_errors_are_clear():
    y = labels_like_handwritten()
    with pytest.raises(ValueError, match="no client"):
        hybrid_partition(y, 2, 6, 2, 1.0)          # 2 x 2 views cannot cover 6
    with pytest.raises(ValueError, match="no client"):
        hybrid_partition(y, 2, 2, 2, 3)            # 2 x 3 classes cannot cover 10
    with pytest.raises(ValueError, match="views_per_client"):
        hybrid_partition(y, 2, 2, 3, 1.0)
    with pytest.raises(ValueError, match="unused_fraction"):
        hybrid_partition(y, 2, 2, 1, 1.0, unused_fraction=1.0)
    with pytest.raises(ValueError, match="classes_per_client"):
        hybrid_partition(y, 2, 2, 1, True)
