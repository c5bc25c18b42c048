"""A launcher run in a background thread, for the tests that kill or signal its processes
mid-run (``test_launcher.py``, ``test_hosts.py``); a helper module of tests/."""
from __future__ import annotations

import threading
import time

from fedhet.parties.launcher import launch


def launch_in_background(fed, run_dir, overrides: dict | None = None) -> tuple[threading.Thread, dict]:
    """Start ``launch(fed, run_dir)`` on a daemon thread; returns the thread and an outcome dict
    that gets ``error`` (what launch raised) and ``t`` (time.monotonic() when it raised)."""
    outcome: dict = {}

    def target():
        try:
            launch(fed, run_dir, progress=False, overrides=overrides)
        except BaseException as e:  # noqa: BLE001 - the test inspects it
            outcome["error"] = e
            outcome["t"] = time.monotonic()

    th = threading.Thread(target=target, daemon=True)
    th.start()
    return th, outcome
