"""Matched averaging (HyFEM eq. (8)): recovery of permutations, identity on identical models,
per-coordinate counts for zero-padded views, function preservation."""
from __future__ import annotations

import numpy as np
import pytest

from fedhet.algorithms.hyfem.matching import (MatchSettings, assignment_matrix, forward, match_client,
                                              matched_averaging, matched_mean, matching_cost,
                                              permute_hidden, project, prune_unmatched)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def random_mlp(rng, dims):
    return [(rng.normal(size=(dims[i + 1], dims[i])), rng.normal(size=dims[i + 1]))
            for i in range(len(dims) - 1)]


def assert_layers_equal(a, b, atol=1e-12):
    assert len(a) == len(b)
    for (W1, b1), (W2, b2) in zip(a, b):
        assert W1.shape == W2.shape and b1.shape == b2.shape
        np.testing.assert_allclose(W1, W2, atol=atol)
        np.testing.assert_allclose(b1, b2, atol=atol)


@pytest.mark.parametrize("dims", [[12, 9, 4], [10, 8, 6, 3]])
def test_permutation_preserves_the_function(dims):
    rng = np.random.default_rng(0)
    model = random_mlp(rng, dims)
    perms = [rng.permutation(h) for h in dims[1:-1]]
    permuted = permute_hidden(model, perms)
    x = rng.normal(size=(50, dims[0]))
    np.testing.assert_allclose(forward(permuted, x), forward(model, x), atol=1e-10)
    # and the weights did move (the test would be empty for identity permutations)
    assert not np.allclose(permuted[0][0], model[0][0])


@pytest.mark.parametrize("dims", [[12, 9, 4], [10, 8, 6, 3]])
def test_matching_recovers_a_permutation(dims):
    rng = np.random.default_rng(1)
    model = random_mlp(rng, dims)
    perms = [rng.permutation(h) for h in dims[1:-1]]
    permuted = permute_hidden(model, perms)
    assign, glob, grown = match_client(model, permuted, np.arange(dims[0]),
                                       MatchSettings(threshold=1.0))
    assert grown == 0
    for a, p in zip(assign, perms):
        np.testing.assert_array_equal(a, p)   # local neuron j is global neuron perms[j]
    # w_m = Pi_m theta_0 gives back exactly the permuted model, hence the same function
    back = project(model, assign, np.arange(dims[0]))
    assert_layers_equal(back, permuted)
    x = rng.normal(size=(20, dims[0]))
    np.testing.assert_allclose(forward(back, x), forward(model, x), atol=1e-10)


def test_matching_recovers_a_permutation_on_partial_inputs():
    """A client holding only some input columns is matched on those columns alone."""
    rng = np.random.default_rng(2)
    glob = random_mlp(rng, [15, 10, 5])
    cols = np.array([0, 1, 2, 3, 9, 10, 11])
    perm = rng.permutation(10)
    local = project(glob, [perm], cols)
    # noise on the local copy must not change the match
    local = [(W + 0.01 * rng.normal(size=W.shape), b) for W, b in local]
    assign, _, grown = match_client(glob, local, cols)
    assert grown == 0
    np.testing.assert_array_equal(assign[0], perm)


def test_assignment_matrix_is_pi_m():
    a = np.array([2, 0, 3])
    P = assignment_matrix(a, 5)
    np.testing.assert_array_equal(P.sum(1), 1.0)       # Pi_m 1 = 1
    assert (P >= 0).all()
    G = np.arange(20.0).reshape(5, 4)
    np.testing.assert_array_equal(P @ G, G[a])


@pytest.mark.parametrize("start_empty", [True, False])
def test_matched_averaging_of_identical_models_is_the_identity(start_empty):
    rng = np.random.default_rng(3)
    model = random_mlp(rng, [8, 6, 5, 3])
    cols = [np.arange(8)] * 4
    res = matched_averaging(None if start_empty else model, [model] * 4, cols, n_inputs=8,
                            settings=MatchSettings(passes=6), seed=5)
    assert_layers_equal(res.layers, model)
    for a in res.assignments:
        for l, h in enumerate([6, 5]):
            np.testing.assert_array_equal(a[l], np.arange(h))
    assert res.cost == pytest.approx(0.0, abs=1e-9)
    assert res.pruned == 0


