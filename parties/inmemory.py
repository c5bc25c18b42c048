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

from . import contract, failure
from .api import Party, PartyAborted, PartyError, VirtualClock
from .checkpoint import Checkpoints
from .faults import Killed, raise_at
from .identity import PartyIdentity
from .model_store import TrainedPart
from .role import LOAD, run_role, trained_part


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
        self._identities: dict[str, PartyIdentity] | None = None  # made on first use (K = 1000: 1000 keys)

    def identity(self, name: str) -> PartyIdentity:
        """``name``'s fresh signing key, every party's pinned (the in-memory federation file's keys)."""
        if self._identities is None:
            self._identities = PartyIdentity.fresh(sorted(self.roles))
        return self._identities[name]

    def party(self, name: str, **kw: Any) -> InMemoryParty:
        kw.setdefault("identity", self.identity(name))
        p = InMemoryParty(self, name, run_id=self.run_id, **kw)
        self.parties[name] = p
        return p

    def abort(self, reason: str, peer: str | None = None, relayed_by: str | None = None) -> None:
        """Stop every party with ``peer``'s notice.  ``relayed_by``: a party the notice stopped passes
        it on as ``peer``'s, to every party but itself (``peer`` too: a forger gets its notice back)."""
        for p in self.parties.values():
            if p.name != (peer if relayed_by is None else relayed_by):
                p.abort(reason, peer)


class FederationFailed(PartyError):
    """One or more parties failed; ``failures`` maps party name to its error, ``records`` every
    stopped party (the aborted too) to its failure record, and ``verdict`` is what the launcher
    would conclude from them (:func:`fedhet.parties.failure.verdict`)."""

    def __init__(self, failures: dict[str, BaseException], tracebacks: dict[str, str],
                 records: dict[str, dict] | None = None):
        first = next(iter(failures))
        super().__init__(
            "party " + ", ".join(repr(n) for n in failures) + f" failed: {first}: {failures[first]}"
        )
        self.failures, self.tracebacks = failures, tracebacks
        self.records = dict(records or {})
        self.verdict = failure.verdict(self.records)


