"""Seeded feature and sample partitions shared by the algorithms.

CHFL's setting (Mori et al., Sec. III-C and V-A3): the features are split at
random into a *common* set held by every client (``common_ratio`` of them,
30% by default) and the rest, which is divided among the K clients as their
*unique* features; the samples are split 60/20/20 into train/val/test and
each part is spread evenly over the clients, so sample sets are disjoint
(eq. 5) and every client shares the common features (eq. 4).

:func:`vertical_split` is the plain vertical counterpart (one feature group
per party) for the VFL algorithms.  Everything is a pure function of its
seed; index arrays are sorted int64.
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
