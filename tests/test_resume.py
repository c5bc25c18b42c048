"""Checkpoints and resume, the mechanism (every algorithm's kill-and-resume is in test_all_algorithms):

* a checkpoint file round-trips any role state exactly (arrays, tensors, RNG states, big integers),
  is written atomically into the party's private folder (0700/0600), and only the newest two stay;
* a damaged or replaced checkpoint is refused, naming the file, and one the transcript did not record
  is never offered for a resume;
* a role that does not restore fails a resumed run loudly instead of silently starting over;
* the launcher killed with SIGKILL, then ``fedhet run --resume``: the same model, an audit that
  follows the transcripts through the restart, and the checkpoints kept out of the public part;
  a checkpoint changed on disk between the kill and the resume is not used (the run goes on from an
  earlier one and still gives the same model);
* with ``restart_grace_s`` a party killed alone is restarted while the others wait, and the run ends
  with the same model.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import resources
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fedhet.algorithms import registry
from fedhet.parties.audit import audit
from fedhet.parties.runfolder import PRIVATE
from fedhet.parties.checkpoint import CheckpointError, Checkpoints, decode, encode
from fedhet.parties.contract import Algorithm
from fedhet.parties.faults import KILL_ENV, parse
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.launcher import launch

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

FEDAVG_SMOKE = Path(str(resources.files("fedhet.algorithms.fedavg_logreg") / "smoke.toml"))


def test_a_checkpoint_round_trips_any_role_state_exactly():
    g = np.random.default_rng(7)
    g.random(3)
    t = torch.Generator().manual_seed(11)
    torch.rand(4, generator=t)
    model = torch.nn.Linear(3, 2).double()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 3, dtype=torch.float64)).sum().backward()
    opt.step()
    state = {"numpy_rng": g.bit_generator.state, "torch_rng": t.get_state(), "model": model.state_dict(),
             "opt": opt.state_dict(), "history": [0.5, 0.25, float("nan")], "big": 2 ** 127 + 1,
             "order": np.arange(10, dtype=np.int64)[::-1], "key": b"\x00secret", 3: ("a", None, True),
             "scalar": np.float32(0.1)}
    back, header = decode(encode(state, {"party": "p"}))
    assert header == {"party": "p"}
    g2 = np.random.default_rng()
    g2.bit_generator.state = back["numpy_rng"]
    assert np.array_equal(g2.random(5), g.random(5))
    t2 = torch.Generator()
    t2.set_state(back["torch_rng"])
    assert torch.equal(torch.rand(5, generator=t2), torch.rand(5, generator=t))
    model2 = torch.nn.Linear(3, 2).double()
    model2.load_state_dict(back["model"])
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    opt2.load_state_dict(back["opt"])
    assert torch.equal(opt2.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert back["big"] == 2 ** 127 + 1 and back[3] == ("a", None, True) and back["key"] == b"\x00secret"
    assert np.isnan(back["history"][2]) and back["history"][:2] == [0.5, 0.25]
    assert np.array_equal(back["order"], state["order"]) and back["scalar"].dtype == np.float32


def test_checkpoints_are_private_atomic_and_only_the_newest_two_stay(tmp_path):
    store = Checkpoints(tmp_path / "p" / PRIVATE / "checkpoints")
    for step in range(1, 5):
        store.write(step, {"w": np.full(3, step)}, {"party": "p"})
    assert store.steps() == [3, 4]
    assert (store.folder.stat().st_mode & 0o777) == 0o700
    assert all((store.path(s).stat().st_mode & 0o777) == 0o600 for s in store.steps())
    with pytest.raises(CheckpointError, match="a set cannot be checkpointed"):
        store.write(5, {"w": {1, 2}}, {"party": "p"})
    assert store.steps() == [3, 4] and sorted(os.listdir(store.folder)) == ["step-000003.ckpt", "step-000004.ckpt"]
    state, header = store.read(4)
    assert header["step"] == 4 and np.array_equal(state["w"], np.full(3, 4))


def test_a_damaged_or_replaced_checkpoint_is_refused_naming_the_file(tmp_path):
    store = Checkpoints(tmp_path)
    digest, _ = store.write(1, {"w": np.ones(2)}, {})
    store.write(2, {"w": np.ones(2) * 2}, {})
    raw = store.path(1).read_bytes()
    store.path(1).write_bytes(raw[:-3] + b"xyz")
    with pytest.raises(CheckpointError, match=r"step-000001\.ckpt: its SHA-256 is not the one"):
        store.read(1, digest)
    store.path(2).write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    with pytest.raises(CheckpointError, match=r"step-000002\.ckpt: unreadable checkpoint"):
        store.read(2)
    # only files whose digest the transcript recorded are offered for a resume
    assert store.offer([{"type": "checkpoint", "step": 1, "sha256": digest}]) == {}


@pytest.mark.federation
def test_a_fault_cued_at_a_step_fires_before_the_role_goes_on(tmp_path, monkeypatch):
    """The kill cued "after checkpoint 2" ran on the checkpoint writer's thread: under load the write
    lagged and the party ran on, once to the end of the run, so its peers had finished and gone
    when it came back (CI: "waited 60s for a '_resume' message").  The cue now fires before
    ``checkpoint`` returns, however slow the write."""
    from fedhet.parties.inmemory import InMemoryHub

    hub = InMemoryHub({"a": "x", "b": "x"}, "run")
    party = hub.party("a", seed=0, device="cpu", timeout=5.0)
    party.checkpoints = Checkpoints(tmp_path / "a", background=True)
    party.checkpoint_every = 1
    store = party.checkpoints._store

    def slow_store(step, raw):
        time.sleep(0.3)   # a loaded disk
        return store(step, raw)

    monkeypatch.setattr(party.checkpoints, "_store", slow_store)
    fired: list[int] = []
    party.after_checkpoint = fired.append
    party.checkpoint(1, {"w": np.ones(3)})
    assert fired == [1]
    party.after_checkpoint = None   # no cue: the write stays in the background
    party.checkpoint(2, {"w": np.ones(3)})
    assert party.checkpoints.steps() == [1]
    party.flush_checkpoints()
    assert party.checkpoints.steps() == [1, 2] and fired == [1]


def test_kill_specs_are_checked():
    assert parse("client1:3") == ("client1", 3, "self")
    assert parse("server:2:launcher") == ("server", 2, "launcher")
    for bad in ("client1", "client1:x", "a:1:everyone"):
        with pytest.raises(ValueError, match=KILL_ENV):
            parse(bad)


@pytest.mark.federation
def test_a_role_that_does_not_restore_fails_a_resumed_run_instead_of_starting_over(tmp_path):
    def server(party, s, data):
        for r in range(3):
            party.send("client", "x", {"r": r})
            party.checkpoint(r + 1, {})
        return {}

    def client(party, s, data):
        for r in range(3):
            party.recv("server", "x")
            party.checkpoint(r + 1, {})
        return {}

    algo = Algorithm(name="no_restore", summary="", roles={"server": server, "client": client},
                     load_data=lambda s, ctx: None)
    parties = [("server", "server"), ("client", "client")]
    with pytest.raises(FederationFailed):
        run_inmemory(algo, parties, strict=False, run_id="x", checkpoint_dir=tmp_path, kill={"client": 2},
                     clock="virtual", timeout=5)
    with pytest.raises(FederationFailed, match="sent a message before calling party.restore"):
        run_inmemory(algo, parties, strict=False, run_id="x", checkpoint_dir=tmp_path, resume=True, timeout=5)


def _weights(run: Path) -> list:
    return json.loads((run / "parties" / "server" / "result.json").read_text())["result"]["weights"]


def _wait_stopped(run: Path, names: list[str], limit_s: float = 60.0) -> None:
    """Wait (bounded: a hang guard) until no party process of ``run`` is alive: each one's lock free."""
    import fcntl

    deadline = time.monotonic() + limit_s
    for n in names:
        while True:
            with open(run / "parties" / n / ".lock", "a+") as f:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"party {n} still runs after its launcher died"
            time.sleep(0.2)


