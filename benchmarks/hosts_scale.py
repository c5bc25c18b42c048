"""Many parties on one machine: N parties in H host processes, wall time and what each process holds.

The job is the ``shamir`` algorithm (the fusion step of F³ without the learning): N - 4 owners
Shamir-share a private matrix to 3 holders (2-of-3), which compute ``sum_i X_i P_i`` on shares;
a coordinator reconstructs it and checks it against plain float64.  Every party is a real party
(its own CURVE and signing keys, sockets, transcript), started by fedhet's launcher with
``[federation] hosts = H`` (``H = 0``: one OS process per party, as without hosts), and every run
is audited (``fedhet audit``).

Per configuration it reports the launcher's wall time (start-up to the last exit), and, sampled
from ``/proc`` every 0.2 s over every process of the run: the peak RSS of each process, the
peak of their sum, and the most file descriptors and threads any process held (the hosts' own
records, ``RUN_DIR/hosts/H.json``, agree).  Bytes: what every owner sent, and all parties in total.

    python -m benchmarks.hosts_scale                       # N in 60, 120, 207, 330; H in 4, 8 (0 at N = 60)
    python -m benchmarks.hosts_scale --quick               # N = 20 in 2 hosts and as processes
    python -m benchmarks.hosts_scale --parties 330 --hosts 6
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

from benchmarks import harness

NAME = "hosts_scale"
HOLDERS = 3


def shamir_federation(n_parties: int, hosts: int, timeout: float):
    owners = n_parties - HOLDERS - 1
    if owners < 2:
        raise SystemExit(f"--parties {n_parties}: need at least {HOLDERS + 3} (2 owners, {HOLDERS} holders, "
                         "a coordinator)")
    parties = ([(f"owner{i + 1:03d}", "owner") for i in range(owners)]
               + [(f"holder{j + 1}", "holder") for j in range(HOLDERS)] + [("coordinator", "coordinator")])
    # Owner i has d_in + i features: keep the widest small at hundreds of owners.
    fed = harness.federation({"name": "shamir", "rows": 16, "d_in": 2, "d_out": 2, "t": 2}, parties,
                             name=f"hosts-scale-{n_parties}", timeout=timeout)
    return replace(fed, hosts=hosts)


class Sampler(threading.Thread):
    """Peak RSS, descriptors and threads of every live process whose command line names the run
    (contains ``key``: the run folder, or any text that marks the run's processes)."""

    def __init__(self, key: str | Path, every_s: float = 0.2):
        super().__init__(daemon=True)
        self.key, self.every = str(key), every_s
        self.procs: dict[int, dict] = {}  # pid -> peaks and its command's role (party or host name)
        self.peak_total_rss_mib = 0.0
        self.halt = threading.Event()

    def _scan(self) -> None:
        total = 0.0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                args = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
                args = [a.decode(errors="replace") for a in args if a]
                if not any(self.key in a for a in args):
                    continue
                st = dict(line.split(":", 1) for line in Path(f"/proc/{d}/status").read_text().splitlines()
                          if ":" in line)
                fds = len(os.listdir(f"/proc/{d}/fd"))
            except (OSError, ValueError):
                continue
            rss = int(st.get("VmRSS", "0 kB").split()[0]) / 1024
            hwm = int(st.get("VmHWM", "0 kB").split()[0]) / 1024
            who = next((args[i + 1] for i, a in enumerate(args[:-1]) if a in ("--host", "--name")), "?")
            p = self.procs.setdefault(int(d), {"who": who, "peak_rss_mib": 0.0, "fds": 0, "threads": 0})
            p["peak_rss_mib"] = max(p["peak_rss_mib"], hwm)
            p["fds"] = max(p["fds"], fds)
            p["threads"] = max(p["threads"], int(st.get("Threads", "0")))
            total += rss
        self.peak_total_rss_mib = max(self.peak_total_rss_mib, total)

    def run(self) -> None:
        while not self.halt.is_set():
            self._scan()
            self.halt.wait(self.every)

    def stop(self) -> None:
        self.halt.set()
        self.join()


def measure(n_parties: int, hosts: int, timeout: float) -> dict:
    fed = shamir_federation(n_parties, hosts, timeout)
    run_dir = Path(tempfile.mkdtemp(prefix=f"hosts-scale-{n_parties}-{hosts}-"))
    sampler = Sampler(run_dir)
    sampler.start()
    row = {"parties": n_parties, "owners": n_parties - HOLDERS - 1, "hosts": hosts}
    try:
        out = harness.launch_audited(fed, run_dir=run_dir, keep=True)
    except Exception as e:  # a configuration that does not fit is a result too
        sampler.stop()
        row.update({"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        shutil.rmtree(run_dir, ignore_errors=True)
        return row
    sampler.stop()
    procs = list(sampler.procs.values())
    parties = out.summary["parties"]
    coord = parties["coordinator"]["result"]
    owners_sent = [p["traffic"]["bytes_sent_total"] for n, p in parties.items() if p["role"] == "owner"]
    row.update({
        "ok": bool(out.summary["ok"]) and bool(out.audit_ok) and coord.get("correct") is True, "audit_ok": out.audit_ok,
        "audit_problems": out.audit_problems[:5], "correct": coord.get("correct"),
        "wall_s": out.wall_s, "cpu_s": out.cpu_s, "processes": len(procs),
        "peak_rss_mib_max": max(p["peak_rss_mib"] for p in procs),
        "peak_rss_mib_sum": sum(p["peak_rss_mib"] for p in procs),
        "peak_total_rss_mib": sampler.peak_total_rss_mib,
        "fds_max": max(p["fds"] for p in procs), "threads_max": max(p["threads"] for p in procs),
        "bytes_per_owner": sum(owners_sent) / len(owners_sent), "bytes_total": out.summary["bytes_total"],
        "per_process": sorted(procs, key=lambda p: p["who"]),
        "host_records": out.summary.get("hosts", {}),
    })
    shutil.rmtree(run_dir, ignore_errors=True)
    return row


def markdown(doc: dict) -> str:
    lines = [
        "# Many parties in host processes (shamir job: owners, 3 holders, a coordinator)",
        "",
        "Every party is a real party (own keys, sockets, transcript) and every run passed `fedhet audit`"
        " unless the row says otherwise. H = 0: one OS process per party. RSS: peak resident memory;"
        " 'sum of peaks' adds each process's own peak, 'peak of sum' is the largest total seen at one"
        " sampling instant (every 0.2 s). fds / threads: the most any one process held.",
        "",
        "| parties | hosts | ok | wall s | CPU s | processes | peak RSS / process MiB | sum of peaks MiB "
        "| peak of sum MiB | fds max | threads max | bytes / owner | bytes total |",
        "|---:|---:|:--|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        if not r.get("wall_s"):
            lines.append(f"| {r['parties']} | {r['hosts']} | FAILED: {r.get('error', '')} |" + " |" * 10)
            continue
        lines.append(
            f"| {r['parties']} | {r['hosts']} | {'yes' if r['ok'] else 'NO'} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} "
            f"| {r['processes']} | {r['peak_rss_mib_max']:.0f} | {r['peak_rss_mib_sum']:.0f} "
            f"| {r['peak_total_rss_mib']:.0f} | {r['fds_max']} | {r['threads_max']} "
            f"| {r['bytes_per_owner']:.0f} | {r['bytes_total']} |")
    return "\n".join(lines + harness.closing_lines(doc))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_common_args(ap, quick_help="N = 20 parties, in 2 hosts and as processes")
    ap.add_argument("--parties", type=int, nargs="+", help="N: parties in all (owners = N - 4)")
    ap.add_argument("--hosts", type=int, nargs="+", help="H: host processes (0 = a process per party)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per-message timeout of the federation (s)")
    ap.add_argument("--processes-upto", type=int, default=60,
                    help="run H = 0 (a process per party) only up to this many parties (each is ~60 MiB)")
    args = ap.parse_args(argv)
    sizes = args.parties or ([20] if args.quick else [60, 120, 207, 330])
    hosts = args.hosts or ([0, 2] if args.quick else [0, 4, 8])
    session = harness.Session(NAME + ("_quick" if args.quick else ""), __file__, argv)
    rows = []
    for n in sizes:
        for h in hosts:
            if h == 0 and n > args.processes_upto:
                continue
            r = measure(n, h, args.timeout)
            print(f"N={n} H={h}: " + (f"wall {r['wall_s']:.1f}s, peak RSS/process {r['peak_rss_mib_max']:.0f} MiB, "
                                      f"sum {r['peak_rss_mib_sum']:.0f} MiB, fds {r['fds_max']}, "
                                      f"threads {r['threads_max']}, audit {r['audit_ok']}"
                                      if r.get("wall_s") else f"FAILED {r.get('error')}"), flush=True)
            rows.append(r)
            doc = {"rows": rows, "environment": session.finish(),
                   "note": ("The shamir job is synthetic (seeded random matrices); all traffic is real CURVE ZeroMQ. "
                            f"H = 0 (one process per party) runs only up to {args.processes_upto} parties: "
                            "each party process holds ~60 MiB, so 330 of them would need ~19 GiB of this "
                            "machine's 24 GiB. The machine is shared: see the load average below.")}
            harness.Output(NAME, args.quick, args.out).write(doc, markdown(doc))
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
