"""Every declared message kind says what protects its values (``protects=``), in every settings variant.

``fedhet report`` colours a run's message map by it, so no kind may be left "not stated".  Each
installed algorithm (and its prediction job) is built from its smoke federation's ``[algorithm]``
table and every combination of the settings that choose which kinds it declares (F³'s fusion, STFL's
variant, he_split's scheme, plain or secure aggregation, CHFL's and HyFEM's method, HyFEM's plain
views, the PSI backend), read from its settings class, so a kind of any variant is seen.  Only
declarations are built: no party runs.
"""
from __future__ import annotations

import dataclasses
import itertools
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import pytest

from fedhet.algorithms import registry
from fedhet.parties.contract import installed_entry_points, prepare
from fedhet.parties.declare import PROTECTIONS, declare
from fedhet.parties.federation import load
from fedhet.parties.settings import SettingsError

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

# The settings that choose which kinds (or which protection of a kind) a run declares.
VARIANT_KEYS = ("fusion", "variant", "he", "aggregation", "method", "allow_plain_views", "psi_backend")
# Values a settings class lists but refuses (an old name kept to say what it is called now).
REFUSED = {("f3", "fusion", "shamir")}


def _choices(cls: type) -> dict[str, tuple]:
    """key -> every value a settings class allows, for its Literal and bool keys (flattened groups too)."""
    out: dict[str, tuple] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if f.metadata.get("flatten"):
            out.update(_choices(tp))
            continue
        args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
        for a in args:
            if typing.get_origin(a) is Literal:
                out[f.name] = typing.get_args(a)
            elif a is bool:
                out[f.name] = (False, True)
    return out


def _variants(name: str) -> list[tuple[dict, Any]]:
    """(overrides, algorithm table) for every combination of the variant keys ``name``'s settings have."""
    algo = registry.get_algorithm(name)
    smoke = resources.files(installed_entry_points()[name].module) / "smoke.toml"   # as test_all_algorithms
    base = {k: v for k, v in load(Path(str(smoke))).algorithm.items() if k != "name"}
    choices = _choices(algo.settings)
    keys = [k for k in VARIANT_KEYS if k in choices]
    return [(dict(zip(keys, combo)), {**base, **dict(zip(keys, combo))})
            for combo in itertools.product(*(choices[k] for k in keys))]


def _declared(name: str) -> dict[str, dict[tuple, dict[str, str | None]]]:
    """algorithm or prediction job -> {variant ((key, value) pairs) -> {kind: protects}}; checks that every
    value of every variant key gave at least one declared run."""
    algo = registry.get_algorithm(name)
    out: dict[str, dict[tuple, dict[str, str | None]]] = {}
    seen: set[tuple[str, Any]] = set()
    for over, table in _variants(name):
        try:
            _, declared, _ = prepare(algo, table)
        except SettingsError:
            continue          # an impossible combination (e.g. F³'s mpc needs t = 2): another covers it
        seen.update(over.items())
        variant = tuple(over.items())
        out.setdefault(name, {})[variant] = {k: d.protects for k, d in declared.items()}
        if algo.predict is not None:
            _, pdecl, _ = prepare(algo.predict, table)
            out.setdefault(algo.predict.name, {})[variant] = {k: d.protects for k, d in pdecl.items()}
    choices = _choices(algo.settings)
    missed = [(k, v) for k in VARIANT_KEYS if k in choices for v in choices[k]
              if (k, v) not in seen and (name, k, v) not in REFUSED]
    assert not missed, f"{name}: no settings combination with {missed} parses; the test sees none of its kinds"
    return out


@pytest.mark.parametrize("name", registry.names())
def test_every_declared_kind_says_what_protects_it(name):
    for job, variants in _declared(name).items():
        for over, kinds in variants.items():
            unstated = sorted(k for k, p in kinds.items() if p is None)
            assert not unstated, f"{job} {over}: kinds without protects=: {unstated}"
            assert set(kinds.values()) <= set(PROTECTIONS), (job, over, kinds)


def test_variants_reach_every_kind_family():
    """The variant grid does reach the kinds that only some settings declare."""
    kinds = {job: set().union(*(set(v) for v in variants.values()))
             for name in ("f3", "stfl", "hyfem", "chfl", "psi") for job, variants in _declared(name).items()}
    assert {"f3/rep", "f3/rss/share", "f3/mpc/logits", "f3/share", "f3/pre/result"} <= kinds["f3"]
    assert {"stfl/latent", "split/activation", "split/gradient"} <= kinds["stfl"]
    assert {"stfl/predict"} <= kinds["stfl.predict"]
    assert {"hyfem/plain_view", "secagg/masked", "agg/plain"} <= kinds["hyfem"]
    assert {"chfl/global", "secagg/masked", "agg/plain"} <= kinds["chfl"]
    assert {"psi/blind_l", "psi_kkrt/oprf"} <= kinds["psi"]


def test_ciphertexts_say_their_scheme():
    he = _declared("he_split")["he_split"]
    by_scheme = {dict(variant)["he"]: kinds for variant, kinds in he.items()}
    assert by_scheme["paillier"]["hei/acts"] == by_scheme["naive"]["hei/acts"] == "paillier"
    assert by_scheme["ckks"]["hei/acts"] == "ckks"
    assert by_scheme["ckks"]["hei/pubkey"] == "control"


def test_an_unknown_protection_is_refused_naming_the_kind():
    with pytest.raises(ValueError, match=r"'demo/kind'.*bogus"):
        declare("demo/kind", "a", "b", "a test kind", protects="bogus")
    assert declare("demo/kind", "a", "b", "a test kind").protects is None   # not stated: allowed, shown so


def test_cli_messages_shows_protects(capsys, monkeypatch):
    import json

    from fedhet.parties.ops import cli

    assert cli.main(["messages", "fedavg_logreg", "--json"]) == 0
    kinds = json.loads(capsys.readouterr().out)
    assert kinds["fedavg/model"]["protects"] == "derived"
    assert kinds["_bye"]["protects"] == "control"
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["messages", "psi"]) == 0
    out = capsys.readouterr().out
    assert "protects" in out and "blinded" in out
