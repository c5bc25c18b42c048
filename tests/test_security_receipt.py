"""Hardening (issue 11, items 2, 7, 13, 14): strict receipt, failures named, an exact and two-sided audit.

Each test reproduces an attack or failure seen against a live federation and asserts the bound.
"""
from __future__ import annotations

import json
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedhet.algorithms import fedavg_logreg, registry
from fedhet.parties import keys as keyfiles
from fedhet.parties.ops import presets
from fedhet.parties.api import PeerTimeout
from fedhet.parties.audit import audit
from fedhet.parties.contract import Algorithm
from fedhet.parties.federation import load
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.engines.local import prepare_local
from fedhet.parties.ops.launcher import launch
from fedhet.parties.runtime import run_party
from fedhet.parties.transcript import Transcript, verify
from launch_tools import shared_run  # a helper module of tests/

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)

FED = [("server", "server"), ("client1", "client"), ("client2", "client")]


# ------------------------------------------------------------ item 2: unread kinds

def test_undeclared_kinds_from_a_listed_peer_are_refused_and_do_not_blame_it_as_silent():
    """A listed client floods the server with a kind nobody reads: nothing is queued, and the
    timeout that follows says what that client did send instead of calling it silent."""
    def flooding_client(party, s, data):
        srv = party.peers_with_role("server")[0]
        for _ in range(100):
            party.send(srv, "junk/unread", {"x": np.zeros(1 << 14)})  # 100 x 128 KiB
        return {}

    def server(party, s, data):
        c1 = party.peers_with_role("client")[0]
        try:
            party.recv(c1, fedavg_logreg.Kind.EVAL, timeout=2)
        except PeerTimeout as e:
            queued = sum(len(q) for q in party._mailbox._queues.values())
            return {"error": str(e), "queued": queued}
        return {"error": None}

    algo = Algorithm(name="fedavg_logreg", summary="", roles={"server": server, "client": flooding_client},
                     load_data=lambda s, ctx: None, declarations=fedavg_logreg.declarations,
                     settings=fedavg_logreg.Settings, sizes=fedavg_logreg.sizes)
    # on the virtual clock the server's 2 s wait ends only once the client has sent everything and
    # stopped: the flood's size, not the machine's speed, decides what the timeout reports
    out = run_inmemory(algo, FED[:2], {"rounds": 1}, timeout=10, clock="virtual")
    assert out["server"]["queued"] == 0
    assert "100 refused (undeclared kind)" in out["server"]["error"]
    assert "silent" not in out["server"]["error"]


def test_a_payload_against_its_schema_fails_the_receiver_naming_sender_kind_and_field():
    def bad_client(party, s, data):
        srv = party.peers_with_role("server")[0]
        party.recv(srv, fedavg_logreg.Kind.MODEL)
        party.send(srv, fedavg_logreg.Kind.EVAL, {"correct": "all of them", "count": 3})
        return {}

    algo = Algorithm(name="fedavg_logreg", summary="", roles={"server": fedavg_logreg.server, "client": bad_client},
                     load_data=lambda s, ctx: None, declarations=fedavg_logreg.declarations,
                     settings=fedavg_logreg.Settings, sizes=fedavg_logreg.sizes)
    with pytest.raises(FederationFailed) as e:
        run_inmemory(algo, FED[:2], {"rounds": 1, "aggregation": "plain"}, timeout=10)
    msg = str(e.value)
    assert "'server'" in msg and "'client1'" in msg and "'fedavg/eval'" in msg and "field 'correct'" in msg


# ------------------------------------------------------------ item 7: failures named

def _threaded_parties(fed, run_dir, algo):
    """Parties of ``fed`` started by hand (no launcher), each in a thread of this process."""
    codes, ends = {}, {}

    def go(name):
        codes[name] = run_party(fed, name, run_dir, algo, echo=False)
        ends[name] = time.monotonic()

    ts = [threading.Thread(target=go, args=(p.name,), daemon=True) for p in fed.parties]
    for t in ts:
        t.start()
    return ts, codes, ends


