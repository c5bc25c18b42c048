"""Line progress: what a party (``fedhet party``) and a launcher whose output is not a terminal print
while a run goes on, one line per party at a time: role, round or epoch, the current metric, elapsed
time and ETA.  The same line goes to the party's ``log.txt``.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Protocol


class TextSink(Protocol):
    def write(self, text: str) -> int: ...

    def flush(self) -> None: ...

LOG_LEVELS = ("debug", "info", "warning", "error")   # --log-level of fedhet party / run / host
EVERY_S = 5.0  # at most one line per party this often, besides the first and the last


def clock(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    s = int(round(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def eta(done: Any, total: Any, elapsed: Any) -> float | None:
    """Seconds left at the rate so far (None until one step is done or without a total)."""
    try:
        done, total, elapsed = float(done), float(total), float(elapsed)
    except (TypeError, ValueError):
        return None
    if done <= 0 or total <= 0 or done > total:
        return None
    return elapsed * (total - done) / done


def line(st: dict) -> str:
    """One progress line from a party's status (``status.json``)."""
    who = f"{st.get('party', '?')} ({st.get('role', '?')})"
    state = st.get("state", "running")
    if state != "running":
        extra = f": {st['error']}" if st.get("error") else ""
        return f"{who} {state}{extra}"
    done, total = st.get("done", 0), st.get("total", 0)
    step = f"step {done}/{total}" if total else f"step {done}"
    metrics = " ".join(f"{k}={_short(v)}" for k, v in (st.get("metrics") or {}).items())
    el = st.get("elapsed_s")
    return " ".join(x for x in (who, step, metrics, f"elapsed {clock(el)}",
                                f"ETA {clock(eta(done, total, el))}") if x)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


class LinePrinter:
    """Prints a party's line when its state or step changes, at most every ``every_s`` seconds per
    party (a change of state is always printed)."""

    def __init__(self, stream: TextSink | None = None, every_s: float = EVERY_S) -> None:
        self.stream: TextSink = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self._last: dict[str, tuple[float, str, Any]] = {}

    def maybe(self, st: dict) -> str | None:
        key = str(st.get("party"))
        now = time.monotonic()
        state, done = st.get("state", "running"), st.get("done")
        last = self._last.get(key)
        if last is not None:
            t, last_state, last_done = last
            if state == last_state and (done == last_done or now - t < self.every_s):
                return None
        self._last[key] = (now, state, done)
        text = line(st)
        try:
            print(text, file=self.stream, flush=True)
        except (OSError, ValueError):   # a closed pipe must not fail the run
            pass
        return text
