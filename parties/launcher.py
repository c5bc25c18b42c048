"""``fedhet run``: every party of a federation as its own local process.

The launcher makes a run folder, fresh key pairs for every party (kept in the
run folder, mode 0600), assigns free loopback ports, writes the resolved
federation file there, starts one ``fedhet party`` process per party, shows
their progress, and stops everything as soon as any party fails, naming it
and its reason.  No child outlives it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from . import keys as keyfiles
from .atomic import write_atomic, write_json_atomic
from .federation import Federation
from .runtime import LAUNCHER_PID_ENV, party_dir


class RunFailed(RuntimeError):
    def __init__(self, party: str, reason: str, run_dir: Path):
        super().__init__(f"party {party!r} failed: {reason} (logs in {run_dir})")
        self.party, self.reason, self.run_dir = party, reason, run_dir


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_run_dir(fed: Federation) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{fed.algorithm_name}-{stamp}-{uuid.uuid4().hex[:6]}"


def prepare_local(fed: Federation, run_dir: Path, overrides: dict[str, Any] | None = None) -> tuple[Federation, Path]:
    """Fresh keys, loopback ports and a run id; returns the resolved federation and its file."""
    run_dir.mkdir(parents=True, exist_ok=True)
    key_dir = run_dir / "keys"
    parties = []
    used: set[int] = set()
    for p in fed.parties:
        pub = keyfiles.generate(key_dir, p.name, overwrite=True)
        port = free_port()
        while port in used:
            port = free_port()
        used.add(port)
        parties.append(replace(p, endpoint=f"tcp://127.0.0.1:{port}", public_key=pub.curve, sign_key=pub.sign,
                               data=_absolute_data(p.data, fed.base_dir)))
    algorithm = dict(fed.algorithm)
    algorithm.update(overrides or {})
    resolved = replace(fed, parties=parties, key_dir=key_dir.resolve(), run_id=uuid.uuid4().hex,
                       algorithm=algorithm, source=str(run_dir / "federation.toml"))
    fed_file = run_dir / "federation.toml"
    write_atomic(fed_file, resolved.to_toml())
    return resolved, fed_file


def _absolute_data(data: dict, base_dir: str) -> dict:
    """A party's data spec with its path made absolute: the resolved federation file lives in
    the run folder, but the user wrote paths relative to their own file."""
    out = dict(data or {})
    path = out.get("path")
    if isinstance(path, str) and base_dir and not Path(path).expanduser().is_absolute():
        out["path"] = str((Path(base_dir) / path).resolve())
    return out


def _reason(run_dir: Path, name: str, code: int) -> str:
    err = party_dir(run_dir, name) / "error.json"
    if err.exists():
        try:
            return json.loads(err.read_text())["error"]
        except Exception:
            pass
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    out = party_dir(run_dir, name) / "stdout.log"
    tail = ""
    if out.exists():
        lines = [ln for ln in out.read_text(errors="replace").splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
    return f"exited with code {code}" + (f": {tail}" if tail else "")


def _stop_all(procs: dict[str, subprocess.Popen], grace: float = 3.0) -> None:
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
    deadline = time.monotonic() + grace
    for p in procs.values():
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs.values():
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()


def launch(fed: Federation, run_dir: str | os.PathLike | None = None, insecure: bool = False,
           timeout: float | None = None, progress: bool = True, overrides: dict[str, Any] | None = None,
           env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the federation locally; returns the run summary or raises RunFailed."""
    run_dir = Path(run_dir) if run_dir else default_run_dir(fed)
    resolved, fed_file = prepare_local(fed, run_dir, overrides)
    procs: dict[str, subprocess.Popen] = {}
    t0 = time.perf_counter()
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    child_env[LAUNCHER_PID_ENV] = str(os.getpid())  # children exit if we die (runtime.die_with_launcher)
    view = _Progress(resolved, run_dir) if progress else None
    restore_signals = _trap_termination()
    try:
        for p in resolved.parties:
            pdir = party_dir(run_dir, p.name)
            pdir.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", "fedhet.parties.cli", "party", str(fed_file), "--name", p.name,
                   "--out", str(run_dir), "--run-id", resolved.run_id, "--quiet"]
            if insecure:
                cmd.append("--insecure")
            with open(pdir / "stdout.log", "wb") as out:
                procs[p.name] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                 start_new_session=True, env=child_env)
        if view:
            view.start()
        while True:
            codes = {n: pr.poll() for n, pr in procs.items()}
            failed = [n for n, c in codes.items() if c not in (None, 0)]
            if failed:
                # The first to fail is the cause; the rest usually failed waiting for it.
                first = min(failed, key=lambda n: _failure_time(run_dir, n, codes[n]))
                raise RunFailed(first, _reason(run_dir, first, codes[first]), run_dir)
            if all(c == 0 for c in codes.values()):
                break
            if timeout is not None and time.perf_counter() - t0 > timeout:
                running = [n for n, c in codes.items() if c is None]
                raise RunFailed(running[0], f"still running after the {timeout:g}s run timeout "
                                f"(also running: {running[1:]})", run_dir)
            if view:
                view.update()
            time.sleep(0.1)
    except BaseException:
        _stop_all(procs)
        _write_summary(resolved, run_dir, time.perf_counter() - t0, ok=False)
        raise
    finally:
        if view:
            view.stop()
        _stop_all(procs)
        restore_signals()
    return _write_summary(resolved, run_dir, time.perf_counter() - t0, ok=True)


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


