"""What every benchmark script shares: results files, machine metadata, best-of timing, and
the project's two ways of running parties.

* **Results** (:class:`Output`): ``benchmarks/results/NAME.{json,md}`` (+ ``.png`` when a
  matplotlib figure is given), ``NAME_quick.*`` for ``--quick``; every file is written
  atomically (``fedhet.parties.atomic``), so a reader or a crash never sees half a file.
* **Metadata** (:class:`Session`): CPU count and model, memory, Python / numpy / torch / pyzmq /
  cryptography versions, git commit, date, and the load average at start and at the end (the
  machines these run on are shared; the load says how much of them a run had).  Scripts store
  it under the JSON key ``environment`` and end the markdown with :func:`environment_line`.
* **Timing** (:func:`best_of`, :func:`best_of_interleaved`): the least wall and CPU time over
  repeats (the noise of a shared machine only ever adds time).
* **Parties as processes** (:func:`launch_audited`): a preset or a federation built in code
  (:func:`federation`) through the real launcher (``fedhet.parties.ops.launcher.launch``, every
  party its own process over CURVE ZeroMQ), then ``fedhet audit`` on the run folder; returns
  the launcher's summary, each party's result, the audit verdict and table, and the CPU time
  of every process of the run.
* **Parties in memory** (:func:`run_roles`): role functions as threads on the in-memory
  transport (``fedhet.parties.inmemory.run_inmemory``: the same codec and checks, no sockets),
  for sweeps over many settings; :func:`roles_algorithm` wraps a script's own role functions.
* **Figures** (:func:`pyplot`, :func:`figure_legend`, :func:`figure_png`): matplotlib without a
  display, one legend shared by a figure's panels, a figure as PNG bytes.
* **Flags** (:func:`add_common_args`): ``--quick``, ``--out`` (results folder) and, where a
  script can re-render its markdown from its JSON, ``--render-only``.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from fedhet.parties.atomic import json_default, write_atomic

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent
VERSIONED = ("numpy", "torch", "pyzmq", "cryptography")


# ------------------------------------------------------------------------------- flags

def add_common_args(ap: argparse.ArgumentParser, *, quick_help: str = "a fast look: small sizes",
                    render_only: bool = False) -> argparse.ArgumentParser:
    """``--quick``, ``--out`` (also spelled ``--out-dir``) and optionally ``--render-only``."""
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", "--out-dir", dest="out", type=Path, default=RESULTS,
                    help=f"results folder (default {RESULTS.relative_to(REPO)})")
    if render_only:
        ap.add_argument("--render-only", action="store_true",
                        help="re-write the markdown (and plot) from the existing JSON")
    return ap


def command_line(script: str | os.PathLike, argv: Sequence[str] | None = None) -> str:
    """``python -m benchmarks.NAME ARGS`` for the record (``argv`` None: this process's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python", "-m", f"benchmarks.{Path(script).stem}", *args])


# ----------------------------------------------------------------------------- results

def _jsonable(o: Any):
    """The one JSON hook (``fedhet.parties.atomic.json_default``), plus parsed flags as dicts."""
    if isinstance(o, argparse.Namespace):
        return vars(o)
    return json_default(o)


def json_text(doc: Any, indent: int | None = 2) -> str:
    """The JSON every results file holds: sorted keys, numpy values as plain numbers."""
    return json.dumps(doc, indent=indent, sort_keys=True, default=_jsonable) + "\n"


def figure_png(fig, dpi: int = 120) -> bytes:
    """A matplotlib figure as PNG bytes; the figure is closed."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=dpi)
    finally:
        plt.close(fig)
    return buf.getvalue()


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure_legend(fig, handles, labels, ncol: int | None = None):
    """One legend for every panel of ``fig``, centred below them; ``fig`` must be made with
    ``layout="constrained"``, which keeps room for it below the panels."""
    return fig.legend(handles, labels, loc="outside lower center", ncol=ncol or len(labels), frameon=False,
                      fontsize="large")


@dataclass(frozen=True)
class Output:
    """Where one benchmark writes: ``out_dir/NAME[_quick].{json,md,png}``."""

    name: str
    quick: bool = False
    out_dir: Path = RESULTS

    @property
    def stem(self) -> str:
        return f"{self.name}_quick" if self.quick else self.name

    def path(self, ext: str) -> Path:
        return Path(self.out_dir) / f"{self.stem}.{ext.lstrip('.')}"

    def write(self, doc: Any, markdown: str | None = None, figure=None, *, indent: int | None = 2,
              dpi: int = 120) -> dict[str, Path]:
        """Write the JSON, then the markdown, then the PNG (each atomically); returns the paths."""
        out = {"json": write_atomic(self.path("json"), json_text(doc, indent))}
        if markdown is not None:
            out["md"] = write_atomic(self.path("md"), markdown)
        if figure is not None:
            out["png"] = write_atomic(self.path("png"), figure_png(figure, dpi))
        return out

    def read(self) -> Any:
        """The JSON written before (for ``--render-only`` and ``--resume``); errors name the file."""
        p = self.path("json")
        try:
            return json.loads(p.read_text())
        except OSError as e:
            raise FileNotFoundError(f"cannot read {p}: {e.strerror}") from None
        except ValueError as e:
            raise ValueError(f"{p} is not valid JSON: {e}") from None


# ----------------------------------------------------------------------------- metadata

def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask; os.cpu_count where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def loadavg() -> float | None:
    """The 1-minute load average (None where the system has none)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


# What benchmarks write (results files, the page generated from them): a change there is not a change of the
# code that ran, so it does not mark a run "(modified)"
OUTPUTS = ("benchmarks/results/", "docs/results.md")


def git_commit() -> dict:
    """The repository's HEAD, whether the code has uncommitted changes (results files aside) and which
    files (None outside git)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return {"commit": None, "dirty": None, "dirty_files": None}
        status = git("status", "--porcelain", "--untracked-files=no").stdout.splitlines()
        changed = sorted(line[3:] for line in status if line[3:] and not line[3:].startswith(OUTPUTS))
        return {"commit": head.stdout.strip(), "dirty": bool(changed), "dirty_files": changed}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None, "dirty_files": None}


def machine_info() -> dict:
    """What the machine and the software are (versions read without importing the packages)."""
    mem = memory_bytes()
    g = git_commit()
    return {
        "cpu_count": cpu_count(), "cpu_count_os": os.cpu_count(), "cpu_model": cpu_model(),
        "machine": platform.machine(), "platform": platform.platform(),
        "memory_gib": None if mem is None else round(mem / 2**30, 1),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in VERSIONED},
        "git_commit": g["commit"], "git_dirty": g["dirty"], "git_dirty_files": g["dirty_files"],
    }


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


class Session:
    """One invocation of a benchmark: machine facts and load when it started, and (after
    :meth:`finish`, which may be called after every partial save) load and time at the end."""

    def __init__(self, name: str, script: str | os.PathLike | None = None,
                 argv: Sequence[str] | None = None):
        self.name = name
        self.command = command_line(script or f"{name}.py", argv)
        self._t0 = time.perf_counter()
        self.meta = {"benchmark": name, "command": self.command, "started": _now(),
                     "loadavg_start": loadavg(), **machine_info()}

    def finish(self) -> dict:
        self.meta.update({"finished": _now(), "loadavg_end": loadavg(),
                          "elapsed_s": time.perf_counter() - self._t0})
        return dict(self.meta)

    @property
    def started(self) -> str:
        return self.meta["started"]

    def header(self) -> dict:
        """Machine, start minute and command: the first line of a results table."""
        env = self.meta
        return {"machine": f"{env['machine']}, {env['cpu_count_os']} cores, Python {env['python']}",
                "when": self.started[:16], "command": self.command}


def publish(out: Output, doc: dict, markdown: Callable[[Any], str], session: Session,
            into: dict | None = None, figure: Callable[[Any], Any] | None = None) -> int:
    """A script's last step: the session's end under ``environment`` of ``into`` (default ``doc``),
    then the JSON, its markdown (and ``figure(doc)``'s PNG) written and the markdown printed; returns
    exit status 0."""
    (doc if into is None else into)["environment"] = session.finish()
    md = markdown(doc)
    out.write(doc, md, None if figure is None else figure(doc))
    print(md)
    return 0


def render_only(out: Output, markdown: Callable[[Any], str], figure: Callable[[Any], Any] | None = None) -> None:
    """``--render-only``: re-write (and print) the markdown (and ``figure``'s PNG) of the results already on disk."""
    doc = out.read()
    md = markdown(doc)
    out.write(doc, md, None if figure is None else figure(doc))
    print(md)


def dash(x, fmt: str = "{:.1f}") -> str:
    """``x`` formatted, or "-" where it is missing (a table cell)."""
    return "-" if x is None else fmt.format(x)


def closing_lines(doc: dict) -> list[str]:
    """The end of a results markdown: the document's note, then where and when it was measured."""
    return ["", doc.get("note", ""), "", environment_line(doc.get("environment")), ""]


def environment_line(env: dict | None) -> str:
    """One markdown line that says where and when a result was measured."""
    if not env:
        return ""
    v = env.get("versions", {})
    load = [env.get("loadavg_start"), env.get("loadavg_end")]
    load_txt = "→".join("?" if x is None else f"{x:.1f}" for x in load)
    commit = (env.get("git_commit") or "?")[:10] + (" (modified)" if env.get("git_dirty") else "")
    mem = env.get("memory_gib")
    return (f"Measured on {env.get('cpu_count')} CPUs ({env.get('cpu_model')})"
            + (f", {mem:g} GiB" if mem is not None else "")
            + f"; Python {env.get('python')}, numpy {v.get('numpy')}, torch {v.get('torch')}; "
            f"commit {commit}; started {env.get('started')}, load average {load_txt}.")


def machine_label(env: dict | None = None) -> str:
    """``x86_64, 2 cores`` (the short form scripts print in their headers)."""
    env = env or {"machine": platform.machine(), "cpu_count": cpu_count()}
    return f"{env['machine']}, {env['cpu_count']} cores"


# ------------------------------------------------------------------------------- timing

@dataclass(frozen=True)
class Timing:
    """Best (least) wall and CPU seconds over the repeats, every wall time, the last result."""

    wall_s: float
    cpu_s: float
    walls: tuple[float, ...]
    result: Any = field(default=None, repr=False, compare=False)


def _once(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def best_of(fn: Callable[[], Any], repeats: int = 3) -> Timing:
    """Call ``fn`` ``repeats`` times; the least wall time and the least CPU time (this process)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w, c, out = _once(fn)
        walls.append(w)
        cpus.append(c)
    return Timing(min(walls), min(cpus), tuple(walls), out)


def best_of_interleaved(variants: dict[str, Callable[[], Any]], repeats: int = 3) -> dict[str, Timing]:
    """:func:`best_of` for several variants, one call of each per round, so load changes during
    the measurement hit every variant alike."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    walls: dict[str, list] = {k: [] for k in variants}
    cpus: dict[str, list] = {k: [] for k in variants}
    last: dict[str, Any] = {}
    for _ in range(repeats):
        for name, fn in variants.items():
            w, c, last[name] = _once(fn)
            walls[name].append(w)
            cpus[name].append(c)
    return {k: Timing(min(walls[k]), min(cpus[k]), tuple(walls[k]), last[k]) for k in variants}


def children_cpu_s() -> float:
    """User + system CPU seconds of every child process waited for so far (and theirs)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


# --------------------------------------------------------------------- parties: processes

def federation(algorithm: dict, parties: Iterable[tuple[str, str]], name: str | None = None,
               timeout: float = 120.0, seed: int = 0):
    """A federation built in code: every party on loopback with a free port (the launcher
    assigns the ports and makes the keys).  ``algorithm`` is the ``[algorithm]`` table; keys set
    to None are left out (TOML has no null: the algorithm's default applies)."""
    from fedhet.parties.federation import from_dict

    if "name" not in algorithm:
        raise ValueError("the algorithm table needs a name (a registered algorithm)")
    return from_dict({
        "federation": {"name": name or f"bench-{algorithm['name']}", "timeout": float(timeout), "seed": int(seed)},
        "algorithm": _no_nulls(algorithm),
        "party": [{"name": n, "role": r, "endpoint": "tcp://127.0.0.1:0"} for n, r in parties],
    }, source=f"<benchmark {name or algorithm['name']}>")


def _no_nulls(table: dict | None) -> dict:
    return {k: v for k, v in (table or {}).items() if v is not None}


def preset(name: str):
    """A preset that ships with fedhet (``fedhet presets``), as a Federation."""
    from fedhet.parties.ops import presets
    from fedhet.parties.federation import load

    return load(presets.path(name))


@dataclass
class Launched:
    """One audited process run: the launcher's summary, the audit, and what it cost."""

    summary: dict
    audit_ok: bool | None          # None: not audited
    audit_problems: list[str]
    audit_table: list[dict]
    run_dir: Path | None           # None once a temporary run folder is removed
    wall_s: float                  # launch() as seen from here: process start-up to the last exit
    cpu_s: float                   # every process of the run (parties, their workers), start to exit

    @property
    def results(self) -> dict[str, Any]:
        """Party name -> what its role function returned."""
        return {n: p.get("result") for n, p in self.summary["parties"].items()}

    @property
    def traffic(self) -> dict[str, dict]:
        return {n: p.get("traffic", {}) for n, p in self.summary["parties"].items()}

    def by_role(self, role: str) -> dict[str, Any]:
        """Party name -> result, for the parties of one role (in federation order)."""
        return {n: p.get("result") for n, p in self.summary["parties"].items() if p.get("role") == role}


def launch_audited(fed, *, overrides: dict | None = None, run_dir: str | os.PathLike | None = None,
                   keep: bool = False, insecure: bool = False, timeout: float | None = None,
                   audit: bool = True, env: dict | None = None) -> Launched:
    """Run ``fed`` (a Federation or a preset name) with ``fedhet.parties.ops.launcher.launch`` and
    audit its run folder with ``fedhet.parties.audit.audit``.

    ``overrides`` replace ``[algorithm]`` keys (None values are left out).  ``run_dir`` None: a
    temporary folder, removed after the audit unless ``keep`` (or the run failed: then it stays for
    its logs).  Raises ``launcher.RunFailed`` when a party fails.
    """
    from fedhet.parties.audit import audit as audit_run
    from fedhet.parties.ops.launcher import launch

    if isinstance(fed, str):
        fed = preset(fed)
    temp = run_dir is None
    rdir = Path(tempfile.mkdtemp(prefix=f"bench-{fed.algorithm_name}-")) if temp else Path(run_dir)
    cpu0, t0 = children_cpu_s(), time.perf_counter()
    summary = launch(fed, rdir, insecure=insecure, timeout=timeout, progress=False, overrides=_no_nulls(overrides),
                     env=env)
    wall, cpu = time.perf_counter() - t0, children_cpu_s() - cpu0
    ok, problems, table = None, [], []
    if audit:
        rep = audit_run(rdir)
        ok, problems, table = rep.ok, list(rep.problems), list(rep.table)
    if temp and not keep:
        shutil.rmtree(rdir, ignore_errors=True)
        rdir = None
    return Launched(summary, ok, problems, table, rdir, wall, cpu)


# ---------------------------------------------------------------------- parties: in memory

def roles_algorithm(name: str, roles: dict[str, Callable], load_data: Callable | None = None,
                    declarations: Sequence = ()) -> types.SimpleNamespace:
    """An algorithm-shaped object for a script's own role functions (``run_inmemory`` takes it).

    Without ``declarations`` its parties accept any message kind (the contract's ad-hoc mode);
    with them, receipt is strict as in a registered algorithm."""
    extra = {"DECLARATIONS": list(declarations)} if declarations else {}
    return types.SimpleNamespace(NAME=name, ROLES=dict(roles), **extra,
                                 load_data=load_data or (lambda cfg, name, role, index, n, data_dir=None: None))


@dataclass
class InMemoryRun:
    results: dict[str, Any]   # party name -> role function's return value
    wall_s: float
    cpu_s: float              # this process (every party's thread)


def run_roles(algorithm, parties: Sequence[tuple[str, str]], cfg: dict | None = None, *, seed: int = 0,
              data: dict[str, Any] | None = None, timeout: float = 600.0, device: str = "cpu") -> InMemoryRun:
    """Every party of ``algorithm`` (a module, a registered name or :func:`roles_algorithm`) as a
    thread on the in-memory transport; ``data`` gives parties their data instead of ``load_data``."""
    from fedhet.parties.inmemory import run_inmemory

    c0, t0 = time.process_time(), time.perf_counter()
    res = run_inmemory(algorithm, list(parties), cfg=cfg, seed=seed, data=data, device=device, timeout=timeout)
    return InMemoryRun(res, time.perf_counter() - t0, time.process_time() - c0)
