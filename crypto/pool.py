"""Process pools whose workers end when the process that made them ends.

A ``ProcessPoolExecutor`` worker waits on a queue that its sibling workers
hold open too, so when the party that owns the pool is killed (``kill -9``,
out of memory) its workers never see the end of the queue and live on for
good.  Every worker made by :func:`process_pool` watches its parent instead:
through a pidfd where the kernel has them (Linux >= 5.3; the worker exits the
moment the parent is gone), else by polling its parent pid twice a second.
"""
from __future__ import annotations

import os
import select
import threading
import time
from typing import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

POLL_S = 0.5


def process_pool(workers: int, mp_context: str = "spawn") -> ProcessPoolExecutor:
    """A ``ProcessPoolExecutor`` of ``workers`` processes that exit when this process does."""
    return ProcessPoolExecutor(max_workers=workers, mp_context=get_context(mp_context),
                               initializer=exit_with_parent, initargs=(os.getpid(),))


def exit_with_parent(parent_pid: int) -> None:
    """Worker initializer: end this process as soon as ``parent_pid`` (its parent) is gone."""
    on_parent_exit(parent_pid, lambda: None, code=1)


def on_parent_exit(parent_pid: int, action: Callable[[], None], code: int) -> None:
    """Once ``parent_pid`` (this process's parent) is gone, run ``action`` and end the process with
    ``code`` at once, from a watcher thread: whatever the main thread is doing (a long C call
    included), so nothing outlives its parent by more than the action takes."""
    def leave() -> None:
        try:
            action()
        finally:
            os._exit(code)

    if os.getppid() != parent_pid:  # already orphaned while starting
        leave()
    fd = None
    try:
        fd = os.pidfd_open(parent_pid)
    except (AttributeError, OSError):
        pass
    if fd is not None and os.getppid() != parent_pid:  # the pid was reused before we opened it
        leave()

    def watch() -> None:
        if fd is not None:
            select.select([fd], [], [])  # readable once the process has exited
        else:
            while os.getppid() == parent_pid:
                time.sleep(POLL_S)
        leave()

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
