"""PSI as a runnable job: one label owner and feature parties intersect synthetic ID sets.

Not a learning algorithm: it exercises ``fedhet.protocols.psi`` through
``fedhet run`` and ``fedhet audit`` (preset ``psi``).  Modules: :mod:`.settings`, :mod:`.data` (the ID
sets), :mod:`.messages` (the backend's kinds), :mod:`.roles`.  Each party builds its
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

Other keys: ``psi_backend`` ("ecdh", the default; "kkrt": OT-extension PSI,
``fedhet.protocols.psi.kkrt``; "rr22": OKVS + silent VOLE,
``fedhet.protocols.psi.rr22``; "auto": the label owner's choice by its size,
``fedhet.protocols.psi.choose_backend``, the result's ``psi_backend`` names it), ``reveal``, ``order``, ``chunk``, ``workers`` (see
``fedhet.protocols.psi``) and ``psi_timeout`` (seconds to wait for any one
PSI message; default the federation's timeout; the waits include the peer's
computation, so raise it for sets of millions of IDs on a busy machine).
"""

from __future__ import annotations

from fedhet.algorithms.psi_job.data import expected_common, ids_digest, load_data
from fedhet.algorithms.psi_job.messages import FEATURE, LABEL_OWNER, Kind, declarations
from fedhet.algorithms.psi_job.roles import ROLES
from fedhet.algorithms.psi_job.settings import NAME, Settings
from fedhet.parties.contract import Algorithm

__all__ = ["ALGORITHM", "FEATURE", "Kind", "LABEL_OWNER", "Settings", "declarations", "expected_common", "ids_digest",
           "load_data"]

ALGORITHM = Algorithm(name=NAME, summary="private set intersection of synthetic ID sets (ECDH, KKRT16 or RR22 PSI)",
                      roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings,
                      headline=("size", "correct"))
