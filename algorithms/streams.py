"""The named numpy streams: ``stream_rng(seed, Stream.X, ...)``, each tag named once in :class:`Stream`.

numpy and the standard library only, so a job that needs no torch (the PSI and Shamir jobs) draws
its streams here without importing it; ``algorithms.toolkit`` re-exports both names beside the seed
derivations (``derive_seed``, ``frozen_seed``, ``crc32_seed``).
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np


class Stream(IntEnum):
    """The named numeric tags of fedhet's seeded numpy streams: ``stream_rng(seed, Stream.X, ...)``.

    The values are frozen (each is what its algorithm was trained with; changing one changes that
    algorithm's results).  A new stream takes a new name here, never a bare number at its call.
    """

    CHFL_ROW_ORDER = 7          # CHFL: a client's order of its own rows before the split
    MATCHING_TIES = 8           # HyFEM's matched averaging: random tie-breaking of the assignment
    HYFEM_ROWS = 7013           # HyFEM: which rows a run keeps (max_rows)
    MMVFL_SPLIT = 7919          # MMVFL: the train/validation permutation
    FATE_SPLIT = 0x57F1         # FATE tabular sets: the train/test split
    FATE_ORDER = 0x5EED         # FATE tabular sets: the row order
    F3_OWNER_STRIDE = 100_003   # F3: owner i's local model seed is seed * stride + i
    SHAMIR_OWNER_MATRIX = 1     # the Shamir job: owner i's private X_i (with i)
    SHAMIR_PUBLIC_MATRIX = 2    # the Shamir job: owner i's public P_i (with i)


def stream_rng(seed: int, *tags: int) -> np.random.Generator:
    """numpy's generator for the stream ``(seed, *tags)`` (tags: :class:`Stream` members, indices).

    The same generator as ``np.random.default_rng([seed, *tags])``.
    """
    return np.random.default_rng(np.random.SeedSequence([int(seed), *(int(t) for t in tags)]))
