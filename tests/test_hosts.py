"""Host processes: many parties in one OS process, each still a party of its own.

* The ``shamir`` preset in 2 hosts gives the same results as one process per party,
  every party keeps its own transcript, and ``fedhet audit`` passes; so does the ``psi``
  preset with all its parties in one host named per party.
* A party that fails inside a host writes its own error.json, and the launcher names
  that party (and its host); the host exits non-zero.
* SIGTERM to a host stops every party in it with its "stopped" records.
* 60 parties in 3 hosts complete and pass the audit.
* Federation files: ``hosts`` / ``host`` are validated, and grouping is round-robin.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fedhet.algorithms import registry
from fedhet.parties.ops import presets
from fedhet.parties.audit import audit
from fedhet.parties.federation import FederationError, from_dict, load
from fedhet.parties.ops.launcher import RunFailed, launch

from launch_tools import launch_in_background, shared_run  # a helper module of tests/

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)

STARTUP = 90.0  # hang guard only


def results(summary: dict) -> dict:
    return {n: p["result"] for n, p in summary["parties"].items()}


def host_pids(run_dir: Path, host: str) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            args = [a.decode() for a in Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if str(run_dir) in args and "--host" in args and host in args:
            out.append(int(d))
    return out


# --------------------------------------------------------------- same results, audited
@pytest.fixture(scope="module")
def shamir_runs(tmp_path_factory):
    """Shamir as one process per party and in two hosts, made once for all workers."""
    fed = load(presets.path("shamir"))

    def make(folder):
        launch(fed, folder / "alone", progress=False, timeout=300)
        launch(replace(fed, hosts=2), folder / "hosted", progress=False, timeout=300)
    base = shared_run(tmp_path_factory, "hosts-shamir", make)
    alone, hosted = (json.loads((base / r / "result.json").read_text()) for r in ("alone", "hosted"))
    return fed, base, alone, hosted


def test_shamir_in_two_hosts_matches_one_process_per_party(shamir_runs):
    fed, base, alone, hosted = shamir_runs
    assert alone["ok"] and hosted["ok"]
    assert "hosts" not in alone
    assert {h: v["parties"] for h, v in hosted["hosts"].items()} == {
        "host1": ["owner1", "holder1", "holder3"], "host2": ["owner2", "holder2", "coordinator"]}
    assert all(v["exit_code"] == 0 and v["peak_rss_mib"] > 0 for v in hosted["hosts"].values())
    # The reconstruction is exact fixed-point arithmetic: the same result whatever the random shares.
    assert results(hosted)["coordinator"] == results(alone)["coordinator"]
    assert results(hosted)["coordinator"]["correct"] is True
    for n in ("owner1", "owner2"):
        assert results(hosted)[n] == results(alone)[n]
    for n in ("holder1", "holder2", "holder3"):
        assert results(hosted)[n] == results(alone)[n]
    # Two host processes ran the six parties (no party process of its own).
    assert not any((base / "hosted" / "parties" / p.name / "stdout.log").exists() for p in fed.parties)
    assert sorted(p.name for p in (base / "hosted" / "hosts").glob("*.log")) == ["host1.log", "host2.log"]


def test_hosted_run_passes_audit_with_a_transcript_per_party(shamir_runs):
    fed, base, alone, hosted = shamir_runs
    rep = audit(base / "hosted", registry.get_algorithm)
    assert rep.ok, rep.problems
    for p in fed.parties:
        t = base / "hosted" / "parties" / p.name / "transcript.jsonl"
        assert t.exists() and t.stat().st_size > 0
    # Each party signed its own transcript: the same record counts as when alone.
    for p in fed.parties:
        n_alone = len((base / "alone" / "parties" / p.name / "transcript.jsonl").read_text().splitlines())
        n_hosted = len((base / "hosted" / "parties" / p.name / "transcript.jsonl").read_text().splitlines())
        assert n_alone == n_hosted, p.name


def test_psi_with_all_parties_in_one_named_host(tmp_path):
    fed = load(presets.path("psi"))
    fed = replace(fed, parties=[replace(p, host="everyone") for p in fed.parties])
    alone = launch(load(presets.path("psi")), tmp_path / "alone", progress=False, timeout=300,
                   overrides={"n": 400})
    hosted = launch(fed, tmp_path / "hosted", progress=False, timeout=300, overrides={"n": 400})
    assert list(hosted["hosts"]) == ["everyone"]
    # Everything but the timing statistics (seconds, and bytes counted up to a moment that races
    # with the peers' closing messages) is the same: the intersection, its order, its digest.
    def ids(summary):
        return {n: {k: v for k, v in r.items() if k != "stats"} for n, r in results(summary).items()}
    assert ids(hosted) == ids(alone)
    assert all(r["correct"] is True for r in results(hosted).values())
    assert audit(tmp_path / "hosted", registry.get_algorithm).ok


# ------------------------------------------------------------------------ failures
def test_failing_party_in_a_host_is_named_and_writes_its_error(tmp_path):
    fed = load(presets.path("shamir"))
    # "spy" is no role of the shamir job: that party fails (and only it: the job ignores it).
    spy = replace(fed.parties[0], name="spy", role="spy")
    fed = replace(fed, parties=fed.parties + [spy], hosts=2, timeout=30)
    groups = fed.host_groups()
    spy_host = next(h for h, ns in groups.items() if "spy" in ns)
    with pytest.raises(RunFailed) as info:
        launch(fed, tmp_path / "run", progress=False, timeout=300)
    err = info.value
    assert err.party == "spy" and err.host == spy_host
    assert "'spy'" in str(err) and spy_host in str(err) and "not a role of shamir" in err.reason
    e = json.loads((tmp_path / "run" / "parties" / "spy" / "error.json").read_text())
    assert e["party"] == "spy" and not e["stopped"] and "not a role" in e["error"]
    summary = json.loads((tmp_path / "run" / "result.json").read_text())
    assert summary["ok"] is False and summary["failed"]["party"] == "spy"
    assert summary["failed"]["host"] == spy_host
    assert summary["parties"]["spy"]["state"] == "failed"
    assert summary["hosts"][spy_host]["exit_code"] not in (0, None)
    assert host_pids(tmp_path / "run", spy_host) == []


def test_sigterm_to_a_host_stops_its_parties_with_their_records(tmp_path):
    fed = replace(load(presets.path("demo")), hosts=2, timeout=60)
    run_dir = tmp_path / "run"
    th, outcome = launch_in_background(fed, run_dir, overrides={"rounds": 100000})
    names = fed.host_groups()["host2"]
    deadline = time.monotonic() + STARTUP
    pids: list[int] = []
    while time.monotonic() < deadline and th.is_alive():
        sts = []
        for n in names:
            try:
                sts.append(json.loads((run_dir / "parties" / n / "status.json").read_text()))
            except (OSError, ValueError):
                sts.append({})
        pids = host_pids(run_dir, "host2")
        if pids and all(s.get("state") == "running" and s.get("done", 0) >= 1 for s in sts):
            break
        time.sleep(0.05)
    assert len(pids) == 1, "host2 did not get going"
    os.kill(pids[0], signal.SIGTERM)
    th.join(fed.timeout + 10)
    assert not th.is_alive()
    err = outcome.get("error")
    assert isinstance(err, RunFailed) and err.host == "host2" and err.party in names, repr(err)
    for n in names:
        e = json.loads((run_dir / "parties" / n / "error.json").read_text())
        assert e["stopped"] is True and "SIGTERM" in e["error"]
        assert json.loads((run_dir / "parties" / n / "status.json").read_text())["state"] == "stopped"
    assert host_pids(run_dir, "host1") == [] and host_pids(run_dir, "host2") == []


# --------------------------------------------------------------------------- scale
def test_sixty_parties_in_three_hosts_complete_and_pass_audit(tmp_path):
    parties = ([{"name": f"owner{i:02d}", "role": "owner", "endpoint": "tcp://127.0.0.1:0"} for i in range(56)]
               + [{"name": f"holder{j}", "role": "holder", "endpoint": "tcp://127.0.0.1:0"} for j in (1, 2, 3)]
               + [{"name": "coordinator", "role": "coordinator", "endpoint": "tcp://127.0.0.1:0"}])
    fed = from_dict({"federation": {"name": "sixty", "timeout": 120, "hosts": 3, "host_threads": 1},
                     "algorithm": {"name": "shamir", "rows": 8, "d_in": 2, "d_out": 2},
                     "party": parties}, base_dir=tmp_path)
    summary = launch(fed, tmp_path / "run", progress=False, timeout=600)
    assert summary["ok"] and len(summary["parties"]) == 60
    assert summary["parties"]["coordinator"]["result"]["correct"] is True
    assert sorted(summary["hosts"]) == ["host1", "host2", "host3"]
    assert sum(len(h["parties"]) for h in summary["hosts"].values()) == 60
    assert all(h["host_threads"] == 1 for h in summary["hosts"].values())
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    # Owners talk only to holders: an owner's transcript names no other owner.
    rows = [json.loads(line) for line in (tmp_path / "run" / "parties" / "owner00" / "transcript.jsonl")
            .read_text().splitlines()]
    peers = {r.get("peer") for r in rows if r.get("peer")}
    assert peers and not any(str(p).startswith("owner") for p in peers), peers


# ---------------------------------------------------------------- federation files
@pytest.mark.unit
def test_host_grouping_is_round_robin_and_explicit_hosts_come_first():
    parties = [{"name": f"p{i}", "role": "r", "endpoint": "tcp://127.0.0.1:0"} for i in range(7)]
    parties[6]["host"] = "big"
    parties[5]["host"] = "big"
    fed = from_dict({"federation": {"hosts": 2}, "algorithm": {"name": "x"}, "party": parties})
    assert fed.host_groups() == {"big": ["p5", "p6"], "host1": ["p0", "p2", "p4"], "host2": ["p1", "p3"]}
    lone = from_dict({"algorithm": {"name": "x"}, "party": parties})
    assert lone.host_groups() == {"big": ["p5", "p6"]}  # the rest: a process each, as without hosts
    again = from_dict(__import__("tomllib").loads(fed.to_toml()))
    assert again.host_groups() == fed.host_groups() and again.hosts == 2


@pytest.mark.unit
@pytest.mark.parametrize("n, hosts, named, chosen", [
    (64, 0, 0, None),     # few enough: a process each, as the file says
    (65, 0, 0, 4),
    (1001, 0, 0, 8),      # K = 1,000 clients and a server
    (5000, 0, 0, 16),
    (1001, 3, 0, None),   # the file's own choice stands
    (100, 0, 40, None),   # 60 name no host
])
def test_many_parties_without_hosts_get_host_processes_and_the_launcher_says_so(n, hosts, named, chosen):
    from fedhet.parties.ops.launcher import default_hosts

    parties = [{"name": f"p{i}", "role": "r", "endpoint": "tcp://127.0.0.1:0"} for i in range(n)]
    for p in parties[:named]:
        p["host"] = "mine"
    fed = from_dict({"federation": {"hosts": hosts}, "algorithm": {"name": "x"}, "party": parties})
    out, why = default_hosts(fed)
    if chosen is None:
        assert out is fed and why is None
        return
    assert out.hosts == chosen and f"in {chosen} host processes" in why and "set hosts to choose" in why
    groups = out.host_groups()
    assert len(groups) == chosen and sum(map(len, groups.values())) == n
    assert max(map(len, groups.values())) - min(map(len, groups.values())) <= 1


@pytest.mark.unit
def test_the_one_party_of_its_role_among_many_gets_a_process_of_its_own():
    """A server of 1,000 clients shared one interpreter lock with ~125 of them in a host, while its
    work grows with all of them.  The launcher's default now runs such a hub alone."""
    from fedhet.parties.ops.launcher import default_hosts

    parties = ([{"name": "server", "role": "server", "endpoint": "tcp://127.0.0.1:0"}]
               + [{"name": f"c{i}", "role": "client", "endpoint": "tcp://127.0.0.1:0"} for i in range(1000)])
    fed = from_dict({"federation": {}, "algorithm": {"name": "x"}, "party": parties})
    out, why = default_hosts(fed)
    groups = out.host_groups()
    assert len(groups) == out.hosts == 8 and sum(map(len, groups.values())) == 1000
    assert all("server" not in ns for ns in groups.values()) and "server in a process of its own" in why
    two = from_dict({"federation": {}, "algorithm": {"name": "x"}, "party": parties[:3]})
    assert default_hosts(two)[0] is two   # few parties: a process each, no hub rule needed