def test_identical_but_permuted_models_average_back_to_one_model():
    """M copies of one model, each with its hidden neurons shuffled: matched averaging undoes the
    shuffles (plain averaging would blur them), so theta_0 computes the model's function."""
    rng = np.random.default_rng(4)
    model = random_mlp(rng, [10, 7, 3])
    clients = [permute_hidden(model, [rng.permutation(7)]) for _ in range(3)]
    res = matched_averaging(clients[0], clients, [np.arange(10)] * 3, seed=0)
    x = rng.normal(size=(30, 10))
    np.testing.assert_allclose(forward(res.layers, x), forward(model, x), atol=1e-9)
    assert res.layers[0][0].shape == (7, 10)


def test_zero_padded_views_are_not_counted():
    """A coordinate held by one client of two equals that client's value, not half of it."""
    rng = np.random.default_rng(5)
    n_in, H, C = 6, 4, 3
    glob = random_mlp(rng, [n_in, H, C])
    cols_a = np.arange(6)          # views 0 and 1 (columns 0-2 and 3-5)
    cols_b = np.arange(3, 6)       # view 1 only
    A = random_mlp(rng, [6, H, C])
    B = random_mlp(rng, [3, H, C])
    ident = [np.arange(H)]
    new = matched_mean(glob, [A, B], [cols_a, cols_b], [ident, ident])
    W = new[0][0]
    np.testing.assert_allclose(W[:, :3], A[0][0][:, :3])                     # only A has these
    np.testing.assert_allclose(W[:, 3:], (A[0][0][:, 3:] + B[0][0]) / 2)      # both have these
    np.testing.assert_allclose(new[0][1], (A[0][1] + B[0][1]) / 2)
    np.testing.assert_allclose(new[1][0], (A[1][0] + B[1][0]) / 2)
    # through the whole block: A and its own restriction to view 1 (B holds view 1 only)
    # average back to A exactly; counting B's padded zeros would halve A's view-0 weights
    a_on_view1 = project(A, ident, cols_b)
    res = matched_averaging(None, [A, a_on_view1], [cols_a, cols_b], n_inputs=6,
                            settings=MatchSettings(passes=4), seed=1)
    assert_layers_equal(res.layers, A)
    for a in res.assignments:
        np.testing.assert_array_equal(a[0], np.arange(H))


def test_uncovered_coordinates_keep_their_value():
    rng = np.random.default_rng(6)
    glob = random_mlp(rng, [6, 4, 2])
    A = random_mlp(rng, [3, 4, 2])
    new = matched_mean(glob, [A], [np.arange(3)], [[np.arange(4)]])
    np.testing.assert_array_equal(new[0][0][:, 3:], glob[0][0][:, 3:])
    np.testing.assert_allclose(new[0][0][:, :3], A[0][0])


def test_weighted_matched_mean():
    rng = np.random.default_rng(7)
    glob = random_mlp(rng, [4, 3, 2])
    A, B = random_mlp(rng, [4, 3, 2]), random_mlp(rng, [4, 3, 2])
    ident = [np.arange(3)]
    new = matched_mean(glob, [A, B], [np.arange(4)] * 2, [ident, ident], weights=[3.0, 1.0])
    np.testing.assert_allclose(new[0][0], 0.75 * A[0][0] + 0.25 * B[0][0])


