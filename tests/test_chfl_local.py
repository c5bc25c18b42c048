"""CHFL numerics: model (eqs. 6-7), flat common vector, Algorithm 2's two
steps, FedAvg aggregation, the partitioner, the loaders, and a tiny run of
the roles in memory (the equality of the roles with plain FedAvg in one loop
is in test_chfl_federated.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms.chfl import experiments as chfl
from fedhet.algorithms.chfl.core import CHFLClient, aggregate, select_per_client
from fedhet.algorithms.chfl.data import client_data
from fedhet.algorithms.chfl.models import (CHFLNet, MLPColumn, UniqueColumn, common_numel,
                                           common_to_flat, flat_to_common, init_common_flat)
from fedhet.algorithms.partition import (chfl_partition, split_features, split_samples,
                                         vertical_split)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

SMALL = (16, 8, 8)




def _toy(n=600, d=12, c=3, seed=0):
    """Classes separable from any feature block: each feature carries the
    class through its own class mean, plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, c, n)
    means = rng.normal(0, 1.5, (c, d))
    X = (means[y] + rng.normal(0, 1.0, (n, d))).astype(np.float32)
    return X, y.astype(np.int64)


# ------------------------------------------------------------------ model

def test_shapes():
    net = CHFLNet(5, 7, 4, hidden=SMALL, mu=0.5)
    out = net(torch.randn(3, 5), torch.randn(3, 7))
    assert out.shape == (3, 4)
    zc = net.common.forward_all(torch.randn(3, 5))
    assert [z.shape[1] for z in zc] == [16, 8, 8, 4]
    assert [l.weight.shape for l in net.unique.laterals] == [(8, 16), (8, 8), (4, 8)]
    assert UniqueColumn(7, 4, SMALL, mu=0.0).laterals is None


def test_eq6_by_hand():
    torch.manual_seed(0)
    net = CHFLNet(3, 2, 2, hidden=(4, 4), mu=0.3)
    xc, xu = torch.randn(5, 3), torch.randn(5, 2)
    c, u = net.common.layers, net.unique.layers
    U = net.unique.laterals
    zc1 = torch.relu(xc @ c[0].weight.T + c[0].bias)
    zc2 = torch.relu(zc1 @ c[1].weight.T + c[1].bias)
    zc3 = zc2 @ c[2].weight.T + c[2].bias
    zu1 = torch.relu(xu @ u[0].weight.T + u[0].bias)
    zu2 = torch.relu(zu1 @ u[1].weight.T + u[1].bias + 0.3 * zc1 @ U[0].weight.T)
    zu3 = zu2 @ u[2].weight.T + u[2].bias + 0.3 * zc2 @ U[1].weight.T
    torch.testing.assert_close(net(xc, xu), zc3 + zu3)


def test_mu_zero_equals_no_laterals():
    torch.manual_seed(1)
    with_lat = UniqueColumn(6, 3, SMALL, mu=0.7, lateral=True)
    plain = UniqueColumn(6, 3, SMALL, mu=0.0, lateral=False)
    plain.layers.load_state_dict(with_lat.layers.state_dict())
    common = MLPColumn(4, 3, SMALL)
    xu, zc = torch.randn(10, 6), common.forward_all(torch.randn(10, 4))
    assert not torch.allclose(with_lat(xu, zc), plain(xu, zc))  # laterals matter at mu>0
    with_lat.mu = 0.0
    assert torch.equal(with_lat(xu, zc), plain(xu, zc))


def test_mu_range_checked():
    with pytest.raises(ValueError, match="mu"):
        UniqueColumn(3, 2, SMALL, mu=1.5)


