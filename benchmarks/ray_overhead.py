"""The Ray engine against local host processes, the same federations side by side: start-up, wall time, RSS.

Each case runs twice in one session, interleaved: ``engine = "local"`` (every party or host an OS
process of this machine, started by ``fedhet run``) and ``engine = "ray"`` on a real cluster of two
nodes on this machine (benchmarks/ray_cluster.py: a head and a second ``ray start`` with its own
resources and label; the same hosts, each a Ray actor that runs its host process on its node).  Every
run is audited.  Reported per run:

- **start-up**: from ``launch()`` until every party has reported (its ``status.json`` is in the
  driver's run folder; under Ray it travels through the engine's poll, every 0.3 s);
- **wall**: ``launch()`` to its return, the run folder brought back from the nodes included;
- **RSS**: the peak of the summed resident memory of the run's party and host processes (sampled
  from ``/proc`` every 0.2 s), and under Ray the engine's own: the actors (one Ray worker process
  per host) and the cluster's daemons (GCS, raylets, agents) while the run goes on.

The cluster's own start (``ray start`` of both nodes) is reported once: it is paid once per
cluster, not per run.

    python -m benchmarks.ray_overhead                # all cases (f3_metr_la when the data is found)
    python -m benchmarks.ray_overhead --quick        # the 4-party case only
    python -m benchmarks.ray_overhead --render-only
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from benchmarks import harness
from benchmarks.hosts_scale import Sampler, shamir_federation

NAME = "ray_overhead"


def fedavg_case():
    from fedhet.parties.federation import load

    return load(Path(__file__).parents[1] / "algorithms" / "fedavg_logreg" / "smoke.toml"), {}


def shamir_case():
    return shamir_federation(60, 4, timeout=600), {}


def secagg_case(k: int = 50):
    """SecAgg+ among ``k`` clients with 10 dropouts (K = 100 does not come up as processes on 2 cores, with
    either engine: its rows record how each fails; docs/ray.md)."""
    from benchmarks.secagg import client_names

    parties = [("server", "server")] + [(c, "client") for c in client_names(k)]
    fed = harness.federation({"name": "secagg_bench", "n_clients": k, "m": 100, "bench_rounds": 1,
                              "aggregation": "secure", "secagg_graph": "harary", "dropouts": 10,
                              "secagg_timeout": 10.0}, parties, name=f"secagg-{k}", timeout=180)
    return replace(fed, hosts=4), {}


def f3_case(data_dir: str):
    fed = harness.preset("f3_metr_la")
    return replace(fed, data_dir=data_dir), {"fusion": "shamir_linear", "local_epochs": 1, "epochs": 1,
                                             "patience": 1, "test_samples": 2}


CASES = {
    "fedavg_logreg: 4 parties, each its own process": (fedavg_case, "synthetic"),
    "shamir: 60 parties in 4 hosts": (shamir_case, "synthetic"),
    "secagg_bench (SecAgg+): K = 50 clients in 4 hosts, 10 dropouts": (secagg_case, "synthetic"),
    "secagg_bench (SecAgg+): K = 100 clients in 4 hosts, 10 dropouts": (lambda: secagg_case(100), "synthetic"),
    "f3_metr_la (shamir_linear, 1 epoch): 211 parties, 207 owners in 4 hosts": (None, "real graph, simulated windows"),
}


class Reported(threading.Thread):
    """The moment every party of the run has a ``status.json`` in the run folder."""

    def __init__(self, run_dir: Path, parties: list[str]):
        super().__init__(daemon=True)
        self.run_dir, self.parties, self.t0 = run_dir, parties, time.perf_counter()
        self.after_s: float | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            if all((self.run_dir / "parties" / p / "status.json").is_file() for p in self.parties):
                self.after_s = time.perf_counter() - self.t0
                return
            self.halt.wait(0.05)


def one(fed, overrides: dict, engine: str, cluster) -> dict:
    from fedhet.parties.audit import audit
    from fedhet.parties.ops.launcher import launch

    run_dir = Path(tempfile.mkdtemp(prefix=f"ray-overhead-{engine}-"))
    if engine == "ray":
        fed = replace(fed, engine="ray", ray_address=cluster.address)
        samplers = {"parties": Sampler("fedhet-ray-"), "actors": Sampler("ray::HostWorker"),
                    "daemons": Sampler(f":{cluster.port}")}
    else:
        samplers = {"parties": Sampler(run_dir)}
    reported = Reported(run_dir, [p.name for p in fed.parties])
    for s in samplers.values():
        s.start()
    reported.start()
    t0 = time.perf_counter()
    row: dict = {"engine": engine}
    try:
        summary = launch(fed, run_dir, progress=False, overrides=overrides, timeout=1200)
        row["wall_s"] = time.perf_counter() - t0
        rep = audit(run_dir)
        row.update({"ok": bool(summary["ok"]) and rep.ok, "audit_ok": rep.ok, "audit_problems": rep.problems[:3]})
        if engine == "ray":
            eng = summary["engine"]
            row.update({"nodes": eng["nodes"], "units": len(eng["units"]), "connect_s": eng.get("connect_s"),
                        "place_s": eng.get("place_s")})
    except Exception as e:  # a failed run is a result too
        why = str(e).replace(str(run_dir), run_dir.name)   # the folder by its name: no path of this machine
        row.update({"ok": False, "error": f"{type(e).__name__}: {why[:300]}", "wall_s": time.perf_counter() - t0})
    finally:
        reported.halt.set()
        for s in samplers.values():
            s.stop()
    row["startup_s"] = reported.after_s
    row.update({f"{k}_peak_rss_mib": s.peak_total_rss_mib for k, s in samplers.items()})
    row["processes"] = len(samplers["parties"].procs)
    if row.get("ok"):
        shutil.rmtree(run_dir, ignore_errors=True)
    else:
        row["run_dir"] = run_dir.name   # left for its logs
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    harness.add_common_args(ap, quick_help="only the 4-party case", render_only=True)
    ap.add_argument("--data-dir", help="the real datasets (default: ../shared/data or FEDHET_DATA_DIR)")
    ap.add_argument("--cases", nargs="*", help="case names to run (default: all that can run here)")
    args = ap.parse_args(argv)
    out = harness.Output(NAME, quick=args.quick, out_dir=args.out)
    if args.render_only:
        harness.render_only(out, markdown)
        return 0
    from benchmarks.ray_cluster import LocalCluster, rss_mib
    from fedhet.algorithms.datapath import data_root

    session = harness.Session(NAME, __file__, argv)
    data = args.data_dir or data_root(required=False)
    cases = list(CASES)[:1] if args.quick else [c for c in CASES if CASES[c][0] is not None or data]
    if args.cases:
        cases = [c for c in cases if any(a in c for a in args.cases)]
    t0 = time.perf_counter()
    cluster = LocalCluster(cpus_per_node=8)
    doc: dict = {"cases": [], "note": ""}
    try:
        cluster.start({"zone": "a"})
        head_s = time.perf_counter() - t0
        cluster.add_node("n2", {"zone": "b"}, {"node2": 1})
        doc["cluster"] = {"nodes": 2, "cpus_per_node": 8, "head_start_s": head_s,
                          "start_s": time.perf_counter() - t0, "idle_daemons_rss_mib": rss_mib(cluster.processes())}
        for case in cases:
            build, data_kind = CASES[case]
            fed, over = build() if build is not None else f3_case(str(data))
            rows = [one(fed, over, engine, cluster) for engine in ("local", "ray")]
            doc["cases"].append({"case": case, "parties": len(fed.parties), "data": data_kind,
                                 "hosts": len(fed.host_groups()), "runs": rows})
            print(json.dumps(doc["cases"][-1])[:400], flush=True)
            out.write(dict(doc, environment=session.meta))   # partial results survive a stop
    finally:
        cluster.stop()
    return harness.publish(out, doc, markdown, session)


def markdown(doc: dict) -> str:
    c = doc.get("cluster", {})
    lines = [
        "# The Ray engine against local host processes",
        "",
        f"A cluster of {c.get('nodes', '?')} nodes on this machine (each its own `ray start`, "
        f"{c.get('cpus_per_node', '?')} logical CPUs): started in {harness.dash(c.get('start_s'))} s (head "
        f"{harness.dash(c.get('head_start_s'))} s), its daemons idle at {harness.dash(c.get('idle_daemons_rss_mib'), '{:.0f}')} MiB RSS. "
        "Per run: start-up = until every party has reported; wall = `launch()` to its return (under Ray with "
        "the run folder brought back); RSS = peak of the summed resident memory of the parties' processes, "
        "and under Ray of the actors (one Ray worker per host or lone party) and the cluster's daemons. "
        "Every run passed `fedhet audit` unless its row says otherwise.",
        "",
        "| case | data | engine | ok | start-up s | wall s | wall ratio | parties RSS MiB | Ray actors MiB "
        "| Ray daemons MiB | nodes used |",
        "|---|---|---|:--|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in doc.get("cases", []):
        local = next((r for r in case["runs"] if r["engine"] == "local"), {})
        for r in case["runs"]:
            ratio = r["wall_s"] / local["wall_s"] if r.get("ok") and local.get("ok") else None
            lines.append(
                f"| {case['case']} | {case['data']} | {r['engine']} | {'yes' if r.get('ok') else 'NO: ' + r.get('error', '')} "
                f"| {harness.dash(r.get('startup_s'))} | {harness.dash(r.get('wall_s'))} | {harness.dash(ratio, '{:.2f}×')} "
                f"| {harness.dash(r.get('parties_peak_rss_mib'), '{:.0f}')} | {harness.dash(r.get('actors_peak_rss_mib'), '{:.0f}')} "
                f"| {harness.dash(r.get('daemons_peak_rss_mib'), '{:.0f}')} | {r.get('nodes', 1 if r['engine'] == 'local' else '–')} |")
    return "\n".join(lines + harness.closing_lines(doc))


if __name__ == "__main__":
    raise SystemExit(main())
