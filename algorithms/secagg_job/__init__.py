"""Secure aggregation as a runnable job: K clients aggregate seeded random vectors, timed per round.

Not a learning algorithm: it runs :mod:`fedhet.protocols.aggregation` (plain, secure, SecAgg+)
through ``fedhet run`` and ``fedhet audit`` (preset ``secagg``), and is what
``benchmarks/secagg.py`` times as processes.  Client ``c`` holds ``x_c`` uniform in [-1, 1]^m and
a weight ``w_c`` in 1..100 drawn from ``input_seed``; the server computes the weighted mean
through the aggregator and, since the inputs are synthetic, compares it with the exact mean
``sum_c w_c clip(x_c) / sum_c w_c`` (the test oracle, not part of the protocol), and its sum with
the exact ``sum_c w_c clip(x_c)``, both over the clients the aggregator counted.  Each of the
``bench_rounds + 1`` rounds (the first a warm-up) is timed at the server; clients report their
CPU seconds (the party's thread and, meaningful when every party is its own process, its whole
process with the transport's threads) and bytes per round.

With ``dropouts = D`` (secure aggregation only), D clients vanish mid-round in every timed round,
each after the step :func:`dropout_plan` gives it (from ``input_seed``); a client that vanished
after sending its masked input still counts.  The server's record of each round: ``wall``,
``server_cpu``, ``server_pcpu``, ``clients`` (each client's report), ``steps_s``, ``contributors``
(how many clients are in the sum), ``dropped`` (the names of those that are not), ``max_err`` and
``bound`` (the mean's largest coordinate error and its bound), ``sum_err`` and ``sum_bound`` (the
sum's).  Modules: :mod:`.settings`, :mod:`.data` (the inputs, the exact sum and mean, the dropout
plan), :mod:`.messages`, :mod:`.roles`.
"""

from __future__ import annotations

from fedhet.algorithms.secagg_job.data import (DROP_STEPS, client_names, dropout_plan, exact_mean, exact_sum, load_data,
                                               make_inputs)
from fedhet.algorithms.secagg_job.messages import Kind, declarations
from fedhet.algorithms.secagg_job.roles import ROLES
from fedhet.algorithms.secagg_job.settings import CLIP, MAX_WEIGHT, NAME, Settings
from fedhet.parties.contract import Algorithm

__all__ = ["ALGORITHM", "CLIP", "DROP_STEPS", "Kind", "MAX_WEIGHT", "NAME", "Settings", "client_names", "declarations",
           "dropout_plan", "exact_mean", "exact_sum", "load_data", "make_inputs"]

ALGORITHM = Algorithm(name=NAME, summary="secure aggregation of seeded random vectors, timed per round",
                      roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings)
