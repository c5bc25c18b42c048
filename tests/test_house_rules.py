"""The house rules (tests/house_rules.py) hold on fedhet's code, and each rule catches a planted
violation of itself (so the test can fail)."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import house_rules as hr

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]


def test_the_code_keeps_the_house_rules():
    found = hr.check(ROOT)
    assert not found, "house rules broken:\n" + "\n".join(map(str, found))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    base = {
        "algorithms/toolkit.py": "def derive_seed(seed, *tags):\n    return seed\n\ndef mlp(a, b):\n    return a\n",
        "parties/settings.py": "def parse_settings(cls, table, name):\n    return cls\n",
        "parties/atomic.py": "def write(path, data):\n    pass\n",
        "crypto/field.py": "P = 2**61 - 1\n",
        "protocols/secagg.py": "def run(party: \"PartyLike\"):\n    return party\n",
    }
    for rel, text in {**base, **files}.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(textwrap.dedent(text))
    return tmp_path


PLANTED = {
    "toolkit-twin": {"algorithms/hyfem/models.py": """
        import zlib
        def derive_seed(seed, *tags):
            return zlib.crc32(repr((seed, *tags)).encode())
        """, "algorithms/stfl/core.py": """
        class STFLConfig:
            @classmethod
            def from_dict(cls, table):
                return cls()
        """},
    "settings-dict": {"algorithms/chfl/roles.py": """
        def client(party: PartyLike, s, data):
            rounds = s.get("rounds", 3)
            return {"rounds": rounds}
        """},
    "crypto-parties": {"crypto/keys.py": """
        from fedhet.parties.atomic import write
        """},
    "runtime-algorithms": {"parties/runtime.py": """
        def run(name):
            from fedhet.algorithms.chfl import ALGORITHM
            return ALGORITHM
        """},
    "ops-layer": {"algorithms/predict.py": """
        from fedhet.parties.ops.launcher import launch
        """, "parties/audit.py": """
        import jinja2
        """},
    "private-import": {"protocols/psi.py": """
        from fedhet.protocols.secagg import _internal
        """},
    "import-cycle": {"algorithms/a.py": "from fedhet.algorithms import b\n",
                     "algorithms/b.py": "def f():\n    from fedhet.algorithms.a import g\n    return g\n"},
    "party-untyped": {"protocols/psi.py": """
        def run(party, items):
            return party
        """},
    "peer-check": {"protocols/psi/kkrt.py": """
        def answer_setup(party: PartyLike, lo, timeout):
            setup = party.recv(lo, "psi/kkrt/setup", timeout=timeout)
            if setup["bins"] != 8:
                raise PartyError("PSI-KKRT: the setup announces the wrong number of bins")
            return setup
        """},
    "bare-seed-tag": {"algorithms/mmvfl/data.py": """
        import numpy as np
        def split(seed, n):
            return np.random.default_rng([seed, 7919]).permutation(n)
        """},
}


@pytest.mark.parametrize("rule", sorted(hr.RULES))
def test_each_rule_catches_a_planted_violation(rule, tmp_path):
    assert not hr.check(_tree(tmp_path / "clean", {})), "the clean planted tree must pass"
    found = hr.check(_tree(tmp_path / "bad", PLANTED[rule]))
    assert {v.rule for v in found} == {rule}, found
    assert all(v.where.split(":")[0] in PLANTED[rule] for v in found)


def test_private_attribute_of_an_imported_module_is_caught(tmp_path):
    root = _tree(tmp_path, {"algorithms/f3/roles.py": """
        from fedhet.protocols import secagg
        def owner(party: PartyLike, s, data):
            return secagg._internal(party)
        """})
    assert [v.rule for v in hr.check(root)] == ["private-import"]


def test_typed_settings_and_named_tags_pass(tmp_path):
    root = _tree(tmp_path, {"algorithms/chfl/roles.py": """
        from fedhet.algorithms.toolkit import derive_seed
        def client(party: PartyLike, s, data):
            table = {"x": 1}
            return {"rounds": s.rounds, "x": table["x"], "seed": derive_seed(s.seed, "local")}
        """})
    assert hr.check(root) == []
