"""Kills on cue, for testing resume: a crash made an event of the protocol, not a race.

``FEDHET_KILL_AT="NAME:STEP[:WHO]"`` in a party process's environment: once party NAME has
written its checkpoint of step STEP, it sends SIGKILL to WHO:

- ``self`` (the default): the party itself, as a crash or ``kill -9`` would;
- ``launcher``: the ``fedhet run`` that started it (its parties then stop: the launcher is gone);
- ``all``: every party of the run folder (each holds its pid in ``parties/N/.lock``), itself last.

Nothing is written first: the point is a process that ends between two instructions.

``FEDHET_PAUSE_AT="NAME:STEP:FILE"``: once party NAME has reported progress step STEP (its
``status.json`` says so), it waits until FILE exists, then goes on; for tests of what watches a
run in progress (``fedhet board``), which then see the run mid-way for as long as they need.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Callable, Mapping

from . import runfolder as rf

KILL_ENV = "FEDHET_KILL_AT"
PAUSE_ENV = "FEDHET_PAUSE_AT"
WHO = ("self", "launcher", "all")


class Killed(BaseException):
    """The in-memory runner's stand-in for SIGKILL: the party's thread ends where it is."""


def parse(spec: str) -> tuple[str, int, str]:
    """(party, step, who) of a ``FEDHET_KILL_AT`` value; ValueError naming what is wrong."""
    parts = spec.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1].isdigit():
        raise ValueError(f"{KILL_ENV}={spec!r}: expected NAME:STEP or NAME:STEP:WHO (WHO one of {', '.join(WHO)})")
    who = parts[2] if len(parts) == 3 else "self"
    if who not in WHO:
        raise ValueError(f"{KILL_ENV}={spec!r}: WHO is {who!r}, expected one of {', '.join(WHO)}")
    return parts[0], int(parts[1]), who


def _pids(run_dir: Path) -> list[int]:
    out = []
    for lock in sorted((run_dir / rf.PARTIES).glob(f"*/{rf.LOCK}")):
        try:
            out.append(int(lock.read_text().strip()))
        except (OSError, ValueError):
            continue
    return out


def kill_hook(name: str, run_dir: str | os.PathLike, env: Mapping[str, str] | None = None,
              launcher_env: str = "FEDHET_LAUNCHER_PID") -> Callable[[int], None] | None:
    """The ``after_checkpoint`` hook for party ``name`` that ``env`` asks for (None: no fault)."""
    env = os.environ if env is None else env
    spec = env.get(KILL_ENV)
    if not spec:
        return None
    target, at, who = parse(spec)
    if target != name:
        return None

    def hook(step: int) -> None:
        if step != at:
            return
        me = os.getpid()
        if who == "launcher" and env.get(launcher_env, "").isdigit():
            os.kill(int(env[launcher_env]), signal.SIGKILL)
            return
        if who == "all":
            for pid in _pids(Path(run_dir)):
                if pid != me:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
        os.kill(me, signal.SIGKILL)

    return hook


def raise_at(step_of: Mapping[str, int], name: str) -> Callable[[int], None] | None:
    """In memory: the hook that ends party ``name``'s thread (:class:`Killed`) after its checkpoint
    of step ``step_of[name]``."""
    if name not in step_of:
        return None
    at = step_of[name]

    def hook(step: int) -> None:
        if step == at:
            raise Killed(f"party {name!r} killed after its checkpoint of step {at}")

    return hook


def pause_hook(name: str, env: Mapping[str, str] | None = None,
               poll_s: float = 0.05) -> Callable[[dict], None] | None:
    """The status hook for party ``name`` that ``FEDHET_PAUSE_AT`` asks for (None: no pause): after
    the status of step STEP is written, it waits (once) until FILE exists."""
    env = os.environ if env is None else env
    spec = env.get(PAUSE_ENV)
    if not spec:
        return None
    parts = spec.split(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit() or not parts[2]:
        raise ValueError(f"{PAUSE_ENV}={spec!r}: expected NAME:STEP:FILE")
    if parts[0] != name:
        return None
    at, release = int(parts[1]), Path(parts[2])
    paused = [False]

    def hook(status: dict) -> None:
        done = status.get("done")
        if paused[0] or status.get("state", "running") != "running" or not isinstance(done, int) or done < at:
            return
        paused[0] = True
        while not release.exists():
            time.sleep(poll_s)

    return hook
