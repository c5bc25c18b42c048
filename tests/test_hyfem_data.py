"""HyFEM's data (algorithms/hyfem/data.py): COIL-20 pose views and a leak-free evaluation split.

A COIL-20 sample is one object seen from V poses 72/V apart, one sample per starting pose, so
samples share images.  These tests check, against the raw images, that no image used by any
client's training rows is among the evaluation rows (the rows every party scores on).
"""
from __future__ import annotations

import numpy as np
import pytest
from fedhet.algorithms import hyfem
from fedhet.algorithms.data_multiview import load_coil20
from fedhet.parties.contract import PartyContext
from fedhet.parties.settings import parse_settings

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def coil(n_views, **over):
    cfg = {"dataset": "coil20", "scenario": "custom", "n_views": n_views,
           "views_per_client": n_views // 2, "classes_per_client": 15 / 40, "unused_fraction": 0.12}
    return parse_settings(hyfem.Settings, {**cfg, **over})


def image_ids(views_of_rows: dict, id_of: dict) -> set:
    """The (object, pose) index of every image in ``views_of_rows`` (view -> rows x 1024)."""
    return {id_of[r.tobytes()] for x in views_of_rows.values() for r in np.asarray(x)}


@pytest.fixture(scope="module")
def pixels_to_image(shared_data):
    pi = load_coil20(shared_data)
    ids = {r.tobytes(): i for i, r in enumerate(pi.images)}
    assert len(ids) == len(pi.images) == 1440   # every image distinct: content identifies it
    return ids


def test_coil_views_are_the_poses_72_over_v_apart(shared_data):
    pi = load_coil20(shared_data)
    for V in (4, 12):
        views, y = hyfem.load_views(coil(V), shared_data)
        assert len(views) == V and all(v.shape == (1440, 1024) for v in views)
        for row in (0, 17, 100, 1439):
            obj, p = divmod(row, 72)
            assert y[row] == obj
            for k in range(V):
                j = np.flatnonzero((pi.object == obj) & (pi.pose == (p + k * 72 // V) % 72))
                np.testing.assert_array_equal(views[k][row], pi.images[j[0]])


def test_image_sets_are_exactly_the_samples_that_share_images():
    for V in (4, 12):
        img = hyfem.coil_sample_images(V)
        sets = hyfem.coil_image_sets(V)
        assert len(np.unique(sets)) == 20 * 72 // V
        for a in range(0, 1440, 7):
            share = np.array([bool(set(img[a]) & set(img[b])) for b in range(1440)])
            np.testing.assert_array_equal(share, sets == sets[a])


@pytest.mark.parametrize("n_views,seed", [(4, 0), (4, 1), (12, 0), (12, 2)])
def test_no_image_is_in_a_clients_training_rows_and_the_evaluation_rows(n_views, seed, pixels_to_image):
    s = coil(n_views, seed=seed)
    M = 8
    srv = hyfem.load_data(s, PartyContext("server", "server", 0, 1))
    evaluation = image_ids(srv["x_test"], pixels_to_image)
    assert len(srv["y_test"]) == 288 and set(srv["y_test"].tolist()) == set(range(20))
    trained = set()
    for m in range(M):
        d = hyfem.load_data(s, PartyContext(f"client{m + 1}", "client", m, M))
        mine = image_ids(d["x_train"], pixels_to_image)
        assert mine and not mine & evaluation, f"client {m} trains on evaluation images"
        trained |= mine
        assert image_ids(d["x_test"], pixels_to_image) <= evaluation
    # a row split (the old one) would share images; the group split leaves both sides large
    assert len(trained) > 800 and len(evaluation) >= 288


def test_max_rows_keeps_whole_image_sets():
    s = coil(4, max_rows=200)
    sets = hyfem.coil_image_sets(4)
    y = np.repeat(np.arange(20), 72)
    train, test = hyfem.split_rows(s, 1440, sets, y)
    assert len(train) + len(test) == 200 and not set(sets[train]) & set(sets[test])
    for g in set(sets[train]) | set(sets[test]):
        assert np.sum(np.isin(np.r_[train, test], np.flatnonzero(sets == g))) == 4
    # stratified: the evaluation sets spread over the objects (50 sets kept, 10 for evaluation)
    assert len(set(y[test])) == 10


def test_split_rows_rejects_misshaped_groups():
    with pytest.raises(ValueError, match="group ids"):
        hyfem.split_rows(coil(4), 1440, np.zeros(10))


def test_load_data_reads_the_federations_data_dir(shared_data, tmp_path, monkeypatch):
    # a party told where the data sets are (--data-dir / [federation] data_dir) must look there, not at
    # the default places: point the environment at an empty folder and the party at a copy
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mfeat_handwritten").symlink_to(shared_data / "mfeat_handwritten")
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("FEDHET_DATA_DIR", str(tmp_path / "empty"))
    s = parse_settings(hyfem.Settings, {"dataset": "handwritten"})
    with pytest.raises(FileNotFoundError):
        hyfem.load_data(s, PartyContext("server", "server", 0, 1))
    out = hyfem.load_data(s, PartyContext("server", "server", 0, 1, data_dir=str(tmp_path / "mine")))
    assert out["y_test"].size > 0 and len(out["x_test"]) == 4
