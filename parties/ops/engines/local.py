"""The local engine: every party, or host of parties, an OS process of this machine.

:func:`prepare_local` makes the run's keys (in a private temporary folder outside the run folder,
:class:`~fedhet.parties.keys.TemporaryKeys`), loopback ports and run id and writes the resolved
federation file; :class:`LocalProcesses` starts one ``python -m fedhet.parties party`` (or ``host``)
process per unit, each in its own process group, restarts one killed by a signal when
``restart_grace_s`` allows (``--resume``), and kills every group at the end.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from fedhet.parties import failure as failure_records
from fedhet.parties import keys as keyfiles
from fedhet.parties import runfolder as rf
from fedhet.parties.atomic import write_atomic
from fedhet.parties.faults import KILL_ENV
from fedhet.parties.federation import Federation, absolute_data
from fedhet.parties.host import THREAD_ENV
from fedhet.parties.runfolder import host_dir, party_dir
from fedhet.parties.runtime import LAUNCHER_PID_ENV, group_alive, raise_open_file_limit


MAX_RESTARTS = 3   # per party process, with [federation] restart_grace_s > 0


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (Linux; elsewhere the IANA range)."""
    try:
        lo, hi = (int(x) for x in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
        return lo, hi
    except (OSError, ValueError):
        return 49152, 65535


LISTEN_PORTS_FROM = 20000   # up to the ephemeral range; below 20000 lie Ray's worker ports (10002-19999) and other services


def free_port(taken: set[int] | frozenset[int] = frozenset()) -> int:
    """A loopback port free now, for a party to listen on later.

    Drawn at random below the kernel's ephemeral range: a port the kernel hands out (an outgoing
    connection's own port, another program's bind to port 0) would be free now and might be taken
    by the time the party binds it, as happened under load with thousands of connections open.
    Falls back to a kernel-chosen port when no port below the range is free after many draws (or
    the range starts at or below ``LISTEN_PORTS_FROM``).  ``taken``: ports already handed out.
    """
    lo, _hi = ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(200 if lo > LISTEN_PORTS_FROM else 0):
        port = rng.randrange(LISTEN_PORTS_FROM, lo)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in taken:
            return port


def prepare_local(fed: Federation, run_dir: Path, overrides: dict[str, Any] | None = None,
                  key_dir: Path | None = None, run_id: str | None = None) -> tuple[Federation, Path]:
    """Fresh keys, loopback ports and a run id; returns the resolved federation and its file.

    Secret keys go to ``key_dir`` (default: a new :class:`~fedhet.parties.keys.TemporaryKeys`
    folder, never inside ``run_dir``, whose secrets live in this process's memory); the caller
    releases it when the run is over (``keys.release_temporary``; at the latest at exit).
    ``run_id``: keep this id (a resumed run) instead of a fresh one.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    temporary = None
    if key_dir is None:
        temporary = keyfiles.TemporaryKeys(run_dir.name)
        key_dir = temporary.path
    parties = []
    used: set[int] = set()
    for p in fed.parties:
        pub = (temporary.generate(p.name) if temporary is not None
               else keyfiles.generate(key_dir, p.name, overwrite=True))
        port = free_port(used)
        used.add(port)
        parties.append(replace(p, endpoint=f"tcp://127.0.0.1:{port}", public_key=pub.curve, sign_key=pub.sign,
                               data=absolute_data(p.data, fed.base_dir)))
    algorithm = dict(fed.algorithm)
    algorithm.update(overrides or {})
    resolved = replace(fed, parties=parties, key_dir=key_dir.resolve(),
                       algorithm=algorithm, source=str(run_dir / rf.FEDERATION),
                       run_id=run_id or uuid.uuid4().hex)
    fed_file = run_dir / rf.FEDERATION
    write_atomic(fed_file, resolved.to_toml())
    return resolved, fed_file


def stop_all(procs: dict[str, subprocess.Popen], grace: float = 3.0) -> None:
    """SIGTERM every party's process group, SIGKILL what is left after ``grace`` seconds.

    Groups are signalled even when their leader (the party) has exited: its
    pool workers and other children live on in the group until killed.
    """
    def signal_groups(sig: int) -> None:
        for p in procs.values():
            try:
                os.killpg(p.pid, sig)  # a party's group id is its pid (start_new_session)
            except (ProcessLookupError, PermissionError):
                pass

    signal_groups(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    while time.monotonic() < deadline and any(group_alive(p.pid) for p in procs.values()):
        time.sleep(0.05)
    signal_groups(signal.SIGKILL)
    for p in procs.values():
        p.wait()


class LocalProcesses:
    """The default engine: every party, or host, an OS process of this machine (see the module's text).

    An engine is what :func:`launch` runs the federation on.  It makes the keys and endpoints
    (:meth:`prepare`), starts each unit, a party alone or a host of several (:meth:`start`), says how
    each unit stands (:meth:`poll`: name -> exit code, None while it runs; a unit the engine lost
    reads as an exit code too), keeps every party's ``status.json``, ``error.json`` and
    ``result.json`` in the run folder up to date, and at the end stops every unit and brings all of
    its files into the run folder (:meth:`stop`) before :meth:`close` frees the keys.  The Ray engine
    (:mod:`fedhet.parties.ops.engines.ray`) is the other one."""

    name = "local"
    supports_resume = True
    supports_restart = True

    def __init__(self, env: dict[str, str] | None = None, insecure: bool = False, log_level: str = "info"):
        self.env, self.insecure, self.log_level = env, insecure, log_level
        self.procs: dict[str, subprocess.Popen] = {}  # party name, or host name for a host process
        self.commands: dict[str, tuple[list[str], Path, dict]] = {}  # ... its command, output file, environment
        self.restarts: dict[str, int] = {}
        self.fed: Federation | None = None
        self.fed_file: Path | None = None

    def check(self, fed: Federation, resume: bool) -> None:
        """Settings this engine cannot run, refused before the run folder exists (none here)."""

    def prepare(self, fed: Federation, run_dir: Path, overrides: dict[str, Any] | None,
                run_id: str | None) -> Federation:
        raise_open_file_limit()  # the parties' secret keys are two descriptors each here (keys.TemporaryKeys)
        self.fed, self.fed_file = prepare_local(fed, run_dir, overrides, run_id=run_id)
        return self.fed

    def start(self, run_dir: Path, resume: bool) -> None:
        assert self.fed is not None and self.fed_file is not None
        resolved, fed_file, log_level = self.fed, self.fed_file, self.log_level
        hosts = resolved.host_groups()
        child_env = dict(os.environ if self.env is None else self.env)
        child_env.setdefault("PYTHONUNBUFFERED", "1")
        child_env[LAUNCHER_PID_ENV] = str(os.getpid())  # children exit if we die (runtime.die_with_launcher)
        host_env = dict(child_env)
        if resolved.host_threads > 0:  # before the host loads BLAS / OpenMP (torch is set in the host)
            host_env.update({k: str(resolved.host_threads) for k in THREAD_ENV})
        hosted = {n for ns in hosts.values() for n in ns}
        for p in resolved.parties:
            if p.name in hosted:
                continue
            pdir = party_dir(run_dir, p.name)
            cmd = [sys.executable, "-m", "fedhet.parties", "party", str(fed_file), "--name", p.name,
                   "--out", str(run_dir), "--run-id", resolved.run_id, "--quiet", "--log-level", log_level]
            cmd += ["--insecure"] * self.insecure
            self.commands[p.name] = (cmd, pdir / rf.STDOUT, child_env)
            self.procs[p.name] = start_process(cmd + ["--resume"] * resume, pdir / rf.STDOUT, child_env, append=resume)
        if hosts:
            host_dir(run_dir).mkdir(parents=True, exist_ok=True)
        for h in hosts:
            (host_dir(run_dir) / f"{h}.json").unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "fedhet.parties", "host", str(fed_file), "--host", h,
                   "--out", str(run_dir), "--run-id", resolved.run_id, "--quiet", "--log-level", log_level]
            cmd += ["--insecure"] * self.insecure
            self.commands[h] = (cmd, host_dir(run_dir) / f"{h}.log", host_env)
            self.procs[h] = start_process(cmd + ["--resume"] * resume, host_dir(run_dir) / f"{h}.log", host_env,
                                   append=resume)

    def poll(self) -> dict[str, int | None]:
        assert self.fed is not None
        codes = {n: pr.poll() for n, pr in self.procs.items()}
        for n, c in codes.items():   # with restart_grace_s, a process killed by a signal comes back
            # ... while another unit still runs: killed after every other party had ended, it would
            # find nobody to resume with (the run's failure names the kill instead of a 60 s wait)
            others = any(o is None for m, o in codes.items() if m != n)
            if (c is not None and c < 0 and self.fed.restart_grace_s > 0 and others
                    and self.restarts.get(n, 0) < MAX_RESTARTS and not self.insecure):
                self.restarts[n] = self.restarts.get(n, 0) + 1
                cmd, log_file, proc_env = self.commands[n]
                proc_env = {k: v for k, v in proc_env.items() if k != KILL_ENV}   # a cue fires once
                print(f"{n} was killed ({signal.Signals(-c).name}); restarting it with --resume "
                      f"({self.restarts[n]} of {MAX_RESTARTS}); the others wait up to {self.fed.restart_grace_s:g}s",
                      file=sys.stderr, flush=True)
                self.procs[n] = start_process(cmd + ["--resume"], log_file, proc_env, append=True)
                codes[n] = None
        return codes

    def exit_record(self, run_dir: Path, unit: str, party: str, role: str, code: int) -> dict:
        """The record of ``party`` when its unit ended with ``code`` and the party left none."""
        detail = f"host {unit!r} ended" if unit != party else stdout_tail(run_dir, party)
        return failure_records.exit_record(party, role, code, detail)

    def stop(self) -> None:
        stop_all(self.procs)

    def codes(self) -> dict[str, int | None]:
        return {n: pr.returncode for n, pr in self.procs.items()}

    def describe(self) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        if self.fed is not None and self.fed.key_dir is not None and not keyfiles.release_temporary(self.fed.key_dir):
            shutil.rmtree(self.fed.key_dir, ignore_errors=True)


def start_process(cmd: list[str], log_file: Path, env: dict, append: bool = False) -> subprocess.Popen:
    """A party or host process in its own session, its output to ``log_file``."""
    with open(log_file, "ab" if append else "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)


def stdout_tail(run_dir: Path, name: str) -> str:
    return failure_records.output_tail(party_dir(run_dir, name) / rf.STDOUT)
