"""The federation file: every party, its role, endpoint, device and public keys.

A TOML file (example: ``fedhet presets``)::

    [federation]
    name = "demo"            # free text
    key_dir = "keys"         # relative to this file; secret keys of the parties run here
    timeout = 120            # seconds a party waits for any one message
    # peer_lost_s = 10       # a peer whose connection broke and stays down is gone: we exit within this
    # checkpoint_every = 1   # each party checkpoints every 1st round/epoch (0: never); see --resume
    # restart_grace_s = 0    # > 0: a party that dies may restart alone (--resume); the others wait this long
    seed = 0
    max_message_mb = 1024    # ZMQ_MAXMSGSIZE and the decoder's limit
    # run_id = "..."         # all parties of one run must agree; `fedhet run` makes a fresh one
    # hosts = 4              # `fedhet run` only: run the parties in 4 host processes (see below)
    # host_threads = 1       # in a host process: torch / BLAS / OpenMP threads (0 = library default)
    # engine = "ray"         # `fedhet run` only: place the hosts on a Ray cluster (docs/ray.md)
    # ray_address = "10.0.0.1:6379"   # the cluster (default: Ray's own look-up, RAY_ADDRESS)
    # placement = "spread"   # Ray: spread the hosts over the nodes, or "pack" them onto few
    # party_ports = "20000-20999"   # Ray: the ports parties listen on, to open between nodes

    [algorithm]
    name = "fedavg_logreg"   # see `fedhet presets` / the registry
    rounds = 20              # any further keys are the algorithm's parameters

    [[party]]
    name = "server"
    role = "server"
    endpoint = "tcp://10.0.0.1:5555"   # where this party listens; port 0 = any free port (local runs)
    device = "cpu"                     # cpu | cuda | cuda:N | auto
    public_key = "Z85 CURVE key"       # from `fedhet keys`
    sign_key = "hex Ed25519 key"       # from `fedhet keys`
    # host = "owners1"                 # `fedhet run` only: the host process this party runs in
    # node_label = "zone=b"            # engine = "ray" only: run on a node with this label

Host processes (local runs with many parties).  By default ``fedhet run``
starts one OS process per party.  Parties with the same ``host`` run in one
host process instead, each on its own thread with its own keys, sockets,
transcript and result/error files, exactly as when alone, so ``fedhet audit``
sees the same run.  ``[federation] hosts = N`` puts every party that names no
``host`` into N hosts ``host1`` .. ``hostN``, round-robin in file order (so
parties of one role spread over the hosts).  A party alone in its host, and
every party when neither is given, runs as its own ``fedhet party`` process.
``fedhet party`` (one party on its own machine) ignores both.

Validation errors name the file, the party and the field.
"""
from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from .netlink import parse_network
from .settings import SettingsError, describe_settings, known_keys, parse_settings, setting, settings_dict

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_./-]{0,62}=[A-Za-z0-9_.-]{0,63}$")
_ENDPOINT = re.compile(r"^(tcp://[^:/\s]+:\d{1,5}|ipc://\S+)$")


class FederationError(ValueError):
    """The federation file is wrong; the message says where and how."""


@dataclass(frozen=True)
class SharedSettings:
    """``[federation]`` keys every party must hold the same: the fingerprint each party sends on its
    first message covers exactly these fields (:meth:`Federation.fingerprint`)."""

    name: str = setting("", "free text naming the federation (default: the file's name)")
    timeout: float = setting(120.0, "seconds a party waits for any one message", lo=0, lo_open=True)
    seed: int = setting(0, "seed of the run (the [algorithm] seed defaults to it)")
    max_message_mb: int = setting(1024, "largest message a party accepts, in MiB", lo=1)
    peer_lost_s: float = setting(10.0, "seconds after a peer's connection breaks and stays down by which this "
                                 "party has given up on it and exited", lo=0, lo_open=True)
    restart_grace_s: float = setting(0.0, "seconds the others wait for a dead party to restart alone with "
                                     "--resume (0 = off)", lo=0)
    network: str = setting("loopback", "the simulated link between every pair of parties: loopback (none), lan "
                           "(0.5 ms round trip, 1 Gbit/s), wan (50 ms, 100 Mbit/s) or \"RTT_MS,MBIT\" "
                           "(fedhet.parties.netlink)")

    def validate(self) -> None:
        parse_network(self.network)   # its ValueError names the key, the value and what is accepted
        if self.restart_grace_s > self.timeout:
            raise ValueError(f"restart_grace_s = {self.restart_grace_s:g} must be between 0 (off) and the timeout "
                             f"({self.timeout:g}s): a party waits for any one message at most the timeout")


