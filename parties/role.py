"""One party's part of a run, whatever the transport: its context, its data, its role.

Both runners call :func:`run_role` once per party, with the settings that
:func:`~fedhet.parties.contract.prepare` parsed: the process runtime
(:class:`fedhet.parties.runtime.PartyRun`, on a ZeroMQ party) and the in-memory runner
(:func:`fedhet.parties.inmemory.run_inmemory`, one thread per party).  What each does
around it (keys, transport, result files, failure records, aborts) is its own.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from .api import PeerRestarted
from .contract import Algorithm, PartyContext, PartyLike, role_index, settings_table
from .model_store import TrainedPart

LOAD = object()  # run_role's ``data`` default: the party loads its own through the algorithm


def run_role(algorithm: Algorithm, settings: Any, party: PartyLike, parties: Sequence[tuple[str, str]], *,
             data_dir: str | None = None, data_spec: Mapping[str, Any] | None = None,
             base_dir: str | None = None, data: Any = LOAD,
             stage: Callable[[str], None] | None = None, resume: Mapping[int, str] | None = None) -> Any:
    """Run ``party``'s role of ``algorithm`` to its result.

    ``parties``: every ``(name, role)`` of the federation, in its order (a party's index among
    those of its role is its position there); ``data_dir``, ``data_spec`` (the party's own
    ``[[party]] data``), ``base_dir``: what :class:`~fedhet.parties.contract.PartyContext` tells
    ``load_data``; ``data``: the party's data, given (tests), instead of loaded; ``stage``: called
    with "data loaded" and "role finished" as each step ends; ``resume``: on a resumed run, the
    checkpoints this party holds (step -> SHA-256): the parties agree on the step to go on from
    (:meth:`~fedhet.parties.api.Party.agree_resume`) before the role starts, which then
    restores it (:meth:`~fedhet.parties.api.Party.restore`).  When a peer restarts alone within
    the restart grace period (:class:`~fedhet.parties.api.PeerRestarted`), the role is stopped where it
    is and run again from the checkpoint the parties agree on then.
    """
    index, n_of_role = role_index(parties)[party.name]
    if data is LOAD:
        ctx = PartyContext(name=party.name, role=party.role, index=index, n_of_role=n_of_role, data_dir=data_dir,
                           data=data_spec, base_dir=base_dir, device=party.device)
        data = algorithm.load_data(settings, ctx)
    if stage is not None:
        stage("data loaded")
    while True:
        try:
            if resume is not None:
                party.agree_resume(resume)
                if stage is not None:
                    stage("resume agreed")
            result = algorithm.roles[party.role](party, settings, data)
            break
        except PeerRestarted as restarted:   # a peer died and came back: back to a common checkpoint
            resume = party.begin_restart(restarted)
    if stage is not None:
        stage("role finished")
    return result


def trained_part(algorithm: Algorithm, settings: Any, party: Any,
                 fingerprint: Mapping[str, Any] | None = None) -> TrainedPart | None:
    """What ``party``'s role handed to ``save_model``, with the runtime's header (algorithm, party,
    role, run, the federation's fingerprint, the settings); None when it saved none."""
    part: TrainedPart | None = getattr(party, "trained", None)
    if part is None:
        return None
    part.header = {"algorithm": algorithm.name, "party": party.name, "role": party.role, "run_id": party.run_id,
                   "fingerprint": fingerprint, "settings": settings_table(settings), "device": party.device}
    return part
