"""The Ray engine's parts that need no cluster: the plan (units, resources, pins), the check of a plan
against the cluster's nodes, the federation keys, the refusals before any run folder exists, the
message without Ray, and the unpacking of a unit's folder.  Runs on a real cluster: test_ray_cluster.py."""
from __future__ import annotations

import io
import os
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from fedhet.parties.ops.cli import main
from fedhet.parties.federation import FederationError, from_dict, load
from fedhet.parties.ops.launcher import launch
from fedhet.parties.ops.engines import Engine, EngineCannot, check_capabilities
from fedhet.parties.ops.engines.local import LocalProcesses
from fedhet.parties.ops.engines.ray import (EngineError, RayEngine, Unit, bind_free, check_cluster, extract, gpus_of,
                                       plan, public)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

SMOKE = Path(__file__).parents[1] / "algorithms" / "fedavg_logreg" / "smoke.toml"


def federation(parties, **fed):
    return from_dict({"federation": {"name": "t", **fed}, "algorithm": {"name": "fedavg_logreg"},
                      "party": [{"name": n, "role": r, "endpoint": "tcp://127.0.0.1:0", **extra}
                                for n, r, extra in parties]})


def test_units_are_the_local_runs_processes_with_the_resources_their_parties_ask_for():
    fed = federation([("server", "server", {"device": "cuda:1"}), ("a", "client", {}), ("b", "client", {}),
                      ("c", "client", {"device": "cuda"}), ("d", "client", {"node_label": "zone=b"}),
                      ("e", "client", {"host": "solo"})], hosts=2, host_threads=3)
    units = {u.name: u for u in plan(fed)}
    # hosts = 2 spreads the 5 parties without a host round-robin; "solo" holds one party: its own process
    assert units["host1"].parties == ("server", "b", "d") and units["host2"].parties == ("a", "c")
    assert units["e"].kind == "party" and units["e"].cpus == 1 and units["e"].parties == ("e",)
    assert units["host1"].cpus == 3 and units["host1"].gpus == 2   # cuda:1 -> 2 GPUs of the unit's own
    assert units["host2"].gpus == 1 and units["host1"].label == {"zone": "b"} and units["host2"].label == {}
    assert [gpus_of(d) for d in ("cpu", "auto", "cuda", "cuda:0", "cuda:3")] == [0, 0, 1, 1, 4]


def test_a_host_whose_parties_name_two_node_labels_is_refused_by_name():
    fed = federation([("a", "client", {"host": "h", "node_label": "zone=a"}),
                      ("b", "client", {"host": "h", "node_label": "zone=b"}), ("s", "server", {})])
    with pytest.raises(FederationError, match=r"host 'h' name different node labels \(zone=a, zone=b\)"):
        plan(fed)


@pytest.mark.parametrize("key, value, says", [
    ("engine", "slurm", "engine must be one of 'local', 'ray'"),
    ("placement", "strict", "placement must be one of 'spread', 'pack'"),
    ("ray_address", 6379, "ray_address must be a string"),
    ("party_ports", "20000", "party_ports must be \"LO-HI\""),
    ("party_ports", "30000-20000", "1024 <= LO <= HI <= 65535, got '30000-20000'"),
    ("party_ports", "80-90", "party_ports must be"),
])
def test_engine_keys_are_checked(key, value, says):
    with pytest.raises(FederationError, match=says):
        federation([("s", "server", {}), ("a", "client", {})], **{key: value})


def test_a_node_label_must_be_key_equals_value():
    with pytest.raises(FederationError, match="node_label 'zone' must be KEY=VALUE"):
        federation([("s", "server", {"node_label": "zone"}), ("a", "client", {})])


def test_engine_keys_survive_the_written_file_and_stay_out_of_the_fingerprint(tmp_path):
    fed = federation([("s", "server", {"node_label": "zone=b"}), ("a", "client", {})], engine="ray",
                     ray_address="10.0.0.1:6379", placement="pack", party_ports="20000-20999")
    path = tmp_path / "f.toml"
    path.write_text(fed.to_toml())
    back = load(path)
    assert (back.engine, back.ray_address, back.placement, back.parties[0].node_label, back.party_ports) == \
        ("ray", "10.0.0.1:6379", "pack", "zone=b", (20000, 20999))
    # where the parties run is this launcher's business, not something the parties must agree on
    assert back.fingerprint() == replace(back, engine="local", ray_address="", placement="spread",
                                         party_ports=None).fingerprint()


