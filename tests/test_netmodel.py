"""The network cost model (issue 48): a synthetic trace replayed by hand, and read from a run folder."""
from __future__ import annotations

import json
import math

import pytest

from fedhet.parties import runfolder as rf
from fedhet.parties.netlink import LinkProfile
from fedhet.parties.ops.netmodel import ModelError, Trace, load, predict

pytestmark = pytest.mark.unit

WAN = LinkProfile("wan", 0.050, 100e6)


def msg(direction: str, peer: str, seq: int, t: float, n: int) -> dict:
    return {"type": "msg", "dir": direction, "peer": peer, "seq": seq, "t": t, "bytes": n, "kind": "k"}


def ping_pong() -> Trace:
    """A sends 1 MB at 0 (B has it at 0.001), B computes 0.1 s and answers 100 B (A has it at 0.102);
    A ends at 0.2, B at 0.15."""
    return Trace(records={"A": [msg("send", "B", 0, 0.0, 1_000_000), msg("recv", "B", 0, 0.102, 100)],
                          "B": [msg("recv", "A", 0, 0.001, 1_000_000), msg("send", "A", 0, 0.101, 100)]},
                 ended_at={"A": 0.2, "B": 0.15}, wall_s=0.2)


def test_a_ping_pong_replayed_by_hand():
    p = predict(ping_pong(), WAN)
    # the 1 MB: 0.08 s on the link + 0.025 s latency: B has it at 0.105 (0.104 late), sends at 0.205
    assert math.isclose(p.party_end_shift_s["B"], 0.104)
    # the answer: 8 us on the link + 0.025: A has it at 0.230008, 0.128008 later than measured
    assert math.isclose(p.party_end_shift_s["A"], 0.128008)
    # A ends last: 0.2 + 0.128008
    assert math.isclose(p.wall_s, 0.328008) and math.isclose(p.added_s, 0.128008)
    assert p.messages == 2 and p.bytes == 1_000_100 and math.isclose(p.on_link_s, 0.08 + 8e-6)


def test_loopback_predicts_the_measured_run():
    p = predict(ping_pong(), None)
    assert p.wall_s == 0.2 and p.added_s == 0.0


def test_messages_on_one_link_queue_behind_each_other():
    """A sends two 1 MB messages back to back to B and one to C; B answers after both."""
    tr = Trace(records={
        "A": [msg("send", "B", 0, 0.0, 1_000_000), msg("send", "B", 1, 0.0, 1_000_000),
              msg("send", "C", 0, 0.0, 1_000_000)],
        "B": [msg("recv", "A", 0, 0.001, 1_000_000), msg("recv", "A", 1, 0.002, 1_000_000)],
        "C": [msg("recv", "A", 0, 0.001, 1_000_000)]},
        ended_at={"A": 0.01, "B": 0.01, "C": 0.01}, wall_s=0.01)
    p = predict(tr, WAN)
    # B's second message starts when the first finished (0.08): arrives 0.16 + 0.025
    assert math.isclose(p.party_end_shift_s["B"], 0.185 - 0.002)
    # C's link is its own: 0.08 + 0.025
    assert math.isclose(p.party_end_shift_s["C"], 0.105 - 0.001)
    assert math.isclose(p.wall_s, 0.01 + 0.183)


def test_a_late_party_sends_late():
    """B's answer to A depends on A's message reaching B: every record of B after it moves too, and
    a message A sent before it heard anything is not delayed by A."""
    tr = Trace(records={
        "A": [msg("send", "B", 0, 0.0, 0), msg("recv", "B", 0, 0.5, 0)],
        "B": [msg("recv", "A", 0, 0.0, 0), msg("send", "A", 0, 0.5, 0)]},
        ended_at={"A": 0.6, "B": 0.5}, wall_s=0.6)
    p = predict(tr, LinkProfile("x", 0.2, 1e12))
    assert math.isclose(p.party_end_shift_s["B"], 0.1) and math.isclose(p.party_end_shift_s["A"], 0.2)
    assert math.isclose(p.wall_s, 0.8)


def test_load_reads_a_run_folder_and_refuses_a_restarted_one(tmp_path):
    for party, recs in ping_pong().records.items():
        d = rf.party_dir(tmp_path, party)
        d.mkdir(parents=True)
        lines = [json.dumps(r) for r in recs] + [json.dumps({"type": "head"})]
        (d / rf.TRANSCRIPT).write_text("\n".join(lines) + "\n")
        (d / rf.RESULT).write_text(json.dumps({"ended_at": ping_pong().ended_at[party]}))
    (tmp_path / rf.RESULT).write_text(json.dumps({"wall_s": 0.2}))
    tr = load(tmp_path)
    assert tr.ended_at == {"A": 0.2, "B": 0.15} and tr.wall_s == 0.2
    assert math.isclose(predict(tr, "wan").wall_s, 0.328008)
    with (rf.party_dir(tmp_path, "A") / rf.TRANSCRIPT).open("a") as f:
        f.write(json.dumps({"type": "resume"}) + "\n")
    with pytest.raises(ModelError, match="restarted"):
        load(tmp_path)


def test_a_message_that_came_before_the_role_began_delays_it_only_past_that():
    """B's role began at 0.5; A's message (sent at 0) came at 0.001: over a 0.6 s one-way link it
    comes at 0.6, 0.1 s after B began, not 0.6 s late."""
    tr = Trace(records={"A": [msg("send", "B", 0, 0.0, 0)], "B": [msg("recv", "A", 0, 0.001, 0)]},
               ended_at={"A": 0.1, "B": 1.0}, wall_s=1.0, started_at={"A": 0.0, "B": 0.5})
    p = predict(tr, LinkProfile("x", 1.2, 1e12))
    assert math.isclose(p.party_end_shift_s["B"], 0.1) and math.isclose(p.wall_s, 1.1)
    assert math.isclose(tr.span_s, 0.5)
