"""One aggregation interface, plain or secure, chosen by configuration.

A training loop calls, each round,

    agg = make_aggregator(settings, defaults)        # once per party (AggregationSettings)
    agg.submit(party, server, vector, weight, round) # on every client
    res = agg.aggregate(party, clients, round)       # on the server
    res.mean, res.sum, res.weight, res.mean_error_bound, res.contributors

and never looks at which one it got.  ``settings.aggregation`` picks it:

* ``"secure"`` (default): :mod:`fedhet.protocols.secagg` (Bonawitz et al.,
  SecAgg+ with ``secagg_graph = "harary"``); the server sees masked ring
  vectors only.  Settings: ``secagg_graph``, ``secagg_degree``,
  ``secagg_threshold``,
  ``secagg_ring_bits``, ``secagg_clip``, ``secagg_max_weight``,
  ``secagg_frac_bits``, ``secagg_timeout``.
* ``"plain"``: each client sends its vector (``plain_dtype``: float64, the
  default, or float32, which has the bytes of a 32-bit secure ring) and its
  weight; the server computes the weighted sum in float64.

Both compute ``sum_u w_u clip(x_u)`` with the same public bounds:
``secagg_clip`` (default 8; ``|x|`` is clipped to it) and, when set,
``secagg_max_weight`` (``0 < w <= max_weight``; secure aggregation always
needs it, default 1).  A client refuses its own input when it is not a finite
1-D vector or its weight is out of range (ValueError naming the party; nothing
is sent).  The plain server also checks what it receives, since a client
may run other code: an update that is malformed, holds NaN or inf, exceeds
the clipping bound or carries a weight out of range is rejected, the
offending client named in the log and in ``AggregateResult.rejected``, and
the round goes on without it, as for a client that stayed silent.  (The
secure server cannot see under the masks: it rejects malformed messages, but
a client with modified code can put any ring vector there.)

Both drop clients that stay silent past the per-step collection timeout
(``aggregation_timeout``, default the party's receive timeout) and aggregate
the rest; both ignore messages of earlier rounds, so a late client cannot
corrupt a later round.  ``mean_error_bound`` is the largest possible
difference, per coordinate, between ``mean`` and the exact weighted mean of
the clipped inputs: 0 for plain
float64 (exact up to float64 arithmetic), ``max |x| * 2**-24`` for plain
float32, and the quantisation bound of :class:`~fedhet.protocols.secagg.Quantizer`
for secure aggregation.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from fedhet.parties import schema as sch
from fedhet.parties.contract import PartyLike
from fedhet.parties.api import PeerFault
from fedhet.parties.declare import MessageDecl, declare

from . import secagg
from .aggregation_settings import AggregationSettings
from .secagg import (Faults, RoundInbox, SecAggClient, SecAggConfig, SecAggError, SecAggServer, SubmitResult,
                     check_input, check_round)

__all__ = ["Aggregator", "PlainAggregator", "SecureAggregator", "AggregateResult", "SubmitResult",
           "AggregationError", "make_aggregator", "declarations", "DECLARATIONS", "Kind", "METHODS"]



class Kind:
    """Plain aggregation's message kind (secure aggregation's are :class:`fedhet.protocols.secagg.Kind`)."""

    PLAIN = "agg/plain"


METHODS = ("plain", "secure")
AggregationError = SecAggError  # what both raise when a round cannot produce a result


@dataclass
class AggregateResult:
    sum: np.ndarray            # sum_u w_u x_u, float64
    weight: float              # sum_u w_u
    mean: np.ndarray           # sum / weight
    contributors: list[str]    # clients whose input is in the sum
    dropped: list[str]         # clients asked but not in the sum
    sum_error_bound: float     # per coordinate, see the module docstring
    mean_error_bound: float
    round: int
    method: str
    details: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)  # client -> why its update was refused (it is in dropped)


def note_exclusions(party: PartyLike, step: str, r: int, contributors: Iterable[str], asked: Iterable[str],
                    rejected: Mapping[str, str], timeout: float | None) -> None:
    """Record the round's excluded clients with the reason (``party.note_round``: result.json)."""
    got = set(contributors)
    excluded = {u: rejected.get(u) or (f"silent past the {timeout:g}s collection timeout" if timeout
                                       else "no input in time")
                for u in sorted(set(asked) - got)}
    party.note_round(step, r, sorted(got), excluded)


