"""The run folder, defined once: every file and folder of a run, who writes it and who reads it.

::

    RUN/                          one run (``fedhet run --out RUN``, or the ``--out`` of hand-started parties)
      federation.toml  FEDERATION the resolved federation file: launcher, Ray engine -> parties, --resume
      config.json      CONFIG     the run's public record (parties, roles, keys' public halves, settings):
                                  each party (runtime) -> audit, report, board, run view
      result.json      RESULT     the launcher's summary (every party's state, the verdict) -> report, board
      metrics.jsonl    METRICS    every party's metrics merged: launcher -> report, board
      report.html      REPORT     ``fedhet report``
      hosts/           HOSTS      host processes: H.json (host) and H.log (launcher)
      parties/NAME/    PARTIES    one folder per party (:func:`party_dir`), locked by its process (LOCK):
        status.json    STATUS     :class:`~fedhet.parties.status.StatusFile` (the party; the launcher
                                  marks "stopped") -> launcher, board, run view
        error.json     ERROR      the party's failure record (:mod:`fedhet.parties.failure`) -> launcher's verdict
        result.json    RESULT     the party's result, traffic, exclusions -> launcher, report
        log.txt        LOG        the party's log
        stdout.log     STDOUT     the process's output: launcher, Ray engine
        metrics.jsonl  METRICS    the transport's metric lines -> launcher (merged), report
        transcript.jsonl TRANSCRIPT  signed record of every message (transcript.N.jsonl: earlier
                                  incarnations, kept) -> audit
        model/         MODEL      the party's trained part (:mod:`fedhet.parties.model_store`) -> export, predict
        private/       PRIVATE    secret: checkpoints (keys, shares, unaggregated models) -> --resume;
                                  never handed to an auditor

Every writer writes atomically (:mod:`fedhet.parties.atomic`).  Runtime, audit and the operations
layer name these files only through this module.
"""
from __future__ import annotations

import os
from pathlib import Path

FEDERATION = "federation.toml"
CONFIG = "config.json"
RESULT = "result.json"
METRICS = "metrics.jsonl"
REPORT = "report.html"
HOSTS = "hosts"
PARTIES = "parties"
STATUS = "status.json"
ERROR = "error.json"
LOG = "log.txt"
STDOUT = "stdout.log"
TRANSCRIPT = "transcript.jsonl"
MODEL = "model"
PRIVATE = "private"
LOCK = ".lock"


def party_dir(run_dir: str | os.PathLike, name: str) -> Path:
    """``RUN/parties/NAME``: everything of party ``name``."""
    return Path(run_dir) / PARTIES / name


def host_dir(run_dir: str | os.PathLike) -> Path:
    """``RUN/hosts``: the host processes' records and output."""
    return Path(run_dir) / HOSTS


def error_file(run_dir: str | os.PathLike, name: str) -> Path:
    return party_dir(run_dir, name) / ERROR


def is_run_folder(path: str | os.PathLike) -> bool:
    """A run folder holds its public record (``config.json``) once its first party started."""
    return (Path(path) / CONFIG).is_file()
