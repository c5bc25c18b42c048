"""Shamir-shared linear algebra as a runnable job: owners share, holders compute, a coordinator reconstructs.

Not a learning algorithm: it exercises ``fedhet.protocols.shamir_share``
through ``fedhet run`` and ``fedhet audit`` (preset ``shamir``), in the shape
F³'s fusion step has (ALGORITHMS.md, F³): owner i holds a matrix X_i
(``rows`` x ``d_in + i``, uniform in ``[-max_abs, max_abs]``, the same
samples with different features), the public alignment matrices P_i
(``d_in + i`` x ``d_out``) follow from the run seed, and the holders compute

    Y = sum_i X_i @ P_i

on their shares (P_i in fixed point with ``public_frac_bits``), so the
result carries ``frac_bits + public_frac_bits`` fractional bits.  The
coordinator reconstructs Y from any t holders and, since the job's data
are synthetic, recomputes Y in plain float64 from the configuration and
checks ``|Y_shared - Y_plain| <= err`` (the error bound the protocol
tracks; ``correct`` in its result).  No party but the owner ever holds X_i;
the coordinator's recomputation is the test oracle, not part of the protocol.

Keys: ``rows``, ``d_in``, ``d_out``, ``t``, ``frac_bits``,
``public_frac_bits``, ``max_abs`` (the public bound on |X_i|), ``drop`` (holder
names that compute but never send their result: a dropout demo; at least t
must remain), ``wait`` (seconds the coordinator waits for results; default the
federation's timeout).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.settings import TableView, parse_settings, setting
from fedhet.protocols import shamir_share as ss

NAME = "shamir"
OWNER, HOLDER, COORDINATOR = "owner", "holder", "coordinator"
PREFIX = "shamir"


@dataclass(frozen=True)
class Settings(TableView):
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


def _cfg(cfg) -> Settings:
    if isinstance(cfg, Settings):
        return cfg
    cfg = dict(cfg or {})
    if isinstance(cfg.get("drop"), str):  # one holder's name given alone
        cfg["drop"] = [cfg["drop"]] if cfg["drop"] else []
    return parse_settings(Settings, cfg, NAME)


def public_matrix(cfg: dict, i: int) -> np.ndarray:
    """Owner i's public alignment matrix P_i, (d_in + i) x d_out, from the run seed."""
    c = _cfg(cfg)
    rng = np.random.default_rng([c["seed"], 2, i])
    return rng.normal(size=(c["d_in"] + i, c["d_out"])) / np.sqrt(c["d_in"] + i)


def owner_matrix(cfg: dict, i: int) -> np.ndarray:
    """Owner i's private matrix X_i (synthetic, deterministic from the seed)."""
    c = _cfg(cfg)
    rng = np.random.default_rng([c["seed"], 1, i])
    return rng.uniform(-c["max_abs"], c["max_abs"], size=(c["rows"], c["d_in"] + i))


def plain_result(cfg: dict, n_owners: int) -> np.ndarray:
    return sum(owner_matrix(cfg, i) @ public_matrix(cfg, i) for i in range(n_owners))


def load_data(s: Settings, ctx: PartyContext):
    if ctx.role not in (OWNER, HOLDER, COORDINATOR):
        raise ValueError(f"shamir: unknown role {ctx.role!r} (roles: {OWNER}, {HOLDER}, {COORDINATOR})")
    if ctx.role == OWNER:
        return {"index": ctx.index, "X": owner_matrix(s, ctx.index)}
    return {"index": ctx.index}


def _holders(party) -> list[str]:
    hs = sorted(n for n, r in party.roles.items() if r == HOLDER)
    if not hs:
        raise ValueError("shamir: the federation has no holder")
    return hs


def _owners(party) -> list[str]:
    # owner i is the i-th owner in federation order, as load_data numbers them
    return [n for n, r in party.roles.items() if r == OWNER]


def owner(party, cfg: Settings, data: dict) -> dict:
    c = _cfg(cfg)
    info = ss.share_to_holders(party, data["X"], _holders(party), c["t"], PREFIX, frac_bits=c["frac_bits"],
                               max_abs=c["max_abs"])
    party.metric(shared_elements=int(data["X"].size))
    return {"shape": list(info.shape), "points": info.points, "bound": info.bound}


def holder(party, cfg: Settings, data: dict) -> dict:
    c = _cfg(cfg)
    owners = _owners(party)
    shares = ss.receive_shares(party, owners, PREFIX, t=c["t"])
    y = ss.sum_shares([ss.matmul(shares[o], public_matrix(cfg, i), frac_bits=c["public_frac_bits"])
                       for i, o in enumerate(owners)])
    coordinators = party.peers_with_role(COORDINATOR)
    if len(coordinators) != 1:
        raise ValueError(f"shamir: needs exactly one coordinator, found {coordinators}")
    sent = party.name not in c["drop"]
    if sent:
        ss.send_to_coordinator(party, coordinators[0], y, PREFIX)
    return {"x": y.x, "sent": sent, "frac_bits": y.frac_bits, "shape": list(y.shape)}


def coordinator(party, cfg: Settings, data: dict) -> dict:
    c = _cfg(cfg)
    holders = _holders(party)
    rec = ss.reconstruct_at_coordinator(party, holders, c["t"], PREFIX, timeout=c.wait)
    plain = plain_result(cfg, len(_owners(party)))
    max_err = float(np.max(np.abs(rec.value - plain))) if plain.size else 0.0
    # the bound is on exact arithmetic; allow float64 rounding of the plain computation
    slack = 1e-12 * (1.0 + float(np.max(np.abs(plain))) if plain.size else 1.0)
    out = {"correct": max_err <= rec.err + slack, "max_err": max_err, "err_bound": rec.err,
           "frac_bits": rec.frac_bits, "max_abs_bound": rec.max_abs, "used": rec.used, "missing": rec.missing,
           "shape": list(rec.value.shape)}
    party.metric(max_err=max_err, err_bound=rec.err, holders_used=len(rec.used))
    party.log.info("reconstructed %s from %s: max error %.3g (bound %.3g)", rec.value.shape, rec.used, max_err,
                   rec.err)
    return out


ROLES = {OWNER: owner, HOLDER: holder, COORDINATOR: coordinator}


def declarations(s: Settings) -> list:
    # owner i has d_in + i columns
    return ss.declarations(PREFIX, OWNER, HOLDER, COORDINATOR, share_shape=(s.rows, None),
                           result_shape=(s.rows, s.d_out))


DECLARATIONS = declarations(Settings())
ALGORITHM = Algorithm(name=NAME, summary="Shamir-shared linear algebra: owners share, holders compute, "
                      "a coordinator reconstructs", roles=ROLES, load_data=load_data,
                      declarations=declarations, settings=Settings,
                      headline=("correct", "max_err"))
