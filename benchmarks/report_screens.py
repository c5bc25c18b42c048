"""Screenshots of ``fedhet report`` and ``fedhet board`` for one process run of each algorithm.

Runs each algorithm's smallest federation (its ``smoke.toml``: packaged or generated data) as
real party processes, audits it into its report, and takes in Debian's headless Chromium:

* ``docs/screens/report-ALGO.png``: the top of each run's report (verdict, summary, message map);
* ``docs/screens/board.png``: the board listing every run, and one more in progress (FedAvg's
  demo, paused on cue by ``FEDHET_PAUSE_AT`` while the screenshot is taken).

``docs/screens/screens.json`` names the commit and machine, and each run's folder, wall time and
audit verdict.  Usage: ``python -m benchmarks.report_screens [--runs DIR]``.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
from dataclasses import replace
from pathlib import Path

from benchmarks import harness
from benchmarks.browser import board_server, browser

REPO = Path(__file__).resolve().parents[1]
ALGORITHMS = ("chfl", "hyfem", "stfl", "f3", "mmvfl", "he_split")
OUT = REPO / "docs" / "screens"
HEIGHT = 1800   # px of each report's top that the screenshot keeps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=None, help="folder for the runs (default a temporary one)")
    ap.add_argument("--only", nargs="*", choices=ALGORITHMS, help="these algorithms only")
    args = ap.parse_args(argv)
    import tempfile

    from fedhet.algorithms.registry import get_algorithm
    from fedhet.parties.ops import presets
    from fedhet.parties.faults import PAUSE_ENV
    from fedhet.parties.federation import load
    from fedhet.parties.ops.launcher import launch
    from fedhet.parties.ops.report import write
    from fedhet.parties.ops.runview import view

    # the results file names no path of this machine: the runs folder is "RUNS", each run its name in it
    shown = list(sys.argv[1:] if argv is None else argv)
    if "--runs" in shown and shown.index("--runs") + 1 < len(shown):
        shown[shown.index("--runs") + 1] = "RUNS"
    session = harness.Session("report_screens", __file__, shown)
    runs = Path(args.runs) if args.runs else Path(tempfile.mkdtemp(prefix="fedhet-screens-"))
    OUT.mkdir(parents=True, exist_ok=True)
    done = []
    for algo in args.only or ALGORITHMS:
        run = runs / algo
        print(f"{algo}: running its smoke federation as processes into {run}", flush=True)
        summary = launch(load(REPO / "algorithms" / algo / "smoke.toml"), run, progress=False, timeout=600)
        page = write(run, lookup=get_algorithm)
        v = view(run, get_algorithm)
        done.append({"algorithm": algo, "run": f"RUNS/{algo}", "wall_s": summary["wall_s"], "audit_ok": v["audit"]["ok"],
                     "kinds": len(v["kinds"]), "screenshot": f"report-{algo}.png"})
        with browser() as b:
            pg = b.new_page(viewport={"width": 1300, "height": HEIGHT})
            pg.goto(page.as_uri())
            pg.wait_for_function("window.fedhetReady === true", timeout=120_000)
            pg.screenshot(path=str(OUT / f"report-{algo}.png"), clip={"x": 0, "y": 0, "width": 1300, "height": HEIGHT})
    # and one run in progress: FedAvg's demo, its client1 paused on cue after round 3 of 6
    go = runs / "release-live"
    os.environ[PAUSE_ENV] = f"client1:3:{go}"
    live = threading.Thread(target=launch, args=(replace(load(presets.path("demo")), hosts=1), runs / "live"),
                            kwargs={"progress": False, "overrides": {"rounds": 6}}, daemon=True)
    live.start()
    token = secrets.token_urlsafe(12)
    try:
        with board_server(runs, token) as url, browser() as b:
            pg = b.new_page(viewport={"width": 1500, "height": 700})
            pg.goto(f"{url}/?token={token}")
            pg.wait_for_selector('tr[data-run="live"][data-state="running"]', timeout=300_000)
            pg.wait_for_timeout(1500)
            pg.screenshot(path=str(OUT / "board.png"), full_page=True)
    finally:
        go.touch()
        del os.environ[PAUSE_ENV]
        live.join(300)
    doc = {"runs": done, "board": "board.png", "environment": session.finish()}
    (OUT / "screens.json").write_text(harness.json_text(doc) + "\n")
    print(json.dumps(done, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