def test_flat_vector_round_trip():
    torch.manual_seed(2)
    a, b = MLPColumn(9, 5, SMALL), MLPColumn(9, 5, SMALL)
    v = common_to_flat(a)
    assert v.dtype == np.float32 and v.ndim == 1 and v.size == common_numel(a)
    assert v.size == 9 * 16 + 16 + 16 * 8 + 8 + 8 * 8 + 8 + 8 * 5 + 5
    flat_to_common(b, v)
    x = torch.randn(4, 9)
    assert torch.equal(a(x), b(x))
    np.testing.assert_array_equal(common_to_flat(b), v)
    flat_to_common(b, torch.from_numpy(v * 2))
    np.testing.assert_array_equal(common_to_flat(b), v * 2)
    with pytest.raises(ValueError, match="shape"):
        flat_to_common(b, v[:-1])
    bad = v.copy()
    bad[0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        flat_to_common(b, bad)
    np.testing.assert_array_equal(init_common_flat(9, 5, SMALL, seed=3),
                                  init_common_flat(9, 5, SMALL, seed=3))


# --------------------------------------------------------- Algorithm 2

def _client(mus, seed=0):
    X, y = _toy()
    split = chfl_partition(len(y), X.shape[1], 3, 0.3, seed=0)
    return CHFLClient(client_data(X, y, split, 0), mus=mus, lr=1e-2, hidden=SMALL, seed=seed)


def test_unique_step_leaves_common_column_alone():
    c = _client([0.5])
    before = c.get_common()
    xc, xu, y = c.data.xc["train"], c.data.xu["train"], c.data.y["train"]
    # whole-network loss with theta_c fixed: no gradient may reach theta_c
    from fedhet.algorithms.chfl.models import CHFLNet as Net
    net = Net(c.data.d_common, c.data.d_unique, 3, SMALL, mu=0.5, common=c.common)
    torch.nn.functional.cross_entropy(net.forward_fixed_common(xc, xu), y).backward()
    assert all(p.grad is None for p in c.common.parameters())
    assert any(p.grad is not None for p in net.unique.parameters())
    np.testing.assert_array_equal(c.get_common(), before)


def test_common_trajectory_independent_of_unique_columns():
    """Step 1 never sees the unique column, so theta_c after a round is the
    same with 0, 1 or 3 unique heads -- and the heads do learn."""
    alone, one, many = _client([]), _client([0.0]), _client([0.0, 0.5, 1.0])
    v0 = alone.get_common()
    np.testing.assert_array_equal(one.get_common(), v0)
    heads_before = [p.detach().clone() for p in many.heads[2].parameters()]
    for c in (alone, one, many):
        c.train_round(epochs=1, batch_size=16)
    assert not np.array_equal(alone.get_common(), v0)
    np.testing.assert_array_equal(one.get_common(), alone.get_common())
    np.testing.assert_array_equal(many.get_common(), alone.get_common())
    assert any(not torch.equal(a, b) for a, b in zip(heads_before, many.heads[2].parameters()))


def test_aggregate():
    rng = np.random.default_rng(0)
    vs = [rng.normal(size=7).astype(np.float32) for _ in range(3)]
    np.testing.assert_allclose(aggregate(vs), np.mean(vs, 0), rtol=1e-6)
    w = [1, 2, 5]
    np.testing.assert_allclose(aggregate(vs, w), np.average(vs, 0, weights=w), rtol=1e-6)
    assert aggregate(vs).dtype == np.float32
    with pytest.raises(ValueError):
        aggregate([vs[0], vs[1][:-1]])
    with pytest.raises(ValueError):
        aggregate(vs, [1, -1, 1])
    with pytest.raises(ValueError):
        aggregate([])


def test_select_uses_validation_not_test():
    val = np.array([[0.5, 0.9], [0.8, 0.1]])   # (rounds, clients)
    test = np.array([[0.1, 0.2], [0.3, 0.4]])
    other = {"val": np.full((2, 2), 0.6), "test": np.full((2, 2), 0.99), "config": {"lr": 2}}
    s = select_per_client([{"val": val, "test": test, "config": {"lr": 1}}, other])
    # client 0: best val 0.8 (round 2, cfg 1); client 1: 0.9 (round 1, cfg 1)
    assert s["test"] == [0.3, 0.2]
    assert s["chosen"] == [{"lr": 1, "round": 2}, {"lr": 1, "round": 1}]
    s = select_per_client([{"val": val, "test": test}, other], select="last")
    assert s["test"] == [0.3, 0.99]


def _curves(res, K, label, part="test"):
    """(rounds, clients) accuracies of one label from the clients' results (one lr)."""
    return np.array([res[f"client{k + 1}"]["curves"][0][label][part] for k in range(K)]).T


@pytest.mark.federation
def test_tiny_run_learns_above_chance():
    X, y = _toy(n=900, seed=4)
    cfg = dict(common_ratio=0.3, lr=3e-3, rounds=3, seed=0, local_epochs=2, batch_size=32,
               hidden=list(SMALL), aggregation="plain")
    r = chfl.run_table({**cfg, "mu": [0.0, 0.5]}, X, y, 3)
    assert set(r["server"]["final_test"]) == {"common", "chfl_mu=0", "chfl_mu=0.5"}
    assert _curves(r, 3, "chfl_mu=0.5").shape == (3, 3)
    for lab, acc in r["server"]["final_test"].items():
        assert acc > 0.6, (lab, acc)  # chance is 1/3
    loc = chfl.run_table({**cfg, "method": "local"}, X, y, 3)
    assert loc["server"]["final_test"]["local"] > 0.6
    # Common alone follows exactly the common column of the CHFL run
    com = chfl.run_table({**cfg, "method": "common"}, X, y, 3)
    assert np.array_equal(_curves(com, 3, "common"), _curves(r, 3, "common"))
    # and a run is reproducible from its seed
    again = chfl.run_table({**cfg, "mu": [0.0, 0.5]}, X, y, 3)
    for k in range(3):
        assert again[f"client{k + 1}"]["curves"] == r[f"client{k + 1}"]["curves"]


def test_run_table_rejects_bad_input():
    X, y = _toy(n=60)
    with pytest.raises(ValueError, match="method"):
        chfl.run_table({"method": "vfl"}, X, y, 2)
    with pytest.raises(ValueError, match="unique features"):
        chfl.run_table({"rounds": 1}, X, y, 20)
    with pytest.raises(ValueError, match="mu_grid"):
        chfl.sweep((X, y), K=2, mu_grid=[0.0])


# ------------------------------------------------------------- partition

def test_partition_properties():
    s = chfl_partition(1003, 54, 5, 0.3, seed=7)
    assert len(s.common) == round(0.3 * 54)
    feats = np.concatenate([s.common, *s.unique])
    assert np.array_equal(np.sort(feats), np.arange(54))          # every feature exactly once
    for k in range(5):
        assert set(s.common) <= set(s.features(k).tolist())        # common shared by all
    rows = np.concatenate([*s.train, *s.val, *s.test])
    assert np.array_equal(np.sort(rows), np.arange(1003))         # disjoint, covering
    sizes = [sum(len(a) for a in part) for part in (s.train, s.val, s.test)]
    assert sizes[1] == sizes[2] == 200 and sizes[0] == 603
    assert max(len(a) for a in s.train) - min(len(a) for a in s.train) <= 1
    assert max(len(u) for u in s.unique) - min(len(u) for u in s.unique) <= 1


def test_partition_seeds():
    a = chfl_partition(500, 20, 3, seed=1)
    b = chfl_partition(500, 20, 3, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a.train + a.unique, b.train + b.unique))
    c = chfl_partition(500, 20, 3, seed=1, feature_seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a.train, c.train))   # same rows
    assert not np.array_equal(a.common, c.common)                        # other features
    d = chfl_partition(500, 20, 3, seed=2, feature_seed=1)
    assert np.array_equal(a.common, d.common)
    assert not np.array_equal(a.train[0], d.train[0])


