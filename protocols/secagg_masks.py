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

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from fedhet.crypto.field import F61
from fedhet.crypto.prg import PRG, SEED_BYTES
from fedhet.crypto.shamir import interpolate, locate_error, parity_check, reconstruct, share, share_at

from .secagg_config import SecAggError
from .secagg_quantizer import Quantizer

__all__ = ["apply_masks", "share_secrets", "share_secrets_at", "reconstruct_secret", "SharedSecret", "recover_secrets"]

# Elements per chunk of the masking loops: the chunk of the output and one
# chunk of keystream stay in L2 while every mask is added to it.
_CHUNK = 1 << 15


def apply_masks(acc: np.ndarray, masks: Iterable[tuple[bytes, int]], quant: Quantizer | None = None,
                x: np.ndarray | None = None, w: float = 0.0) -> None:
    """``acc += sum sign * PRG(seed)`` in the ring, chunk by chunk (each PRG's stream read in order).

    With ``quant``, each chunk of ``acc`` is first overwritten with the
    quantised ``(x, w)``: the client's whole masked input in one cache-friendly pass.
    """
    streams = [(PRG(seed), sign) for seed, sign in masks]
    dtype = acc.dtype
    n = acc.size
    key = np.empty(min(_CHUNK, max(n, 1)), dtype=dtype)
    tmp = np.empty(key.size, dtype=np.float64) if quant is not None else None
    add, sub = np.add, np.subtract
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        a = acc[lo:hi]
        if quant is not None:
            assert x is not None and tmp is not None
            quant.encode_into(acc, x, w, lo, hi, tmp)
        kk = key[: hi - lo]
        for prg, sign in streams:
            prg.fill_bytes(kk)
            (add if sign > 0 else sub)(a, kk, out=a)


def share_secrets(secrets: list[bytes], n: int, t: int) -> np.ndarray:
    """t-of-n shares of 32-byte secrets: row i is the share at x = i + 1, the secrets' elements side by side."""
    return share(np.concatenate([F61.bytes_to_elements(s) for s in secrets]), n, t)


def share_secrets_at(secrets: list[bytes], xs: list[int], t: int) -> np.ndarray:
    """:func:`share_secrets` at the points ``xs`` only (a SecAgg+ client's k + 1 holders, not all n)."""
    return share_at(np.concatenate([F61.bytes_to_elements(s) for s in secrets]), xs, t)


def reconstruct_secret(rows: list[np.ndarray], points: list[int], t: int, what: str) -> bytes:
    """A 32-byte secret from >= t Shamir shares (each ``SECRET_ELEMS`` field elements) at x = ``points``."""
    if len(rows) < t:
        raise SecAggError(f"cannot reconstruct {what}: {len(rows)} share(s), the threshold is t={t}")
    try:
        return F61.elements_to_bytes(reconstruct(np.stack(rows[:t]), points[:t], field=F61), SEED_BYTES)
    except ValueError as e:
        raise SecAggError(f"shares of {what} do not decode to a 32-byte secret: {e}") from None


@dataclass
class SharedSecret:
    """The shares of one 32-byte secret that arrived, and how to recognise the secret.

    ``holders[i]`` sent ``rows[i]``, its share at x = ``points[i]``; ``verify(secret)`` is the
    dealer's public check (a seed against its signed commitment, a key against its public key).
    After :func:`recover_secrets`: ``secret`` (None if it could not be recovered), ``off`` (the
    holders whose share is proven off the verified polynomial) and ``note`` (why not recovered).
    """

    what: str
    holders: list[str]
    points: list[int]
    rows: list[np.ndarray]
    verify: Callable[[bytes], bool]
    secret: bytes | None = None
    off: list[str] = field(default_factory=list)
    note: str = ""


def _decode(rows: np.ndarray, points: list[int], verify: Callable[[bytes], bool]) -> bytes | None:
    try:
        b = F61.elements_to_bytes(interpolate(rows, points, [0], field=F61)[0], SEED_BYTES)
    except ValueError:
        return None
    return b if verify(b) else None


def recover_secrets(items: list[SharedSecret], t: int) -> None:
    """Recover every secret from its k >= t shares, checking the redundant ones; fills each item in.

    Shares of one secret must lie on one polynomial of degree < t (a random parity check,
    :func:`~fedhet.crypto.shamir.parity_check`, batched over the secrets held at the same points;
    it misses an inconsistency with probability below k / 2**61), and the secret it gives must
    pass ``verify``.
    When they do not, the wrong share is found where the data allow: with k >= t + 2 shares one
    wrong share is located from the syndromes (:func:`~fedhet.crypto.shamir.locate_error`); with
    k = t + 1, by the one leave-one-out subset whose secret passes ``verify``.  With k = t, or two
    or more wrong shares, nothing names a holder: ``secret`` stays None and ``note`` says so.
    """
    if any(len(it.rows) < t for it in items):
        it = next(it for it in items if len(it.rows) < t)
        raise SecAggError(f"cannot reconstruct {it.what}: {len(it.rows)} share(s), the threshold is t={t}")
    groups: dict[tuple[int, ...], list[SharedSecret]] = {}
    for it in items:
        groups.setdefault(tuple(it.points), []).append(it)
    for pts, its in groups.items():
        Y = np.concatenate([np.stack(it.rows) for it in its], axis=1)  # (k, SECRET_ELEMS * len(its))
        c = parity_check(list(pts), t, field=F61)  # random, drawn now: after the shares arrived
        zero = ~np.any(F61.sum(F61.mul(Y, c[:, None]), axis=0).reshape(len(its), -1), axis=1)
        if zero.any():
            first = reconstruct(Y[:t], list(pts[:t]), field=F61).reshape(len(its), -1)
        for j, it in enumerate(its):
            if zero[j]:
                _consistent(it, first[j], t)
            else:
                _inconsistent(it, t)


def _consistent(it: SharedSecret, elems: np.ndarray, t: int) -> None:
    try:
        b = F61.elements_to_bytes(elems, SEED_BYTES)
    except ValueError:
        b = None
    if b is not None and it.verify(b):
        it.secret = b
    elif len(it.rows) == t:
        it.note = (f"the {t} shares of {it.what} (from {it.holders}) do not give the dealer's committed value, "
                   "and with no redundant share it cannot be told whose is wrong: cannot name a sender")
    else:
        it.note = (f"the {len(it.rows)} shares of {it.what} (from {it.holders}) agree with each other but not "
                   "with the dealer's committed value (the dealer shared another secret, or every holder "
                   "lied alike): cannot name a sender")


def _inconsistent(it: SharedSecret, t: int) -> None:
    k = len(it.rows)
    Y = np.stack(it.rows)
    if k >= t + 2:
        i = locate_error(Y, it.points, t, field=F61)
        cands = [] if i is None else [i]
    else:  # k == t + 1: one redundant share detects, the dealer's check places it
        cands = list(range(k))
    found = []
    for i in cands:
        rest = [j for j in range(k) if j != i][:t]
        b = _decode(Y[rest], [it.points[j] for j in rest], it.verify)
        if b is not None:
            found.append((i, b))
    if len(found) == 1:
        i, it.secret = found[0]
        it.off = [it.holders[i]]
        return
    it.note = (f"the {k} shares of {it.what} (from {it.holders}) are inconsistent"
               + (" in more than one place" if k >= t + 2 else "")
               + ", and no single wrong share explains it: cannot name a sender")
