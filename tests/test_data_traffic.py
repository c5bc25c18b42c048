import numpy as np
import pytest

from fedhet.algorithms import data_traffic as dt
from fedhet.algorithms.datapath import DatasetNotFound


def _graph():
    try:
        return dt.load_graph("metr_la")
    except DatasetNotFound:
        pytest.skip("traffic graphs not present")


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


def test_simulation_seeded_and_graph_carries_signal():
    _graph()
    a = dt.simulate("metr_la", seed=1, n_windows=600)
    b = dt.simulate("metr_la", seed=1, n_windows=600)
    assert a.x.shape == (600, 207, 12) and np.array_equal(a.x, b.x) and a.provenance.startswith("synthetic")
    assert 0.2 < a.y.mean() < 0.8
    tr, te = a.split["train"], a.split["test"]
    f = a.x.min(axis=2)
    z = (f - f[tr].mean(0)) / f[tr].std(0)       # each sensor's standardised window minimum

    def acc(X):                                  # least-squares linear classifier, held-out accuracy
        Xb = np.c_[X, np.ones(len(X))]
        w = np.linalg.lstsq(Xb[tr], a.y[tr] * 2.0 - 1, rcond=None)[0]
        return np.mean((Xb[te] @ w > 0) == a.y[te])

    single = max(acc(z[:, [i]]) for i in range(0, 207, 23))   # a lone sensor: weak witness
    allsens = acc(np.sort(z, axis=1)[:, :5])                   # the 5 most slowed sensors of the network
    assert single < 0.65 and allsens > single + 0.1, (single, allsens)