def test_partition_errors():
    with pytest.raises(ValueError, match="unique features"):
        split_features(10, 8, 0.3)          # 7 unique features for 8 clients
    with pytest.raises(ValueError, match="common_ratio"):
        split_features(10, 2, 1.0)
    with pytest.raises(ValueError, match="no common feature"):
        split_features(4, 2, 0.05)
    with pytest.raises(ValueError, match="at least one row"):
        split_samples(10, 4)
    with pytest.raises(ValueError, match="fractions"):
        split_samples(100, 2, fractions=(0.5, 0.6))
    with pytest.raises(ValueError, match="n_clients"):
        split_features(10, 0)


def test_vertical_split():
    g = vertical_split(10, 3)
    assert [len(a) for a in g] == [4, 3, 3] and np.array_equal(np.concatenate(g), np.arange(10))
    g = vertical_split(10, 2, seed=5, sizes=[3, 7])
    assert [len(a) for a in g] == [3, 7]
    assert np.array_equal(np.sort(np.concatenate(g)), np.arange(10))
    with pytest.raises(ValueError):
        vertical_split(3, 4)
    with pytest.raises(ValueError):
        vertical_split(10, 2, sizes=[3, 3])


# ------------------------------------------------------------------- data

@pytest.mark.parametrize("name,shape,classes", [
    ("covertype", (15120, 54), 7), ("sensorless", (2200, 48), 11),
    ("jannis", (30145, 54), 4), ("vehicle", (846, 18), 4)])
def test_stored_loaders(name, shape, classes, shared_data):
    from fedhet.algorithms.data_tabular import load_tabular
    d = load_tabular(name)
    assert d.name == name and d.X.shape == shape and d.X.dtype == np.float32
    assert d.y.dtype == np.int64 and d.n_classes == classes
    assert np.array_equal(np.unique(d.y), np.arange(classes))
    if name == "covertype":
        assert (np.bincount(d.y) == 2160).all()
        assert d.X[0, 0] == 2596 and d.y[0] == 4     # Kaggle's first row, Cover_Type 5


def test_user_copy_of_openml_set(tmp_path):
    from fedhet.algorithms.data_tabular import load_tabular
    from fedhet.algorithms.datapath import DatasetNotFound
    (tmp_path / "helena").mkdir()
    X = np.arange(12, dtype=np.float64).reshape(4, 3)
    np.save(tmp_path / "helena" / "X.npy", X)
    np.save(tmp_path / "helena" / "y.npy", np.array([5, 7, 5, 9]))
    d = load_tabular("helena", data_dir=tmp_path)
    assert d.X.dtype == np.float32 and np.array_equal(d.X, X) and d.y.tolist() == [0, 1, 0, 2]
    (tmp_path / "aloi").mkdir()
    with pytest.raises(DatasetNotFound, match="aloi"):
        load_tabular("aloi", data_dir=tmp_path)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_tabular("mnist", data_dir=tmp_path)
