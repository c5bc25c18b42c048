"""Secure vs plain aggregation: wall time per round and bytes per client.

Variants, run side by side on the same inputs in one run:

* ``plain``: each client sends its vector as float32 and its weight (the
  fair baseline: a 32-bit ring element has the same bytes as a float32),
* ``secure``: Bonawitz et al. on the complete graph, 32-bit ring,
* ``secure+``: SecAgg+ on the Harary graph (k = 2 ceil(log2 K); for K <= 5
  that is the complete graph, for K = 10 it is k = 8 of 9 neighbours).

Clients K in {5, 10, 50}, vector length m in {1e4, 1e5, 1e6}.  Parties are
threads on the in-memory transport (``fedhet.parties.inmemory``: the real
codec and byte counting, no sockets).  Every party shares this machine's
cores, so the in-memory wall time is close to the *sum* of all parties' CPU
time; the benchmark therefore also reports the CPU critical path (the largest
client's CPU time in the round plus the server's), what a deployment with
one core per party would see before network time.  The in-memory rows run
the role functions below through ``harness.run_roles``.  A process variant
(``--processes``, default on for K = 5, 10) runs the same role functions with
every party its own process over CURVE-encrypted ZeroMQ on loopback, started
by fedhet's launcher and audited; the launcher can only start a *registered*
algorithm, so these rows need the roles registered as ``secagg_bench`` (see
:data:`NAME`); without that they are skipped and the report says so.

One warm-up round (it includes the once-per-run identity-key exchange) is
dropped; each figure is the median of ``--rounds`` timed rounds.  A round is
timed at the server from its start signal to the aggregate in hand.  Bytes
are the encoded frames each client sent and received during its ``submit``.

Anchor: Bonawitz et al. report 1.73x communication expansion for 2**10
clients and 2**20-element vectors; the per-client overhead measured here is
fitted linearly in K and extrapolated to that point.  Goals at K = 10,
m = 1e6 (issue 15): secure round <= 1.3x the plain round's wall time and
<= 1.5x its CPU, <= 1.1x its bytes.  CPU is reported twice: the critical
path (what one party's core sees) and all parties together; for the latter
the report also gives a floor, the CPU of the masks alone
(:func:`mask_floor`), which bounds how close any complete-graph round can
come to plain aggregation's all-party CPU.  ``--passes N`` launches every process
variant N times in turn; ``--previous DIR`` adds the previous commit's code
(``git archive COMMIT | tar -x -C DIR/fedhet``) as one more interleaved
variant.  The K sweep (``--ks 10 25 50 100 --ms 10000 100000``) reports how
time, CPU and bytes grow with K for the complete graph and for SecAgg+.

Writes ``benchmarks/results/secagg{,_quick}.{json,md}`` and ``secagg{,_quick}.png``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks import harness
from fedhet.algorithms import secagg_job

CLIP, MAX_WEIGHT = secagg_job.CLIP, secagg_job.MAX_WEIGHT
METHODS = {
    "plain": {"aggregation": "plain", "plain_dtype": "float32"},
    "secure": {"aggregation": "secure", "secagg_graph": "complete"},
    "secure+": {"aggregation": "secure", "secagg_graph": "harary"},
}
for _v in METHODS.values():
    _v.update(secagg_clip=CLIP, secagg_max_weight=MAX_WEIGHT, aggregation_timeout=600)

# The benchmark's job is the registered algorithm secagg_bench (fedhet.algorithms.secagg_job): the
# same role functions run in memory and, through the launcher, as processes.
NAME = secagg_job.NAME
PREVIOUS = "secure (previous commit)"
PROCESS_HOW = ("every party its own process over CURVE ZeroMQ on loopback, started by fedhet's launcher "
               "(registered algorithm `secagg_bench`), the run audited")
INMEMORY_HOW = ("every party a thread on the in-memory transport (`run_inmemory`: the real codec and byte "
                "counting, no sockets), the same role functions")
client_names, make_inputs, exact_mean = secagg_job.client_names, secagg_job.make_inputs, secagg_job.exact_mean


def job_cfg(k, m, method, rounds, seed):
    return {"n_clients": int(k), "m": int(m), "bench_rounds": int(rounds), "input_seed": int(seed), **METHODS[method]}


def summarise(rounds_out):
    timed = rounds_out[1:]
    med = statistics.median
    ups = [med(c["up"] for c in r["clients"].values()) for r in timed]
    downs = [med(c["down"] for c in r["clients"].values()) for r in timed]
    crit = [max(c["cpu"] for c in r["clients"].values()) + r["server_cpu"] for r in timed]
    last = timed[-1]
    # Whole-process CPU (every thread, the transport's included): a party's own figure when it is a process.
    ptotal = [sum(c.get("pcpu", c["cpu"]) for c in r["clients"].values()) + r.get("server_pcpu", r["server_cpu"])
              for r in timed]
    pcrit = [max(c.get("pcpu", c["cpu"]) for c in r["clients"].values()) + r.get("server_pcpu", r["server_cpu"])
             for r in timed]
    steps = {}
    for r in timed:
        for kind, v in (r.get("steps_s") or {}).items():
            steps.setdefault(kind, []).append(v)
    return {
        "wall_s": med(r["wall"] for r in timed), "wall_s_all": [r["wall"] for r in timed],
        "critical_cpu_s": med(crit), "server_cpu_s": med(r["server_cpu"] for r in timed),
        "client_cpu_max_s": med(max(c["cpu"] for c in r["clients"].values()) for r in timed),
        "client_cpu_median_s": med(med(c["cpu"] for c in r["clients"].values()) for r in timed),
        "protocol_cpu_total_s": med(sum(c["cpu"] for c in r["clients"].values()) + r["server_cpu"] for r in timed),
        "process_cpu_total_s": med(ptotal), "process_cpu_path_s": med(pcrit),
        "server_process_cpu_s": med(r.get("server_pcpu", r["server_cpu"]) for r in timed),
        "client_process_cpu_median_s": med(med(c.get("pcpu", c["cpu"]) for c in r["clients"].values())
                                           for r in timed),
        "server_steps_s": {k: med(v) for k, v in steps.items()},
        "bytes_up_per_client": med(ups), "bytes_down_per_client": med(downs),
        "bytes_per_client": med(ups) + med(downs),
        "max_mean_error": last["max_err"], "mean_error_bound": last["bound"],
    }


def bench_inmemory(k, m, method, rounds, seed):
    xs, ws = make_inputs(k, m, seed)
    data = {"server": {"xs": xs, "ws": ws}, **{c: {"x": xs[c], "w": ws[c]} for c in xs}}
    run = harness.run_roles(secagg_job.ALGORITHM, [("server", "server")] + [(c, "client") for c in client_names(k)],
                            cfg=job_cfg(k, m, method, rounds, seed), seed=seed, data=data, timeout=900)
    return summarise(run.results["server"])


def mask_floor(k, m, seed, repeats=3):
    """CPU seconds of the work only a complete-graph round adds to a plain one: the masks.

    Every client quantises its input and adds K AES-CTR streams (its self-mask
    and K - 1 pairwise masks) in the ring; the server removes the K
    self-masks.  That is ``K * (K + 1)`` keystreams of ``m + 1`` ring words,
    whatever the implementation: timed here in this one process (warm caches,
    no messages, best of ``repeats``), it is a lower bound on what secure
    aggregation adds to the plain round's all-party CPU.
    """
    from fedhet.crypto.prg import random_seed
    from fedhet.protocols.secagg_config import SecAggConfig
    from fedhet.protocols.secagg_masks import apply_masks

    quant = SecAggConfig(clip=CLIP, max_weight=MAX_WEIGHT).quantizer(k)
    xs, ws = make_inputs(k, m, seed)
    seeds = [random_seed() for _ in range(k)]
    pair = {(u, v): random_seed() for u in range(k) for v in range(u + 1, k)}
    acc = np.empty(m + 1, dtype=quant.dtype)
    total = np.zeros_like(acc)
    best = float("inf")
    for _ in range(repeats):
        c0 = time.process_time()
        for u, c in enumerate(client_names(k)):
            masks = [(seeds[u], +1)] + [(pair[min(u, v), max(u, v)], +1 if u < v else -1)
                                        for v in range(k) if v != u]
            apply_masks(acc, masks, quant, xs[c], ws[c])
        apply_masks(total, [(b, -1) for b in seeds])
        best = min(best, time.process_time() - c0)
    return best


# ------------------------------------------------------------- processes
def processes_available() -> bool:
    """Whether the launcher can start these roles (they must be a registered algorithm)."""
    from fedhet.algorithms import registry

    return NAME in registry.names()


def bench_processes(k, m, method, rounds, seed, code_dir=None):
    """The same roles, every party its own process (the launcher), audited: the server's per-round records.

    ``code_dir``: a folder holding another checkout of the package as ``fedhet/`` (e.g. the previous
    commit), put first on every party's PYTHONPATH so they run that code.
    """
    if not processes_available():
        raise RuntimeError(f"the process rows need the benchmark's roles registered as algorithm {NAME!r}")
    names = ["server"] + client_names(k)
    fed = harness.federation({"name": NAME, **job_cfg(k, m, method, rounds, seed)},
                             [(n, "server" if n == "server" else "client") for n in names],
                             name=f"secagg-bench-{k}", timeout=900, seed=seed)
    saved = os.environ.get("PYTHONPATH")
    if code_dir:
        os.environ["PYTHONPATH"] = str(code_dir) + (os.pathsep + saved if saved else "")
    try:
        run = harness.launch_audited(fed, timeout=1800)
    finally:
        if code_dir:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
    return run.results["server"], run.audit_ok


def bench_processes_interleaved(k, m, variants, rounds, seed, passes):
    """``passes`` launches of every variant, in turn (plain, secure, ..., plain, secure, ...), so a change
    of load on this shared machine hits all alike; each figure is the median over every timed round."""
    records = {name: [] for name in variants}
    audits = {name: True for name in variants}
    for i in range(passes):
        for name, (method, code_dir) in variants.items():
            rec, ok = bench_processes(k, m, method, rounds, seed, code_dir)
            records[name] += rec[1:] if i else rec  # summarise() drops the first (warm-up) round
            audits[name] = audits[name] and ok
            print(f"  pass {i + 1}/{passes} {name:28s} walls {[round(r['wall'], 3) for r in rec[1:]]}", flush=True)
    out = {}
    for name in variants:
        row = summarise(records[name])
        row["audit_ok"] = audits[name]
        row["launches"] = passes
        out[name] = row
    return out


# ---------------------------------------------------------------- output
def extrapolate(rows):
    """Fit per-client secure-minus-plain bytes = a + b K (m fixed at the largest m), predict the anchor."""
    ms = max(r["m"] for r in rows)
    pts = {}
    for r in rows:
        if r["m"] == ms and r["transport"] == "inmemory" and r["method"] in ("plain", "secure"):
            pts.setdefault(r["K"], {})[r["method"]] = r["bytes_per_client"]
    ks = sorted(k for k, v in pts.items() if len(v) == 2)
    if len(ks) < 2:
        return None
    over = [pts[k]["secure"] - pts[k]["plain"] for k in ks]
    b, a = np.polyfit(ks, over, 1)
    K, M = 1024, 1 << 20
    plain32 = 4 * M
    return {"fit_m": ms, "per_client_overhead_bytes": {str(k): o for k, o in zip(ks, over)},
            "fit_a_bytes": float(a), "fit_b_bytes_per_client": float(b),
            "anchor": {"K": K, "m": M, "predicted_expansion_32bit": (plain32 + a + b * K) / plain32,
                       "predicted_expansion_vs_16bit_plain": (plain32 + a + b * K) / (2 * M),
                       "bonawitz_reported": 1.73}}


def scaling(rows):
    """Wall, CPU and bytes per round against K for each (m, method) of the in-memory sweep, and log-log slopes."""
    mem = [r for r in rows if r["transport"] == "inmemory"]
    plain = {(r["K"], r["m"]): r["bytes_per_client"] for r in mem if r["method"] == "plain"}
    out, fits = [], []
    for m in sorted({r["m"] for r in mem}):
        for method in [x for x in METHODS if x != "plain"]:
            pts = sorted((r for r in mem if r["m"] == m and r["method"] == method), key=lambda r: r["K"])
            if len(pts) < 2:
                continue
            for r in pts:
                out.append({"m": m, "method": method, "K": r["K"], "wall_s": r["wall_s"],
                            "cpu_all_s": r.get("protocol_cpu_total_s", float("nan")),
                            "cpu_path_s": r["critical_cpu_s"], "bytes": r["bytes_per_client"],
                            "overhead_bytes": r["bytes_per_client"] - plain.get((r["K"], m), 0)})
            lk = np.log([r["K"] for r in pts])

            def slope(vals):
                v = np.asarray(vals, dtype=float)
                return float(np.polyfit(lk, np.log(v), 1)[0]) if np.all(v > 0) else float("nan")

            fits.append({"m": m, "method": method, "ks": [r["K"] for r in pts],
                         "wall": slope([r["wall_s"] for r in pts]),
                         "cpu_all": slope([r.get("protocol_cpu_total_s", np.nan) for r in pts]),
                         "cpu_path": slope([r["critical_cpu_s"] for r in pts]),
                         "overhead_bytes": slope([r["bytes_per_client"] - plain.get((r["K"], m), 0) for r in pts])})
    return {"rows": out, "fits": fits} if fits else None


def _fmt_bytes(n):
    return f"{n / 1e6:.3f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def render_md(doc):
    rows = doc["rows"]
    out = [f"# Secure aggregation benchmark{' (quick)' if doc['quick'] else ''}", "",
           f"`{doc['command']}` on {doc['machine']}; {doc['rounds']} timed rounds after one warm-up, medians.", "",
           "In-memory rows: every party is a thread of one process on this machine's cores, so `wall` is "
           "close to the sum of all parties' CPU; `CPU path` = the busiest client's CPU + the server's CPU "
           "in the round (a deployment with one core per party, before network time). Ratios are against "
           "the plain row with the same K, m and transport (float32 on the wire, the bytes of a 32-bit ring).",
           "",
           "Process rows: `CPU path` is the same sum from each party's protocol thread; `CPU all` = the sum over "
           "all parties of that thread's CPU in the round (the protocol's whole work; in memory it is the same "
           "figure). Transport threads (CURVE, the connection guard) are left out of both: they run on a timer "
           "and cost the same per second whatever the protocol.",
           "",
           "| transport | K | m | method | wall (s) | x plain | CPU path (s) | x plain | CPU all (s) | x plain "
           "| bytes/client (up+down) | x plain | max mean err | stated bound |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["transport"], r["K"], r["m"]): r for r in rows if r["method"] == "plain"}
    for r in rows:
        b = base.get((r["transport"], r["K"], r["m"]))
        rw = f"{r['wall_s'] / b['wall_s']:.2f}" if b else "-"
        rc = f"{r['critical_cpu_s'] / b['critical_cpu_s']:.2f}" if b else "-"
        rb = f"{r['bytes_per_client'] / b['bytes_per_client']:.4f}" if b else "-"
        ta = r.get("protocol_cpu_total_s")
        ra = f"{ta / b['protocol_cpu_total_s']:.2f}" if b and ta and b.get("protocol_cpu_total_s") else "-"
        out.append(f"| {r['transport']} | {r['K']} | {r['m']:.0e} | {r['method']} | {r['wall_s']:.4f} | {rw} | "
                   f"{r['critical_cpu_s']:.4f} | {rc} | {ta if ta is None else f'{ta:.4f}'} | {ra} | "
                   f"{_fmt_bytes(r['bytes_per_client'])} | {rb} | "
                   f"{r['max_mean_error']:.2e} | {r['mean_error_bound']:.2e} |")
    if doc.get("how"):
        out += ["", "How it ran: " + "; ".join(f"{k} rows: {v}" for k, v in doc["how"].items()) + "."]
    for note in doc.get("notes", []):
        out += ["", f"Note: {note}"]
    g = doc.get("goals")
    if g:
        out += ["", "## Goals at K = 10, m = 1e6 (secure, complete graph, vs plain float32)", ""]
        for key, v in g.items():
            line = (f"- {key}: measured {v['measured']:.3f}x, goal <= {v['goal']}x: "
                    f"**{'met' if v['met'] else 'not met'}**")
            if "floor" in v:
                line += (f"; the masks alone (K (K + 1) = 110 AES-CTR streams of m + 1 ring words with their ring "
                         f"additions, and the quantisation, timed in one warm process with no messages) cost "
                         f"{v['floor_s']:.3f} s, so no complete-graph round can go below (plain + masks) / plain "
                         f"= **{v['floor']:.2f}x** here")
            out.append(line)
    sc = doc.get("scaling")
    if sc:
        out += ["", "## Growth with K (in-memory rows)", "",
                "Per round; `slope` = d log(quantity) / d log K fitted over "
                "the sweep (1: linear in K, 2: quadratic). Wall and all-party CPU cover every party of the round; "
                "bytes are per client.", "",
                "| m | method | K | wall (s) | CPU all (s) | CPU path (s) | bytes/client | overhead bytes vs plain |",
                "|---|---|---|---|---|---|---|---|"]
        for item in sc["rows"]:
            out.append(f"| {item['m']:.0e} | {item['method']} | {item['K']} | {item['wall_s']:.4f} | "
                       f"{item['cpu_all_s']:.4f} | {item['cpu_path_s']:.4f} | {_fmt_bytes(item['bytes'])} | "
                       f"{_fmt_bytes(item['overhead_bytes'])} |")
        out += ["", "| m | method | slope wall | slope CPU all | slope CPU path | slope overhead bytes/client |",
                "|---|---|---|---|---|---|"]
        for f in sc["fits"]:
            out.append(f"| {f['m']:.0e} | {f['method']} | {f['wall']:.2f} | {f['cpu_all']:.2f} | {f['cpu_path']:.2f} | "
                       f"{f['overhead_bytes']:.2f} |")
    e = doc.get("extrapolation")
    if e:
        a = e["anchor"]
        out += ["", "## Communication expansion vs Bonawitz et al.", "",
                f"Per-client secure-minus-plain bytes at m = {e['fit_m']:.0e}: "
                + ", ".join(f"K={k}: {_fmt_bytes(v)}" for k, v in e["per_client_overhead_bytes"].items())
                + f"; linear fit {e['fit_a_bytes']:.0f} + {e['fit_b_bytes_per_client']:.0f} K bytes.",
                f"Extrapolated to K = {a['K']}, m = 2^20: {a['predicted_expansion_32bit']:.3f}x a float32 "
                f"vector ({a['predicted_expansion_vs_16bit_plain']:.3f}x a 16-bit vector); Bonawitz et al. "
                f"report {a['bonawitz_reported']}x (their encodings and key sizes differ; this is a linear "
                "extrapolation of our measured per-neighbour overhead, not a run at that size)."]
    env = harness.environment_line(doc.get("environment"))
    if env:
        out += ["", env]
    return "\n".join(out) + "\n"


def plot(doc):
    """The in-memory rows at the largest m, or None when there are none."""
    import matplotlib.ticker

    plt = harness.pyplot()

    rows = [r for r in doc["rows"] if r["transport"] == "inmemory"]
    if not rows:
        return None
    m = max(r["m"] for r in rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, title in ((axes[0], "wall_s", "wall per round (all parties share the cores)"),
                           (axes[1], "critical_cpu_s", "CPU critical path per round")):
        for method in METHODS:
            pts = sorted((r["K"], r[key]) for r in rows if r["m"] == m and r["method"] == method)
            if pts:
                ax.plot(*zip(*pts), marker="o", label=method)
        ax.set_xlabel("clients K")
        ax.set_ylabel("seconds")
        ax.set_title(f"{title}, m = {m:.0e}", fontsize=9)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ks = sorted({r["K"] for r in rows})
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    return fig


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_common_args(ap, quick_help="K in {5, 10}, m in {1e4, 1e5}, 2 rounds", render_only=True)
    ap.add_argument("--ks", type=int, nargs="*")
    ap.add_argument("--ms", type=int, nargs="*")
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--processes", choices=("auto", "on", "off", "only"), default="auto",
                    help="also run K = 5, 10 as processes through the launcher (auto: not with --quick, and "
                         f"only where the roles are registered as {NAME!r})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--passes", type=int, default=1,
                    help="launches of each process variant, interleaved (plain, secure, previous, plain, ...)")
    ap.add_argument("--previous", default=None,
                    help="a folder holding the previous commit's package as fedhet/ (git archive COMMIT | tar -x "
                         "-C DIR/fedhet): adds its secure row to the process runs, interleaved with the others")
    ap.add_argument("--processes-plus", action="store_true", help="also run secure+ as processes")
    ap.add_argument("--process-ks", type=int, nargs="*", help="K of the process rows (default: those of --ks <= 10)")
    ap.add_argument("--process-ms", type=int, nargs="*", help="m of the process rows (default: those of --ms >= 1e5)")
    args = ap.parse_args(argv)
    out_file = harness.Output("secagg", quick=args.quick, out_dir=args.out)
    if args.render_only:
        doc = out_file.read()
        out_file.write(doc, render_md(doc), plot(doc))
        print(render_md(doc))
        return 0
    if args.processes == "only":
        args.processes = "on"
        ms_mem = []
    else:
        ms_mem = None
    ks = args.ks or ([5, 10] if args.quick else [5, 10, 50])
    ms = args.ms or ([10**4, 10**5] if args.quick else [10**4, 10**5, 10**6])
    rounds = args.rounds or (2 if args.quick else 5)
    procs = args.processes == "on" or (args.processes == "auto" and not args.quick)
    if args.processes == "on" and not processes_available():
        ap.error(f"--processes on: the launcher can only start registered algorithms; register the roles "
                 f"of this script as {NAME!r} first")
    session = harness.Session("secagg", __file__, argv)
    doc = {"quick": args.quick, "command": session.command,
           "machine": harness.machine_label(session.meta),
           "rounds": rounds, "rows": [], "how": {"inmemory": INMEMORY_HOW}, "notes": []}
    for k in ks:
        for m in (ms if ms_mem is None else ms_mem):
            for method in args.methods:
                t0 = time.perf_counter()
                row = {"transport": "inmemory", "K": k, "m": m, "method": method}
                row.update(bench_inmemory(k, m, method, rounds, args.seed))
                doc["rows"].append(row)
                print(f"inmemory K={k:3d} m={m:8d} {method:8s} wall {row['wall_s']:.4f}s  cpu-path "
                      f"{row['critical_cpu_s']:.4f}s  bytes/client {row['bytes_per_client']:,}  "
                      f"({time.perf_counter() - t0:.1f}s)", flush=True)
    if procs and not processes_available():
        doc["notes"].append(f"process rows skipped: fedhet's launcher starts registered algorithms only, and "
                            f"this script's roles are not registered as {NAME!r}.")
        procs = False
    if procs:
        doc["how"]["zmq-processes"] = PROCESS_HOW
        for k in args.process_ks or [k for k in ks if k <= 10]:
            for m in args.process_ms or [m for m in ms if m >= 10**5]:
                variants = {x: (x, None) for x in args.methods if x != "secure+" or args.processes_plus}
                if args.previous and "secure" in variants:
                    variants[PREVIOUS] = ("secure", args.previous)
                res = bench_processes_interleaved(k, m, variants, rounds, args.seed, args.passes)
                for name, r in res.items():
                    row = {"transport": "zmq-processes", "K": k, "m": m, "method": name, **r}
                    doc["rows"].append(row)
                    print(f"processes K={k:3d} m={m:8d} {name:28s} wall {row['wall_s']:.4f}s  protocol CPU total "
                          f"{row['protocol_cpu_total_s']:.3f}s path {row['critical_cpu_s']:.4f}s  server process "
                          f"{row['server_process_cpu_s']:.4f}s  steps {row['server_steps_s']}  bytes/client "
                          f"{row['bytes_per_client']:,}  audit {'ok' if row['audit_ok'] else 'FAILED'}", flush=True)
    by = {(r["transport"], r["K"], r["m"], r["method"]): r for r in doc["rows"]}
    goals = {}
    for tr in ("inmemory", "zmq-processes"):
        p = by.get((tr, 10, 10**6, "plain"))
        for method in ("secure", PREVIOUS):
            s = by.get((tr, 10, 10**6, method))
            if not (p and s):
                continue
            for key, metric, goal in (("wall time", "wall_s", 1.3), ("CPU critical path", "critical_cpu_s", 1.5),
                                      ("protocol CPU, all parties", "protocol_cpu_total_s", 1.5),
                                      ("bytes per client", "bytes_per_client", 1.1)):
                v = s[metric] / p[metric]
                goals[f"{key} ({tr}, {method})"] = {"measured": v, "goal": goal, "met": v <= goal}
                if metric == "protocol_cpu_total_s":
                    floor = doc.setdefault("mask_floor_s", mask_floor(10, 10**6, args.seed))
                    goals[f"{key} ({tr}, {method})"].update(
                        floor_s=floor, floor=(p[metric] + floor) / p[metric])
    doc["goals"] = goals
    doc["extrapolation"] = extrapolate(doc["rows"])
    doc["scaling"] = scaling(doc["rows"])
    doc["environment"] = session.finish()
    out_file.write(doc, render_md(doc), plot(doc))
    print(render_md(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
