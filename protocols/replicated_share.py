"""Replicated (2-of-3) sharing between parties: owners -> three holders (who compute together) -> a coordinator.

Flow (each function runs on one party, against the party API; the arithmetic is :mod:`fedhet.protocols.replicated`)::

    owner        share_to_holders(party, words, holders)     {prefix}/share: one pair per holder (seeds for the
                                                             PRG-expanded components, about 2x the array in all)
    holder       h = connect(party, holders)                 {prefix}/key: a fresh key to the successor, one from
                                                             the predecessor; every exchange is {prefix}/round
    holder       pairs = receive_shares(party, owners, h)
    holder       ...replicated.mul / relu / ... (h, ...)      rounds between the holders only
    holder       send_open(party, coord, kind, rss, step)    a pair of a value to open
    coordinator  open_at(party, holders, kind, step)         the three pairs, every component checked twice

Holders are indexed by name order (holder_index).  ``connect`` runs in every incarnation of a run (a resumed run
makes new keys); the keys never leave the two holders that share them (CURVE-encrypted messages, never in a
checkpoint).  A holder's exchange checks the successor's round number and array size, so a wrong or
misordered message stops the computation naming the sender.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from fedhet.parties import schema as sch
from fedhet.parties.api import PeerFault, PeersDisagree
from fedhet.parties.contract import PartyLike
from fedhet.parties.declare import MessageDecl, declare
from fedhet.protocols import replicated as rs

__all__ = ["holder_index", "share_to_holders", "receive_shares", "connect", "send_open", "open_at",
           "declarations", "MAX_ROUND_WORDS"]

VERSION = 1
MAX_ROUND_WORDS = 1 << 28    # one exchange carries at most this many words (2 GiB)


def holder_index(holders: Sequence[str]) -> dict[str, int]:
    hs = list(holders)
    if len(hs) != 3 or len(set(hs)) != 3:
        raise ValueError(f"replicated sharing needs exactly three distinct holders, got {hs}")
    return {h: i for i, h in enumerate(sorted(hs))}


def share_to_holders(party: PartyLike, words: np.ndarray, holders: Sequence[str], kind: str, frac_bits: int) -> None:
    """Owner side: a fresh 2-of-3 sharing of ``words`` (uint64 fixed point), one pair per holder."""
    idx = holder_index(holders)
    parts = rs.share(words)
    for h, i in idx.items():
        a, b = parts[i]
        party.send(h, kind, {"v": VERSION, "frac_bits": int(frac_bits), "shape": [int(v) for v in words.shape],
                             "a": a, "b": b})


def receive_shares(party: PartyLike, owners: Sequence[str], kind: str, shape_of: dict[str, tuple],
                   frac_bits: int) -> dict[str, rs.Rss]:
    """Holder side: each owner's pair, expanded, checked against the shape the settings give (None: any)."""
    out = {}
    for o in owners:
        msg = party.recv(o, kind)
        if msg["v"] != VERSION or msg["frac_bits"] != frac_bits:
            raise PeerFault(party.name, o, kind, f"version {msg['v']} / frac_bits {msg['frac_bits']}, expected "
                            f"{VERSION} / {frac_bits}")
        shape = tuple(msg["shape"])
        want = tuple(shape_of[o])
        if len(shape) != len(want) or any(w is not None and w != v for v, w in zip(shape, want)) \
                or any(v > MAX_ROUND_WORDS for v in shape):
            raise PeerFault(party.name, o, kind, f"an array of shape {shape}, expected {want}")
        try:
            out[o] = rs.Rss(rs.expand(msg["a"], shape), rs.expand(msg["b"], shape))
        except ValueError as e:
            raise PeerFault(party.name, o, kind, str(e)) from None
    return out


