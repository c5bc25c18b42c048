"""Shared pytest set-up: the slow marker, the data folder, small helpers.

Tests declare the real datasets they need in one way: the ``shared_data`` fixture (it gives the
folder), or the ``data`` marker for a test that only calls code which finds the folder itself.  Both
skip, with the reason, when the data are absent, and both are selected by ``-m data`` (CI's second
pass).  A test that reads the data without declaring it fails in CI's first pass, which runs with
no data visible (``FEDHET_DATA_DIR`` an empty folder and ``FEDHET_NO_SHARED=1``).

Every test belongs to one **tier**, by what it starts (a module's ``pytestmark`` or a test's own
marker; ``netns``, ``ray`` and ``browser`` imply ``system``):

- ``unit``: functions and objects, no party;
- ``federation``: parties in this process (``InMemoryParty`` threads, a ``ZmqParty`` over sockets);
- ``processes``: party processes (the launcher, ``fedhet`` commands); ``smoke`` marks the few that
  ``make test`` runs, one audited process run per algorithm family;
- ``system``: network namespaces, a Ray cluster, a browser.

A test that starts more than its tier says fails, naming the tier it needs, so the markers stay
true.  ``make test`` runs ``--tiers unit,federation,smoke``; CI (``make test-all``) runs every tier.
Each worker runs torch, BLAS and numba with one thread: two workers on two cores are enough, and
extra intra-op threads on tiny layers only spin-wait (a tiny F³ test took 52 s instead of 0.4 s).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

# One thread per worker for torch, BLAS/OpenMP and numba, set before any of them is imported here
# (the environment also reaches the party processes a test starts).
for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

import pytest  # noqa: E402

from fedhet.algorithms.datapath import ENV_DATA_DIR, ENV_NO_SHARED, data_root  # noqa: E402
from fedhet.parties.inmemory import InMemoryParty  # noqa: E402

TIERS = ("unit", "federation", "processes", "system")
SYSTEM_MARKS = ("netns", "ray", "browser")   # each implies the system tier


def data_folder():
    """The real datasets' folder, or None when it is absent or holds no dataset folder."""
    root = data_root(required=False)
    if root is None or not any(p.is_dir() for p in root.iterdir()):
        return None
    return root


def no_data_reason() -> str:
    why = [f"{k}={os.environ[k]}" for k in (ENV_DATA_DIR, ENV_NO_SHARED) if os.environ.get(k)]
    return (f"needs the real datasets: ../shared/data beside the repository or {ENV_DATA_DIR} "
            f"(none visible{': ' + ', '.join(why) if why else ''})")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run paper reproductions and other slow tests")
    parser.addoption("--tiers", default="",
                     help="comma-separated tiers to run: unit, federation, processes, system, and smoke (the "
                          "processes tests make test runs); default every tier")
    parser.addoption("--record-tiers", default="",
                     help="append, per test, its tier and what it started (processes, in-memory parties) to "
                          "this file, and fail none for it (how the tier markers were first set)")
    parser.addoption("--ray", action="store_true", default=False,
                     help="also run the Ray engine's tests on a cluster they start on this machine (make test-ray)")


def tier_of(item) -> str:
    """The one tier of a test: its own tier marker, else its module's (``pytestmark``); a
    ``netns``, ``ray`` or ``browser`` marker means ``system``."""
    if any(item.get_closest_marker(m) is not None for m in SYSTEM_MARKS):
        return "system"
    own = [m.name for m in item.iter_markers() if m.name in TIERS]
    if not own and item.config.getoption("--record-tiers"):
        return "unit"
    if not own:
        raise pytest.UsageError(f"{item.nodeid}: no tier marker: mark the test or its module with one of "
                                f"{', '.join(TIERS)} (tests/conftest.py says what each starts)")
    return own[0]   # the closest first: a test's own marker overrides its module's


