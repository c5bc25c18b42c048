"""Shamir-shared linear algebra as a runnable job: owners share, holders compute, a coordinator reconstructs.

Not a learning algorithm: it exercises ``fedhet.protocols.shamir_share``
through ``fedhet run`` and ``fedhet audit`` (preset ``shamir``), in the shape
F³'s fusion step has (ALGORITHMS.md, F³; modules :mod:`.settings`, :mod:`.data`, :mod:`.messages`,
:mod:`.roles`): owner i holds a matrix X_i
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

from fedhet.algorithms.shamir_job.data import load_data, owner_matrix, plain_result, public_matrix
from fedhet.algorithms.shamir_job.messages import COORDINATOR, HOLDER, OWNER, Kind, declarations
from fedhet.algorithms.shamir_job.roles import ROLES
from fedhet.algorithms.shamir_job.settings import NAME, Settings
from fedhet.parties.contract import Algorithm

__all__ = ["ALGORITHM", "COORDINATOR", "HOLDER", "Kind", "OWNER", "Settings", "declarations", "load_data",
           "owner_matrix", "plain_result", "public_matrix"]

ALGORITHM = Algorithm(name=NAME, summary="Shamir-shared linear algebra: owners share, holders compute, "
                      "a coordinator reconstructs", roles=ROLES, load_data=load_data,
                      declarations=declarations, settings=Settings,
                      headline=("correct", "max_err"))
