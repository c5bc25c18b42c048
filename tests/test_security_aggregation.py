"""Attacks on aggregation (issue 11, items 8 and 10), reproduced with the in-memory transport.

* A listed client sending NaN, or weights of 1e12, or a weight of 1e12: the plain server rejects the
  update naming the client, the round goes on with the honest clients, and the honest clients get
  the honest mean (before: NaN reached every client, or the attacker replaced the model).
* Plain and secure aggregation enforce the same public clipping bound on what an honest client sends.
* Secure aggregation: a client whose own input is not finite refuses it naming itself and becomes a
  dropout; a malformed message is rejected and its sender named.
* SecAgg+: the default degree and local threshold survive n - t random dropouts at K = 20 and K = 50
  (before: 6 dropouts of 20 already failed 2 rounds in 3), and a failure caused by pruning reports
  how many clients really answered.
"""
from __future__ import annotations

import types
import uuid

import numpy as np
import pytest

from fedhet.parties import schema as sch
from fedhet.parties.declare import declare
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.protocols import aggregation, secagg
from fedhet.protocols.aggregation import Kind as AggKind, make_aggregator
from fedhet.protocols.secagg import Faults, SecAggClient, SecAggConfig, SecAggServer, neighbours, prune
from fedhet.protocols.aggregation_settings import AggregationSettings

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

HONEST = ["c0", "c1", "c2", "c3"]
ATTACKER = "mallory"
M = 40


def honest_inputs(seed=0):
    rng = np.random.default_rng(seed)
    return {c: rng.uniform(-2, 2, M) for c in HONEST}, {c: float(rng.integers(1, 50)) for c in HONEST}


def plain_mean(xs, ws, who, clip=8.0):
    """The plain server's float64 computation, in its order (sorted clients)."""
    acc = np.zeros(M)
    for c in sorted(who):
        acc += np.clip(xs[c], -clip, clip) * ws[c]
    return acc / sum(ws[c] for c in who)


# Every payload is checked against the aggregators' schemas on receipt, as in a real run.
DECLARATIONS = aggregation.declarations() + [
    declare("test/model", "server", "client", "the aggregated mean",
            payload=sch.Fields({"mean": sch.Arr("<f8", (None,), finite=False)}))]


def federation(cfg, xs, ws, attack, timeout=30):
    """Server aggregates once and broadcasts the mean; honest clients refuse a non-finite model (as
    CHFL's clients do) and return it; ``attack(party, server)`` is what the attacker does instead of
    submitting honestly, and returns what it wants recorded."""
    clients = sorted(HONEST + [ATTACKER])

    def server(party, c, d):
        res = make_aggregator(AggregationSettings(**cfg)).aggregate(party, clients, 0)
        party.broadcast("test/model", {"mean": res.mean}, to=clients)
        return res

    def client(party, c, d):
        if party.name == ATTACKER:
            out = attack(party, "server")
            party.recv("server", "test/model")
            return out
        make_aggregator(AggregationSettings(**cfg)).submit(party, "server", xs[party.name], ws[party.name], 0)
        mean = party.recv("server", "test/model")["mean"]
        if not np.all(np.isfinite(mean)):
            raise ValueError(f"{party.name}: the global model is not finite")
        return mean

    algo = types.SimpleNamespace(NAME="agg-attack", ROLES={"server": server, "client": client},
                                 load_data=lambda *a: None, DECLARATIONS=DECLARATIONS)
    return run_inmemory(algo, [("server", "server")] + [(c, "client") for c in clients], timeout=timeout)


def raw_update(x, w=1.0, amax=0.0):
    """An attacker bypassing the aggregator's client code: it sends any payload it likes."""
    def attack(party, server):
        party.send(server, AggKind.PLAIN, {"r": 0, "x": np.asarray(x, dtype=np.float64), "w": w, "amax": amax})
        return "sent"
    return attack


PLAIN = {"aggregation": "plain", "secagg_max_weight": 100.0}


@pytest.mark.parametrize("what,x,w,why", [
    ("NaN", np.r_[np.ones(M - 1), np.nan], 1.0, "NaN or inf (first at index 39"),
    ("inf", np.full(M, -np.inf), 1.0, "NaN or inf (first at index 0"),
    ("weights of 1e12", np.full(M, 1e12), 1.0, "beyond the public clipping bound 8"),
    ("a weight of 1e12", np.ones(M), 1e12, "weight must be a number in (0, max_weight=100]"),
    ("a boolean weight", np.ones(M), True, "'w': expected a number, got True"),  # refused by the schema
    ("a short vector", np.ones(M - 3), 1.0, "has 37 elements, expected 40"),
])
def test_plain_server_rejects_a_poisoned_update_names_the_attacker_and_keeps_the_honest_mean(what, x, w, why):
    xs, ws = honest_inputs()
    out = federation(PLAIN, xs, ws, raw_update(x, w))
    res = out["server"]
    assert set(res.rejected) == {ATTACKER} and why in res.rejected[ATTACKER], (what, res.rejected)
    assert res.contributors == HONEST and res.dropped == [ATTACKER]
    want = plain_mean(xs, ws, HONEST)
    assert np.array_equal(res.mean, want)
    assert all(np.array_equal(out[c], want) for c in HONEST)  # every honest client got the honest model


