"""The PSI job's message kinds: those of the PSI backend its settings choose; the job adds none."""
from __future__ import annotations

from fedhet.algorithms.psi_job.settings import Settings
from fedhet.parties.declare import MessageDecl
from fedhet.protocols import psi

LABEL_OWNER, FEATURE = "label_owner", "feature"


class Kind:
    """The job's own kinds: none.  Every message is one of the chosen PSI protocol's
    (:mod:`fedhet.protocols.psi.ecdh` for ``psi_backend = "ecdh"``, :mod:`fedhet.protocols.psi.kkrt` for "kkrt",
    :mod:`fedhet.protocols.psi.rr22` for "rr22"),
    declared and schema-checked there."""


def declarations(s: Settings) -> list[MessageDecl]:
    """The chosen backend's kinds, for this job's role names (the other backends' are refused on receipt)."""
    return psi.declarations(LABEL_OWNER, FEATURE, backend=s.psi_backend)
