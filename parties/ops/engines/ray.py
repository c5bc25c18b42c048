"""The Ray engine: ``fedhet run --engine ray`` places the federation's hosts on a Ray cluster.

Beyond one machine, :func:`fedhet.parties.ops.launcher.launch` runs on this engine instead of
:class:`~fedhet.parties.ops.engines.local.LocalProcesses`.  The unit of placement is the same as in a local
run: a host (``host`` / ``hosts`` in the federation file: many parties, one process), or a party
that runs alone.  Each unit becomes one Ray actor (:class:`HostWorker`), which runs the unit's
``fedhet host`` or ``fedhet party`` process on its node, exactly as the local launcher would.
What Ray does: placement, resources and telling us when a node is gone.  What it does not do:
carry party traffic.  Every party keeps its own keys and CURVE sockets, and talks to its peers
directly, never through Ray's object store.

1. **Plan** (:func:`plan`): each unit asks for ``host_threads`` CPUs (a host; 1 when unset, and a
   party alone asks for 1) and for the GPUs its parties' devices name (``cuda`` or ``cuda:N``:
   N + 1 GPUs; under Ray, ``cuda:N`` counts among the GPUs Ray gave the unit).  A unit whose parties
   name a ``node_label`` (``KEY=VALUE``) is pinned to nodes with that label (all its parties must
   agree); the others go into one placement group, ``placement = "spread"`` (over the nodes) or
   ``"pack"`` (onto few).  A plan the cluster cannot meet is refused, saying what is missing,
   before anything is placed.
2. **Keys and endpoints** (:meth:`HostWorker.prepare`): each actor makes its parties' key pairs on
   its own node, in a private temporary folder whose secrets live in the actor's memory
   (:class:`~fedhet.parties.keys.TemporaryKeys`), and picks a free port per party on its node's
   address (in ``party_ports = "LO-HI"`` when given, the range a firewall between nodes opens).  Only the public halves and the endpoints come back to the driver, which writes the
   resolved federation file (``RUN/federation.toml``) and gives it to every actor before any party
   starts.  A secret key never leaves its node.
3. **Run**: each actor starts its unit's process in a session of its own on its node, in a run
   folder of its own, with the driver's ``FEDHET_*`` settings in its environment.  The process
   watches the actor as it would the launcher: it stops when the actor dies.  The driver polls the
   actors about three times a second; each poll brings back the unit's exit code and every
   ``status.json``, ``error.json`` and ``result.json`` that changed, written into the driver's run
   folder, so progress bars, failure detection and the verdict read the same files as in a local
   run.
4. **End**: every unit is stopped (SIGTERM to its process group, then SIGKILL), its run folder comes
   back to the driver (a tar archive through Ray): each party's transcript, log, results, metrics and
   trained part, but never its ``private/`` folder (checkpoints: keys, shares, unaggregated models),
   which is removed on its node with the actor and the keys.  ``fedhet audit RUN`` then works
   unchanged.  Nothing is left running on the cluster.

**Failures.**  A unit whose actor dies, or whose node disappears, ends as a lost unit: the run
fails within seconds, and the verdict (:func:`fedhet.parties.failure.verdict`, the same rules as a
local run) names the unit's first unfinished party, with the node's id and address and the
parties the unit held in the evidence.  The lost unit's files stay on its node (what its parties
had reported is in the driver's run folder).  Resume (``--resume``) and ``restart_grace_s`` are for
local runs only: the Ray engine refuses them.

Ray is optional (``pip install 'fedhet[ray]'``); without it the engine fails with that advice.
"""
from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedhet.parties import runfolder as rf
from fedhet.parties import failure as failure_records
from fedhet.parties.atomic import write_atomic
from fedhet.parties.federation import Federation, FederationError, absolute_data
from fedhet.parties.host import THREAD_ENV
from fedhet.parties.runtime import LAUNCHER_PID_ENV, group_alive
from fedhet.parties.runfolder import PRIVATE, host_dir, party_dir

RAY_MISSING = ("engine = \"ray\" needs Ray, which is not installed here: pip install 'fedhet[ray]' "
               "(or pip install 'ray[default]'), then start a cluster (docs/ray.md)")
