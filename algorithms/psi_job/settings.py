"""The PSI job's settings (the ``[algorithm]`` table)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fedhet.parties.settings import setting
from fedhet.protocols import psi

NAME = "psi"


@dataclass(frozen=True)
class Settings:
    n: int = setting(1000, "IDs per party, before duplicate rows", lo=0)
    overlap: float = setting(0.5, "fraction of n that every party holds", lo=0, hi=1)
    pair_overlap: float = setting(0.1, "fraction of n the label owner shares with one feature party only",
                                  lo=0, hi=1)
    duplicates: float = setting(0.02, "extra rows repeating IDs, as a fraction of n", lo=0, hi=1)
    id_type: Literal["str", "int"] = setting("str", "IDs as keyed-hash strings or integers")
    psi_backend: Literal["auto", "ecdh", "kkrt", "rr22"] = setting(
        "ecdh", "PSI protocol: ECDH (X25519), KKRT16 (OT extension), RR22 (OKVS + silent VOLE) or auto (the label "
        f"owner runs rr22 from {psi.AUTO_RR22_FROM} IDs, ecdh below; the feature parties follow)")
    reveal: bool = setting(True, "false: only the label owner learns the intersection")
    order: Literal["sorted", "label_owner"] = setting("sorted", "order of the common list")
    chunk: int = setting(psi.DEFAULT_CHUNK, "points per PSI message", lo=1)
    workers: int | None = setting(None, "worker processes for the curve arithmetic (None: automatic)", lo=0)
    psi_timeout: float | None = setting(None, "seconds to wait for any one PSI message (None: the "
                                        "federation's timeout)", lo=0, lo_open=True)
    seed: int = setting(0, "seeds the IDs and the row order", lo=0)
