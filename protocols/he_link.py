"""What both sides of one HE interactive link share, whatever the scheme: message kinds, counters, receiving.

:class:`Kind` names the eight messages of :mod:`fedhet.protocols.he_interactive` (declared there with
their payload schemas); :class:`LayerStats` counts one side's work; :func:`recv_timed` receives and charges
the wait to the counters; :func:`fault` is the error for any received message proven bad.  A payload
reaches the layers only after the party checked it against its declared schema (fields, dtypes,
shapes, the batch bound), so the layers check only what a schema cannot say.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from typing import Any

from fedhet.parties.api import PeerFault
from fedhet.parties.contract import PartyLike

__all__ = ["Kind", "LayerStats", "recv_timed", "fault"]


class Kind:
    """The message kinds of one HE interactive link (the protocol of :mod:`~fedhet.protocols.he_interactive`)."""

    PUBKEY = "hei/pubkey"            # guest -> host: the guest's public key
    ACTS = "hei/acts"                # guest -> host: [[A_g]]
    NOISE = "hei/noise_ct"           # guest -> host: [[eps]]
    FWD_CT = "hei/fwd_ct"            # host -> guest: [[A_g W_g + e_B]]
    FWD_MASKED = "hei/fwd_masked"    # guest -> host: A_g W + e_B
    GRAD_CT = "hei/grad_ct"          # host -> guest: [[G + e_W]]
    GRAD_MASKED = "hei/grad_masked"  # guest -> host: G + e_W + nu
    INGRAD_CT = "hei/ingrad_ct"      # host -> guest: [[delta (W_g + eps)^T]]


@dataclass
class LayerStats:
    """Counters of one side of one link (seconds are wall time inside this side's calls)."""

    encrypted: int = 0       # ciphertexts made (Paillier) or vectors encrypted (CKKS)
    decrypted: int = 0
    rerandomized: int = 0
    s_encrypt: float = 0.0
    s_decrypt: float = 0.0
    s_compute: float = 0.0   # homomorphic arithmetic and masks
    s_rerandomize: float = 0.0  # rerandomization (obfuscators not ready in the pool are computed here)
    s_wait: float = 0.0      # blocked in recv
    pool_misses: int = 0     # obfuscators the background pool had not ready in time
    delta_clipped: int = 0   # per-sample gradient entries clipped to |delta| < 2**d_int_bits
    min_mask_sigma: int | None = None  # smallest statistical mask margin used, bits (int schemes)
    max_bound_bits: int = 0  # largest slot bound met before masking (int schemes)

    def as_dict(self) -> dict:
        return asdict(self)


def recv_timed(party: PartyLike, frm: str, kind: str, stats: LayerStats) -> Any:
    """``party.recv(frm, kind)``, adding the time blocked to ``stats.s_wait``."""
    t0 = time.perf_counter()
    msg = party.recv(frm, kind)
    stats.s_wait += time.perf_counter() - t0
    return msg


def fault(party: PartyLike, frm: str, kind: str, reason: str) -> PeerFault:
    """The error for a message of ``kind`` from ``frm`` that is proven bad (it names ``frm``)."""
    return PeerFault(party.name, frm, kind, reason)