@dataclass(frozen=True)
class LocalSettings:
    """``[federation]`` keys of one machine or one start, never compared between parties."""

    key_dir: str = setting("", "folder of this machine's secret keys, relative to the file")
    data_dir: str = setting("", "folder of the built-in data sets")
    run_id: str = setting("", "the id every party of one run uses")
    checkpoint_every: int = setting(1, "each party checkpoints its state every N-th round or epoch, 0 = never", lo=0)


@dataclass(frozen=True)
class LaunchSettings:
    """``[federation]`` keys that only ``fedhet run`` (the launcher and its engines) and host processes
    read; a party never does, and none of them is in the fingerprint."""

    hosts: int = setting(0, "`fedhet run` only: host processes for the parties that name no host", lo=0)
    host_threads: int = setting(0, "`fedhet run` only: torch / BLAS threads per host process", lo=0)
    engine: Literal["local", "ray"] = setting("local", "`fedhet run` only: local (processes on this machine) "
                                             "or ray (hosts on a Ray cluster)")
    ray_address: str = setting("", "`fedhet run` with engine = \"ray\": the cluster's address (default: Ray's "
                               "own look-up)")
    placement: Literal["spread", "pack"] = setting("spread", "engine = \"ray\": spread (hosts over many nodes) "
                                                   "or pack (onto few)")
    party_ports: str = setting("", "engine = \"ray\": LO-HI, the ports parties listen on (default: any free port)")

    def validate(self) -> None:
        if self.party_ports:
            m = re.match(r"^(\d{1,5})-(\d{1,5})$", self.party_ports)
            if m is None or not 1024 <= int(m[1]) <= int(m[2]) <= 65535:
                raise ValueError(f"party_ports must be \"LO-HI\" with 1024 <= LO <= HI <= 65535, "
                                 f"got {self.party_ports!r}")

    def port_range(self) -> tuple[int, int] | None:
        if not self.party_ports:
            return None
        lo, hi = self.party_ports.split("-")
        return int(lo), int(hi)


@dataclass(frozen=True)
class PartySettings:
    """One ``[[party]]`` entry."""

    name: str = setting(doc="the party's name")
    role: str = setting(doc="its role in the algorithm")
    endpoint: str = setting(doc="where it listens: tcp://HOST:PORT or ipc://PATH")
    device: str = setting("cpu", "cpu | cuda | cuda:N | auto")
    public_key: str = setting("", "its Z85 CURVE public key (from `fedhet keys`)")
    sign_key: str = setting("", "its hex Ed25519 public key (from `fedhet keys`)")
    data: dict[str, Any] = setting({}, "its own data file: a table of the keys in DATA_KEYS")
    host: str = setting("", "`fedhet run` only: the host process it runs in")
    node_label: str = setting("", "engine = \"ray\" only: KEY=VALUE, a label of the Ray node it must run on")

    def validate(self) -> None:
        for f in ("name", "role", "endpoint"):
            if not getattr(self, f):
                raise ValueError(f"missing or empty field {f!r}")
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must start with a letter and use letters, digits, _ . -")
        if not _ENDPOINT.match(self.endpoint):
            raise ValueError(f"endpoint {self.endpoint!r} is not tcp://HOST:PORT or ipc://PATH")
        if not re.match(r"^(cpu|auto|cuda(:\d+)?)$", self.device):
            raise ValueError(f"device {self.device!r} must be cpu, auto, cuda or cuda:N")
        if self.host and not _NAME.match(self.host):
            raise ValueError(f"host {self.host!r} must be a name (letters, digits, _ . -, starting with a letter)")
        if self.node_label and not _LABEL.match(self.node_label):
            raise ValueError(f"node_label {self.node_label!r} must be KEY=VALUE (a label its Ray node was started with)")


FEDERATION_SECTIONS = (SharedSettings, LocalSettings, LaunchSettings)

#: Every key of ``[federation]``, with a one-line description (error hints and docs).
FEDERATION_KEYS: dict[str, str] = {row["key"]: row["doc"] for cls in FEDERATION_SECTIONS
                                   for row in describe_settings(cls)}

