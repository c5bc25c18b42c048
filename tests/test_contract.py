"""The algorithm contract: one settings parser, payload schemas checked on receipt and by the audit."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pytest

from fedhet.parties import schema as sch
from fedhet.parties.api import MessageRejected, PeerTimeout
from fedhet.parties.contract import Algorithm, PartyLike
from fedhet.parties.declare import declare
from fedhet.parties.inmemory import FederationFailed, InMemoryHub, run_inmemory
from fedhet.parties.settings import SettingsError, describe_settings, parse_settings, setting

pytestmark = pytest.mark.federation   # the tier (tests/conftest.py)


@dataclass(frozen=True)
class Inner:
    agg_clip: float | None = setting(None, "a clip", lo=0, lo_open=True)


@dataclass(frozen=True)
class Demo:
    rounds: int = setting(5, "rounds", lo=1)
    lr: float = setting(0.1, "step", lo=0, lo_open=True)
    mode: Literal["fast", "slow"] = setting("fast", "how")
    widths: tuple[int, ...] = setting((8, 4), "hidden widths", min_len=1, lo=1)
    label: str | None = setting(None, "optional label")
    inner: Inner = setting(Inner(), flatten=True)

    def validate(self):
        if self.mode == "slow" and self.rounds > 100:
            raise ValueError("slow mode allows at most 100 rounds")


def test_settings_parse_defaults_types_and_flattened_groups():
    s = parse_settings(Demo, {"rounds": 7, "lr": 1, "widths": [3], "agg_clip": 2, "label": "x"}, "demo")
    assert (s.rounds, s.lr, s.widths, s.inner.agg_clip, s.label) == (7, 1.0, (3,), 2.0, "x")
    assert isinstance(s.lr, float) and s.inner.agg_clip == 2.0 and s.rounds == 7
    assert parse_settings(Demo, {}, "demo") == Demo()


@pytest.mark.parametrize("table, words", [
    ({"round": 3}, ["unknown", "'round'", "did you mean 'rounds'"]),
    ({"rounds": 0}, ["rounds", ">= 1", "0"]),
    ({"rounds": 2.5}, ["rounds", "integer", "2.5"]),
    ({"rounds": True}, ["rounds", "integer"]),
    ({"lr": 0}, ["lr", "> 0"]),
    ({"lr": float("nan")}, ["lr", "finite"]),
    ({"mode": "medium"}, ["mode", "'fast'", "'slow'"]),
    ({"widths": []}, ["widths", "at least 1"]),
    ({"widths": [4, "x"]}, ["widths[1]", "integer"]),
    ({"agg_clip": -1}, ["agg_clip", "> 0"]),
    ({"mode": "slow", "rounds": 500}, ["at most 100 rounds"]),
])
def test_settings_errors_name_the_key(table, words):
    with pytest.raises(SettingsError) as e:
        parse_settings(Demo, table, "demo")
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_describe_lists_every_key_with_its_doc():
    rows = {r["key"]: r for r in describe_settings(Demo)}
    assert set(rows) == {"rounds", "lr", "mode", "widths", "label", "agg_clip"}
    assert rows["rounds"]["default"] == 5 and rows["rounds"]["doc"] == "rounds"
    assert ">= 1" in rows["rounds"]["range"] and rows["mode"]["type"] == "'fast' | 'slow'"


SPEC = sch.Fields({"w": sch.Arr("<f4", ("n",)), "r": sch.Int(lo=0), "tags": sch.ListOf(sch.Str(), max_len=3),
                   "by": sch.MapOf(sch.Arr(("<f4", "<f8"), (None, 2))), "note": sch.Optional(sch.Str())},
                  optional=("note",))


def _ok_payload():
    return {"w": np.zeros(4, np.float32), "r": 1, "tags": ["a"], "by": {"x": np.zeros((3, 2))}}


@pytest.mark.parametrize("change, field", [
    (lambda p: p.update(w=np.zeros(5, np.float32)), "w"),
    (lambda p: p.update(w=np.zeros(4, np.float64)), "w"),
    (lambda p: p.update(w=[0.0] * 4), "w"),
    (lambda p: p.update(r=-1), "r"),
    (lambda p: p.pop("r"), "r"),
    (lambda p: p.update(extra=1), "extra"),
    (lambda p: p.update(tags=["a"] * 4), "tags"),
    (lambda p: p.update(by={"x": np.zeros((3, 3))}), "by.x"),
    (lambda p: p.update(by={"x": np.zeros((3, 2), np.int64)}), "by.x"),
])
def test_schema_names_the_field(change, field):
    SPEC.validate(_ok_payload(), "", {"n": 4})
    p = _ok_payload()
    change(p)
    with pytest.raises(sch.SchemaError) as e:
        SPEC.validate(p, "", {"n": 4})
    assert e.value.path == field, str(e.value)


def test_schema_checks_transcript_records_by_path():
    described = sch.describe(_ok_payload())
    assert [p for p, _, _ in described] == ["w", "by.x"]
    assert sch.check_arrays(SPEC, described, {"n": 4}) is None
    assert "shape" in sch.check_arrays(SPEC, [("w", "<f4", (9,))], {"n": 4})
    assert "undeclared field" in sch.check_arrays(SPEC, [("raw", "<f4", (4,))], {"n": 4})
    assert "declared int" in sch.check_arrays(SPEC, [("r", "<f8", (1,))], {"n": 4})
    # records without paths (older transcripts) still need a matching declared array
    assert sch.check_arrays(SPEC, [("<f4", (4,))], {"n": 4}) is None
    assert sch.check_arrays(SPEC, [("<i8", (4,))], {"n": 4}) is not None


# ------------------------------------------------------------ strict receipt

def _hub(declarations):
    hub = InMemoryHub({"a": "sender", "b": "receiver"})
    a = hub.party("a", timeout=2, declarations=declarations, sizes={"n": 3})
    b = hub.party("b", timeout=2, declarations=declarations, sizes={"n": 3})
    return a, b


DECLS = [declare("x/vec", "sender", "receiver", "a vector", payload=sch.Fields({"v": sch.Arr("<f8", ("n",))}))]


def test_receipt_against_the_schema_fails_naming_sender_kind_and_field():
    a, b = _hub(DECLS)
    a.send("b", "x/vec", {"v": np.ones(3)})
    assert np.array_equal(b.recv("a", "x/vec")["v"], np.ones(3))
    a.send("b", "x/vec", {"v": np.ones(7)})
    with pytest.raises(MessageRejected) as e:
        b.recv("a", "x/vec")
    msg = str(e.value)
    assert "'a'" in msg and "'x/vec'" in msg and "field 'v'" in msg and "n=3" in msg


def test_undeclared_kinds_and_roles_are_refused_on_receipt_and_named_in_the_timeout():
    a, b = _hub(DECLS)
    for _ in range(5):
        a.send("b", "x/unread", {"junk": np.ones(1000)})
    b.send("a", "x/vec", {"v": np.ones(3)})  # declared, but not from a receiver
    assert not b._mailbox._queues.get(("a", "x/unread"))  # nothing was kept
    with pytest.raises(PeerTimeout) as e:
        b.recv("a", "x/vec", timeout=0.2)
    assert "5 refused (undeclared kind)" in str(e.value) and "silent" not in str(e.value)
    with pytest.raises(PeerTimeout):
        a.recv("b", "x/vec", timeout=0.2)
    assert a.reject_counts["b: undeclared kind"] == 1


def test_a_flood_of_one_kind_is_bounded(monkeypatch):
    from fedhet.parties import api

    monkeypatch.setattr(api, "QUEUE_MAX_MESSAGES", 10)
    a, b = _hub(DECLS)
    for _ in range(25):
        a.send("b", "x/vec", {"v": np.ones(3)})
    assert len(b._mailbox._queues[("a", "x/vec")]) == 10
    for _ in range(10):
        b.recv("a", "x/vec")
    with pytest.raises(MessageRejected, match="queued"):
        b.recv("a", "x/vec")


def test_reject_reasons_are_truncated_and_the_list_bounded():
    a, b = _hub(DECLS)
    for i in range(300):
        b._deliver([b"\x93" + b"x" * 5000], authenticated="a")
    assert len(b.rejected) == 100 and all(len(r) <= 200 for r in b.rejected)
    assert b.reject_counts["a: malformed"] == 300


def test_an_abort_notice_stops_peers_at_once():
    hub = InMemoryHub({"a": "r", "b": "r"})
    a = hub.party("a", timeout=30, declarations=[])
    b = hub.party("b", timeout=30, declarations=[])
    a.notify_failure("disk full")
    from fedhet.parties.api import PartyAborted
    with pytest.raises(PartyAborted, match="party 'a' announced its own failure: disk full"):
        b.recv("a", "anything")


# ------------------------------------------------------------ the contract

def _echo_algorithm():
    @dataclass(frozen=True)
    class S:
        n: int = setting(3, "vector length", lo=1)
        seed: int = setting(0, "seed")

    def sender(party, s, data):
        party.send("b", "x/vec", {"v": np.arange(float(s.n)) + data})
        return {"sent": s.n}

    def receiver(party, s, data):
        return {"got": party.recv("a", "x/vec")["v"].tolist()}

    return Algorithm(name="echo", summary="test", roles={"sender": sender, "receiver": receiver},
                     load_data=lambda s, ctx: 10.0 if ctx.role == "sender" else None,
                     declarations=lambda s: DECLS, settings=S, sizes=lambda s: {"n": s.n})


def test_run_inmemory_parses_settings_and_checks_receipt():
    algo = _echo_algorithm()
    out = run_inmemory(algo, [("a", "sender"), ("b", "receiver")], {"n": 4})
    assert out["b"]["got"] == [10.0, 11.0, 12.0, 13.0]
    with pytest.raises(SettingsError, match="did you mean 'n'"):
        run_inmemory(algo, [("a", "sender"), ("b", "receiver")], {"nn": 4})
    with pytest.raises(ValueError, match="role 'boss'"):
        run_inmemory(algo, [("a", "sender"), ("b", "boss")], {})


def test_a_schema_violation_fails_the_run_naming_the_field():
    algo = _echo_algorithm()
    bad = Algorithm(name="echo", summary="", roles=algo.roles, load_data=algo.load_data,
                    declarations=algo.declarations, settings=algo.settings, sizes=lambda s: {"n": s.n + 1})
    with pytest.raises(FederationFailed) as e:
        run_inmemory(bad, [("a", "sender"), ("b", "receiver")], {"n": 4})
    assert "field 'v'" in str(e.value) and "'x/vec'" in str(e.value)


def test_both_transports_parties_are_party_like():
    """What roles may use of a party (PartyLike) is what both transports give them; mypy checks the
    same where the runners hand their parties to run_role (parties/inmemory.py, parties/runtime.py)."""
    from fedhet.parties.api import Party
    from fedhet.parties.zmq_transport import ZmqParty

    assert isinstance(InMemoryHub({"a": "r", "b": "r"}).party("a"), PartyLike)
    assert issubclass(ZmqParty, Party)
    assert not isinstance(object(), PartyLike)


@pytest.mark.processes
def test_cli_messages_lists_kinds_with_schemas():
    out = subprocess.run([sys.executable, "-m", "fedhet.parties.ops.cli", "messages", "fedavg_logreg", "--json"],
                         capture_output=True, text=True, cwd=_root())
    assert out.returncode == 0, out.stderr
    import json
    kinds = json.loads(out.stdout)
    assert kinds["fedavg/model"]["sender"] == ["server"] and "n_params" in kinds["fedavg/model"]["payload"]


def _root():
    from pathlib import Path
    return Path(__file__).resolve().parents[1]
