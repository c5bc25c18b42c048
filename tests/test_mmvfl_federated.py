"""MMVFL as a federation against the centralised oracle, as processes with the audit, and what leaves a party."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.algorithms import mmvfl
from fedhet.algorithms.mmvfl import core
from fedhet.algorithms.data_multiview import load_multiview
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.settings import parse_settings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

PARTIES = [("server", "server")] + [(f"p{i}", "participant") for i in range(1, 6)]
SMALL = {"dataset": "handwritten", "train_per_class": 12, "val_per_class": 6, "max_iter": 4,
         "percents": [10, 50, 100], "report_model": True}
# the oracle comparisons on packaged data (scikit-learn's digits, 4 views) and on the real Handwritten
DATASETS = [pytest.param("digits", id="digits"), pytest.param("handwritten", id="handwritten", marks=pytest.mark.data)]


def parties_of(dataset):
    k = mmvfl.DATASET_SHAPES[dataset][1]
    return [("server", "server")] + [(f"p{i}", "participant") for i in range(1, k + 1)]


def _oracle(cfg):
    s = parse_settings(mmvfl.Settings, cfg, "mmvfl")
    mv = load_multiview(s.dataset)
    train, _ = mmvfl.fold_rows(s, mv.y)
    rows = mmvfl.common_rows(s, train, len(mv.views))
    views = []
    for X in mv.views:
        Xr = np.asarray(X, dtype=np.float64)[rows]
        m, sc = core.fit_standardizer(Xr)
        views.append(core.standardize(Xr, m, sc))
    return rows, core.run_centralized(views, mv.y[rows], np.arange(rows.size), s.core())


def _compare(res, ref, rows, atol, parties=PARTIES):
    assert res["server"]["iterations"] == ref.iterations
    np.testing.assert_allclose(np.array(res["server"]["Z"]), ref.Z, rtol=0, atol=atol)
    for k, (name, _) in enumerate(parties[1:]):
        r = res[name]
        assert r["index"] == k and r["ids"] == rows.tolist()
        np.testing.assert_allclose(np.array(r["W"]), ref.W[k], rtol=1e-9, atol=atol)
        np.testing.assert_allclose(np.array(r["Z_k"]), ref.Z_views[k], rtol=0, atol=atol)


@pytest.mark.parametrize("dataset", DATASETS)
def test_plain_federated_run_equals_the_centralised_oracle(dataset):
    cfg = {**SMALL, "dataset": dataset, "aggregation": "plain"}
    rows, ref = _oracle(cfg)
    res = run_inmemory("mmvfl", parties_of(dataset), cfg, seed=0)
    assert len(rows) == mmvfl.n_common_rows(parse_settings(mmvfl.Settings, cfg, "mmvfl"))
    _compare(res, ref, rows, atol=1e-9, parties=parties_of(dataset))
    np.testing.assert_allclose(res["server"]["smoothed"], ref.smoothed, rtol=1e-12)


@pytest.mark.parametrize("dataset", DATASETS)
def test_secure_federated_run_within_the_quantisation_bound(dataset):
    # one round: Z is one aggregation of identical inputs, so the stated bound applies directly
    PARTIES = parties_of(dataset)
    cfg = {**SMALL, "dataset": dataset, "aggregation": "secure", "max_iter": 1}
    rows, ref = _oracle(cfg)
    res = run_inmemory("mmvfl", PARTIES, cfg, seed=0)
    bound = res["server"]["max_mean_error_bound"]
    assert 0 < bound < 1e-10
    assert np.max(np.abs(np.array(res["server"]["Z"]) - ref.Z)) <= bound
    # several rounds: the error stays at the bound's scale
    cfg = {**SMALL, "dataset": dataset, "aggregation": "secure"}
    rows, ref = _oracle(cfg)
    res = run_inmemory("mmvfl", PARTIES, cfg, seed=0)
    _compare(res, ref, rows, atol=1e3 * res["server"]["max_mean_error_bound"] + 1e-12, parties=PARTIES)


@pytest.mark.unit
def test_label_holder_must_be_first(tmp_path):
    cfg = {**SMALL, "aggregation": "plain", "max_iter": 1}
    s = parse_settings(mmvfl.Settings, cfg, "mmvfl")
    assert mmvfl.sizes(s)["n_rows"] == 12 * 10 - 5 * 2
    with pytest.raises(ValueError, match="n_folds"):
        parse_settings(mmvfl.Settings, {**cfg, "fold": 5}, "mmvfl")


@pytest.mark.processes
@pytest.mark.data   # Handwritten's view widths (the all-algorithms test runs the digits preset as processes)
def test_processes_audit_and_nothing_label_or_x_shaped_leaves(tmp_path):
    from fedhet.parties.ops import presets
    from fedhet.parties.audit import audit
    from fedhet.parties.federation import load
    from fedhet.parties.ops.launcher import launch
    from fedhet.algorithms import registry

    over = {"train_per_class": 10, "val_per_class": 4, "max_iter": 2, "percents": [10, 100]}
    fed = load(presets.path("mmvfl"))
    summary = launch(fed, tmp_path / "run", progress=False, overrides=over, timeout=240)
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    s = parse_settings(mmvfl.Settings, {**fed.algorithm_cfg(), **over}, "mmvfl")
    z_len = mmvfl.sizes(s)["z_len"]
    n_rows = mmvfl.sizes(s)["n_rows"]
    dims = {240, 76, 216, 47, 64}
    import json
    seen_masked = 0
    for tr in (tmp_path / "run").rglob("*transcript*"):
        for line in tr.read_text().splitlines():
            rec = json.loads(line)
            if rec.get("dir", "send") != "send" and "dir" in rec:
                continue
            kind = rec.get("kind", "")
            arrays = rec.get("arrays") or []
            for a in arrays:
                shape = tuple(a[-1])
                # no X-shaped (rows x d_k) and no label-shaped (rows,) arrays from anyone
                assert not (len(shape) == 2 and shape[1] in dims), (kind, shape)
                # (PSI's result is the common rows' positions, uint32, not labels)
                assert not (len(shape) == 1 and shape[0] == n_rows and kind != "psi/result"), (kind, shape)
                if kind == "secagg/masked":
                    seen_masked += 1
                    assert shape[0] in (z_len + 1, 3), shape
            if kind == "mmvfl/report":
                assert all(len(a[-1]) == 0 or a[-1] == [] for a in arrays)
    assert seen_masked > 0  # the transcripts were read
    assert summary["parties"]["server"]["result"]["iterations"] >= 1


@pytest.mark.parametrize("knn_k", [1, 3])
def test_a_participants_part_scores_its_own_rows_alone_as_it_scored_them(knn_k):
    """Each participant's exported part (its W_k, scaler, k-NN reference set) gives, on its raw validation
    rows, the accuracies it reported: exactly, but where neighbours tie in exact arithmetic (digits' integer
    pixels on two features) torch's and numpy's rounding of the distances may pick another one (here one
    row of 40, with k = 3 at 10 %).  The server saves no part."""
    from fedhet.algorithms.scoring import check_part
    from fedhet.algorithms.mmvfl.model import load_model

    cfg = {"dataset": "digits", "train_per_class": 10, "val_per_class": 4, "max_iter": 2, "percents": [10, 50, 100],
           "knn_k": knn_k, "aggregation": "plain"}
    models: dict = {}
    res = run_inmemory("mmvfl", parties_of("digits"), cfg, seed=0, models=models)
    assert set(models) == {name for name, role in parties_of("digits") if role == "participant"}
    s = parse_settings(mmvfl.Settings, cfg, "mmvfl")
    mv = load_multiview("digits")
    _, val = mmvfl.fold_rows(s, mv.y)
    for k, (name, _) in enumerate(parties_of("digits")[1:]):
        part = models[name]
        assert part.meta["percents"] == [10.0, 50.0, 100.0] and len(part.meta["feature_names"]) == 16
        module = load_model(part.meta, part.tensors)
        assert check_part(module, part.meta) is None
        with torch.no_grad():
            pred = module(torch.as_tensor(mv.views[k][val], dtype=torch.float64)).numpy()
        acc = [float(np.mean(pred[:, j] == mv.y[val])) for j in range(pred.shape[1])]
        assert np.allclose(acc, res[name]["accuracy"], rtol=0, atol=1.01 / len(val)), name
        assert knn_k == 3 or acc == res[name]["accuracy"], name


@pytest.mark.unit
def test_the_parts_knn_is_cores_rule_ties_included():
    from fedhet.algorithms.mmvfl.model import SelectionKNN

    rng = np.random.default_rng(3)
    ref = rng.integers(0, 3, size=(40, 5)).astype(np.float64)   # many exact ties
    labels = rng.integers(0, 4, size=40)
    q = rng.integers(0, 3, size=(25, 5)).astype(np.float64)
    sel = [np.array([0]), np.array([2, 4]), np.arange(5)]
    for k in (1, 2, 3, 5):
        m = SelectionKNN(np.zeros(5), np.ones(5), ref, labels, sel, k, 4)
        with torch.no_grad():
            got = m(torch.as_tensor(q)).numpy()
        want = np.stack([core.knn_predict(ref[:, s], labels, q[:, s], k) for s in sel], axis=1)
        np.testing.assert_array_equal(got, want)
