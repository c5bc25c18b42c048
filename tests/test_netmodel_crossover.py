"""The cost model's sweep and crossovers (issue 48's "what to pick"): two synthetic runs whose spans are
known in closed form at every round trip and bandwidth, and the crossovers the functions find between
them against the ones solved by hand."""
from __future__ import annotations

import math

import pytest

from benchmarks import network_matrix as nm
from fedhet.parties.ops.netmodel import SWEEP_MBIT, SWEEP_RTT_MS, Trace, cheapest, crossover, sweep

pytestmark = pytest.mark.unit

HOPS = 10


def msg(direction: str, peer: str, seq: int, t: float, n: int) -> dict:
    return {"type": "msg", "dir": direction, "peer": peer, "seq": seq, "t": t, "bytes": n, "kind": "k"}


def one_shot() -> Trace:
    """S sends 1 MB to R at 0 (R has it at once on loopback) and R computes 0.1 s: the span is
    0.1 + 8 / Mbit/s + RTT / 2."""
    return Trace(records={"S": [msg("send", "R", 0, 0.0, 1_000_000)], "R": [msg("recv", "S", 0, 0.0, 1_000_000)]},
                 ended_at={"S": 0.0, "R": 0.1}, wall_s=0.1)


def chatty() -> Trace:
    """P and Q pass an empty message back and forth HOPS times, 1 ms apart, and the last receiver ends
    1 ms after the last: the span is 0.01 + HOPS * RTT / 2 at any bandwidth."""
    recs: dict[str, list[dict]] = {"P": [], "Q": []}
    for k in range(HOPS):
        src, dst = ("P", "Q") if k % 2 == 0 else ("Q", "P")
        recs[src].append(msg("send", dst, k // 2, k * 1e-3, 0))
        recs[dst].append(msg("recv", src, k // 2, k * 1e-3, 0))
    last = "Q" if (HOPS - 1) % 2 == 0 else "P"
    ended = {"P": (HOPS - 1) * 1e-3, "Q": (HOPS - 1) * 1e-3}
    ended[last] = HOPS * 1e-3
    return Trace(records=recs, ended_at=ended, wall_s=HOPS * 1e-3)


def span_one_shot(rtt_s: float, mbit: float) -> float:
    return 0.1 + 8.0 / mbit + rtt_s / 2


def span_chatty(rtt_s: float) -> float:
    return 0.01 + HOPS * rtt_s / 2


def test_the_sweep_is_the_closed_form_at_every_point():
    a, b = sweep(one_shot()), sweep(chatty())
    for i, rtt in enumerate(SWEEP_RTT_MS):
        for j, mbit in enumerate(SWEEP_MBIT):
            assert math.isclose(a[i][j], span_one_shot(rtt / 1e3, mbit), rel_tol=1e-9)
            assert math.isclose(b[i][j], span_chatty(rtt / 1e3), rel_tol=1e-9, abs_tol=1e-12)


def test_the_round_trip_where_the_one_shot_run_overtakes_the_chatty_one():
    a, b = sweep(one_shot()), sweep(chatty())
    for mbit in (100.0, 1000.0):
        j = SWEEP_MBIT.index(mbit)
        ya, yb = [line[j] for line in a], [line[j] for line in b]
        # 0.1 + 8/mbit + r/2 = 0.01 + HOPS r/2  =>  r = (0.09 + 8/mbit) / ((HOPS - 1) / 2)
        want_ms = (0.09 + 8.0 / mbit) / ((HOPS - 1) / 2) * 1e3
        assert math.isclose(crossover(SWEEP_RTT_MS, ya, yb), want_ms, rel_tol=1e-9)
        # beating it by a factor k:  k (0.1 + 8/mbit + r/2) = 0.01 + HOPS r/2
        k = 2.0
        want_k_ms = (k * (0.1 + 8.0 / mbit) - 0.01) / ((HOPS - k) / 2) * 1e3
        assert math.isclose(crossover(SWEEP_RTT_MS, ya, yb, k), want_k_ms, rel_tol=1e-9)
        # the chatty run never overtakes it again as the round trip grows; a factor beyond HOPS is never met
        assert crossover(SWEEP_RTT_MS, yb, ya) == 0.0          # it is cheaper from the start
        assert crossover(SWEEP_RTT_MS, ya, yb, HOPS + 1.0) is None


def test_the_bandwidth_where_the_chatty_run_overtakes_the_one_shot_one():
    """At 50 ms the chatty run costs 0.26 s; the one-shot run 0.125 + 8/mbit: dearer below 8/0.135 Mbit/s.
    Along falling bandwidth the curves are linear in seconds per Mbit, the x the crossover is given."""
    a, b = sweep(one_shot()), sweep(chatty())
    i = SWEEP_RTT_MS.index(50.0)
    order = sorted(range(len(SWEEP_MBIT)), key=lambda j: -SWEEP_MBIT[j])
    xs = [1.0 / SWEEP_MBIT[j] for j in order]
    ya, yb = [a[i][j] for j in order], [b[i][j] for j in order]
    x = crossover(xs, yb, ya)
    assert math.isclose(1.0 / x, 8.0 / (span_chatty(0.05) - 0.1 - 0.025), rel_tol=1e-9)
    stretches = cheapest(xs, {"one_shot": ya, "chatty": yb})
    assert [c for _, c in stretches] == ["one_shot", "chatty"] and math.isclose(stretches[1][0], x)


def test_crossover_on_sampled_lines():
    xs = [0.0, 1.0, 2.0, 4.0]
    assert math.isclose(crossover(xs, [1, 2, 3, 5], [0, 2.5, 3.5, 5.5]), 2 / 3)   # b - a: -1 at 0, 0.5 at 1
    assert crossover(xs, [1, 1, 1, 1], [2, 2, 2, 2]) == 0.0                 # holds at the first sample
    assert crossover(xs, [1, 1, 1, 1], [2, 2, 2, 2], factor=3.0) is None    # never 3x cheaper
    assert crossover(xs, [1, 1, 1, 1], [0, 0, 0, 4], factor=2.0) == 3.0     # 2 a <= b between 2 and 4
    with pytest.raises(ValueError, match="one length"):
        crossover(xs, [1, 2], [1, 2, 3, 4])
    # rising is least to 1.5 (where it meets flat), flat to 3.75 (where late falls to 2), then late
    assert cheapest(xs, {"flat": [2, 2, 2, 2], "rising": [0, 1, 3, 5], "late": [9, 9, 9, 1]}) == [
        (0.0, "rising"), (1.5, "flat"), (3.75, "late")]


def _doc(a: Trace, b: Trace) -> dict:
    """A network_matrix results document of two cells of one task, their sweeps from the traces."""
    def row(cell, trace):
        runs = {net: {"span_s": trace.span_s} for net in nm.PROFILES}
        return {"cell": cell, "runs": runs, "sweep_span_s": sweep(trace)}
    return {"sweep": {"rtt_ms": list(SWEEP_RTT_MS), "mbit_s": list(SWEEP_MBIT)},
            "rows": [row("psi_ecdh", a), row("psi_rr22", b)]}


def test_the_benchmark_reads_its_crossovers_from_the_stored_sweep():
    """network_matrix's "what to pick" finds the same crossover from a results document."""
    p = nm.pick(_doc(one_shot(), chatty()))
    (pair,) = p["pairs"]          # one_shot (psi_ecdh here) is the dearer at loopback
    assert (pair["a"], pair["b"]) == ("psi_ecdh", "psi_rr22")
    c = pair["crossover"]["RTT at 100 Mbit/s"]
    assert math.isclose(c["x"], (0.09 + 0.08) / ((HOPS - 1) / 2) * 1e3, rel_tol=1e-9) and not c["from_start"]
    (task,) = p["tasks"]
    assert [s["cell"] for s in task["cheapest"]["RTT at 100 Mbit/s"]] == ["psi_rr22", "psi_ecdh"]
    assert math.isclose(task["cheapest"]["RTT at 100 Mbit/s"][1]["x"], c["x"])
    assert task["measured"]["loopback"]["cell"] == "psi_rr22"
    assert any("psi_ecdh from 37.8 ms" in line for line in nm.pick_lines(_doc(one_shot(), chatty())))


def test_a_row_without_a_sweep_is_left_out_and_errors_over_the_bound_are_named():
    doc = _doc(one_shot(), chatty())
    doc["rows"].append({"cell": "psi_kkrt", "runs": {}, "error": "RuntimeError: lan: the audit failed"})
    assert [t["cells"] for t in nm.pick(doc)["tasks"]] == [["psi_ecdh", "psi_rr22"]]
    doc["rows"][0]["runs"]["lan"]["model_error"] = 0.2
    doc["rows"][1]["runs"]["wan"]["model_error"] = -0.1
    line = nm.over_bound_line(doc)
    assert "1 of 2" in line and "psi_ecdh at lan (+20%)" in line and "psi_rr22" not in line
