"""MMVFL numerical core: each update against its plain definition, the oracle's properties."""
from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from fedhet.algorithms import data_multiview as dm
from fedhet.algorithms.mmvfl import core as mc

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def _standardized(data: dm.MultiView, train: np.ndarray) -> list[np.ndarray]:
    out = []
    for X in data.views:
        mean, scale = mc.fit_standardizer(X[train])
        out.append(mc.standardize(X, mean, scale))
    return out


@pytest.fixture(scope="module", autouse=True)
def one_blas_thread():
    """Small solves on a shared machine: multi-threaded BLAS only waits for busy cores (35x slower here)."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def synthetic():
    data = dm.make_synthetic(n_per_class=30, n_classes=4, dims=(12, 20, 16), informative=4,
                             separation=4.0, seed=3)
    train, val = dm.balanced_split(data.y, 20, 10, seed=0)
    return data, _standardized(data, train), train, val


# ---------------------------------------------------------------- eq. (6) solvers
@pytest.mark.parametrize("n,d", [(60, 15), (25, 70)])
def test_cholesky_woodbury_and_numpy_solve_agree(n, d):
    X, Z = _rand((n, d), 1), _rand((n, 3), 2)
    a = 1.0 / (2 * (np.abs(_rand(d, 3)) + 1e-3))
    beta = 0.3
    expect = np.linalg.solve(X.T @ X + beta * np.diag(a), X.T @ Z)
    chol = mc.solve_cholesky(mc.prepare_view(X, 3, "cholesky"), X.T @ Z, a, beta)
    wood = mc.solve_woodbury(mc.prepare_view(X, 3, "woodbury"), Z, a, beta)
    np.testing.assert_allclose(chol, expect, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(wood, expect, rtol=1e-8, atol=1e-10)
    # solve_w dispatches on the resolved solver; auto picks Woodbury exactly when d > N
    auto = mc.prepare_view(X, 3, "auto")
    assert auto.solver == ("woodbury" if d > n else "cholesky")
    assert (auto.gram is None) == (auto.solver == "woodbury")
    np.testing.assert_allclose(mc.solve_w(auto, Z, a, beta), expect, rtol=1e-8, atol=1e-10)


def test_choose_solver_and_costs():
    assert mc.choose_solver(800, 1522, 2) == "woodbury"
    assert mc.choose_solver(1200, 240, 10) == "cholesky"
    assert mc.choose_solver(100, 100, 3) == "cholesky"
    assert mc.choose_solver(1200, 240, 10, "woodbury") == "woodbury"
    c = mc.solver_costs(100, 1000, 3)
    assert c["woodbury"] < c["cholesky"]
    with pytest.raises(ValueError, match="solver must be one of"):
        mc.choose_solver(10, 10, 2, "lu")


def test_reweighting_diagonal_is_the_papers_formula():
    W = np.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(mc.reweighting_diagonal(W, 1e-8), [1 / (2 * (5 + 1e-8)), 1 / (2e-8)])


@pytest.mark.parametrize("solver", ["cholesky", "woodbury"])
def test_update_w_decreases_the_smoothed_subproblem_and_reaches_a_fixed_point(solver):
    X, Z = _rand((40, 25), 4), _rand((40, 3), 5)
    beta, eps = 2.0, 1e-8
    system = mc.prepare_view(X, 3, solver)
    W = mc.init_w(25, 3, seed=0, participant=0)

    def f(W):
        return np.sum((X @ W - Z) ** 2) + beta * mc.l21_smoothed(W, eps)

    values = [f(W)]
    for _ in range(60):
        W = mc.update_w(system, Z, W, beta, eps, max_iters=1).W
        values.append(f(W))
    assert all(b <= a * (1 + 1e-12) for a, b in zip(values, values[1:]))
    assert values[-1] < values[0]
    # Stationary: W solves eq. (6) with A computed from W itself.
    a = mc.reweighting_diagonal(W, eps)
    again = np.linalg.solve(X.T @ X + beta * np.diag(a), X.T @ Z)
    np.testing.assert_allclose(again, W, rtol=1e-4, atol=1e-6)


def test_update_w_tolerance_stops_early():
    X, Z = _rand((50, 10), 6), _rand((50, 2), 7)
    system = mc.prepare_view(X, 2)
    up = mc.update_w(system, Z, mc.init_w(10, 2, 0, 0), 0.1, 1e-8, max_iters=500, tol=1e-10)
    assert up.converged and up.iterations < 500
    fixed = mc.update_w(system, Z, mc.init_w(10, 2, 0, 0), 0.1, 1e-8, max_iters=4)
    assert fixed.iterations == 4 and not fixed.converged


# ---------------------------------------------------------------- eq. (7), (8), (3)
def test_z_updates_are_the_exact_minimisers():
    n, c = 30, 4
    XW, Z = _rand((n, c), 8), _rand((n, c), 9)
    Y = mc.one_hot(np.arange(n) % c, c)
    mask = np.arange(n) % 3 != 0
    zeta, eta = 7.0, 3.0
    Zk = mc.update_z_view(XW, Z, zeta)
    np.testing.assert_allclose(Zk, (XW + zeta * Z) / (1 + zeta))
    # gradient of ||XW - Z1||^2 + zeta ||Z1 - Z||^2 + eta ||M (Z1 - Y)||^2 is zero at the update
    Z1 = mc.update_z_view(XW, Z, zeta, Y, eta, mask)
    grad = (Z1 - XW) + zeta * (Z1 - Z) + eta * mask[:, None] * (Z1 - Y)
    np.testing.assert_allclose(grad, 0, atol=1e-12)
    np.testing.assert_allclose(Z1[~mask], Zk[~mask])
    np.testing.assert_allclose(mc.update_z_view(XW, Z, zeta, Y, eta),
                               (XW + zeta * Z + eta * Y) / (1 + zeta + eta))


def test_combine_is_the_weighted_mean_from_contributions():
    Zs = [_rand((10, 3), s) for s in range(4)]
    zetas = [1.0, 2.0, 3.0, 4.0]
    Z = mc.combine_z(mc.sum_contributions([mc.z_contribution(z, w) for z, w in zip(Zs, zetas)]),
                     mc.zeta_total(zetas))
    np.testing.assert_allclose(Z, np.average(np.stack(Zs), axis=0, weights=zetas))
    # and it minimises sum_k zeta_k ||Z_k - Z||^2
    np.testing.assert_allclose(sum(w * (Z - z) for z, w in zip(Zs, zetas)), 0, atol=1e-12)
    with pytest.raises(ValueError, match="zeta_k must be > 0"):
        mc.combine_z(Zs[0], 0.0)


def test_objective_terms_sum_to_eq3():
    rng = np.random.default_rng(10)
    n, c, beta, zeta, eta, eps = 20, 3, 0.5, 4.0, 6.0, 1e-8
    Xs = [rng.standard_normal((n, d)) for d in (5, 8)]
    Ws = [rng.standard_normal((d, c)) for d in (5, 8)]
    Zks = [rng.standard_normal((n, c)) for _ in Xs]
    Z = rng.standard_normal((n, c))
    Y = mc.one_hot(rng.integers(0, c, n), c)
    direct = sum(np.linalg.norm(X @ W - Zk) ** 2 + beta * sum(np.linalg.norm(r) for r in W)
                 + zeta * np.linalg.norm(Zk - Z) ** 2 for X, W, Zk in zip(Xs, Ws, Zks))
    direct += eta * np.linalg.norm(Zks[0] - Y) ** 2
    terms = [mc.objective_terms(Xs[0], Ws[0], Zks[0], Z, beta, zeta, eps, Y, eta),
             mc.objective_terms(Xs[1], Ws[1], Zks[1], Z, beta, zeta, eps)]
    total = mc.sum_contributions(terms)
    assert total.shape == (len(mc.OBJECTIVE_FIELDS),)
    assert total[0] == pytest.approx(direct, rel=1e-12)
    # smoothed <= eq3, within beta * eps * sum ln(1 + ||w||/eps)
    gap = beta * eps * sum(np.log1p(np.linalg.norm(W, axis=1) / eps).sum() for W in Ws)
    assert total[0] - gap - 1e-9 <= total[1] <= total[0]


def test_should_stop():
    assert not mc.should_stop([10.0], 1e-3, 5)
    assert not mc.should_stop([10.0, 9.0], 1e-3, 5)
    assert mc.should_stop([10.0, 9.0, 8.9999], 1e-3, 5)
    assert mc.should_stop([5, 4, 3, 2, 1], 1e-9, 5)


# ---------------------------------------------------------------- the oracle
def test_oracle_objective_never_increases(synthetic):
    data, views, train, _ = synthetic
    st = mc.MMVFLSettings(beta=0.5, max_iter=80, tol=1e-9)
    res = mc.run_centralized(views, data.y, train, st)
    s = np.asarray(res.smoothed)
    assert np.all(np.diff(s) <= 1e-10 * s[:-1])
    # eq. (3) itself may rise by at most the smoothing gap (module docstring)
    o = np.asarray(res.objective)
    gap = st.beta * st.epsilon * sum(np.log1p(np.linalg.norm(W, axis=1) / st.epsilon).sum() for W in res.W)
    assert np.all(np.diff(o) <= 10 * gap + 1e-10 * o[:-1])
    assert o[-1] < 0.1 * o[0]
    assert res.iterations == len(res.objective) <= st.max_iter
    assert np.array_equal(res.rows, train)


def test_oracle_is_deterministic_and_the_step_functions_reproduce_it(synthetic):
    data, views, train, _ = synthetic
    st = mc.MMVFLSettings(beta=0.1, max_iter=30, tol=0.0)
    a = mc.run_centralized(views, data.y, train, st)
    b = mc.run_centralized(views, data.y, train, st)
    for x, y in zip(a.W + a.Z_views + [a.Z], b.W + b.Z_views + [b.Z]):
        assert np.array_equal(x, y)
    # The federated order of events, run by hand, aggregating in another order:
    n_classes = data.n_classes
    states = [mc.init_participant(k, X[train], n_classes, st, labels=data.y[train] if k == 0 else None)
              for k, X in enumerate(views)]
    Z = mc.initial_z(train.size, n_classes)
    trace = []
    while True:
        contribs = []
        for k in range(len(states)):
            states[k], Zk = mc.participant_z_step(states[k], Z, st)
            contribs.append(mc.z_contribution(Zk, states[k].zeta))
        Z = mc.combine_z(mc.sum_contributions(contribs[::-1]), mc.zeta_total([s.zeta for s in states]))
        terms = []
        for k in range(len(states)):
            states[k], t = mc.participant_w_step(states[k], Z, st)
            terms.append(t)
        trace.append(float(mc.sum_contributions(terms[::-1])[1]))
        if mc.should_stop(trace, st.tol, st.max_iter):
            break
    assert len(trace) == a.iterations == 30
    np.testing.assert_allclose(trace, a.smoothed, rtol=1e-10)
    np.testing.assert_allclose(Z, a.Z, rtol=1e-8, atol=1e-10)
    for s, W, Zk in zip(states, a.W, a.Z_views):
        np.testing.assert_allclose(s.W, W, rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(s.Z_k, Zk, rtol=1e-8, atol=1e-10)


def test_oracle_shares_the_labels_and_views_recover_them(synthetic):
    data, views, train, val = synthetic
    st = mc.MMVFLSettings(beta=0.1)
    res = mc.run_centralized(views, data.y, train, st)
    assert res.converged
    y_train = data.y[train]
    for k in range(len(views)):
        pl = mc.pseudo_labels(res.Z_views[k])
        assert np.mean(pl == y_train) == 1.0
        # a classifier trained on participant k's pseudo-labels, on its top features (the 4
        # informative of d_k), works on its validation rows, better than on all features
        d = views[k].shape[1]
        acc = {p: mc.selection_accuracy(views[k][train], pl, views[k][val], data.y[val],
                                        mc.feature_scores(res.W[k]), p, st.knn_k)
               for p in (100 * 4 / d, 100)}
        assert acc[100 * 4 / d] >= 0.8 and acc[100 * 4 / d] >= acc[100], (k, acc)
    # the projections themselves carry the class: argmax X_k W_k on validation rows
    for k in range(len(views)):
        pred = mc.pseudo_labels(views[k][val] @ res.W[k])
        assert np.mean(pred == data.y[val]) >= 0.8


def test_transductive_rows_get_labels_from_the_views(synthetic):
    data, views, train, val = synthetic
    st = mc.MMVFLSettings(beta=0.1, zeta=1.0, eta=10.0, rows="all", max_iter=300, tol=1e-10)
    res = mc.run_centralized(views, data.y, train, st)
    assert res.Z.shape == (data.n_rows, data.n_classes) and np.array_equal(res.rows, np.arange(data.n_rows))
    assert np.mean(mc.pseudo_labels(res.Z[val]) == data.y[val]) >= 0.9
    # unlabelled rows' labels were never read: scrambling them changes nothing
    y2 = data.y.copy()
    y2[val] = (y2[val] + 1) % data.n_classes
    res2 = mc.run_centralized(views, y2, train, st)
    np.testing.assert_array_equal(res.Z, res2.Z)


def test_label_holder_z_approaches_y_as_eta_grows(synthetic):
    data, views, train, _ = synthetic
    Y = mc.one_hot(data.y[train], data.n_classes)
    errs = []
    for eta in (1.0, 100.0, 1e4, 1e6):
        res = mc.run_centralized(views, data.y, train, mc.MMVFLSettings(beta=0.1, eta=eta, max_iter=60))
        errs.append(np.abs(res.Z_views[0] - Y).max())
    assert all(b < a for a, b in zip(errs, errs[1:]))
    assert errs[-1] < 1e-2


def test_feature_selection_finds_the_informative_columns():
    data = dm.make_synthetic(n_per_class=40, n_classes=3, dims=(30, 40), informative=(5, 6),
                             separation=4.0, seed=11)
    train, _ = dm.balanced_split(data.y, 30, 10, seed=1)
    views = _standardized(data, train)
    st = mc.MMVFLSettings(beta=5.0)
    res = mc.run_centralized(views, data.y, train, st)
    sup = [mc.fit_supfl(X[train], data.y[train], 3, st, k) for k, X in enumerate(views)]
    mvl = mc.fit_supmvlfl([X[train] for X in views], data.y[train], 3, st)
    for k, m in enumerate((5, 6)):
        for W in (res.W[k], sup[k].W[0], mvl.W[k]):
            top = set(np.argsort(-mc.feature_scores(W))[:m].tolist())
            assert len(top & set(range(m))) >= m - 1, (k, sorted(top))


def test_supmvlfl_solves_the_joint_problem():
    rng = np.random.default_rng(12)
    Xs = [rng.standard_normal((40, d)) for d in (6, 9)]
    y = rng.integers(0, 3, 40)
    st = mc.MMVFLSettings(beta=1.0, max_iter=2000, w_tol=1e-12)
    fit = mc.fit_supmvlfl(Xs, y, 3, st)
    assert fit.converged and fit.iterations < 2000
    assert [W.shape for W in fit.W] == [(6, 3), (9, 3)]
    # stationary point of ||X1W1 + X2W2 - Y||^2 + beta sum ||W_k||_{2,1} (eq. 10, joint reading)
    X = np.hstack(Xs)
    W = np.vstack(fit.W)
    a = mc.reweighting_diagonal(W, st.epsilon)
    XtY = X.T @ mc.one_hot(y, 3)
    grad = X.T @ (X @ W) - XtY + st.beta * a[:, None] * W
    assert np.abs(grad).max() < 1e-6 * np.abs(XtY).max()
    # it is not K separate supFL fits
    sep = [mc.fit_supfl(Xk, y, 3, st, k).W[0] for k, Xk in enumerate(Xs)]
    assert not np.allclose(sep[0], fit.W[0], atol=1e-3)


def test_selection_and_knn():
    assert mc.n_selected(47, 2) == 1
    assert mc.n_selected(240, 2) == 5
    assert mc.n_selected(64, 100) == 64
    assert mc.n_selected(10, 25) == 3      # 2.5 rounds half up
    with pytest.raises(ValueError, match="percentage"):
        mc.n_selected(10, 0)
    np.testing.assert_array_equal(mc.top_features([0.1, 0.5, 0.5, 0.2], 50), [1, 2])
    np.testing.assert_array_equal(mc.feature_scores([[3.0, 4.0], [0.0, 1.0]]), [5.0, 1.0])
    np.testing.assert_array_equal(mc.pseudo_labels([[0.1, 0.9], [0.7, 0.2]]), [1, 0])

    from sklearn.neighbors import KNeighborsClassifier
    rng = np.random.default_rng(13)
    Xtr, Xq = rng.standard_normal((80, 5)), rng.standard_normal((30, 5))
    ytr = rng.integers(0, 2, 80)
    for k in (1, 3, 5):
        ref = KNeighborsClassifier(n_neighbors=k).fit(Xtr, ytr).predict(Xq)
        np.testing.assert_array_equal(mc.knn_predict(Xtr, ytr, Xq, k), ref)
    # a 2-2 vote goes to the class of the nearest of the tied neighbours
    Xtr = np.array([[0.0], [1.0], [-1.5], [2.0]])
    assert mc.knn_predict(Xtr, [1, 0, 0, 1], np.array([[0.1]]), k=4)[0] == 1


def test_w_step_keeps_x_w_for_the_next_z_step():
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((30, 6)), rng.integers(0, 3, 30)
    st = mc.MMVFLSettings(beta=0.1)
    s = mc.init_participant(0, X, 3, st, labels=y)
    s, _ = mc.participant_z_step(s, np.zeros((30, 3)), st)
    s, _ = mc.participant_w_step(s, np.zeros((30, 3)), st)
    np.testing.assert_array_equal(s.XW, s.system.X @ s.W)


def test_standardizer():
    X = np.c_[np.arange(6.0), np.full(6, 3.0)]
    mean, scale = mc.fit_standardizer(X)
    Xs = mc.standardize(X, mean, scale)
    np.testing.assert_allclose(Xs.mean(axis=0), 0, atol=1e-12)
    np.testing.assert_allclose(Xs[:, 0].std(), 1)
    assert scale[1] == 1.0 and np.all(Xs[:, 1] == 0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="beta must be"):
        mc.MMVFLSettings(beta=0)
    with pytest.raises(ValueError, match="solver must be"):
        mc.MMVFLSettings(solver="qr")
    with pytest.raises(ValueError, match="rows must be"):
        mc.MMVFLSettings(rows="val")
    with pytest.raises(ValueError, match="inner_iters"):
        mc.MMVFLSettings(inner_iters=0)
    X = np.ones((4, 3))
    X[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"argument 'participant 1 X', row 3 \(index 2\), column 2 \(index 1\): "
                                          "value is NaN"):
        mc.init_participant(1, X, 2, mc.MMVFLSettings())
    with pytest.raises(ValueError, match="every view needs 5 rows"):
        mc.run_centralized([np.ones((5, 2)), np.ones((4, 2))], np.zeros(5, int), [0, 1], mc.MMVFLSettings())
    with pytest.raises(ValueError, match="repeated rows"):
        mc.run_centralized([np.ones((5, 2))], np.zeros(5, int), [0, 0], mc.MMVFLSettings())
    with pytest.raises(ValueError, match="labels must lie"):
        mc.one_hot(np.array([0, 3]), 3)
    with pytest.raises(ValueError, match="W-step before any Z-step"):
        st = mc.MMVFLSettings()
        mc.participant_w_step(mc.init_participant(0, np.ones((3, 2)), 2, st), np.zeros((3, 2)), st)


# ---------------------------------------------------------------- real data (skips without it)
def test_handwritten_subset_objective_and_selection(shared_data):
    data = dm.load_handwritten(shared_data)
    train, val = dm.balanced_split(data.y, 20, 10, seed=0)
    views = _standardized(data, train)
    st = mc.MMVFLSettings(beta=0.1, max_iter=60)
    res = mc.run_centralized(views, data.y, train, st)
    s = np.asarray(res.smoothed)
    assert np.all(np.diff(s) <= 1e-10 * s[:-1])
    assert res.solvers == ["woodbury" if d > train.size else "cholesky" for d in data.dims]
    assert res.solvers[0] == "woodbury"             # pixel: 240 features, N = 200 rows
    for k in range(5):
        assert np.mean(mc.pseudo_labels(res.Z_views[k]) == data.y[train]) == 1.0
    # the pixel view with 20 % of its features still classifies well above chance (10 %)
    acc = mc.selection_accuracy(views[0][train], data.y[train], views[0][val], data.y[val],
                                mc.feature_scores(res.W[0]), 20)
    assert acc >= 0.6


def test_relathe_subset_woodbury_equals_cholesky(shared_data):
    data = dm.load_relathe(shared_data)
    train, _ = dm.balanced_split(data.y, 30, 0, seed=0)
    views = _standardized(data, train)
    runs = {}
    for solver in ("cholesky", "woodbury", "auto"):
        st = mc.MMVFLSettings(beta=0.1, max_iter=4, tol=0.0, solver=solver)
        runs[solver] = mc.run_centralized(views, data.y, train, st)
    assert runs["auto"].solvers == ["woodbury"] * 3   # d_k >= 1,400 > N = 60
    for W1, W2 in zip(runs["cholesky"].W, runs["woodbury"].W):
        np.testing.assert_allclose(W1, W2, rtol=1e-5, atol=1e-8 * np.abs(W1).max())
    np.testing.assert_allclose(runs["cholesky"].Z, runs["woodbury"].Z, rtol=1e-7, atol=1e-9)