#: Every key of a ``[[party]]`` entry.
PARTY_KEYS: dict[str, str] = {row["key"]: row["doc"] for row in describe_settings(PartySettings)}

@dataclass(frozen=True)
class DataSettings:
    """A party's ``data = {...}`` table: its own data file and which columns play which part
    (``docs/user_data.md``; ``algorithms/party_table.TableSpec`` checks what only the values can say)."""

    path: str = setting(doc="the party's data file; relative paths start at the federation file's folder")
    format: str = setting("", "csv | parquet | npz; default from the file name (.csv, .csv.gz, .tsv, .parquet, "
                          ".pq, .npz)")
    id: str | None = setting(None, "name of the ID column (needed by algorithms that align rows across parties)")
    id_type: str = setting("str", "str (default) or int: how IDs are compared across parties")
    label: str | None = setting(None, "name of the label column (for roles that hold labels)")
    classes: list[Any] | None = setting(None, "all label values (integers or strings), in the order that defines "
                                        "codes 0..C-1")
    features: list[str] | str | None = setting(None, "list of feature column names, or \"rest\" (default): every "
                                               "column but id, label and ignore")
    ignore: list[str] = setting([], "columns that features = \"rest\" leaves out")
    n_features: int | None = setting(None, "number of feature columns this party must have (agreed in the "
                                     "federation file)", lo=1)
    delimiter: str = setting("", "CSV field separator, one character (default \",\"; tab for .tsv)")


#: Every key of a party's ``data`` table (the algorithms' party_table module reads them).
DATA_KEYS: dict[str, str] = {row["key"]: row["doc"] for row in describe_settings(DataSettings)}


def unknown_keys(given: Any, known: dict[str, str] | list[str], where: str) -> str | None:
    """None when every key of ``given`` is known, else a message naming ``where``, each unknown
    key with the closest known one (difflib), and the known keys."""
    known = list(known)
    bad = [str(k) for k in given if k not in known]
    if not bad:
        return None
    shown = []
    for k in bad:
        near = difflib.get_close_matches(k, known, n=1, cutoff=0.6)
        shown.append(f"{k!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return (f"{where}: unknown key{'s' if len(bad) > 1 else ''} {', '.join(shown)}; "
            f"known keys: {', '.join(known)}")


@dataclass
class PartySpec:
    name: str
    role: str
    endpoint: str
    device: str = "cpu"
    public_key: str = ""
    sign_key: str = ""
    # The party's own data file (path, id/label/feature columns): read only on its own
    # machine, never part of the public record or the run id (paths differ per machine).
    data: dict[str, Any] = field(default_factory=dict)
    host: str = ""  # the host process it runs in under `fedhet run` ("": see Federation.hosts)
    node_label: str = ""  # engine = "ray": "KEY=VALUE", a label of the node it must run on


