"""fedhet's seeds: the one derivation for new code, the frozen ones models were trained with, and the
named tags of the seeded numpy streams (``algorithms.toolkit`` re-exports all of them).

numpy and the standard library only, so that a job that needs no torch (the PSI, Shamir and secure
aggregation jobs) draws its streams here without importing it.
"""
from __future__ import annotations

import zlib
from enum import IntEnum

import numpy as np

def derive_seed(seed: int, *tags: int | str) -> int:
    """A 63-bit seed for one model or stream from the run seed and tags (client index, "unique"...).

    numpy's ``SeedSequence`` over the words ``[seed, *tags]`` (a string tag contributes its UTF-8
    bytes, an int itself), so distinct tag tuples give independent streams.  CHFL's seeds.
    """
    words = [int(seed)]
    for t in tags:
        words.extend(t.encode() if isinstance(t, str) else [int(t)])
    state = np.random.SeedSequence(words).generate_state(2, dtype=np.uint32)
    return int.from_bytes(state.tobytes(), "little") & ((1 << 63) - 1)


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


def frozen_seed(seed: int, *tags: int | str) -> int:
    """The 31-bit seed STFL and HyFEM were trained with: CRC-32 of ``repr((seed, *tags))``.

    Kept so that their models stay the same for the same seed; new algorithms use
    :func:`derive_seed`.
    """
    return crc32_seed(repr((int(seed), *tags)), 31)


def crc32_seed(key: str, bits: int = 32) -> int:
    """CRC-32 of the text ``key``, keeping its low ``bits`` bits (31 or 32).

    The derivation STFL (key ``repr((seed, *tags))``, 31 bits) and the HE split network (key
    ``f"{seed}/he_split/{what}"``, 32 bits) were trained with; it stays so that their models are
    the same for the same seed.  New algorithms use :func:`derive_seed`.
    """
    if bits not in (31, 32):
        raise ValueError(f"crc32_seed keeps 31 or 32 bits, got {bits}")
    return zlib.crc32(key.encode()) & ((1 << bits) - 1)