def test_plain_server_rejects_a_lying_error_bound_and_the_wrong_dtype():
    xs, ws = honest_inputs(1)
    res = federation(PLAIN, xs, ws, raw_update(np.ones(M), amax=float("nan")))["server"]
    assert "amax must be a finite number" in res.rejected[ATTACKER]

    def float32_update(party, server):
        party.send(server, AggKind.PLAIN, {"r": 0, "x": np.ones(M, np.float32), "w": 1.0, "amax": 0.0})
    res = federation(PLAIN, xs, ws, float32_update)["server"]
    assert "1-D float64 vector" in res.rejected[ATTACKER]


def test_only_poisoned_updates_is_a_named_failure():
    def server(party, c, d):
        return make_aggregator(AggregationSettings(**PLAIN)).aggregate(party, [ATTACKER], 0)

    def client(party, c, d):
        raw_update(np.full(M, np.nan))(party, "server")

    algo = types.SimpleNamespace(NAME="t", ROLES={"server": server, "client": client}, load_data=lambda *a: None)
    with pytest.raises(FederationFailed) as e:
        run_inmemory(algo, [("server", "server"), (ATTACKER, "client")])
    msg = str(e.value.failures["server"])
    assert "no client sent an acceptable update" in msg and ATTACKER in msg and "NaN" in msg


@pytest.mark.parametrize("method", ["plain", "secure"])
def test_both_aggregators_clip_an_honest_clients_huge_input_to_the_same_public_bound(method):
    xs, ws = honest_inputs(2)
    xs[ATTACKER] = np.full(M, 1e12)
    xs[ATTACKER][::2] = -3.0
    ws[ATTACKER] = 7.0
    cfg = {**PLAIN, "aggregation": method}

    def through_the_api(party, server):  # a client whose update blew up, running the honest code
        return make_aggregator(AggregationSettings(**cfg)).submit(party, server, xs[ATTACKER], ws[ATTACKER], 0)

    res = federation(cfg, xs, ws, through_the_api)["server"]
    everyone = HONEST + [ATTACKER]
    assert res.contributors == sorted(everyone) and res.rejected == {}
    want = plain_mean(xs, ws, everyone)
    assert np.max(np.abs(res.mean - want)) <= res.mean_error_bound + 1e-12
    assert np.max(np.abs(res.mean)) <= 8.0


def test_secure_client_with_a_nan_input_refuses_it_naming_itself_and_the_round_goes_on():
    xs, ws = honest_inputs(3)
    cfg = {"aggregation": "secure", "secagg_max_weight": 100.0, "aggregation_timeout": 2.0}

    def nan_input(party, server):
        try:
            make_aggregator(AggregationSettings(**cfg)).submit(party, server, np.r_[np.zeros(M - 1), np.nan], 1.0, 0)
        except ValueError as e:
            return str(e)
        return "accepted"

    out = federation(cfg, xs, ws, nan_input)
    assert f"of {ATTACKER!r} contains NaN or inf (first at index {M - 1}" in out[ATTACKER]
    res = out["server"]
    assert res.contributors == HONEST and res.dropped == [ATTACKER]
    assert np.max(np.abs(res.mean - plain_mean(xs, ws, HONEST))) <= res.mean_error_bound
    assert all(np.array_equal(out[c], res.mean) for c in HONEST)


def test_secure_server_names_a_client_sending_malformed_keys_and_goes_on():
    xs, ws = honest_inputs(4)
    cfg = {"aggregation": "secure", "secagg_max_weight": 100.0, "aggregation_timeout": 2.0}

    def bad_keys(party, server):
        party.send(server, secagg.Kind.KEYS, {"r": 0, "c_pk": b"x", "s_pk": b"y", "commit": b"z", "sig": b""})

    res = federation(cfg, xs, ws, bad_keys)["server"]
    assert set(res.rejected) == {ATTACKER} and "'c_pk': 1 bytes, 32 declared" in res.rejected[ATTACKER]
    assert res.contributors == HONEST and res.dropped == [ATTACKER]
    assert np.max(np.abs(res.mean - plain_mean(xs, ws, HONEST))) <= res.mean_error_bound


# ------------------------------------------------------------------ SecAgg+ dropouts
STEPS = ("start", "advertise", "share", "masked")  # the step after which a client vanishes