@dataclass
class Federation:
    name: str
    parties: list[PartySpec]
    algorithm: dict[str, Any]
    key_dir: Path | None = None
    timeout: float = 120.0
    seed: int = 0
    max_message_mb: int = 1024
    run_id: str = ""
    data_dir: str = ""
    source: str = "<memory>"
    base_dir: str = ""  # the federation file's folder: relative data paths start there
    hosts: int = 0  # host processes for the parties that name no host (0: one process per party)
    host_threads: int = 0  # torch / BLAS threads per host process (0: the libraries' defaults)
    peer_lost_s: float = 10.0  # a peer whose up connection broke and stays down is gone; exited by then
    checkpoint_every: int = 1  # each party checkpoints every N-th step (round or epoch); 0: never
    restart_grace_s: float = 0.0  # > 0: a dead party may restart alone; its peers wait this long for it
    network: str = "loopback"  # the simulated link between every pair of parties (fedhet.parties.netlink)
    engine: str = "local"  # `fedhet run`: local processes, or "ray" (parties/ops/engines/ray.py)
    ray_address: str = ""  # engine = "ray": the cluster ("": Ray's own look-up)
    placement: str = "spread"  # engine = "ray": spread or pack the hosts over the nodes
    party_ports: tuple[int, int] | None = None  # engine = "ray": the ports parties listen on (None: any)
    unparsed_launch: dict[str, Any] = field(default_factory=dict)  # a party's: the launch keys as written

    # ------------------------------------------------------------- queries
    @property
    def roles(self) -> dict[str, str]:
        return {p.name: p.role for p in self.parties}

    def party(self, name: str) -> PartySpec:
        for p in self.parties:
            if p.name == name:
                return p
        raise FederationError(f"{self.source}: no party named {name!r} (parties: {[p.name for p in self.parties]})")

    def host_groups(self) -> dict[str, list[str]]:
        """Host name -> its parties (file order), for every host that runs two or more parties.

        Parties not listed run as processes of their own.  Explicit ``host`` fields first;
        ``hosts = N`` spreads the rest round-robin over ``host1`` .. ``hostN``.
        """
        groups: dict[str, list[str]] = {}
        free = [p for p in self.parties if not p.host]
        for p in self.parties:
            if p.host:
                groups.setdefault(p.host, []).append(p.name)
        if self.hosts > 0:
            for i, p in enumerate(free):
                groups.setdefault(f"host{i % self.hosts + 1}", []).append(p.name)
        order = {p.name: i for i, p in enumerate(self.parties)}
        return {h: sorted(ns, key=order.__getitem__) for h, ns in groups.items() if len(ns) > 1}

    @property
    def algorithm_name(self) -> str:
        return str(self.algorithm["name"])

    def algorithm_cfg(self) -> dict[str, Any]:
        cfg = {k: v for k, v in self.algorithm.items() if k != "name"}
        cfg.setdefault("seed", self.seed)
        return cfg

    def fingerprint(self) -> dict[str, Any]:
        """Digests of the canonical federation, by section, that every party sends on each link's
        first message: parties and roles, endpoints, public keys, the [federation] settings all
        parties share, and each [algorithm] key on its own (so a mismatch names the key).  What is
        local to one machine (key_dir, data_dir, a party's data files, device, hosts) is left out."""
        def h(x: Any) -> str:
            return hashlib.sha256(json.dumps(x, sort_keys=True, default=str).encode()).hexdigest()[:16]

        ps = sorted(self.parties, key=lambda p: p.name)
        return {
            "parties": h([(p.name, p.role) for p in ps]),
            "endpoints": h([(p.name, p.endpoint) for p in ps]),
            "keys": h([(p.name, p.public_key, p.sign_key) for p in ps]),
            "federation": h({k: getattr(self, k) for k in known_keys(SharedSettings)}),   # every shared key
            "algorithm": {str(k): h(v) for k, v in sorted({"name": self.algorithm_name,
                                                           **self.algorithm_cfg()}.items())},
        }

    def launch_items(self) -> dict[str, Any]:
        """The launch keys that differ from their defaults, in :class:`LaunchSettings` order, as the file
        writes them: parsed, or as written where a party did not parse them (``unparsed_launch``)."""
        ports = "" if self.party_ports is None else f"{self.party_ports[0]}-{self.party_ports[1]}"
        have = {"hosts": self.hosts, "host_threads": self.host_threads, "engine": self.engine,
                "ray_address": self.ray_address, "placement": self.placement, "party_ports": ports,
                **self.unparsed_launch}
        default = settings_dict(LaunchSettings())
        return {k: have[k] for k in default if have[k] != default[k]}

    def derived_run_id(self) -> str:
        """Run id all parties agree on without talking: the file's own hash."""
        if self.run_id:
            return self.run_id
        return hashlib.sha256(repr(self.to_dict(public_only=True)).encode()).hexdigest()[:16]

    # ---------------------------------------------------------- conversion
    def to_dict(self, public_only: bool = True) -> dict[str, Any]:
        fed = {"name": self.name, "timeout": self.timeout, "seed": self.seed,
               "max_message_mb": self.max_message_mb}
        if self.run_id:
            fed["run_id"] = self.run_id
        if self.data_dir:
            fed["data_dir"] = self.data_dir
        if self.peer_lost_s != 10.0:
            fed["peer_lost_s"] = self.peer_lost_s
        if self.checkpoint_every != 1:
            fed["checkpoint_every"] = self.checkpoint_every
        if self.restart_grace_s:
            fed["restart_grace_s"] = self.restart_grace_s
        if self.network != "loopback":
            fed["network"] = self.network
        fed.update(self.launch_items())
        if self.key_dir is not None and not public_only:
            fed["key_dir"] = str(self.key_dir)
        return {
            "federation": fed,
            "algorithm": copy.deepcopy(self.algorithm),
            "party": [
                {k: v for k, v in vars(p).items()
                 if (v != "" or k in ("name", "role", "endpoint")) and not (k == "data" and (public_only or not v))}
                for p in self.parties
            ],
        }

    def to_toml(self) -> str:
        d = self.to_dict(public_only=False)
        if self.key_dir is not None and self.source not in ("<memory>", ""):
            try:
                d["federation"]["key_dir"] = os.path.relpath(self.key_dir, Path(self.source).parent)
            except ValueError:
                pass
        out = ["[federation]"] + [f"{k} = {_toml_value(v)}" for k, v in d["federation"].items()]
        out += ["", "[algorithm]"] + [f"{k} = {_toml_value(v)}" for k, v in d["algorithm"].items()]
        for p in d["party"]:
            out += ["", "[[party]]"] + [f"{k} = {_toml_value(v)}" for k, v in p.items()]
        return "\n".join(out) + "\n"


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise FederationError(f"cannot write {type(v).__name__} value {v!r} to TOML")


