"""A cost model of a run under any network, from its transcripts (issue 48).

A loopback run's transcripts hold every message twice: the sender's ``send`` record and the
receiver's ``recv`` record (sizes, sequence numbers, times on the one clock of the machine).  The model
replays that dependency graph with a link profile (:mod:`fedhet.parties.netlink`) in between:

- a message is sent at its send record's time, shifted by how late its sender is running;
- it occupies its directed link from ``max(sent, link free)`` for ``size * 8 / bandwidth`` seconds and
  arrives one-way latency later, never earlier than the loopback run handed it over after sending it
  (the local sockets' own time is kept): exactly the emulator's schedule (:class:`LinkSchedule`);
- a party is as late as the latest message it has received so far: each of its records after a
  ``recv`` is shifted by at least that message's delay (the compute between records is the measured
  gap, so a party's measured compute time is kept); a message that came before the party's role began
  (``started_at`` in its result.json) delays it only by as much as it came after that;
- a party ends its measured tail after its last record, shifted as that record.

The assumption that a party waited for each message the moment it arrived makes the model an upper
bound where a party had slack (a message that came while it was busy would have been absorbed).
The predicted wall time is the measured one plus how much later the last party ends; so is the span
(:attr:`Trace.span_s`: from the moment every party's role ran to the last party's end, the part of a
run a network changes).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedhet.parties import runfolder as rf
from fedhet.parties.netlink import LinkProfile, parse_network


@dataclass
class Trace:
    """What the model reads of a run: every party's message records and end time, and the run's wall."""

    records: dict[str, list[dict]]          # party -> its msg records in order
    ended_at: dict[str, float]              # party -> epoch seconds it ended (its last record's if unknown)
    wall_s: float                           # the measured wall time of the run
    network: str = "loopback"
    started_at: dict[str, float] = field(default_factory=dict)   # party -> when its role began (if known)

    @property
    def span_s(self) -> float:
        """From the moment every party's role ran to the last party's end: what the network can change."""
        first = min((r[0]["t"] for r in self.records.values() if r), default=0.0)
        return max(self.ended_at.values()) - max([first, *self.started_at.values()])


@dataclass
class Prediction:
    network: str
    wall_s: float                 # predicted wall time
    measured_wall_s: float        # of the replayed run
    added_s: float                # predicted minus measured
    messages: int
    bytes: int
    on_link_s: float              # seconds, summed over messages, each spent on its simulated link
    party_end_shift_s: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class ModelError(ValueError):
    """A run the model cannot replay; the text says why."""


def load(run_dir: str | Path) -> Trace:
    """The trace of the run in ``run_dir`` (a finished run without restarts)."""
    run_dir = Path(run_dir)
    pdirs = sorted(p for p in (run_dir / rf.PARTIES).glob("*") if p.is_dir())
    if not pdirs:
        raise ModelError(f"{run_dir}: no parties/ folder (not a run folder)")
    records: dict[str, list[dict]] = {}
    ended: dict[str, float] = {}
    started: dict[str, float] = {}
    for pdir in pdirs:
        name = pdir.name
        path = pdir / rf.TRANSCRIPT
        if not path.is_file():
            raise ModelError(f"{run_dir}: party {name!r} has no transcript")
        recs = []
        for n, line in enumerate(path.read_text().splitlines()):
            try:
                rec = json.loads(line)
            except ValueError:
                raise ModelError(f"{path}: line {n + 1} is not JSON") from None
            if rec.get("type") == "resume":
                raise ModelError(f"{path}: the party restarted; the model replays runs without restarts")
            if rec.get("type") == "msg":
                recs.append(rec)
        records[name] = recs
        res = _read(pdir / rf.RESULT)
        ended[name] = float(res.get("ended_at") or (recs[-1]["t"] if recs else 0.0))
        if res.get("started_at"):
            started[name] = float(res["started_at"])
    summary = _read(run_dir / rf.RESULT)
    first = min((r[0]["t"] for r in records.values() if r), default=0.0)
    wall = float(summary.get("wall_s") or (max(ended.values()) - first))
    return Trace(records, ended, wall, str(summary.get("network") or "loopback"), started)


def _read(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def predict(trace: Trace, network: str | LinkProfile | None) -> Prediction:
    """The run of ``trace`` replayed over ``network`` (a profile, its text, or None: loopback)."""
    profile = parse_network(network) if isinstance(network, str) else network
    if trace.network != "loopback":
        raise ModelError(f"the run was made under network {trace.network!r}; the model replays loopback runs")
    sends: dict[tuple[str, str, int], dict] = {}
    for party, recs in trace.records.items():
        for r in recs:
            if r["dir"] == "send":
                sends[(party, r["peer"], r["seq"])] = r
    # every record, in measured order (a send before the recv of the same instant: causes first)
    events = sorted(((r["t"], r["dir"] != "send", party, r) for party, recs in trace.records.items() for r in recs),
                    key=lambda e: (e[0], e[1]))
    late: dict[str, float] = {p: 0.0 for p in trace.records}      # how much later each party runs now
    sent_at: dict[tuple[str, str, int], float] = {}                 # predicted send time of each message
    free: dict[tuple[str, str], float] = {}                         # directed link -> end of its last transmission
    last_due: dict[tuple[str, str], float] = {}
    on_link = 0.0
    n_msgs = n_bytes = 0
    for t, _, party, r in events:
        if r["dir"] == "send":
            sent_at[(party, r["peer"], r["seq"])] = t + late[party]
            continue
        src = r["peer"]
        s = sends.get((src, party, r["seq"]))
        s_pred = sent_at.get((src, party, r["seq"])) if s is not None else None
        if s is None or s_pred is None:   # no matching send record: its sender's delay is unknown
            continue
        n_msgs += 1
        n_bytes += int(r["bytes"])
        transit = max(0.0, t - s["t"])    # what the local sockets took on loopback
        if profile is None:
            due = s_pred + transit
        else:
            link = (src, party)
            start = max(s_pred, free.get(link, -math.inf))
            end = start + profile.transfer_s(int(r["bytes"]))
            free[link] = end
            on_link += end - start
            due = max(s_pred + transit, end + profile.one_way_s, last_due.get(link, -math.inf))
            last_due[link] = due
        # the party depends on the message from when it came, or from when its role began if it came
        # before (a message that reaches a party still loading its data delays nothing)
        late[party] = max(late[party], due - max(t, trace.started_at.get(party, t)))
    ends = {p: trace.ended_at[p] + late[p] for p in trace.records}
    added = max(ends.values()) - max(trace.ended_at.values())
    return Prediction(network=profile.name if profile else "loopback", wall_s=trace.wall_s + added,
                      measured_wall_s=trace.wall_s, added_s=added, messages=n_msgs, bytes=n_bytes,
                      on_link_s=on_link, party_end_shift_s=dict(late))


def predict_run(run_dir: str | Path, networks: tuple[str, ...] = ("lan", "wan")) -> dict[str, Prediction]:
    """The run in ``run_dir`` predicted at each of ``networks``."""
    trace = load(run_dir)
    return {n: predict(trace, n) for n in networks}


# ------------------------------------------------------------------ sweeps and crossovers

# The grids a sweep replays by default: round trips 0 and 0.1 ms .. 1 s (1, 1.5, 2, 3, 5, 7 per decade),
# bandwidths 1 Mbit/s .. 10 Gbit/s (1, 2, 5 per decade).  LAN (0.5 ms, 1 Gbit/s) and WAN (50 ms,
# 100 Mbit/s) lie on the grid.
SWEEP_RTT_MS = (0.0, *(round(m * 10.0 ** e, 6) for e in range(-1, 3) for m in (1, 1.5, 2, 3, 5, 7)), 1000.0)
SWEEP_MBIT = tuple(float(m * 10 ** e) for e in range(0, 4) for m in (1, 2, 5)) + (10000.0,)


def sweep(trace: Trace, rtts_ms=SWEEP_RTT_MS, mbits=SWEEP_MBIT) -> list[list[float]]:
    """The span (:attr:`Trace.span_s`) the model predicts for ``trace`` at every round trip of ``rtts_ms``
    and bandwidth of ``mbits``: ``[i][j]`` is at ``rtts_ms[i]``, ``mbits[j]``."""
    return [[trace.span_s + predict(trace, LinkProfile(f"{rtt:g},{mbit:g}", rtt / 1e3, mbit * 1e6)).added_s
             for mbit in mbits] for rtt in rtts_ms]


def crossover(xs, a, b, factor: float = 1.0) -> float | None:
    """The first ``x`` at which ``factor * a <= b`` holds, for curves ``a`` and ``b`` sampled at ``xs``
    (in the order given; linear between samples, so exact where both are linear between the two samples
    around it): ``xs[0]`` when it holds at the first sample, None when it holds at none."""
    if not len(xs) == len(a) == len(b) or not len(xs):
        raise ValueError(f"crossover: xs, a and b must be of one length > 0, got {len(xs)}, {len(a)}, {len(b)}")
    g = [y_b - factor * y_a for y_a, y_b in zip(a, b)]      # >= 0 where a (times factor) is no dearer
    if g[0] >= 0:
        return float(xs[0])
    for i in range(1, len(xs)):
        if g[i] >= 0:    # g went from < 0 at i - 1 to >= 0 at i
            return float(xs[i - 1] + (xs[i] - xs[i - 1]) * (-g[i - 1]) / (g[i] - g[i - 1]))
    return None


def cheapest(xs, curves: dict[str, list[float]]) -> list[tuple[float, str]]:
    """Which curve is least along ``xs``: ``(x where it becomes least, name)`` per stretch, in the order of
    ``xs``, the first at ``xs[0]``; a boundary is where the two stretches' curves cross (:func:`crossover`
    between the samples around it)."""
    names = list(curves)
    if not names:
        return []
    best = [min(names, key=lambda n: curves[n][i]) for i in range(len(xs))]
    out = [(float(xs[0]), best[0])]
    for i in range(1, len(xs)):
        if best[i] != best[i - 1]:
            p, q = best[i - 1], best[i]
            x = crossover(xs[i - 1:i + 1], curves[q][i - 1:i + 1], curves[p][i - 1:i + 1])
            out.append((float(xs[i]) if x is None else x, q))
    return out
