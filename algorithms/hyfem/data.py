"""HyFEM's data: the views of a multi-view data set, the seeded training / evaluation split and each
client's part of the hybrid partition.

Handwritten (UCI mfeat, all six views; ModelNet40 is not available offline, Handwritten is the
stand-in), scikit-learn's digits (4 quadrant views, packaged) or COIL-20 (a sample = one object
seen from ``n_views`` poses at fixed angular offsets 72/V apart, each pose a view).  The rows are
shuffled with the seed and split into training and evaluation rows (``test_fraction``; COIL-20's
samples overlap -- the V samples of an image set are the same images rotated -- so whole image
sets go to one side, stratified by object: :func:`split_rows`, :func:`coil_image_sets`); every
client computes the same seeded :func:`partition.hybrid_partition` of the training labels and
keeps only its own rows and views.  **Evaluation convenience (declared):** every party loads the
held-out evaluation rows (all views, with labels) -- clients to score their local model with only
their views, the server to score theta_0 with every view.  They are a public benchmark split,
never trained on.  Features are standardised per view with the evaluation rows' column means and
deviations (the same public statistics at every party; :func:`view_scalers`, kept with each
party's data for the part it exports).
"""
from __future__ import annotations

import numpy as np

from fedhet.algorithms.hyfem.settings import COIL_OBJECTS, COIL_POSES, VIEW_DIMS, Settings, classes_arg
from fedhet.algorithms.partition import hybrid_partition
from fedhet.algorithms.toolkit import Stream, stream_rng
from fedhet.parties.contract import PartyContext

# ------------------------------------------------------------------------------- data

def load_views(s: Settings, data_dir=None) -> tuple[list[np.ndarray], np.ndarray]:
    """All rows of the data set: the used views (float32, rows aligned) and the labels."""
    D = s.partition()[0]
    if s.dataset in VIEW_DIMS:
        from fedhet.algorithms.data_multiview import load_multiview
        mv = load_multiview(s.dataset, data_dir, **({"drop_small": False} if s.dataset == "handwritten" else {}))
        return [np.asarray(v, dtype=np.float32) for v in mv.views[:D]], np.asarray(mv.y, dtype=np.int64)
    from fedhet.algorithms.data_multiview import load_coil20
    pi = load_coil20(data_dir)
    idx = coil_sample_images(D)
    views = [pi.images[idx[:, k]] for k in range(D)]
    y = np.repeat(np.arange(COIL_OBJECTS, dtype=np.int64), COIL_POSES)
    return views, y


def coil_sample_images(n_views: int) -> np.ndarray:
    """(1440, V) image indices (object x 72 + pose, COIL20.mat's row) of every COIL-20 sample's
    views: sample object x 72 + p sees poses p, p + 72/V, ..., p + (V-1) 72/V (mod 72)."""
    step = COIL_POSES // n_views
    poses = (np.arange(COIL_POSES)[:, None] + step * np.arange(n_views)[None, :]) % COIL_POSES
    return (np.arange(COIL_OBJECTS)[:, None, None] * COIL_POSES + poses[None]).reshape(-1, n_views)


def coil_image_sets(n_views: int) -> np.ndarray:
    """Per COIL-20 sample, the id of its image set: object x 72/V + (p mod 72/V).  The V samples
    of a set (starting poses p, p + 72/V, ...) are the same V images in rotated view order; samples
    of different sets share no image."""
    step = COIL_POSES // n_views
    p = np.arange(COIL_POSES)
    return (np.arange(COIL_OBJECTS)[:, None] * step + (p % step)[None, :]).reshape(-1)


def row_groups(s: Settings) -> np.ndarray | None:
    """Rows that must stay on one side of the training / evaluation split (None: each row alone):
    COIL-20's image sets (:func:`coil_image_sets`)."""
    return coil_image_sets(s.partition()[0]) if s.dataset == "coil20" else None


