"""Secure aggregation from 50 to 1,000 clients as processes: wall time, per-client and server cost, connections.

Each configuration is one run of the registered job ``secagg_bench`` (``fedhet.algorithms.secagg_job``)
started by fedhet's launcher: a server and K clients, every party a real party (its own CURVE and
signing keys, sockets, signed transcript) in host processes (``[federation] hosts``: the launcher's
default, :func:`fedhet.parties.ops.launcher.default_hosts`, at least 4), CURVE ZeroMQ on loopback,
and every run audited (``fedhet audit``).  Two rounds: a warm-up round with every client, then a
timed round in which 10 % of the clients vanish, spread over the four steps
(``secagg_job.data.dropout_plan``); the server waits its per-step timeout once for each step with a
dropout, so that round's wall time is mostly those waits and is reported beside them.

Per run: the launcher's wall time; both rounds' wall time at the server and its steps; the exact
sum's error against its bound over the clients counted; per client (median over the clients) the
thread CPU of its ``submit`` and the bytes it sent and received in the round; the server's CPU and
bytes; sampled from ``/proc`` every 0.5 s, the most TCP connections of the run established at once
(one per connection: the accepting end's listening port is a party's) and each process's peak RSS,
descriptors and threads; from every party's ``result.json``, the handshakes retried
(``traffic.handshake_retries``) and the connections its guard cut (``traffic.guard_cuts``).  A lost
message would leave a sequence gap that fails the run and the audit, so a passed, audited run lost
none.  For SecAgg+ at one m the per-client and server costs are fitted as K^a (log-log slope).

With ``--flower PY`` (an interpreter with ``flwr[simulation]``; ``$FEDHET_FLOWER_PYTHON``), Flower's
SecAgg+ runs in its own simulation engine at the same K, m, neighbours and threshold
(``benchmarks/flower_secagg.py``), interleaved with fedhet's runs of that K.

    python -m benchmarks.secagg_scale                       # K in 50 100 200 500 1000 at m = 1000, 100 and 1000 at
                                                            # m = 100,000; the complete graph at K = 100
    python -m benchmarks.secagg_scale --ks 100 200 --flower /path/to/flwr/python
    python -m benchmarks.secagg_scale --quick               # K = 20 and 50
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import harness
from benchmarks.hosts_scale import Sampler
from fedhet.algorithms import secagg_job

NAME = "secagg_scale"
DROPOUT_FRACTION = 0.10
MIN_HOSTS = 4


def federation(k: int, graph: str = "harary", m: int = 1000, dropouts: int | None = None,
               step_timeout: float = 10.0, hosts: int | None = None, timeout: float = 600.0):
    """The server and ``k`` clients of ``secagg_bench``: one warm-up round and one timed round in which
    ``dropouts`` clients (default 10 %) vanish; hosts: the launcher's default for that many parties, at least 4."""
    from fedhet.parties.ops.launcher import default_hosts

    drops = int(round(DROPOUT_FRACTION * k)) if dropouts is None else int(dropouts)
    parties = [("server", "server")] + [(c, "client") for c in secagg_job.client_names(k)]
    fed = harness.federation({"name": secagg_job.NAME, "n_clients": k, "m": m, "bench_rounds": 1,
                              "aggregation": "secure", "secagg_graph": graph, "dropouts": drops,
                              "secagg_clip": secagg_job.CLIP, "secagg_max_weight": secagg_job.MAX_WEIGHT,
                              "secagg_timeout": float(step_timeout)},
                             parties, name=f"secagg-scale-{k}", timeout=timeout)
    if hosts is None:   # the launcher's default (the server in a process of its own), at least MIN_HOSTS
        placed = default_hosts(fed)[0]
        return replace(placed, hosts=max(MIN_HOSTS, placed.hosts))
    return replace(fed, hosts=int(hosts))