@pytest.mark.processes
def test_the_launcher_killed_then_fedhet_run_resume_gives_the_same_model(tmp_path):
    """SIGKILL to the launcher after client1's checkpoint of round 2 (its parties stop); the server's
    newest checkpoint is then forged on disk (re-encoded, valid, with other weights): ``fedhet run
    --resume`` does not use it (its digest is not the one the server's transcript recorded), goes on
    from an earlier one, and ends with the uninterrupted run's model."""
    fed = load(FEDAVG_SMOKE)
    want = run_inmemory("fedavg_logreg", list(fed.roles.items()), fed.algorithm_cfg(), seed=fed.seed)
    run = tmp_path / "run"
    fed_file = tmp_path / "fed.toml"   # the smoke federation in one host process (one torch import)
    fed_file.write_text(FEDAVG_SMOKE.read_text().replace("[federation]\n", "[federation]\nhosts = 1\n", 1))
    cli = [sys.executable, "-m", "fedhet.parties.ops.cli", "run"]
    env = dict(os.environ, **{KILL_ENV: "client1:2:launcher"})
    killed = subprocess.run(cli + [str(fed_file), "--out", str(run), "--no-progress"], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stdout[-2000:] + killed.stderr[-2000:]
    _wait_stopped(run, list(fed.roles))
    store = Checkpoints(run / "parties" / "server" / PRIVATE / "checkpoints")
    newest = max(store.steps())
    state, header = store.read(newest)
    state["role"]["w"] = state["role"]["w"] + 1.0
    store.path(newest).write_bytes(encode(state, header))
    resumed = subprocess.run(cli + ["--resume", str(run), "--no-progress"], capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    assert _weights(run) == want["server"]["weights"]
    res = json.loads((run / "parties" / "server" / "result.json").read_text())
    assert res["incarnation"] == 1 and res["resumed_from"] < newest
    rep = audit(run, registry.get_algorithm, trust_folder_keys=True)
    assert rep.ok, rep.problems[:5]
    # the secret part: checkpoints only under parties/N/private, never in what an auditor is handed
    secret = {p.relative_to(run).parts[:3] for p in run.rglob("*.ckpt")}
    assert secret and all(s[0] == "parties" and s[2] == PRIVATE for s in secret)


@pytest.mark.processes
def test_a_party_killed_alone_restarts_while_the_others_wait(tmp_path):
    """``restart_grace_s``: the launcher restarts a party killed with SIGKILL (``--resume``); the others
    stop their round where they are, agree on a checkpoint with it and go on: the same model, and
    every party's transcript goes on through the one restart."""
    fed = load(FEDAVG_SMOKE)
    want = run_inmemory("fedavg_logreg", list(fed.roles.items()), fed.algorithm_cfg(), seed=fed.seed)
    # client2 its own process, the others one host process (fewer torch imports)
    parties = [p if p.name == "client2" else replace(p, host="rest") for p in fed.parties]
    summary = launch(replace(fed, restart_grace_s=60.0, parties=parties), tmp_path / "run", progress=False,
                     env=dict(os.environ, **{KILL_ENV: "client2:2"}))
    assert _weights(tmp_path / "run") == want["server"]["weights"]
    assert {p: (r["incarnation"], r["resumed_from"] >= 1) for p, r in summary["parties"].items()} == \
        {p: (1, True) for p in fed.roles}
    rep = audit(tmp_path / "run", registry.get_algorithm, trust_folder_keys=True)
    assert rep.ok, rep.problems[:5]


def test_a_restart_grace_longer_than_the_timeout_is_refused(tmp_path):
    text = FEDAVG_SMOKE.read_text().replace("timeout = 60", "timeout = 60\nrestart_grace_s = 90")
    (tmp_path / "fed.toml").write_text(text)
    with pytest.raises(ValueError, match="restart_grace_s = 90 must be between 0 .* and the timeout"):
        load(tmp_path / "fed.toml")
