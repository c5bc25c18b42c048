"""ECDH-PSI (X25519) between two party processes: time and bytes from 2^10 to 2^20 items per side.

Each size runs the ``psi`` job (``fedhet.algorithms.psi_job``) with a label owner and one
feature party, as a federation built in code and started by fedhet's launcher: each party its
own OS process over CURVE-encrypted ZeroMQ, with its own process pool for the scalar
multiplications; half of each set is common.  Every run is audited (``fedhet audit``) and every
party checks its intersection against the expected one.  In the same run the script measures
what bounds the protocol:

* the X25519 rate of one process (``blind`` over hashed points, wall and CPU),
  and the aggregate rate of one process per core running at once;
* the hash-to-curve rate of one process;
* floor = total scalar multiplications (4n) / (one-process rate x cores), and
  the same with the measured all-cores rate and with hashing included;
* a plaintext baseline: Python's set intersection of the same IDs.

PSI time is measured inside the parties (the protocol's own clock): the launcher starts the two
processes independently, so the party that comes up first waits for the other inside its PSI
call; the reported time is the later party's call, from both parties ready to the end.

Anchors quoted in the issue (not measured here): openmined.psi ~215 s
single-threaded for 2^20 x 2^20; SecretFlow ECDH-PSI ~40 s on 4 cores.

    python -m benchmarks.psi            # 2^10, 2^12, ..., 2^20
    python -m benchmarks.psi --quick    # up to 2^16
    python -m benchmarks.psi --sizes 20 # only 2^20

Writes benchmarks/results/psi.json and .md atomically (psi_quick.* with --quick,
psi_custom.* with --sizes).  The machine
is shared: the load average before and after each size is recorded.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time

from benchmarks import harness
from fedhet.crypto import ecdh_psi as grp

ANCHORS = {"openmined.psi, 1 thread, 2^20 x 2^20": 215.0, "SecretFlow ECDH-PSI, 4 cores, 2^20 x 2^20": 40.0}
GOAL_S = 60.0
ROLES = {"label_owner": "label_owner", "feature": "feature"}  # party name -> role
PSI_TIMEOUT_S = 1200.0


# ------------------------------------------------------------ rates
def _rate(seconds: float) -> dict:
    pts = grp.hash_to_points(grp.encode_items(range(2048)))
    k = grp.new_scalar()
    grp.blind(k, pts[:32 * 64])  # warm up
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        grp.blind(k, pts)
        n += 2048
    return {"mults": n, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def _hash_rate(seconds: float) -> dict:
    from fedhet.algorithms import psi_job

    s = psi_job.ALGORITHM.parse({**psi_cfg(8192, None, 1 << 14), "seed": 1})
    ids = psi_job.load_data(s, _ctx("label_owner"))["ids"]
    enc = grp.encode_items(ids)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        grp.hash_to_points(enc)
        n += len(enc)
    return {"items": n, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def measure_rates(seconds: float, ncores: int) -> dict:
    one = _rate(seconds)
    ctx = mp.get_context("spawn")
    with ctx.Pool(ncores) as pool:
        pool.map(abs, range(ncores))  # start the workers before timing
        par = pool.map(_rate, [seconds] * ncores)
    h = _hash_rate(seconds / 2)
    return {
        "x25519_per_s_one_process_wall": one["mults"] / one["wall_s"],
        "x25519_per_s_one_process_cpu": one["mults"] / one["cpu_s"],
        "x25519_per_s_all_cores": sum(r["mults"] / r["wall_s"] for r in par),
        "hash_per_s_one_process_cpu": h["items"] / h["cpu_s"],
        "hash_per_s_one_process_wall": h["items"] / h["wall_s"],
    }


# ------------------------------------------------------------ one PSI run
def _ctx(role: str):
    from fedhet.parties.contract import PartyContext

    return PartyContext(name=role, role=role, index=0, n_of_role=1)


def psi_cfg(n: int, workers: int | None, chunk: int, backend: str = "ecdh") -> dict:
    """The ``psi`` job's [algorithm] table: n IDs per side, half of them common, no duplicates."""
    return {"name": "psi", "n": n, "overlap": 0.5, "pair_overlap": 0.0, "duplicates": 0.0, "id_type": "str",
            "reveal": True, "order": "sorted", "chunk": chunk, "workers": workers, "psi_timeout": PSI_TIMEOUT_S,
            "psi_backend": backend}