def test_matched_mean_is_the_argmin_given_the_assignments():
    rng = np.random.default_rng(8)
    glob = random_mlp(rng, [9, 6, 3])
    cols = [np.arange(9), np.arange(3, 9), np.array([0, 1, 2, 6, 7, 8])]
    clients = [random_mlp(rng, [len(c), 5, 3]) for c in cols]
    assigns = [[rng.permutation(6)[:5]] for _ in clients]
    best = matched_mean(glob, clients, cols, assigns)
    c0 = matching_cost(best, clients, cols, assigns)
    for _ in range(5):
        moved = [(W + 1e-3 * rng.normal(size=W.shape), b + 1e-3 * rng.normal(size=b.shape))
                 for W, b in best]
        assert matching_cost(moved, clients, cols, assigns) > c0


def test_a_far_neuron_opens_a_new_global_neuron_and_the_cap_holds():
    rng = np.random.default_rng(9)
    glob = random_mlp(rng, [5, 4, 2])
    local = [(W.copy(), b.copy()) for W, b in glob]
    local[0][0][2] = -5.0 * local[0][0][2]             # neuron 2 now resembles nothing
    # relative threshold 1: "further from every global neuron than from a zero dummy neuron"
    a, grown_glob, n_new = match_client(glob, local, np.arange(5), MatchSettings(threshold=1.0))
    assert n_new == 1 and a[0][2] == 4 and grown_glob[0][0].shape == (5, 5)
    np.testing.assert_array_equal(a[0][[0, 1, 3]], [0, 1, 3])
    np.testing.assert_array_equal(grown_glob[0][0][4], 0.0)   # a dummy neuron starts at zero
    a, g2, n_new = match_client(glob, local, np.arange(5), MatchSettings(max_width=4))
    assert n_new == 0 and g2[0][0].shape == (4, 5) and sorted(a[0]) == [0, 1, 2, 3]
    a, g3, n_new = match_client(glob, local, np.arange(5), MatchSettings(threshold=np.inf))
    assert n_new == 0
    with pytest.raises(ValueError, match="max_width"):
        match_client(glob, random_mlp(rng, [5, 6, 2]), np.arange(5), MatchSettings(max_width=4))


def test_pruning_drops_unmatched_neurons_and_renumbers():
    rng = np.random.default_rng(10)
    glob = random_mlp(rng, [4, 5, 2])
    pruned, assigns, n = prune_unmatched(glob, [[np.array([4, 1])], [np.array([1, 3])]])
    assert n == 2
    np.testing.assert_array_equal(pruned[0][0], glob[0][0][[1, 3, 4]])
    np.testing.assert_array_equal(pruned[1][0], glob[1][0][:, [1, 3, 4]])
    np.testing.assert_array_equal(assigns[0][0], [2, 0])
    np.testing.assert_array_equal(assigns[1][0], [0, 1])


def test_matched_averaging_is_seeded():
    rng = np.random.default_rng(11)
    base = random_mlp(rng, [6, 5, 3])
    clients = [[(W + 0.3 * rng.normal(size=W.shape), b) for W, b in permute_hidden(base, [rng.permutation(5)])]
               for _ in range(4)]
    cols = [np.arange(6)] * 4
    r1 = matched_averaging(base, clients, cols, seed=3)
    r2 = matched_averaging(base, clients, cols, seed=3)
    assert r1.picked == r2.picked
    assert_layers_equal(r1.layers, r2.layers, atol=0)


def test_bad_input_is_named():
    rng = np.random.default_rng(12)
    glob = random_mlp(rng, [4, 3, 2])
    with pytest.raises(ValueError, match="client 0: first layer takes 4 inputs"):
        matched_mean(glob, [glob], [np.arange(3)], [[np.arange(3)]])
    with pytest.raises(ValueError, match="distinct global neurons"):
        matched_mean(glob, [glob], [np.arange(4)], [[np.array([0, 0, 1])]])
    with pytest.raises(ValueError, match="layer 1 takes"):
        matched_mean([glob[0], (np.zeros((2, 5)), np.zeros(2))], [glob], [np.arange(4)],
                     [[np.arange(3)]])
    with pytest.raises(ValueError, match="threshold_mode"):
        MatchSettings(threshold_mode="nope")
