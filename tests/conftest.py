"""Shared pytest set-up: the slow marker, the data folder, small helpers."""
from __future__ import annotations

import pytest

from fedhet.algorithms.datapath import ENV_DATA_DIR, data_root
from fedhet.parties.inmemory import InMemoryParty


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False,
                     help="also run paper reproductions and other slow tests")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="slow: run with --runslow (or the benchmarks)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def shared_data():
    """The real datasets folder; tests that need it skip with the reason when it is absent."""
    root = data_root(required=False)
    if root is None:
        pytest.skip(f"needs ../shared/data beside the repository (or {ENV_DATA_DIR})")
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