def load(path: str | os.PathLike, launch: bool = True) -> Federation:
    """The federation file at ``path`` (``launch``: see :func:`from_dict`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise FederationError(f"cannot read federation file {path}: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise FederationError(f"{path}: not valid TOML: {e}") from None
    return from_dict(data, source=str(path), base_dir=path.parent, launch=launch)


def _parsed(cls, table: dict[str, Any], where: str, source: str):
    """``cls`` from ``table`` by the one settings parser; its errors as a FederationError naming the file."""
    try:
        return parse_settings(cls, table, where, ignore=())
    except SettingsError as e:
        raise FederationError(f"{source}: {e}") from None


def _section(cls, table: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in table.items() if k in known_keys(cls)}


def _parties(plist: Any, source: str) -> list[PartySpec]:
    """The ``[[party]]`` entries, each through the settings parser; names and endpoints unique."""
    if not isinstance(plist, list) or len(plist) < 2:
        raise FederationError(f"{source}: needs at least two [[party]] entries")
    parties: list[PartySpec] = []
    for i, p in enumerate(plist):
        where = f"[[party]] #{i + 1}" + (f" {p.get('name')!r}" if isinstance(p, dict) and "name" in p else "")
        if not isinstance(p, dict):
            raise FederationError(f"{source}: {where} is not a table")
        for known, label in ((PARTY_KEYS, where), (DATA_KEYS, f"{where} data")):
            table = p if known is PARTY_KEYS else p.get("data", {})
            bad = unknown_keys(table, known, label) if isinstance(table, dict) else (
                f"{where}: data must be a table, e.g. data = {{ path = \"mine.csv\", label = \"y\" }}")
            if bad:
                raise FederationError(f"{source}: {bad}")
        ps = _parsed(PartySettings, p, where, source)
        if ps.name in (q.name for q in parties):
            raise FederationError(f"{source}: {where}: duplicate party name {ps.name!r}")
        if not ps.endpoint.endswith(":0") and ps.endpoint in (q.endpoint for q in parties):
            raise FederationError(f"{source}: {where}: endpoint {ps.endpoint!r} is used by another party")
        parties.append(PartySpec(**settings_dict(ps)))
    return parties


def from_dict(data: dict[str, Any], source: str = "<memory>", base_dir: str | os.PathLike | None = None,
              launch: bool = True) -> Federation:
    """A federation from its tables: every one a user writes goes through the one settings parser
    (:mod:`fedhet.parties.settings`), each error naming the file, the table and the key.

    ``launch=False`` (a party process): the :class:`LaunchSettings` keys, which a party never reads,
    are only checked to be known keys, not parsed; the federation keeps them as written, for its
    public record."""
    unknown = set(data) - {"federation", "algorithm", "party"}
    if unknown:
        raise FederationError(f"{source}: unknown top-level tables {sorted(unknown)} (expected [federation], "
                              f"[algorithm], [[party]])")
    for table in ("federation", "algorithm"):
        if not isinstance(data.get(table, {}), dict):
            raise FederationError(f"{source}: [{table}] must be a table")
    fed = dict(data.get("federation", {}))
    bad = unknown_keys(fed, FEDERATION_KEYS, "[federation]")
    if bad:
        raise FederationError(f"{source}: {bad}")
    shared, local = (_parsed(cls, _section(cls, fed), "[federation]", source) for cls in (SharedSettings, LocalSettings))
    launch_table = _section(LaunchSettings, fed)
    settings = _parsed(LaunchSettings, launch_table, "[federation]", source) if launch else LaunchSettings()
    algo = dict(data.get("algorithm", {}))
    parties = _parties(data.get("party"), source)
    if "name" not in algo or not isinstance(algo["name"], str):
        raise FederationError(f"{source}: [algorithm] needs a name (e.g. name = \"fedavg_logreg\")")
    key_dir = None
    if local.key_dir:
        key_dir = Path(local.key_dir)
        if not key_dir.is_absolute() and base_dir is not None:
            key_dir = Path(base_dir) / key_dir
    return Federation(
        **{**settings_dict(shared), "name": shared.name or Path(source).stem},
        parties=parties, algorithm=algo, key_dir=key_dir, run_id=local.run_id, data_dir=local.data_dir,
        checkpoint_every=local.checkpoint_every, source=source,
        base_dir=str(base_dir) if base_dir is not None else "",
        hosts=settings.hosts, host_threads=settings.host_threads, engine=settings.engine,
        ray_address=settings.ray_address, placement=settings.placement, party_ports=settings.port_range(),
        unparsed_launch={} if launch else launch_table,
    )


def absolute_data(data: dict, base_dir: str) -> dict:
    """A party's data spec with its path made absolute: the resolved federation file lives in
    the run folder, but the user wrote paths relative to their own file."""
    out = dict(data or {})
    path = out.get("path")
    if isinstance(path, str) and base_dir and not Path(path).expanduser().is_absolute():
        out["path"] = str((Path(base_dir) / path).resolve())
    return out


def update_public_keys(path: str | os.PathLike, keys: dict[str, dict[str, str]]) -> None:
    """Set ``public_key`` / ``sign_key`` of the named parties in the federation file at ``path``.

    Only those values change: comments, layout, key order and keys left at their defaults stay
    as the user wrote them (tomlkit edits the parsed document in place); the file is replaced
    atomically.  ``keys``: party name -> ``{"public_key": ..., "sign_key": ...}``.
    """
    import tomlkit
    from tomlkit.exceptions import TOMLKitError

    from .atomic import write_atomic

    path = Path(path)
    try:
        doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise FederationError(f"cannot read federation file {path}: {e.strerror}") from None
    except (TOMLKitError, UnicodeDecodeError) as e:
        raise FederationError(f"{path}: not valid TOML: {e}") from None
    found: set[str] = set()
    for entry in doc.get("party", []):
        name = entry.get("name") if isinstance(entry, dict) else None
        if name in keys:
            for k, v in keys[name].items():
                if k not in ("public_key", "sign_key"):
                    raise ValueError(f"update_public_keys: {k!r} is not a public key field")
                entry[k] = v
            found.add(str(name))
    missing = sorted(set(keys) - found)
    if missing:
        raise FederationError(f"{path}: no [[party]] named {missing}")
    mode = path.stat().st_mode & 0o777
    write_atomic(path, tomlkit.dumps(doc), mode=mode)


def _key_hint(fed: Federation, name: str) -> str:
    src = fed.source
    return (f"run `fedhet keys {src} --update` (key pairs for every party on this machine, public keys "
            f"written into the file), or on the party's own machine `fedhet keys {src} --name {name} --update` "
            "and copy its public_key and sign_key into every machine's copy of the file")


def check_keys_present(fed: Federation) -> None:
    """Every party must carry valid public keys (for CURVE pinning and transcript checks)."""
    from .keys import curve_public_ok, verify_key

    for p in fed.parties:
        if not p.public_key or not curve_public_ok(p.public_key):
            raise FederationError(f"{fed.source}: party {p.name!r} has no valid public_key; {_key_hint(fed, p.name)}")
        if not p.sign_key:
            raise FederationError(f"{fed.source}: party {p.name!r} has no sign_key; {_key_hint(fed, p.name)}")
        try:
            verify_key(p.sign_key)
        except ValueError as e:
            raise FederationError(f"{fed.source}: party {p.name!r}: {e}") from None