class Connections(threading.Thread):
    """The most TCP connections of a run established at once: ESTABLISHED sockets whose local port is one
    its parties listen on (the accepting end of each connection), from /proc/net/tcp every ``every_s``."""

    def __init__(self, run_dir: Path, every_s: float = 0.5):
        super().__init__(daemon=True)
        self.run_dir, self.every = Path(run_dir), every_s
        self.ports: set[int] = set()
        self.peak = 0
        self.halt = threading.Event()

    def _ports(self) -> set[int]:
        f = self.run_dir / "federation.toml"
        if not f.is_file():
            return set()
        return {int(p) for p in re.findall(r'endpoint = "tcp://[^"]*:(\d+)"', f.read_text())}

    def _count(self) -> int:
        n = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = Path(table).read_text().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if len(f) > 3 and f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) in self.ports:
                    n += 1
        return n

    def run(self) -> None:
        while not self.halt.is_set():
            if not self.ports:
                self.ports = self._ports()
            if self.ports:
                self.peak = max(self.peak, self._count())
            self.halt.wait(self.every)

    def stop(self) -> None:
        self.halt.set()
        self.join()


def _total(traffic: dict, key: str) -> int | None:
    """The parties' ``traffic[key]["total"]`` summed; None where no party reports it."""
    vals = [t[key]["total"] for t in traffic.values() if isinstance(t.get(key), dict)]
    return sum(vals) if vals else None


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else None


def _round(rec: dict, dropped: set[str]) -> dict:
    """One round of the server's record: wall, steps, error, and the median counted client's cost."""
    clients = {c: v for c, v in rec["clients"].items() if c not in dropped}
    return {"wall_s": rec["wall"], "steps_s": rec["steps_s"], "contributors": rec["contributors"],
            "dropped": len(rec["dropped"]), "sum_err": rec["sum_err"], "sum_bound": rec["sum_bound"],
            "exact": bool(rec["sum_err"] <= rec["sum_bound"]), "server_cpu_s": rec["server_cpu"],
            "client_cpu_s": _median(v.get("cpu") for v in clients.values()),
            "client_up_bytes": _median(v.get("up") for v in clients.values()),
            "client_down_bytes": _median(v.get("down") for v in clients.values()),
            "server_down_bytes": sum(v.get("up", 0) for v in rec["clients"].values()),
            "server_up_bytes": sum(v.get("down", 0) for v in rec["clients"].values())}


def measure(k: int, graph: str, m: int, step_timeout: float, hosts: int | None = None) -> dict:
    fed = federation(k, graph, m, step_timeout=step_timeout, hosts=hosts)
    run_dir = Path(tempfile.mkdtemp(prefix=f"secagg-scale-{k}-"))
    sampler, conns = Sampler(run_dir, every_s=0.5), Connections(run_dir)
    sampler.start()
    conns.start()
    row: dict = {"K": k, "graph": graph, "m": m, "hosts": fed.hosts, "step_timeout_s": step_timeout,
                 "dropouts_planned": int(round(DROPOUT_FRACTION * k))}
    try:
        out = harness.launch_audited(fed, run_dir=run_dir, keep=True)
    except Exception as e:  # a configuration that does not complete is a result too
        sampler.stop()
        conns.stop()
        row.update({"ok": False, "error": f"{type(e).__name__}: {str(e)[:400]}".replace(str(run_dir), run_dir.name)})
        return row
    sampler.stop()
    conns.stop()
    parties = out.summary["parties"]
    recs = parties["server"]["result"]
    warm, timed = recs[0], recs[-1]
    traffic = {n: p.get("traffic", {}) for n, p in parties.items()}
    procs = list(sampler.procs.values())
    row.update({
        "ok": bool(out.summary["ok"]) and bool(out.audit_ok) and all(r["sum_err"] <= r["sum_bound"] for r in recs),
        "audit_ok": out.audit_ok, "audit_problems": out.audit_problems[:5], "wall_s": out.wall_s, "cpu_s": out.cpu_s,
        "warmup": _round(warm, set()), "timed": _round(timed, set(timed["dropped"])),
        "dropout_waits_s": step_timeout * sum(1 for s, v in timed["steps_s"].items() if v >= step_timeout * 0.99),
        "tcp_connections_peak": conns.peak,
        "dialled_by_server": traffic["server"].get("dialled"),
        "dialled_per_client_max": max(t.get("dialled", 0) for n, t in traffic.items() if n != "server"),
        "handshake_retries": sum(t.get("handshake_retries", {}).get("total", 0) for t in traffic.values()),
        "guard_cuts": sum(t.get("guard_cuts", {}).get("total", 0) for t in traffic.values()),
        "guard_cuts_listed": sum(sum(t.get("guard_cuts", {}).get("listed", {}).values()) for t in traffic.values()),
        "resent": _total(traffic, "resent"),   # None: this transport sends nothing again after a break
        "messages_lost": 0,   # a sequence gap fails the run and the audit: this row passed both
        "processes": len(procs), "peak_total_rss_mib": sampler.peak_total_rss_mib,
        "rss_mib_max": max(p["peak_rss_mib"] for p in procs), "fds_max": max(p["fds"] for p in procs),
        "threads_max": max(p["threads"] for p in procs),
        "per_process": sorted(procs, key=lambda p: p["who"]),
    })
    shutil.rmtree(run_dir, ignore_errors=True)
    return row


