"""The shared algorithm toolkit (``fedhet.algorithms.toolkit``) against plain computations.

Seed values are frozen known-answer vectors on purpose: CHFL's, STFL's and the HE split
network's models are drawn from them, so a change here would change every trained model.
"""
from __future__ import annotations

import threading
import time
import zlib

import numpy as np
import pytest
import torch

from fedhet.algorithms import toolkit as T

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

# ------------------------------------------------------------------------------------ seeds


def test_derive_seed_frozen_vectors():
    # Computed by CHFL's own derive_seed (chfl_local) before it moved here (CHFL's models depend on them).
    assert T.derive_seed(0) == 6569863346532939966
    assert T.derive_seed(7, "theta0") == 1633059400423625922
    assert T.derive_seed(3, 2, "unique") == 1568005228041641801
    assert T.derive_seed(1000, 4, "batches") == 1303307427966638002
    assert T.derive_seed(np.int64(7), "theta0") == T.derive_seed(7, "theta0")
    seeds = {T.derive_seed(1, k, t) for k in range(5) for t in ("a", "b")}
    assert len(seeds) == 10 and all(0 <= s < 2 ** 63 for s in seeds)


def test_crc32_seed_is_crc32_of_the_key():
    # STFL's key is repr((seed, *tags)) with 31 bits, the HE split network's "seed/he_split/what".
    assert T.crc32_seed(repr((5, "split", "guest", 1)), 31) == 1171481809
    assert T.crc32_seed("0/he_split/host") == 3325374398 == zlib.crc32(b"0/he_split/host")
    assert T.crc32_seed("0/he_split/host", 31) == 3325374398 & 0x7FFFFFFF
    with pytest.raises(ValueError, match="31 or 32"):
        T.crc32_seed("x", 16)


# -------------------------------------------------------------------------- devices and RNG


def test_resolve_device():
    assert T.resolve_device("cpu") == torch.device("cpu") == T.resolve_device(" CPU ")
    assert T.resolve_device(None) == torch.device("cpu")
    assert T.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert T.resolve_device(torch.device("cpu")) == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            T.resolve_device("cuda:0")
    with pytest.raises(ValueError, match="unknown device"):
        T.resolve_device("tpu")


def test_seeded_repeats_and_restores_the_callers_state():
    torch.manual_seed(123)
    outside = torch.rand(3)
    torch.manual_seed(123)
    with T.seeded(9):
        a = torch.rand(4)
        lin = torch.nn.Linear(3, 2)
    after = torch.rand(3)
    assert torch.equal(after, outside)  # the block consumed nothing of the caller's stream
    with T.seeded(9):
        b = torch.rand(4)
        lin2 = torch.nn.Linear(3, 2)
    torch.manual_seed(9)
    assert torch.equal(a, b) and torch.equal(a, torch.rand(4))
    assert torch.equal(lin.weight, lin2.weight)
    with T.seeded(10):
        assert not torch.equal(torch.rand(4), a)


def test_seeded_blocks_in_threads_do_not_interleave():
    """Parties of an in-memory run are threads of one process: each one's seeded draws must be
    what it would draw alone."""
    alone = {}
    for s in range(4):
        with T.seeded(s):
            alone[s] = torch.cat([torch.rand(50) for _ in range(20)])
    got, start = {}, threading.Barrier(4)

    def draw(s):
        start.wait()
        with T.seeded(s):
            parts = []
            for _ in range(20):
                parts.append(torch.rand(50))
                time.sleep(0.001)  # let the other threads run in between
            got[s] = torch.cat(parts)

    threads = [threading.Thread(target=draw, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(got[s], alone[s]) for s in range(4))


def test_as_tensor():
    t = T.as_tensor(np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::2])
    assert t.dtype == torch.float32 and t.tolist() == [[0.0, 2.0], [3.0, 5.0]]
    assert T.as_tensor([1, 2], dtype=torch.long).dtype == torch.long


# ---------------------------------------------------------------------------- classification


def test_binary_loss_and_decisions_by_hand():
    logits = torch.tensor([[2.0], [-1.0], [0.5]])
    y = T.label_tensor(np.array([1, 0, 0]), 2)
    assert y.dtype == torch.float32
    p = 1 / (1 + np.exp(-np.array([2.0, -1.0, 0.5])))
    want = -np.mean(np.log([p[0], 1 - p[1], 1 - p[2]]))
    assert float(T.class_loss(logits, y)) == pytest.approx(want, rel=1e-6)
    # integer labels give the same loss (converted to the logits' dtype)
    assert torch.equal(T.class_loss(logits, torch.tensor([1, 0, 0])), T.class_loss(logits, y))
    assert T.predict_classes(logits).tolist() == [1, 0, 1]
    assert T.logit_width(2) == 1


