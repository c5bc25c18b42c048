"""Secure aggregation as a runnable job: K clients aggregate seeded random vectors, timed per round.

Not a learning algorithm: it runs :mod:`fedhet.protocols.aggregation` (plain, secure, SecAgg+)
through ``fedhet run`` and ``fedhet audit`` (preset ``secagg``), and is what
``benchmarks/secagg.py`` times as processes.  Client ``c`` holds ``x_c`` uniform in [-1, 1]^m and
a weight ``w_c`` in 1..100 drawn from ``input_seed``; the server computes the weighted mean
through the aggregator and, since the inputs are synthetic, compares it with the exact mean
``sum_c w_c clip(x_c) / sum_c w_c`` (the test oracle, not part of the protocol).  Each of the
``bench_rounds + 1`` rounds (the first a warm-up) is timed at the server; clients report their
CPU seconds (the party's thread and, meaningful when every party is its own process, its whole
process with the transport's threads) and bytes per round.  Modules: :mod:`.settings`, :mod:`.data` (the
inputs and the exact mean), :mod:`.messages`, :mod:`.roles`.
"""

from __future__ import annotations

from fedhet.algorithms.secagg_job.data import client_names, exact_mean, load_data, make_inputs
from fedhet.algorithms.secagg_job.messages import Kind, declarations
from fedhet.algorithms.secagg_job.roles import ROLES
from fedhet.algorithms.secagg_job.settings import CLIP, MAX_WEIGHT, NAME, Settings
from fedhet.parties.contract import Algorithm

__all__ = ["ALGORITHM", "CLIP", "Kind", "MAX_WEIGHT", "NAME", "Settings", "client_names", "declarations",
           "exact_mean", "load_data", "make_inputs"]

ALGORITHM = Algorithm(name=NAME, summary="secure aggregation of seeded random vectors, timed per round",
                      roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings)