def flower(py: str, k: int, m: int, degree: int, t_local: int, timeout: float = 3600.0) -> dict:
    """Flower's SecAgg+ in its simulation engine (``benchmarks/flower_secagg.py`` under ``py``)."""
    script = Path(__file__).with_name("flower_secagg.py")
    cmd = [py, str(script), "--clients", str(k), "--m", str(m), "--num-shares", str(degree + 1),
           "--threshold", str(t_local), "--clip", str(secagg_job.CLIP), "--max-weight", str(secagg_job.MAX_WEIGHT)]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"K": k, "m": m, "ok": False, "error": f"did not finish within {timeout:g}s"}
    wall = time.perf_counter() - t0
    try:
        res = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return {"K": k, "m": m, "ok": False, "error": f"exit {p.returncode}: {p.stderr.strip()[-400:]}"}
    return {"K": k, "m": m, "degree": degree, "t_local": t_local, "process_wall_s": wall, **res}


def harary(k: int) -> tuple[int, int]:
    from fedhet.protocols.aggregation import secagg_config
    from fedhet.protocols.aggregation_settings import AggregationSettings

    cfg = secagg_config(AggregationSettings(aggregation="secure", secagg_graph="harary"))
    return cfg.k(k), cfg.t_local(k)


def fits(rows: list[dict]) -> list[dict]:
    """Log-log slopes against K of SecAgg+'s per-client and server cost (warm-up round: no dropout waits)."""
    out = []
    for m in sorted({r["m"] for r in rows}):
        pts = sorted((r for r in rows if r.get("ok") and r["graph"] == "harary" and r["m"] == m), key=lambda r: r["K"])
        if len(pts) < 2:
            continue
        lk = np.log([r["K"] for r in pts])

        def slope(key):
            v = np.asarray([r["warmup"][key] for r in pts], dtype=float)
            return float(np.polyfit(lk, np.log(v), 1)[0]) if np.all(v > 0) else None

        degree = {r["K"]: harary(r["K"])[0] for r in pts}
        ld = np.log([degree[r["K"]] for r in pts])

        def per_k(key, rnd="warmup"):
            """Against the degree k: SecAgg+ promises a client's cost ~ k (b = 1), whatever K."""
            v = np.asarray([r[rnd][key] for r in pts], dtype=float)
            return float(np.polyfit(ld, np.log(v), 1)[0]) if np.all(v > 0) and np.ptp(ld) > 0 else None

        def later(key):  # the timed round: the client list is named by its digest (10 % of the clients drop)
            v = np.asarray([r["timed"][key] for r in pts], dtype=float)
            return float(np.polyfit(lk, np.log(v), 1)[0]) if np.all(v > 0) else None

        out.append({"m": m, "ks": [r["K"] for r in pts], "client_cpu": slope("client_cpu_s"),
                    "client_bytes": slope("client_up_bytes"), "client_down_bytes": slope("client_down_bytes"),
                    "server_cpu": slope("server_cpu_s"), "server_bytes": slope("server_down_bytes"),
                    "round_wall": slope("wall_s"), "degree": degree,
                    "client_down_bytes_later": later("client_down_bytes"),
                    "vs_degree": {"client_cpu": per_k("client_cpu_s"), "client_bytes": per_k("client_up_bytes"),
                                  "client_down_bytes": per_k("client_down_bytes"),
                                  "client_down_bytes_later": per_k("client_down_bytes", "timed")}})
    return out