def pytest_collection_modifyitems(config, items):
    chosen = [t.strip() for t in (config.getoption("--tiers") or "").split(",") if t.strip()]
    unknown = set(chosen) - {*TIERS, "smoke"}
    if unknown:
        raise pytest.UsageError(f"--tiers: unknown {', '.join(sorted(unknown))} (known: {', '.join(TIERS)}, smoke)")
    keep, drop = [], []
    for item in items:
        tier = tier_of(item)
        item.user_properties.append(("tier", tier))
        smoke = tier == "processes" and item.get_closest_marker("smoke") is not None
        (keep if not chosen or tier in chosen or (smoke and "smoke" in chosen) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    runslow = config.getoption("--runslow")
    skip = pytest.mark.skip(reason="slow: run with --runslow (or the benchmarks)")
    no_ray = None if config.getoption("--ray") else pytest.mark.skip(
        reason="Ray engine on a cluster of this machine: run with --ray (`make test-ray` installs fedhet[ray])")
    no_data = None if data_folder() is not None else pytest.mark.skip(reason=no_data_reason())
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.data)   # so `-m data` selects every test that reads the data
        if no_data is not None and "data" in item.keywords:
            item.add_marker(no_data)
        if not runslow and "slow" in item.keywords:
            item.add_marker(skip)
        if no_ray is not None and "ray" in item.keywords:
            item.add_marker(no_ray)


@pytest.fixture(scope="session")
def shared_data():
    """The real datasets folder; tests that need it skip with the reason when it is absent."""
    root = data_folder()
    if root is None:
        pytest.skip(no_data_reason())
    return root


@pytest.fixture
def wire(monkeypatch):
    """Every frame set any in-memory party puts on the wire, as (sender, receiver, frames)."""
    frames: list = []
    orig = InMemoryParty._transport_send

    def capture(self, to, fr):
        frames.append((self.name, to, [bytes(f) for f in fr]))
        return orig(self, to, fr)

    monkeypatch.setattr(InMemoryParty, "_transport_send", capture)
    return frames


_STARTS = {"unit": 0, "federation": 1, "processes": 2, "system": 3}
_started: list[str] = []   # what the running test (its fixtures included) started: set per test


def pytest_configure(config):
    """Watch every process start and party object (in memory, or over sockets in this process) for
    the whole session; the tier guard reads what the running test started (module fixtures
    included: they start in its set-up).  torch, if something imported it already, gets one thread."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    class WatchedPopen(subprocess.Popen):
        def __init__(self, args, *a, **k):
            _started.append("process " + (args if isinstance(args, str) else " ".join(map(str, list(args)[:3]))))
            super().__init__(args, *a, **k)

    def watched(cls):
        orig = cls.__init__

        def init(self, *a, **k):
            _started.append(f"{cls.__name__} {a[0] if a else k.get('name')!r}")
            orig(self, *a, **k)
        cls.__init__ = init

    from fedhet.parties.zmq_transport import ZmqParty   # a party over sockets in this process

    subprocess.Popen = WatchedPopen   # type: ignore[misc]
    watched(InMemoryParty)
    watched(ZmqParty)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _started.clear()
    yield
    record = item.config.getoption("--record-tiers")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps({"test": item.nodeid, "tier": dict(item.user_properties).get("tier"),
                                "started": sorted(set(_started))}) + "\n")


@pytest.fixture(autouse=True)
def _tier_guard(request):
    """A test that starts more than its tier says fails, naming the tier it needs: a unit test
    that makes an in-memory party, or a unit or federation test that starts a process."""
    tier = dict(request.node.user_properties).get("tier", "unit")
    yield
    if request.config.getoption("--record-tiers"):
        return
    procs = [s for s in _started if s.startswith("process")]
    if procs and _STARTS[tier] < _STARTS["processes"]:
        pytest.fail(f"a {tier}-tier test started a {procs[0]}: mark it processes (or system)", pytrace=False)
    if _started and tier == "unit":
        pytest.fail(f"a unit-tier test started a party ({_started[0]}): mark it federation", pytrace=False)
