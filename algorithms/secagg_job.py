"""Secure aggregation as a runnable job: K clients aggregate seeded random vectors, timed per round.

Not a learning algorithm: it runs :mod:`fedhet.protocols.aggregation` (plain, secure, SecAgg+)
through ``fedhet run`` and ``fedhet audit`` (preset ``secagg``), and is what
``benchmarks/secagg.py`` times as processes.  Client ``c`` holds ``x_c`` uniform in [-1, 1]^m and
a weight ``w_c`` in 1..100 drawn from ``input_seed``; the server computes the weighted mean
through the aggregator and, since the inputs are synthetic, compares it with the exact mean
``sum_c w_c clip(x_c) / sum_c w_c`` (the test oracle, not part of the protocol).  Each of the
``bench_rounds + 1`` rounds (the first a warm-up) is timed at the server; clients report their
CPU seconds (the party's thread and, meaningful when every party is its own process, its whole
process with the transport's threads) and bytes per round.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from fedhet.parties import schema as sch
from fedhet.parties.contract import Algorithm, PartyContext
from fedhet.parties.declare import declare, no_arrays
from fedhet.parties.settings import TableView, setting
from fedhet.protocols import aggregation
from fedhet.protocols.aggregation_settings import AggregationSettings

NAME = "secagg_bench"
K_GO, K_DONE = "bench/go", "bench/done"
CLIP, MAX_WEIGHT = 4.0, 100.0
DEFAULTS = {"aggregation": "secure", "secagg_clip": CLIP, "secagg_max_weight": MAX_WEIGHT}


@dataclass(frozen=True)
class Settings(TableView):
    m: int = setting(1000, "vector length", lo=1)
    n_clients: int = setting(3, "K, the number of clients (the server's exact mean needs it)", lo=1)
    bench_rounds: int = setting(1, "timed rounds (one warm-up round more is run)", lo=1)
    input_seed: int = setting(0, "seeds the clients' vectors and weights", lo=0)
    seed: int = setting(0, "the federation's seed (unused: inputs come from input_seed)", lo=0)
    agg: AggregationSettings = setting(AggregationSettings(), flatten=True)


def client_names(k: int) -> list[str]:
    return [f"c{i:02d}" for i in range(k)]


def make_inputs(k: int, m: int, seed: int):
    rng = np.random.default_rng(seed)
    xs = {c: rng.uniform(-1, 1, m) for c in client_names(k)}
    ws = {c: float(rng.integers(1, int(MAX_WEIGHT) + 1)) for c in client_names(k)}
    return xs, ws


def exact_mean(xs, ws):
    return sum(ws[c] * np.clip(xs[c], -CLIP, CLIP) for c in xs) / sum(ws.values())


def load_data(s: Settings, ctx: PartyContext):
    """A client's vector and weight (clients are named c00, c01, ...); the server's: the exact mean."""
    xs, ws = make_inputs(s.n_clients, s.m, s.input_seed)
    if ctx.role == "server":
        return {"exact": exact_mean(xs, ws)}
    if ctx.name not in xs:
        raise ValueError(f"secagg_bench: clients must be named {client_names(s.n_clients)}, got {ctx.name!r}")
    return {"x": xs[ctx.name], "w": ws[ctx.name]}


def server(party, s: Settings, data) -> list:
    clients = party.peers_with_role("client")
    agg = aggregation.make_aggregator(s.agg.table(), DEFAULTS)
    out = []
    for r in range(s.bench_rounds + 1):
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        party.broadcast(K_GO, r, to=clients)
        res = agg.aggregate(party, clients, r)
        wall, cpu, pcpu = time.perf_counter() - t0, time.thread_time() - c0, time.process_time() - p0
        done = party.gather(K_DONE, frm=clients)
        out.append({"wall": wall, "server_cpu": cpu, "server_pcpu": pcpu, "clients": done,
                    "steps_s": {k: v["seconds"] for k, v in res.details.get("steps", {}).items()},
                    "max_err": float(np.max(np.abs(res.mean - data["exact"]))),
                    "bound": float(res.mean_error_bound), "contributors": len(res.contributors)})
    return out


def client(party, s: Settings, data) -> dict:
    agg = aggregation.make_aggregator(s.agg.table(), DEFAULTS)
    srv = party.peers_with_role("server")[0]
    for r in range(s.bench_rounds + 1):
        party.recv(srv, K_GO)
        s0, r0 = sum(party.bytes_sent.values()), sum(party.bytes_received.values())
        c0, p0 = time.thread_time(), time.process_time()
        agg.submit(party, srv, data["x"], data["w"], r)
        cpu, pcpu = time.thread_time() - c0, time.process_time() - p0
        party.send(srv, K_DONE, {"cpu": cpu, "pcpu": pcpu, "up": sum(party.bytes_sent.values()) - s0,
                                 "down": sum(party.bytes_received.values()) - r0})
    return {}


def declarations(s: Settings) -> list:
    return [
        declare(K_GO, "server", "client", "the round number (start signal)", no_arrays, payload=sch.Int(lo=0)),
        declare(K_DONE, "client", "server", "the client's CPU seconds (its thread, its process) and bytes in the "
                "round (scalars)", no_arrays,
                payload=sch.Fields({"cpu": sch.Float(), "pcpu": sch.Float(), "up": sch.Int(lo=0),
                                    "down": sch.Int(lo=0)})),
    ] + aggregation.declarations(int(s.m), int(s.m), s.agg.table(), DEFAULTS)


ROLES = {"server": server, "client": client}
ALGORITHM = Algorithm(name=NAME, summary="secure aggregation of seeded random vectors, timed per round",
                      roles=ROLES, load_data=load_data, declarations=declarations, settings=Settings)
