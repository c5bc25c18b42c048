"""Secure aggregation: the masks (PRG streams added in the ring) and the Shamir-shared 32-byte secrets.

A client's masked input is ``q + PRG(b) + sum_v +-PRG(s_uv)`` in ``Z/2**bits``
(:func:`apply_masks`, the AES-256-CTR :class:`~fedhet.crypto.prg.PRG` with the
whole 256-bit seed); the server removes masks the same way with the opposite
signs.  The two secrets a client shares (its self-mask seed ``b`` and its
mask key ``s^SK``, 32 bytes each) are split into t-of-n Shamir shares over
GF(2**61 - 1), :data:`~fedhet.protocols.secagg_messages.SECRET_ELEMS` field
elements per secret (:func:`share_secrets`, :func:`reconstruct_secret`).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np

from fedhet.crypto.field import F61
from fedhet.crypto.prg import PRG, SEED_BYTES
from fedhet.crypto.shamir import reconstruct, share

from .secagg_config import SecAggError
from .secagg_quantizer import Quantizer

__all__ = ["apply_masks", "share_secrets", "reconstruct_secret"]

# Elements per chunk of the masking loops: the chunk of the output and one
# chunk of keystream stay in L2 while every mask is added to it.
_CHUNK = 1 << 15


def apply_masks(acc: np.ndarray, masks: Iterable[tuple[bytes, int]], quant: Quantizer | None = None,
                x: np.ndarray | None = None, w: float = 0.0) -> None:
    """``acc += sum sign * PRG(seed)`` in the ring, chunk by chunk (each PRG's stream read in order).

    With ``quant``, each chunk of ``acc`` is first overwritten with the
    quantised ``(x, w)``: the client's whole masked input in one cache-friendly pass.
    """
    masks = [(PRG(seed), sign) for seed, sign in masks]
    dtype = acc.dtype
    n = acc.size
    key = np.empty(min(_CHUNK, max(n, 1)), dtype=dtype)
    tmp = np.empty(key.size, dtype=np.float64) if quant is not None else None
    add, sub = np.add, np.subtract
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        a = acc[lo:hi]
        if quant is not None:
            quant.encode_into(acc, x, w, lo, hi, tmp)
        kk = key[: hi - lo]
        for prg, sign in masks:
            prg.fill_bytes(kk)
            (add if sign > 0 else sub)(a, kk, out=a)


def share_secrets(secrets: list[bytes], n: int, t: int) -> np.ndarray:
    """t-of-n shares of 32-byte secrets: row i is the share at x = i + 1, the secrets' elements side by side."""
    return share(np.concatenate([F61.bytes_to_elements(s) for s in secrets]), n, t)


def reconstruct_secret(rows: list[np.ndarray], points: list[int], t: int, what: str) -> bytes:
    """A 32-byte secret from >= t Shamir shares (each ``SECRET_ELEMS`` field elements) at x = ``points``."""
    if len(rows) < t:
        raise SecAggError(f"cannot reconstruct {what}: {len(rows)} share(s), the threshold is t={t}")
    try:
        return F61.elements_to_bytes(reconstruct(np.stack(rows[:t]), points[:t], field=F61), SEED_BYTES)
    except ValueError as e:
        raise SecAggError(f"shares of {what} do not decode to a 32-byte secret: {e}") from None