def markdown(doc: dict) -> str:
    lines = [
        "# Secure aggregation from 50 to 1,000 clients, as processes",
        "",
        "Synthetic inputs (`secagg_bench`: seeded uniform vectors and integer weights). Every party a real party "
        "in host processes over CURVE ZeroMQ on loopback; every run audited. Warm-up round: every client; "
        "timed round: 10 % of the clients vanish, spread over the four steps, and the server waits its step "
        "timeout once per step with a dropout (`waits`). Per client: median over the counted clients of the "
        "round. Connections: most TCP connections of the run established at once.",
        "",
        "| K | graph | m | hosts | ok | run wall s | warm-up round s | timed round s (waits) | exact sum | "
        "client CPU s | client up / down KiB | server CPU s | TCP conns | server dialled / client dialled | "
        "handshake retries | guard cuts (listed) | resent | lost | peak RSS MiB (sum) | fds / threads max |",
        "|---:|:--|---:|---:|:--|---:|---:|---:|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        if not r.get("wall_s"):
            lines.append(f"| {r['K']} | {r['graph']} | {r['m']} | {r['hosts']} | FAILED: {r.get('error', '')} |"
                         + " |" * 15)
            continue
        w, t = r["warmup"], r["timed"]
        lines.append(
            f"| {r['K']} | {r['graph']} | {r['m']} | {r['hosts']} | {'yes' if r['ok'] else 'NO'} | {r['wall_s']:.0f} "
            f"| {w['wall_s']:.1f} | {t['wall_s']:.1f} ({r['dropout_waits_s']:.0f}) "
            f"| {'yes' if w['exact'] and t['exact'] else 'NO'} ({t['contributors']} of {r['K']}) "
            f"| {harness.dash(w['client_cpu_s'], '{:.3f}')} | {w['client_up_bytes'] / 1024:.1f} / {w['client_down_bytes'] / 1024:.1f} "
            f"| {w['server_cpu_s']:.2f} | {r['tcp_connections_peak']} "
            f"| {r['dialled_by_server']} / {r['dialled_per_client_max']} | {r['handshake_retries']} "
            f"| {r['guard_cuts']} ({r['guard_cuts_listed']}) | {harness.dash(r.get('resent'), '{}')} | {r['messages_lost']} "
            f"| {r['peak_total_rss_mib']:.0f} | {r['fds_max']} / {r['threads_max']} |")
    if doc.get("fits"):
        lines += ["", "SecAgg+ cost against K (log-log slope a of cost ~ K^a, warm-up round):", "",
                  "| m | K | client CPU | client bytes up | client bytes down | server CPU | server bytes in | "
                  "round wall | neighbours k |",
                  "|---:|:--|---:|---:|---:|---:|---:|---:|:--|"]
        for f in doc["fits"]:
            lines.append(f"| {f['m']} | {', '.join(map(str, f['ks']))} | {harness.dash(f['client_cpu'], '{:.2f}')} "
                         f"| {harness.dash(f['client_bytes'], '{:.2f}')} | {harness.dash(f['client_down_bytes'], '{:.2f}')} "
                         f"| {harness.dash(f['server_cpu'], '{:.2f}')} | {harness.dash(f['server_bytes'], '{:.2f}')} "
                         f"| {harness.dash(f['round_wall'], '{:.2f}')} "
                         f"| {', '.join(f'{k}: {d}' for k, d in f['degree'].items())} |")
        if any(f.get("vs_degree") for f in doc["fits"]):
            lines += ["", "A client's cost against its neighbours k (slope b of cost ~ k^b; SecAgg+ promises b <= 1):",
                      "", "| m | K | client CPU | client bytes up | client bytes down | ... in a later round |",
                      "|---:|:--|---:|---:|---:|---:|"]
            for f in doc["fits"]:
                v = f.get("vs_degree") or {}
                lines.append(f"| {f['m']} | {', '.join(map(str, f['ks']))} "
                             + "".join(f"| {harness.dash(v.get(x), '{:.2f}')} " for x in
                                       ("client_cpu", "client_bytes", "client_down_bytes", "client_down_bytes_later"))
                             + "|")
    if doc.get("flower"):
        lines += ["", "Against Flower's SecAgg+ in its simulation engine (same K, m, neighbours and threshold; "
                  "one round, no dropouts; fedhet: the warm-up round, and the whole run with start-up):", "",
                  "| K | m | Flower round s | Flower run s | Flower max err | fedhet round s | fedhet run s (less dropout waits) |",
                  "|---:|---:|---:|---:|---:|---:|---:|"]
        by = {(r["K"], r["m"]): r for r in doc["rows"] if r.get("ok") and r["graph"] == "harary"}
        for f in doc["flower"]:
            mine = by.get((f["K"], f["m"]))
            if not f.get("ok", False) and "error" in f:
                lines.append(f"| {f['K']} | {f['m']} | FAILED: {f['error'][:200]} | | | | |")
                continue
            lines.append(f"| {f['K']} | {f['m']} | {harness.dash(f.get('round_s'))} | {harness.dash(f.get('wall_s'))} "
                         f"| {harness.dash(f.get('max_err'), '{:.1e}')} | {harness.dash(mine and mine['warmup']['wall_s'])} "
                         f"| {harness.dash(mine and mine['wall_s'] - mine['dropout_waits_s'], '{:.0f}')} |")
    return "\n".join(lines + harness.closing_lines(doc))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_common_args(ap, quick_help="K = 20 and 50, SecAgg+ only")
    ap.add_argument("--ks", type=int, nargs="+", help="K: clients (default 50 100 200 500 1000)")
    ap.add_argument("--ms", type=int, nargs="+", default=[1000, 100_000],
                    help="vector lengths: every K at the first, --big-m-ks at the others")
    ap.add_argument("--big-m-ks", type=int, nargs="*", default=[100, 1000], help="K of the runs at the other ms")
    ap.add_argument("--complete-ks", type=int, nargs="*", help="K of the complete-graph runs (default 100)")
    ap.add_argument("--flower", default=os.environ.get("FEDHET_FLOWER_PYTHON"),
                    help="an interpreter with flwr[simulation]: Flower's SecAgg+ at each K up to --flower-upto")
    ap.add_argument("--flower-upto", type=int, default=200, help="largest K Flower is run at")
    ap.add_argument("--step-timeout", type=float, help="the server's per-step timeout (default 10 s, 20 s above K = 200)")
    ap.add_argument("--render-only", action="store_true")
    args = ap.parse_args(argv)
    out = harness.Output(NAME, args.quick, args.out)
    if args.render_only:
        harness.render_only(out, markdown)
        return 0
    ks = args.ks or ([20, 50] if args.quick else [50, 100, 200, 500, 1000])
    if args.quick:
        args.ms = args.ms[:1]
    complete = args.complete_ks if args.complete_ks is not None else ([] if args.quick else [100])
    plan = ([(k, "harary", args.ms[0]) for k in ks] + [(k, "complete", args.ms[0]) for k in complete]
            + [(k, "harary", m) for m in args.ms[1:] for k in (args.big_m_ks or ks)])
    session = harness.Session(NAME + ("_quick" if args.quick else ""), __file__, argv)
    doc: dict = {"rows": [], "flower": [], "note": (
        "Synthetic data. Lost messages: a sequence gap fails the run and its audit, so every passed row lost none. "
        "fedhet's round time is the server's, from its start signal to the sum in hand; the run's wall time adds "
        "the start of every process and party.")}
    for k, graph, m in plan:
        timeout = args.step_timeout or (10.0 if k <= 200 else 20.0)
        if args.flower and graph == "harary" and k <= args.flower_upto:
            deg, tl = harary(k)
            f = flower(args.flower, k, m, deg, tl)
            print(f"Flower K={k} m={m}: {f}", flush=True)
            doc["flower"].append(f)
        r = measure(k, graph, m, timeout)
        print(f"K={k} {graph} m={m}: " + (f"ok {r['ok']} wall {r['wall_s']:.0f}s warm-up round "
                                          f"{r['warmup']['wall_s']:.1f}s conns {r['tcp_connections_peak']}"
                                          if r.get("wall_s") else f"FAILED {r.get('error')}"), flush=True)
        doc["rows"].append(r)
        doc["fits"] = fits(doc["rows"])
        doc["environment"] = session.finish()
        out.write(doc, markdown(doc))
    return 0 if all(r.get("ok") for r in doc["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
