"""Launch helpers of the tests (a helper module of tests/): a launcher run in a background thread,
for the tests that kill or signal its processes mid-run (``test_launcher.py``, ``test_hosts.py``),
and process runs made once per test session for the tests that only read them."""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

from fedhet.parties.ops.launcher import launch


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


def shared_run(tmp_path_factory, name: str, make) -> Path:
    """A process run that several tests only read, made once per test session for all xdist
    workers: ``make(folder)`` runs it into ``folder`` (under the session's common temporary
    folder) while a file lock keeps the other workers waiting; later callers get the folder.  A
    test that changes a run works on a copy (``shutil.copytree``).  A ``make`` that raised is
    raised again by every caller, never half-made folders handed on."""
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's base is popen-gwN inside the session's folder; without it the base IS
    # the session's folder (its parent is common to every session: runs made by older code, and
    # their failure markers, would be handed to later sessions).
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(parents=True, exist_ok=True)
    folder, made, failed = root / name, root / f"{name}.made", root / f"{name}.failed"
    with FileLock(str(root / f"{name}.lock")):
        if failed.is_file():
            raise RuntimeError(f"the shared run {name!r} failed in another worker: {failed.read_text()}")
        if not made.is_file():
            shutil.rmtree(folder, ignore_errors=True)
            try:
                make(folder)
            except BaseException as e:
                failed.write_text(f"{type(e).__name__}: {e}")
                raise
            made.touch()
    return folder
