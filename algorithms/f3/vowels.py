"""Japanese Vowels (UCI, real; aeon .ts files in ../shared/data/japanese_vowels) as F³ owners' series.

Each utterance has 12 LPC channels of one common length T (7..29) and a speaker label 1..9.
Owner c (c = 0..11) holds channel c of every utterance.  Series are right-padded with 0 to
``max_len`` (29 by default); ``mask[k, s]`` is True for the real steps, ``lengths[k]`` = T_k.
Labels are returned 0-based (speaker - 1).  The files' own TRAIN (270) / TEST (370) split is kept.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedhet.algorithms.datapath import data_root

__all__ = ["VowelsSplit", "parse_ts", "load_vowels", "N_OWNERS", "N_CLASSES", "MAX_LEN"]

N_OWNERS = 12
N_CLASSES = 9
MAX_LEN = 29


@dataclass
class VowelsSplit:
    """series (n, 12, max_len) float64 zero-padded, mask (n, max_len) bool, lengths (n,), labels (n,)."""
    series: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray

    def owner(self, c: int) -> np.ndarray:
        """Owner c's series, (n, max_len, 1)."""
        return self.series[:, c, :, None]


def parse_ts(path: str | os.PathLike, max_len: int = MAX_LEN) -> VowelsSplit:
    """Read one aeon .ts file; errors name the file and line."""
    rows, labels = [], []
    in_data = False
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if not in_data:
                in_data = line.lower() == "@data"
                continue
            parts = line.split(":")
            if len(parts) != N_OWNERS + 1:
                raise ValueError(f"{path}, line {ln}: expected {N_OWNERS} channels and a label, got {len(parts) - 1} channels")
            try:
                chans = [np.array([float(v) for v in p.split(",")]) for p in parts[:-1]]
                lab = int(parts[-1])
            except ValueError as e:
                raise ValueError(f"{path}, line {ln}: {e}") from None
            T = len(chans[0])
            if any(len(c) != T for c in chans) or not 1 <= T <= max_len:
                raise ValueError(f"{path}, line {ln}: channel lengths {[len(c) for c in chans]} differ or exceed {max_len}")
            if not 1 <= lab <= N_CLASSES:
                raise ValueError(f"{path}, line {ln}: label {lab} not in 1..{N_CLASSES}")
            rows.append(np.stack(chans))
            labels.append(lab - 1)
    if not rows:
        raise ValueError(f"{path}: no @data rows")
    n = len(rows)
    series = np.zeros((n, N_OWNERS, max_len))
    lengths = np.array([r.shape[1] for r in rows])
    for k, r in enumerate(rows):
        series[k, :, :r.shape[1]] = r
    mask = np.arange(max_len)[None, :] < lengths[:, None]
    return VowelsSplit(series, mask, lengths, np.array(labels, dtype=np.int64))


def load_vowels(data_dir=None) -> tuple[VowelsSplit, VowelsSplit]:
    """(train, test) from ``japanese_vowels/JapaneseVowels_{TRAIN,TEST}.ts`` (real data)."""
    root = Path(data_root(data_dir)) / "japanese_vowels"
    return parse_ts(root / "JapaneseVowels_TRAIN.ts"), parse_ts(root / "JapaneseVowels_TEST.ts")
