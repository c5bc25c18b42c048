"""What :func:`fedhet.parties.ops.launcher.launch` runs a federation on: an :class:`Engine`.

Two engines: :class:`~fedhet.parties.ops.engines.local.LocalProcesses` (every party, or host, a
process of this machine; the default) and :class:`~fedhet.parties.ops.engines.ray.RayEngine` (the
same units as Ray actors on a cluster).  :func:`make_engine` picks the one ``[federation] engine``
names.  What an engine can do is said by its capability flags, which the launcher checks before the
run folder exists, never by an engine refusing inside :meth:`Engine.check`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fedhet.parties.federation import Federation


class EngineCannot(ValueError):
    """The engine lacks a capability the run asks for (``--resume``, ``restart_grace_s``)."""


@runtime_checkable
class Engine(Protocol):
    """The launcher's side of an engine.

    A run goes :meth:`check` (settings this engine cannot run, before the run folder exists),
    :meth:`prepare` (keys, endpoints, run id; the resolved federation), :meth:`start` (every unit: a
    party alone or a host of several), :meth:`poll` until done (name -> exit code, None while it
    runs; a unit the engine lost reads as an exit code too; every party's ``status.json``,
    ``error.json`` and ``result.json`` kept up to date in the run folder), then :meth:`stop` (every
    unit stopped and its files brought into the run folder) and :meth:`close` (keys freed)."""

    name: str
    supports_resume: bool     # `fedhet run --resume`: units started again from their checkpoints
    supports_restart: bool    # [federation] restart_grace_s: a killed unit restarted within the grace

    def check(self, fed: Federation, resume: bool) -> None: ...

    def prepare(self, fed: Federation, run_dir: Path, overrides: dict[str, Any] | None,
                run_id: str | None) -> Federation: ...

    def start(self, run_dir: Path, resume: bool) -> None: ...

    def poll(self) -> dict[str, int | None]: ...

    def exit_record(self, run_dir: Path, unit: str, party: str, role: str, code: int) -> dict: ...

    def stop(self) -> None: ...

    def codes(self) -> dict[str, int | None]: ...

    def describe(self) -> dict[str, Any] | None: ...

    def close(self) -> None: ...


def check_capabilities(engine: Engine, fed: Federation, resume: bool) -> None:
    """EngineCannot naming what the run asks for that ``engine`` cannot do."""
    if resume and not engine.supports_resume:
        raise EngineCannot(f"--resume: the {engine.name} engine cannot resume a run (run it again, or resume "
                           f"it with the local engine, every party on this machine)")
    if fed.restart_grace_s > 0 and not engine.supports_restart:
        raise EngineCannot(f"{fed.source}: restart_grace_s = {fed.restart_grace_s:g} restarts a killed party "
                           f"process; the {engine.name} engine does not (set it to 0 for this engine)")


def make_engine(fed: Federation, env: dict[str, str] | None = None, insecure: bool = False,
                log_level: str = "info") -> Engine:
    """The engine ``[federation] engine`` names: the local processes, or the Ray engine."""
    if fed.engine == "ray":
        from fedhet.parties.ops.engines.ray import RayEngine

        return RayEngine(fed.ray_address, fed.placement, env=env, insecure=insecure, log_level=log_level)
    from fedhet.parties.ops.engines.local import LocalProcesses

    return LocalProcesses(env, insecure, log_level)
