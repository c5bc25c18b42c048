"""The PSI tests' oracle, shared by both backends' tests (``test_psi.py``, ``test_psi_kkrt.py``).

* :func:`psi_runner`: the two PSI roles as an ad-hoc in-memory algorithm, run on given ID lists
  (the label owner ``lo``, feature parties ``f0``, ``f1``, ...); keyword settings (``order``,
  ``chunk``, ``workers``, ``reveal``, ``backend``) reach the protocol calls.
* :func:`expected` / :func:`check_result`: what every party must end with, computed with
  Python sets.
* :func:`intersection_tests`: the two tests both backends meet: every case of :data:`CASES` and
  hypothesis' lists of :data:`ids` give what Python's sets give.
* :func:`unkeyed_hashes` / :func:`leaks` / :func:`scan_a_run`: the scan that no raw ID or unkeyed
  hash of one crosses the wire; :func:`two_runs_differ`: fresh randomness in every run;
  :func:`declared_envelopes`: every frame as its backend declares it.
"""
from __future__ import annotations

import hashlib
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedhet.crypto import ecdh_psi as grp
from fedhet.parties.inmemory import run_inmemory
from fedhet.protocols import psi


def psi_runner(name: str, *, backend: str = "ecdh", timeout: float = 30.0):
    """``run_psi(lo_ids, feature_ids, **cfg)`` -> each party's PSIResult, ``backend`` unless the
    call's ``backend=`` says otherwise."""

    def lo(party, cfg, ids):
        return psi.psi_label_owner(party, ids, party.peers_with_role("feature"), reveal_to_all=cfg.get("reveal", True),
                                   order=cfg.get("order", "sorted"), chunk=cfg.get("chunk", 7),
                                   workers=cfg.get("workers", 0), backend=cfg.get("backend", backend))

    def fe(party, cfg, ids):
        return psi.psi_feature_party(party, ids, party.peers_with_role("label_owner")[0], chunk=cfg.get("chunk", 5),
                                     workers=cfg.get("workers", 0), backend=cfg.get("backend", backend))

    algo = types.SimpleNamespace(NAME=name, ROLES={"label_owner": lo, "feature": fe}, load_data=None)

    def run_psi(lo_ids, feature_ids, **cfg):
        parties = [("lo", "label_owner")] + [(f"f{j}", "feature") for j in range(len(feature_ids))]
        data = {"lo": list(lo_ids)} | {f"f{j}": list(ids) for j, ids in enumerate(feature_ids)}
        return run_inmemory(algo, parties, cfg=cfg, data=data, timeout=timeout)

    return run_psi


def expected(lo_ids, *others):
    common = set(lo_ids)
    for o in others:
        common &= set(o)
    return sorted(common, key=grp.sort_key)


def check_result(res, lo_ids, feature_ids):
    want = expected(lo_ids, *feature_ids)
    data = {"lo": list(lo_ids)} | {f"f{j}": list(ids) for j, ids in enumerate(feature_ids)}
    for name, r in res.items():
        assert r.revealed and r.ids == want, name
        # rows point at the first occurrence of each common ID in that party's own input
        assert [data[name].index(i) for i in r.ids] == r.rows.tolist(), name
        assert r.rows.dtype == np.int64


CASES = {
    "both empty": ([], [[]]),
    "owner empty": ([], [["a", "b"]]),
    "feature empty": ([1, 2, 3], [[]]),
    "disjoint": (list(range(20)), [list(range(20, 45))]),
    "identical": ([f"id{i}" for i in range(30)], [[f"id{i}" for i in range(30)]]),
    "partial": (list(range(0, 60, 2)), [list(range(0, 60, 3))]),
    "duplicates": ([5, 1, 5, 2, 1, 9, 9, 3], [[9, 9, 1, 7, 1, 5, 5]]),
    "unicode": (["Zoë", "日本", "🙂", "e\u0301", "\u00e9", "a"], [["\u00e9", "🙂", "b", "日本", "日本"]]),
    "types kept apart": ([1, "1", b"1", 2], [["1", 2, b"2", -1]]),
}

ids = st.lists(st.one_of(st.integers(-50, 50), st.text(max_size=4)), max_size=30)


def intersection_tests(run_psi, cases: dict, max_examples: int):
    """The two intersection tests for one backend's ``run_psi``; a test module binds them to
    their names (pytest collects them there).  Both run parties in memory (the federation tier)."""

    @pytest.mark.federation
    @pytest.mark.parametrize("case", cases)
    def test_intersection_equals_python_sets(case):
        lo_ids, feature_ids = cases[case]
        check_result(run_psi(lo_ids, feature_ids), lo_ids, feature_ids)

    @pytest.mark.federation
    @settings(max_examples=max_examples, deadline=None)
    @given(ids, ids)
    def test_intersection_equals_python_sets_hypothesis(x, y):
        check_result(run_psi(x, [y]), x, [y])

    return test_intersection_equals_python_sets, test_intersection_equals_python_sets_hypothesis


