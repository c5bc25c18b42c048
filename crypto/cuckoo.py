"""Cuckoo hashing (PSI receiver) and the bin hash functions both PSI parties share.

Each item is a 128-bit digest.  Its ``N_HASHES = 3`` candidate bins are
``h_j(x) = w_j(AES_seed(x)) mod m``, with w_j the j-th 40-bit little-endian
word of one AES-128 block under the public per-run seed (AES-ECB batched from
``cryptography``); the modulo bias is below m / 2^40.  The receiver places every
item in one of its bins (:func:`build_table`); the sender, doing "simple
hashing", evaluates each of its items at all three bins, which KKRT16's PSI
(§5 of the paper) needs and which here is a gather, not a table.

Table size and failure bound: ``m = ceil(1.27 n)`` bins (at least 128, rounded
up to a multiple of 128 for the OT extension's chunks), three hash functions
and no stash.  Pinkas, Schneider, Tkachenko, Yanai ("Efficient Circuit-based
PSI with Linear Communication", Eurocrypt 2019) and Pinkas, Schneider, Zohner
("Scalable Private Set Intersection Based on OT Extension", ACM TOPS 2018)
estimate from experiments (an extrapolation, not a proof) that stash-less
cuckoo hashing with 3 hash functions and 1.27n bins fails with probability
below 2^-40 for large n; KKRT16's PSI (§5) uses a stash instead.  Small sets
fail more often, and every failure is *detected*: the insertion gives up after
a bounded number of eviction rounds and :func:`build_table` draws a fresh seed
and starts over (up to ``MAX_ATTEMPTS`` times, then it raises
:class:`CuckooFailure`).  A failed table is never used, so a failure can
only cost time, never give a wrong intersection.  The seed finally used is
uniform among seeds that succeed for the receiver's set; what it can tell the
sender about that set is bounded by the failure probability of one attempt.

Insertion is the random-walk eviction of cuckoo hashing run for all pending
items at once in numpy: every pending item claims its current candidate bin;
one claimant per bin wins and the previous occupant, and the losers, move on
to another of their candidates chosen at random.
"""
from __future__ import annotations

import math
import os

import numpy as np

from .ot import aes_ecb

N_HASHES = 3
BIN_FACTOR = 1.27
BIN_ALIGN = 128           # the OT extension works on multiples of 128 bins
MAX_ROUNDS = 4096         # parallel eviction rounds before an attempt is declared failed
MAX_ATTEMPTS = 32         # fresh seeds before giving up
SEED_BYTES = 16
_WORD_BITS = 40


class CuckooFailure(RuntimeError):
    """No cuckoo table was found within the attempt budget (bins too few for the items)."""


def num_bins(n: int, factor: float = BIN_FACTOR) -> int:
    """ceil(factor * n), at least 128, rounded up to a multiple of 128."""
    m = max(BIN_ALIGN, math.ceil(factor * int(n)))
    return -(-m // BIN_ALIGN) * BIN_ALIGN


def bin_hashes(digests: np.ndarray, seed: bytes, n_bins: int) -> np.ndarray:
    """The N_HASHES candidate bins of each 16-byte digest: (n, 3) int64 in [0, n_bins)."""
    if len(seed) != SEED_BYTES:
        raise ValueError(f"cuckoo seed must be {SEED_BYTES} bytes, got {len(seed)}")
    if not 1 <= n_bins < (1 << _WORD_BITS):
        raise ValueError(f"n_bins must be in 1..2^{_WORD_BITS}, got {n_bins}")
    d = np.ascontiguousarray(digests, dtype=np.uint8).reshape(-1, 16)
    e = aes_ecb(seed, d).reshape(-1, 16).view("<u8")  # (n, 2) little-endian words
    lo, hi = e[:, 0], e[:, 1]
    mask = np.uint64((1 << _WORD_BITS) - 1)
    words = [lo & mask, (lo >> np.uint64(_WORD_BITS)) | ((hi & np.uint64(0xFFFF)) << np.uint64(24)),
             (hi >> np.uint64(16)) & mask]
    return np.stack([(w % np.uint64(n_bins)).astype(np.int64) for w in words], axis=1)


def insert(hashes: np.ndarray, n_bins: int, rng: np.random.Generator,
           max_rounds: int = MAX_ROUNDS) -> tuple[np.ndarray, np.ndarray] | None:
    """Place every item in one of its candidate bins; None if some item is still homeless after ``max_rounds``.

    Returns (table, which): table[b] is the item in bin b or -1, which[b] the
    index j of the hash function that put it there (-1 for empty bins).
    """
    hashes = np.asarray(hashes, dtype=np.int64)
    n = len(hashes)
    table = np.full(n_bins, -1, dtype=np.int64)
    choice = np.zeros(n, dtype=np.int64)
    pending = np.arange(n, dtype=np.int64)
    for _ in range(max_rounds):
        if len(pending) == 0:
            break
        bins = hashes[pending, choice[pending]]
        old = table[bins]
        table[bins] = pending          # with repeated bins numpy keeps one of them; we read back which
        won = table[bins] == pending
        evicted = old[won]
        evicted = evicted[evicted >= 0]
        losers = pending[~won]
        pending = np.concatenate([evicted, losers])
        if len(pending):
            # move on to one of the two other candidates, at random (breaks eviction cycles)
            choice[pending] = (choice[pending] + rng.integers(1, N_HASHES, len(pending))) % N_HASHES
    else:
        if len(pending):
            return None
    which = np.full(n_bins, -1, dtype=np.int64)
    full = table >= 0
    which[full] = choice[table[full]]
    return table, which


def build_table(digests: np.ndarray, n_bins: int | None = None, *, max_attempts: int = MAX_ATTEMPTS,
                max_rounds: int = MAX_ROUNDS, seeds=None):
    """Cuckoo-hash the digests with fresh seeds until one works.

    Returns (seed, n_bins, table, which, attempts).  ``seeds``: an iterable of
    seeds to try first (tests); afterwards seeds come from the OS CSPRNG.
    Raises :class:`CuckooFailure` after ``max_attempts`` failed seeds.
    """
    d = np.ascontiguousarray(digests, dtype=np.uint8).reshape(-1, 16)
    m = num_bins(len(d)) if n_bins is None else int(n_bins)
    given = iter(seeds or ())
    for attempt in range(1, max_attempts + 1):
        seed = next(given, None) or os.urandom(SEED_BYTES)
        h = bin_hashes(d, seed, m)
        rng = np.random.default_rng(np.frombuffer(seed, dtype=np.uint32))  # placement randomness; stays local
        placed = insert(h, m, rng, max_rounds)
        if placed is not None:
            return seed, m, placed[0], placed[1], attempt
    raise CuckooFailure(f"cuckoo hashing of {len(d)} items into {m} bins with {N_HASHES} hash functions failed "
                        f"for {max_attempts} fresh seeds")
