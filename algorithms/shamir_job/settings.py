"""The Shamir job's settings (the ``[algorithm]`` table)."""
from __future__ import annotations

from dataclasses import dataclass

from fedhet.parties.settings import setting

NAME = "shamir"


@dataclass(frozen=True)
class Settings:
    rows: int = setting(64, "samples (rows of every X_i)", lo=1)
    d_in: int = setting(8, "owner i has d_in + i features", lo=1)
    d_out: int = setting(4, "columns of every public P_i", lo=1)
    t: int = setting(2, "threshold: any t holders reconstruct, t - 1 learn nothing", lo=1)
    frac_bits: int = setting(16, "fixed-point fractional bits of the shared X_i", lo=0, hi=60)
    public_frac_bits: int = setting(16, "fractional bits of the public P_i", lo=0, hi=60)
    max_abs: float = setting(4.0, "public bound on |X_i|", lo=0, lo_open=True)
    drop: list[str] = setting([], "holders that compute but never send their result (dropout demo)")
    wait: float | None = setting(None, "seconds the coordinator waits for results (None: the federation's)",
                                 lo=0, lo_open=True)
    seed: int = setting(0, "seeds the synthetic X_i and the public P_i", lo=0)