def survives(cfg, n, dropouts, run_id):
    """The server's sets for one dropout pattern ({client: step}); True if the round completes.

    Mirrors SecAggServer: prune after keys and after shares, at least t at every step, and every
    self-mask seed (U3) and every mask key of a client that dropped after sharing (U2 - U3) with
    t_local live holders at the unmasking step (U4).
    """
    universe = [f"c{i:02d}" for i in range(n)]
    t, tl = cfg.t(n), cfg.t_local(n)
    nbrs = neighbours(universe, cfg, seed=1, run_id=run_id, r=0)
    gone_after = {s: {u for u, st in dropouts.items() if st == s} for s in STEPS}
    u1 = prune(set(universe) - gone_after["start"], nbrs, t, tl)
    u2 = prune(u1 - gone_after["advertise"], nbrs, t, tl)
    u3 = u2 - gone_after["share"]
    u4 = u3 - gone_after["masked"]
    if min(len(u1), len(u2), len(u3), len(u4)) < t:
        return False
    return all(len(((nbrs[u] & u2) | {u}) & u4) >= tl for u in u2)


@pytest.mark.unit
@pytest.mark.parametrize("n", [20, 50])
def test_secagg_plus_defaults_survive_random_dropouts_of_n_minus_t_clients(n):
    rng = np.random.default_rng(n)
    cfg = SecAggConfig(graph="harary")
    t = cfg.t(n)
    assert cfg.k(n) < n - 1  # a real SecAgg+ graph, not the complete one
    patterns = 400
    fails = 0
    for _ in range(patterns):
        who = rng.choice(n, size=n - t, replace=False)
        dropouts = {f"c{i:02d}": STEPS[rng.integers(len(STEPS))] for i in who}
        fails += not survives(cfg, n, dropouts, uuid.UUID(int=int(rng.integers(2**62))).hex)
    assert fails == 0
    # the earlier default (k = 2 ceil(log2 n), t_local = ceil(t (k + 1) / n)) fails most of these
    old = SecAggConfig(graph="harary", degree=2 * int(np.ceil(np.log2(n))))
    rng = np.random.default_rng(n)
    old_fails = 0
    for _ in range(100):
        who = rng.choice(n, size=n - t, replace=False)
        dropouts = {f"c{i:02d}": STEPS[rng.integers(len(STEPS))] for i in who}
        old_fails += not survives(old, n, dropouts, uuid.UUID(int=int(rng.integers(2**62))).hex)
    assert old_fails > 50


def run_secagg(cfg, xs, faults, seed=0):
    clients = sorted(xs)

    def server(party, c, d):
        return SecAggServer(cfg).aggregate(party, clients, 0)

    def client(party, c, d):
        return SecAggClient(cfg, faults.get(party.name)).submit(party, "server", xs[party.name], 1.0, 0)

    algo = types.SimpleNamespace(NAME="secagg-plus", ROLES={"server": server, "client": client},
                                 load_data=lambda *a: None)
    return run_inmemory(algo, [("server", "server")] + [(c, "client") for c in clients], seed=seed, timeout=60)


@pytest.mark.parametrize("n", [20, pytest.param(50, marks=pytest.mark.slow)])
def test_secagg_plus_end_to_end_with_n_minus_t_random_dropouts(n):
    rng = np.random.default_rng(100 + n)
    cfg = SecAggConfig(graph="harary", clip=4.0, timeout=3.0)  # generous: 50 threads on a loaded CPU
    t = cfg.t(n)
    xs = {f"c{i:02d}": rng.uniform(-4, 4, 8) for i in range(n)}
    who = sorted(f"c{i:02d}" for i in rng.choice(n, size=n - t, replace=False))
    steps = {u: STEPS[i % len(STEPS)] for i, u in enumerate(who)}  # every step has dropouts
    out = run_secagg(cfg, xs, {u: Faults(stop_after=s) for u, s in steps.items()}, seed=n)
    res = out["server"]
    # a client that sent its masked input counts even though it vanished afterwards
    counted = sorted(u for u in xs if steps.get(u) in (None, "masked"))
    assert res.contributors == counted and res.degree == cfg.k(n) < n - 1
    want = sum(np.clip(xs[u], -4, 4) for u in counted)
    assert np.max(np.abs(res.sum - want)) <= res.sum_error_bound
    assert all(out[u].status == "stopped" for u in who)


def test_a_round_lost_to_pruning_reports_how_many_clients_answered():
    n = 20  # t = 11
    cfg = SecAggConfig(graph="harary", degree=2, local_threshold=3, timeout=1.0)
    rng = np.random.default_rng(7)
    xs = {f"c{i:02d}": rng.uniform(-1, 1, 4) for i in range(n)}
    # 9 leave before advertising: 11 = t answer, and with t_local = k + 1 every one of them next to
    # a missing client on the ring is pruned, so fewer than t remain whatever the placement
    gone = [f"c{i:02d}" for i in range(9)]
    with pytest.raises(FederationFailed) as e:
        run_secagg(cfg, xs, {u: Faults(stop_after="start") for u in gone})
    msg = str(e.value.failures["server"])
    assert "11 of 20 clients advertised keys, but only" in msg and "t_local=3" in msg, msg
    assert "below the threshold t=11" in msg and "no sum is released" in msg
