"""STFL numerics in process: models, VAE training, data loaders and splits, whole methods."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedhet.algorithms import data_fate as D
from fedhet.algorithms.stfl import core as L
from fedhet.algorithms.stfl.models import VAE, HierarchicalNet, vae_loss
from fedhet.algorithms.stfl.settings import Model
from fedhet.algorithms.toolkit import mlp
from fedhet.parties.settings import SettingsError, parse_settings

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

FAST = Model(epochs=20, vae_epochs=20, lr=1e-2, vae_lr=1e-2)


@pytest.fixture(scope="module")
def breast_views():
    return D.prepare("breast_sk", seed=3)


# ------------------------------------------------------------------ models


def test_model_shapes():
    vae = VAE(20, hidden_mult=2.0, latent_frac=0.5)
    assert vae.encoder.latent_dim == 10
    assert vae.encoder.trunk[0].out_features == 40
    x = torch.randn(7, 20)
    x_hat, mu, logvar = vae(x)
    assert x_hat.shape == (7, 20) and mu.shape == (7, 10) and logvar.shape == (7, 10)
    assert VAE(9).encoder.latent_dim == 4  # half, rounded down
    net = HierarchicalNet(5, [9, 20], n_classes=4)
    assert net(torch.randn(3, 5), [torch.randn(3, 9), torch.randn(3, 20)]).shape == (3, 4)
    assert HierarchicalNet(5, [6], n_classes=2)(torch.randn(3, 5), [torch.randn(3, 6)]).shape == (3, 1)
    m = mlp(6, 1, hidden_mult=3.0, layers=2)
    assert [l.out_features for l in m if isinstance(l, torch.nn.Linear)] == [18, 18, 1]


def test_vae_loss_matches_closed_form():
    x = torch.randn(4, 3)
    x_hat = torch.randn(4, 3)
    mu, logvar = torch.randn(4, 2), torch.randn(4, 2)
    tot, rec, kl = vae_loss(x_hat, x, mu, logvar, kl_weight=0.5)
    rec_ref = ((x_hat - x) ** 2).sum() / 4
    var = logvar.exp()
    kl_ref = 0.5 * (var + mu ** 2 - 1 - logvar).sum() / 4  # KL(N(mu, var) || N(0, 1))
    assert torch.allclose(rec, rec_ref) and torch.allclose(kl, kl_ref)
    assert torch.allclose(tot, rec_ref + 0.5 * kl_ref)
    assert float(vae_loss(x, x, torch.zeros(4, 2), torch.zeros(4, 2))[0]) == 0.0


def test_vae_training_reduces_loss(breast_views):
    g = breast_views.guests[0]
    cfg = replace(FAST, seed=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        untrained = VAE(g.x_unlabeled.shape[1])
    fit = L.fit_vae(g.x_unlabeled, cfg)
    before = L.vae_eval_loss(untrained, g.x_test)
    after = L.vae_eval_loss(fit.vae, g.x_test)  # held-out rows
    assert after["recon_at_mean"] < 0.5 * before["recon_at_mean"]
    assert after["neg_elbo"] < before["neg_elbo"]
    assert fit.history[-1] < fit.history[0]
    z = L.encode(fit.encoder, g.x_train)
    assert z.shape == (len(g.x_train), g.x_train.shape[1] // 2) and z.dtype == np.float32
    # the shared code is the posterior mean: deterministic, no sampling noise
    assert np.array_equal(z, L.encode(fit.encoder, g.x_train))


# ------------------------------------------------------------------ whole methods


def test_stfl_on_sklearn_breast_is_accurate(breast_views):
    r = L.stfl(breast_views, FAST)
    assert r["accuracy"] > 0.9
    assert r["n_test"] == len(breast_views.host.y_test)
    assert r["latent_dims"] == [10]
    for m in ("centralized", "hierarchical"):
        assert L.METHODS[m](breast_views, FAST, "cpu")["accuracy"] > 0.9


def test_stfl_is_deterministic_given_seed(breast_views):
    cfg = replace(FAST, epochs=5, vae_epochs=5)
    g = breast_views.guests[0]
    z1 = L.encode(L.train_vae(g.x_unlabeled, cfg, seed=11), g.x_train)
    torch.manual_seed(12345)  # the caller's global RNG must not matter
    z2 = L.encode(L.train_vae(g.x_unlabeled, cfg, seed=11), g.x_train)
    z3 = L.encode(L.train_vae(g.x_unlabeled, cfg, seed=12), g.x_train)
    assert np.array_equal(z1, z2)
    assert not np.allclose(z1, z3)
    h = breast_views.host
    w = [L.train_host(h.x_train, [z1], h.y_train, 2, cfg, seed=5).model[0].weight.detach().clone()
         for _ in range(2)]
    assert torch.equal(w[0], w[1])
    a, b = L.stfl(breast_views, replace(cfg, seed=4)), L.stfl(breast_views, replace(cfg, seed=4))
    assert a["accuracy"] == b["accuracy"]


def test_multiclass_and_several_guests():
    rng = np.random.default_rng(0)
    n, k = 600, 3
    y = rng.integers(0, k, n)
    centres = rng.normal(0, 3, (k, 12))
    x = (centres[y] + rng.normal(0, 1, (n, 12))).astype(np.float32)
    ids = np.array([f"u{i}" for i in range(n)])
    data = D.VerticalData("toy", k, D.PartyTable(ids, x[:, :4].copy(), list("abcd"), y),
                          [D.PartyTable(ids, x[:, 4:].copy(), [f"g{i}" for i in range(8)])])
    data = D.split_guest_columns(data, 2)
    assert [g.x.shape[1] for g in data.guests] == [4, 4]
    v = D.views(data, D.make_split(data, seed=0))
    r = L.stfl(v, FAST)
    assert r["latent_dims"] == [2, 2]
    assert r["accuracy"] > 0.8  # well-separated blobs; chance is 1/3
    assert L.hierarchical(v, FAST)["accuracy"] > 0.8


def test_host_side_checks_inputs(breast_views):
    h = breast_views.host
    z = np.zeros((len(h.x_train) - 1, 3), dtype=np.float32)
    with pytest.raises(ValueError, match="latents\\[0\\]"):
        L.train_host(h.x_train, [z], h.y_train, 2, FAST)
    with pytest.raises(ValueError, match="labels must be in"):
        L.train_host(h.x_train, [], h.y_train + 5, 2, FAST)


def test_config_validation():
    assert parse_settings(Model, {"epochs": 3}, "stfl").epochs == 3
    with pytest.raises(SettingsError, match="unknown setting.*'epoch'"):
        parse_settings(Model, {"epoch": 3}, "stfl")
    with pytest.raises(SettingsError, match="batch_size"):
        parse_settings(Model, {"batch_size": 0}, "stfl")
    with pytest.raises(SettingsError, match="epochs must be an integer"):
        parse_settings(Model, {"epochs": 2.5}, "stfl")


# ------------------------------------------------------------------ data


def _check_split_and_views(data: D.VerticalData, v: D.Views):
    s = v.split
    sets = [set(s.selftaught.tolist()), set(s.train.tolist()), set(s.test.tolist())]
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    assert sum(map(len, sets)) == len(data.common_ids)
    h = v.host
    assert np.array_equal(h.ids_train, s.train) and np.array_equal(h.ids_test, s.test)
    for gv in v.guests:
        assert np.array_equal(gv.ids_train, h.ids_train)
        assert np.array_equal(gv.ids_test, h.ids_test)
        assert np.array_equal(gv.ids_unlabeled, s.selftaught)
    # standardisation fitted on the party's training rows only
    assert np.allclose(h.x_train.mean(0), 0, atol=1e-4)
    assert np.allclose(v.guests[0].x_unlabeled.mean(0), 0, atol=1e-4)
    assert h.x_train.dtype == np.float32 and h.y_train.dtype == np.int64


def test_sklearn_breast_loader_aligned_and_disjoint():
    from sklearn.datasets import load_breast_cancer

    data = D.load("breast_sk", seed=2)
    g = data.guests[0]
    assert data.host.x.shape == (569, 10) and g.x.shape == (569, 20)
    assert not np.array_equal(g.ids, data.host.ids)  # guest rows stored in another order
    split = D.make_split(data, seed=2)
    assert split.sizes() == {"selftaught": 228, "train": 227, "test": 114}
    v = D.views(data, split)
    _check_split_and_views(data, v)
    # aligned rows are the same patients: compare with the original table through the IDs
    raw = load_breast_cancer().data
    rows = np.array([int(i.split("-")[1]) for i in split.train])
    assert np.allclose(g.rows(split.train).x, raw[rows, :20], rtol=1e-6)
    assert np.array_equal(data.host.rows(split.train).y, load_breast_cancer().target[rows])
    # different seed, different split; same seed, same split
    assert not np.array_equal(D.make_split(data, seed=3).train, split.train)
    assert np.array_equal(D.make_split(data, seed=2).train, split.train)


def test_split_rejects_bad_fractions():
    data = D.load("breast_sk")
    with pytest.raises(ValueError, match="selftaught_frac"):
        D.make_split(data, 0, selftaught_frac=0.7, test_frac=0.4)
    with pytest.raises(ValueError, match="unknown data set"):
        D.load("nope")
    with pytest.raises(KeyError, match="not in this party"):
        data.host.rows(np.array(["missing-id"]))


def test_fate_cancer_matches_sklearn_table(shared_data):
    root = shared_data
    from sklearn.datasets import load_breast_cancer

    data = D.load("cancer", data_dir=root)
    assert data.n_classes == 2
    assert data.host.x.shape == (569, 10) and data.guests[0].x.shape == (569, 20)
    ids = data.common_ids
    order = ids.astype(int)
    b = load_breast_cancer()
    z = (b.data - b.data.mean(0)) / b.data.std(0)
    assert np.allclose(data.host.rows(ids).x, z[order, 20:30], atol=1e-4)
    assert np.allclose(data.guests[0].rows(ids).x, z[order, :20], atol=1e-4)
    assert np.array_equal(data.host.rows(ids).y, b.target[order])
    v = D.views(data, D.make_split(data, seed=0))
    _check_split_and_views(data, v)
    assert v.split.sizes()["selftaught"] == 228


@pytest.mark.parametrize("name,host_d,guest_d,k,n", [
    ("payment", 13, 10, 2, 30000), ("credit", 5, 5, 2, 30000), ("vehicle", 9, 9, 4, 846)])
def test_fate_loaders(name, host_d, guest_d, k, n, shared_data):
    root = shared_data
    data = D.load(name, data_dir=root)
    assert data.n_classes == k
    assert data.host.x.shape == (n, host_d) and data.guests[0].x.shape == (n, guest_d)
    assert set(np.unique(data.host.y)) == set(range(k))
    v = D.views(data, D.make_split(data, seed=1))
    _check_split_and_views(data, v)
    if name == "credit":  # the host half is FATE's give_credit_hetero_test columns
        _, ids, y, x = D._read_csv(str(root / "fate" / "give_credit_hetero_test.csv.gz"))
        t = data.host.rows(ids)
        assert np.allclose(t.x, x, atol=1e-6) and np.array_equal(t.y, y)


def test_federated_host_view_has_no_selftaught_rows():
    data = D.load("breast_sk", seed=0)
    split = D.make_split(data, seed=0)
    hv = D.host_view(data, split, with_selftaught=False)
    assert hv.x_selftaught is None and len(hv.ids_selftaught) == 0
    assert not set(hv.ids_train.tolist()) & set(split.selftaught.tolist())
    v = D.Views("breast_sk", hv, [D.guest_view(data, split, 0)], split)
    with pytest.raises(ValueError, match="self-taught rows"):
        L.centralized(v, replace(FAST, epochs=1), all_data=True)
