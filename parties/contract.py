"""The algorithm contract: what an algorithm hands the runtime, and nothing more.

The runtime (processes, the in-memory transport, the audit) knows no
algorithm by name: it is given an :class:`Algorithm` — by the CLI, which is
the one place that wires the algorithms' registry to ``parties/`` —
and uses only what the contract names:

- ``roles``: role name -> role function ``fn(party, settings, data) -> result``
  (:class:`RoleFunction`); plain code written against the party API, :class:`PartyLike`;
- ``settings``: the settings dataclass, parsed from the ``[algorithm]``
  table by :func:`fedhet.parties.settings.parse_settings` (unknown keys,
  types and ranges checked before any party starts);
- ``load_data(settings, ctx)``: a party's own data, from built-in sets or the
  user's file named in the party's section (``ctx.data``);
- ``declarations(settings)``: the message kinds with their payload schemas;
  the party checks every receipt against them and the audit every record;
- ``sizes(settings)``: the symbolic sizes the schemas use (``n_common``...);
- ``headline``: the result keys that are the run's outcome (final accuracy...): the end-of-run
  table shows them first and in full for every party whose result has them;
- ``predict`` (optional): the algorithm's prediction job (``fedhet predict``), itself an
  :class:`Algorithm` named ``<name>.predict`` (roles, settings, declarations of its own), which
  :func:`installed_algorithm` finds by that name, so the runners and the audit run it like any other.

An algorithm is a package exposing one ``ALGORITHM = Algorithm(...)``, registered by one
entry point in the ``fedhet_algorithms`` group (fedhet's own are listed by ``pyproject.toml``;
a user's package adds its own the same way), with a ``smoke.toml`` federation beside its
``__init__.py``: its smallest run, which the generic test runs.  :func:`installed_algorithm`
finds an algorithm by that entry point, so ``parties/`` never imports one by name; both
runners run a party's role through :func:`fedhet.parties.role.run_role`.
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from importlib.metadata import EntryPoint, distributions
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from . import declare as decl
from .settings import SettingsError, describe_settings, parse_settings


@runtime_checkable
class PartyLike(Protocol):
    """What a role or protocol function may use of a party: both transports' parties
    (:class:`fedhet.parties.api.Party`, in memory and over ZeroMQ) implement it.

    Read-only: who the party is and who its peers are, its device, seed, run id, default
    receive timeout, log, and the bytes it sent and received per peer.  ``round`` is the one
    attribute a role writes (the round its messages and metrics are recorded under).
    """

    round: int

    @property
    def name(self) -> str: ...
    @property
    def role(self) -> str: ...
    @property
    def roles(self) -> dict[str, str]: ...          # every party's name -> role (itself included)
    @property
    def peers(self) -> list[str]: ...               # every other party, sorted
    @property
    def run_id(self) -> str: ...
    @property
    def seed(self) -> int: ...                      # the federation's seed
    @property
    def device(self) -> str: ...                    # resolved ("cpu", "cuda:0"...)
    @property
    def timeout(self) -> float: ...                 # the default receive timeout, seconds
    @property
    def log(self) -> logging.Logger: ...
    @property
    def bytes_sent(self) -> dict[str, int]: ...     # peer -> bytes sent to it so far
    @property
    def bytes_received(self) -> dict[str, int]: ... # peer -> bytes received from it so far

    def send(self, to: str, kind: str, payload: Any) -> None: ...
    def recv(self, frm: str, kind: str, timeout: float | None = None) -> Any: ...
    def recv_any(self, frm: str, kinds: Iterable[str],
                 timeout: float | None = None) -> tuple[str, Any]: ...   # (kind, payload) of the first
    def broadcast(self, kind: str, payload: Any, to: Iterable[str] | None = None) -> None: ...
    def gather(self, kind: str, frm: Iterable[str] | None = None,
               timeout: float | None = None) -> dict[str, Any]: ...
    def peers_with_role(self, role: str) -> list[str]: ...
    def peer_with_role(self, role: str) -> str: ...     # the one peer of a role, or PartyError
    def progress(self, done: int, total: int, **metrics: Any) -> None: ...
    def save_model(self, tensors: Mapping[str, Any], meta: Mapping[str, Any]) -> None: ...
    def metric(self, **values: Any) -> None: ...
    def note_round(self, step: str, round: int, contributors: Iterable[str],
                   excluded: Mapping[str, str]) -> None: ...   # who was left out of a round, and why
    def checkpoint(self, step: int, state: Mapping[str, Any]) -> None: ...  # end of step (round/epoch)
    def restore(self) -> tuple[int, dict]: ...      # (step, state) to go on from; (0, {}) fresh
    def agree_resume(self, offered: Mapping[int, str]) -> int: ...  # the runner's, not a role's
    def begin_restart(self, cause: Any) -> dict[int, str]: ...  # the runner's: a peer restarted alone
    def sign(self, label: str, message: bytes) -> bytes: ...  # signed with the party's pinned federation key
    def verify(self, signer: str, label: str, message: bytes, signature: bytes) -> bool: ...  # by signer's pinned key
    def now(self) -> float: ...                     # the clock receive timeouts run on (virtual in tests)
    def sleep(self, seconds: float) -> None: ...    # on now()'s clock


class RoleFunction(Protocol):
    """A role: ``fn(party, settings, data) -> result``, where ``settings`` is the algorithm's parsed
    settings object, ``data`` what its ``load_data`` returned for this party, and the result the
    party's JSON-able outcome (a dict of named results; secagg_bench's server returns a list)."""

    def __call__(self, party: PartyLike, settings: Any, data: Any, /) -> Any: ...


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
    roles: Mapping[str, RoleFunction]
    load_data: Callable[[Any, PartyContext], Any]
    declarations: Callable[[Any], list] | None = None  # None only for ad-hoc test algorithms
    settings: type | None = None
    sizes: Callable[[Any], dict] = field(default=lambda s: {})
    headline: tuple[str, ...] = ()  # result keys shown in full at the end of a run (final accuracy...)
    # A saved trained part (its meta, its tensors: fedhet.parties.model_store) rebuilt as the object that
    # scores new rows (a torch module whose forward takes the meta's "inputs"); None: trains no model.
    load_model: Callable[[Mapping[str, Any], Mapping[str, Any]], Any] | None = None
    # The prediction job (fedhet predict): an Algorithm named ``name + PREDICT_SUFFIX``; None: none.
    predict: "Algorithm | None" = None

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
                raise ValueError(f"role {role!r} of party {name!r} is not a role of {self.name} "
                                 f"({sorted(self.roles)})")


def from_module(mod: Any) -> Algorithm:
    """The :class:`Algorithm` of ``mod``: an Algorithm itself, or a module exposing ``ALGORITHM``.

    Ad-hoc algorithms of tests may instead be any object with ``NAME``, ``ROLES``, ``load_data``
    (called as ``load_data(settings, ctx)``) and optionally ``DECLARATIONS`` (a list, or a function
    of the settings); their settings stay a raw dict."""
    if isinstance(mod, Algorithm):
        return mod
    algo = getattr(mod, "ALGORITHM", None)
    if isinstance(algo, Algorithm):
        return algo
    for attr in ("NAME", "ROLES", "load_data"):
        if not hasattr(mod, attr):
            raise TypeError(f"{getattr(mod, '__name__', mod)!r} is not an algorithm: it has no ALGORITHM "
                            f"(nor the {attr} of an ad-hoc test algorithm)")

    def declarations(cfg):
        d = mod.DECLARATIONS
        return list(d(cfg) if callable(d) else d)

    return Algorithm(name=mod.NAME, summary=mod.NAME, roles=dict(mod.ROLES),
                     load_data=lambda settings, ctx: mod.load_data(settings, ctx),
                     declarations=declarations if hasattr(mod, "DECLARATIONS") else None)


ENTRY_POINT_GROUP = "fedhet_algorithms"
PREDICT_SUFFIX = ".predict"   # "stfl.predict": the prediction job of the installed algorithm "stfl"


def installed_entry_points() -> dict[str, EntryPoint]:
    """name -> entry point of every algorithm in the ``fedhet_algorithms`` group of the installed
    distributions (fedhet's own, listed by its ``pyproject.toml``, and any package's that adds one)."""
    # Every distribution's metadata, not only the first of each name: a stale fedhet.egg-info
    # in a source tree on sys.path would otherwise hide the installed entry points.
    eps: dict[str, EntryPoint] = {}
    for dist in distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP:
                eps.setdefault(ep.name, ep)
    return eps


def installed_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name`` in the ``fedhet_algorithms`` entry-point group, or, for
    ``<name>.predict``, that algorithm's prediction job (its ``predict``)."""
    eps = installed_entry_points()
    if name not in eps and name.endswith(PREDICT_SUFFIX) and name[:-len(PREDICT_SUFFIX)] in eps:
        base = from_module(eps[name[:-len(PREDICT_SUFFIX)]].load())
        if base.predict is None:
            raise ValueError(f"algorithm {base.name!r} has no prediction job (fedhet predict)")
        return base.predict
    if name not in eps:
        raise ValueError(f"unknown algorithm {name!r}; installed: {', '.join(sorted(eps)) or 'none'} "
                         f"(entry-point group {ENTRY_POINT_GROUP!r}; reinstall fedhet if this list is stale)")
    return from_module(eps[name].load())


def role_index(parties: Sequence[tuple[str, str]]) -> dict[str, tuple[int, int]]:
    """name -> (position among parties of its role, number of parties of that role), for the
    ``(name, role)`` pairs in federation order."""
    counts: dict[str, int] = {}
    pos: dict[str, int] = {}
    for name, role in parties:
        pos[name] = counts.get(role, 0)
        counts[role] = pos[name] + 1
    return {name: (pos[name], counts[role]) for name, role in parties}


def prepare(algorithm: Algorithm, table: Any) -> tuple[Any, dict | None, dict]:
    """Parse the settings, build the declarations and sizes; errors name the key.

    ``table``: the ``[algorithm]`` table (a dict, or None), or settings already parsed (any other
    object), which are used as they are."""
    s = algorithm.parse(table) if table is None or isinstance(table, dict) else table
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
