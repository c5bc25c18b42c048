"""PSI as a runnable job: one label owner and feature parties intersect synthetic ID sets.

Not a learning algorithm: it exercises ``fedhet.protocols.psi`` through
``fedhet run`` and ``fedhet audit`` (preset ``psi``).  Each party builds its
own IDs from the run configuration alone:

* a core block of ``round(overlap * n)`` IDs that every party holds;
* the label owner's private block (``n`` minus the core); feature party j
  also holds the ``pair_overlap * n`` IDs of slot j of that block, so the
  label owner shares a block with each feature party that no other party has;
* the rest of each feature party's ``n`` IDs are its own;
* ``duplicates * n`` extra rows repeat IDs the party already has; rows are
  shuffled per party.

IDs are ``id_type`` "str" (``"u" + 16 hex digits``, a keyed hash of the slot,
so they carry no visible structure) or "int".  Every party can therefore
compute the expected common set (the core block, plus pair block 0 when there
is a single feature party) and checks its result against it, and that its
rows really hold the common IDs.  ``ids_sha256`` hashes the ordered common
list so a run shows that every party ended with the same list.

Other keys: ``psi_backend`` ("ecdh", the default, or "kkrt": OT-extension PSI,
``fedhet.protocols.psi.kkrt``), ``reveal``, ``order``, ``chunk``, ``workers`` (see
``fedhet.protocols.psi``) and ``psi_timeout`` (seconds to wait for any one
PSI message; default the federation's timeout; the waits include the peer's
computation, so raise it for sets of millions of IDs on a busy machine).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

from fedhet.crypto.ecdh_psi import encode_items
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.settings import TableView, parse_settings, setting
from fedhet.protocols import psi

NAME = "psi"
LABEL_OWNER, FEATURE = "label_owner", "feature"


@dataclass(frozen=True)
class Settings(TableView):
    n: int = setting(1000, "IDs per party, before duplicate rows", lo=0)
    overlap: float = setting(0.5, "fraction of n that every party holds", lo=0, hi=1)
    pair_overlap: float = setting(0.1, "fraction of n the label owner shares with one feature party only",
                                  lo=0, hi=1)
    duplicates: float = setting(0.02, "extra rows repeating IDs, as a fraction of n", lo=0, hi=1)
    id_type: Literal["str", "int"] = setting("str", "IDs as keyed-hash strings or integers")
    psi_backend: Literal["ecdh", "kkrt"] = setting("ecdh", "PSI protocol: ECDH (X25519) or KKRT16 (OT extension)")
    reveal: bool = setting(True, "false: only the label owner learns the intersection")
    order: Literal["sorted", "label_owner"] = setting("sorted", "order of the common list")
    chunk: int = setting(psi.DEFAULT_CHUNK, "points per PSI message", lo=1)
    workers: int | None = setting(None, "worker processes for the curve arithmetic (None: automatic)", lo=0)
    psi_timeout: float | None = setting(None, "seconds to wait for any one PSI message (None: the "
                                        "federation's timeout)", lo=0, lo_open=True)
    seed: int = setting(0, "seeds the IDs and the row order", lo=0)


def _cfg(cfg) -> Settings:
    return cfg if isinstance(cfg, Settings) else parse_settings(Settings, cfg, NAME)


def declarations(s: Settings) -> list:
    return psi.declarations(LABEL_OWNER, FEATURE, backend=None)


DECLARATIONS = psi.declarations(LABEL_OWNER, FEATURE, backend=None)


def _blocks(c: dict) -> tuple[int, int]:
    core = int(round(c["overlap"] * c["n"]))
    pair = min(int(round(c["pair_overlap"] * c["n"])), c["n"] - core)
    return core, pair


def _ids(c: dict, slots: np.ndarray) -> list:
    if c["id_type"] == "int":
        return [int(s) for s in slots]
    key = hashlib.sha256(f"fedhet-psi-job/{c['seed']}".encode()).digest()[:16]
    return ["u" + hashlib.blake2b(int(s).to_bytes(8, "little"), digest_size=8, key=key).hexdigest()
            for s in slots]


def _slots(c: dict, role: str, index: int) -> np.ndarray:
    """The ID slots of one party (before duplicates): slot numbers are disjoint between blocks."""
    n = c["n"]
    core, pair = _blocks(c)
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


def load_data(s: Settings, ctx: PartyContext):
    c = _cfg(s)
    if ctx.role not in (LABEL_OWNER, FEATURE):
        raise ValueError(f"psi: unknown role {ctx.role!r} (roles: {LABEL_OWNER}, {FEATURE})")
    slots = _slots(c, ctx.role, ctx.index)
    rng = np.random.default_rng([c.seed, 0 if ctx.role == LABEL_OWNER else 1 + ctx.index])
    n_dup = int(round(c.duplicates * len(slots))) if len(slots) else 0
    rows = np.concatenate([slots, rng.choice(slots, size=n_dup)]) if n_dup else slots
    rows = rng.permutation(rows)
    return {"ids": _ids(c, rows), "index": ctx.index}


def expected_common(cfg: dict, n_features: int) -> set:
    """The IDs common to the label owner and ``n_features`` feature parties, from the configuration."""
    c = _cfg(cfg)
    core, pair = _blocks(c)
    slots = list(range(core))
    if n_features == 1:
        slots += list(range(core, core + pair))
    return set(_ids(c, np.array(slots, dtype=np.int64)))


def ids_digest(ids) -> str:
    h = hashlib.sha256()
    for e in encode_items(ids):
        h.update(len(e).to_bytes(4, "little") + e)
    return h.hexdigest()


def _report(party, cfg: Settings, res: psi.PSIResult, data: dict, n_features: int) -> dict:
    out = {"revealed": res.revealed, "stats": res.stats}
    if res.ids is not None:
        exp = expected_common(cfg, n_features)
        aligned = all(data["ids"][r] == i for r, i in zip(res.rows.tolist(), res.ids))
        first = all(data["ids"].index(i) == r for r, i in zip(res.rows.tolist()[:50], res.ids[:50]))
        out.update({"size": len(res.ids), "expected_size": len(exp), "correct": set(res.ids) == exp,
                    "rows_aligned": aligned and first, "ids_sha256": ids_digest(res.ids),
                    "first_ids": res.ids[:5]})
        party.metric(psi_size=len(res.ids), psi_seconds=res.stats["seconds"], correct=out["correct"])
    else:
        party.metric(psi_seconds=res.stats["seconds"])
    party.log.info("PSI done: %s", {k: v for k, v in out.items() if k != "first_ids"})
    return out


def label_owner(party, cfg: Settings, data: dict) -> dict:
    c = _cfg(cfg)
    peers = party.peers_with_role(FEATURE)
    res = psi.psi_label_owner(party, data["ids"], peers, reveal_to_all=c.reveal, order=c.order,
                              chunk=c.chunk, workers=c.workers, timeout=c.psi_timeout, backend=c.psi_backend)
    return _report(party, cfg, res, data, len(peers))


def feature(party, cfg: Settings, data: dict) -> dict:
    c = _cfg(cfg)
    owners = party.peers_with_role(LABEL_OWNER)
    if len(owners) != 1:
        raise ValueError(f"psi: needs exactly one label_owner party, found {owners}")
    res = psi.psi_feature_party(party, data["ids"], owners[0], chunk=c.chunk, workers=c.workers,
                                timeout=c.psi_timeout, backend=c.psi_backend)
    n_features = sum(1 for r in party.roles.values() if r == FEATURE)
    return _report(party, cfg, res, data, n_features)


ROLES = {LABEL_OWNER: label_owner, FEATURE: feature}

ALGORITHM = Algorithm(name=NAME, summary="private set intersection of synthetic ID sets (ECDH-PSI or KKRT16)",
                      roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings,
                      headline=("size", "correct"))
