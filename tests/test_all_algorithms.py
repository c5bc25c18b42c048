"""Every installed algorithm, through the one contract: its smoke federation runs in memory and as
processes, and a run killed after a checkpoint (one party, or every party at once) and resumed gives
the uninterrupted run's results and trained parts bit for bit, in memory and as processes whose
transcripts pass the audit through the restart.

The algorithms are those of the ``fedhet_algorithms`` entry points; each one's smallest run is the
federation file ``smoke.toml`` beside its package's ``__init__.py``, so adding an algorithm takes
its package, one entry point and that file, and no line here.  ``example_sum`` (a package under
``tests/example_algorithm/``, registered through an entry point of its own) shows it.
"""
from __future__ import annotations

import os
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from algorithm_tools import comparable, jsonable, smoke_federation  # a helper module of tests/
from fedhet.algorithms import registry
from fedhet.algorithms.scoring import check_part
from fedhet.parties.ops.export import export_run, load_export
from fedhet.parties.audit import audit
from fedhet.parties.checkpoint import Checkpoints
from fedhet.parties.contract import ENTRY_POINT_GROUP
from fedhet.parties.federation import Federation
from fedhet.parties.faults import KILL_ENV
from fedhet.parties.inmemory import FederationFailed, run_inmemory
from fedhet.parties.ops.launcher import RunFailed, launch, resume_federation
from fedhet.parties.settings import known_keys
from fedhet.protocols import psi

pytestmark = pytest.mark.processes   # the tier (tests/conftest.py)

EXAMPLE_DIR = Path(__file__).parent / "example_algorithm"

def check_processes_match_memory(name: str, tmp_path: Path) -> dict:
    """Run ``name``'s smoke federation in memory (checkpointing: the reference), then as processes that
    are killed with SIGKILL right after a checkpoint (one party, or every party at once: a party and
    step drawn from the name) and resumed with ``fedhet run --resume``: the resumed processes give
    the in-memory run's results and trained parts, bit for bit, and the audit follows every
    transcript through the restart.  Returns the resumed run's summary."""
    fed = smoke_federation(name)
    algo = registry.get_algorithm(name)
    assert algo.name == name, f"entry point {name!r} loads algorithm {algo.name!r}"
    mem, models, victim, at = kill_plan(name, fed, tmp_path)
    who = random.Random(name + "who").choice(["self", "all"])
    # Federations of four or more parties run in two host processes (each party a thread with its own
    # keys, CURVE sockets, transcript and files, as in `hosts = N`): the protocol crosses process
    # boundaries all the same, at two imports of torch instead of one per party.  One process per
    # party is what test_launcher and each algorithm's own process test run.
    if len(fed.parties) >= 4:
        fed = replace(fed, hosts=2)
    run = tmp_path / "run"
    with pytest.raises(RunFailed):
        launch(fed, run, progress=False, timeout=240, env=dict(os.environ, **{KILL_ENV: f"{victim}:{at}:{who}"}))
    summary = launch(resume_federation(run), run, progress=False, timeout=240, resume=True)
    steps = {p: r.get("resumed_from") for p, r in summary["parties"].items()}
    assert len(set(steps.values())) == 1, f"{name}: the parties went on from different steps {steps}"
    rep = audit(run, registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    assert rep.messages > 0
    for p in fed.parties:
        got = comparable(jsonable(summary["parties"][p.name]["result"]))
        assert got == comparable(jsonable(mem[p.name])), \
            f"{name}: party {p.name} differs after kill -9 of {victim!r} ({who}) at step {at}, resumed at {steps}"
    if algo.load_model is not None:
        check_trained_parts(name, models, tmp_path)
    return summary


def check_trained_parts(name: str, models: dict, tmp_path: Path) -> None:
    """An algorithm that trains a model: every part saved in memory rebuilds into a module that scores
    as the trained part did, and the process run's parts export (weights, metadata, ONNX) and load
    back the same, with the same tensors as in memory."""
    algo = registry.get_algorithm(name)
    assert models, f"{name} has a model loader but no party saved a trained part"
    for party, part in models.items():
        assert check_part(algo.load_model(part.meta, part.tensors), part.meta) is None, (name, party)
    exported = export_run(tmp_path / "run", tmp_path / "export", registry.get_algorithm)
    assert set(exported) == set(models), f"{name}: the process run saved parts for {sorted(exported)}"
    for party, folder in exported.items():
        module, doc = load_export(folder, registry.get_algorithm)
        assert check_part(module, doc["meta"]) is None, (name, party)
        from safetensors.numpy import load_file
        on_disk = load_file(str(folder / "weights.safetensors"))
        assert set(on_disk) == set(models[party].tensors)
        # tensors a part lists as random (secret shares drawn from the OS CSPRNG) differ run to run by design
        fresh = set(models[party].meta.get("random_tensors", []))
        assert all(np.array_equal(on_disk[k], v) for k, v in models[party].tensors.items() if k not in fresh), \
            (name, party)


# Every algorithm is killed and resumed in memory below (test_killed_and_resumed_in_memory_...). As
# killed and resumed processes, the default suite runs those whose only process run without the real
# data is this one; he_split, stfl and chfl, which run as audited processes in their own tests
# (one process per party), and fedavg_logreg, whose processes test_resume.py kills and resumes
# (the launcher, one party), run here with --runslow, to keep the suite within its time.
PROCESS_RESUME_SLOW = ("he_split", "stfl", "chfl", "fedavg_logreg")
# make test's process runs of the algorithms with no process test of their own without the real data
PROCESS_SMOKE = ("hyfem", "mmvfl", "f3")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in PROCESS_RESUME_SLOW else
                                  pytest.param(n, marks=pytest.mark.smoke) if n in PROCESS_SMOKE else n
                                  for n in registry.names()])
