"""Every installed algorithm, through the one contract: its smoke federation runs in memory and as
processes, the process run passes the audit, and both give the same results for the same seed.

The algorithms are those of the ``fedhet_algorithms`` entry points; each one's smallest run is the
federation file ``smoke.toml`` beside its package's ``__init__.py``, so adding an algorithm takes
its package, one entry point and that file, and no line here.  ``example_sum`` (a package under
``tests/example_algorithm/``, registered through an entry point of its own) shows it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from fedhet.algorithms import registry
from fedhet.algorithms.export import check_part, export_run, load_export
from fedhet.parties.audit import audit
from fedhet.parties.contract import ENTRY_POINT_GROUP, installed_entry_points
from fedhet.parties.federation import Federation, load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.launcher import launch

SMOKE = "smoke.toml"
EXAMPLE_DIR = Path(__file__).parent / "example_algorithm"

# Keys whose values are measurements of this run (time, load, the transport's framing: a run
# id's length changes header bytes), not results.
_TIMING = ("_s", "time", "wall", "elapsed", "warmup", "throughput", "s_per_", "bytes", "cpu")
# Execution statistics (worker pools exist in processes only), not results.
_EXECUTION = ("stats", "up", "down")


def _comparable(x, key: str = ""):
    if isinstance(x, dict):
        return {k: _comparable(v, str(k)) for k, v in x.items()
                if not any(str(k).endswith(t) or t in str(k) for t in _TIMING) and k not in _EXECUTION}
    if isinstance(x, (list, tuple)):
        return [_comparable(v, key) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


def _jsonable(x):
    return json.loads(json.dumps(x, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def smoke_federation(name: str) -> Federation:
    """The smoke federation of installed algorithm ``name``: ``smoke.toml`` beside the ``__init__.py``
    of the package its entry point names."""
    module = installed_entry_points()[name].module
    try:
        folder = resources.files(module)
    except TypeError:   # a plain module (no package, no folder of its own)
        pytest.fail(f"algorithm {name!r}: its entry point names {module!r}, a module; an algorithm is a "
                    f"package, with its smallest run in {module.replace('.', '/')}/{SMOKE} beside its __init__.py")
    path = folder / SMOKE
    if not path.is_file():
        pytest.fail(f"algorithm {name!r} has no smoke federation: put its smallest run in {path} "
                    f"(beside the __init__.py of {module})")
    fed = load(Path(str(path)))
    assert fed.algorithm_name == name, f"{path} runs {fed.algorithm_name!r}, not {name!r}"
    return fed


def check_processes_match_memory(name: str, tmp_path: Path) -> dict:
    """Run ``name``'s smoke federation as processes (audited) and in memory; both must agree.
    Returns the process run's summary."""
    fed = smoke_federation(name)
    algo = registry.get_algorithm(name)
    assert algo.name == name, f"entry point {name!r} loads algorithm {algo.name!r}"
    # Federations of four or more parties run in two host processes (each party a thread with its own
    # keys, CURVE sockets, transcript and files, as in `hosts = N`): the protocol crosses process
    # boundaries all the same, at two imports of torch instead of one per party.  One process per
    # party is what test_launcher and each algorithm's own process test run.
    if len(fed.parties) >= 4:
        fed = replace(fed, hosts=2)
    summary = launch(fed, tmp_path / "run", progress=False, timeout=240)
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    assert rep.messages > 0

    models: dict = {}
    mem = run_inmemory(algo, [(p.name, p.role) for p in fed.parties], fed.algorithm_cfg(), seed=fed.seed,
                       timeout=120, models=models)
    for p in fed.parties:
        got = _comparable(_jsonable(summary["parties"][p.name]["result"]))
        want = _comparable(_jsonable(mem[p.name]))
        assert got == want, f"{name}: party {p.name} differs between processes and in-memory"
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


@pytest.mark.parametrize("name", registry.names())
def test_in_memory_and_processes_agree_and_pass_the_audit(name, tmp_path):
    check_processes_match_memory(name, tmp_path)


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
