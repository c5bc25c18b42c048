"""Secure aggregation at scale as processes (issue 45): no client talks to another client.

K = 200 SecAgg+ clients and a server in host processes (the default process tier), and K = 1,000 in
the slow tier, each a real party with its own CURVE and signing keys, started by the launcher and
audited.  What is checked: the exact sum within its bound over the clients counted, every client
dialled the server and nobody else and sent nothing to another client (no client-to-client link),
and the audit passes.  No timing is asserted.
"""
from __future__ import annotations

import pytest

from fedhet.parties.audit import audit
from fedhet.parties.ops.launcher import launch

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)


def run_scale(k: int, tmp_path, dropouts: int = 0, step_timeout: float = 30.0):
    from benchmarks.secagg_scale import federation

    fed = federation(k, "harary", m=100, dropouts=dropouts, step_timeout=step_timeout, timeout=600)
    run_dir = tmp_path / f"secagg-{k}"
    summary = launch(fed, run_dir, progress=False, timeout=1800)
    return summary, audit(run_dir)


def check(summary, rep, k: int, dropouts: int) -> None:
    assert summary["ok"] and rep.ok, rep.problems[:5]
    parties = summary["parties"]
    rounds = parties["server"]["result"]
    assert len(rounds) == 2
    for r in rounds:
        assert r["sum_err"] <= r["sum_bound"], r   # the exact sum, over the clients counted
    assert rounds[0]["contributors"] == k and rounds[1]["contributors"] <= k - dropouts
    assert parties["server"]["traffic"]["dialled"] == k   # the server dials each client it answers
    for name, p in parties.items():
        if name == "server":
            continue
        t = p["traffic"]
        assert t["dialled"] == 1 and set(t["bytes_sent"]) == {"server"}, (name, t)   # one link, to the server


def test_k200_secagg_plus_in_host_processes_clients_dial_only_the_server(tmp_path):
    summary, rep = run_scale(200, tmp_path)
    check(summary, rep, 200, 0)


@pytest.mark.slow
def test_k1000_secagg_plus_with_dropouts_completes_exactly(tmp_path):
    summary, rep = run_scale(1000, tmp_path, dropouts=100, step_timeout=20.0)
    check(summary, rep, 1000, 100)