class Aggregator:
    """The interface: ``submit`` on clients, ``aggregate`` on the server; one object per party."""

    method = "?"

    def submit(self, party: PartyLike, server: str, vector, weight: float = 1.0, round: int = 0) -> SubmitResult:
        raise NotImplementedError

    def aggregate(self, party: PartyLike, clients: Iterable[str], round: int = 0,
                  length: int | None = None) -> AggregateResult:
        raise NotImplementedError


class PlainAggregator(Aggregator):
    """Clients send vectors in the clear; the reference the secure path is compared with.

    ``clip`` and ``max_weight``: the public bounds (see the module docstring).
    """

    method = "plain"

    def __init__(self, dtype: str = "float64", timeout: float | None = None, clip: float = SecAggConfig.clip,
                 max_weight: float = math.inf):
        if dtype not in ("float32", "float64"):
            raise ValueError(f"plain_dtype must be 'float32' or 'float64', got {dtype!r}")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"aggregation_timeout must be positive, got {timeout!r}")
        if not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
            raise ValueError(f"the clipping bound (secagg_clip) must be a positive finite number, got {clip!r}")
        if not (isinstance(max_weight, (int, float)) and max_weight > 0):
            raise ValueError(f"max_weight (secagg_max_weight) must be positive, got {max_weight!r}")
        self.dtype = np.dtype(dtype)
        self.timeout = timeout
        self.clip = float(clip)
        self.max_weight = float(max_weight)
        # What an honest client's clipped update can hold once cast to the wire dtype.
        self._wire_clip = float(self.dtype.type(self.clip))
        self._inbox: RoundInbox | None = None
        self._last: int | None = None

    def submit(self, party: PartyLike, server, vector, weight=1.0, round=0) -> SubmitResult:
        r = int(round)
        check_round(self._last, r)
        x, w = check_input(vector, weight, self.max_weight, who=party.name)
        self._last = r
        if x.size and (float(x.max()) > self.clip or float(x.min()) < -self.clip):
            x = np.clip(x, -self.clip, self.clip)
        amax = max(float(x.max()), -float(x.min())) if x.size and self.dtype == np.float32 else 0.0
        party.send(server, Kind.PLAIN, {"r": r, "x": x.astype(self.dtype, copy=False), "w": w, "amax": amax})
        return SubmitResult("ok", r)

    def check_update(self, p, length: int | None, size: int | None) -> str | None:
        """Why the server refuses a received update ``p`` (None: it is acceptable).

        ``size``: the length of the updates accepted so far this round.
        """
        x, w, amax = p["x"], p["w"], p["amax"]  # a 1-D float vector and two numbers (the schema checked)
        if x.dtype != self.dtype:
            return f"the update must be a 1-D {self.dtype.name} vector, got {x.dtype}"
        want = length if length is not None else size
        if want is not None and x.size != want:
            return f"the update has {x.size} elements, expected {want}"
        if not (math.isfinite(w) and 0 < w <= self.max_weight):
            return f"the weight must be a number in (0, max_weight={self.max_weight:g}], got {w!r}"[:200]
        if not (math.isfinite(amax) and amax >= 0):
            return f"amax must be a finite number >= 0, got {amax!r}"[:200]
        finite = np.isfinite(x)
        if not finite.all():
            i = int(np.argmin(finite))
            return f"the update contains NaN or inf (first at index {i}: {x[i]})"
        top = float(np.max(np.abs(x))) if x.size else 0.0
        if top > self._wire_clip:
            return f"|x| reaches {top:.6g}, beyond the public clipping bound {self.clip:g} (secagg_clip)"
        return None

    def aggregate(self, party: PartyLike, clients, round=0, length=None) -> AggregateResult:
        r = int(round)
        check_round(self._last, r)
        self._last = r
        if self._inbox is None:
            self._inbox = RoundInbox(party.log)
        clients = sorted(set(clients))
        timeout = float(self.timeout if self.timeout is not None else party.timeout)
        t0 = time.monotonic()
        deadline = party.now() + timeout
        acc = tmp = None
        wsum = e_sum = amax = 0.0
        got = []
        rejected = {}
        for u in clients:
            try:
                p = self._inbox.recv(party, u, Kind.PLAIN, r, deadline)
            except PeerFault as e:  # refused on receipt (e.g. a weight of inf), or out since: named, dropped
                party.log.warning("plain aggregation round %d: dropped %s: %s", r, u, e)
                rejected[u] = str(e)
                continue
            if p is None:
                party.log.info("plain aggregation round %d: %s dropped (silent for %gs)", r, u, timeout)
                continue
            why = self.check_update(p, length, None if acc is None else acc.size)
            if why:
                party.log.warning("plain aggregation round %d: rejected the update of %s and dropped it: %s",
                                  r, u, why)
                rejected[u] = why
                continue
            x, w = p["x"], p["w"]
            if acc is None:
                acc, tmp = np.zeros(x.size), np.empty(x.size)
            np.multiply(x, float(w), out=tmp, dtype=np.float64)  # w*x in float64 even for float32 updates
            acc += tmp
            wsum += float(w)
            a = float(p["amax"])
            e_sum += float(w) * a
            amax = max(amax, a)
            got.append(u)
        if not got:
            detail = f"; rejected: {rejected}" if rejected else ""
            raise AggregationError(f"plain aggregation round {r}: no client sent an acceptable update within "
                                   f"{timeout:g}s{detail}")
        assert acc is not None  # some update was accepted
        note_exclusions(party, "plain aggregation", r, got, clients, rejected, timeout)
        eps = 2.0 ** -24 * (1 + 2.0 ** -23) if self.dtype == np.float32 else 0.0
        return AggregateResult(sum=acc, weight=wsum, mean=acc / wsum, contributors=got,
                               dropped=sorted(set(clients) - set(got)), sum_error_bound=e_sum * eps,
                               mean_error_bound=amax * eps, round=r, method="plain",
                               details={"dtype": self.dtype.name, "seconds": time.monotonic() - t0},
                               rejected=rejected)


