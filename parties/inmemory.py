"""In-memory transport: every party a thread in one process.

Messages go through exactly the same codec, sequence numbers and checks as on
ZeroMQ (the frames are copied to bytes, as a socket would), so a role function
gives bit-identical results under both; this transport exists for fast tests
and for sweeps over many seeds.
"""
from __future__ import annotations

import threading
import traceback
import uuid
from typing import Any

from .api import Party, PartyAborted, PartyError


class InMemoryParty(Party):
    def __init__(self, hub: "InMemoryHub", name: str, **kw: Any) -> None:
        super().__init__(name, hub.roles, **kw)
        self._hub = hub

    def _transport_send(self, to: str, frames: list) -> None:
        # The receiving side authenticates the sender by which object called it,
        # the in-memory analogue of CURVE's proven key.
        self._hub.parties[to]._deliver([bytes(f) for f in frames], authenticated=self.name)


class InMemoryHub:
    def __init__(self, roles: dict[str, str], run_id: str | None = None) -> None:
        self.roles = dict(roles)
        self.run_id = run_id or uuid.uuid4().hex
        self.parties: dict[str, InMemoryParty] = {}

    def party(self, name: str, **kw: Any) -> InMemoryParty:
        p = InMemoryParty(self, name, run_id=self.run_id, **kw)
        self.parties[name] = p
        return p

    def abort(self, reason: str) -> None:
        for p in self.parties.values():
            p.abort(reason)


class FederationFailed(PartyError):
    """One or more parties failed; ``failures`` maps party name to its error."""

    def __init__(self, failures: dict[str, BaseException], tracebacks: dict[str, str]):
        first = next(iter(failures))
        super().__init__(
            "party " + ", ".join(repr(n) for n in failures) + f" failed: {first}: {failures[first]}"
        )
        self.failures, self.tracebacks = failures, tracebacks


def run_inmemory(algorithm: Any, parties: list[tuple[str, str]], cfg: dict | None = None, seed: int = 0,
                 data: dict[str, Any] | None = None, device: str = "cpu", timeout: float = 120.0,
                 data_dir=None) -> dict[str, Any]:
    """Run every role function of ``algorithm`` in its own thread; return name -> result.

    ``algorithm`` is an algorithm module (or its registered name).  Each party
    loads its own data through ``algorithm.load_data`` unless ``data`` gives it.
    """
    from fedhet.algorithms.registry import get_algorithm

    algo = get_algorithm(algorithm) if isinstance(algorithm, str) else algorithm
    cfg = dict(cfg or {})
    cfg.setdefault("seed", seed)
    roles = dict(parties)
    if len(roles) != len(parties):
        raise ValueError("party names must be unique")
    for name, role in parties:
        if role not in algo.ROLES:
            raise ValueError(f"party {name!r} has role {role!r}, which {algo.NAME} does not have "
                             f"(roles: {sorted(algo.ROLES)})")
    hub = InMemoryHub(roles)
    for name, _ in parties:
        hub.party(name, seed=seed, device=device, timeout=timeout)
    results: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}
    tbs: dict[str, str] = {}
    index = _role_index(parties)

    def body(name: str, role: str) -> None:
        try:
            d = data[name] if data is not None and name in data else algo.load_data(
                cfg, name, role, index[name][0], index[name][1], data_dir)
            results[name] = algo.ROLES[role](hub.parties[name], cfg, d)
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            if not isinstance(e, PartyAborted):
                failures[name] = e
                tbs[name] = traceback.format_exc()
            hub.abort(f"party {name!r} failed: {e}")

    threads = [threading.Thread(target=body, args=(n, r), name=f"party-{n}", daemon=True) for n, r in parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise FederationFailed(failures, tbs)
    return results


def _role_index(parties: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """name -> (position among parties of its role, number of parties of that role)."""
    counts: dict[str, int] = {}
    pos: dict[str, int] = {}
    for name, role in parties:
        pos[name] = counts.get(role, 0)
        counts[role] = pos[name] + 1
    return {name: (pos[name], counts[role]) for name, role in parties}
