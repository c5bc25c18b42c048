"""The job's roles: the server times each round of the aggregator and compares its sum and mean with the
exact ones over the clients it counted; each client submits its vector and reports its CPU seconds and bytes
per round.

Dropouts (setting ``dropouts``): in every timed round (never in the warm-up round 0) the clients of
:func:`~fedhet.algorithms.secagg_job.data.dropout_plan` vanish after their step, through the protocol's own
:class:`~fedhet.protocols.secagg_client.Faults`; the server finds each by its per-step timeout.  A client
that vanished still reports its CPU seconds and bytes (``bench/done``) and takes part in the next round,
so the server gathers every client's report, as without dropouts.  The warm-up round waits each step at
least the federation's timeout (:func:`warmup_settings`): it sets up the transport's connections and the
clients' identity keys, which at K = 100 can take longer than the few seconds a timed round with dropouts
wants to wait per step, and no client drops out in it.

Checkpoint step k: k rounds done (the server keeps its report of each; a client keeps nothing).  A round
cut by a kill is run again after the resume with fresh keys, seeds and masks: the aggregator draws them
from the OS for every run of a round, and none of them is checkpointed."""
from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from fedhet.algorithms.secagg_job.data import client_names, dropout_plan, exact_sum
from fedhet.algorithms.secagg_job.messages import CLIENT, SERVER, Kind
from fedhet.algorithms.secagg_job.settings import DEFAULTS, Settings
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.secagg import STEPS, Faults


def warmup_settings(s: Settings, party_timeout: float) -> AggregationSettings:
    """The warm-up round's aggregation settings: the run's, each step waiting at least ``party_timeout``."""
    a = s.agg.over(DEFAULTS)
    step = aggregation.secagg_config(a).timeout if a.method == "secure" else a.aggregation_timeout
    wait = max(float(party_timeout), step or 0.0)
    return replace(a, aggregation_timeout=wait, secagg_timeout=wait)


def server(party: PartyLike, s: Settings, data: dict) -> list:
    clients = party.peers_with_role(CLIENT)
    if set(clients) != set(client_names(s.n_clients)):
        raise ValueError(f"secagg_bench: n_clients = {s.n_clients} needs the clients {client_names(s.n_clients)}, "
                         f"the federation has {sorted(clients)}")
    warmup = aggregation.make_aggregator(warmup_settings(s, party.timeout))
    timed = aggregation.make_aggregator(s.agg, DEFAULTS)
    start, saved = party.restore()
    out: list = saved.get("rounds", [])
    for r in range(start, s.bench_rounds + 1):
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        party.broadcast(Kind.GO, r, to=clients)
        go_s = time.perf_counter() - t0
        res = (timed if r else warmup).aggregate(party, clients, r)
        wall, cpu, pcpu = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0
        done = party.gather(Kind.DONE, frm=clients)
        total, weight = exact_sum(data["xs"], data["ws"], res.contributors)  # over the clients counted
        out.append({"wall": wall, "go_s": go_s, "server_cpu": cpu, "server_pcpu": pcpu, "clients": done,
                    "steps_s": {k: v["seconds"] for k, v in res.details.get("steps", {}).items()},
                    "max_err": float(np.max(np.abs(res.mean - total / weight))),
                    "bound": float(res.mean_error_bound), "contributors": len(res.contributors),
                    "dropped": list(res.dropped), "sum_err": float(np.max(np.abs(res.sum - total))),
                    "sum_bound": float(res.sum_error_bound)})
        party.checkpoint(r + 1, {"rounds": out})
    return out


def client(party: PartyLike, s: Settings, data: dict) -> dict:
    step = dropout_plan(s).get(party.name)
    faults = None if step is None else {r: Faults(stop_after=step) for r in range(1, s.bench_rounds + 1)}
    agg = aggregation.make_aggregator(s.agg, DEFAULTS, faults=faults)
    srv = party.peer_with_role(SERVER)
    # The next round's start comes once the server has timed out this round's dropouts: at most one wait
    # of its per-step timeout for every step, on top of the party's own timeout.
    per_step = aggregation.secagg_config(s.agg.over(DEFAULTS)).timeout if s.dropouts else 0.0
    go_timeout = party.timeout + len(STEPS) * (party.timeout if per_step is None else per_step)
    start, _ = party.restore()
    for r in range(start, s.bench_rounds + 1):
        party.recv(srv, Kind.GO, timeout=go_timeout)
        s0, r0 = sum(party.bytes_sent.values()), sum(party.bytes_received.values())
        c0, p0 = time.thread_time(), time.process_time()
        agg.submit(party, srv, data["x"], data["w"], r)   # status "stopped" where the plan drops this client
        cpu, pcpu = time.thread_time() - c0, time.process_time() - p0
        party.send(srv, Kind.DONE, {"cpu": cpu, "pcpu": pcpu, "up": sum(party.bytes_sent.values()) - s0,
                                    "down": sum(party.bytes_received.values()) - r0})
        party.checkpoint(r + 1, {})
    return {}


ROLES = {SERVER: server, CLIENT: client}
