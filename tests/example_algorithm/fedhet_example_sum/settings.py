"""The ``[algorithm]`` keys of example_sum."""
from __future__ import annotations

from dataclasses import dataclass

from fedhet.parties.settings import setting


@dataclass(frozen=True)
class Settings:
    scale: float = setting(1.0, "adder i (0-based among adders) sends (i + 1) * scale", lo=0, hi=1e6)
    seed: int = setting(0, "the federation's seed (unused: the run is deterministic)", lo=0)
