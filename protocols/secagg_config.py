"""Secure aggregation: the parameters every party agrees on, and the masking graph they define.

:class:`SecAggConfig` holds the settings (``secagg_*`` keys of an algorithm's
configuration); from the number n of clients it derives the minimum number t
of clients a round needs, the degree k of the masking graph and the local
Shamir threshold t_local (:meth:`SecAggConfig.t`, :meth:`~SecAggConfig.k`,
:meth:`~SecAggConfig.t_local`).  :func:`neighbours` places the clients on that
graph.

Graphs (``graph``).  ``"complete"``: every client masks with and shares among
all clients, threshold t of n (default ``threshold = 0.5``: t = floor(n/2) + 1,
a strict majority).  A round then survives any n - t dropouts (fewer than
half the clients), and the server learns no single input even colluding with
t - 1 clients.

``"harary"`` (SecAgg+, Bell et al. CCS 2020): the clients are placed on a ring
by a permutation derived from the run seed, tag and round (so the server does
not choose it), and each masks with and shares among its k nearest ring
neighbours (the Harary graph H(k, n)); its shares go to those k neighbours
plus itself, with threshold t_local.  Unless ``degree`` / ``local_threshold``
are given, :func:`harary_parameters` chooses the smallest even k, and for it
the largest t_local, such that

* the same dropouts as the complete graph are tolerated: when any n - t
  clients, chosen independently of the ring placement, drop out at any steps,
  every secret the server must reconstruct keeps t_local live holders (so the
  round completes), except with probability at most ``2**-CORRECTNESS_BITS``
  (2**-20; a union bound over the clients of hypergeometric tails, computed
  exactly);
* a coalition of ``floor(collusion * n)`` clients (default ``collusion = 0.1``)
  fixed independently of the placement holds fewer than t_local shares of
  every other client, so the server colluding with it learns no single input,
  except with probability at most ``2**-PRIVACY_BITS`` (2**-40).

The two pull against each other (a low t_local survives dropouts, a high one
resists collusion); they are met together only when k grows with the
dropout fraction, so k is O(log n) with a large constant: for n = 10, 20, 50,
100, 1000 the defaults are (k, t_local) = (6, 3), (12, 4), (28, 6), (48, 11),
(170, 50).  When no k < n - 1 meets both, the graph is the complete one.  An
explicit ``degree`` without ``local_threshold`` keeps the earlier rule
t_local = ceil(t (k + 1) / n), which resists collusion better but tolerates
far fewer dropouts.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import math
from dataclasses import dataclass
from math import comb

import msgpack
import numpy as np

from fedhet.crypto.prg import PRG
from fedhet.parties.api import PartyError, PeerFault, PeersDisagree, RoundFailed

from .secagg_quantizer import Quantizer

__all__ = ["SecAggError", "SecAggConfig", "neighbours", "neighbours_of", "harary_parameters", "CORRECTNESS_BITS", "PRIVACY_BITS"]

CORRECTNESS_BITS = 20  # SecAgg+ default: a round with n - t random dropouts fails w.p. <= 2**-20
PRIVACY_BITS = 40      # ... and a random coalition of the assumed size breaks a client w.p. <= 2**-40


class SecAggError(PartyError):
    """A secure-aggregation round failed (too few clients, bad message, failed check); nothing was released.
    Raised as such for this party's own settings; a round's failure is one of the three below, which
    say whom the evidence names (fedhet.parties.failure)."""


class SecAggFault(SecAggError, PeerFault):
    """A message of one party (the server's list or relay, a client's input) is wrong by itself: names it."""


class SecAggDisagree(SecAggError, PeersDisagree):
    """A client's signed or sealed message, relayed by the server, does not check: the client or the
    relaying server deviated, and nothing shows which.  Names neither."""


class SecAggRoundFailed(SecAggError, RoundFailed):
    """Too few clients completed a step, or the server stopped the round: names nobody."""



@dataclass(frozen=True)
class SecAggConfig:
    """Parameters every party of one federation must agree on.

    ``threshold``: a fraction in (0, 1) (t = floor(threshold * n) + 1, default
    0.5: a strict majority) or an int t >= 2.  ``degree``, ``local_threshold``,
    ``collusion``: the SecAgg+ graph (see the module docstring; ignored by the
    complete graph).  ``timeout``: seconds the server waits for each step's
    messages (None: the party's receive timeout).  ``client_timeout``: how long
    a client waits for the server (None: the party's timeout plus ``timeout``).
    """

    graph: str = "complete"
    degree: int | None = None
    threshold: float | int = 0.5
    ring_bits: int = 32
    clip: float = 8.0
    max_weight: float = 1.0
    frac_bits: int | None = None
    timeout: float | None = None
    client_timeout: float | None = None
    tag: str = "secagg"
    local_threshold: int | None = None
    collusion: float = 0.1

    def __post_init__(self):
        if self.graph not in ("complete", "harary"):
            raise ValueError(f"secagg graph must be 'complete' or 'harary', got {self.graph!r}")
        if self.ring_bits not in (32, 64):
            raise ValueError(f"secagg ring_bits must be 32 or 64, got {self.ring_bits!r}")
        if not (isinstance(self.clip, (int, float)) and math.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"secagg clip must be a positive finite number, got {self.clip!r}")
        if not (isinstance(self.max_weight, (int, float)) and math.isfinite(self.max_weight)
                and self.max_weight > 0):
            raise ValueError(f"secagg max_weight must be a positive finite number, got {self.max_weight!r}")
        th = self.threshold
        if isinstance(th, bool) or not isinstance(th, (int, float)):
            raise ValueError(f"secagg threshold must be a fraction in (0, 1) or an int >= 2, got {th!r}")
        if isinstance(th, float) and not 0 < th < 1:
            raise ValueError(f"secagg threshold as a fraction must be in (0, 1), got {th!r}")
        if isinstance(th, int) and th < 2:
            raise ValueError(f"secagg threshold as a count must be >= 2, got {th!r}")
        if self.degree is not None and (isinstance(self.degree, bool) or not isinstance(self.degree, int)
                                        or self.degree < 2):
            raise ValueError(f"secagg degree must be an int >= 2, got {self.degree!r}")
        lt = self.local_threshold
        if lt is not None and (isinstance(lt, bool) or not isinstance(lt, int) or lt < 2):
            raise ValueError(f"secagg local_threshold must be an int >= 2, got {lt!r}")
        c = self.collusion
        if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0 <= c < 0.5:
            raise ValueError(f"secagg collusion must be a fraction in [0, 0.5), got {c!r}")
        if self.frac_bits is not None and (not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits < 62):
            raise ValueError(f"secagg frac_bits must be an int in [0, 62), got {self.frac_bits!r}")
        for name in ("timeout", "client_timeout"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"secagg {name} must be a positive number of seconds, got {v!r}")

    # -- derived parameters, functions of the number n of clients -------------
    def t(self, n: int) -> int:
        """Minimum number of clients for a round (and Shamir threshold of the complete graph)."""
        if n < 2:
            raise SecAggError(f"secure aggregation needs at least 2 clients, got {n}")
        t = self.threshold if isinstance(self.threshold, int) else int(math.floor(self.threshold * n)) + 1
        if t > n:
            raise SecAggError(f"secagg threshold t={t} exceeds the number of clients n={n}")
        return max(2, t)

    def _graph(self, n: int) -> tuple[int, int]:
        """(k, t_local) for n clients."""
        t = self.t(n)
        if self.graph == "complete":
            return n - 1, t
        if self.degree is None:
            k, tl = harary_parameters(n, t, float(self.collusion))
        else:
            k = self.degree + self.degree % 2  # H(k, n) on a ring: k/2 neighbours on each side
            tl = None
        if k >= n - 1:
            return n - 1, t
        if self.local_threshold is not None:
            tl = self.local_threshold
        elif tl is None:
            tl = max(2, math.ceil(t * (k + 1) / n))
        if tl > k + 1:
            raise SecAggError(f"secagg local_threshold={tl} exceeds the {k + 1} share holders of a client "
                              f"(degree k={k}); lower it or raise secagg_degree")
        return k, tl

    def k(self, n: int) -> int:
        """Neighbours per client: n - 1 for the complete graph, the Harary degree otherwise."""
        return self._graph(n)[0]

    def t_local(self, n: int) -> int:
        """Shamir threshold among one client's k + 1 share holders."""
        return self._graph(n)[1]

    def quantizer(self, n: int) -> Quantizer:
        return Quantizer(self.ring_bits, self.clip, self.max_weight, n, self.frac_bits)


# ------------------------------------------------------------- SecAgg+ degree
def _tail_counts(pop: int, good: int, draws: int) -> list[int]:
    """``c[x]`` = number of ``draws``-subsets of a ``pop``-set with ``good`` marked holding exactly x marked."""
    return [comb(good, x) * comb(pop - good, draws - x) for x in range(draws + 1)]


@functools.lru_cache(maxsize=512)
def harary_parameters(n: int, t: int, collusion: float) -> tuple[int, int]:
    """SecAgg+'s default (degree k, local threshold t_local) for n clients and round threshold t.

    The smallest even k < n - 1, and for it the largest t_local >= 2, with
    (exact integer arithmetic, union bounds over the n clients):

    * n * P[a client keeps fewer than t_local live holders] <= 2**-CORRECTNESS_BITS
      when exactly t of the n clients remain, chosen at random: a client
      that remains has 1 + Hyp(n - 1, t - 1, k) live holders (itself and its
      live neighbours), one that dropped after sharing Hyp(n - 1, t, k);
    * n * P[Hyp(n - 1, c, k) >= t_local] <= 2**-PRIVACY_BITS for a random
      coalition of c = floor(collusion * n) clients among an honest client's k
      neighbours.

    (n - 1, t), the complete graph, when no such k exists.
    """
    c = int(math.floor(collusion * n))
    for k in range(2, n - 1, 2):
        total = comb(n - 1, k)
        below_alive = list(itertools.accumulate(_tail_counts(n - 1, t - 1, k)))  # P[X <= x] * total
        below_gone = list(itertools.accumulate(_tail_counts(n - 1, t, k)))       # P[Y <= y] * total
        best = 0
        for tl in range(2, k + 2):
            fails = max(below_alive[tl - 2], below_gone[tl - 1])  # P[1 + X < tl], P[Y < tl]
            if (n * fails) << CORRECTNESS_BITS > total:
                break
            best = tl
        if best < 2:
            continue
        if c and (n * sum(_tail_counts(n - 1, c, k)[best:])) << PRIVACY_BITS > total:
            continue
        return k, best
    return n - 1, t


# ----------------------------------------------------------------- graph
def _ring(universe: list[str], cfg: SecAggConfig, seed: int, run_id: str, r: int) -> list[str]:
    """The clients in ring order (SecAgg+): a permutation every party derives alike from the run seed,
    tag and round, so the server cannot place a victim among clients of its choosing."""
    digest = hashlib.sha256(msgpack.packb(["fedhet/secagg/harary/v1", int(seed), run_id, cfg.tag, int(r),
                                           list(universe)])).digest()
    keys = PRG(digest).uint64(len(universe))
    return [universe[i] for i in np.argsort(keys, kind="stable")]


def neighbours(universe: list[str], cfg: SecAggConfig, seed: int, run_id: str, r: int) -> dict[str, frozenset]:
    """Each client's masking neighbours: all others, or its Harary-graph neighbours."""
    n = len(universe)
    k = cfg.k(n)
    if k >= n - 1:
        return {u: frozenset(v for v in universe if v != u) for u in universe}
    order = _ring(universe, cfg, seed, run_id, r)
    pos = {u: i for i, u in enumerate(order)}
    half = k // 2
    return {u: frozenset(order[(pos[u] + d) % n] for d in range(-half, half + 1) if d) for u in universe}


def neighbours_of(me: str, universe: list[str], cfg: SecAggConfig, seed: int, run_id: str, r: int) -> frozenset:
    """``neighbours(...)[me]`` without the others' sets: what one client needs (k names, not n sets)."""
    n = len(universe)
    k = cfg.k(n)
    if k >= n - 1:
        return frozenset(v for v in universe if v != me)
    order = _ring(universe, cfg, seed, run_id, r)
    at = order.index(me)
    return frozenset(order[(at + d) % n] for d in range(-(k // 2), k // 2 + 1) if d)
