"""Shared pytest set-up: the slow marker, the data folder, small helpers.

Tests declare the real datasets they need in one way: the ``shared_data`` fixture (it gives the
folder), or the ``data`` marker for a test that only calls code which finds the folder itself.  Both
skip, with the reason, when the data are absent, and both are selected by ``-m data`` (CI's second
pass).  A test that reads the data without declaring it fails in CI's first pass, which runs with
no data visible (``FEDHET_DATA_DIR`` an empty folder and ``FEDHET_NO_SHARED=1``).
"""
from __future__ import annotations

import os

import pytest

from fedhet.algorithms.datapath import ENV_DATA_DIR, ENV_NO_SHARED, data_root
from fedhet.parties.inmemory import InMemoryParty


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
    parser.addoption("--ray", action="store_true", default=False,
                     help="also run the Ray engine's tests on a cluster they start on this machine (make test-ray)")


def pytest_collection_modifyitems(config, items):
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


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tests (``pytestmark = pytest.mark.usefixtures(...)``): the
    roles run with ``torch_threads = 1``, and on tiny layers extra intra-op threads only add
    spin-waits on a shared CPU."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
