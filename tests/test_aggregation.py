"""The aggregator interface (protocols/aggregation.py): plain and secure behind one call, and FedAvg on both."""
from __future__ import annotations

from dataclasses import replace

import types

import numpy as np
import pytest

from fedhet.parties import declare as decl
from fedhet.parties import federation
from fedhet.parties.ops import presets
from fedhet.parties.audit import audit
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import launch
from fedhet.protocols import aggregation, secagg
from fedhet.protocols.aggregation import (AggregationError, Kind, PlainAggregator, SecureAggregator,
                                          make_aggregator)
from fedhet.protocols.aggregation_settings import AggregationSettings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

CLIENTS = [f"c{i}" for i in range(5)]
NOTED: dict = {}   # the server party's exclusions after federate() (what result.json records)


def federate(cfg, xs, ws, rounds=(0,), late=None):
    """The same role functions for every method: only ``cfg`` differs.  ``late``: (client, round, seconds)."""

    def server(party, c, d):
        agg = make_aggregator(AggregationSettings(**cfg))
        out = []
        for i, r in enumerate(rounds):
            if i:
                party.gather("test/ready", frm=CLIENTS)
            out.append(agg.aggregate(party, CLIENTS, r))
        NOTED["exclusions"] = list(party.exclusions)
        return out

    def client(party, c, d):
        agg = make_aggregator(AggregationSettings(**cfg))
        for i, r in enumerate(rounds):
            if i:
                party.send("server", "test/ready", None)
            if late and late[:2] == (party.name, r):
                party.sleep(late[2])   # on the virtual clock: late by protocol time, not by luck
            agg.submit(party, "server", xs[party.name][i], ws[party.name], r)
        return {}

    algo = types.SimpleNamespace(NAME="agg-test", ROLES={"server": server, "client": client},
                                 load_data=lambda *a: None)
    out = run_inmemory(algo, [("server", "server")] + [(c, "client") for c in CLIENTS], timeout=30, clock="virtual")
    return out["server"]


def data(seed, m=500, rounds=1):
    rng = np.random.default_rng(seed)
    xs = {c: [rng.uniform(-3, 3, m) for _ in range(rounds)] for c in CLIENTS}
    ws = {c: float(rng.integers(1, 200)) for c in CLIENTS}
    return xs, ws


def exact_mean(xs, ws, who, i=0):
    return sum(ws[c] * xs[c][i] for c in who) / sum(ws[c] for c in who)