def test_a_failing_party_tells_its_peers_who_stop_within_seconds_and_name_it(tmp_path):
    base = registry.get_algorithm("fedavg_logreg")

    def failing_client(party, s, data):
        if party.name == "client2":
            srv = party.peers_with_role("server")[0]
            party.recv(srv, fedavg_logreg.Kind.MODEL)
            raise RuntimeError("disk full while training")
        return base.roles["client"](party, s, data)

    algo = replace(base, roles={"server": base.roles["server"], "client": failing_client})
    fed = load(presets.path("demo"))
    fed = replace(fed, parties=fed.parties[:3], timeout=120.0)
    resolved, _ = prepare_local(fed, tmp_path / "run", {"rounds": 50, "aggregation": "plain"})
    ts, codes, ends = _threaded_parties(resolved, tmp_path / "run", algo)
    for t in ts:
        t.join(timeout=100)
    assert codes == {"server": 1, "client1": 1, "client2": 1}
    errs = {p: json.loads((tmp_path / "run" / "parties" / p / "error.json").read_text())
            for p in ("server", "client1", "client2")}
    assert "disk full" in errs["client2"]["error"] and errs["client2"]["cause"] == "own"
    # the peers were stopped by client2's notice (not by the 120 s receive timeout), and it names client2
    assert errs["server"]["cause"] == "peer_abort" and errs["server"]["culprit"] == "client2"
    assert "'client2' announced its own failure" in errs["server"]["error"]
    assert errs["client1"]["cause"] == "peer_abort" and errs["client1"]["culprit"] == "client2"
    for p in errs:
        assert json.loads((tmp_path / "run" / "parties" / p / "status.json").read_text())["state"] == "failed"


# ------------------------------------------------------------ items 13 and 14: the audit

@pytest.fixture(scope="module")
def fedavg_run(tmp_path_factory):
    # the four parties in one host process (one torch import): the audit reads the same transcripts;
    # made once for all workers (the tests change copies only)
    def make(folder):
        launch(replace(load(presets.path("demo")), hosts=1), folder, progress=False,
               overrides={"rounds": 2, "aggregation": "plain"}, timeout=120)
        assert audit(folder, registry.get_algorithm).ok
    return shared_run(tmp_path_factory, "receipt-fedavg", make)


def _resign(run_dir: Path, name: str, mutate) -> None:
    """Rewrite one party's transcript with ``mutate`` applied to its records and sign it again
    with a key written into the folder's config.json: signatures and chains verify, so only
    the declarations can catch what was changed."""
    config = json.loads((run_dir / "config.json").read_text())
    path = run_dir / "parties" / name / "transcript.jsonl"
    entry = next(p for p in config["party"] if p["name"] == name)
    recs = verify(path, name, config["run_id"], keyfiles.verify_key(entry["sign_key"])).records
    key_dir = run_dir.parent / f"{run_dir.name}-forger-keys"
    entry["sign_key"] = keyfiles.generate(key_dir, name, overwrite=True).sign
    (run_dir / "config.json").write_text(json.dumps(config))
    path.unlink()
    t = Transcript(path, name, config["run_id"], keyfiles.load_signing_key(key_dir, name))
    for r in recs:
        r = mutate(dict(r))
        if r.get("type", "msg") != "msg":   # a checkpoint record: kept as it was
            t.mark(r["type"], **{k: v for k, v in r.items() if k not in ("type", "i", "t", "party", "prev")})
            continue
        t.record(r["dir"], r["peer"], r["kind"], r["round"], r["seq"], r["bytes"], r["sha256"],
                 [(dt, tuple(sh)) for dt, sh in r["arrays"]], paths=r.get("paths"))
    t.close()


@pytest.mark.processes
def test_audit_checks_receive_records_against_the_declarations(fedavg_run, tmp_path):
    bad = tmp_path / "recv"
    shutil.copytree(fedavg_run, bad)

    def raw_features(r):
        if r.get("dir") == "recv" and r["kind"] == "agg/plain":
            r["arrays"] = [["<f8", [142, 30]]]  # a client's raw feature table
        return r

    _resign(bad, "server", raw_features)
    rep = audit(bad, registry.get_algorithm)
    assert not rep.ok
    assert any("recv record" in p and "agg/plain" in p for p in rep.problems), rep.problems[:5]


@pytest.mark.processes
def test_audit_declarations_are_exact_in_size(fedavg_run, tmp_path):
    bad = tmp_path / "size"
    shutil.copytree(fedavg_run, bad)

    def huge_model(r):
        if r.get("dir") == "send" and r["kind"] == "fedavg/model":
            r["arrays"] = [["<f8", [1_000_000]]]
        return r

    _resign(bad, "server", huge_model)
    rep = audit(bad, registry.get_algorithm)
    assert any("fedavg/model" in p and "n_params=31" in p for p in rep.problems), rep.problems[:5]
