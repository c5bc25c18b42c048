"""Comparing an algorithm's results across runners, and finding its smallest run: a helper module of
tests/ (``test_all_algorithms.py``, ``test_ray_cluster.py``)."""
from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path

import pytest

from fedhet.parties.contract import installed_entry_points
from fedhet.parties.federation import Federation, load

SMOKE = "smoke.toml"

# Keys whose values are measurements of this run (time, load, the transport's framing: a run
# id's length changes header bytes), not results.
TIMING = ("_s", "time", "wall", "elapsed", "warmup", "throughput", "s_per_", "bytes", "cpu")
# Execution statistics (worker pools exist in processes only), not results.
EXECUTION = ("stats", "up", "down")


def comparable(x, key: str = ""):
    """``x`` without what measures the run rather than results it (times, bytes, pool statistics)."""
    if isinstance(x, dict):
        return {k: comparable(v, str(k)) for k, v in x.items()
                if not any(str(k).endswith(t) or t in str(k) for t in TIMING) and k not in EXECUTION}
    if isinstance(x, (list, tuple)):
        return [comparable(v, key) for v in x]
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x


def jsonable(x):
    """``x`` as JSON gives it back (arrays as lists)."""
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
