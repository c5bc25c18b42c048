"""The Ray engine on a real cluster: three nodes on this machine, each its own ``ray start`` with its own
raylet, labels and resources (benchmarks/ray_cluster.py), started and stopped by this module.

- every algorithm's smallest run, its hosts spread over the nodes, gives the in-memory run's results
  and its run folder, brought back from the nodes, passes ``fedhet audit``;
- a party pinned to a node label runs there, and ``placement = "pack"`` puts the rest on one node;
- F³ on METR-LA (207 owners, shamir mode) spread over two nodes passes the audit (real graph);
- secure aggregation among K = 100 clients with 10 dropouts gives the exact sum within its bound;
- a node whose raylet is killed mid-run fails the run within seconds, naming the node and the
  parties it held, and leaves no process of the run behind.

Marked ``ray``: skipped unless ``--ray`` (``make test-ray`` installs Ray and runs them in one process).
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace

import pytest

from algorithm_tools import comparable, jsonable, smoke_federation  # a helper module of tests/
from fedhet.algorithms import registry
from fedhet.parties.audit import audit
from fedhet.parties.faults import PAUSE_ENV
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.ops.launcher import RunFailed, launch

pytestmark = pytest.mark.ray

RUN_ID = "ray-engine-test"


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray", reason="the Ray engine's tests need Ray: pip install 'fedhet[ray]'")
    from benchmarks.ray_cluster import LocalCluster

    c = LocalCluster(cpus_per_node=6)
    try:
        c.start({"zone": "a"})
        c.add_node("n2", {"zone": "b"})
        c.add_node("n3", {"zone": "c"})
        yield c
    finally:
        c.stop()
    assert not c.processes(), f"processes of the test cluster left running: {c.processes()}"


def on_ray(fed, cluster, **kw):
    return replace(fed, engine="ray", ray_address=cluster.address, **kw)


def units(summary: dict) -> dict:
    return summary["engine"]["units"]


@pytest.mark.parametrize("name", registry.names())
def test_smoke_runs_on_ray_give_the_in_memory_results_and_pass_the_audit(name, cluster, tmp_path):
    fed = smoke_federation(name)
    algo = registry.get_algorithm(name)
    want = run_inmemory(algo, [(p.name, p.role) for p in fed.parties], fed.algorithm_cfg(), seed=fed.seed,
                        run_id=RUN_ID, timeout=120)
    # As in the local process test: four or more parties run in two hosts, the rest alone.
    fed = on_ray(fed, cluster, hosts=2 if len(fed.parties) >= 4 else 0)
    summary = launch(fed, tmp_path / "run", progress=False, timeout=300)
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    assert rep.messages > 0
    for p in fed.parties:
        assert comparable(jsonable(summary["parties"][p.name]["result"])) == comparable(jsonable(want[p.name])), \
            f"{name}: party {p.name} on Ray differs from the in-memory run"
    placed = units(summary)
    assert all(u["files"] == "collected" and u["exit_code"] == 0 for u in placed.values()), placed
    assert len({u["node_id"] for u in placed.values()}) >= 2, f"spread: the units over the nodes, got {placed}"
    # every party's own files came back from its node, but not its checkpoints (keys, shares)
    for p in fed.parties:
        for f in ("transcript.jsonl", "result.json", "log.txt"):
            assert (tmp_path / "run" / "parties" / p.name / f).is_file(), (p.name, f)
    assert not list((tmp_path / "run").glob("parties/*/private")), "a party's private/ left its node"


def test_a_pinned_party_runs_on_its_labelled_node_and_pack_keeps_the_others_together(cluster, tmp_path):
    fed = smoke_federation("fedavg_logreg")
    fed = on_ray(fed, cluster, placement="pack",
                 parties=[replace(p, node_label="zone=c") if p.name == "client1" else p for p in fed.parties])
    summary = launch(fed, tmp_path / "run", progress=False, timeout=300)
    placed = units(summary)
    assert placed["client1"]["node_labels"] == {"zone": "c"} and placed["client1"]["node_label"] == "zone=c"
    others = {n: u["node_id"] for n, u in placed.items() if n != "client1"}
    assert len(set(others.values())) == 1, f"pack: the unpinned units on one node, got {others}"
    assert audit(tmp_path / "run", registry.get_algorithm).ok


@pytest.mark.data
def test_f3_metr_la_in_shamir_mode_spread_over_the_nodes_passes_the_audit(cluster, tmp_path, shared_data):
    from fedhet.parties.ops.presets import path as preset_path

    fed = on_ray(load(preset_path("f3_metr_la")), cluster, data_dir=str(shared_data))
    over = {"fusion": "shamir_linear", "local_epochs": 1, "epochs": 1, "patience": 1, "test_samples": 2}
    summary = launch(fed, tmp_path / "run", progress=False, timeout=1800, overrides=over)
    assert len(summary["parties"]) == 211
    placed = units(summary)
    assert {u["kind"] for u in placed.values()} == {"host", "party"} and len(placed) == 8
    assert len({u["node_id"] for u in placed.values()}) >= 2
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]


def test_secure_aggregation_among_100_clients_with_dropouts_gives_the_exact_sum_within_its_bound(cluster, tmp_path):
    from benchmarks.harness import federation
    from fedhet.algorithms import secagg_job as job

    # every client dials only the server (issue 45: no client-to-client link)
    k = 100
    cfg = {"name": "secagg_bench", "n_clients": k, "m": 100, "bench_rounds": 1, "aggregation": "secure",
           "secagg_graph": "harary", "dropouts": 10, "secagg_timeout": 10.0, "input_seed": 5}
    fed = federation(cfg, [("server", "server")] + [(c, "client") for c in job.client_names(k)],
                     name="secagg-100", timeout=300)
    summary = launch(on_ray(fed, cluster, hosts=4), tmp_path / "run", progress=False, timeout=1200)
    assert len({u["node_id"] for u in units(summary).values()}) >= 2
    plan = job.dropout_plan(job.ALGORITHM.parse({k_: v for k_, v in cfg.items() if k_ != "name"}))
    assert len(plan) == 10
    timed = summary["parties"]["server"]["result"][1]
    # the server counted exactly the clients the plan keeps: those that never vanished, and those that
    # vanished only after sending their masked input
    kept = [c for c in job.client_names(k) if plan.get(c, "masked") == "masked"]
    assert timed["contributors"] == len(kept) and sorted(timed["dropped"]) == sorted(set(job.client_names(k)) - set(kept))
    assert 0 < timed["sum_err"] <= timed["sum_bound"] and timed["max_err"] <= timed["bound"]
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]


def test_a_killed_raylet_fails_the_run_naming_the_node_and_leaves_nothing_running(cluster, tmp_path):
    """Last in this module: node n3 does not come back."""
    fed = smoke_federation("fedavg_logreg")
    fed = on_ray(fed, cluster, parties=[replace(p, node_label="zone=c") if p.name == "client3" else p
                                        for p in fed.parties])
    release = tmp_path / "never"   # client3 waits after its first round until this file exists: never
    run = tmp_path / "run"
    seen: dict = {}

    def kill_when_paused():
        status = run / "parties" / "client3" / "status.json"
        while "killed" not in seen:
            try:
                if json.loads(status.read_text()).get("done", 0) >= 1:
                    seen["killed"] = cluster.kill_raylet("n3")
                    seen["t"] = time.monotonic()
            except (OSError, ValueError):
                pass
            time.sleep(0.1)

    threading.Thread(target=kill_when_paused, daemon=True).start()
    with pytest.raises(RunFailed) as e:
        launch(fed, run, progress=False, timeout=600, env=dict(os.environ, **{PAUSE_ENV: f"client3:1:{release}"}))
    print(f"the run failed {time.monotonic() - seen['t']:.1f}s after node n3's raylet was killed")
    assert seen["killed"], "no raylet of node n3 was found to kill"
    summary = json.loads((run / "result.json").read_text())
    placed = units(summary)
    lost = {n for n, u in placed.items() if u.get("lost")}
    assert "client3" in lost and all(placed[n]["node_labels"] == {"zone": "c"} for n in lost)
    assert all(placed[n]["files"] == "collected" for n in placed if n not in lost)
    failed = summary["failed"]
    assert failed["party"] in lost and e.value.party == failed["party"]
    # named: the node (id, address, label) and what the unit held
    assert "lost" in failed["reason"] and "zone=c" in failed["reason"] and "it held" in failed["reason"]
    assert placed[failed["party"]]["node_id"][:12] in failed["reason"]
    # found by the engine, not waited out: no party's record blames a silent peer
    assert failed["cause"] == "own" and "timeout" not in json.dumps(failed["evidence"]).lower()
    # nothing of the run is left running, on any node
    deadline = time.monotonic() + 60
    from benchmarks.ray_cluster import processes_with

    while processes_with(summary["run_id"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_with(summary["run_id"]), processes_with(summary["run_id"])
