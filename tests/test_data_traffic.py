import numpy as np
import pytest

from fedhet.algorithms.f3 import traffic as dt
from fedhet.algorithms.datapath import DatasetNotFound

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def _graph():
    try:
        return dt.load_graph("metr_la")
    except DatasetNotFound:
        pytest.skip("traffic graphs not present")


@pytest.mark.data
def test_graph_and_split():
    ids, adj = _graph()
    assert len(ids) == 207 and adj.shape == (207, 207) and np.all(np.diag(adj) == 1)
    s = dt.split_indices(2856)
    assert [len(s[k]) for k in ("train", "val", "test")] == [1999, 286, 571]
    assert sorted(np.concatenate(list(s.values()))) == list(range(2856))


def test_unsafe_pickle_refused(tmp_path):
    import io
    import pickle
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        dt._SafeUnpickler(io.BytesIO(pickle.dumps(print))).load()


def _auc(score, y):
    from scipy.stats import rankdata
    r = rankdata(score)
    n1 = int(y.sum())
    return (r[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * (len(y) - n1))


@pytest.mark.data
def test_simulation_seeded_and_graph_carries_signal():
    _graph()
    a = dt.simulate("metr_la", seed=1, n_windows=1000)
    b = dt.simulate("metr_la", seed=1, n_windows=1000)
    assert a.x.shape == (1000, 207, 12) and np.array_equal(a.x, b.x) and a.provenance.startswith("synthetic")
    assert 0.2 < a.y.mean() < 0.6
    tr, te = a.split["train"], a.split["test"]
    f = np.stack([a.x.min(axis=2), a.x.mean(axis=2)], axis=-1)
    z = (f - f[tr].mean(0)) / f[tr].std(0)       # each sensor's standardised window minimum and mean

    def held_out_auc(X, ridge):                  # ridge least-squares linear classifier, held-out AUC
        Xb = np.c_[X, np.ones(len(X))]
        w = np.linalg.solve(Xb[tr].T @ Xb[tr] + ridge * np.eye(Xb.shape[1]), Xb[tr].T @ (a.y[tr] * 2.0 - 1))
        return _auc(Xb[te] @ w, a.y[te])

    singles = [held_out_auc(z[:, i], 1.0) for i in range(0, 207, 23)]   # lone sensors: weak witnesses
    network = held_out_auc(z.reshape(len(z), -1), 50.0)                # every sensor at once
    assert max(singles) < 0.8 and np.mean(singles) > 0.52, singles
    assert network > max(singles) + 0.1, (network, singles)
