"""A host process: many parties of one federation in one OS process, each on its own thread.

``fedhet run`` starts one host process per host of the federation (``host`` /
``hosts`` in the federation file, see :mod:`fedhet.parties.federation`), so that
hundreds of parties fit on one machine.  Every party stays a party: its own
CURVE and signing keys, its own ROUTER and DEALER sockets, transcript, log,
status, ``result.json`` or ``error.json``, written by the same code as a party
process of its own (:class:`fedhet.parties.runtime.PartyRun`); ``fedhet audit``
cannot tell the difference.  What the parties share is process-wide only: one
``zmq.Context`` with one ZAP handler (:class:`~fedhet.parties.zmq_transport.SharedContext`,
which keeps each party's admission list its own), the file-descriptor limit
(raised to the hard limit), and, with ``host_threads``, torch's and BLAS's thread
pools.

A failing party reports and notifies its peers exactly as alone; its host goes
on until all its parties ended and exits 1 if any of them failed (0: all done),
after writing ``RUN_DIR/hosts/HOST.json`` (each party's exit code, peak RSS,
descriptors and threads).  SIGTERM stops every party of the host that has not
ended with its "stopped" records, then exits 143.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from . import runfolder as rf
from .atomic import write_json_atomic
from .contract import Algorithm
from .federation import Federation
from .runtime import PartyRun, die_with_launcher, raise_open_file_limit

THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def limit_threads(n: int) -> None:
    """torch's intra-op pool (and BLAS / OpenMP through the environment) to ``n`` threads.

    The environment only reaches libraries not yet loaded: the launcher also sets it
    for the host's process.  torch is configured only where it is installed.
    """
    if n <= 0:
        return
    for k in THREAD_ENV:
        os.environ[k] = str(n)
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(n)


def process_usage() -> dict:
    """Peak and current RSS (MiB), open descriptors and threads of this process (Linux /proc)."""
    out: dict = {}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("VmHWM", "VmRSS"):
                out["peak_rss_mib" if k == "VmHWM" else "rss_mib"] = int(v.split()[0]) / 1024
            elif k == "Threads":
                out["threads"] = int(v)
        out["fds"] = len(os.listdir("/proc/self/fd"))
    except (OSError, ValueError):
        pass
    return out


def run_host(fed: Federation, host: str, run_dir: str | os.PathLike, algorithm: Algorithm,
             insecure: bool = False, run_id: str | None = None, echo: bool = False, log_level: str = "info",
             resume: bool = False) -> int:
    """Run every party of ``host`` to completion, one thread each; returns the exit code
    (0: every party done, 1: one or more failed, 143: stopped by SIGTERM)."""
    from .zmq_transport import SharedContext

    groups = fed.host_groups()
    if host not in groups:
        raise ValueError(f"{fed.source}: no host {host!r} runs two or more parties (hosts: {sorted(groups)})")
    die_with_launcher()
    fd_limit = raise_open_file_limit()
    limit_threads(fed.host_threads)
    run_dir = Path(run_dir)
    run_id = run_id or fed.derived_run_id()
    t0 = time.perf_counter()
    context = SharedContext()
    runs = [PartyRun(fed, name, run_dir, algorithm, insecure=insecure, run_id=run_id, echo=echo, log_level=log_level,
                     zmq_context=context, resume=resume) for name in groups[host]]
    lock = threading.Lock()
    stopping = threading.Event()

    def record_all(why: str) -> None:
        stopping.set()
        with lock:
            for r in runs:
                if r.code is None and not (r.pdir / rf.RESULT).exists():
                    try:
                        r.record_stop(why)
                    except Exception:
                        pass

    def on_sigterm(signum, frame):
        # As a party process does: record "stopped" for every party still running, then exit at
        # once (unwinding many threads out of long C calls could take arbitrarily long).
        try:
            record_all(f"stopped by signal {signal.Signals(signum).name}")
        finally:
            os._exit(143)

    die_with_launcher(record_all)   # a killed launcher: the same records, from a watcher thread

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread (tests): the default action stays
        pass
    peak = {"fds": 0, "threads": 0}
    threads = [threading.Thread(target=r.run, name=f"party-{r.name}", daemon=True) for r in runs]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        u = process_usage()
        peak["fds"] = max(peak["fds"], u.get("fds", 0))
        peak["threads"] = max(peak["threads"], u.get("threads", 0))
        time.sleep(0.2)
    context.close()  # waits for each party's last messages to leave (their sockets' linger)
    codes = {r.name: r.code if r.code is not None else 1 for r in runs}
    code = 0 if all(c == 0 for c in codes.values()) else 1
    usage = process_usage()
    try:
        rf.host_dir(run_dir).mkdir(parents=True, exist_ok=True)
        write_json_atomic(rf.host_dir(run_dir) / f"{host}.json", {
            "host": host, "pid": os.getpid(), "party_codes": codes, "exit_code": code,
            "wall_s": time.perf_counter() - t0, "fd_limit": fd_limit, "host_threads": fed.host_threads,
            "peak_fds": max(peak["fds"], usage.get("fds", 0)),
            "peak_threads": max(peak["threads"], usage.get("threads", 0)),
            "peak_rss_mib": usage.get("peak_rss_mib"), "rss_mib": usage.get("rss_mib")})
    except OSError:
        pass
    return code