class SecureAggregator(Aggregator):
    """Secure aggregation (:mod:`fedhet.protocols.secagg`) behind the common interface."""

    method = "secure"

    def __init__(self, config: SecAggConfig | None = None, observer: Callable | None = None,
                 faults: Faults | Mapping[int, Faults] | None = None, noise: Callable | None = None):
        self.config = config or SecAggConfig()
        self._noise = noise  # DP: each client's share of the distributed noise (dp_noise.RingNoise)
        self._client: SecAggClient | None = None
        self._server: SecAggServer | None = None
        self._observer = observer
        self._faults = faults  # injected dropouts and late or stale messages: see secagg.Faults

    def submit(self, party: PartyLike, server, vector, weight=1.0, round=0) -> SubmitResult:
        if self._client is None:
            self._client = SecAggClient(self.config, self._faults, noise=self._noise)
        return self._client.submit(party, server, vector, weight, round)

    def aggregate(self, party: PartyLike, clients, round=0, length=None) -> AggregateResult:
        if self._server is None:
            self._server = SecAggServer(self.config, self._observer)
        clients = list(clients)
        res = self._server.aggregate(party, clients, round, length)
        note_exclusions(party, "secure aggregation", res.round, res.contributors, clients, res.rejected,
                        self.config.timeout)
        return AggregateResult(
            sum=res.sum, weight=res.weight, mean=res.mean, contributors=res.contributors, dropped=res.dropped,
            sum_error_bound=res.sum_error_bound, mean_error_bound=res.mean_error_bound, round=res.round,
            method="secure",
            details={"graph": res.graph, "degree": res.degree, "threshold": res.threshold,
                     "threshold_local": res.threshold_local, "frac_bits": res.frac_bits,
                     "ring_bits": res.ring_bits, "steps": res.steps},
            rejected=res.rejected)


# SecAggConfig's fields that AggregationSettings sets as ``secagg_<field>``
_SECAGG_FIELDS = ("graph", "degree", "threshold", "ring_bits", "clip", "max_weight", "frac_bits", "timeout",
                  "client_timeout")
_SECONDS_AND_BOUNDS = ("clip", "max_weight", "timeout", "client_timeout")


