"""The algorithm contract: what an algorithm hands the runtime, and nothing more.

The runtime (processes, the in-memory transport, the audit) knows no
algorithm by name: it is given an :class:`Algorithm` — by the CLI, which is
the one place that wires the algorithms' registry to ``parties/`` —
and uses only what the contract names:

- ``roles``: role name -> role function ``fn(party, settings, data) -> dict``
  (:class:`RoleFunction`); plain code written against the party API;
- ``settings``: the settings dataclass, parsed from the ``[algorithm]``
  table by :func:`fedhet.parties.settings.parse_settings` (unknown keys,
  types and ranges checked before any party starts);
- ``load_data(settings, ctx)``: a party's own data, from built-in sets or the
  user's file named in the party's section (``ctx.data``);
- ``declarations(settings)``: the message kinds with their payload schemas;
  the party checks every receipt against them and the audit every record;
- ``sizes(settings)``: the symbolic sizes the schemas use (``n_common``...);
- ``headline``: the result keys that are the run's outcome (final accuracy...): the end-of-run
  table shows them first and in full for every party whose result has them.

An algorithm module exposes one ``ALGORITHM = Algorithm(...)``.

Where no registry is handed in (a test calling ``run_inmemory("chfl", ...)`` or
``audit(run_dir)``), :func:`installed_algorithm` finds the algorithm through the
``fedhet_algorithms`` entry-point group of the installed distributions — fedhet's own
algorithms are listed there by ``pyproject.toml``, and a user's package can add its own
the same way — so ``parties/`` still never imports an algorithm by name.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

from . import declare as decl
from .settings import SettingsError, describe_settings, parse_settings


class PartyLike(Protocol):
    """What a role function may use of a party (both transports implement it)."""

    name: str
    role: str
    peers: list[str]
    device: str
    round: int

    def send(self, to: str, kind: str, payload: Any) -> None: ...
    def recv(self, frm: str, kind: str, timeout: float | None = None) -> Any: ...
    def broadcast(self, kind: str, payload: Any, to: Any = None) -> None: ...
    def gather(self, kind: str, frm: Any = None, timeout: float | None = None) -> dict: ...
    def peers_with_role(self, role: str) -> list[str]: ...
    def progress(self, done: int, total: int, **metrics: Any) -> None: ...
    def metric(self, **values: Any) -> None: ...


class RoleFunction(Protocol):
    def __call__(self, party: Any, settings: Any, data: Any) -> dict: ...


@dataclass(frozen=True)
class PartyContext:
    """What ``load_data`` learns about the party it loads for."""

    name: str
    role: str
    index: int                   # position among the parties of its role (federation order)
    n_of_role: int               # how many parties have this role
    data_dir: str | None = None  # folder of the built-in data sets (--data-dir / [federation] data_dir)
    data: Mapping[str, Any] | None = None  # the party's own data file spec ([[party]] data = {...})
    base_dir: str | None = None  # folder of the federation file (relative data paths)
    device: str = "cpu"


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    roles: Mapping[str, Callable[..., dict]]
    load_data: Callable[[Any, PartyContext], Any]
    declarations: Callable[[Any], list] | None = None  # None only for ad-hoc test algorithms
    settings: type | None = None
    sizes: Callable[[Any], dict] = field(default=lambda s: {})
    headline: tuple[str, ...] = ()  # result keys shown in full at the end of a run (final accuracy...)

    def parse(self, table: Mapping[str, Any] | None) -> Any:
        """The settings object for an ``[algorithm]`` table (a dict where ``settings`` is None)."""
        if self.settings is None:
            return dict(table or {})
        return parse_settings(self.settings, dict(table or {}), self.name)

    def declared(self, settings: Any) -> dict[str, decl.MessageDecl] | None:
        """Every declared kind (builtins included); None for an algorithm that declares none,
        whose parties then accept any kind (ad-hoc test algorithms only: the audit fails them)."""
        return None if self.declarations is None else decl.index(self.declarations(settings))

    def describe_settings(self) -> list[dict]:
        return [] if self.settings is None else describe_settings(self.settings)

    def check_roles(self, roles: Mapping[str, str]) -> None:
        for name, role in roles.items():
            if role not in self.roles:
                raise ValueError(f"party {name!r} has role {role!r}, which {self.name} does not have "
                                 f"(roles: {sorted(self.roles)})")


def from_module(mod: Any) -> Algorithm:
    """The :class:`Algorithm` of a module: its ``ALGORITHM``, or one built from the older
    ``NAME/ROLES/load_data/DECLARATIONS`` attributes (raw dict settings)."""
    if isinstance(mod, Algorithm):
        return mod
    algo = getattr(mod, "ALGORITHM", None)
    if isinstance(algo, Algorithm):
        return algo
    for attr in ("NAME", "ROLES", "load_data"):
        if not hasattr(mod, attr):
            raise TypeError(f"{getattr(mod, '__name__', mod)!r} is not an algorithm: it lacks {attr}")

    def load(cfg, ctx: PartyContext):
        return mod.load_data(cfg, ctx.name, ctx.role, ctx.index, ctx.n_of_role, ctx.data_dir)

    def declarations(cfg):
        d = mod.DECLARATIONS
        return list(d(cfg) if callable(d) else d)

    doc = (getattr(mod, "__doc__", "") or "").strip().splitlines()
    return Algorithm(name=mod.NAME, summary=doc[0] if doc else mod.NAME, roles=dict(mod.ROLES),
                     load_data=load, declarations=declarations if hasattr(mod, "DECLARATIONS") else None,
                     headline=tuple(getattr(mod, "HEADLINE", ())))


ENTRY_POINT_GROUP = "fedhet_algorithms"


def installed_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name`` in the ``fedhet_algorithms`` entry-point group."""
    from importlib.metadata import distributions

    # Every distribution's metadata, not only the first of each name: a stale fedhet.egg-info
    # in a source tree on sys.path would otherwise hide the installed entry points.
    eps: dict = {}
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                eps.setdefault(ep.name, ep)
    if name not in eps:
        raise ValueError(f"unknown algorithm {name!r}; installed: {', '.join(sorted(eps)) or 'none'} "
                         f"(entry-point group {ENTRY_POINT_GROUP!r}; reinstall fedhet if this list is stale)")
    return from_module(eps[name].load())


def role_index(parties: list[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """name -> (position among parties of its role, number of parties of that role)."""
    counts: dict[str, int] = {}
    pos: dict[str, int] = {}
    for name, role in parties:
        pos[name] = counts.get(role, 0)
        counts[role] = pos[name] + 1
    return {name: (pos[name], counts[role]) for name, role in parties}


def prepare(algorithm: Algorithm, table: Mapping[str, Any] | None) -> tuple[Any, dict | None, dict]:
    """Parse the settings, build the declarations and sizes; errors name the key."""
    s = algorithm.parse(table)
    try:
        declared = algorithm.declared(s)
        sizes = dict(algorithm.sizes(s) or {})
    except SettingsError:
        raise
    except ValueError as e:
        raise SettingsError(f"{algorithm.name}: {e}") from None
    return s, declared, sizes


def settings_table(settings: Any) -> dict:
    """A JSON-able view of a settings object (for result files)."""
    if dataclasses.is_dataclass(settings):
        from .settings import settings_dict
        return settings_dict(settings)
    return dict(settings or {})


def resolve_data_path(ctx: PartyContext, path: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_absolute() and ctx.base_dir:
        p = Path(ctx.base_dir) / p
    return p