def connect(party: PartyLike, holders: Sequence[str], prefix: str) -> rs.Holder:
    """This holder's :class:`~fedhet.protocols.replicated.Holder`: a fresh key sent to its successor, its
    predecessor's received, and an exchange over ``{prefix}/round`` messages."""
    idx = holder_index(holders)
    names = sorted(idx)
    i = idx[party.name]
    nxt, prv = names[(i + 1) % 3], names[(i - 1) % 3]
    key = os.urandom(rs.KEY_BYTES)
    party.send(nxt, f"{prefix}/key", {"key": key})
    got = party.recv(prv, f"{prefix}/key")["key"]
    counter = [0]

    def exchange(words: np.ndarray) -> np.ndarray:
        r = counter[0]
        counter[0] += 1
        party.send(prv, f"{prefix}/round", {"r": r, "w": words.reshape(-1)})
        msg = party.recv(nxt, f"{prefix}/round")
        w = np.asarray(msg["w"])
        if msg["r"] != r or w.size != words.size:
            raise PeerFault(party.name, nxt, f"{prefix}/round", f"round {msg['r']} with {w.size} words, expected "
                            f"round {r} with {words.size} (the holders are out of step)")
        return w.reshape(words.shape)
    return rs.Holder(i, key, got, exchange)


def send_open(party: PartyLike, to: str, kind: str, x: rs.Rss, step: int) -> None:
    """Holder side: its pair of a (reshared) value, for ``to`` to open."""
    party.send(to, kind, {"step": int(step), "a": np.ascontiguousarray(x.a), "b": np.ascontiguousarray(x.b)})


def open_at(party: PartyLike, holders: Sequence[str], kind: str, step: int) -> np.ndarray:
    """Coordinator side: the value (uint64 words) from the three holders' pairs; a holder that answers another
    step, or two holders whose copies of a component differ, stop it with the holders named."""
    idx = holder_index(holders)
    names = sorted(idx)
    pairs = []
    for h in names:
        msg = party.recv(h, kind)
        if msg["step"] != step:
            raise PeerFault(party.name, h, kind, f"step {msg['step']}, expected {step}")
        pairs.append((np.asarray(msg["a"]), np.asarray(msg["b"])))
    try:
        return rs.open_pairs(pairs)
    except rs.OpenError as e:
        a, b = (names[j] for j in e.holders)
        raise PeersDisagree(party.name, [a, b], kind, f"step {step}: they sent different copies of component "
                            f"{e.component}: one of the two deviated (the opening cannot tell which)") from None


def declarations(prefix: str, owner: str, holder: str, share_shape: tuple, width: int | None = None) -> list[MessageDecl]:
    """The share, key and round kinds under ``prefix`` (the algorithm declares its own opening kinds)."""
    comp = sch.OneOf((sch.Bytes(length=rs.KEY_BYTES), sch.Arr("<u8", tuple(share_shape))))
    return [
        declare(f"{prefix}/share", owner, holder, "one holder's pair of an owner's 2-of-3 replicated sharing over "
                "Z_2^64 of its fixed-point array: each component a uint64 array or the 32-byte seed of its PRG "
                "expansion; uniform to the holder alone",
                payload=sch.Fields({"v": sch.Int(), "frac_bits": sch.Int(lo=0, hi=62),
                                    "shape": sch.ListOf(sch.Int(lo=0), max_len=len(share_shape)), "a": comp,
                                    "b": comp}), protects="shares"),
        declare(f"{prefix}/key", holder, holder, "a fresh 256-bit key shared with the next holder (its zero "
                "sharings); never leaves the two", payload=sch.Fields({"key": sch.Bytes(length=rs.KEY_BYTES)}),
                protects="control"),
        declare(f"{prefix}/round", holder, holder, "one round of the holders' computation: a reshared product, "
                "AND or comparison term (uint64, uniform to the receiver)",
                payload=sch.Fields({"r": sch.Int(lo=0), "w": sch.Arr("<u8", (None,), max_elems=MAX_ROUND_WORDS)}),
                protects="shares"),
    ]
