"""Link profiles: a simulated network between the parties of one machine.

``[federation] network`` names the link every pair of parties talks over:

- ``"loopback"`` (the default): no shaping, messages are delivered as the sockets hand them over;
- ``"lan"``: 0.5 ms round trip, 1 Gbit/s;
- ``"wan"``: 50 ms round trip, 100 Mbit/s;
- ``"RTT_MS,MBIT"``: any round trip in milliseconds and bandwidth in Mbit/s (``"20,1000"``).

The schedule (:class:`LinkSchedule`) is that of a store-and-forward link per directed pair of parties:
a message from P starts its transmission when P sent it or when P's previous message on this link
finished, whichever is later; it takes ``size * 8 / bandwidth`` seconds on the link and arrives one-way
latency (RTT / 2) after its last bit left.  It is handed to the receiver's mailbox at that time and
never earlier than the local socket delivered it.  Messages of one link keep their order.

:class:`LinkShaper` applies the schedule at the receiver of a ZeroMQ party, after CURVE has
decrypted and authenticated the frames and before the party's checks (``Party._deliver``): the
encryption stays end to end, and the transcript records a message when the simulated link hands it
over, exactly as on a real network.  ``sent_at`` is the time the first frame of the message reached the
receiver (a streamed message's start), so the time the local sockets took is not counted twice.

The same schedule drives the cost model (:mod:`fedhet.parties.ops.netmodel`), which replays a loopback
run's transcripts under any profile.
"""
from __future__ import annotations

import heapq
import itertools
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

#: The named profiles: (round trip in ms, bandwidth in Mbit/s); loopback is no shaping at all.
NAMED: dict[str, tuple[float, float] | None] = {"loopback": None, "lan": (0.5, 1000.0), "wan": (50.0, 100.0)}


@dataclass(frozen=True)
class LinkProfile:
    """One link's round trip (seconds) and bandwidth (bits per second); the same on every directed link."""

    name: str
    rtt_s: float
    bits_per_s: float

    @property
    def one_way_s(self) -> float:
        return self.rtt_s / 2.0

    def transfer_s(self, nbytes: int) -> float:
        """Seconds ``nbytes`` occupy the link."""
        return nbytes * 8.0 / self.bits_per_s

    def as_dict(self) -> dict[str, Any]:
        return {"network": self.name, "rtt_ms": self.rtt_s * 1e3, "mbit_s": self.bits_per_s / 1e6}


def parse_network(text: str) -> LinkProfile | None:
    """The profile ``text`` names (None: loopback, no shaping); ValueError saying what is accepted."""
    if not isinstance(text, str):
        raise ValueError(f"network must be a string, got {text!r}")
    key = text.strip().lower()
    if key in NAMED:
        spec = NAMED[key]
        return None if spec is None else LinkProfile(key, spec[0] / 1e3, spec[1] * 1e6)
    parts = key.split(",")
    try:
        if len(parts) != 2:
            raise ValueError
        rtt_ms, mbit = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"network must be \"loopback\", \"lan\", \"wan\" or \"RTT_MS,MBIT\" (e.g. \"20,100\"), "
                         f"got {text!r}") from None
    if not (math.isfinite(rtt_ms) and rtt_ms >= 0):
        raise ValueError(f"network {text!r}: the round trip must be a finite number of milliseconds >= 0")
    if not (math.isfinite(mbit) and mbit > 0):
        raise ValueError(f"network {text!r}: the bandwidth must be a finite number of Mbit/s > 0")
    return LinkProfile(f"{rtt_ms:g},{mbit:g}", rtt_ms / 1e3, mbit * 1e6)


def describe(profile: LinkProfile | None) -> dict[str, Any]:
    """What a run folder records of its network (loopback: no shaping)."""
    if profile is None:
        return {"network": "loopback", "rtt_ms": None, "mbit_s": None}
    return profile.as_dict()


class LinkSchedule:
    """Delivery times on the directed links into one party (pure: the caller supplies every time)."""

    def __init__(self, profile: LinkProfile) -> None:
        self.profile = profile
        self._free: dict[str, float] = {}   # sender -> when its link finishes the last transmission
        self._last: dict[str, float] = {}   # sender -> due time of its last message (order per link)

    def due(self, peer: str, nbytes: int, sent_at: float, arrived_at: float) -> float:
        """When the message of ``nbytes`` from ``peer``, sent at ``sent_at`` and handed over locally at
        ``arrived_at``, reaches the receiver over the simulated link."""
        start = max(sent_at, self._free.get(peer, -math.inf))
        end = start + self.profile.transfer_s(nbytes)
        self._free[peer] = end
        t = max(arrived_at, end + self.profile.one_way_s, self._last.get(peer, -math.inf))
        self._last[peer] = t
        return t


class LinkShaper:
    """Holds each received message until its link delivers it (:class:`LinkSchedule`), then calls
    ``deliver(frames, authenticated)`` from its own thread, in due order (per link: arrival order)."""

    def __init__(self, profile: LinkProfile, deliver: Callable[[list, str | None], Any], name: str = "",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.schedule = LinkSchedule(profile)
        self._deliver, self._clock = deliver, clock
        self._heap: list[tuple[float, int, list, str | None]] = []
        self._count = itertools.count()
        self._first: dict[str, float] = {}   # sender -> when the first frame of its next message came
        self._cv = threading.Condition()
        self._halt = False
        self.held_s = 0.0      # seconds messages were held past their local delivery, all links together
        self.messages = 0
        self.thread = threading.Thread(target=self._run, name=f"link-{name}", daemon=True)
        self.thread.start()

    def heard(self, peer: str | None) -> None:
        """A frame of ``peer``'s next message reached this party (the first one starts its transmission)."""
        if peer is not None:
            with self._cv:
                self._first.setdefault(peer, self._clock())

    def put(self, peer: str, frames: list, authenticated: str | None) -> None:
        """A whole message from ``peer`` handed over by the local socket now."""
        nbytes = sum(len(memoryview(f)) for f in frames)
        with self._cv:
            now = self._clock()
            due = self.schedule.due(peer, nbytes, min(now, self._first.pop(peer, now)), now)
            self.held_s += due - now
            self.messages += 1
            heapq.heappush(self._heap, (due, next(self._count), frames, authenticated))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._halt:
                    wait = self._heap[0][0] - self._clock() if self._heap else None
                    if wait is not None and wait <= 0:
                        break
                    self._cv.wait(wait)
                if self._halt:
                    return
                _, _, frames, user = heapq.heappop(self._heap)
            self._deliver(frames, user)

    def close(self) -> None:
        """Stop; messages still on the simulated link are dropped (the party is closing)."""
        with self._cv:
            self._halt = True
            self._cv.notify()
        self.thread.join(timeout=2)

    def stats(self) -> dict[str, Any]:
        return {**self.schedule.profile.as_dict(), "messages": self.messages, "held_s": self.held_s}