SYNCED = (rf.STATUS, rf.ERROR, rf.RESULT)  # what each poll brings back while the run goes on
POLL_S = 0.3             # the driver asks every actor how its unit stands this often
CALL_TIMEOUT_S = 30.0    # a poll that takes longer counts as a strike against the unit
STRIKES = 3              # an unreachable actor on a live node is lost after this many strikes
PLACE_TIMEOUT_S = 120.0  # placing the actors (and their first answer) may take this long
ENV_PREFIXES = ("FEDHET_",)


class EngineError(ValueError):
    """The Ray engine cannot run this federation here; the message says why and what to do."""


def require_ray():
    """The ``ray`` module, or :class:`EngineError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise EngineError(RAY_MISSING) from None
    return ray


# ------------------------------------------------------------------ plan
@dataclass(frozen=True)
class Unit:
    """What one actor runs: a host of several parties, or one party alone."""

    name: str                   # the host's name, or the party's when it runs alone
    parties: tuple[str, ...]
    kind: str                   # "host" or "party"
    cpus: float
    gpus: float
    label: dict[str, str] = field(default_factory=dict)   # node label the unit is pinned to ({}: none)


def gpus_of(device: str) -> int:
    """GPUs a party's device asks Ray for: ``cuda`` 1, ``cuda:N`` N + 1, ``cpu`` / ``auto`` 0."""
    if device == "cuda":
        return 1
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1]) + 1
    return 0


def plan(fed: Federation) -> list[Unit]:
    """The units of ``fed`` in file order of their first party, with their resources and pins;
    FederationError when the parties of one host name different node labels."""
    groups = fed.host_groups()
    host_of = {n: h for h, ns in groups.items() for n in ns}
    units: list[Unit] = []
    seen: set[str] = set()
    for p in fed.parties:
        name = host_of.get(p.name, p.name)
        if name in seen:
            continue
        seen.add(name)
        members = [fed.party(n) for n in groups.get(name, [p.name])]
        labels = {m.node_label for m in members if m.node_label}
        if len(labels) > 1:
            raise FederationError(f"{fed.source}: the parties of host {name!r} name different node labels "
                                  f"({', '.join(sorted(labels))}): a host runs on one node")
        label = dict([labels.pop().split("=", 1)]) if labels else {}
        host = name in groups
        cpus = float(fed.host_threads or 1) if host else 1.0
        units.append(Unit(name, tuple(m.name for m in members), "host" if host else "party", cpus,
                          float(max(gpus_of(m.device) for m in members)), label))
    return units


def check_cluster(units: list[Unit], nodes: list[dict]) -> None:
    """EngineError unless every unit fits on some live node of ``nodes`` (``ray.nodes()``): its
    label, CPUs and GPUs; the message names the unit, what it needs and what the nodes have."""
    alive = [n for n in nodes if n.get("Alive")]
    if not alive:
        raise EngineError("the Ray cluster has no live node")
    for u in units:
        fits = [n for n in alive
                if all(n.get("Labels", {}).get(k) == v for k, v in u.label.items())
                and n.get("Resources", {}).get("CPU", 0) >= u.cpus
                and n.get("Resources", {}).get("GPU", 0) >= u.gpus]
        if not fits:
            have = "; ".join(f"{n.get('NodeManagerAddress')} {_labels(n)} CPU={n.get('Resources', {}).get('CPU', 0):g} "
                             f"GPU={n.get('Resources', {}).get('GPU', 0):g}" for n in alive)
            pin = f" on a node labelled {_pairs(u.label)}" if u.label else ""
            raise EngineError(f"{u.kind} {u.name!r} (parties {', '.join(u.parties[:5])}"
                              f"{', ...' if len(u.parties) > 5 else ''}) needs {u.cpus:g} CPU and {u.gpus:g} GPU"
                              f"{pin}; no live node of the cluster has that (nodes: {have})")


def _labels(node: dict) -> str:
    own = {k: v for k, v in node.get("Labels", {}).items() if not k.startswith("ray.io/")}
    return "{" + _pairs(own) + "}"


def _pairs(d: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(d.items()))


