"""Every registered algorithm, through the one contract: its smallest preset runs in memory and as
processes, the process run passes the audit, and both give the same results for the same seed."""
from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from fedhet.algorithms import registry
from fedhet.parties import presets
from fedhet.parties.audit import audit
from fedhet.parties.federation import load
from fedhet.parties.inmemory import run_inmemory
from fedhet.parties.launcher import launch

# The smallest preset of each algorithm, cut down further so each run takes seconds.  A new
# algorithm must add its line here (the test below fails until it does).  Each runs on data that
# ships with a package or is generated, so a clone without ../shared tests every algorithm.
SMALLEST = {
    "fedavg_logreg": ("demo", {"rounds": 3}),
    "psi": ("psi", {"n": 300}),
    "shamir": ("shamir", {}),
    "stfl": ("stfl", {"epochs": 2, "vae_epochs": 2}),
    "he_split": ("he_split", {"epochs": 1, "max_batches": 1, "key_bits": 1024}),
    "chfl": ("chfl_small", {"rounds": 1, "local_epochs": 1, "hidden": [16]}),
    "secagg_bench": ("secagg", {"m": 200}),
    "hyfem": ("hyfem_digits", {"rounds": 2, "local_steps": 4, "max_rows": 300, "extractor_hidden": 16,
                        "inference_hidden": 16, "embed_dim": 8}),
    "mmvfl": ("mmvfl_digits", {"train_per_class": 10, "val_per_class": 4, "max_iter": 2, "percents": [10, 100]}),
    "f3": ("f3_grid", {"local_epochs": 2, "epochs": 2, "graph": "icdf", "test_samples": 2}),
}

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


def test_every_registered_algorithm_has_a_smallest_preset():
    assert sorted(SMALLEST) == registry.names()
    for name, (preset, _) in SMALLEST.items():
        assert load(presets.path(preset)).algorithm_name == name


@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_in_memory_and_processes_agree_and_pass_the_audit(name, tmp_path):
    preset, overrides = SMALLEST[name]
    fed = load(presets.path(preset))
    algo = registry.get_algorithm(name)
    # Federations of four or more parties run in two host processes (each party a thread with its own
    # keys, CURVE sockets, transcript and files, as in `hosts = N`): the protocol crosses process
    # boundaries all the same, at two imports of torch instead of one per party.  One process per
    # party is what test_launcher and each algorithm's own process test run.
    if len(fed.parties) >= 4:
        fed = replace(fed, hosts=2)
    summary = launch(fed, tmp_path / "run", progress=False, overrides=overrides, timeout=240)
    rep = audit(tmp_path / "run", registry.get_algorithm)
    assert rep.ok, rep.problems[:5]
    assert rep.messages > 0

    cfg = {**fed.algorithm_cfg(), **overrides}
    mem = run_inmemory(algo, [(p.name, p.role) for p in fed.parties], cfg, seed=fed.seed, timeout=120)
    for p in fed.parties:
        got = _comparable(_jsonable(summary["parties"][p.name]["result"]))
        want = _comparable(_jsonable(mem[p.name]))
        assert got == want, f"{name}: party {p.name} differs between processes and in-memory"
