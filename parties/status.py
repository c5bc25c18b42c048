"""A party's ``status.json``: one writer, and a state that only moves forward.

A party's state goes ``starting`` -> ``running`` -> one of ``done``, ``failed``, ``stopped``, and
never back.  Several threads report a party's progress (its role, its transport's link watch, a
signal handler or launcher watch that records a stop), so every write goes through
:class:`StatusFile`, which holds one lock across the check and the atomic rename: a progress write
that lost the race to a stop is refused, never written over it.  Another process (the launcher,
marking parties it stopped) goes through :func:`advance`, which checks the state on disk.

``fedhet board``, ``fedhet report`` and the launcher's summary read these files: a party that
stopped must never read "running".
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from .atomic import FD_RETRY_S, write_json_atomic

ORDER = {"starting": 0, "running": 1, "done": 2, "failed": 2, "stopped": 2}
FINAL = frozenset(s for s, k in ORDER.items() if k == 2)
# A writer holding the lock finishes one small atomic write; a stop waits at most this long for it
# (a stop recorded from a signal handler must not hang on a writer stuck in a full disk).
LOCK_WAIT_S = 5.0


def may_follow(old: str | None, new: str) -> bool:
    """Whether a party whose status reads ``old`` may next read ``new``: forward only, and a final
    state is final (it may be rewritten with more detail, never changed)."""
    if new not in ORDER:
        raise ValueError(f"unknown party state {new!r} (known: {', '.join(ORDER)})")
    if old is None or old not in ORDER:
        return True
    if old in FINAL:
        return new == old
    return ORDER[new] >= ORDER[old]


class StatusFile:
    """The one writer of one party's ``status.json`` in this process (thread-safe)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()   # re-entrant: a signal handler may interrupt a write on its thread
        self.state: str | None = None

    def write(self, st: dict[str, Any]) -> bool:
        """Write ``st`` (its ``"state"``, default ``running``) if the state may follow the last one
        written; returns whether it was written.  An ``OSError`` of the write itself propagates."""
        new = st.setdefault("state", "running")
        may_follow(None, new)   # an unknown state is a bug of the caller: raise before taking the lock
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise TimeoutError(f"{self.path}: another writer held the status lock for {LOCK_WAIT_S:g}s")
        try:
            if not may_follow(self.state, new):
                return False
            # progress is advisory: it never waits for descriptors; a final state does (atomic.py)
            write_json_atomic(self.path, st, fd_wait_s=FD_RETRY_S if new in FINAL else 0.0)
            self.state = new
            return True
        finally:
            self._lock.release()


def read(path: str | os.PathLike) -> dict[str, Any] | None:
    """A status file's content, or None when it is missing or unreadable."""
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def advance(path: str | os.PathLike, update: dict[str, Any]) -> bool:
    """From another process than the party's (whose writer has ended): merge ``update`` into the
    status on disk if its state may follow the one there; returns whether it was written."""
    old = read(path) or {}
    if not may_follow(old.get("state"), update.get("state", "running")):
        return False
    write_json_atomic(path, {**old, **update})
    return True
