"""Parties in separate network namespaces, joined only by a veth pair, finish a job.

The server lives in one namespace and two clients in another; the federation
file names their 10.x addresses, its keys are made with ``fedhet keys
--update``, and each party is started the way it would be on its own machine
(``fedhet party FILE --name N``).  The weights must equal the in-memory run's
and the run must pass the audit.  Needs root and iproute2's ``ip netns``;
skipped with the reason otherwise.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from fedhet.parties.ops import cli
from fedhet.parties.audit import audit
from fedhet.parties.federation import Federation, PartySpec, load
from fedhet.parties.inmemory import run_inmemory

pytestmark = pytest.mark.netns

TAG = f"fh{os.getpid() % 100000}"
NS = {"a": f"{TAG}a", "b": f"{TAG}b"}
SUBNET = f"10.231.{os.getpid() % 250}"
ADDR = {"a": f"{SUBNET}.1", "b": f"{SUBNET}.2"}
PLACE = {"server": "a", "client1": "b", "client2": "b"}  # party -> namespace
ROUNDS = 3


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def _need_netns() -> None:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("needs iproute2's `ip` (apt-get install iproute2)")
    probe = f"{TAG}probe"
    r = _ip("netns", "add", probe)
    if r.returncode != 0:
        pytest.skip(f"`ip netns add` is not allowed here: {r.stderr.strip()}")
    _ip("netns", "del", probe)


def _check(r: subprocess.CompletedProcess, what: str) -> None:
    assert r.returncode == 0, f"{what}: {r.stderr.strip()}"


@pytest.fixture
def namespaces():
    _need_netns()
    try:
        for ns in NS.values():
            _check(_ip("netns", "add", ns), f"netns add {ns}")
        _check(_ip("link", "add", f"{TAG}va", "type", "veth", "peer", "name", f"{TAG}vb"), "veth pair")
        for side, ns in NS.items():
            dev = f"{TAG}v{side}"
            _check(_ip("link", "set", dev, "netns", ns), f"move {dev}")
            _check(_ip("-n", ns, "addr", "add", f"{ADDR[side]}/24", "dev", dev), f"address {dev}")
            _check(_ip("-n", ns, "link", "set", dev, "up"), f"up {dev}")
            _check(_ip("-n", ns, "link", "set", "lo", "up"), f"lo up in {ns}")
        yield NS
    finally:
        for ns in NS.values():  # deleting a namespace also deletes its end of the veth
            _ip("netns", "del", ns)


def test_two_namespaces_complete_fedavg(namespaces, tmp_path):
    port = {n: 25555 + i for i, n in enumerate(PLACE)}
    fed = Federation(
        name="netns", algorithm={"name": "fedavg_logreg", "rounds": ROUNDS}, timeout=60.0, seed=0,
        parties=[PartySpec(n, "server" if n == "server" else "client", f"tcp://{ADDR[side]}:{port[n]}")
                 for n, side in PLACE.items()],
        key_dir=tmp_path / "keys", source=str(tmp_path / "federation.toml"))
    fed_file = tmp_path / "federation.toml"
    fed_file.write_text(fed.to_toml())
    assert cli.main(["keys", str(fed_file), "--update"]) == 0
    fed = load(fed_file)
    assert all(p.public_key and p.sign_key for p in fed.parties)

    # Each namespace holds only its own end: the other side's address is reachable only over the veth.
    for side, other in (("a", "b"), ("b", "a")):
        own = _ip("-n", namespaces[side], "-o", "addr").stdout
        assert ADDR[side] in own and ADDR[other] not in own

    run_dir, run_id = tmp_path / "run", uuid.uuid4().hex
    procs = {}
    try:
        for name, side in PLACE.items():
            log = open(tmp_path / f"{name}.out", "wb")
            procs[name] = subprocess.Popen(
                ["ip", "netns", "exec", namespaces[side], sys.executable, "-m", "fedhet.parties", "party",
                 str(fed_file), "--name", name, "--out", str(run_dir), "--run-id", run_id, "--quiet"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            log.close()
        codes = {n: p.wait(timeout=180) for n, p in procs.items()}  # hang guard
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    outs = {n: (tmp_path / f"{n}.out").read_text(errors="replace") for n in PLACE}
    assert codes == {n: 0 for n in PLACE}, outs

    results = {n: json.loads((run_dir / "parties" / n / "result.json").read_text()) for n in PLACE}
    mem = run_inmemory("fedavg_logreg", [(p.name, p.role) for p in fed.parties], fed.algorithm_cfg(), seed=fed.seed)
    assert {n: r["result"]["weights"] for n, r in results.items()} == {n: r["weights"] for n, r in mem.items()}
    # The server and the clients sit on different sides of the veth: their traffic crossed it.
    assert results["server"]["traffic"]["bytes_received"]["client1"] > 0
    assert results["client2"]["traffic"]["bytes_received"]["server"] > 0
    rep = audit(run_dir)
    assert rep.ok, rep.problems


def test_wrong_port_across_namespaces_is_named_within_seconds(namespaces, tmp_path):
    """client1's federation file names a port where nothing listens on the server's machine (the
    server listens elsewhere): client1 reports "no TCP connection to" that endpoint in its log and
    its status within 10 s of starting, rather than after the 60 s receive timeout."""
    real, wrong = 25601, 25602
    place = {"server": "a", "client1": "b"}
    fed = Federation(
        name="netns-wrong-port", algorithm={"name": "fedavg_logreg", "rounds": ROUNDS, "aggregation": "plain"},
        timeout=60.0, seed=0,
        parties=[PartySpec("server", "server", f"tcp://{ADDR['a']}:{wrong}"),
                 PartySpec("client1", "client", f"tcp://{ADDR['b']}:{real}")],
        key_dir=tmp_path / "keys", source=str(tmp_path / "federation.toml"))
    fed_file = tmp_path / "federation.toml"
    fed_file.write_text(fed.to_toml())
    assert cli.main(["keys", str(fed_file), "--update"]) == 0
    run_dir, run_id = tmp_path / "run", uuid.uuid4().hex
    binds = {"server": f"tcp://{ADDR['a']}:{real}", "client1": f"tcp://{ADDR['b']}:{real}"}
    procs = {}
    status = run_dir / "parties" / "client1" / "status.json"
    try:
        for name, side in place.items():
            procs[name] = subprocess.Popen(
                ["ip", "netns", "exec", namespaces[side], sys.executable, "-m", "fedhet.parties", "party",
                 str(fed_file), "--name", name, "--out", str(run_dir), "--run-id", run_id, "--quiet",
                 "--bind", binds[name]],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        links = {}
        deadline = time.monotonic() + 120  # hang guard (imports on a loaded machine)
        while "links" not in links:
            assert time.monotonic() < deadline, "client1 never reported the link"
            assert procs["client1"].poll() is None, "client1 ended before it reported the link"
            try:
                links = json.loads(status.read_text())
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    got = links["links"]["server"]
    assert got["state"] == "no TCP connection" and got["endpoint"] == f"tcp://{ADDR['a']}:{wrong}", got
    assert got["reported_after_s"] <= 10.0, got  # the party's own clock: diagnose_s (5 s) after it dialled
    log = (run_dir / "parties" / "client1" / "log.txt").read_text()
    assert f"no TCP connection to tcp://{ADDR['a']}:{wrong}" in log and "WARNING" in log


def _federation(tmp_path, name, algorithm, place, port0, device=None):
    fed = Federation(
        name=name, algorithm=algorithm, timeout=60.0, seed=0,
        parties=[PartySpec(n, "server" if n == "server" else "client", f"tcp://{ADDR[side]}:{port0 + i}",
                           device=(device or {}).get(n, "cpu"))
                 for i, (n, side) in enumerate(place.items())],
        key_dir=tmp_path / "keys", source=str(tmp_path / "federation.toml"))
    tmp_path.mkdir(parents=True, exist_ok=True)
    fed_file = tmp_path / "federation.toml"
    fed_file.write_text(fed.to_toml())
    assert cli.main(["keys", str(fed_file), "--update"]) == 0
    return load(fed_file), fed_file


def _start(namespaces, side, fed_file, name, run_dir, run_id):
    return subprocess.Popen(
        ["ip", "netns", "exec", namespaces[side], sys.executable, "-m", "fedhet.parties", "party",
         str(fed_file), "--name", name, "--out", str(run_dir), "--run-id", run_id, "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)


def _records(run_dir, names):
    return {n: json.loads((run_dir / "parties" / n / "error.json").read_text()) for n in names}


def test_different_files_and_a_missing_device_across_namespaces_are_named_not_timed_out(namespaces, tmp_path):
    """Item 2: the server's machine holds a file with another [algorithm] rounds; item 3: client2's
    file asks for CUDA on a CPU host.  Each party stops on the evidence (a fingerprint mismatch, an
    abort notice naming client2), never on the 60 s receive timeout."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("needs a host without CUDA")
    place = {"server": "a", "client1": "b", "client2": "b"}
    algo = {"name": "fedavg_logreg", "rounds": ROUNDS, "aggregation": "plain"}
    # item 2
    fed, fed_file = _federation(tmp_path / "m", "netns-mismatch", algo, place, 25611)
    other = tmp_path / "m" / "server.toml"
    other.write_text(fed_file.read_text().replace(f"rounds = {ROUNDS}", f"rounds = {ROUNDS + 1}"))
    run_dir, run_id = tmp_path / "m" / "run", uuid.uuid4().hex
    procs = {n: _start(namespaces, side, other if n == "server" else fed_file, n, run_dir, run_id)
             for n, side in place.items()}
    try:
        codes = {n: p.wait(timeout=180) for n, p in procs.items()}  # hang guard
    finally:
        for p in procs.values():
            p.kill()
    assert all(c != 0 for c in codes.values()), codes
    recs = _records(run_dir, place)
    assert any(r["cause"] == "mismatch" and r["evidence"]["sections"] == ["[algorithm] rounds"] for r in recs.values())
    assert all(r["cause"] in ("mismatch", "peer_abort") for r in recs.values()), recs
    # item 3
    fed, fed_file = _federation(tmp_path / "d", "netns-device", algo, place, 25621, device={"client2": "cuda"})
    run_dir, run_id = tmp_path / "d" / "run", uuid.uuid4().hex
    procs = {n: _start(namespaces, side, fed_file, n, run_dir, run_id) for n, side in place.items()}
    try:
        codes = {n: p.wait(timeout=180) for n, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
    recs = _records(run_dir, place)
    assert recs["client2"]["cause"] == "own" and "CUDA" in recs["client2"]["error"]
    for n in ("server", "client1"):
        assert recs[n]["cause"] == "peer_abort" and recs[n]["culprit"] == "client2", recs[n]


def test_a_second_start_in_a_namespace_is_refused_and_the_first_runs_on(namespaces, tmp_path):
    """Item 4 on the party's own machine: the same party started twice in one run folder."""
    place = {"server": "a", "client1": "b", "client2": "b"}
    fed, fed_file = _federation(tmp_path, "netns-twice", {"name": "fedavg_logreg", "rounds": ROUNDS,
                                                          "aggregation": "plain"}, place, 25631)
    run_dir, run_id = tmp_path / "run", uuid.uuid4().hex
    first = _start(namespaces, "a", fed_file, "server", run_dir, run_id)
    try:
        lock = run_dir / "parties" / "server" / ".lock"
        deadline = time.monotonic() + 120  # hang guard
        while not (lock.exists() and lock.read_text().strip()):
            assert time.monotonic() < deadline and first.poll() is None
            time.sleep(0.05)
        second = _start(namespaces, "a", fed_file, "server", run_dir, run_id)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 1 and "already running" in err and "Traceback" not in err, err
        assert first.poll() is None and not (run_dir / "parties" / "server" / "error.json").exists()
    finally:
        first.kill()
        first.wait()
