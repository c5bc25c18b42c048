"""Seeded feature and sample partitions shared by the algorithms.

CHFL's setting (Mori et al., Sec. III-C and V-A3): the features are split at
random into a *common* set held by every client (``common_ratio`` of them,
30% by default) and the rest, which is divided among the K clients as their
*unique* features; the samples are split 60/20/20 into train/val/test and
each part is spread evenly over the clients, so sample sets are disjoint
(Eq. (5)) and every client shares the common features (Eq. (4)).

:func:`vertical_split` is the plain vertical counterpart (one feature group
per party) for the VFL algorithms.

:func:`hybrid_partition` is HyFEM's hybrid setting (Zhang et al., Sec. 3.1):
every client holds some views (feature groups), some classes, and a disjoint
set of training rows of those classes; optionally a fraction of the rows is
used by no client (Fig. 4: 12.08%).

Everything is a pure function of its seed; index arrays are sorted int64.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# Separate streams so that changing the feature split leaves the sample
# split alone and vice versa (the paper repeats runs per feature split).
_FEATURE_STREAM = 1
_SAMPLE_STREAM = 2
_VERTICAL_STREAM = 3
_HYBRID_STREAM = 4


def _rng(seed: int, stream: int) -> np.random.Generator:
    if int(seed) < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), stream]))


def _check_count(name: str, v) -> int:
    if isinstance(v, bool) or int(v) != v or int(v) < 1:
        raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return int(v)


def split_features(n_features: int, n_clients: int, common_ratio: float = 0.3,
                   seed: int = 0) -> tuple[np.ndarray, list[np.ndarray]]:
    """Random common features (``round(common_ratio * n_features)``) and the
    rest divided as evenly as possible among ``n_clients`` as unique sets."""
    d = _check_count("n_features", n_features)
    k = _check_count("n_clients", n_clients)
    if not 0.0 < float(common_ratio) < 1.0:
        raise ValueError(f"common_ratio must be in (0, 1), got {common_ratio}")
    n_common = int(round(float(common_ratio) * d))
    if n_common < 1:
        raise ValueError(f"common_ratio {common_ratio} of {d} features leaves no common feature")
    n_unique = d - n_common
    if n_unique < k:
        raise ValueError(
            f"{n_unique} unique features (of {d}, common_ratio {common_ratio}) cannot give "
            f"each of {k} clients at least one; use fewer clients or a smaller common_ratio")
    perm = _rng(seed, _FEATURE_STREAM).permutation(d)
    common = np.sort(perm[:n_common]).astype(np.int64)
    unique = [np.sort(p).astype(np.int64) for p in np.array_split(perm[n_common:], k)]
    return common, unique


def split_samples(n_samples: int, n_clients: int, seed: int = 0,
                  fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> list[list[np.ndarray]]:
    """Shuffle, cut into parts by ``fractions`` (train/val/test), and spread
    each part evenly over the clients.  Returns ``parts[p][client]``."""
    n = _check_count("n_samples", n_samples)
    k = _check_count("n_clients", n_clients)
    fr = np.asarray(fractions, dtype=float)
    if fr.ndim != 1 or fr.size < 1 or (fr <= 0).any() or abs(fr.sum() - 1.0) > 1e-9:
        raise ValueError(f"fractions must be positive and sum to 1, got {list(fractions)}")
    sizes = np.floor(fr * n).astype(int)
    sizes[0] += n - sizes.sum()  # rounding remainder goes to the first (train) part
    if (sizes < k).any():
        raise ValueError(
            f"{n} samples split {list(fractions)} gives parts of {sizes.tolist()} rows; "
            f"each must have at least one row per client ({k} clients)")
    perm = _rng(seed, _SAMPLE_STREAM).permutation(n)
    out, start = [], 0
    for s in sizes:
        part = perm[start:start + s]
        start += s
        out.append([np.sort(c).astype(np.int64) for c in np.array_split(part, k)])
    return out


@dataclass(frozen=True)
class HorizontalSplit:
    """Who holds which features and rows (CHFL, Fig. 2)."""

    common: np.ndarray                 # feature ids every client holds
    unique: list[np.ndarray]           # unique[k]: client k's own feature ids
    train: list[np.ndarray]            # train[k]: client k's training rows
    val: list[np.ndarray]
    test: list[np.ndarray]
    n_features: int
    n_samples: int
    meta: dict = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.unique)

    def features(self, k: int) -> np.ndarray:
        """All of client k's features: common first, then unique."""
        return np.concatenate([self.common, self.unique[k]])

    def rows(self, k: int, part: str) -> np.ndarray:
        if part not in ("train", "val", "test"):
            raise ValueError(f"part must be train, val or test, got {part!r}")
        return getattr(self, part)[k]