def run_size(n: int, workers: int | None, chunk: int, insecure: bool, seed: int = 0, backend: str = "ecdh") -> dict:
    """One PSI of n x n IDs: the ``psi`` job, label owner and feature party as processes (the launcher)."""
    from fedhet.algorithms import psi_job

    cfg = psi_cfg(n, workers, chunk, backend)
    fed = harness.federation(cfg, ROLES.items(), name="psi-bench", timeout=PSI_TIMEOUT_S, seed=seed)
    load0 = harness.loadavg()
    run = harness.launch_audited(fed, insecure=insecure, timeout=3 * PSI_TIMEOUT_S)
    got = run.results
    if not run.audit_ok:
        raise RuntimeError(f"the audit of the PSI run failed: {run.audit_problems[:5]}")
    if len({r["ids_sha256"] for r in got.values()}) != 1:
        raise RuntimeError("the parties ended with different common lists")
    if not all(r["correct"] and r["rows_aligned"] for r in got.values()):
        raise RuntimeError(f"a party's intersection is wrong: {got}")
    size = got["label_owner"]["size"]
    if size != n - n // 2:
        raise RuntimeError(f"intersection of {size} IDs, expected {n - n // 2}")
    # plaintext baseline on the parties' own IDs, same script run
    job = psi_job.ALGORITHM.parse({**cfg, "seed": seed})
    a = psi_job.load_data(job, _ctx("label_owner"))["ids"]
    b = psi_job.load_data(job, _ctx("feature"))["ids"]
    tp = time.perf_counter()
    common = set(a) & set(b)
    plain = time.perf_counter() - tp
    assert len(common) == size
    stats = {k: r["stats"] for k, r in got.items()}
    # Each party's PSI call starts when its own process is up; the earlier one waits for its peer's
    # start-up inside the call.  The later one's call is the protocol from both parties ready to the end.
    psi_by_party = {k: s["total_s"] for k, s in stats.items()}
    return {
        "n": n, "psi_s": min(psi_by_party.values()), "psi_s_by_party": psi_by_party,
        "process_wall_s": run.wall_s, "size": size,
        "bytes_sent": {k: s["bytes_sent"] for k, s in stats.items()},
        "bytes_total": sum(s["bytes_sent"] for s in stats.values()),
        "scalar_mults": 4 * n, "workers": stats["label_owner"]["workers"],
        "cpu_s_children": run.cpu_s, "audit_ok": run.audit_ok,
        "plaintext_set_s": plain, "loadavg_before": load0, "loadavg_after": harness.loadavg(),
        "stages": {k: {st: v for st, v in s.items() if st.endswith("_s") and st != "total_s"}
                   for k, s in stats.items()},
        "rss_mib": {k: s.get("max_rss_mib") for k, s in stats.items()},
        "backend": backend,
    }


def stage_seconds(stages: dict) -> dict[str, float]:
    """One party's PSI phases, name -> seconds, from a results file's ``stages`` in either convention:
    ``<phase>_s`` (the project's, since issue 44) or ``seconds_<phase>`` (older results files);
    ``cpu`` is the call's CPU time."""
    out = {}
    for k, v in stages.items():
        name = k.removeprefix("seconds_") if k.startswith("seconds_") else k.removesuffix("_s")
        out["cpu" if name in ("cpu", "cpu_seconds") else name] = v
    return out