NODES = [
    {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Labels": {"zone": "a", "ray.io/node-id": "x"},
     "Resources": {"CPU": 4.0}},
    {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Labels": {"zone": "b"}, "Resources": {"CPU": 2.0, "GPU": 1.0}},
    {"Alive": False, "NodeManagerAddress": "10.0.0.3", "Labels": {"zone": "c"}, "Resources": {"CPU": 64.0}},
]


def test_a_plan_the_cluster_can_meet_passes():
    check_cluster([Unit("h", ("a", "b"), "host", 4, 0), Unit("g", ("c",), "party", 1, 1, {"zone": "b"})], NODES)


@pytest.mark.parametrize("unit, says", [
    (Unit("h", ("a", "b"), "host", 8, 0), r"host 'h' \(parties a, b\) needs 8 CPU and 0 GPU;"),
    (Unit("g", ("c",), "party", 1, 2), "needs 1 CPU and 2 GPU"),
    (Unit("g", ("c",), "party", 1, 0, {"zone": "c"}), "on a node labelled zone=c"),   # its node is dead
])
def test_a_plan_the_cluster_cannot_meet_is_refused_naming_the_unit_and_the_nodes(unit, says):
    with pytest.raises(EngineError, match=says) as e:
        check_cluster([unit], NODES)
    assert "10.0.0.1 {zone=a} CPU=4 GPU=0" in str(e.value) and "10.0.0.3" not in str(e.value)


def test_without_ray_the_engine_says_how_to_get_it_and_makes_no_run_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)   # `import ray` raises ImportError
    fed = replace(load(SMOKE), engine="ray")
    with pytest.raises(EngineError, match=r"pip install 'fedhet\[ray\]'"):
        launch(fed, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    assert main(["run", str(SMOKE), "--engine", "ray", "--out", str(tmp_path / "run2")]) == 2
    assert "pip install 'fedhet[ray]'" in capsys.readouterr().out.replace("\n", "")
    assert not (tmp_path / "run2").exists()


def test_an_address_without_the_ray_engine_is_refused(tmp_path, capsys):
    assert main(["run", str(SMOKE), "--address", "10.0.0.1:6379", "--out", str(tmp_path / "r")]) == 2
    assert "--address is the Ray cluster's" in capsys.readouterr().out
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("setting, says", [
    ({"resume": True}, "--resume: the ray engine cannot resume a run"),
    ({"restart_grace_s": 5.0}, "restart_grace_s = 5 restarts a killed party process; the ray engine does not"),
])
def test_what_only_the_local_engine_does_is_refused_before_anything_starts(setting, says, tmp_path):
    """The engine's capability flags, checked by the launcher before the run folder exists."""
    fed = load(SMOKE)
    if "restart_grace_s" in setting:
        fed = replace(fed, restart_grace_s=setting["restart_grace_s"])
    assert isinstance(RayEngine(), Engine) and not RayEngine.supports_resume and LocalProcesses.supports_resume
    with pytest.raises(EngineCannot, match=says):
        check_capabilities(RayEngine(), fed, resume=bool(setting.get("resume")))
    with pytest.raises(EngineCannot, match=says):
        launch(replace(fed, engine="ray"), tmp_path / "r", progress=False, resume=bool(setting.get("resume")))
    assert not (tmp_path / "r").exists()


def test_a_units_folder_comes_back_with_nothing_outside_the_run_folder(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("parties/a/result.json", b"{}"), ("../escaped", b"x"), ("/abs", b"y")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("parties/a/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    run = tmp_path / "run"
    run.mkdir()
    extract(buf.getvalue(), run)
    assert (run / "parties/a/result.json").read_bytes() == b"{}"
    assert not (tmp_path / "escaped").exists() and not (run / "parties/a/link").exists()
    assert sorted(p.name for p in run.rglob("*")) == ["a", "parties", "result.json"]


def _three_ports_held() -> tuple[int, list]:
    """A range lo..lo+2 and a socket bound to each of its ports through ``bind_free``, trying ranges
    until one is wholly free (another process on the machine may hold any port of a given range)."""
    for k in range(200):
        lo = 40000 + (os.getpid() + 37 * k) % 2000 * 10
        held = []
        try:
            for _ in range(3):
                held.append(bind_free("127.0.0.1", (lo, lo + 2)))
            return lo, held
        except EngineError:
            for h in held:
                h.close()
    raise AssertionError("no free range of three ports in 40000-59999")


def test_party_ports_come_from_the_range_and_a_full_range_is_refused():
    lo, held = _three_ports_held()
    try:
        assert sorted(h.getsockname()[1] for h in held) == [lo, lo + 1, lo + 2]
        with pytest.raises(EngineError, match=f"no free port in party_ports {lo}-{lo + 2} on 127.0.0.1"):
            bind_free("127.0.0.1", (lo, lo + 2))
    finally:
        for h in held:
            h.close()


def test_a_partys_private_folder_never_leaves_its_node():
    def member(name):
        return tarfile.TarInfo(name)

    assert public(member("parties/a/private/checkpoints/3.ckpt")) is None
    assert public(member("parties/a/private")) is None
    kept = member("parties/a/transcript.jsonl")
    assert public(kept) is kept and public(member("parties/private_eye/log.txt")) is not None
