"""Secure aggregation: Bonawitz et al. (CCS 2017), with the SecAgg+ graph of Bell et al. (CCS 2020).

The server learns ``sum_u w_u * clip(x_u)`` and ``sum_u w_u`` over the clients
that completed the round, and nothing else about any single ``x_u`` or ``w_u``:
what it receives from a client is a vector masked with uniformly random ring
elements, and Shamir shares it can open only for the masks the protocol lets
it remove.  One call to :meth:`SecAggServer.aggregate` (server) and
:meth:`SecAggClient.submit` (each client) is one protocol instance with fresh
keys and seeds; ``round`` names the instance and must increase from call to
call on one object.

Rounds (Bonawitz et al., Fig. 4; every message carries ``r``, the round):

0. **Advertise keys.**  Client ``u`` makes two X25519 key pairs, ``c_u`` (to
   seal shares) and ``s_u`` (to agree pairwise mask seeds), and a 256-bit
   self-mask seed ``b_u``.  It signs ``(tag, run, r, u, c_u^PK, s_u^PK,
   H(b_u))`` with its Ed25519 identity key and sends it (``secagg/keys``).
   The server relays to each client the signed keys of its neighbours that
   advertised (U1; ``secagg/keylist``); clients verify every signature and
   that all public keys are distinct.
1. **Share keys.**  ``u`` splits ``b_u`` and ``s_u^SK`` into t-of-n Shamir
   shares over GF(2**61 - 1) (:mod:`fedhet.crypto.shamir`), seals the shares
   for neighbour ``v`` with AES-256-GCM under ``HKDF(X25519(c_u^SK, c_v^PK))``
   (associated data: tag, run, round, u, v) and sends the sealed shares to the
   server (``secagg/shares``), which relays each to its addressee with the set
   U2 of clients that shared (``secagg/relay``).
2. **Masked input.**  ``u`` sends (``secagg/masked``)
   ``y_u = q_u + PRG(b_u) + sum_{v in N(u) and U2, v > u} PRG(s_uv)
   - sum_{v in N(u) and U2, v < u} PRG(s_uv)  (mod 2**32 or 2**64)``,
   ``s_uv = HKDF(X25519(s_u^SK, s_v^PK))`` (256 bits), PRG = the AES-256-CTR
   :class:`~fedhet.crypto.prg.PRG` with the full 256-bit seed.  (Flower's
   SecAgg+ folds the shared secret into a 32-bit seed for numpy's Mersenne
   Twister; here the seed is the whole key and the generator a cipher.)
3. **Unmasking.**  The server names the clients whose masked input arrived
   (U3; ``secagg/unmask_request``).  Each client of U3 returns, for every
   client whose shares it holds, the share of ``b`` if that client is in U3 and
   the share of ``s^SK`` if it dropped after sharing (U2 minus U3), never both
   (``secagg/unmask``).  The server reconstructs, checks each ``b_u`` against
   its signed hash and each ``s_v^SK`` against ``s_v^PK``, and subtracts
   ``PRG(b_u)`` for u in U3 and the dropped clients' pairwise masks.

Identity keys and trust.  Each client makes a fresh Ed25519 identity key per
run (per :class:`SecAggClient` object) and sends its public half once, directly
to every other client over the federation's transport (``secagg/ident``).
That transport is CURVE-authenticated against the federation file, so the
federation's transport keys are the PKI binding identity keys to parties
(Bonawitz et al. assume such a PKI for the active-adversary variant); the
server, which relays the signed key lists, cannot substitute keys unnoticed.
The threat model otherwise is theirs: an honest-but-curious server, possibly
colluding with fewer than t clients.

Graphs (``graph``).  ``"complete"``: every client masks with and shares among
all clients, threshold t of n.  ``"harary"`` (SecAgg+): the clients are placed
on a ring by a permutation derived from the run seed, tag and round (so the
server does not choose it), and each masks with and shares among its k
nearest ring neighbours (the Harary graph H(k, n); default
``k = 2 * ceil(log2 n)``, even, O(log n)).  Its shares go to those k
neighbours plus itself, with the threshold scaled to that neighbourhood:
``t_local = ceil(t * (k + 1) / n)`` (at least 2).

Dropouts.  The server collects each step until all expected clients answered
or ``timeout`` seconds passed; the silent are dropped from then on (and told
so if they come back, with a ``dropped`` notice in place of the next message
they wait for).  The round goes on while at least ``t`` clients remain and
every needed secret still has ``t_local`` share holders; otherwise it fails
with :class:`SecAggError` and the server releases nothing (the remaining
clients get an ``abort`` notice and raise too).  A message from an earlier
round is discarded when read, so a late client cannot corrupt a later round;
a message from a later round is kept for it.

Quantisation and the error bound.  A client clips its vector to
``[-clip, clip]``, multiplies it by its weight ``w`` (sample count, MMVFL's
``zeta_k``; ``0 < w <= max_weight``) and rounds to the grid ``2**-f``; ``w``
itself travels as one extra coordinate, so the server learns only
``sum w``.  ``f`` (``frac_bits``) is the largest that keeps
``n * (max_weight * max(clip, 1) * 2**f + 1/2) < 2**(bits - 1)`` (no sum can
wrap) and ``n * max_weight * max(clip, 1) * 2**f <= 2**52`` (float64 exact).
Each coordinate's rounding error is at most ``2**-(f + 1)``, so with ``s``
contributing clients

    |sum - sum_u w_u clip(x_u)|  <=  e_sum  = s * (2**-(f+1) + max_weight * clip * 2**-52)
    |sum w - sum_u w_u|          <=  e_w    = s * (2**-(f+1) + max_weight * 2**-52)
    |mean - exact mean|          <=  (e_sum + clip * e_w) / (sum w) + clip * 2**-51

(the ``2**-52`` terms cover float64 rounding of ``w * x``; for the mean,
``|S'/W' - S/W| <= (|S' - S| + |S/W| |W' - W|) / W'`` with ``|S/W| <= clip``).
Both bounds come back with the result.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import msgpack
import numpy as np

from fedhet.crypto import keys as ck
from fedhet.crypto.field import F61
from fedhet.crypto.prg import PRG, SEED_BYTES, random_seed
from fedhet.crypto.shamir import reconstruct, share
from fedhet.parties.api import PartyError, PeerTimeout
from fedhet.parties.declare import MessageDecl, declare, no_arrays

__all__ = [
    "SecAggConfig", "SecAggClient", "SecAggServer", "SecAggResult", "SubmitResult", "SecAggError",
    "Quantizer", "check_input", "neighbours", "apply_masks", "RoundInbox", "DECLARATIONS", "declarations",
    "KIND_IDENT", "KIND_KEYS", "KIND_KEYLIST", "KIND_SHARES", "KIND_RELAY", "KIND_MASKED",
    "KIND_UNMASK_REQUEST", "KIND_UNMASK",
]

KIND_IDENT = "secagg/ident"
KIND_KEYS = "secagg/keys"
KIND_KEYLIST = "secagg/keylist"
KIND_SHARES = "secagg/shares"
KIND_RELAY = "secagg/relay"
KIND_MASKED = "secagg/masked"
KIND_UNMASK_REQUEST = "secagg/unmask_request"
KIND_UNMASK = "secagg/unmask"

STEPS = ("advertise", "share", "masked", "unmask")
_SIG_LABEL = "fedhet/secagg/keys/v1"
# One 32-byte secret is 5 elements of GF(2**61 - 1) (7 bytes each).
_ELEMS = -(-SEED_BYTES // F61.bytes_per_element)
# Elements per chunk of the masking loops: the chunk of the output and one
# chunk of keystream stay in L2 while every mask is added to it.
_CHUNK = 1 << 15


class SecAggError(PartyError):
    """A secure-aggregation round failed (too few clients, bad message, failed check); nothing was released."""


# ----------------------------------------------------------------- config
@dataclass(frozen=True)
class SecAggConfig:
    """Parameters every party of one federation must agree on.

    ``threshold``: a fraction in (0, 1) (t = floor(threshold * n) + 1, default
    0.5: a strict majority) or an int t >= 2.  ``timeout``: seconds the server
    waits for each step's messages (None: the party's receive timeout).
    ``client_timeout``: how long a client waits for the server (None: the
    party's timeout plus ``timeout``).
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
        if self.degree is not None and (not isinstance(self.degree, int) or self.degree < 2):
            raise ValueError(f"secagg degree must be an int >= 2, got {self.degree!r}")
        if self.frac_bits is not None and (not isinstance(self.frac_bits, int) or not 0 <= self.frac_bits < 62):
            raise ValueError(f"secagg frac_bits must be an int in [0, 62), got {self.frac_bits!r}")
        for name in ("timeout", "client_timeout"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"secagg {name} must be a positive number of seconds, got {v!r}")

    @classmethod
    def from_cfg(cls, cfg: dict | None, prefix: str = "secagg_") -> "SecAggConfig":
        """Read ``secagg_graph``, ``secagg_clip``, ... from a flat algorithm configuration."""
        cfg = cfg or {}
        kw = {}
        for f in cls.__dataclass_fields__:
            if prefix + f in cfg:
                kw[f] = cfg[prefix + f]
        for k in ("clip", "max_weight", "timeout", "client_timeout"):
            if isinstance(kw.get(k), int) and not isinstance(kw[k], bool):
                kw[k] = float(kw[k])
        return cls(**kw)

    # -- derived parameters, functions of the number n of clients -------------
    def t(self, n: int) -> int:
        """Minimum number of clients for a round (and Shamir threshold of the complete graph)."""
        if n < 2:
            raise SecAggError(f"secure aggregation needs at least 2 clients, got {n}")
        t = self.threshold if isinstance(self.threshold, int) else int(math.floor(self.threshold * n)) + 1
        if t > n:
            raise SecAggError(f"secagg threshold t={t} exceeds the number of clients n={n}")
        return max(2, t)

    def k(self, n: int) -> int:
        """Neighbours per client: n - 1 for the complete graph, the Harary degree otherwise."""
        if self.graph == "complete":
            return n - 1
        k = self.degree if self.degree is not None else 2 * math.ceil(math.log2(max(n, 2)))
        k += k % 2  # H(k, n) on a ring: k/2 neighbours on each side
        return min(k, n - 1)

    def t_local(self, n: int) -> int:
        """Shamir threshold among one client's k + 1 share holders."""
        k = self.k(n)
        if k == n - 1:
            return self.t(n)
        return min(k + 1, max(2, math.ceil(self.t(n) * (k + 1) / n)))

    def quantizer(self, n: int) -> "Quantizer":
        return Quantizer(self.ring_bits, self.clip, self.max_weight, n, self.frac_bits)


# ----------------------------------------------------------- quantisation
class Quantizer:
    """Clip, weight and round to the fixed-point grid of ``Z/2**bits``; decode sums (see the module docstring)."""

    def __init__(self, ring_bits: int, clip: float, max_weight: float, n: int, frac_bits: int | None = None):
        self.ring_bits, self.clip, self.max_weight, self.n = int(ring_bits), float(clip), float(max_weight), int(n)
        self.dtype = np.dtype(np.uint32 if self.ring_bits == 32 else np.uint64)
        self.sdtype = np.dtype(np.int32 if self.ring_bits == 32 else np.int64)
        mag = self.n * self.max_weight * max(self.clip, 1.0)  # worst |sum| in units of 2**f
        limit = 2.0 ** (self.ring_bits - 1) - 1 - self.n / 2
        fmax = min(math.floor(math.log2(limit / mag)), math.floor(52 - math.log2(mag)), 61)
        if frac_bits is None:
            if fmax < 0:
                raise ValueError(f"secagg: {self.n} clients x max_weight {self.max_weight:g} x clip "
                                 f"{self.clip:g} do not fit a {self.ring_bits}-bit ring; lower them or use 64 bits")
            frac_bits = fmax
        elif frac_bits > fmax:
            raise ValueError(f"secagg frac_bits={frac_bits} lets the sum of {self.n} clients (max_weight "
                             f"{self.max_weight:g}, clip {self.clip:g}) wrap a {self.ring_bits}-bit ring; "
                             f"use at most {fmax}")
        self.frac_bits = int(frac_bits)
        self.scale = math.ldexp(1.0, self.frac_bits)

    def encode_into(self, out: np.ndarray, x: np.ndarray, w: float, lo: int, hi: int, tmp: np.ndarray) -> None:
        """Quantise coordinates ``lo:hi`` of ``(x, w)`` (index ``len(x)`` is the weight) into ``out[lo:hi]``."""
        m = x.size
        so = out.view(self.sdtype)
        xe = min(hi, m)
        if lo < xe:
            f = tmp[: xe - lo]
            lim = self.clip * w * self.scale
            np.multiply(x[lo:xe], w * self.scale, out=f)
            np.clip(f, -lim, lim, out=f)
            np.rint(f, out=f)
            np.copyto(so[lo:xe], f, casting="unsafe")  # in range by construction of frac_bits
        if lo <= m < hi:
            so[m] = round(w * self.scale)

    def decode(self, acc: np.ndarray) -> tuple[np.ndarray, float]:
        vals = np.ldexp(acc.view(self.sdtype).astype(np.float64), -self.frac_bits)
        return vals[:-1], float(vals[-1])

    def bounds(self, contributors: int, weight_sum: float) -> tuple[float, float]:
        """(bound on |sum error| per coordinate, bound on |mean error| per coordinate)."""
        half = math.ldexp(1.0, -(self.frac_bits + 1))
        e_sum = contributors * (half + self.max_weight * self.clip * 2.0 ** -52)
        e_w = contributors * (half + self.max_weight * 2.0 ** -52)
        e_mean = (e_sum + self.clip * e_w) / weight_sum + self.clip * 2.0 ** -51 if weight_sum > 0 else math.inf
        return e_sum, e_mean


def check_input(vector, weight, max_weight: float) -> tuple[np.ndarray, float]:
    """The input as a contiguous float64 vector and the weight as a float; clear errors otherwise."""
    x = np.asarray(vector)
    if x.ndim != 1:
        raise ValueError(f"secagg input must be a 1-D vector, got shape {x.shape}")
    if x.dtype.kind not in "fiu":
        raise TypeError(f"secagg input must be real numbers, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("secagg input contains NaN or inf")
    try:
        w = float(weight)
    except (TypeError, ValueError):
        raise TypeError(f"secagg weight must be a number, got {weight!r}") from None
    if not (math.isfinite(w) and 0 < w <= max_weight):
        raise ValueError(f"secagg weight must be in (0, max_weight={max_weight:g}], got {w!r} "
                         "(raise secagg_max_weight)")
    return x, w


# ----------------------------------------------------------------- graph
def neighbours(universe: list[str], cfg: SecAggConfig, seed: int, run_id: str, r: int) -> dict[str, frozenset]:
    """Each client's masking neighbours: all others, or its Harary-graph neighbours."""
    n = len(universe)
    k = cfg.k(n)
    if k >= n - 1:
        return {u: frozenset(v for v in universe if v != u) for u in universe}
    # Ring positions from a permutation every party derives alike, so the
    # server cannot place a victim among clients of its choosing.
    digest = hashlib.sha256(msgpack.packb(["fedhet/secagg/harary/v1", int(seed), run_id, cfg.tag, int(r),
                                           list(universe)])).digest()
    keys = PRG(digest).uint64(n)
    order = [universe[i] for i in np.argsort(keys, kind="stable")]
    pos = {u: i for i, u in enumerate(order)}
    half = k // 2
    return {u: frozenset(order[(pos[u] + d) % n] for d in range(-half, half + 1) if d) for u in universe}


# ---------------------------------------------------------------- results
@dataclass
class SecAggResult:
    """What the server learns: the weighted sum, the weight sum, and who contributed."""

    sum: np.ndarray
    weight: float
    mean: np.ndarray
    contributors: list[str]
    dropped: list[str]
    sum_error_bound: float
    mean_error_bound: float
    round: int
    frac_bits: int
    ring_bits: int
    threshold: int
    threshold_local: int
    graph: str
    degree: int
    steps: dict = field(default_factory=dict)  # step -> clients that completed it, and seconds


@dataclass
class SubmitResult:
    status: str  # "ok" (unmasking shares sent) or "dropped" (the server went on without us) or "stopped"
    round: int
    reason: str = ""


# ------------------------------------------------------------- utilities
def _ctx(cfg: SecAggConfig, run_id: str, r: int) -> bytes:
    return msgpack.packb(["fedhet/secagg/v1", cfg.tag, run_id, int(r)])


def _sig_message(cfg: SecAggConfig, run_id: str, r: int, name: str, c_pk: bytes, s_pk: bytes,
                 commit: bytes) -> bytes:
    return msgpack.packb([_SIG_LABEL, cfg.tag, run_id, int(r), name, c_pk, s_pk, commit])


def _commit(b: bytes) -> bytes:
    return hashlib.sha256(b"fedhet/secagg/self-mask/v1" + b).digest()


def _is_bytes(v, n: int | None = None) -> bool:
    return isinstance(v, (bytes, bytearray)) and (n is None or len(v) == n)


def apply_masks(acc: np.ndarray, masks: Iterable[tuple[bytes, int]], quant: Quantizer | None = None,
                x: np.ndarray | None = None, w: float = 0.0) -> None:
    """``acc += sum sign * PRG(seed)`` in the ring, chunk by chunk (each PRG's stream read in order).

    With ``quant``, each chunk of ``acc`` is first overwritten with the
    quantised ``(x, w)``: the client's whole masked input in one cache-friendly pass.
    """
    masks = [(PRG(seed), sign) for seed, sign in masks]
    dtype = acc.dtype
    n = acc.size
    key = np.empty(min(_CHUNK, max(n, 1)), dtype=dtype)
    tmp = np.empty(key.size, dtype=np.float64) if quant is not None else None
    add, sub = np.add, np.subtract
    for lo in range(0, n, _CHUNK):
        hi = min(n, lo + _CHUNK)
        a = acc[lo:hi]
        if quant is not None:
            quant.encode_into(acc, x, w, lo, hi, tmp)
        kk = key[: hi - lo]
        for prg, sign in masks:
            prg.fill_bytes(kk)
            (add if sign > 0 else sub)(a, kk, out=a)


def _reconstruct_secret(rows: list[np.ndarray], points: list[int], t: int, what: str) -> bytes:
    """A 32-byte secret from >= t Shamir shares (each ``_ELEMS`` field elements)."""
    if len(rows) < t:
        raise SecAggError(f"cannot reconstruct {what}: {len(rows)} share(s), the threshold is t={t}")
    try:
        return F61.elements_to_bytes(reconstruct(np.stack(rows[:t]), points[:t], field=F61), SEED_BYTES)
    except ValueError as e:
        raise SecAggError(f"shares of {what} do not decode to a 32-byte secret: {e}") from None


class RoundInbox:
    """Reads one (sender, kind) for the current round: drops older rounds, keeps later ones."""

    def __init__(self, log):
        self._later: dict[tuple[str, str], list] = {}
        self.log = log

    def recv(self, party, frm: str, kind: str, r: int, deadline: float):
        held = self._later.get((frm, kind))
        if held:
            for i, p in enumerate(held):
                if p["r"] == r:
                    return held.pop(i)
        while True:
            try:
                p = party.recv(frm, kind, timeout=max(0.0, deadline - time.monotonic()))
            except PeerTimeout:
                return None
            if not isinstance(p, dict) or not isinstance(p.get("r"), int) or isinstance(p.get("r"), bool):
                self.log.warning("secagg: discarded a %s message from %s without a round number", kind, frm)
                continue
            if p["r"] < r:
                self.log.info("secagg: discarded a late %s message of round %d from %s (now round %d)",
                              kind, p["r"], frm, r)
                continue
            if p["r"] > r:
                self._later.setdefault((frm, kind), []).append(p)
                continue
            return p


def _check_round(last: int | None, r: int) -> None:
    if isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0:
        raise ValueError(f"secagg round must be a non-negative int, got {r!r}")
    if last is not None and r <= last:
        raise ValueError(f"secagg round {r} is not after the previous round {last}: every aggregation "
                         "needs a new, larger round number")


# ----------------------------------------------------------------- client
class SecAggClient:
    """The client side.  One object per party and run: it holds the run's identity key."""

    def __init__(self, config: SecAggConfig | None = None):
        self.cfg = config or SecAggConfig()
        self._ident = ck.generate_ed25519()
        self._ident_pk = ck.public_bytes(self._ident)
        self._peer_ident: dict[str, bytes] = {}
        self._ident_sent = False
        self._inbox = None
        self._last_round: int | None = None

    def _timeout(self, party) -> float:
        if self.cfg.client_timeout is not None:
            return float(self.cfg.client_timeout)
        return float(party.timeout) + float(self.cfg.timeout or party.timeout)

    def _ident_of(self, party, v: str) -> bytes:
        if v not in self._peer_ident:
            p = party.recv(v, KIND_IDENT, timeout=self._timeout(party))
            if not isinstance(p, dict) or not _is_bytes(p.get("pk"), ck.KEY_BYTES):
                raise SecAggError(f"client {v!r} sent a malformed identity key")
            self._peer_ident[v] = bytes(p["pk"])
        return self._peer_ident[v]

    def _from_server(self, party, server: str, kind: str, r: int) -> dict:
        p = self._inbox.recv(party, server, kind, r, time.monotonic() + self._timeout(party))
        if p is None:
            raise SecAggError(f"client {party.name!r}: no {kind!r} from {server!r} for round {r} within "
                              f"{self._timeout(party):g}s")
        if p.get("abort"):
            raise SecAggError(f"round {r} aborted by the server: {p['abort']}")
        return p

    def submit(self, party, server: str, vector, weight: float = 1.0, round: int = 0, *,
               stop_after: str | None = None, delay: tuple[str, float] | None = None) -> SubmitResult:
        """Take part in one aggregation with ``weight * clip(vector)``.

        ``stop_after`` (one of ``"start"`` and :data:`STEPS`) and ``delay``
        (``(step, seconds)``: sleep before sending that step's message) inject
        dropouts and late clients for tests: the client vanishes after that step.
        """
        cfg = self.cfg
        r = int(round)
        _check_round(self._last_round, r)
        if stop_after is not None and stop_after not in ("start",) + STEPS:
            raise ValueError(f"stop_after must be one of {('start',) + STEPS}, got {stop_after!r}")
        x, w = check_input(vector, weight, cfg.max_weight)
        self._last_round = r
        if self._inbox is None:
            self._inbox = RoundInbox(party.log)
        me = party.name
        ctx = _ctx(cfg, party.run_id, r)
        if not self._ident_sent:
            for v in party.peers_with_role(party.role):
                party.send(v, KIND_IDENT, {"pk": self._ident_pk})
            self._ident_sent = True
        if stop_after == "start":
            return SubmitResult("stopped", r, "before advertising keys")

        def pause(step):
            if delay is not None and delay[0] == step:
                time.sleep(float(delay[1]))

        # -- round 0: advertise keys ------------------------------------------
        c_sk, s_sk = ck.generate_x25519(), ck.generate_x25519()
        c_pk, s_pk = ck.public_bytes(c_sk), ck.public_bytes(s_sk)
        b = random_seed()
        commit = _commit(b)
        sig = ck.sign(self._ident, _sig_message(cfg, party.run_id, r, me, c_pk, s_pk, commit))
        pause("advertise")
        party.send(server, KIND_KEYS, {"r": r, "c_pk": c_pk, "s_pk": s_pk, "commit": commit, "sig": sig})
        if stop_after == "advertise":
            return SubmitResult("stopped", r, "after advertising keys")

        # -- round 1: share keys -----------------------------------------------
        p = self._from_server(party, server, KIND_KEYLIST, r)
        if p.get("dropped"):
            return SubmitResult("dropped", r, "excluded at the key list")
        universe = p.get("universe")
        if not (isinstance(universe, list) and all(isinstance(u, str) for u in universe)
                and len(set(universe)) == len(universe) and me in universe):
            raise SecAggError(f"round {r}: the server's client list is malformed or lacks {me!r}")
        universe = sorted(universe)
        own_role = party.role
        strangers = [u for u in universe if u != me and party.roles.get(u) != own_role]
        if strangers:
            raise SecAggError(f"round {r}: the server listed parties that are not {own_role}s: {strangers}")
        n = len(universe)
        t, tl = cfg.t(n), cfg.t_local(n)
        quant = cfg.quantizer(n)
        if (p.get("frac_bits"), p.get("ring_bits")) != (quant.frac_bits, quant.ring_bits):
            raise SecAggError(f"round {r}: the server encodes with frac_bits={p.get('frac_bits')}, ring_bits="
                              f"{p.get('ring_bits')}; this client's configuration gives {quant.frac_bits}, "
                              f"{quant.ring_bits} (do both use the same secagg_* settings?)")
        nbrs = neighbours(universe, cfg, party.seed, party.run_id, r)[me]
        keys = p.get("keys")
        if not isinstance(keys, dict) or me not in keys:
            raise SecAggError(f"round {r}: the key list lacks this client's own keys")
        seen: set[bytes] = set()
        peer_keys: dict[str, tuple[bytes, bytes, bytes]] = {}
        for v, entry in keys.items():
            if v != me and v not in nbrs:
                raise SecAggError(f"round {r}: the key list holds {v!r}, not a neighbour of {me!r}")
            if not (isinstance(entry, list) and len(entry) == 4 and all(_is_bytes(e) for e in entry)):
                raise SecAggError(f"round {r}: malformed key entry for {v!r}")
            vc, vs, vcommit, vsig = (bytes(e) for e in entry)
            if v == me:
                if (vc, vs, vcommit) != (c_pk, s_pk, commit):
                    raise SecAggError(f"round {r}: the server relayed keys for {me!r} that are not its own")
            elif not ck.verify(self._ident_of(party, v), _sig_message(cfg, party.run_id, r, v, vc, vs, vcommit),
                               vsig):
                raise SecAggError(f"round {r}: the signature on {v!r}'s keys does not verify")
            if vc in seen or vs in seen or vc == vs:
                raise SecAggError(f"round {r}: public keys in the key list are not distinct")
            seen.update((vc, vs))
            peer_keys[v] = (vc, vs, vcommit)
        if len(peer_keys) < tl:
            raise SecAggError(f"round {r}: only {len(peer_keys)} share holders, below the threshold {tl}")
        idx = {u: i for i, u in enumerate(universe)}
        secret = np.concatenate([F61.bytes_to_elements(b), F61.bytes_to_elements(ck.private_bytes(s_sk))])
        shares = share(secret, n, tl)  # row i: the share for universe[i], at x = i + 1
        own_share = shares[idx[me]].copy()
        ct, enc = {}, {}
        for v, (vc, _, _) in peer_keys.items():
            if v == me:
                continue
            enc[v] = ck.agree(c_sk, vc, info=b"enc" + ctx)  # the same key opens v's shares for us
            ct[v] = ck.seal(enc[v], shares[idx[v]].tobytes(), aad=ctx + msgpack.packb([me, v]))
        pause("share")
        party.send(server, KIND_SHARES, {"r": r, "ct": ct})
        if stop_after == "share":
            return SubmitResult("stopped", r, "after sharing keys")

        # -- round 2: masked input ----------------------------------------------
        p = self._from_server(party, server, KIND_RELAY, r)
        if p.get("dropped"):
            return SubmitResult("dropped", r, "excluded after sharing keys")
        u2 = p.get("u2")
        relayed = p.get("ct")
        if not (isinstance(u2, list) and isinstance(relayed, dict) and me in u2 and set(u2) <= set(universe)
                and (nbrs & set(u2)) <= set(peer_keys)):
            raise SecAggError(f"round {r}: malformed relay of shares (U2 must hold {me!r} and only "
                              "clients whose keys were listed)")
        u2 = set(u2)
        if len(u2) < t:
            raise SecAggError(f"round {r}: only {len(u2)} clients shared keys, below t={t}")
        mask_peers = sorted((nbrs & u2) - {me})
        if set(relayed) != set(mask_peers):
            raise SecAggError(f"round {r}: relayed shares come from {sorted(relayed)}, expected {mask_peers}")
        held: dict[str, np.ndarray] = {me: own_share}
        for v in mask_peers:
            try:
                raw = ck.open_sealed(enc[v], relayed[v], aad=ctx + msgpack.packb([v, me]))
            except (ck.AuthenticationError, TypeError) as e:
                raise SecAggError(f"round {r}: the shares from {v!r} fail authentication: {e}") from None
            row = np.frombuffer(raw, dtype=np.uint64)
            if row.size != 2 * _ELEMS:
                raise SecAggError(f"round {r}: the shares from {v!r} have the wrong size")
            held[v] = F61.asarray(row.copy(), f"shares from {v}")
        masks = [(b, +1)]
        for v in mask_peers:
            seed = ck.agree(s_sk, peer_keys[v][1], info=b"mask" + ctx)
            masks.append((seed, +1 if idx[me] < idx[v] else -1))
        y = np.empty(x.size + 1, dtype=quant.dtype)
        apply_masks(y, masks, quant, x, w)
        del masks
        pause("masked")
        party.send(server, KIND_MASKED, {"r": r, "y": y})
        if stop_after == "masked":
            return SubmitResult("stopped", r, "after sending the masked input")

        # -- round 3: unmasking -------------------------------------------------
        p = self._from_server(party, server, KIND_UNMASK_REQUEST, r)
        if p.get("dropped"):
            return SubmitResult("dropped", r, "excluded after the masked input")
        u3 = p.get("u3")
        if not (isinstance(u3, list) and me in u3 and set(u3) <= u2):
            raise SecAggError(f"round {r}: malformed unmask request (U3 must hold {me!r} and lie within U2)")
        u3 = set(u3)
        if len(u3) < t:
            raise SecAggError(f"round {r}: only {len(u3)} masked inputs, below t={t}; refusing to unmask")
        b_of = sorted(v for v in held if v in u3)
        s_of = sorted(v for v in held if v not in u3)  # dropped after sharing: reveal its mask key only
        # One array, b-shares then s-shares: never empty (it holds our own b-share).
        rows = [held[v][:_ELEMS] for v in b_of] + [held[v][_ELEMS:] for v in s_of]
        reply = {"r": r, "b_of": b_of, "s_of": s_of, "shares": np.stack(rows)}
        pause("unmask")
        party.send(server, KIND_UNMASK, reply)
        return SubmitResult("ok", r)


# ----------------------------------------------------------------- server
class SecAggServer:
    """The server side.  ``observer(kind, client, payload)`` sees every accepted message (its whole view)."""

    def __init__(self, config: SecAggConfig | None = None, observer: Callable[[str, str, Any], None] | None = None):
        self.cfg = config or SecAggConfig()
        self.observer = observer
        self._inbox = None
        self._last_round: int | None = None

    def aggregate(self, party, clients: Iterable[str], round: int = 0, length: int | None = None) -> SecAggResult:
        """Run one round with ``clients``; returns the weighted sum (``length`` checks the vector length)."""
        cfg = self.cfg
        r = int(round)
        _check_round(self._last_round, r)
        self._last_round = r
        if self._inbox is None:
            self._inbox = RoundInbox(party.log)
        universe = sorted(set(clients))
        bad = [u for u in universe if u not in party.roles or u == party.name]
        if bad:
            raise ValueError(f"secagg: {bad} are not peers of {party.name!r}")
        n = len(universe)
        t, tl, k = cfg.t(n), cfg.t_local(n), cfg.k(n)
        quant = cfg.quantizer(n)
        nbrs = neighbours(universe, cfg, party.seed, party.run_id, r)
        idx = {u: i for i, u in enumerate(universe)}
        timeout = float(cfg.timeout if cfg.timeout is not None else party.timeout)
        steps: dict[str, dict] = {}
        log = party.log

        def collect(kind: str, frm: list[str], valid: Callable[[str, dict], str | None]) -> dict[str, dict]:
            t0 = time.monotonic()
            deadline = t0 + timeout
            got = {}
            for u in frm:
                p = self._inbox.recv(party, u, kind, r, deadline)
                if p is None:
                    log.info("secagg round %d: %s dropped (no %s within %gs)", r, u, kind, timeout)
                    continue
                why = valid(u, p)
                if why:
                    log.warning("secagg round %d: dropped %s: bad %s message: %s", r, u, kind, why)
                    continue
                if self.observer is not None:
                    self.observer(kind, u, p)
                got[u] = p
            steps[kind] = {"clients": len(got), "seconds": time.monotonic() - t0}
            return got

        def fail(waiting: Iterable[str], next_kind: str, reason: str):
            # Everyone who may be waiting for the next message learns why there is none.
            msg = f"secure aggregation round {r} failed: {reason}; no sum is released"
            for u in sorted(waiting):
                party.send(u, next_kind, {"r": r, "abort": msg})
            raise SecAggError(msg)

        def tell_dropped(who: Iterable[str], next_kind: str):
            for u in sorted(who):
                party.send(u, next_kind, {"r": r, "dropped": True})

        def prune(alive: set[str]) -> set[str]:
            # A client whose secrets have fewer than t_local possible holders
            # could never be unmasked: leave it out (SecAgg+; never happens
            # on the complete graph while |alive| >= t).
            if len(alive) < t:
                return alive  # the round fails; report the true count
            while True:
                weak = {u for u in alive if len((nbrs[u] & alive) | {u}) < tl}
                if not weak:
                    return alive
                alive = alive - weak

        # -- round 0: advertise keys ------------------------------------------
        def valid_keys(u, p):
            if not all(_is_bytes(p.get(f), ck.KEY_BYTES) for f in ("c_pk", "s_pk", "commit")):
                return "keys must be 32 bytes each"
            if not _is_bytes(p.get("sig"), 64):
                return "signature must be 64 bytes"
            return None

        adv = collect(KIND_KEYS, universe, valid_keys)
        u1 = prune(set(adv))
        if len(u1) < t:
            fail(universe, KIND_KEYLIST, f"only {len(u1)} of {n} clients advertised keys, below the threshold t={t}")
        tell_dropped(set(universe) - u1, KIND_KEYLIST)
        entry = {u: [adv[u]["c_pk"], adv[u]["s_pk"], adv[u]["commit"], adv[u]["sig"]] for u in u1}
        for u in sorted(u1):
            party.send(u, KIND_KEYLIST, {"r": r, "universe": universe, "frac_bits": quant.frac_bits,
                                         "ring_bits": quant.ring_bits,
                                         "keys": {v: entry[v] for v in sorted((nbrs[u] & u1) | {u})}})

        # -- round 1: share keys -----------------------------------------------
        def valid_shares(u, p):
            ct = p.get("ct")
            if not isinstance(ct, dict) or set(ct) != (nbrs[u] & u1):
                return "sealed shares must be addressed to exactly the neighbours in U1"
            if not all(_is_bytes(c, 2 * _ELEMS * 8 + ck.SEAL_OVERHEAD) for c in ct.values()):
                return "sealed shares have the wrong size"
            return None

        sh = collect(KIND_SHARES, sorted(u1), valid_shares)
        u2 = prune(set(sh))
        if len(u2) < t:
            fail(u1, KIND_RELAY, f"only {len(u2)} of {n} clients shared keys, below the threshold t={t}")
        tell_dropped(u1 - u2, KIND_RELAY)
        for v in sorted(u2):
            party.send(v, KIND_RELAY, {"r": r, "u2": sorted(u2),
                                       "ct": {u: sh[u]["ct"][v] for u in sorted(nbrs[v] & u2)}})

        # -- round 2: masked input ----------------------------------------------
        acc = None
        want = None if length is None else int(length) + 1

        def valid_masked(u, p):
            nonlocal acc, want
            y = p.get("y")
            if not isinstance(y, np.ndarray) or y.dtype != quant.dtype or y.ndim != 1:
                return f"masked input must be a 1-D {quant.dtype} array"
            if want is None:
                want = y.size
            if y.size != want:
                return f"masked input has {y.size} elements, expected {want}"
            if acc is None:
                acc = y.copy()
            else:
                np.add(acc, y, out=acc)  # the sum is all the server keeps
            return None

        masked = collect(KIND_MASKED, sorted(u2), valid_masked)
        u3 = set(masked)
        del masked
        if len(u3) < t:
            fail(u2, KIND_UNMASK_REQUEST, f"only {len(u3)} of {n} masked inputs arrived, below the threshold t={t}")
        tell_dropped(u2 - u3, KIND_UNMASK_REQUEST)
        for u in sorted(u3):
            party.send(u, KIND_UNMASK_REQUEST, {"r": r, "u3": sorted(u3)})

        # -- round 3: unmasking -------------------------------------------------
        holders = {u: ((nbrs[u] & u2) | {u}) for u in u2}

        def valid_unmask(u, p):
            b_of, s_of = p.get("b_of"), p.get("s_of")
            if not (isinstance(b_of, list) and isinstance(s_of, list)):
                return "share owner lists missing"
            if set(b_of) != holders[u] & u3 or set(s_of) != holders[u] - u3:
                return "shares are not for exactly the expected clients"
            a = p.get("shares")
            rows = len(b_of) + len(s_of)
            if not isinstance(a, np.ndarray) or a.dtype != np.uint64 or a.shape != (rows, _ELEMS):
                return f"shares must be a uint64 array of shape ({rows}, {_ELEMS})"
            try:
                F61.asarray(a, "shares")
            except ValueError as e:
                return str(e)
            return None

        un = collect(KIND_UNMASK, sorted(u3), valid_unmask)
        u4 = set(un)
        if len(u4) < t:
            raise SecAggError(f"secure aggregation round {r} failed: only {len(u4)} of {n} clients sent "
                              f"unmasking shares, below the threshold t={t}; no sum is released")
        b_rows: dict[str, list] = {u: [] for u in u3}
        s_rows: dict[str, list] = {v: [] for v in u2 - u3}
        for h in sorted(u4, key=idx.get):  # ascending x = idx + 1
            p = un[h]
            nb = len(p["b_of"])
            for v, row in zip(p["b_of"], p["shares"][:nb]):
                b_rows[v].append((idx[h] + 1, row))
            for v, row in zip(p["s_of"], p["shares"][nb:]):
                s_rows[v].append((idx[h] + 1, row))
        masks: list[tuple[bytes, int]] = []
        try:
            for u in sorted(u3):
                pts = [x for x, _ in b_rows[u]]
                bu = _reconstruct_secret([row for _, row in b_rows[u]], pts, tl, f"the self-mask seed of {u!r}")
                if _commit(bu) != adv[u]["commit"]:
                    raise SecAggError(f"the reconstructed self-mask seed of {u!r} does not match its commitment")
                masks.append((bu, -1))
            ctx = _ctx(cfg, party.run_id, r)
            for v in sorted(u2 - u3):
                pts = [x for x, _ in s_rows[v]]
                sk_raw = _reconstruct_secret([row for _, row in s_rows[v]], pts, tl, f"the mask key of {v!r}")
                sk = ck.private_key_from_bytes(sk_raw, "x25519")
                if ck.public_bytes(sk) != adv[v]["s_pk"]:
                    raise SecAggError(f"the reconstructed mask key of {v!r} does not match its public key")
                for u in sorted(nbrs[v] & u3):
                    seed = ck.agree(sk, adv[u]["s_pk"], info=b"mask" + ctx)
                    # u added +PRG(s_uv) when u sorts before v: take it back out.
                    masks.append((seed, -1 if idx[u] < idx[v] else +1))
        except SecAggError as e:
            raise SecAggError(f"secure aggregation round {r} failed: {e}; no sum is released") from None
        t0 = time.monotonic()
        apply_masks(acc, masks)
        total, wsum = quant.decode(acc)
        steps["unmask_compute"] = {"seconds": time.monotonic() - t0}
        e_sum, e_mean = quant.bounds(len(u3), wsum)
        if not wsum > 0:
            raise SecAggError(f"secure aggregation round {r}: the weights sum to {wsum}")
        return SecAggResult(
            sum=total, weight=wsum, mean=total / wsum, contributors=sorted(u3), dropped=sorted(set(universe) - u3),
            sum_error_bound=e_sum, mean_error_bound=e_mean, round=r, frac_bits=quant.frac_bits,
            ring_bits=quant.ring_bits, threshold=t, threshold_local=tl, graph=cfg.graph, degree=k, steps=steps)


# ----------------------------------------------------------- declarations
def _ring_vector(arrays: list, cfg: dict, length: int | None) -> str | None:
    bits = int(cfg.get("secagg_ring_bits", 32))
    want = "<u4" if bits == 32 else "<u8"
    if len(arrays) != 1:
        return f"expected one masked vector, got {len(arrays)} arrays"
    dt, shape = arrays[0]
    if dt != want or len(shape) != 1:
        return f"masked input must be a 1-D {want} ring vector (secagg_ring_bits={bits}), got {dt}{list(shape)}"
    if length is not None and shape[0] != length + 1:
        return f"masked input has {shape[0]} elements, expected {length} + 1 (the weight)"
    return None


def _share_arrays(arrays: list, cfg: dict) -> str | None:
    if len(arrays) != 1:
        return f"expected one array of shares, got {len(arrays)}"
    for dt, shape in arrays:
        if dt != "<u8" or len(shape) != 2 or shape[1] != _ELEMS:
            return f"shares must be uint64 arrays of shape (k, {_ELEMS}), got {dt}{list(shape)}"
    return None


def declarations(length: Callable[[dict], int] | None = None) -> list[MessageDecl]:
    """The protocol's message kinds; ``length(cfg)`` (optional) pins the vector length for the audit."""
    def masked(arrays, cfg):
        return _ring_vector(arrays, cfg, None if length is None else int(length(cfg)))

    return [
        declare(KIND_IDENT, "client", "client", "a client's per-run Ed25519 identity public key (32 bytes)",
                no_arrays),
        declare(KIND_KEYS, "client", "server",
                "two X25519 public keys, a hash of the self-mask seed, an Ed25519 signature", no_arrays),
        declare(KIND_KEYLIST, "server", "client", "the signed public keys of the client's neighbours, or a "
                "dropped/abort notice", no_arrays),
        declare(KIND_SHARES, "client", "server",
                "Shamir shares of the self-mask seed and mask key, AES-GCM sealed to each neighbour", no_arrays),
        declare(KIND_RELAY, "server", "client", "sealed shares addressed to the client, and U2", no_arrays),
        declare(KIND_MASKED, "client", "server", "the masked, quantised, weighted input (a uniform ring vector)",
                masked),
        declare(KIND_UNMASK_REQUEST, "server", "client", "U3, the clients whose masked input arrived", no_arrays),
        declare(KIND_UNMASK, "client", "server",
                "self-mask seed shares of U3 and mask-key shares of U2 minus U3", _share_arrays),
    ]


DECLARATIONS = declarations()