@pytest.mark.unit
@pytest.mark.parametrize("change, msg", [
    ({"federation": {"hosts": -1}}, r"\[federation\]: hosts must be >= 0, got -1"),
    ({"federation": {"host_threads": "1"}}, r"\[federation\]: host_threads must be an integer, got '1'"),
    ({"host": "bad name"}, "host 'bad name' must be a name"),
])
def test_bad_host_settings_name_what_is_wrong(change, msg):
    parties = [{"name": f"p{i}", "role": "r", "endpoint": "tcp://127.0.0.1:0"} for i in range(2)]
    doc = {"federation": dict(change.get("federation", {})), "algorithm": {"name": "x"}, "party": parties}
    if "host" in change:
        parties[1]["host"] = change["host"]
    with pytest.raises(FederationError, match=msg):
        from_dict(doc)


def test_fedhet_host_cli_refuses_an_unknown_host(tmp_path):
    fed = replace(load(presets.path("shamir")), hosts=2, source="<memory>")
    f = tmp_path / "fed.toml"
    f.write_text(fed.to_toml())
    out = subprocess.run([sys.executable, "-m", "fedhet.parties", "host", str(f), "--host", "nope",
                          "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    said = " ".join((out.stdout + out.stderr).split())  # the console wraps long lines
    assert out.returncode != 0 and "no host 'nope' runs two or more parties" in said