def test_multiclass_loss_and_decisions_by_hand():
    logits = torch.tensor([[1.0, 2.0, 0.0], [3.0, -1.0, 0.5]])
    y = T.label_tensor([1, 2], 3)
    assert y.dtype == torch.long
    lp = logits.numpy() - np.log(np.exp(logits.numpy()).sum(1, keepdims=True))
    assert float(T.class_loss(logits, y)) == pytest.approx(-(lp[0, 1] + lp[1, 2]) / 2, rel=1e-6)
    assert T.predict_classes(logits).tolist() == [1, 0]
    assert T.logit_width(5) == 5
    with pytest.raises(ValueError, match="at least 2 classes"):
        T.logit_width(1)


def test_label_checks_and_accuracy():
    with pytest.raises(ValueError, match="labels must be in 0..1"):
        T.label_tensor([0, 2], 2)
    with pytest.raises(ValueError, match="1-D"):
        T.label_tensor([[0]], 2)
    assert T.accuracy([1, 0, 1, 1], np.array([1, 1, 1, 0])) == 0.5
    assert T.accuracy([], []) == 0.0
    with pytest.raises(ValueError, match="predictions"):
        T.accuracy([1, 0], [1])


# ---------------------------------------------------------------------------------- networks


def test_mlp_structure():
    m = T.mlp(6, 1, hidden_mult=3.0, layers=2, activation="tanh")
    assert [type(x).__name__ for x in m] == ["Linear", "Tanh", "Linear", "Tanh", "Linear"]
    assert [x.out_features for x in m if isinstance(x, torch.nn.Linear)] == [18, 18, 1]
    assert [type(x).__name__ for x in T.mlp(4, 3, layers=0)] == ["Linear"]
    assert T.hidden_width(1, 0.1) == 2  # at least two units
    # the same layers in the same order as the explicit widths: same weights from the same seed
    with T.seeded(1):
        a = T.mlp(5, 2, 2.0, 1)
    with T.seeded(1):
        b = T.mlp_from_widths([5, 10, 2])
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="unknown activation"):
        T.mlp(3, 1, activation="swish")
    with pytest.raises(ValueError, match="layers"):
        T.mlp(3, 1, layers=-1)
    assert isinstance(T.make_activation("elu"), torch.nn.ELU)


# ----------------------------------------------------------------------------------- scaling


def test_scaler_uses_the_fitted_rows_only():
    rng = np.random.default_rng(0)
    train = rng.normal(3, 2, (200, 3)).astype(np.float32)
    train[:, 2] = 7.0  # no spread: centred only
    sc = T.Scaler.fit(train)
    z = sc(train)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z[:, :2].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(z[:, :2].std(0), 1, atol=1e-5)
    assert (z[:, 2] == 0).all() and sc.std[2] == 1.0
    other = rng.normal(0, 1, (5, 3)).astype(np.float32)
    np.testing.assert_allclose(sc(other), (other - train.mean(0)) / sc.std, rtol=1e-6)
    assert T.Scaler.fit(np.array([[0.0], [1e-7]]), min_std=1e-6).std[0] == 1.0
    with pytest.raises(ValueError, match="zero rows"):
        T.Scaler.fit(np.zeros((0, 2)))


# ------------------------------------------------------------------------------- batch order


def test_epoch_permutation_is_keyed_per_epoch():
    p = T.epoch_permutation([4, 0x4E5], 3, 50)
    assert sorted(p.tolist()) == list(range(50))
    # documented formula (the order every trained model used): numpy's generator on [*key, epoch]
    assert np.array_equal(p, np.random.default_rng([4, 0x4E5, 3]).permutation(50))
    assert np.array_equal(T.epoch_permutation(9, 1, 20), np.random.default_rng([9, 1]).permutation(20))
    assert not np.array_equal(p, T.epoch_permutation([4, 0x4E5], 4, 50))
    parts = T.batch_slices(p, 16)
    assert [len(b) for b in parts] == [16, 16, 16, 2] and np.array_equal(np.concatenate(parts), p)


def test_shuffled_batches_stream():
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    e1 = list(T.shuffled_batches(10, 4, g1))
    assert [len(b) for b in e1] == [4, 4, 2]
    assert sorted(torch.cat(e1).tolist()) == list(range(10))
    assert torch.equal(torch.cat(e1), torch.cat(list(T.shuffled_batches(10, 4, g2))))
    assert not torch.equal(torch.cat(list(T.shuffled_batches(10, 4, g1))), torch.cat(e1))  # next epoch


# -------------------------------------------------------------------------- PSI-aligned views