def split_rows(s: Settings, n: int, groups: np.ndarray | None = None,
               labels: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(training rows, evaluation rows), seeded; ``max_rows`` keeps a shuffled subset.

    With ``groups`` (one id per row) whole groups go to one side, and ``max_rows`` keeps whole
    groups (the first ones reaching it).  COIL-20 needs this: its samples overlap (the V samples of
    an image set are the same V images rotated), so a row split would put evaluation images into
    training.  All samples of a set are kept rather than one per set: one per set leaves 72/V
    samples per object (120 in all at V = 12, 24 of them for evaluation), and the rotations are
    honest training data (which pose is "view 0" is arbitrary).  With ``labels`` the split is
    stratified: each label's groups are shuffled and the groups are taken round-robin over the
    labels (in a random order), so the evaluation groups spread over the labels as evenly as their
    count allows.  A group's label is its first row's."""
    rng = stream_rng(s.seed, Stream.HYFEM_ROWS)
    if groups is None:
        order = rng.permutation(n)
        if s.max_rows is not None:
            order = order[:s.max_rows]
        n_test = int(round(len(order) * s.test_fraction))
        return np.sort(order[n_test:]), np.sort(order[:n_test])
    groups = np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"split_rows: {groups.shape} group ids for {n} rows")
    ids, first, inverse = np.unique(groups, return_index=True, return_inverse=True)
    G = len(ids)
    stratum = np.zeros(G, dtype=np.int64) if labels is None else np.asarray(labels)[first]
    if labels is not None and np.shape(labels) != (n,):
        raise ValueError(f"split_rows: {np.shape(labels)} labels for {n} rows")
    shuffled = rng.permutation(G)
    rank = np.empty(G, dtype=np.int64)
    for c in np.unique(stratum):   # position of each group in its label's shuffled order
        mine = shuffled[stratum[shuffled] == c]
        rank[mine] = np.arange(len(mine))
    gorder = np.lexsort((rng.permutation(G), rank))   # by rank; labels in random order within it
    if s.max_rows is not None:
        size = np.bincount(inverse, minlength=G)[gorder]
        gorder = gorder[:int(np.searchsorted(np.cumsum(size), s.max_rows)) + 1]
    n_test = int(round(len(gorder) * s.test_fraction))
    side = np.full(G, -1)      # -1 unused, 0 training, 1 evaluation
    side[gorder] = 0
    side[gorder[:n_test]] = 1
    rows = np.arange(n)
    return rows[side[inverse] == 0], rows[side[inverse] == 1]


def make_partition(s: Settings, y_train: np.ndarray, n_clients: int):
    D, v, c, u = s.partition()
    return hybrid_partition(y_train, n_clients, D, v, classes_arg(c), u, seed=s.seed)


def view_scalers(s: Settings, views: list[np.ndarray], test: np.ndarray) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """Each view's public standardisation, (column means, deviations + 1e-6) of the evaluation
    rows (float32); None for image views (COIL-20), which are used as they are."""
    if s.dataset not in VIEW_DIMS:
        return [None] * len(views)
    return [(v[test].mean(0), v[test].std(0) + 1e-6) for v in views]


def scale_views(views: list[np.ndarray], scalers: list[tuple[np.ndarray, np.ndarray] | None]) -> list[np.ndarray]:
    """``(v - mean) / std`` per view (float32), a view without a scaler as it is."""
    return [v if sc is None else ((v - sc[0]) / sc[1]).astype(np.float32) for v, sc in zip(views, scalers)]


def raw_views(s: Settings, data_dir=None):
    """(views unscaled, labels, training rows, evaluation rows, each view's scaler)."""
    views, y = load_views(s, data_dir)
    groups = row_groups(s)
    train, test = split_rows(s, len(y), groups, None if groups is None else y)
    return views, y, train, test, view_scalers(s, views, test)


def prepared_views(s: Settings, data_dir=None):
    """(views scaled as every party scales them, labels, training rows, evaluation rows)."""
    views, y, train, test, scalers = raw_views(s, data_dir)
    return scale_views(views, scalers), y, train, test


def load_data(s: Settings, ctx: PartyContext):
    """A party's part: the evaluation rows (every view) and, a client, its own training rows of its
    views; ``x_test_raw`` and ``scalers`` (per view) are what its exported part applies to raw rows."""
    views, y, train, test, scalers = raw_views(s, ctx.data_dir)
    scale = scale_views(views, scalers)
    x_test = {d: scale[d][test] for d in range(len(scale))}
    out = {"x_test": x_test, "y_test": y[test], "x_test_raw": {d: views[d][test] for d in range(len(views))},
           "scalers": dict(enumerate(scalers))}
    if ctx.role == "server":
        return out
    split = make_partition(s, y[train], ctx.n_of_role)
    m = ctx.index
    rows = train[split.rows[m]]   # every other client's rows are dropped here
    mine = [int(d) for d in split.views[m]]
    out.update(index=m, views=mine, all_views=[[int(d) for d in v] for v in split.views],
               x_train={d: scale[d][rows] for d in mine}, y_train=y[rows],
               x_test={d: x_test[d] for d in mine}, x_test_raw={d: out["x_test_raw"][d] for d in mine},
               scalers={d: scalers[d] for d in mine})
    return out
