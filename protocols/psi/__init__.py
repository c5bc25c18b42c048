"""Private set intersection between a label owner and feature parties (vertical FL).

Three backends with one API and one result (:class:`PSIResult`):

==================  ==================================================================
:mod:`.common`      message kinds and schemas, the argument checks, the agreed output
:mod:`.ecdh`        ECDH-PSI (X25519 blinding, streamed on a process pool): the default
:mod:`.kkrt`        KKRT16 (batched OPRF from OT extension): less CPU at large sizes
:mod:`.rr22`        RR22 class (OKVS + silent VOLE): the fewest bytes on the wire
==================  ==================================================================

:func:`psi_label_owner` and :func:`psi_feature_party` check their arguments
and hand the run to the backend every party of one intersection must name
alike; what each party learns is the same with all three (see the backends'
docstrings).
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

from fedhet.parties.contract import PartyLike

from . import ecdh, kkrt, rr22
from .common import (BACKENDS, DEFAULT_CHUNK, MAX_CHUNK, ORDERS, Kind, PSIResult, check_backend, check_chunk,
                     declarations, feature_args, label_owner_args)
from .ecdh import match_rows

__all__ = ["psi_label_owner", "psi_feature_party", "prepare", "PSIResult", "Kind", "declarations", "DECLARATIONS",
           "BACKENDS", "ORDERS", "DEFAULT_CHUNK", "MAX_CHUNK", "check_backend", "check_chunk", "match_rows",
           "ecdh", "kkrt", "rr22"]


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
    ``"kkrt"`` or ``"rr22"``; every party of one intersection must use the same.
    """
    check_backend(backend)
    peers, chunk, context = label_owner_args(party, peers, order, chunk, context)
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
    check_backend(backend)
    return rr22.warm_up() if backend == "rr22" else 0.0


def psi_feature_party(party: PartyLike, ids: Iterable[Any], label_owner: str, *, chunk: int = DEFAULT_CHUNK,
                      workers: int | None = None, timeout: float | None = None, backend: str = "ecdh") -> PSIResult:
    """This feature party's side of :func:`psi_label_owner` (same ``backend`` as the label owner's).

    Returns the common IDs (in the label owner's agreed order) and this
    party's rows for them, or ``ids=None`` when the label owner keeps the
    result to itself.
    """
    check_backend(backend)
    chunk = feature_args(party, label_owner, chunk)
    if backend == "kkrt":
        return kkrt.feature_party(party, ids, label_owner, chunk=chunk, timeout=timeout)
    if backend == "rr22":
        return rr22.feature_party(party, ids, label_owner, chunk=chunk, timeout=timeout)
    return ecdh.feature_party(party, ids, label_owner, chunk=chunk, workers=workers, timeout=timeout)


DECLARATIONS = declarations()
