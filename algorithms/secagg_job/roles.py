"""The job's roles: the server times each round of the aggregator and compares its mean with the exact
one; each client submits its vector and reports its CPU seconds and bytes per round.

Checkpoint step k: k rounds done (the server keeps its report of each; a client keeps nothing).  A round
cut by a kill is run again after the resume with fresh keys, seeds and masks: the aggregator draws them
from the OS for every run of a round, and none of them is checkpointed."""
from __future__ import annotations

import time

import numpy as np

from fedhet.algorithms.secagg_job.messages import CLIENT, SERVER, Kind
from fedhet.algorithms.secagg_job.settings import DEFAULTS, Settings
from fedhet.parties.contract import PartyLike
from fedhet.protocols import aggregation


def server(party: PartyLike, s: Settings, data: dict) -> list:
    clients = party.peers_with_role(CLIENT)
    agg = aggregation.make_aggregator(s.agg, DEFAULTS)
    start, saved = party.restore()
    out: list = saved.get("rounds", [])
    for r in range(start, s.bench_rounds + 1):
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        party.broadcast(Kind.GO, r, to=clients)
        res = agg.aggregate(party, clients, r)
        wall, cpu, pcpu = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0
        done = party.gather(Kind.DONE, frm=clients)
        out.append({"wall": wall, "server_cpu": cpu, "server_pcpu": pcpu, "clients": done,
                    "steps_s": {k: v["seconds"] for k, v in res.details.get("steps", {}).items()},
                    "max_err": float(np.max(np.abs(res.mean - data["exact"]))),
                    "bound": float(res.mean_error_bound), "contributors": len(res.contributors)})
        party.checkpoint(r + 1, {"rounds": out})
    return out


def client(party: PartyLike, s: Settings, data: dict) -> dict:
    agg = aggregation.make_aggregator(s.agg, DEFAULTS)
    srv = party.peers_with_role(SERVER)[0]
    start, _ = party.restore()
    for r in range(start, s.bench_rounds + 1):
        party.recv(srv, Kind.GO)
        s0, r0 = sum(party.bytes_sent.values()), sum(party.bytes_received.values())
        c0, p0 = time.thread_time(), time.process_time()
        agg.submit(party, srv, data["x"], data["w"], r)
        cpu, pcpu = time.thread_time() - c0, time.process_time() - p0
        party.send(srv, Kind.DONE, {"cpu": cpu, "pcpu": pcpu, "up": sum(party.bytes_sent.values()) - s0,
                                    "down": sum(party.bytes_received.values()) - r0})
        party.checkpoint(r + 1, {})
    return {}


ROLES = {SERVER: server, CLIENT: client}