# ------------------------------------------------------------ report
def render(res: dict) -> str:
    r = res["rates"]
    c = res["cores"]
    lines = [
        "# ECDH-PSI (X25519) benchmark",
        "",
        f"Two party processes (label owner, feature party) over {'plain TCP' if res['insecure'] else 'CURVE'} "
        f"ZeroMQ on this machine ({c} cores, {res['platform']}), each with a process pool of "
        f"{res['workers_label']} workers; half of each set is common.  Command: `{res['command']}`.",
        "",
        *([f"How it ran: {res['how']}.", ""] if res.get("how") else []),
        f"Measured in this run: X25519 {r['x25519_per_s_one_process_wall']:,.0f}/s in one process (wall; "
        f"{r['x25519_per_s_one_process_cpu']:,.0f}/s per CPU-second), {r['x25519_per_s_all_cores']:,.0f}/s "
        f"with one process per core at once; hash-to-curve {r['hash_per_s_one_process_cpu']:,.0f} items per "
        f"CPU-second.  Load average at start: {res['loadavg_start']:.2f} (other jobs share the machine).",
        "",
        "floor = 4n scalar mults / (one-process rate x cores); floor (all cores) uses the aggregate rate "
        "measured with every core busy; CPU floor = (4n / CPU rate + 2n / hash CPU rate) / cores.",
        "",
        "CPU-s used counts every party and worker process" + (
            ", from process start to exit (Python start-up, ID generation and the job's own result checks "
            "included: they dominate the smallest sizes)" if res.get("how") else "")
        + "; CPU used / floor near 1 means the protocol adds "
        "little beyond the group operations, and PSI s / floor then mostly measures the share of the cores "
        "this run got from the other jobs.",
        "",
        "| n per side | PSI s | floor s | PSI / floor | floor (all cores) s | PSI / that | CPU floor s "
        "| CPU-s used | CPU used / (CPU floor x cores) | MB sent | plaintext set s | PSI / plaintext "
        "| load before→after |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in res["sizes"]:
        lines.append(
            f"| 2^{s['log2n']} | {s['psi_s']:.2f} | {s['floor_s']:.2f} | {s['psi_s'] / s['floor_s']:.2f} | "
            f"{s['floor_all_cores_s']:.2f} | {s['psi_s'] / s['floor_all_cores_s']:.2f} | {s['cpu_floor_s']:.2f} | "
            f"{s['cpu_s_children']:.1f} | {s['cpu_s_children'] / (s['cpu_floor_s'] * c):.2f} | {s['bytes_total'] / 1e6:.1f} | {s['plaintext_set_s']:.4f} | "
            f"{s['psi_s'] / max(s['plaintext_set_s'], 1e-9):,.0f} | {s['loadavg_before']:.1f}→{s['loadavg_after']:.1f} |")
    big = [s for s in res["sizes"] if s["log2n"] == 20]
    lines.append("")
    if big:
        s = big[0]
        lines.append(f"2^20 x 2^20: {s['psi_s']:.1f} s (goal <= {GOAL_S:.0f} s on this {c}-core machine: "
                     f"{'met' if s['psi_s'] <= GOAL_S else 'not met'}), {s['psi_s'] / s['floor_s']:.2f}x the "
                     f"scalar-multiplication floor of {s['floor_s']:.1f} s; {s['bytes_total'] / 2**20:.0f} MiB sent.")
    lines.append("Anchors quoted in the issue, not measured here: " +
                 "; ".join(f"{k}: {v:.0f} s" for k, v in ANCHORS.items()) + ".")
    env_line = harness.environment_line(res.get("environment"))
    if env_line:
        lines.append(env_line)
    return "\n".join(lines) + "\n"


HOW = ("the `psi` job as a federation built in code, both parties started by fedhet's launcher and the "
       "run audited (`fedhet audit`); PSI s = the protocol's own clock inside the party that came up last "
       "(the other party's call also holds the wait for its peer's start-up), process start-up excluded")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_common_args(ap, quick_help="2^10 .. 2^16 only, shorter rate measurement", render_only=True)
    ap.add_argument("--sizes", type=int, nargs="*", help="log2 of the set sizes (default 10 12 ... 20)")
    ap.add_argument("--workers", type=int, default=None, help="pool workers per party (default: every core)")
    ap.add_argument("--chunk", type=int, default=1 << 14)
    ap.add_argument("--insecure", action="store_true", help="plain TCP instead of CURVE")
    args = ap.parse_args(argv)
    out_file = harness.Output("psi_custom" if args.sizes else "psi", quick=args.quick and not args.sizes,
                              out_dir=args.out)
    if args.render_only:
        res = out_file.read()
        out_file.write(res, render(res))
        print(render(res))
        return 0
    session = harness.Session("psi", __file__, argv)
    sizes = args.sizes or ([10, 12, 14, 16] if args.quick else [10, 12, 14, 16, 18, 20])
    ncores = harness.cpu_count()
    rates = measure_rates(1.0 if args.quick else 3.0, ncores)
    print(f"rates: {rates}", flush=True)
    out = []
    for e in sizes:
        n = 1 << e
        s = run_size(n, args.workers, args.chunk, args.insecure)
        s["log2n"] = e
        s["floor_s"] = 4 * n / (rates["x25519_per_s_one_process_wall"] * ncores)
        s["floor_all_cores_s"] = 4 * n / rates["x25519_per_s_all_cores"]
        s["cpu_floor_s"] = (4 * n / rates["x25519_per_s_one_process_cpu"]
                            + 2 * n / rates["hash_per_s_one_process_cpu"]) / ncores
        print(f"2^{e}: PSI {s['psi_s']:.2f} s, floor {s['floor_s']:.2f} s ({s['psi_s'] / s['floor_s']:.2f}x), "
              f"all-cores floor {s['floor_all_cores_s']:.2f} s, {s['bytes_total'] / 1e6:.1f} MB, "
              f"CPU {s['cpu_s_children']:.1f} s, load {s['loadavg_before']:.1f}->{s['loadavg_after']:.1f}",
              flush=True)
        out.append(s)
    env = session.finish()
    res = {
        "benchmark": "psi", "quick": args.quick, "command": session.command,
        "cores": ncores, "platform": env["platform"], "python": env["python"],
        "insecure": args.insecure, "chunk": args.chunk,
        "workers_label": args.workers if args.workers is not None else "auto (every core)",
        "loadavg_start": env["loadavg_start"], "rates": rates, "sizes": out, "anchors_s": ANCHORS, "goal_s": GOAL_S,
        "time": env["started"], "how": HOW, "environment": env,
    }
    out_file.write(res, render(res))
    print(render(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
