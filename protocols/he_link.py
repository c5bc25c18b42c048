"""What both sides of one HE interactive link share, whatever the scheme: message kinds, counters, receiving.

The kinds are the eight messages of :mod:`fedhet.protocols.he_interactive` (declared there with their
payload checks); :class:`LayerStats` counts one side's work; :func:`recv_timed` receives and charges
the wait to the counters; :func:`need_fields` rejects a payload that is not a dict with the expected
keys, naming kind and sender; :func:`fault` is the error for any received message proven bad.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from fedhet.parties.api import PeerFault

__all__ = [
    "K_PUBKEY", "K_ACTS", "K_NOISE", "K_FWD_CT", "K_FWD_MASKED", "K_GRAD_CT", "K_GRAD_MASKED", "K_INGRAD_CT",
    "LayerStats", "recv_timed", "need_fields", "fault",
]

K_PUBKEY, K_ACTS, K_NOISE = "hei/pubkey", "hei/acts", "hei/noise_ct"
K_FWD_CT, K_FWD_MASKED = "hei/fwd_ct", "hei/fwd_masked"
K_GRAD_CT, K_GRAD_MASKED, K_INGRAD_CT = "hei/grad_ct", "hei/grad_masked", "hei/ingrad_ct"


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


def recv_timed(party, frm: str, kind: str, stats: LayerStats):
    """``party.recv(frm, kind)``, adding the time blocked to ``stats.s_wait``."""
    t0 = time.perf_counter()
    msg = party.recv(frm, kind)
    stats.s_wait += time.perf_counter() - t0
    return msg


def fault(party, frm: str, kind: str, reason: str) -> PeerFault:
    """The error for a message of ``kind`` from ``frm`` that is proven bad (it names ``frm``)."""
    return PeerFault(party.name, frm, kind, reason)


def need_fields(msg, keys, kind: str, frm: str, party) -> dict:
    """``msg`` itself if it is a dict holding every key in ``keys``; else PeerFault naming kind and sender."""
    if not isinstance(msg, dict) or any(k not in msg for k in keys):
        raise fault(party, frm, kind, f"must be a dict with keys {list(keys)}")
    return msg