def unkeyed_hashes(raw_ids, extra=lambda raw, enc: []):
    """Raw ID bytes and unkeyed hashes of each ID a careless implementation might send
    (``extra(raw, encoded)`` adds a backend's own (label, bytes) pairs), as bytes -> what."""
    out = {}
    for x in raw_ids:
        raw = x.encode() if isinstance(x, str) else bytes(x)
        enc = grp.encode_item(x)
        for label, v in [("raw", raw), ("encoded", enc), ("sha256", hashlib.sha256(raw).digest()), *extra(raw, enc)]:
            out[v] = f"{label} of {x!r}"
    return out


def leaks(frames, forbidden):
    """Every forbidden value found in a captured frame (``wire`` fixture), named."""
    return [f"{frm}->{to}: {what}" for frm, to, fr in frames for f in fr
            for v, what in forbidden.items() if v in f]


def scan_a_run(run_psi, wire, forbidden):
    """Two parties with 40 customer IDs each, 15 in common, in chunks of 16: the run finds the 15, and
    nothing on the wire (``wire`` fixture) is in ``forbidden(ids)``; returns both ID lists and that map."""
    rng = np.random.default_rng(2)
    mk = lambda k: [f"cust-{v:08d}-é" for v in rng.integers(0, 10**8, k)]  # noqa: E731
    lo_ids, f_ids = mk(40), mk(40)
    f_ids[:15] = lo_ids[:15]
    res = run_psi(lo_ids, [f_ids], chunk=16)
    assert res["f0"].size == 15
    bad = forbidden(lo_ids + f_ids)
    assert len(wire) > 6 and leaks(wire, bad) == []
    return lo_ids, f_ids, bad


def declared_envelopes(wire, backend: str) -> list:
    """Every captured frame decoded and held to ``backend``'s declarations (roles of sender and
    receiver, array records, payload schema); the envelopes, in order (parties lo, f0, f1, ...)."""
    from fedhet.parties import codec
    from fedhet.parties import declare as decl

    declared = decl.index(psi.declarations(backend=backend))
    role = lambda name: "label_owner" if name == "lo" else "feature"  # noqa: E731
    envs = []
    for _, _, fr in wire:
        e = codec.decode(fr)
        d = declared[e.kind]
        assert decl.role_ok(role(e.frm), d.sender) and decl.role_ok(role(e.to), d.receiver)
        assert decl.check_record(d, e.arrays) is None, (e.kind, e.arrays)
        d.payload.validate(e.payload)
        envs.append(e)
    return envs


def max_in_flight(wire, data_kind: str, ack_kind: str) -> tuple[int, int]:
    """(the most ``data_kind`` chunks ever sent and not yet acknowledged (``ack_kind``), chunks sent)."""
    from fedhet.parties import codec

    out = most = sent = 0
    for _, _, fr in wire:
        kind = codec.decode(fr).kind
        sent += kind == data_kind
        out += (kind == data_kind) - (kind == ack_kind)
        most = max(most, out)
    return most, sent


def two_runs_differ(run_psi, wire, arrays):
    """The same two ID lists intersected twice: every (kind, payload key) array in ``arrays`` has the
    same shape both times and differs in over 90 % of its bytes (fresh randomness each run); returns
    both runs' decoded envelopes."""
    from fedhet.parties import codec

    lo_ids, f_ids = [f"id{i}" for i in range(200)], [f"id{i}" for i in range(100, 300)]
    runs = []
    for _ in range(2):
        wire.clear()
        run_psi(lo_ids, [f_ids])
        runs.append([codec.decode(fr) for _, _, fr in wire])
    for kind, key in arrays:
        a, b = (np.concatenate([e.payload[key].reshape(-1) for e in run if e.kind == kind]) for run in runs)
        assert a.shape == b.shape and (a != b).mean() > 0.9, kind
    return runs


def psi_job_as_processes(run_dir, overrides: dict, kinds: set, timeout: float = 180):
    """The ``psi`` preset as party processes with ``overrides``: every party agrees on a correct
    intersection, the audit passes, and the transcripts hold at least the PSI ``kinds``; the audit report."""
    from fedhet.parties.ops import presets
    from fedhet.parties.audit import audit
    from fedhet.parties.federation import load
    from fedhet.parties.ops.launcher import launch

    summary = launch(load(presets.path("psi")), run_dir=run_dir, progress=False, timeout=timeout,
                     overrides=overrides)
    assert summary["ok"]
    results = [p["result"] for p in summary["parties"].values()]
    assert len(results) == 3 and all(r["correct"] and r["rows_aligned"] for r in results)
    assert len({r["ids_sha256"] for r in results}) == 1
    rep = audit(run_dir)
    assert rep.ok, rep.problems
    assert {row["kind"] for row in rep.table} >= kinds
    return rep