def run_inmemory(algorithm: Any, parties: list[tuple[str, str]], cfg: Any = None, seed: int = 0,
                 data: dict[str, Any] | None = None, device: str = "cpu", timeout: float = 120.0,
                 data_dir=None, party_data: dict[str, dict] | None = None, base_dir=None,
                 strict: bool = True, clock: str = "real", models: dict[str, TrainedPart] | None = None,
                 run_id: str | None = None, checkpoint_dir=None, checkpoint_every: int = 1, resume: bool = False,
                 kill: dict[str, int] | None = None, resumed: dict[str, int | None] | None = None
                 ) -> dict[str, Any]:
    """Run every role function of ``algorithm`` in its own thread; return name -> result.

    ``algorithm`` is a :class:`~fedhet.parties.contract.Algorithm`, a module exposing one, or
    an installed algorithm's name (:func:`~fedhet.parties.contract.installed_algorithm`).  ``cfg`` is
    the ``[algorithm]`` table (or an already parsed settings object).  Each party loads its
    own data through ``algorithm.load_data`` unless ``data`` gives it; ``party_data`` gives a
    party's own data-file spec, as the ``data`` key of its section in a federation file.
    With ``strict`` every party refuses messages its declarations do not allow, exactly as
    the process runtime does.  ``clock="virtual"`` runs receive timeouts on a
    :class:`~fedhet.parties.api.VirtualClock`: a timeout fires only when every party waits, so tests
    of dropouts, late and stalled parties do not depend on the machine's speed (role functions
    that wait in one thread at a time only).  ``models``, a dict, receives each party's trained part
    (what its role handed to ``save_model``, with the runtime's header) by name.

    Checkpoints: with ``checkpoint_dir`` each party writes them to ``checkpoint_dir/NAME`` (every
    ``checkpoint_every``-th step); ``resume=True`` goes on from the newest step every party holds
    there (give the first run's ``run_id``: roles may derive from it); ``kill`` (name -> step)
    ends a party's thread right after its checkpoint of that step, as a SIGKILL would end its
    process (:class:`fedhet.parties.faults.Killed`, reported in the FederationFailed): the others
    go on as far as they can without it, as they would as processes (with ``clock="virtual"`` that
    is exactly as far as the protocol lets them).  ``resumed``, a dict, receives the step each
    party went on from.
    """
    if resume and checkpoint_dir is None:
        raise ValueError("resume=True needs the checkpoint_dir of the run to resume")
    if clock not in ("real", "virtual"):
        raise ValueError(f"clock must be 'real' or 'virtual', got {clock!r}")
    vclock = VirtualClock() if clock == "virtual" else None
    algo = contract.installed_algorithm(algorithm) if isinstance(algorithm, str) else contract.from_module(algorithm)
    if cfg is None or isinstance(cfg, dict):   # a table (else settings already parsed)
        cfg = dict(cfg or {})
        cfg.setdefault("seed", seed)
    settings, declared, sizes = contract.prepare(algo, cfg)
    roles = dict(parties)
    if len(roles) != len(parties):
        raise ValueError("party names must be unique")
    algo.check_roles(roles)
    hub = InMemoryHub(roles, run_id)
    stores: dict[str, Checkpoints] = {}
    for name, _ in parties:
        p = hub.party(name, seed=seed, device=device, timeout=timeout, declarations=declared if strict else None,
                      sizes=sizes, clock=vclock, incarnation=1 if resume else 0)
        if checkpoint_dir is not None:
            stores[name] = p.checkpoints = Checkpoints(f"{checkpoint_dir}/{name}")
            p.checkpoint_every = checkpoint_every
            p.after_checkpoint = raise_at(kill or {}, name)
        if vclock is not None:
            vclock.start(name)   # every party is live before any thread can wait
    results: dict[str, Any] = {}
    failures: dict[str, BaseException] = {}
    records: dict[str, dict] = {}
    aborted: dict[str, BaseException] = {}   # stopped by an abort notice (a forged one, too)
    tbs: dict[str, str] = {}

    def body(name: str, role: str) -> None:
        try:
            results[name] = run_role(algo, settings, hub.parties[name], parties,
                                     data_dir=None if data_dir is None else str(data_dir),
                                     data_spec=(party_data or {}).get(name),
                                     base_dir=None if base_dir is None else str(base_dir),
                                     data=data[name] if data is not None and name in data else LOAD,
                                     resume=stores[name].offer() if resume and name in stores else None)
            part = trained_part(algo, settings, hub.parties[name])
            if models is not None and part is not None:
                models[name] = part
            if resumed is not None:
                resumed[name] = hub.parties[name].resumed_from
        except Killed as e:   # a SIGKILL sends no notice: the others find out by waiting for it
            failures[name] = e
            tbs[name] = ""
        except BaseException as e:  # noqa: BLE001 - reported to the caller
            records[name] = failure.record(e, name, role, transport=hub.parties.get(name))
            if not isinstance(e, PartyAborted):
                failures[name] = e
                tbs[name] = traceback.format_exc()
                hub.abort(f"party {name!r} failed: {e}", name)
            else:
                # stopped by a notice: the hub passes that notice on as its sender's, never as this
                # party's own (a party process sends none then; one in its name would read as forged)
                aborted[name] = e
                hub.abort(str(e), e.peer, relayed_by=name)
        finally:
            if vclock is not None:
                vclock.finish(name)

    threads = [threading.Thread(target=body, args=(n, r), name=f"party-{n}", daemon=True) for n, r in parties]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise FederationFailed(failures, tbs, records)
    if aborted:   # only notices stopped parties: no result may pass for a whole run's
        raise FederationFailed(aborted, tbs, records)
    return results