def test_processes_killed_and_resumed_give_the_in_memory_results_and_pass_the_audit(name, tmp_path):
    check_processes_match_memory(name, tmp_path)


# ------------------------------------------------ kill and resume
RUN_ID = "resume-test"   # roles may derive from the run id: the reference and the resumed run share it


def same_parts(name: str, got: dict, want: dict) -> None:
    """Trained parts (name -> TrainedPart) equal, bit for bit, but for the tensors a part lists as
    random (secret shares drawn from the OS CSPRNG)."""
    assert set(got) == set(want), (name, sorted(got), sorted(want))
    for party, part in want.items():
        fresh = set(part.meta.get("random_tensors", []))
        theirs = got[party].tensors
        assert set(theirs) == set(part.tensors), (name, party)
        differ = [k for k, v in part.tensors.items() if k not in fresh and not np.array_equal(np.asarray(theirs[k]), v)]
        assert not differ, f"{name}: party {party}'s trained {differ} differ after the resume"


def kill_plan(name: str, fed: Federation, tmp_path: Path) -> tuple[dict, dict, str, int]:
    """The uninterrupted run in memory, checkpointing (the reference: results and parts), and where
    to kill: a party drawn by the algorithm's name, at a step drawn from those it checkpoints."""
    parties = [(p.name, p.role) for p in fed.parties]
    models: dict = {}
    ref = run_inmemory(registry.get_algorithm(name), parties, fed.algorithm_cfg(), seed=fed.seed, run_id=RUN_ID,
                       timeout=120, models=models, checkpoint_dir=tmp_path / "ref")
    last = {n: max(Checkpoints(tmp_path / "ref" / n).steps(), default=0) for n, _ in parties}
    assert max(last.values()) >= 1, f"{name} writes no checkpoint: a killed run of it could not resume"
    rng = random.Random(name)
    victim = rng.choice(sorted(n for n, s in last.items() if s >= 1))
    return ref, models, victim, rng.randint(1, last[victim])


@pytest.mark.federation
@pytest.mark.parametrize("name", registry.names())
def test_killed_and_resumed_in_memory_gives_the_same_results(name, tmp_path):
    fed = smoke_federation(name)
    algo = registry.get_algorithm(name)
    ref, ref_models, victim, at = kill_plan(name, fed, tmp_path)
    parties, cfg = [(p.name, p.role) for p in fed.parties], fed.algorithm_cfg()
    ckpt = tmp_path / "killed"
    with pytest.raises(FederationFailed) as killed:
        run_inmemory(algo, parties, cfg, seed=fed.seed, run_id=RUN_ID, timeout=60, clock="virtual",
                     checkpoint_dir=ckpt, kill={victim: at})
    assert type(killed.value.failures.get(victim)).__name__ == "Killed", killed.value
    models: dict = {}
    resumed: dict = {}
    got = run_inmemory(algo, parties, cfg, seed=fed.seed, run_id=RUN_ID, timeout=120, models=models,
                       checkpoint_dir=ckpt, resume=True, resumed=resumed)
    # the others went on as far as the protocol let them without the victim: all hold step at - 1
    assert len(set(resumed.values())) == 1 and resumed[victim] >= at - 1, (name, victim, at, resumed)
    for p, _ in parties:
        assert comparable(jsonable(got[p])) == comparable(jsonable(ref[p])), \
            f"{name}: party {p} differs after a kill of {victim} at step {at} and a resume"
    same_parts(name, models, ref_models)


