"""``fedhet run``: every party of a federation as its own local process, or many in a host process.

The launcher makes a run folder, fresh key pairs for every party (in a private
temporary folder outside the run folder, mode 0700, removed when the run ends:
the run folder is what users hand to an auditor, and a signing key there would
let anyone re-sign its transcripts; the secret halves live only in the launcher's
memory, :class:`~fedhet.parties.keys.TemporaryKeys`, so a launcher killed with
SIGKILL leaves none behind), assigns free loopback ports, writes the
resolved federation file there, starts one ``fedhet party`` process per party,
shows their progress, and stops everything as soon as any party fails.  No
child outlives it: every party runs in its own process group, and every group
is killed at the end, also those whose party has already exited (its pool
workers live in it).

``result.json`` of a failed run names the party the evidence proves at fault and
why, or ``"party": null`` ("unknown") with the evidence
(``"failed": {"party", "reason", "proven", "cause", "evidence"}``): the verdict of
:mod:`fedhet.parties.failure` over every party's own failure record (and, for a
process that left none, what the launcher saw: a signal or an exit code), never
file ages or exit order.  Every party's entry says ``"state"``: ``done``,
``failed`` or ``stopped`` (stopped by the launcher because another failed).

Hosts (``host`` / ``hosts`` in the federation file): the parties of one host
run in one ``fedhet host`` process (:mod:`fedhet.parties.host`), each with its
own files as above.  The launcher watches the parties' own ``error.json`` as
well as the processes, so a failure is still named by *party* (``"failed"``
also says ``"host"``), and a host killed outright is blamed on its first party
that had not finished.  ``result.json`` then has ``"hosts"``: each host's
parties, exit code, peak RSS, descriptors and threads (``RUN_DIR/hosts/H.json``,
written by the host) and its output in ``RUN_DIR/hosts/H.log``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedhet.parties import failure as failure_records
from fedhet.parties import runfolder as rf
from fedhet.parties import status as party_status
from fedhet.parties.atomic import write_atomic, write_json_atomic
from fedhet.parties.contract import Algorithm, installed_algorithm, prepare
from fedhet.parties.federation import Federation
from fedhet.parties.ops.engines import Engine, check_capabilities, make_engine
from fedhet.parties.progress import LinePrinter
from fedhet.parties.runfolder import host_dir, party_dir
from fedhet.parties.settings import SettingsError


class RunFailed(RuntimeError):
    """The run failed; ``party`` is the party the evidence proves at fault, or None ("unknown")."""

    def __init__(self, party: str | None, reason: str, run_dir: Path, host: str | None = None):
        where = f" (in host {host!r})" if host else ""
        who = f"party {party!r}{where} failed" if party else "the run failed, no party proven at fault"
        super().__init__(f"{who}: {reason} (logs in {run_dir})")
        self.party, self.reason, self.run_dir, self.host = party, reason, run_dir, host


def default_run_dir(fed: Federation) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{fed.algorithm_name}-{stamp}-{uuid.uuid4().hex[:6]}"


def check_before_launch(fed: Federation, overrides: dict[str, Any] | None = None,
                        algorithm: Algorithm | None = None) -> None:
    """The checks a party would make of the settings, made once before any party starts (and before
    the run folder exists): the ``[algorithm]`` table with ``--set`` overrides parses (unknown keys,
    types, ranges, every key the algorithm requires).  (A role the algorithm lacks still fails
    in its own party, by name: tests use such a party to fail one party on purpose.)"""
    algo = algorithm if algorithm is not None else installed_algorithm(fed.algorithm_name)
    table = fed.algorithm_cfg()
    table.update(overrides or {})
    how = " (with --set " + ", ".join(f"{k}={v!r}" for k, v in overrides.items()) + ")" if overrides else ""
    try:
        prepare(algo, table)
    except ValueError as e:
        msg = str(e)
        hint = "" if "--describe" in msg else (f" (set keys in [algorithm] or with --set KEY=VALUE; `fedhet presets "
                                                f"--describe {algo.name}` lists every key)")
        raise SettingsError(f"{fed.source}: [algorithm]{how}: {msg}{hint}; no party was started") from None


def resume_federation(run_dir: str | os.PathLike) -> Federation:
    """The federation a run folder was launched with (its ``federation.toml``: the settings and
    ``--set`` overrides in force, the run id), to resume it; FederationError naming what is missing."""
    from fedhet.parties.federation import FederationError, load

    path = Path(run_dir) / rf.FEDERATION
    if not path.is_file():
        raise FederationError(f"{run_dir}: not a run folder of `fedhet run` (no federation.toml): nothing to resume")
    return load(path)


# Parties that name no host, beyond which `fedhet run` puts them into host processes itself when
# [federation] hosts is not set.  A party in a process of its own costs ~100 MiB (Python, numpy, torch,
# libzmq) and a dozen threads; one more in a host costs a few MiB and its transport's threads
# (benchmarks/secagg_scale.py: K = 1,000 SecAgg+ clients in 8 hosts hold 3.4 GiB in all).
AUTO_HOSTS_ABOVE = 64
PARTIES_PER_HOST = 128   # ~0.4 GiB and ~500 threads per host at K = 1,000; descriptors well below 20,000
AUTO_HOSTS = (4, 16)     # at least, at most: more hosts than this only add start-up and memory on a few cores


def default_hosts(fed: Federation) -> tuple[Federation, str | None]:
    """``fed`` with ``hosts`` chosen for many parties when the file sets none, and the line that says so
    (None when the file's own choice stands: ``hosts`` set, or at most AUTO_HOSTS_ABOVE unhosted parties).

    A hub, the one party of its role among many (a server, a coordinator), gets a process of its own
    (:func:`hubs`): in a host it would share one interpreter lock with a hundred parties, while its work
    grows with all of them (a SecAgg server's key lists and relays: K messages of k entries each).
    """
    free = sum(1 for p in fed.parties if not p.host)
    if fed.hosts > 0 or free <= AUTO_HOSTS_ABOVE:
        return fed, None
    lone = hubs(fed)
    free -= len(lone)
    lo, hi = AUTO_HOSTS
    n = min(hi, max(lo, -(-free // PARTIES_PER_HOST)))
    parties = [replace(p, host=f"{HUB_HOST_PREFIX}{i}") if p.name in lone else p for i, p in enumerate(fed.parties)]
    alone = f"; {', '.join(sorted(lone))} in a process of its own (the one party of its role)" if lone else ""
    return replace(fed, hosts=n, parties=parties), (
        f"{free} parties name no host and [federation] hosts is not set: running them in {n} host processes "
        f"(about {-(-free // n)} parties each, round-robin in file order){alone}; set hosts to choose")


HUB_HOST_PREFIX = "hub"   # a host of one party: a process of its own (Federation.host_groups lists none)


def hubs(fed: Federation) -> set[str]:
    """Unhosted parties that are the only one of their role while another role has more than
    AUTO_HOSTS_ABOVE parties: the server of a thousand clients, not one of two peers."""
    count: dict[str, int] = {}
    for p in fed.parties:
        count[p.role] = count.get(p.role, 0) + 1
    if max(count.values(), default=0) <= AUTO_HOSTS_ABOVE:
        return set()
    return {p.name for p in fed.parties if not p.host and count[p.role] == 1}


def launch(fed: Federation, run_dir: str | os.PathLike | None = None, insecure: bool = False,
           timeout: float | None = None, progress: bool = True, overrides: dict[str, Any] | None = None,
           env: dict[str, str] | None = None, algorithm: Algorithm | None = None,
           log_level: str = "info", resume: bool = False, engine: Engine | None = None) -> dict[str, Any]:
    """Run the federation locally; returns the run summary or raises RunFailed.

    ``resume``: go on with the run in ``run_dir`` (``fed`` is then the folder's own
    ``federation.toml``: :func:`resume_federation`): the same run id and settings, fresh keys and
    ports, every party restarted with ``--resume`` from the newest checkpoint all of them hold.

    ``engine``: what runs the parties (an :class:`~fedhet.parties.ops.engines.Engine`; default
    :func:`~fedhet.parties.ops.engines.make_engine` of ``[federation] engine``); what the run asks for
    that the engine cannot do (its capability flags) is refused before the run folder exists.  ``env``: the parties' environment (default this one's).

    Bad settings raise :class:`SettingsError` before any party starts and before the run folder
    is made (:func:`check_before_launch`; ``algorithm`` defaults to the installed one of the name)."""
    check_before_launch(fed, overrides, algorithm)
    fed, why = default_hosts(fed)
    if why:
        print(why, flush=True)
    engine = engine if engine is not None else make_engine(fed, env, insecure, log_level)
    check_capabilities(engine, fed, resume)
    engine.check(fed, resume)
    run_dir = Path(run_dir) if run_dir else default_run_dir(fed)
    t0 = time.perf_counter()
    view: _Progress | _Lines | None = None
    failure: dict[str, Any] | None = None
    restore_signals = lambda: None  # noqa: E731
    resolved: Federation | None = None
    try:
        resolved = engine.prepare(fed, run_dir, overrides, fed.run_id if resume else None)
        hosts = resolved.host_groups()
        for p in resolved.parties:
            party_dir(run_dir, p.name).mkdir(parents=True, exist_ok=True)
        # a terminal gets live bars; redirected output (a file, CI, nohup) gets progress lines as they come
        if progress:
            view = _Progress(resolved, run_dir) if sys.stdout.isatty() else _Lines(resolved, run_dir)
        restore_signals = _trap_termination()
        engine.start(run_dir, resume)
        if view:
            view.start()
        failed_since: float | None = None
        while True:
            codes = engine.poll()
            failed = [n for n, c in codes.items() if c not in (None, 0)]
            if hosts and not failed and _hosted_failures(run_dir, hosts, codes):
                # A party in a host failed: its host runs on until its other parties end, so the
                # party's own error.json is the first sign.  Give its peers' reports a moment.
                failed_since = failed_since if failed_since is not None else time.monotonic()
                if time.monotonic() - failed_since > 1.0:
                    failed = [h for h in hosts if codes[h] is None]
            if failed:
                # The evidence decides (fedhet.parties.failure.verdict), not which process ended first;
                # read before anyone is stopped (a party stopped now was stopped from outside).
                failure = _verdict(resolved, run_dir, hosts, codes, engine)
                raise RunFailed(failure["party"], failure["reason"], run_dir, failure.get("host"))
            if all(c == 0 for c in codes.values()):
                break
            if timeout is not None and time.perf_counter() - t0 > timeout:
                running = [n for n, c in codes.items() if c is None]
                running = [m for n in running for m in (_unfinished(run_dir, hosts[n]) if n in hosts else [n])]
                failure = {"party": running[0], "reason": f"still running after the {timeout:g}s run timeout "
                                                          f"(also running: {running[1:]})"}
                raise RunFailed(running[0], failure["reason"], run_dir)
            if view:
                view.update()
            time.sleep(0.1)
    except BaseException as e:
        engine.stop()
        if resolved is None:
            engine.close()
            raise
        if failure is None:
            failure = {"party": None, "reason": f"launcher stopped: {type(e).__name__}: {e}".rstrip(": ")}
        _mark_stopped(resolved, run_dir, failure)
        _write_summary(resolved, run_dir, time.perf_counter() - t0, ok=False, failure=failure, hosts=hosts,
                       codes=engine.codes(), engine=engine.describe())
        raise
    finally:
        if view:
            view.stop()
        engine.stop()
        restore_signals()
        engine.close()
    return _write_summary(resolved, run_dir, time.perf_counter() - t0, ok=True, hosts=hosts,
                          codes=engine.codes(), engine=engine.describe())


def _unfinished(run_dir: Path, names: list[str]) -> list[str]:
    """Parties (of a host) with neither a result nor an error of their own yet."""
    return [n for n in names if not (party_dir(run_dir, n) / rf.RESULT).exists()
            and not (party_dir(run_dir, n) / rf.ERROR).exists()] or list(names)


def _own_error(run_dir: Path, name: str) -> dict | None:
    """A party's error report, unless it only says the party was stopped from outside."""
    err = _read_json(party_dir(run_dir, name) / rf.ERROR)
    return err if err is not None and not err.get("stopped") else None


def _hosted_failures(run_dir: Path, hosts: dict[str, list[str]], codes: dict[str, int | None]) -> bool:
    return any(_own_error(run_dir, n) is not None for h, ns in hosts.items() if codes[h] is None for n in ns)


def _verdict(fed: Federation, run_dir: Path, hosts: dict[str, list[str]],
             codes: dict[str, int | None], engine: Any) -> dict[str, Any]:
    """The failed run's verdict: every party's own failure record, and for a process (or a host)
    that ended without one, what the launcher saw of it (killed by a signal, or its exit code)."""
    host_of = {n: h for h, ns in hosts.items() for n in ns}
    records: dict[str, dict | None] = {}
    for p in fed.parties:
        rec = _read_json(party_dir(run_dir, p.name) / rf.ERROR)
        proc = host_of.get(p.name, p.name)
        code = codes.get(proc)
        if rec is None and code not in (None, 0):
            if p.name in host_of:  # a host that died outright: its first unfinished party stands for it
                if p.name != _unfinished(run_dir, hosts[proc])[0] or _hosted_any_record(run_dir, hosts[proc]):
                    continue
            rec = engine.exit_record(run_dir, proc, p.name, p.role, code or 0)
        if rec is not None and rec.get("cause") == "stopped":
            # The launcher has stopped nobody yet: a party stopped now was stopped from outside
            # (a signal to it or to its host), which is its own failure as far as the run goes.
            rec = dict(rec, cause="own", culprit=p.name)
        records[p.name] = rec
    v = failure_records.verdict(records)
    if v["party"] in host_of:
        v["host"] = host_of[v["party"]]
    return v


def _hosted_any_record(run_dir: Path, names: list[str]) -> bool:
    return any((party_dir(run_dir, n) / rf.ERROR).exists() for n in names)


def _trap_termination():
    """Make SIGTERM/SIGHUP raise SystemExit, so launch's cleanup stops every child.

    By default they kill the launcher outright and its children (in their own
    sessions) run on.  Signal handlers can only be set from the main thread;
    elsewhere the children's parent-death signal still covers us.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None

    def on_signal(signum, frame):
        for s in old:  # a second signal must not interrupt the cleanup
            signal.signal(s, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    return lambda: [signal.signal(s, h) for s, h in old.items()]


def _read_json(path: Path) -> dict | None:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _mark_stopped(fed: Federation, run_dir: Path, failure: dict) -> None:
    """Parties the launcher stopped (no result, no error of their own) must not read "running"."""
    cause = (f"stopped by the launcher after {failure['party']!r} failed" if failure.get("party")
             else f"stopped by the launcher ({failure.get('reason')})")
    for p in fed.parties:
        pdir = party_dir(run_dir, p.name)
        err = _read_json(pdir / rf.ERROR)
        own_failure = err is not None and not err.get("stopped")  # a party stopped by SIGTERM says so
        if (pdir / rf.RESULT).exists() or own_failure or p.name == failure.get("party"):
            continue
        if (party_status.read(pdir / rf.STATUS) or {}).get("reason"):
            continue
        try:   # refused where the party's own final state is there already (done, failed)
            party_status.advance(pdir / rf.STATUS,
                                 {"party": p.name, "role": p.role, "state": "stopped", "reason": cause})
        except OSError:
            pass


def _party_summary(p, run_dir: Path, failure: dict | None) -> dict[str, Any]:
    pdir = party_dir(run_dir, p.name)
    res = _read_json(pdir / rf.RESULT)
    if res is not None:
        return dict(res, state="done")
    st = _read_json(pdir / rf.STATUS) or {}
    err = _read_json(pdir / rf.ERROR)
    if st.get("state") == "stopped" and (failure is None or failure.get("party") != p.name):
        return {"role": p.role, "state": "stopped",
                "error": st.get("reason") or (err or {}).get("error") or "stopped by the launcher"}
    if err is not None:
        return {"role": p.role, "state": "failed", "error": err.get("error")}
    if failure is not None and failure.get("party") == p.name:
        return {"role": p.role, "state": "failed", "error": failure.get("reason")}
    return {"role": p.role, "state": st.get("state") or "unknown", "error": "no result"}


def _write_summary(fed: Federation, run_dir: Path, wall: float, ok: bool,
                   failure: dict | None = None, hosts: dict[str, list[str]] | None = None,
                   codes: dict[str, int | None] | None = None, engine: dict | None = None) -> dict[str, Any]:
    parties: dict[str, Any] = {}
    merged: list[dict] = []
    for p in fed.parties:
        pdir = party_dir(run_dir, p.name)
        parties[p.name] = _party_summary(p, run_dir, failure)
        m = pdir / rf.METRICS
        if m.exists():
            for line in m.read_text().splitlines():
                try:
                    merged.append(json.loads(line))
                except ValueError:
                    pass
    merged.sort(key=lambda r: (r.get("round", 0), r.get("party", "")))
    write_atomic(run_dir / rf.METRICS, "".join(json.dumps(r, sort_keys=True) + "\n" for r in merged))
    summary = {
        "ok": ok, "run_id": fed.run_id, "algorithm": fed.algorithm_name, "federation": fed.name,
        "wall_s": wall, "parties": parties, "network": fed.network,
        "bytes_total": sum(v.get("traffic", {}).get("bytes_sent_total", 0) for v in parties.values()),
    }
    if hosts:
        summary["hosts"] = {
            h: dict(_read_json(host_dir(run_dir) / f"{h}.json") or {}, parties=names,
                    exit_code=(codes or {}).get(h))
            for h, names in hosts.items()}
    if engine is not None:
        summary["engine"] = engine
    if failure is not None:
        summary["failed"] = failure
    write_json_atomic(run_dir / rf.RESULT, summary)
    return summary


class _Lines:
    """Progress lines (parties/progress.py) from the parties' status.json files, for output that is
    not a terminal: one line per party when its state or step changes, at most every few seconds."""

    def __init__(self, fed: Federation, run_dir: Path):
        self.fed, self.run_dir = fed, run_dir
        self.printer = LinePrinter(stream=sys.stdout)

    def start(self) -> None:
        print(f"run {self.fed.run_id}: {len(self.fed.parties)} parties, folder {self.run_dir}", flush=True)

    def update(self) -> None:
        for p in self.fed.parties:
            st = _read_json(party_dir(self.run_dir, p.name) / rf.STATUS)
            if st is not None:
                self.printer.maybe(st)

    def stop(self) -> None:
        self.update()


class _Progress:
    """A rich progress bar per party, fed by their status.json files."""

    def __init__(self, fed: Federation, run_dir: Path):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.fed, self.run_dir = fed, run_dir
        # markup=False: party names and metrics are shown as they are (rich would eat [brackets])
        self.progress = Progress(TextColumn("{task.description:<18}", markup=False), BarColumn(),
                                 TextColumn("{task.fields[info]}", markup=False), TimeElapsedColumn(), transient=False)
        self.tasks = {p.name: self.progress.add_task(f"{p.name} ({p.role})", total=None, info="starting")
                      for p in fed.parties}

    def start(self) -> None:
        self.progress.start()

    def update(self) -> None:
        for name, task in self.tasks.items():
            st = party_dir(self.run_dir, name) / rf.STATUS
            try:
                s = json.loads(st.read_text())
            except (OSError, ValueError):
                continue
            info = s.get("state", "")
            if s.get("metrics"):
                info = " ".join(f"{k}={v}" for k, v in s["metrics"].items())
            total = s.get("total") or None
            self.progress.update(task, total=total, completed=s.get("done", 0), info=info)

    def stop(self) -> None:
        self.update()
        self.progress.stop()