def _host_toy():
    ids_tr, ids_te = np.array(["d", "a", "x", "c"]), np.array(["b", "y", "e"])
    x_tr = np.arange(8, dtype=np.float32).reshape(4, 2)
    x_te = 100 + np.arange(6, dtype=np.float32).reshape(3, 2)
    return ids_tr, ids_te, x_tr, np.array([0, 1, 0, 1]), x_te, np.array([1, 1, 0])


@pytest.mark.parametrize("order", ["own", "common"])
def test_align_host_rows(order):
    ids_tr, ids_te, x_tr, y_tr, x_te, y_te = _host_toy()
    own = np.concatenate([ids_tr, ids_te])
    common, (rows, _) = T.sorted_intersection(own.tolist(), ["a", "b", "c", "d", "e", "z"])
    assert common == ["a", "b", "c", "d", "e"]
    h = T.align_host_rows(rows, x_tr, y_tr, x_te, y_te, order=order)
    assert h.n_common == 5 and h.n_dropped == 2
    # every kept row sits at the position of its own ID in the common list
    for x, y, pos, ids, xs, ys in ((h.x_train, h.y_train, h.pos_train, ids_tr, x_tr, y_tr),
                                  (h.x_test, h.y_test, h.pos_test, ids_te, x_te, y_te)):
        for xi, yi, p in zip(x, y, pos):
            r = int(np.flatnonzero((xs == xi).all(1))[0])
            assert common[p] == ids[r] and ys[r] == yi
    assert sorted(h.pos_train.tolist() + h.pos_test.tolist()) == list(range(5))
    if order == "own":  # the host's own row order: d, a, c
        assert [common[p] for p in h.pos_train] == ["d", "a", "c"]
    else:  # the common list's order
        assert [common[p] for p in h.pos_train] == ["a", "c", "d"]


def test_align_host_rows_rejects_bad_rows():
    _, _, x_tr, y_tr, x_te, y_te = _host_toy()
    with pytest.raises(ValueError, match="7 train\\+test rows"):
        T.align_host_rows([0, 7], x_tr, y_tr, x_te, y_te)
    with pytest.raises(ValueError, match="twice"):
        T.align_host_rows([1, 1], x_tr, y_tr, x_te, y_te)
    with pytest.raises(ValueError, match="order"):
        T.align_host_rows([1], x_tr, y_tr, x_te, y_te, order="sorted")


def test_align_guest_rows_scales_with_the_other_rows():
    rng = np.random.default_rng(1)
    x = rng.normal(5, 3, (40, 3))
    common = np.array([7, 3, 30, 12])
    g = T.align_guest_rows(x, common)
    rest = np.setdiff1d(np.arange(40), common)
    assert g.rest.sum() == 36 and not g.rest[common].any()
    mu, sd = x[rest].astype(np.float32).mean(0), x[rest].astype(np.float32).std(0)
    np.testing.assert_allclose(g.x_common, (x[common] - mu) / sd, rtol=1e-5)
    np.testing.assert_allclose(g.x_rest.mean(0), 0, atol=1e-5)
    every = T.align_guest_rows(x[:4], [2, 0, 1, 3])  # all rows common: fitted on all of them
    np.testing.assert_allclose(every.x_common.mean(0), 0, atol=1e-5)
    assert every.x_rest.shape == (0, 3)
    with pytest.raises(ValueError, match="40 rows"):
        T.align_guest_rows(x, [40])


def test_sorted_intersection_first_occurrence():
    common, rows = T.sorted_intersection([3, 1, 2, 1], [2, 3, 4], [1, 2, 3])
    assert common == [2, 3]
    assert [r.tolist() for r in rows] == [[2, 0], [0, 1], [1, 2]]
    with pytest.raises(ValueError):
        T.sorted_intersection()


def test_phases_record_every_timing_as_phase_s_and_survive_a_checkpoint():
    from fedhet.algorithms.toolkit import Phases

    ph = Phases()
    for _ in range(3):
        with ph.timed("train", "cpu"):
            sum(range(1000))
    ph.add("submit", 0.25)
    res = ph.result()
    assert set(res) == {"train_s", "submit_s"} and len(res["train_s"]) == 3 and res["submit_s"] == [0.25]
    assert all(t >= 0 for t in res["train_s"]) and ph.last("submit") == 0.25
    again = Phases.restored(ph.state())
    again.add("train", 1.0)
    assert again.result()["train_s"][:3] == res["train_s"] and len(ph.result()["train_s"]) == 3   # a copy


def test_traffic_totals_are_the_runtimes_counts():
    from types import SimpleNamespace

    from fedhet.algorithms.toolkit import traffic_totals

    party = SimpleNamespace(bytes_sent={"a": 3, "b": 4}, bytes_received={"a": 10})
    assert traffic_totals(party) == {"bytes_sent": 7, "bytes_received": 10}