def chfl_partition(n_samples: int, n_features: int, n_clients: int,
                   common_ratio: float = 0.3, seed: int = 0,
                   feature_seed: int | None = None,
                   fractions: Sequence[float] = (0.6, 0.2, 0.2)) -> HorizontalSplit:
    """The CHFL partition; ``feature_seed`` (default ``seed``) fixes the
    feature split, ``seed`` the sample split."""
    fseed = seed if feature_seed is None else feature_seed
    common, unique = split_features(n_features, n_clients, common_ratio, fseed)
    train, val, test = split_samples(n_samples, n_clients, seed, fractions)
    return HorizontalSplit(common, unique, train, val, test, int(n_features), int(n_samples),
                           {"common_ratio": float(common_ratio), "seed": int(seed),
                            "feature_seed": int(fseed), "fractions": [float(f) for f in fractions]})


def vertical_split(n_features: int, n_parties: int, seed: int | None = None,
                   sizes: Sequence[int] | None = None) -> list[np.ndarray]:
    """Disjoint feature groups, one per party, covering every feature once.

    ``sizes`` fixes each group's width (must sum to ``n_features``); default
    as even as possible.  ``seed=None`` keeps features in column order
    (contiguous blocks); a seed shuffles them first.
    """
    d = _check_count("n_features", n_features)
    p = _check_count("n_parties", n_parties)
    if sizes is None:
        if p > d:
            raise ValueError(f"{p} parties need at least {p} features, got {d}")
        sizes = [len(a) for a in np.array_split(np.arange(d), p)]
    sizes = [int(s) for s in sizes]
    if len(sizes) != p:
        raise ValueError(f"sizes has {len(sizes)} entries for {p} parties")
    if any(s < 1 for s in sizes) or sum(sizes) != d:
        raise ValueError(f"sizes {sizes} must be positive and sum to n_features={d}")
    order = np.arange(d) if seed is None else _rng(seed, _VERTICAL_STREAM).permutation(d)
    bounds = np.cumsum([0] + sizes)
    return [np.sort(order[bounds[i]:bounds[i + 1]]).astype(np.int64) for i in range(p)]


@dataclass(frozen=True)
class HybridSplit:
    """Who holds which views, classes and rows (HyFEM's hybrid setting)."""

    views: list[np.ndarray]      # views[m]: the view ids client m holds (D_m), sorted
    classes: list[np.ndarray]    # classes[m]: the class labels client m has rows of, sorted
    rows: list[np.ndarray]       # rows[m]: client m's rows (indices into the labels given)
    unused: np.ndarray           # rows no client holds
    n_views: int
    n_samples: int
    meta: dict = field(default_factory=dict)

    @property
    def n_clients(self) -> int:
        return len(self.views)

    def holders_of_view(self, d: int) -> list[int]:
        """The clients that hold view d (who joins view d's aggregation, Eq. (7))."""
        return [m for m, v in enumerate(self.views) if int(d) in v]

    def view_class_counts(self, labels) -> np.ndarray:
        """(n_views, n_classes) number of clients with rows of class c and view d (the paper's
        Fig. 2); classes in sorted label order."""
        y = np.asarray(labels)
        cls = np.unique(y)
        out = np.zeros((self.n_views, len(cls)), dtype=np.int64)
        for v, r in zip(self.views, self.rows):
            present = np.isin(cls, y[r])
            out[np.ix_(v, np.flatnonzero(present))] += 1
        return out