def secagg_config(s: AggregationSettings) -> SecAggConfig:
    """The secure aggregation protocol's configuration for the aggregation settings ``s`` (the keys set
    in ``s``; SecAggConfig's defaults for the rest; ``aggregation_timeout`` where ``secagg_timeout`` is unset)."""
    kw: dict[str, Any] = {f: getattr(s, "secagg_" + f) for f in _SECAGG_FIELDS if getattr(s, "secagg_" + f) is not None}
    if s.aggregation_timeout is not None:
        kw.setdefault("timeout", s.aggregation_timeout)
    for f in _SECONDS_AND_BOUNDS:
        if isinstance(kw.get(f), int) and not isinstance(kw[f], bool):
            kw[f] = float(kw[f])
    return SecAggConfig(**kw)


def make_aggregator(settings: AggregationSettings | None = None,
                    defaults: AggregationSettings | None = None,
                    faults: Faults | Mapping[int, Faults] | None = None) -> Aggregator:
    """The aggregator ``settings.over(defaults)`` names (``aggregation``, secure when unset): the run's
    aggregation settings, each unset key taking the algorithm's default.

    ``faults``: misbehaviour injected into this party's ``submit`` (a client vanishing after a step, for
    one :class:`~fedhet.protocols.secagg_client.Faults` in every round or a mapping round -> Faults);
    secure aggregation only (ValueError for plain, whose client sends a single message)."""
    s = (settings or AggregationSettings()).over(defaults)
    if s.method == "plain":
        if faults is not None:
            raise ValueError("injected faults (secagg Faults) need aggregation = 'secure', got 'plain'")
        bounds = secagg_config(AggregationSettings(secagg_clip=s.secagg_clip, secagg_max_weight=s.secagg_max_weight))
        return PlainAggregator(s.plain_dtype or "float64", s.aggregation_timeout, clip=bounds.clip,
                               max_weight=bounds.max_weight if s.secagg_max_weight is not None else math.inf)
    if s.method == "secure":
        return SecureAggregator(secagg_config(s), faults=faults)
    raise ValueError(f"aggregation must be one of {METHODS}, got {s.method!r}")


def declarations(length: int | None = None, max_length: int | None = None,
                 settings: AggregationSettings | None = None,
                 defaults: AggregationSettings | None = None) -> list[MessageDecl]:
    """The kinds the aggregator that ``make_aggregator(settings, defaults)`` makes sends, with the payloads
    its settings allow: only the chosen method's kinds (a plain update in a secure run is undeclared:
    refused on receipt and failed by the audit), plain updates of its ``plain_dtype``, masked ones of its
    ring.  Without ``settings`` and ``defaults``: both methods' kinds, any dtype.

    ``length`` (when the settings fix it) pins every update to that many elements (a masked one to
    ``length + 1``); ``max_length`` (the longest vector aggregated) bounds every received update
    (a plain one to ``max_length`` elements, a masked one to ``max_length + 1``), so no update
    outgrows what the settings call for."""
    method = plain_dtype = ring_bits = None
    if settings is not None or defaults is not None:
        s = (settings or AggregationSettings()).over(defaults)
        method = s.method
        if method not in METHODS:
            raise ValueError(f"aggregation must be one of {METHODS}, got {method!r}")
        plain_dtype = s.plain_dtype or "float64"
        ring_bits = s.secagg_ring_bits or SecAggConfig.ring_bits
    cap = secagg.DEFAULT_MAX_ELEMS if max_length is None else int(max_length)
    dtype = ("<f4", "<f8") if plain_dtype is None else np.dtype(plain_dtype).str
    plain = [declare(Kind.PLAIN, "client", "server", "a client's vector in the clear, its weight (and max |x|)",
                     payload=sch.Fields({
                         "r": sch.Int(),
                         "x": sch.Arr(dtype, (None if length is None else int(length),), max_elems=cap, finite=False),
                         # Values are the server's own per-round checks (check_update): a NaN, an inf or
                         # an out-of-range weight drops that update and names its sender.
                         "w": sch.Float(finite=False), "amax": sch.Float(finite=False)}),
                     # The aggregated vectors are model parameters/updates or predictions, not raw rows
                     # (each algorithm declares what it aggregates); nothing but CURVE hides them.
                     protects="derived")]
    secure = secagg.declarations(length, max_length, ring_bits)
    return (plain if method in (None, "plain") else []) + (secure if method in (None, "secure") else [])


DECLARATIONS = declarations()