def _failure_time(run_dir: Path, name: str, code: int) -> float:
    """Order failures by cause: a killed process first, then the earliest error report.

    Peers of a dead party fail *because* of it (timeouts), so they sort after it.
    """
    if code < 0:
        return -1.0
    err = party_dir(run_dir, name) / "error.json"
    return err.stat().st_mtime if err.exists() else float("inf")


def _write_summary(fed: Federation, run_dir: Path, wall: float, ok: bool) -> dict[str, Any]:
    parties: dict[str, Any] = {}
    merged: list[dict] = []
    for p in fed.parties:
        pdir = party_dir(run_dir, p.name)
        res = pdir / "result.json"
        if res.exists():
            parties[p.name] = json.loads(res.read_text())
        elif (pdir / "error.json").exists():
            parties[p.name] = {"role": p.role, "error": json.loads((pdir / "error.json").read_text()).get("error")}
        else:
            parties[p.name] = {"role": p.role, "error": "no result"}
        m = pdir / "metrics.jsonl"
        if m.exists():
            for line in m.read_text().splitlines():
                try:
                    merged.append(json.loads(line))
                except ValueError:
                    pass
    merged.sort(key=lambda r: (r.get("round", 0), r.get("party", "")))
    write_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n" for r in merged))
    summary = {
        "ok": ok, "run_id": fed.run_id, "algorithm": fed.algorithm_name, "federation": fed.name,
        "wall_s": wall, "parties": parties,
        "bytes_total": sum(v.get("traffic", {}).get("bytes_sent_total", 0) for v in parties.values()),
    }
    write_json_atomic(run_dir / "result.json", summary)
    return summary


class _Progress:
    """A rich progress bar per party, fed by their status.json files."""

    def __init__(self, fed: Federation, run_dir: Path):
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.fed, self.run_dir = fed, run_dir
        self.progress = Progress(TextColumn("{task.description:<18}"), BarColumn(), TextColumn("{task.fields[info]}"),
                                 TimeElapsedColumn(), transient=False)
        self.tasks = {p.name: self.progress.add_task(f"{p.name} ({p.role})", total=None, info="starting")
                      for p in fed.parties}

    def start(self) -> None:
        self.progress.start()

    def update(self) -> None:
        for name, task in self.tasks.items():
            st = party_dir(self.run_dir, name) / "status.json"
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
