"""Private set intersection between a label owner and feature parties (vertical FL).

Three backends with one API and one result (:class:`PSIResult`):

==================  ==================================================================
:mod:`.common`      message kinds and schemas, the argument checks, the agreed output
:mod:`.ecdh`        ECDH-PSI (X25519 blinding, streamed on a process pool): the default
:mod:`.kkrt`        KKRT16 (batched OPRF from OT extension): less CPU at large sizes
:mod:`.rr22`        RR22 class (OKVS + silent VOLE): the fewest bytes on the wire
==================  ==================================================================

``backend="auto"`` (the vertical algorithms' default): the label owner picks by its own number of IDs
(:func:`choose_backend`: rr22 from :data:`AUTO_RR22_FROM` IDs, ecdh below) and its first message, which
names the backend and its version, tells every feature party on ``"auto"`` which one to run.

:func:`psi_label_owner` and :func:`psi_feature_party` check their arguments
and hand the run to the backend every party of one intersection must name
alike; what each party learns is the same with all three (see the backends'
docstrings).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from fedhet.parties.contract import PartyLike

from . import ecdh, kkrt, rr22
from .common import (AUTO, AUTO_BACKENDS, AUTO_RR22_FROM, BACKENDS, CHOICES, DEFAULT_CHUNK, MAX_CHUNK, ORDERS, Kind,
                     PSIResult, as_id_list, check_backend, check_chunk, choose_backend, declarations, describe_backend,
                     feature_args, first_message, label_owner_args)
from .ecdh import match_rows

__all__ = ["psi_label_owner", "psi_feature_party", "prepare", "PSIResult", "Kind", "declarations", "DECLARATIONS",
           "BACKENDS", "ORDERS", "DEFAULT_CHUNK", "MAX_CHUNK", "check_backend", "check_chunk", "match_rows",
           "ecdh", "kkrt", "rr22", "AUTO", "AUTO_BACKENDS", "AUTO_RR22_FROM", "CHOICES", "choose_backend",
           "describe_backend"]


def psi_label_owner(party: PartyLike, ids: Iterable[Any], peers: Sequence[str], reveal_to_all: bool = True, *,
                    order: str = "sorted", chunk: int = DEFAULT_CHUNK, workers: int | None = None,
                    context: bytes = b"", timeout: float | None = None, backend: str = "ecdh") -> PSIResult:
    """Intersect this party's ``ids`` with every feature party in ``peers``.

    Returns the IDs common to all parties in the agreed ``order`` and this
    party's rows for them; with ``reveal_to_all`` the feature parties receive
    the same list.  ``workers``: worker processes for the scalar
    multiplications (None: every core once the sets are large enough, 0:
    inline; ECDH only).  ``context``: bytes that separate this intersection's
    hash domain from others (e.g. the ID namespace); sent to the peers.
    ``timeout``: seconds to wait for any one message (default: the party's);
    the waits include the peers' computation.  ``backend``: ``"ecdh"``,
    ``"kkrt"`` or ``"rr22"``; every party of one intersection must use the same, or ``"auto"``
    (:func:`choose_backend` of our number of IDs; feature parties on ``"auto"`` follow our first
    message).  The backend in force is the result's ``stats["backend"]``.
    """
    check_backend(backend, auto=True)
    peers, chunk, context = label_owner_args(party, peers, order, chunk, context)
    if backend == AUTO:
        ids = as_id_list(ids, f"label owner {party.name!r}")
        res = psi_label_owner(party, ids, peers, reveal_to_all, order=order, chunk=chunk, workers=workers,
                              context=context, timeout=timeout, backend=choose_backend(len(ids)))
        res.stats["backend_setting"] = AUTO
        return res
    if backend == "kkrt":
        return kkrt.label_owner(party, ids, peers, reveal_to_all, order=order, chunk=chunk, context=context,
                                timeout=timeout)
    if backend == "rr22":
        return rr22.label_owner(party, ids, peers, reveal_to_all, order=order, chunk=chunk, context=context,
                                timeout=timeout)
    return ecdh.label_owner(party, ids, peers, reveal_to_all, order=order, chunk=chunk, workers=workers,
                            context=context, timeout=timeout)


def prepare(backend: str) -> float:
    """Load what ``backend`` runs on before a first intersection and return the seconds it took.

    For ``"rr22"`` that is numba's one-time start and its cached kernels (about half a second in a
    fresh process, which would otherwise count in the first run's time); the others need nothing.
    """
    check_backend(backend, auto=True)
    return rr22.warm_up() if backend == "rr22" else 0.0


def psi_feature_party(party: PartyLike, ids: Iterable[Any], label_owner: str, *, chunk: int = DEFAULT_CHUNK,
                      workers: int | None = None, timeout: float | None = None, backend: str = "ecdh") -> PSIResult:
    """This feature party's side of :func:`psi_label_owner` (same ``backend`` as the label owner's).

    Returns the common IDs (in the label owner's agreed order) and this
    party's rows for them, or ``ids=None`` when the label owner keeps the
    result to itself.  ``"auto"``: run the backend the label owner's first message names (one of
    :data:`AUTO_BACKENDS`).
    """
    check_backend(backend, auto=True)
    chunk = feature_args(party, label_owner, chunk)
    first = None
    if backend == AUTO:
        first = first_message(party, label_owner, AUTO, timeout)
        backend = first[0]
    if backend == "kkrt":
        res = kkrt.feature_party(party, ids, label_owner, chunk=chunk, timeout=timeout)
    elif backend == "rr22":
        res = rr22.feature_party(party, ids, label_owner, chunk=chunk, timeout=timeout, first=first)
    else:
        res = ecdh.feature_party(party, ids, label_owner, chunk=chunk, workers=workers, timeout=timeout, first=first)
    if first is not None:
        res.stats["backend_setting"] = AUTO
    return res


DECLARATIONS = declarations()
