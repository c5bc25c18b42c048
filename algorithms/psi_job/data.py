"""The PSI job's synthetic ID sets, each party's built from the settings alone (see the package docstring)."""
from __future__ import annotations

import hashlib

import numpy as np

from fedhet.algorithms.psi_job.messages import FEATURE, LABEL_OWNER
from fedhet.algorithms.streams import stream_rng
from fedhet.algorithms.psi_job.settings import Settings
from fedhet.crypto.ecdh_psi import encode_items
from fedhet.parties.contract import PartyContext


def _blocks(s: Settings) -> tuple[int, int]:
    core = int(round(s.overlap * s.n))
    pair = min(int(round(s.pair_overlap * s.n)), s.n - core)
    return core, pair


def _ids(s: Settings, slots: np.ndarray) -> list:
    if s.id_type == "int":
        return [int(x) for x in slots]
    key = hashlib.sha256(f"fedhet-psi-job/{s.seed}".encode()).digest()[:16]
    return ["u" + hashlib.blake2b(int(x).to_bytes(8, "little"), digest_size=8, key=key).hexdigest()
            for x in slots]


def _slots(s: Settings, role: str, index: int) -> np.ndarray:
    """The ID slots of one party (before duplicates): slot numbers are disjoint between blocks."""
    n = s.n
    core, pair = _blocks(s)
    own_private = n - core
    core_slots = np.arange(core)
    lo_private = core + np.arange(own_private)  # the label owner's block, pair slots at its front
    if role == LABEL_OWNER:
        return np.concatenate([core_slots, lo_private])
    lo_end = core + own_private
    mine_pair = core + index * pair + np.arange(pair)
    mine_pair = mine_pair[mine_pair < lo_end]  # more feature parties than the block has room for: fewer pairs
    rest = n - core - len(mine_pair)
    private = lo_end + index * n + np.arange(rest)  # feature party blocks never meet
    return np.concatenate([core_slots, mine_pair, private])


def load_data(s: Settings, ctx: PartyContext) -> dict:
    """The party's ID rows (its slots, ``duplicates * n`` repeated, shuffled) and its index."""
    if ctx.role not in (LABEL_OWNER, FEATURE):
        raise ValueError(f"psi: unknown role {ctx.role!r} (roles: {LABEL_OWNER}, {FEATURE})")
    slots = _slots(s, ctx.role, ctx.index)
    rng = stream_rng(s.seed, 0 if ctx.role == LABEL_OWNER else 1 + ctx.index)  # a stream per party
    n_dup = int(round(s.duplicates * len(slots))) if len(slots) else 0
    rows = np.concatenate([slots, rng.choice(slots, size=n_dup)]) if n_dup else slots
    rows = rng.permutation(rows)
    return {"ids": _ids(s, rows), "index": ctx.index}


def expected_common(s: Settings, n_features: int) -> set:
    """The IDs common to the label owner and ``n_features`` feature parties, from the settings."""
    core, pair = _blocks(s)
    slots = list(range(core))
    if n_features == 1:
        slots += list(range(core, core + pair))
    return set(_ids(s, np.array(slots, dtype=np.int64)))


def ids_digest(ids) -> str:
    """SHA-256 of the ordered list of IDs (length-prefixed encodings): equal lists, equal digests."""
    h = hashlib.sha256()
    for e in encode_items(ids):
        h.update(len(e).to_bytes(4, "little") + e)
    return h.hexdigest()