# ------------------------------------------------ every PSI backend
def aligning() -> list[str]:
    """The algorithms that align their rows by PSI: those with a ``psi_backend`` setting."""
    return [n for n in registry.names() if registry.get_algorithm(n).settings is not None
            and "psi_backend" in known_keys(registry.get_algorithm(n).settings)]


_AUTO: dict[str, dict] = {}   # name -> its smoke run with psi_backend "auto", in memory (once per session)


def _smoke_in_memory(name: str, backend: str) -> dict:
    fed = smoke_federation(name)
    return run_inmemory(registry.get_algorithm(name), [(p.name, p.role) for p in fed.parties],
                        {**fed.algorithm_cfg(), "psi_backend": backend}, seed=fed.seed, run_id=RUN_ID, timeout=120)


@pytest.mark.federation
@pytest.mark.parametrize("backend", psi.BACKENDS)
@pytest.mark.parametrize("name", aligning())
def test_every_psi_backend_aligns_to_the_same_results(name, backend):
    """Issue 49: every vertical algorithm takes ``psi_backend``; each backend gives the results of the
    default ("auto", which at smoke sizes chooses ecdh) but for what measures the run, and every party
    that aligned records the backend in force."""
    if name not in _AUTO:
        _AUTO[name] = _smoke_in_memory(name, "auto")
    ref = _AUTO[name]
    got = _smoke_in_memory(name, backend)
    used = {p: r["psi_backend"] for p, r in got.items() if isinstance(r, dict) and "psi_backend" in r}
    assert used and set(used.values()) == {backend}, used
    auto = {r["psi_backend"] for r in ref.values() if isinstance(r, dict) and "psi_backend" in r}
    assert len(auto) == 1 and auto <= set(psi.AUTO_BACKENDS), auto
    for p in got:
        want = {k: v for k, v in comparable(jsonable(ref[p])).items() if k != "psi_backend"}
        assert {k: v for k, v in comparable(jsonable(got[p])).items() if k != "psi_backend"} == want, (name, backend, p)


# ------------------------------------------------ a new algorithm: a package, an entry point, a preset
def register(tmp_path: Path, monkeypatch, entry_points: dict[str, str], *folders: Path) -> None:
    """Install ``entry_points`` (name -> module) as a distribution's, in this process and in the
    processes it launches: a ``*.dist-info`` folder in ``tmp_path``, which goes on sys.path and on
    PYTHONPATH with ``folders`` (where the modules are)."""
    info = tmp_path / "site" / "fedhet_example-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fedhet-example\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{n} = {m}\n" for n, m in entry_points.items()))
    paths = [str(info.parent)] + [str(f) for f in folders]
    for p in reversed(paths):
        monkeypatch.syspath_prepend(p)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))


def test_a_new_algorithm_takes_its_package_one_entry_point_and_one_preset(tmp_path, monkeypatch):
    assert "example_sum" not in registry.names()
    register(tmp_path, monkeypatch, {"example_sum": "fedhet_example_sum"}, EXAMPLE_DIR)
    assert "example_sum" in registry.names()
    summary = check_processes_match_memory("example_sum", tmp_path)
    assert summary["parties"]["summer"]["result"] == {"total": 3.0, "adders": 2}


@pytest.mark.unit
def test_an_algorithm_without_a_smoke_federation_is_named_with_the_file_it_needs(tmp_path, monkeypatch):
    pkg = tmp_path / "code" / "fedhet_example_bare"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    register(tmp_path, monkeypatch, {"example_bare": "fedhet_example_bare", "example_flat": "fedhet_example_sum.roles"},
             tmp_path / "code", EXAMPLE_DIR)
    with pytest.raises(pytest.fail.Exception, match=r"'example_bare' has no smoke federation: .*"
                                                    r"fedhet_example_bare/smoke\.toml"):
        smoke_federation("example_bare")
    with pytest.raises(pytest.fail.Exception, match=r"'example_flat'.* a module; an algorithm is a package"):
        smoke_federation("example_flat")
