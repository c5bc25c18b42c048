"""Shared pytest set-up: the slow marker, the data folder, small helpers."""
from __future__ import annotations

import pytest

from fedhet.algorithms.datapath import ENV_DATA_DIR, data_root


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