# ------------------------------------------------------------ the actor
class HostWorker:
    """One unit on its node (a Ray actor: :meth:`RayEngine.prepare` wraps this class with ``ray.remote``).

    Holds the unit's secret keys, its run folder on the node and its process; never sees another
    unit's secrets."""

    def __init__(self, unit: Unit):
        from fedhet.parties.keys import TemporaryKeys

        self.unit = unit
        self.work = Path(tempfile.mkdtemp(prefix=f"fedhet-ray-{unit.name}-"))
        self.run_dir = self.work / "run"
        self.keys = TemporaryKeys(unit.name)
        self.proc: subprocess.Popen | None = None
        self.held: list[socket.socket] = []
        self.seen: dict[str, tuple[int, int]] = {}

    def prepare(self, ports: tuple[int, int] | None = None) -> dict[str, Any]:
        """Fresh key pairs and a free port on this node for each party (in ``ports``, LO-HI, when given):
        the public halves, the endpoints, and where the unit runs."""
        import ray

        ip = ray.util.get_node_ip_address()
        keys, endpoints = {}, {}
        for name in self.unit.parties:
            pub = self.keys.generate(name)
            keys[name] = (pub.curve, pub.sign)
            # held until the unit starts: another unit on this node, picking its ports meanwhile,
            # cannot get one of these
            self.held.append(bind_free(ip, ports))
            endpoints[name] = f"tcp://{ip}:{self.held[-1].getsockname()[1]}"
        return {"keys": keys, "endpoints": endpoints, "node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ip, "pid": os.getpid(), "work": str(self.work)}

    def start(self, fed: Federation, insecure: bool, log_level: str) -> int:
        """Write the federation file (this node's key folder) and start the unit's process; its pid."""
        fed_file = self.work / rf.FEDERATION
        mine = replace(fed, key_dir=self.keys.path, source=str(fed_file))
        write_atomic(fed_file, mine.to_toml())
        for n in self.unit.parties:
            party_dir(self.run_dir, n).mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env[LAUNCHER_PID_ENV] = str(os.getpid())   # the process stops when this actor dies
        if self.unit.kind == "host":
            if fed.host_threads > 0:
                env.update({k: str(fed.host_threads) for k in THREAD_ENV})
            host_dir(self.run_dir).mkdir(parents=True, exist_ok=True)
            which, log = ["host", str(fed_file), "--host", self.unit.name], host_dir(self.run_dir) / f"{self.unit.name}.log"
        else:
            which, log = ["party", str(fed_file), "--name", self.unit.name], party_dir(self.run_dir, self.unit.name) / rf.STDOUT
        cmd = [sys.executable, "-m", "fedhet.parties.ops.cli", *which, "--out", str(self.run_dir),
               "--run-id", fed.run_id, "--quiet", "--log-level", log_level] + ["--insecure"] * insecure
        for s in self.held:   # the parties bind these ports now
            s.close()
        self.held = []
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        return self.proc.pid

    def poll(self) -> dict[str, Any]:
        """The unit's exit code (None: running) and the synced files that changed since the last poll
        (read after the code: a unit that has ended has written all of them)."""
        code = self.proc.poll() if self.proc is not None else None
        files: dict[str, bytes] = {}
        paths = [self.run_dir / rf.CONFIG] + [party_dir(self.run_dir, n) / f for n in self.unit.parties
                                                    for f in SYNCED]
        for path in paths:
            try:
                st = path.stat()
                if self.seen.get(str(path)) == (st.st_mtime_ns, st.st_size):
                    continue
                files[str(path.relative_to(self.run_dir))] = path.read_bytes()
                self.seen[str(path)] = (st.st_mtime_ns, st.st_size)
            except OSError:
                continue
        return {"code": code, "files": files}

    def stop(self, grace: float = 3.0) -> int | None:
        """SIGTERM the unit's process group, SIGKILL what is left after ``grace`` seconds; its exit code."""
        if self.proc is None:
            return None
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            if sig == signal.SIGTERM:
                deadline = time.monotonic() + grace
                while time.monotonic() < deadline and group_alive(self.proc.pid):
                    time.sleep(0.05)
        return self.proc.wait()

    def collect(self) -> bytes:
        """The unit's run folder (its parties' folders, its host's report and log) as a tar archive."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
            if (self.run_dir / rf.CONFIG).is_file():   # the run's public record: the same from every party
                tar.add(self.run_dir / rf.CONFIG, arcname=rf.CONFIG)
            for n in self.unit.parties:
                if party_dir(self.run_dir, n).is_dir():
                    tar.add(party_dir(self.run_dir, n), arcname=str(party_dir(Path("."), n)), filter=public)
            if self.unit.kind == "host":
                for f in (f"{self.unit.name}.json", f"{self.unit.name}.log"):
                    if (host_dir(self.run_dir) / f).is_file():
                        tar.add(host_dir(self.run_dir) / f, arcname=str(host_dir(Path(".")) / f))
        return buf.getvalue()

    def close(self) -> None:
        """Free the unit's secret keys and remove its folder on the node."""
        import shutil

        self.stop(0.5)
        self.keys.close()
        shutil.rmtree(self.work, ignore_errors=True)


def bind_free(ip: str, ports: tuple[int, int] | None) -> socket.socket:
    """A socket bound to a free port of ``ip``: any (the OS picks), or the first free one of LO-HI from a
    random start (EngineError when every port of the range is taken)."""
    import random

    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if ports is None:
        s.bind((ip, 0))
        return s
    lo, hi = ports
    start = random.randint(lo, hi)
    for port in list(range(start, hi + 1)) + list(range(lo, start)):
        try:
            s.bind((ip, port))
            return s
        except OSError:
            continue
    s.close()
    raise EngineError(f"no free port in party_ports {lo}-{hi} on {ip}: widen the range")


def public(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """A party's folder without ``private/`` (its checkpoints: keys, shares, unaggregated models),
    which never leaves the party's node."""
    return None if PRIVATE in Path(member.name).parts else member


def extract(archive: bytes, run_dir: Path) -> None:
    """Unpack a unit's archive into ``run_dir``: plain files and folders under it only."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                continue
            members.append(m)
        tar.extractall(run_dir, members=members)


# ------------------------------------------------------------ the driver
@dataclass
class Placed:
    """A unit's actor, where it runs and how it stands, as the driver sees it."""

    unit: Unit
    actor: Any
    node_id: str = ""
    node_ip: str = ""
    node_labels: dict[str, str] = field(default_factory=dict)
    code: int | None = None
    lost: str = ""        # why the unit is lost ("": it is not)
    node_alive: bool = True
    strikes: int = 0
    collected: bool = False


class RayEngine:
    """The Ray engine for :func:`fedhet.parties.ops.launcher.launch` (an
    :class:`~fedhet.parties.ops.engines.Engine`; see the module's text)."""

    name = "ray"
    supports_resume = False    # the launcher refuses --resume and restart_grace_s for this engine
    supports_restart = False

    def __init__(self, address: str = "", placement: str = "spread", env: dict[str, str] | None = None,
                 insecure: bool = False, log_level: str = "info"):
        self.address, self.placement = address or None, placement
        self.env = dict(os.environ if env is None else env)
        self.insecure, self.log_level = insecure, log_level
        self.placed: dict[str, Placed] = {}
        self.group: Any = None
        self.fed: Federation | None = None
        self.run_dir: Path | None = None
        self.started_ray = False
        self.last_poll = 0.0
        self.timings: dict[str, float] = {}
        self.closed = False

    def check(self, fed: Federation, resume: bool) -> None:
        require_ray()
        plan(fed)

    # ------------------------------------------------------------------ prepare
    def prepare(self, fed: Federation, run_dir: Path, overrides: dict[str, Any] | None,
                run_id: str | None) -> Federation:
        import uuid

        ray = require_ray()
        t0 = time.perf_counter()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, logging_level="ERROR", log_to_driver=False)
            except Exception as e:   # Ray raises several kinds (ConnectionError, RuntimeError, its own)
                where = self.address or "(Ray's look-up: RAY_ADDRESS, or a cluster started on this machine)"
                raise EngineError(f"cannot reach the Ray cluster at {where}: {e}") from None
            self.started_ray = True
        self.timings["connect_s"] = time.perf_counter() - t0
        units = plan(fed)
        check_cluster(units, ray.nodes())
        run_dir.mkdir(parents=True, exist_ok=True)
        self.fed, self.run_dir = fed, run_dir
        self.make_actors(ray, units)
        t1 = time.perf_counter()
        refs = {u.name: self.placed[u.name].actor.prepare.remote(fed.party_ports) for u in units}
        try:
            ready = {n: ray.get(r, timeout=PLACE_TIMEOUT_S) for n, r in refs.items()}
        except ray.exceptions.GetTimeoutError:
            raise EngineError(f"the cluster placed not every unit within {PLACE_TIMEOUT_S:g}s (units: "
                              f"{', '.join(refs)}); `ray status` shows what it lacks") from None
        self.timings["place_s"] = time.perf_counter() - t1
        keys, endpoints = {}, {}
        nodes = {node["NodeID"]: node for node in ray.nodes()}
        for n, r in ready.items():
            pl = self.placed[n]
            pl.node_id, pl.node_ip = r["node_id"], r["node_ip"]
            pl.node_labels = {k: v for k, v in nodes.get(pl.node_id, {}).get("Labels", {}).items()
                              if not k.startswith("ray.io/")}
            keys.update(r["keys"])
            endpoints.update(r["endpoints"])
        parties = [replace(p, endpoint=endpoints[p.name], public_key=keys[p.name][0], sign_key=keys[p.name][1],
                           data=absolute_data(p.data, fed.base_dir)) for p in fed.parties]
        algorithm = dict(fed.algorithm)
        algorithm.update(overrides or {})
        resolved = replace(fed, parties=parties, key_dir=None, algorithm=algorithm,
                           source=str(run_dir / rf.FEDERATION), run_id=run_id or uuid.uuid4().hex)
        write_atomic(run_dir / rf.FEDERATION, resolved.to_toml())
        self.fed = resolved
        return resolved

    def make_actors(self, ray, units: list[Unit]) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        worker = ray.remote(HostWorker)
        env = {k: v for k, v in self.env.items() if k.startswith(ENV_PREFIXES)}
        free = [u for u in units if not u.label]
        if free:
            bundles = [{"CPU": u.cpus, **({"GPU": u.gpus} if u.gpus else {})} for u in free]
            self.group = placement_group(bundles, strategy=self.placement.upper())
            try:
                ray.get(self.group.ready(), timeout=PLACE_TIMEOUT_S)
            except ray.exceptions.GetTimeoutError:
                raise EngineError(f"the cluster cannot reserve {len(bundles)} bundles ({bundles[0]} each, "
                                  f"placement {self.placement}) within {PLACE_TIMEOUT_S:g}s; `ray status` shows "
                                  f"what it has") from None
        index = {u.name: i for i, u in enumerate(free)}
        for u in units:
            opts: dict[str, Any] = {"num_cpus": u.cpus, "num_gpus": u.gpus, "max_restarts": 0,
                                    "runtime_env": {"env_vars": env}}
            if u.label:
                opts["label_selector"] = dict(u.label)
            else:
                opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=index[u.name])
            self.placed[u.name] = Placed(u, worker.options(**opts).remote(u))

    # ------------------------------------------------------------------ run
    def start(self, run_dir: Path, resume: bool) -> None:
        ray = require_ray()
        assert self.fed is not None
        refs = [pl.actor.start.remote(self.fed, self.insecure, self.log_level) for pl in self.placed.values()]
        ray.get(refs, timeout=PLACE_TIMEOUT_S)

    def poll(self) -> dict[str, int | None]:
        ray = require_ray()
        if time.monotonic() - self.last_poll >= POLL_S:
            self.last_poll = time.monotonic()
            live = {n: pl for n, pl in self.placed.items() if pl.code is None and not pl.lost}
            refs = {n: pl.actor.poll.remote() for n, pl in live.items()}
            for n, ref in refs.items():
                pl = live[n]
                try:
                    out = ray.get(ref, timeout=CALL_TIMEOUT_S)
                except ray.exceptions.ActorDiedError as e:
                    self.lose(pl, f"its Ray actor died ({_first_line(e)})")
                    continue
                except (ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError,
                        ray.exceptions.RayActorError) as e:
                    pl.strikes += 1
                    if not self.node_alive(pl.node_id) or pl.strikes >= STRIKES:
                        self.lose(pl, f"its Ray actor is unreachable ({type(e).__name__})")
                    continue
                pl.strikes = 0
                self.write(out["files"])
                pl.code = out["code"]
        return self.codes()

    def write(self, files: dict[str, bytes]) -> None:
        assert self.run_dir is not None
        for rel, data in files.items():
            path = self.run_dir / rel
            if ".." in Path(rel).parts or Path(rel).is_absolute():
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)

    def node_alive(self, node_id: str) -> bool:
        ray = require_ray()
        try:
            return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())
        except Exception:
            return False

    def lose(self, pl: Placed, why: str) -> None:
        pl.lost = why
        pl.node_alive = self.node_alive(pl.node_id)

    def where(self, pl: Placed) -> str:
        """The node a unit ran on, as a person finds it: id, address, labels, and whether Ray
        still lists it as alive (asked now)."""
        if pl.lost:
            pl.node_alive = pl.node_alive and self.node_alive(pl.node_id)
        labels = f", {_pairs(pl.node_labels)}" if pl.node_labels else ""
        state = "" if not pl.lost else ("; Ray still lists the node as alive" if pl.node_alive
                                        else "; Ray reports the node dead")
        return f"node {pl.node_id[:12]} ({pl.node_ip}{labels}){state}"

    def codes(self) -> dict[str, int | None]:
        return {n: (-1 if pl.lost else pl.code) for n, pl in self.placed.items()}

    def exit_record(self, run_dir: Path, unit: str, party: str, role: str, code: int) -> dict:
        pl = self.placed[unit]
        held = ", ".join(pl.unit.parties)
        what = f"{pl.unit.kind} {unit!r}"
        evidence = {"engine": "ray", "unit": unit, "node_id": pl.node_id, "node_ip": pl.node_ip,
                    "node_labels": pl.node_labels, "parties": list(pl.unit.parties)}
        if pl.lost:
            how = f"{what} lost: {pl.lost} on {self.where(pl)}"
            return failure_records.exit_record(party, role, code, f"it held {held}", how=how,
                                               evidence=dict(evidence, node_alive=pl.node_alive, exit_code=None,
                                                             seen_by="ray engine"))
        detail = f"{what} ended on {self.where(pl)}"
        if pl.unit.kind == "party":
            tail = failure_records.output_tail(party_dir(run_dir, party) / rf.STDOUT)
            detail += f": {tail}" if tail else ""
        return failure_records.exit_record(party, role, code, detail, evidence=evidence)

    # ------------------------------------------------------------------ end
    def stop(self) -> None:
        """Stop every unit still running and bring every reachable unit's folder into the run folder."""
        if not self.placed or self.run_dir is None or self.closed:
            return
        ray = require_ray()
        todo = {n: pl for n, pl in self.placed.items() if not pl.lost and not pl.collected}
        stops = {n: pl.actor.stop.remote() for n, pl in todo.items()}
        for n, ref in stops.items():
            try:
                code = ray.get(ref, timeout=CALL_TIMEOUT_S)
                if todo[n].code is None:
                    todo[n].code = code
            except Exception as e:   # lost meanwhile: its files stay on its node
                self.lose(todo[n], f"its Ray actor did not answer at the end ({type(e).__name__})")
        archives = {n: pl.actor.collect.remote() for n, pl in todo.items() if not pl.lost}
        for n, ref in archives.items():
            try:
                extract(ray.get(ref, timeout=PLACE_TIMEOUT_S), self.run_dir)
                self.placed[n].collected = True
            except Exception as e:
                self.lose(self.placed[n], f"its run folder could not be brought back ({type(e).__name__}: "
                                          f"{_first_line(e)})")

    def describe(self) -> dict[str, Any]:
        units = {}
        for n, pl in self.placed.items():
            units[n] = {"kind": pl.unit.kind, "parties": list(pl.unit.parties), "node_id": pl.node_id,
                        "node_ip": pl.node_ip, "node_labels": pl.node_labels, "cpus": pl.unit.cpus,
                        "gpus": pl.unit.gpus,
                        **({"node_label": _pairs(pl.unit.label)} if pl.unit.label else {}),
                        "exit_code": pl.code,
                        **({"lost": pl.lost, "node_alive": pl.node_alive} if pl.lost else {}),
                        "files": "collected" if pl.collected else "left on its node"}
        return {"name": "ray", "address": self.address or "", "placement": self.placement,
                "nodes": len({pl.node_id for pl in self.placed.values() if pl.node_id}),
                **{k: round(v, 3) for k, v in self.timings.items()}, "units": units}

    def close(self) -> None:
        """Remove every actor (and with it its keys and node folder) and the placement group."""
        if self.closed:
            return
        self.closed = True
        if not self.placed and self.group is None:
            return
        ray = require_ray()
        closes = [pl.actor.close.remote() for pl in self.placed.values() if not pl.lost]
        try:
            ray.get(closes, timeout=CALL_TIMEOUT_S)
        except Exception:
            pass
        for pl in self.placed.values():
            try:
                ray.kill(pl.actor, no_restart=True)
            except Exception:
                pass
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.group)
            except Exception:
                pass
        self.group = None
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