@pytest.mark.unit
def test_make_aggregator_chooses_by_configuration():
    A = AggregationSettings
    assert isinstance(make_aggregator(), SecureAggregator)  # secure by default
    assert isinstance(make_aggregator(A(aggregation="plain")), PlainAggregator)
    sec = make_aggregator(A(aggregation="secure", secagg_graph="harary", secagg_ring_bits=64, aggregation_timeout=3))
    assert (sec.config.graph, sec.config.ring_bits, sec.config.timeout) == ("harary", 64, 3.0)
    # the run's keys over the algorithm's defaults
    assert make_aggregator(A(plain_dtype="float32"), A(aggregation="plain")).dtype == np.float32
    assert isinstance(make_aggregator(A(aggregation="secure"), A(aggregation="plain")), SecureAggregator)
    clipped = make_aggregator(A(), A(secagg_clip=2.0, secagg_max_weight=5))
    assert (clipped.config.clip, clipped.config.max_weight) == (2.0, 5.0)
    with pytest.raises(ValueError, match="aggregation must be one of"):
        make_aggregator(A(aggregation="homomorphic"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="plain_dtype"):
        make_aggregator(A(aggregation="plain", plain_dtype="int8"))  # type: ignore[arg-type]


@pytest.mark.parametrize("cfg", [
    {"aggregation": "plain"},
    {"aggregation": "plain", "plain_dtype": "float32"},
    {"aggregation": "secure", "secagg_max_weight": 200.0},
    {"aggregation": "secure", "secagg_max_weight": 200.0, "secagg_graph": "harary", "secagg_degree": 2},
])
def test_every_method_gives_the_weighted_mean_within_its_bound(cfg):
    xs, ws = data(1)
    (res,) = federate(cfg, xs, ws)
    want = exact_mean(xs, ws, CLIENTS)
    assert res.method == cfg["aggregation"] and res.contributors == CLIENTS
    assert res.weight == pytest.approx(sum(ws.values()), abs=res.sum_error_bound)
    assert np.max(np.abs(res.mean - want)) <= res.mean_error_bound + 1e-12
    if cfg.get("plain_dtype", "float64") == "float64" and cfg["aggregation"] == "plain":
        assert res.mean_error_bound == 0.0
    else:
        assert 0 < res.mean_error_bound < 1e-5


@pytest.mark.parametrize("method", ["plain", "secure"])
def test_a_late_client_is_left_out_and_its_stale_update_ignored(method):
    xs, ws = data(2, m=50, rounds=2)
    cfg = {"aggregation": method, "aggregation_timeout": 0.4, "secagg_max_weight": 200.0}
    r0, r1 = federate(cfg, xs, ws, rounds=(0, 1), late=("c3", 0, 1.0))
    assert r0.dropped == ["c3"] and r1.dropped == []
    # issue 43, item 7: the round that went on without c3 says so, with the reason (result.json)
    (ex,) = NOTED["exclusions"]
    assert ex["round"] == 0 and ex["step"] == f"{method} aggregation" and "c3" not in ex["contributors"]
    assert list(ex["excluded"]) == ["c3"] and ("silent" in ex["excluded"]["c3"] or "dropped" in ex["excluded"]["c3"])
    assert np.max(np.abs(r0.mean - exact_mean(xs, ws, [c for c in CLIENTS if c != "c3"], 0))) <= \
        r0.mean_error_bound + 1e-12
    assert np.max(np.abs(r1.mean - exact_mean(xs, ws, CLIENTS, 1))) <= r1.mean_error_bound + 1e-12


def test_no_update_at_all_is_an_error():
    def server(party, c, d):
        return PlainAggregator(timeout=0.2).aggregate(party, ["c0"], 0)

    algo = types.SimpleNamespace(NAME="t", ROLES={"server": server, "client": lambda p, c, d: {}},
                                 load_data=lambda *a: None)
    with pytest.raises(Exception) as e:
        run_inmemory(algo, [("server", "server"), ("c0", "client")])
    assert isinstance(e.value.failures["server"], AggregationError)


@pytest.mark.unit
def test_a_plain_update_in_a_secure_run_fails_its_declaration():
    def declared(cfg):
        return {d.kind: d for d in aggregation.declarations(31, 31, AggregationSettings(**cfg))}

    assert Kind.PLAIN not in declared({"aggregation": "secure"})  # undeclared: refused on receipt, fails the audit
    assert Kind.PLAIN not in declared({})  # secure is the default
    assert secagg.Kind.MASKED not in declared({"aggregation": "plain"})
    plain = declared({"aggregation": "plain"})[Kind.PLAIN]
    assert decl.check_record(plain, [("x", "<f8", (31,))]) is None
    assert "31" in decl.check_record(plain, [("x", "<f8", (30,))])
    f32 = declared({"aggregation": "plain", "plain_dtype": "float32"})[Kind.PLAIN]
    assert "where <f4 is declared" in decl.check_record(f32, [("x", "<f8", (31,))])
    assert {Kind.PLAIN, secagg.Kind.MASKED} <= {d.kind for d in aggregation.declarations()}  # no settings: both


def test_fedavg_in_memory_plain_and_secure_agree():
    parties = [("server", "server"), ("c1", "client"), ("c2", "client"), ("c3", "client")]
    p = run_inmemory("fedavg_logreg", parties, {"rounds": 10, "aggregation": "plain"}, seed=5)
    s = run_inmemory("fedavg_logreg", parties, {"rounds": 10, "aggregation": "secure"}, seed=5)
    s2 = run_inmemory("fedavg_logreg", parties, {"rounds": 10, "secagg_graph": "harary"}, seed=5)
    assert s["server"]["aggregation"] == "secure" and p["server"]["aggregation"] == "plain"
    assert s["server"]["test_accuracy"] == p["server"]["test_accuracy"] > 0.9
    # quantisation errors of ~1e-7 per round stay small through 10 rounds of training
    assert np.max(np.abs(np.subtract(s["server"]["weights"], p["server"]["weights"]))) < 1e-5
    # the unmasked sum is exact: fresh random masks, the same bits
    assert s["server"]["weights"] == s2["server"]["weights"]
    assert all(s[c]["weights"] == s["server"]["weights"] for c in ("c1", "c2", "c3"))


@pytest.mark.processes
@pytest.mark.smoke   # make test's process run of this family
def test_fedavg_as_processes_plain_and_secure_reach_the_same_accuracy_and_secure_passes_the_audit(tmp_path):
    fed = replace(federation.load(presets.path("demo")), hosts=1)   # one host process: one torch import
    runs = {}
    for method in ("plain", "secure"):
        summary = launch(fed, run_dir=tmp_path / method, progress=False, overrides={"aggregation": method})
        assert summary["ok"]
        runs[method] = summary["parties"]["server"]["result"]
    assert runs["secure"]["aggregation"] == "secure" and runs["plain"]["aggregation"] == "plain"
    assert runs["secure"]["test_accuracy"] == runs["plain"]["test_accuracy"] > 0.9

    rep = audit(tmp_path / "secure")
    assert rep.ok, rep.problems
    kinds = {row["kind"] for row in rep.table if row["sent"]}
    assert {"secagg/keys", "secagg/shares", "secagg/masked", "secagg/unmask"} <= kinds
    assert Kind.PLAIN not in kinds  # the server never received a vector in the clear
    assert audit(tmp_path / "plain").ok

    # The same seed in memory gives bit-identical weights to the ZeroMQ run.
    parties = [(p.name, p.role) for p in fed.parties]
    mem = run_inmemory("fedavg_logreg", parties, dict(fed.algorithm_cfg(), aggregation="secure"), seed=fed.seed)
    assert mem["server"]["weights"] == runs["secure"]["weights"]