def _cyclic_subsets(order: np.ndarray, n_clients: int, per_client: int) -> list[np.ndarray]:
    """Client m takes ``per_client`` consecutive items of ``order`` (cyclically) from position
    floor(m * len / n_clients): every client the same number, starts spread evenly."""
    n = len(order)
    return [np.sort(order[(m * n // n_clients + np.arange(per_client)) % n]).astype(np.int64)
            for m in range(n_clients)]


def hybrid_partition(labels, n_clients: int, n_views: int, views_per_client: int,
                     classes_per_client: int | float, unused_fraction: float = 0.0,
                     seed: int = 0) -> HybridSplit:
    """Samples x views x classes per client (HyFEM, Sec. 3.1).

    Views and classes are shuffled (seeded) and dealt cyclically: client m holds
    ``views_per_client`` consecutive views of the shuffled order starting at floor(m D / M);
    ``classes_per_client`` classes (an int, or a float in (0, 1] for that fraction of the
    classes, rounded to the nearest count) are dealt the same way to the clients taken in a
    random order.  Every view and every class must be held
    by at least one client.  From each class, ``unused_fraction`` of its rows (rounded) go to
    no client; the rest are shuffled and split evenly among the clients holding that class,
    so row sets are disjoint.  ``labels`` are the training labels (any values).
    """
    y = np.asarray(labels)
    if y.ndim != 1 or y.size < 1:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {y.shape}")
    M = _check_count("n_clients", n_clients)
    D = _check_count("n_views", n_views)
    v = _check_count("views_per_client", views_per_client)
    if v > D:
        raise ValueError(f"views_per_client={v} exceeds n_views={D}")
    cls = np.unique(y)
    C = len(cls)
    if isinstance(classes_per_client, (bool, np.bool_)):
        raise ValueError(f"classes_per_client must be a count or a fraction, got {classes_per_client!r}")
    if isinstance(classes_per_client, (int, np.integer)):
        c = int(classes_per_client)
    else:
        frac = float(classes_per_client)
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"classes_per_client as a fraction must be in (0, 1], got {frac}")
        c = max(1, int(round(frac * C)))
    if not 1 <= c <= C:
        raise ValueError(f"classes_per_client={classes_per_client!r} gives {c} classes; the labels "
                         f"have {C}")
    if not 0.0 <= float(unused_fraction) < 1.0:
        raise ValueError(f"unused_fraction must be in [0, 1), got {unused_fraction}")
    rng = _rng(seed, _HYBRID_STREAM)
    views = _cyclic_subsets(rng.permutation(D), M, v)
    # classes are dealt to the clients in a random order of their own, so that which views a
    # client has and which classes it has are not tied together
    class_blocks = _cyclic_subsets(rng.permutation(C), M, c)
    class_pos = [class_blocks[i] for i in np.argsort(rng.permutation(M))]
    classes = [np.sort(cls[p]) for p in class_pos]
    for name, subsets, total in (("view", views, D), ("class", class_pos, C)):
        held = np.zeros(total, dtype=bool)
        for s_ in subsets:
            held[s_] = True
        if not held.all():
            missing = np.flatnonzero(~held)
            what = missing if name == "view" else cls[missing]
            raise ValueError(f"{M} clients x {v if name == 'view' else c} {name}s each leave "
                             f"{name}(s) {what.tolist()} with no client; give each client more")
    rows: list[list[np.ndarray]] = [[] for _ in range(M)]
    unused: list[np.ndarray] = []
    for k, label in enumerate(cls):
        idx = rng.permutation(np.flatnonzero(y == label))
        n_drop = int(round(float(unused_fraction) * len(idx)))
        unused.append(idx[:n_drop])
        holders = [m for m in range(M) if k in class_pos[m]]
        for m, part in zip(holders, np.array_split(idx[n_drop:], len(holders))):
            rows[m].append(part)
    out_rows = [np.sort(np.concatenate(r)).astype(np.int64) if r else np.zeros(0, np.int64)
                for r in rows]
    return HybridSplit(views, classes, out_rows, np.sort(np.concatenate(unused)).astype(np.int64),
                       D, int(y.size),
                       {"views_per_client": v, "classes_per_client": c,
                        "unused_fraction": float(unused_fraction), "seed": int(seed)})
