"""A real Ray cluster of several nodes on this machine, for the Ray engine's tests and benchmark.

Each node is its own ``ray start`` (a head, then nodes that join it with their own resources and
labels), so every node has its own raylet, object store and worker processes, as on separate
machines; only the network is this machine's.  :meth:`LocalCluster.kill_raylet` ends one node the
hard way (SIGKILL to its raylet), :meth:`LocalCluster.stop` ends every process of the cluster (found
by the cluster's GCS port in their command lines, so another Ray cluster of this user is left
alone), and :func:`processes_with` finds what is still running (orphans) by a string such as a run id.

Linux only (``/proc``).  ``ray`` must be installed: ``pip install 'fedhet[ray]'``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fedhet.parties.ops.engines.local import free_port


def ray_binary() -> str | None:
    """The ``ray`` command of this interpreter's environment (or the PATH's)."""
    here = Path(sys.executable).parent / "ray"
    return str(here) if here.is_file() else shutil.which("ray")


def processes_with(text: str) -> dict[int, str]:
    """pid -> command line of every process of this machine whose command line contains ``text``
    (this process excluded)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if text in cmd:
            out[int(d.name)] = cmd
    return out


def rss_mib(pids) -> float:
    """The summed resident memory of ``pids`` (MiB; processes gone meanwhile count 0)."""
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except (OSError, ValueError):
            continue
    return total / 1024


@dataclass
class Node:
    name: str
    labels: dict[str, str]
    node_manager_port: int
    resources: dict[str, float] = field(default_factory=dict)

    def raylet_pids(self) -> list[int]:
        return [pid for pid, cmd in processes_with(f"--node_manager_port={self.node_manager_port}").items()
                if "raylet" in cmd.split(" ", 1)[0]]


class LocalCluster:
    """``ray start --head`` plus nodes that join it, all on this machine (see the module's text)."""

    def __init__(self, cpus_per_node: int = 4, env: dict[str, str] | None = None):
        self.ray = ray_binary()
        if self.ray is None:
            raise RuntimeError("no `ray` command: pip install 'fedhet[ray]'")
        self.cpus = cpus_per_node
        self.port = free_port()
        self.ip = "127.0.0.1"
        self.env = dict(os.environ if env is None else env, RAY_USAGE_STATS_ENABLED="0")
        self.env.pop("RAY_ADDRESS", None)
        self.nodes: dict[str, Node] = {}

    @property
    def address(self) -> str:
        return f"{self.ip}:{self.port}"

    def _ray_start(self, args: list[str]) -> None:
        r = subprocess.run([self.ray, "start", "--disable-usage-stats", f"--num-cpus={self.cpus}", *args],
                           env=self.env, capture_output=True, text=True, timeout=180)
        if r.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n"
                               f"{r.stderr[-2000:]}")

    def start(self, labels: dict[str, str] | None = None) -> LocalCluster:
        """The head node (also a worker node: it runs actors), labelled ``labels``."""
        node = Node("head", dict(labels or {}), free_port())
        self._ray_start(["--head", f"--port={self.port}", f"--node-ip-address={self.ip}",
                         "--include-dashboard=false", f"--node-manager-port={node.node_manager_port}",
                         f"--ray-client-server-port={free_port()}",
                         *self._label_args(node.labels)])
        self.nodes["head"] = node
        return self

    def add_node(self, name: str, labels: dict[str, str] | None = None,
                 resources: dict[str, float] | None = None) -> Node:
        """A node joining the cluster with its own raylet, labels and custom resources."""
        node = Node(name, dict(labels or {}), free_port(), dict(resources or {}))
        args = [f"--address={self.address}", f"--node-ip-address={self.ip}",
                f"--node-manager-port={node.node_manager_port}", *self._label_args(node.labels)]
        if node.resources:
            args.append(f"--resources={json.dumps(node.resources)}")
        self._ray_start(args)
        self.nodes[name] = node
        return node

    @staticmethod
    def _label_args(labels: dict[str, str]) -> list[str]:
        return [f"--labels={','.join(f'{k}={v}' for k, v in labels.items())}"] if labels else []

    def kill_raylet(self, name: str) -> list[int]:
        """SIGKILL node ``name``'s raylet (the node disappears as a machine that lost power would,
        from the cluster's view); the pids killed."""
        pids = self.nodes[name].raylet_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def processes(self) -> dict[int, str]:
        """Every process of this cluster: its GCS, raylets, agents and workers (all of them name its
        GCS port), and the processes they started (their parent is one of them)."""
        mine = {pid: cmd for pid, cmd in processes_with(f":{self.port}").items()
                if "gcs" in cmd or "ray" in cmd}
        mine.update(processes_with(f"--gcs_server_port={self.port}"))
        return mine

    def stop(self, timeout: float = 10.0) -> None:
        """End every process of the cluster: SIGTERM, then SIGKILL what is left."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.processes():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5.0)
            while self.processes() and time.monotonic() < deadline:
                time.sleep(0.2)
