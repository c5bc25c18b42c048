"""Attacks on the audit, each with the bound it must keep (issue 11, items 12 and 15).

* Malformed fields (``"bytes": null``, a list where the kind belongs, ...) in a
  re-signed transcript, or in ``config.json``: the audit reports a problem
  naming the party, record and field; it never crashes (before: a traceback).
* Replacing a party's ``sign_key`` in the run folder's ``config.json`` and
  re-signing its transcript with the new key: passes an audit that trusts the
  folder (which now says so loudly), and fails ``fedhet audit RUN
  --federation fed.toml`` against the federation file the auditor trusts.
* ``fedhet run`` keeps no secret key in the run folder, and removes the
  folder it kept them in when the run ends.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from fedhet.parties.ops import cli, presets
from fedhet.parties.audit import UNTRUSTED_KEYS_WARNING, audit
from fedhet.parties.federation import load
from fedhet.parties.ops.launcher import launch
from launch_tools import shared_run  # helper modules of tests/
from transcript_tools import resign

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)


@pytest.fixture(scope="module")
def psi_run(tmp_path_factory):
    """A PSI run made once for all workers (the tests change copies only), and the auditor's own
    copy of its federation file, taken before anyone could touch the folder."""
    fed = load(presets.path("psi"))
    fed = replace(fed, algorithm=dict(fed.algorithm, n=200, workers=0))

    def make(folder):
        assert launch(fed, folder / "run", progress=False, timeout=300)["ok"]
        shutil.copy(folder / "run" / "federation.toml", folder / "trusted.toml")
    base = shared_run(tmp_path_factory, "audit-psi", make)
    return base / "run", base / "trusted.toml"


def copy_run(run_dir: Path, dest: Path) -> Path:
    shutil.copytree(run_dir, dest)
    return dest


# ------------------------------------------------------------ item 12
MALFORMED = [("bytes", None), ("bytes", "12"), ("bytes", -5), ("seq", None), ("seq", [1]), ("seq", True),
             ("kind", None), ("kind", ["psi/setup"]), ("kind", {"k": 1}), ("peer", None), ("peer", {"x": 1}),
             ("dir", None), ("dir", "sideways"), ("arrays", None), ("arrays", [["<f4", None]]),
             ("arrays", [[1, [2]]]), ("arrays", "x" * 10_000), ("sha256", None), ("round", "1"), ("bytes", ...)]


@pytest.mark.parametrize("field,value", MALFORMED, ids=[f"{f}={str(v)[:12]}" for f, v in MALFORMED])
def test_malformed_record_is_reported_not_a_crash(psi_run, tmp_path, field, value):
    run_dir, trusted = psi_run
    run = copy_run(run_dir, tmp_path / "run")

    def edit(recs):
        if value is ...:
            del recs[1][field]
        else:
            recs[1][field] = value

    resign(run, "feature1", edit)
    rep = audit(run)  # must not raise
    assert not rep.ok
    hits = [p for p in rep.problems if p.startswith("feature1: record 1:") and repr(field) in p]
    assert hits, rep.problems
    assert all(len(p) < 600 for p in rep.problems)  # the 10,000-character value is quoted short
    assert cli.main(["audit", str(run)]) == 1


@pytest.mark.parametrize("config", [[], {"party": None}, {"party": [None]}, {"party": [{"name": ["a"], "role": 1}]},
                                    {"party": [{"name": "a", "role": "x", "sign_key": 5}]},
                                    {"party": [{"name": "a", "role": "x"}], "algorithm": "psi"}])
def test_malformed_config_is_reported_not_a_crash(psi_run, tmp_path, config):
    run = copy_run(psi_run[0], tmp_path / "run")
    (run / "config.json").write_text(json.dumps(config))
    rep = audit(run)
    assert not rep.ok and all(p.startswith(str(run / "config.json")) for p in rep.problems), rep.problems
    assert cli.main(["audit", str(run)]) == 1


# ------------------------------------------------------------ item 15
def test_clean_run_passes_against_the_trusted_federation_without_warning(psi_run):
    run_dir, trusted = psi_run
    rep = audit(run_dir, federation=trusted)
    assert rep.ok, rep.problems
    assert rep.warnings == []
    assert cli.main(["audit", str(run_dir), "--federation", str(trusted)]) == 0


def test_replaced_sign_key_passes_only_an_audit_that_trusts_the_folder(psi_run, tmp_path, capsys):
    run_dir, trusted = psi_run
    run = copy_run(run_dir, tmp_path / "run")
    resign(run, "feature2")  # same records, new key, new key in config.json
    rep = audit(run)
    assert rep.ok, rep.problems  # the folder is self-consistent...
    assert rep.warnings == [UNTRUSTED_KEYS_WARNING]  # ...and the audit says how little that means
    capsys.readouterr()
    assert cli.main(["audit", str(run)]) == 1  # issue 27, item 15: unverified unless the keys are accepted
    out = capsys.readouterr().out
    assert "WARNING" in out and "unverified: the signing keys come from the run folder itself" in out
    assert cli.main(["audit", str(run), "--trust-folder-keys"]) == 0
    rep = audit(run, federation=trusted)
    assert not rep.ok
    assert any(p.startswith("feature2:") and "signature does not verify" in p for p in rep.problems), rep.problems
    assert any(p.startswith("feature2:") and "different signing key" in p for p in rep.problems), rep.problems
    assert cli.main(["audit", str(run), "--federation", str(trusted)]) == 1


def test_trusted_federation_must_cover_the_run(psi_run, tmp_path):
    run_dir, trusted = psi_run
    fed = load(trusted)
    fed2 = replace(fed, parties=[replace(p, role="feature") if p.name == "owner" else p for p in fed.parties][:2],
                   source="<memory>", key_dir=None)
    other = tmp_path / "other.toml"
    other.write_text(fed2.to_toml())
    rep = audit(run_dir, federation=other)
    assert not rep.ok
    assert any("owner: role 'label_owner' in config.json, 'feature'" in p for p in rep.problems), rep.problems
    assert any(p.startswith("feature2: not a party of the trusted federation") for p in rep.problems)
    assert audit(run_dir, federation=tmp_path / "missing.toml").problems


def test_local_runs_keep_secret_keys_out_of_the_run_folder(psi_run):
    run_dir, _ = psi_run
    assert not list(run_dir.rglob("*.key")), "secret key files in the run folder"
    assert not (run_dir / "keys").exists()
    key_dir = load(run_dir / "federation.toml").key_dir
    assert key_dir is not None and not str(key_dir.resolve()).startswith(str(run_dir.resolve()))
    assert not key_dir.exists(), f"the secret key folder {key_dir} outlived the run"


@pytest.fixture(scope="module")
def secure_run(tmp_path_factory):
    """The demo (FedAvg with secure aggregation) for two rounds, made once for all workers."""
    def make(folder):
        assert launch(replace(load(presets.path("demo")), hosts=1), folder, progress=False, timeout=300,
                      overrides={"rounds": 2, "aggregation": "secure"})["ok"]
    return shared_run(tmp_path_factory, "audit-secure-demo", make)


def _drop_and_renumber(recs: list, direction: str, peer: str, kind: str, nth: int) -> int:
    """Delete the ``nth`` record of ``kind`` exchanged with ``peer`` in ``direction`` and number the
    later ones on that link one less; returns the deleted record's seq."""
    hits = [i for i, r in enumerate(recs) if r.get("dir") == direction and r.get("peer") == peer
            and r.get("kind") == kind]
    gone = recs.pop(hits[nth])
    for r in recs:
        if r.get("dir") == direction and r.get("peer") == peer and r.get("seq", -1) > gone["seq"]:
            r["seq"] -= 1
    return gone["seq"]


def test_a_matched_message_deleted_by_two_colluders_and_renumbered_is_an_impossible_order(secure_run, tmp_path):
    """Issue 43, item 5: the server and client1 delete the second round's ``secagg/keylist`` from both
    transcripts and renumber what follows on that link: every chain, signature, sequence and pairing
    checks, and the audit passed.  client1 still sent its shares for that round: the declared order
    (``secagg/shares`` after ``secagg/keylist``) shows a message is missing."""
    assert audit(secure_run, trust_folder_keys=True).ok   # the clean run keeps the order
    run = copy_run(secure_run, tmp_path / "run")
    resign(run, "server", lambda recs: _drop_and_renumber(recs, "send", "client1", "secagg/keylist", 1))
    resign(run, "client1", lambda recs: _drop_and_renumber(recs, "recv", "server", "secagg/keylist", 1))
    rep = audit(run, trust_folder_keys=True)
    assert not rep.ok
    order = [p for p in rep.problems if "impossible order" in p]
    assert order and all(p.startswith("client1:") for p in order), rep.problems
    assert not [p for p in rep.problems if "never received" in p or "never sent" in p or "gap" in p], rep.problems
