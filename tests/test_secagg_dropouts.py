"""Client dropouts in the secure-aggregation job (setting ``dropouts`` of ``secagg_bench``): the plan, the
settings' checks, and a run in memory whose sum and mean are exact within their bounds over the clients
the server counted.

The runs are on the virtual clock: the server's per-step timeout (5 s of protocol time) fires only when
every party waits, so an honest client is never dropped because the machine is slow, a vanished one is
always timed out, and the run takes well under a second of real time."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from fedhet.algorithms import secagg_job as job
from fedhet.parties.ops import presets
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.launcher import check_before_launch
from fedhet.parties.settings import SettingsError
from fedhet.protocols import aggregation
from fedhet.protocols.aggregation_settings import AggregationSettings
from fedhet.protocols.secagg import STEPS, Faults

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


def settings(**kw):
    return job.ALGORITHM.parse(kw)


def counted(plan: dict[str, str], k: int) -> list[str]:
    """The clients whose input must be in the sum: those that never vanish, and those that vanish only
    after sending their masked input."""
    return [c for c in job.client_names(k) if c not in plan or plan[c] == "masked"]


# ------------------------------------------------------------------ the plan
def test_the_plan_is_deterministic_from_input_seed_and_spread_over_the_steps():
    assert job.DROP_STEPS == ("start",) + STEPS[:-1]   # after "unmask" a client has nothing left to send
    s = settings(n_clients=100, dropouts=10, input_seed=3)
    plan = job.dropout_plan(s)
    assert plan == job.dropout_plan(settings(n_clients=100, dropouts=10, input_seed=3, m=7))  # inputs' size: no part
    assert len(plan) == 10 and set(plan) <= set(job.client_names(100))
    per_step = Counter(plan.values())
    assert set(per_step) == set(job.DROP_STEPS)
    assert max(per_step.values()) - min(per_step.values()) <= 1                  # 10 over 4 steps: 3, 3, 2, 2
    others = [job.dropout_plan(settings(n_clients=100, dropouts=10, input_seed=seed)) for seed in range(4, 8)]
    assert all(p != plan for p in others)                                         # another seed, another plan
    assert len({frozenset(p) for p in others + [plan]}) == 5                      # ... other clients, too
    four = job.dropout_plan(settings(n_clients=20, dropouts=4, input_seed=0))
    assert sorted(four.values()) == sorted(job.DROP_STEPS)                        # 4 dropouts: every step once
    assert job.dropout_plan(settings(n_clients=20)) == {}


# ------------------------------------------------------------ the checks
@pytest.mark.parametrize("table,says", [
    ({"n_clients": 20, "dropouts": 10}, "dropouts = 10 leaves 10 of n_clients = 20, below the secure aggregation "
                                        "threshold t = 11"),
    ({"n_clients": 20, "dropouts": 6, "secagg_threshold": 0.7}, "t = 15 (secagg_threshold): at most 5 dropouts"),
    ({"n_clients": 3, "dropouts": 4}, "dropouts = 4 exceeds n_clients = 3"),
    ({"n_clients": 1, "dropouts": 1}, "secure aggregation needs at least 2 clients"),
    ({"n_clients": 20, "dropouts": 2, "aggregation": "plain"}, "dropouts = 2 needs aggregation = 'secure', got "
                                                               "'plain'"),
])
def test_dropouts_that_secure_aggregation_cannot_survive_are_refused_by_name(table, says):
    with pytest.raises(SettingsError) as e:
        settings(**table)
    assert str(e.value).startswith("secagg_bench: dropouts = ") and says in str(e.value), str(e.value)


def test_the_most_dropouts_the_threshold_allows_parse():
    assert settings(n_clients=20, dropouts=9).dropouts == 9                       # t = 11 of 20
    assert settings(n_clients=100, dropouts=49).dropouts == 49                    # t = 51 of 100
    assert settings(n_clients=20, dropouts=0, aggregation="plain").dropouts == 0


def test_the_launcher_refuses_too_many_dropouts_before_any_party_starts():
    fed = load(presets.path("secagg"))                                           # 3 clients: t = 2
    check_before_launch(fed, {"dropouts": 1})
    with pytest.raises(SettingsError, match=r"\(with --set dropouts=2\): secagg_bench: dropouts = 2 leaves 1 .*"
                                            r"no party was started"):
        check_before_launch(fed, {"dropouts": 2})


def test_faults_are_for_secure_aggregation_only():
    with pytest.raises(ValueError, match="need aggregation = 'secure'"):
        aggregation.make_aggregator(AggregationSettings(aggregation="plain"), faults=Faults(stop_after="share"))
    agg = aggregation.make_aggregator(AggregationSettings(aggregation="secure"), faults={1: Faults(stop_after="share")})
    assert isinstance(agg, aggregation.SecureAggregator)


# ------------------------------------------------------------------ a run
def run(cfg: dict, clients: list[str]) -> list[dict]:
    parties = [("server", "server")] + [(c, "client") for c in clients]
    return run_inmemory(job.ALGORITHM, parties, cfg, run_id="secagg-dropouts", timeout=60, clock="virtual")["server"]


@pytest.mark.federation
@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_with_dropouts_the_sum_over_the_counted_clients_is_exact_within_its_bound(graph):
    k = 20
    cfg = {"n_clients": k, "m": 16, "dropouts": 5, "bench_rounds": 2, "secagg_timeout": 5.0, "secagg_graph": graph}
    plan = job.dropout_plan(settings(**cfg))
    want = counted(plan, k)
    assert set(plan.values()) == set(job.DROP_STEPS)   # every step has a dropout, "masked" (still counted) too
    assert len(want) == k - 4
    rounds = run(cfg, job.client_names(k))
    assert len(rounds) == 3
    xs, ws = job.make_inputs(k, 16, 0)
    for r, rec in enumerate(rounds):
        # the warm-up round has no dropout; every timed round the same, the vanished back in the next one
        who = job.client_names(k) if r == 0 else want
        assert rec["contributors"] == len(who)
        assert sorted(set(job.client_names(k)) - set(rec["dropped"])) == sorted(who)
        assert set(rec["clients"]) == set(job.client_names(k))   # every client reported, the vanished too
        total, weight = job.exact_sum(xs, ws, who)
        assert 0 < rec["sum_err"] <= rec["sum_bound"] < 1e-3
        assert 0 < rec["max_err"] <= rec["bound"] < 1e-6
        # ... and the sum the server had differs from the sum over all clients by far more than its bound
        if r:
            every, _ = job.exact_sum(xs, ws)
            assert np.max(np.abs(every - total)) > 100 * rec["sum_bound"]


@pytest.mark.federation
def test_the_server_refuses_a_federation_whose_clients_are_not_the_n_clients_named():
    with pytest.raises(FederationFailed, match=r"n_clients = 4 needs the clients \['c00', 'c01', 'c02', 'c03'\]"):
        run({"n_clients": 4, "m": 4}, job.client_names(3))


def test_a_threshold_given_as_a_count_stays_a_count():
    # ``secagg_threshold`` is ``float | int``: 15 is the count t = 15, not the fraction 15.0 (refused)
    s = settings(n_clients=20, dropouts=5, secagg_threshold=15)
    assert s.agg.secagg_threshold == 15 and isinstance(s.agg.secagg_threshold, int)
    assert isinstance(settings(n_clients=20, secagg_threshold=0.7).agg.secagg_threshold, float)
    with pytest.raises(SettingsError, match="t = 15"):
        settings(n_clients=20, dropouts=6, secagg_threshold=15)
