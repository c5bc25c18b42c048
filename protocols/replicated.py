"""Three-party replicated secret sharing over Z_2^64: the arithmetic of one holder, no parties.

Sharing (2-of-3, honest majority; the CNF form of a 2-of-3 threshold sharing, as in ABY3 / Araki et al.)
  arithmetic  x = x_0 + x_1 + x_2 (mod 2^64); holder i holds the pair (x_i, x_{i+1})   (indices mod 3)
  binary      x = x_0 ^ x_1 ^ x_2 (64-bit words); the same pairs
One holder's pair misses one component, which is uniform: one holder learns nothing; any two hold all three.

Randomness without messages.  Holder i shares one 256-bit key with its successor (k_i) and one with its
predecessor (k_{i-1}); the zero sharing α_i = F(k_i) - F(k_{i-1}) (binary: F(k_i) ^ F(k_{i-1})) sums to 0 over the
three holders, is uniform to any one of them, and keeps the holders in lockstep: every holder draws the same
sizes in the same order (:class:`Holder`).

Rounds.  Every interactive step is one :meth:`Holder.exchange`: holder i sends one array to holder i - 1 and
receives one from holder i + 1.

  operation                              rounds   words each holder sends        exact?
  public linear map, add, add_public     0        0                              exactly, mod 2^64
                                         (lin_public: float64 BLAS on limbs, exact)
  mul / bilinear (then reshare)          1        one per output element         exactly, mod 2^64
  a2b (carry-save + Kogge-Stone adder)   8        13 per element                 exactly
  msb (the carry into the top bit only)  8        about 4.4 per element          exactly
  b2a of a shared bit                    2        2 per bit                      exactly
  ltz (x < 0 as an arithmetic 0/1)       10       about 6.4 per element          exactly for |x| < 2^63
  trunc (x >> d, floor)                  10       13 + 2 (64 - d) per element    exactly for |x| < 2^63
  relu (x, [x >= 0])                     11       about 7.4 per element          exactly

Fixed point is the caller's: a value with f fractional bits is round(v 2^f) as a two's-complement word; a public
operand with g bits multiplies it into f + g bits.  Nothing here truncates unless asked (:func:`trunc`), so the
caller keeps every intermediate below 2^63 in magnitude (:func:`encode` refuses a public operand that does not
fit).  What is opened: :func:`open_pairs` sums the three components of a reshared value; each component is
uniform given the sum (the reshare's zero sharing), so an opening shows the value and nothing else.
"""
from __future__ import annotations

import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from fedhet.crypto.prg import PRG, SEED_BYTES

__all__ = ["Rss", "Brss", "Holder", "encode", "decode", "share", "expand", "lin", "lin_public", "add", "sub", "add_public",
           "mul", "bilinear", "cross", "a2b", "msb", "b2a", "ltz", "relu", "trunc", "open_pairs", "OpenError",
           "public", "mul_fixed", "maximum", "max_last", "exp_nonpos", "exp_error", "reciprocal", "reciprocal_error",
           "newton_iterations", "softmax", "softmax_error", "softmax_ce_grad",
           "in_process", "in_process_holders", "KEY_BYTES", "ROUNDS"]

KEY_BYTES = SEED_BYTES
_U = np.uint64
ROUNDS = {"mul": 1, "a2b": 8, "b2a": 2, "ltz": 10, "trunc": 10, "relu": 11}


@dataclass
class Rss:
    """One holder's pair of an arithmetic sharing: (x_i, x_{i+1}), uint64 arrays of one shape."""
    a: np.ndarray
    b: np.ndarray

    @property
    def shape(self) -> tuple:
        return self.a.shape

    def __getitem__(self, idx) -> "Rss":
        return Rss(self.a[idx], self.b[idx])


@dataclass
class Brss:
    """One holder's pair of a binary (XOR) sharing of 64-bit words."""
    a: np.ndarray
    b: np.ndarray

    def __xor__(self, o: "Brss") -> "Brss":
        return Brss(self.a ^ o.a, self.b ^ o.b)

    def __lshift__(self, k: int) -> "Brss":
        return Brss(self.a << self.a.dtype.type(k), self.b << self.b.dtype.type(k))

    def __rshift__(self, k: int) -> "Brss":
        return Brss(self.a >> self.a.dtype.type(k), self.b >> self.b.dtype.type(k))

    def __getitem__(self, idx) -> "Brss":
        return Brss(self.a[idx], self.b[idx])


class Holder:
    """Holder ``index`` (0, 1 or 2) of a three-party computation: its two pairwise keys and its ``exchange``
    (send one array to the predecessor, return the successor's array of the same shape)."""

    def __init__(self, index: int, key_next: bytes, key_prev: bytes, exchange: Callable[[np.ndarray], np.ndarray]):
        if index not in (0, 1, 2):
            raise ValueError(f"holder index must be 0, 1 or 2, got {index!r}")
        self.i = index
        self._nxt, self._prv = PRG(bytes(key_next), 1), PRG(bytes(key_prev), 1)
        self._exchange = exchange
        self.rounds = 0
        self.words_sent = 0
        self.inboxes: list = []       # in_process_holders: the three holders' queues

    def exchange(self, words: np.ndarray) -> np.ndarray:
        """Send ``words`` (an unsigned integer array: uint64, or smaller words packed into uint64 for the wire)
        to the predecessor, return the successor's of the same shape and type."""
        words = np.ascontiguousarray(words)
        if words.dtype not in (np.uint64, np.uint32, np.uint16, np.uint8):
            raise TypeError(f"exchange: unsigned integer words, got {words.dtype}")
        got = self._exchange(words.reshape(-1) if words.dtype == _U else _as_u64(words)).reshape(-1)
        if words.dtype != _U:
            got = got.view(np.uint8)[:words.nbytes].view(words.dtype) if got.nbytes >= words.nbytes else got[:0]
        if got.size != words.size:
            raise ValueError(f"holder {self.i}: the successor's reply has {got.size} words, expected {words.size}")
        self.rounds += 1
        self.words_sent += -(-words.nbytes // 8)
        return got.reshape(words.shape)



    def zero(self, shape) -> np.ndarray:
        """This holder's term of a fresh arithmetic sharing of zero."""
        return self._nxt.uint64(shape) - self._prv.uint64(shape)

    def zero_xor(self, shape, dtype=np.uint64) -> np.ndarray:
        bits = np.dtype(dtype).itemsize * 8
        return self._nxt.integers_pow2(shape, bits) ^ self._prv.integers_pow2(shape, bits)

    def reshare(self, t: np.ndarray) -> Rss:
        """A 3-out-of-3 sum term (one per holder, e.g. a product's) -> a fresh 2-of-3 pair: one round."""
        mine = t + self.zero(t.shape)
        return Rss(mine, self.exchange(mine))

    def reshare_xor(self, t: np.ndarray) -> Brss:
        mine = t ^ self.zero_xor(t.shape, t.dtype)
        return Brss(mine, self.exchange(mine))


def _as_u64(small: np.ndarray) -> np.ndarray:
    """Smaller words packed into uint64 (zero-padded) for the wire."""
    raw = small.reshape(-1).view(np.uint8)
    if raw.size % 8:
        raw = np.concatenate([raw, np.zeros(8 - raw.size % 8, np.uint8)])
    return raw.view(_U)


# ----------------------------------------------------------------- fixed point and sharing
def encode(x, bits: int, what: str = "value") -> np.ndarray:
    """round(x 2^bits) as int64; refuses values whose encoding reaches 2^62 (no room left for sums)."""
    v = np.rint(np.ldexp(np.asarray(x, dtype=np.float64), bits))
    if v.size and not np.all(np.abs(v) < 2.0 ** 62):
        raise ValueError(f"{what}: |value| * 2^{bits} reaches 2^62 (max |value| {np.abs(x).max():.4g})")
    return v.astype(np.int64)


def decode(words: np.ndarray, bits: int) -> np.ndarray:
    """Two's-complement words with ``bits`` fractional bits -> float64."""
    return np.ldexp(np.asarray(words).view(np.int64).astype(np.float64), -bits)


def share(words: np.ndarray, seeds: Sequence[bytes] | None = None) -> list[tuple]:
    """A dealer's (an owner's) sharing of uint64 ``words``: the three holders' pairs.  x_0 and x_1 are PRG
    expansions of two fresh seeds, x_2 = x - x_0 - x_1; a pair gives a seed (32 bytes) in place of a component
    that is one (holder 0 gets two seeds, holders 1 and 2 one seed and x_2): about 2x the array's bytes in all."""
    words = np.ascontiguousarray(words).view(_U)
    s0, s1 = seeds if seeds is not None else (os.urandom(KEY_BYTES), os.urandom(KEY_BYTES))
    x2 = words - expand(s0, words.shape) - expand(s1, words.shape)
    return [(s0, s1), (s1, x2), (x2, s0)]


def expand(part, shape) -> np.ndarray:
    """A pair's component: the array itself, or its seed's expansion."""
    if isinstance(part, (bytes, bytearray)):
        return PRG(bytes(part), 2).uint64(tuple(shape))
    a = np.asarray(part)
    if a.dtype != _U or a.shape != tuple(shape):
        raise ValueError(f"share component: {a.dtype} {a.shape}, expected uint64 {tuple(shape)}")
    return a


# ----------------------------------------------------------------- local operations
def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a).view(np.int64))


def _n(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.contiguous().numpy()).view(_U)


def lin(x: Rss, f: Callable[[torch.Tensor], torch.Tensor]) -> Rss:
    """A public linear map (int64 torch ops wrap mod 2^64) applied to both components: no messages."""
    return Rss(_n(f(_t(x.a))), _n(f(_t(x.b))))


def lin_public(x: Rss, M: np.ndarray, apply: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               coef_abs_sum: float) -> Rss:
    """apply(M, x) for a public integer M and a linear ``apply`` (a matrix product) through float64 BLAS: each
    64-bit word is cut into limbs small enough that every limb's products and sums stay exact below 2^53
    (``coef_abs_sum`` bounds Σ |M| over the terms of one output), and the limbs' results are shifted back
    together mod 2^64.  Equal to :func:`lin` with int64 arithmetic, several times faster."""
    cb = max(1, int(np.ceil(np.log2(float(coef_abs_sum) + 1.0))))
    L = 52 - cb
    if L < 8:                                                      # coefficients too large: int64 arithmetic
        Mt = torch.from_numpy(np.ascontiguousarray(M, dtype=np.int64))
        return lin(x, lambda t: apply(Mt, t))
    Mf = torch.from_numpy(np.ascontiguousarray(M, dtype=np.float64))
    mask = _U((1 << L) - 1)

    def one(a: np.ndarray) -> np.ndarray:
        acc = None
        for j in range(-(-64 // L)):
            limb = ((a >> _U(L * j)) & mask).astype(np.float64)
            r = apply(Mf, torch.from_numpy(limb)).numpy()
            part = np.rint(r).astype(np.int64).view(_U) << _U(L * j)
            acc = part if acc is None else acc + part
        return np.ascontiguousarray(acc)
    return Rss(one(x.a), one(x.b))


def add(x: Rss, y: Rss) -> Rss:
    return Rss(x.a + y.a, x.b + y.b)


def sub(x: Rss, y: Rss) -> Rss:
    return Rss(x.a - y.a, x.b - y.b)


def add_public(h: Holder, x: Rss, c) -> Rss:
    """x + c for a public c (int64 words): c joins component 0 (held by holders 0 and 2)."""
    c = np.asarray(c).astype(np.int64).view(_U)
    return Rss(x.a + c if h.i == 0 else x.a.copy(), x.b + c if h.i == 2 else x.b.copy())


def _pair(h: Holder, a: np.ndarray, b: np.ndarray, keep: set[int]) -> tuple[np.ndarray, np.ndarray]:
    """This holder's pair of the sharing whose components are those of (a, b) in ``keep`` and zero elsewhere."""
    z = np.zeros_like(a)
    return (a if h.i in keep else z), (b if (h.i + 1) % 3 in keep else z)


def mul(h: Holder, x: Rss, y: Rss) -> Rss:
    """Elementwise x y: the nine cross products split over the holders, then one reshare (one round)."""
    return h.reshare(x.a * y.a + x.a * y.b + x.b * y.a)


def bilinear(h: Holder, x: Rss, y: Rss, f: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             reshare: bool = True):
    """f(x, y) for a bilinear f in int64 torch ops (a matrix product, an inner product over a batch): the products
    are summed locally and only f's outputs are reshared (one round, one word per output element).  With
    ``reshare=False`` the holder's 3-out-of-3 term plus its zero-sharing term is returned (to be sent to a
    party that adds the three)."""
    t = cross(x, y, f)
    return h.reshare(t) if reshare else t + h.zero(t.shape)


def cross(x: Rss, y: Rss, f: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> np.ndarray:
    """This holder's 3-out-of-3 term of f(x, y) (f bilinear): f(x_i, y_i) + f(x_i, y_i+1) + f(x_i+1, y_i), before
    any reshare (several products' terms can share one :meth:`Holder.reshare`)."""
    xa, xb, ya, yb = _t(x.a), _t(x.b), _t(y.a), _t(y.b)
    return _n(f(xa, ya) + f(xa, yb) + f(xb, ya))


# ----------------------------------------------------------------- binary circuits
def and_(h: Holder, x: Brss, y: Brss) -> Brss:
    """x AND y (numpy broadcasting between the two): one round, one word per output word."""
    return h.reshare_xor((x.a & y.a) ^ (x.a & y.b) ^ (x.b & y.a))


def a2b(h: Holder, x: Rss) -> Brss:
    """The binary sharing of x's bits, in x's word size: x_0 + x_1 + x_2 in a carry-save adder, then a
    Kogge-Stone prefix adder; uint64: 8 rounds, 13 words per element."""
    w = x.a.dtype.itemsize * 8
    s = Brss(x.a, x.b)                                              # x_0 ^ x_1 ^ x_2
    c02, c12, c2 = (Brss(*_pair(h, x.a, x.b, k)) for k in ({0, 2}, {1, 2}, {2}))
    c = (and_(h, c02, c12) ^ c2) << 1                              # 2 maj(x_0, x_1, x_2)
    g = and_(h, s, c)                                               # generate and propagate per bit
    p0 = s ^ c
    gp = Brss(np.stack([g.a, p0.a]), np.stack([g.b, p0.b]))         # [G; P], both ANDs of a level in one round
    k = 1
    while k < w // 2:
        both = and_(h, gp[1:2], gp << k)                            # [P & (G << k); P & (P << k)]
        gp = Brss(np.stack([gp.a[0] ^ both.a[0], both.a[1]]), np.stack([gp.b[0] ^ both.b[0], both.b[1]]))
        k *= 2
    g = gp[0] ^ and_(h, gp[1], gp[0] << k)                          # the last level needs G only
    return p0 ^ (g << 1)


_EVEN = [0x5555555555555555, 0x3333333333333333, 0x0F0F0F0F0F0F0F0F, 0x00FF00FF00FF00FF, 0x0000FFFF0000FFFF,
         0x00000000FFFFFFFF]
_LANES = {32: np.uint32, 16: np.uint16, 8: np.uint8, 4: np.uint8, 2: np.uint8, 1: np.uint8}


def _even(x: np.ndarray, w: int) -> np.ndarray:
    """Bits 0, 2, 4, ... of each ``w``-bit lane word, compressed into w / 2 low bits (the next, smaller dtype)."""
    t = x.dtype.type
    x = x & t(_EVEN[0] & ((1 << w) - 1))
    j = 1
    while (1 << j) < w:
        x = (x | (x >> t(1 << (j - 1)))) & t(_EVEN[j] & ((1 << w) - 1))
        j += 1
    return x.astype(_LANES[w // 2])


def _halve(b: Brss, w: int) -> tuple[Brss, Brss]:
    """(even lanes, odd lanes) of every word: the lower and upper bit of each pair."""
    one = b.a.dtype.type(1)
    return (Brss(_even(b.a, w), _even(b.b, w)), Brss(_even(b.a >> one, w), _even(b.b >> one, w)))


def msb(h: Holder, x: Rss) -> Brss:
    """The sign bit of x (two's complement, its word size) as a binary
    sharing of 0/1 bytes: the carry-save layer and the bits' generate / propagate as in :func:`a2b`, then only the
    carry into the top bit, by a tree that halves the lanes each level (uint64: 8 rounds, about 4.5 words per
    element instead of a2b's 13)."""
    w = x.a.dtype.itemsize * 8
    t = x.a.dtype.type
    s = Brss(x.a, x.b)                                              # x_0 ^ x_1 ^ x_2
    c02, c12, c2 = (Brss(*_pair(h, x.a, x.b, k)) for k in ({0, 2}, {1, 2}, {2}))
    c = (and_(h, c02, c12) ^ c2) << 1                              # 2 maj(x_0, x_1, x_2)
    p0 = s ^ c
    g = and_(h, s, c)
    top = t(1 << (w - 1))
    keep = t(~top & ((1 << w) - 1))
    # the top bit as a pure propagate (G = 0, P = 1): the whole word's carry out is then the carry into it
    g = Brss(g.a & keep, g.b & keep)
    p = Brss((p0.a & keep) | (top if h.i == 0 else t(0)), (p0.b & keep) | (top if h.i == 2 else t(0)))
    lanes = w
    while lanes > 1:
        (ge, go), (pe, po) = _halve(g, lanes), _halve(p, lanes)
        lanes //= 2
        if lanes > 1:                                               # G' = Go ^ Po & Ge, P' = Po & Pe: one round
            both = and_(h, Brss(po.a[None], po.b[None]), Brss(np.stack([ge.a, pe.a]), np.stack([ge.b, pe.b])))
            g, p = go ^ both[0], both[1]
        else:
            g = go ^ and_(h, po, ge)
    one = t(1)
    sign = Brss(((p0.a >> t(w - 1)) & one).astype(np.uint8), ((p0.b >> t(w - 1)) & one).astype(np.uint8))
    out = sign ^ g            # the value's upper bits are 0, its components' need not be: keep bit 0 alone
    return Brss(out.a & np.uint8(1), out.b & np.uint8(1))


def b2a(h: Holder, bits: Brss) -> Rss:
    """Arithmetic sharing (uint64) of shared bits (0/1 words): b_0 ^ b_1 ^ b_2 by a ^ b = a + b - 2ab, two rounds."""
    a, b = bits.a.astype(_U), bits.b.astype(_U)
    b0, b1, b2 = (Rss(*_pair(h, a, b, {k})) for k in range(3))
    e = sub(add(b0, b1), _times(mul(h, b0, b1), 2))
    return sub(add(e, b2), _times(mul(h, e, b2), 2))


def _times(x: Rss, k: int) -> Rss:
    return Rss(x.a * _U(k), x.b * _U(k))


def ltz(h: Holder, x: Rss) -> Rss:
    """[x < 0] as an arithmetic 0/1 sharing (exact for |x| < 2^63)."""
    return b2a(h, msb(h, x))


def relu(h: Holder, x: Rss) -> tuple[Rss, Rss]:
    """(max(x, 0), [x >= 0]): the comparison and one multiplication, 11 rounds."""
    pos = add_public(h, _neg(ltz(h, x)), np.ones(x.shape, np.int64))
    return mul(h, pos, x), pos


def _neg(x: Rss) -> Rss:
    return Rss(-x.a, -x.b)


def trunc(h: Holder, x: Rss, d: int) -> Rss:
    """floor(x / 2^d), exact for |x| < 2^63: x's bits (a2b), an arithmetic shift of each binary component
    (which commutes with XOR), and the 64 - d remaining bits back to arithmetic (the top one with weight
    -2^(63-d): two's complement)."""
    if not 0 < d < 63:
        raise ValueError(f"trunc: d must be in 1..62, got {d}")
    bits = a2b(h, x)
    sa, sb = (bits.a.view(np.int64) >> d).view(_U), (bits.b.view(np.int64) >> d).view(_U)
    keep = 64 - d
    pos = np.arange(keep, dtype=_U)
    ea = (sa[..., None] >> pos) & _U(1)
    eb = (sb[..., None] >> pos) & _U(1)
    ar = b2a(h, Brss(ea, eb))
    w = (np.ones(keep, dtype=_U) << pos)
    w[-1:] = -w[-1:]                                               # -2^(63-d): the sign bit
    return Rss((ar.a * w).sum(-1, dtype=_U), (ar.b * w).sum(-1, dtype=_U))


# ----------------------------------------------------------------- fixed-point functions
def public(h: Holder, c, shape=None) -> Rss:
    """The trivial sharing of public int64 words ``c`` (component 0 = c, the others 0): no messages."""
    c = np.asarray(c, dtype=np.int64)
    if shape is not None:
        c = np.broadcast_to(c, shape)
    z = np.zeros(c.shape, dtype=_U)
    return add_public(h, Rss(z, z.copy()), c)


def mul_fixed(h: Holder, x: Rss, y: Rss, f: int) -> Rss:
    """floor(x y / 2^f): a fixed-point product of two values with f fractional bits (11 rounds); its error is
    the floor's, at most 2^-f, plus whatever x and y carry.  The product must stay below 2^63 before the shift."""
    return trunc(h, mul(h, x, y), f)


def maximum(h: Holder, x: Rss, y: Rss) -> Rss:
    """max(x, y) = y + ReLU(x - y), exact for |x - y| < 2^63 (12 rounds)."""
    return add(y, relu(h, sub(x, y))[0])


def max_last(h: Holder, x: Rss) -> Rss:
    """The maximum over the last axis (shape x.shape[:-1] + (1,)): a tree of :func:`maximum`, ceil(log2 k) levels
    for k entries (an odd level compares its last entry with itself); exact."""
    while x.shape[-1] > 1:
        k = x.shape[-1]
        if k % 2:
            x = Rss(np.concatenate([x.a, x.a[..., -1:]], -1), np.concatenate([x.b, x.b[..., -1:]], -1))
        x = maximum(h, x[..., 0::2], x[..., 1::2])
    return x


EXP_APPROX = 0.28    # sup over x in [-2^n, 0] of e^x - (1 + x/2^n)^(2^n) is at most EXP_APPROX 2^-n (2 e^-2 2^-n as n grows)


def exp_error(f: int, n: int) -> float:
    """The bound of :func:`exp_nonpos`: EXP_APPROX 2^-n (the limit's) + 2^(n+1-f) (its n squarings' floors)."""
    return EXP_APPROX * 2.0 ** -n + 2.0 ** (n + 1 - f)


def exp_nonpos(h: Holder, x: Rss, f: int, n: int = 8, clamp: bool = True) -> Rss:
    """e^x for x <= 0 (f fractional bits, f > n + 1) as (1 + x/2^n)^(2^n): x clamped to [-2^n, 0] (``clamp``: one
    :func:`maximum`, 12 rounds; leave it out when the caller knows x >= -2^n), one truncation and n squarings
    (n fixed-point products): 23 + 11 n rounds with the clamp.

    Error.  For x in [-2^n, 0] the limit's error e^x - (1 + x/2^n)^(2^n) lies in [0, EXP_APPROX 2^-n]; below
    -2^n the result is 0 (error < e^-(2^n)).  Every floor costs at most 2^-f and a squaring doubles at most the
    error of a value in [0, 1] (|a^2 - b^2| <= 2 |a - b|), so the fixed point adds at most 2^(n+1-f):
    |result - e^x| <= :func:`exp_error` (f, n).  At x = 0 the result is exactly 1, and it never exceeds 1.
    x > 0 is outside the function's range (it is not clamped from above)."""
    if not 0 < n < f - 1:
        raise ValueError(f"exp_nonpos: need 0 < n < f - 1, got n = {n}, f = {f}")
    if clamp:
        x = maximum(h, x, public(h, -(1 << (n + f)), x.shape))
    y = add_public(h, trunc(h, x, n), np.full(x.shape, 1 << f, np.int64))       # 1 + x / 2^n, in [0, 1]
    for _ in range(n):
        y = mul_fixed(h, y, y, f)
    return y


def newton_iterations(lo: float, hi: float, f: int) -> int:
    """Newton steps of :func:`reciprocal` on [lo, hi]: the fewest K with r^(2^K) <= 2^-f, r = (hi - lo) / (hi + lo)."""
    r = (hi - lo) / (hi + lo)
    k = 0
    while r ** (2 ** k) > 2.0 ** -f:
        k += 1
    return k


def reciprocal_error(lo: float, hi: float, f: int) -> float:
    """The bound of :func:`reciprocal`: 2^-f / lo (Newton's residue at K steps) + (3 + 2 / lo) 2^-f (the floors)."""
    return 2.0 ** -f / lo + (3.0 + 2.0 / lo) * 2.0 ** -f


def reciprocal(h: Holder, x: Rss, f: int, lo: float, hi: float) -> Rss:
    """1/x for x in the public range [lo, hi] (0 < lo < hi; f fractional bits) by Newton-Raphson,
    y <- y (2 - x y), from the public initial guess y_0 = 2 / (lo + hi).

    With e_k = 1 - x y_k, e_(k+1) = e_k^2 and |e_0| <= r = (hi - lo) / (hi + lo) < 1 on [lo, hi], so
    K = :func:`newton_iterations` steps (two fixed-point products each: 22 K rounds) leave |e_K| <= 2^-f, that
    is |y_K - 1/x| <= 2^-f / x.  Newton corrects its own perturbations (an error d in y_k leaves x d^2 in
    y_(k+1)), so the floors add at most those of the last step: 2^-f in x y (times y <= 2/lo) and 2^-f in y,
    plus the residue of the one before: |result - 1/x| <= :func:`reciprocal_error` (lo, hi, f).  Outside
    [lo, hi] (up to 2 hi) it still converges, more slowly; x <= 0 or x >= 2 (lo + hi) diverges."""
    if not 0 < lo < hi:
        raise ValueError(f"reciprocal: need 0 < lo < hi, got [{lo}, {hi}]")
    y = public(h, encode(2.0 / (lo + hi), f, "the initial guess"), x.shape)
    two = np.full(x.shape, 2 << f, np.int64)
    for _ in range(newton_iterations(lo, hi, f)):
        y = mul_fixed(h, y, add_public(h, _neg(mul_fixed(h, x, y, f)), two), f)
    return y


def softmax_error(classes: int, f: int, n: int) -> float:
    """The bound of :func:`softmax` per entry: (classes + 1) exp_error + reciprocal_error on [1, classes] + 2^-f."""
    return (classes + 1) * exp_error(f, n) + reciprocal_error(1.0, float(max(classes, 2)), f) + 2.0 ** -f


def softmax(h: Holder, x: Rss, f: int, n: int = 8) -> Rss:
    """softmax over the last axis (k classes; f fractional bits): z = x - max (exact, :func:`max_last`),
    e = e^z (:func:`exp_nonpos`, e = 1 exactly at the maximum, so s = Σ e lies in [1, k]), 1/s
    (:func:`reciprocal` on [1, k]) and e / s (one product).  Error per entry: |e_c/s - softmax_c| <=
    |Δe_c| / s + e_c |Δ(1/s)| with |Δe| <= exp_error, |Δs| <= k exp_error, s >= 1 and e_c <= 1, plus the
    reciprocal's and the last floor's: at most :func:`softmax_error` (k, f, n)."""
    k = x.shape[-1]
    m = max_last(h, x)
    z = sub(x, Rss(np.broadcast_to(m.a, x.shape), np.broadcast_to(m.b, x.shape)))
    e = exp_nonpos(h, z, f, n)
    s = Rss(e.a.sum(-1, keepdims=True, dtype=_U), e.b.sum(-1, keepdims=True, dtype=_U))
    r = reciprocal(h, s, f, 1.0, float(max(k, 2)))
    return mul_fixed(h, e, Rss(np.broadcast_to(r.a, x.shape).copy(), np.broadcast_to(r.b, x.shape).copy()), f)


def softmax_ce_grad(h: Holder, logits: Rss, onehot: Rss, f: int, n: int = 8) -> tuple[Rss, Rss]:
    """(softmax(ℓ) - y, softmax(ℓ)): the gradient of the cross-entropy -Σ_c y_c log softmax_c(ℓ) in ℓ, per
    sample, for a shared one-hot y (f fractional bits, as ℓ), and the probabilities; the gradient's error is the
    softmax's (y is exact)."""
    p = softmax(h, logits, f, n)
    return sub(p, onehot), p


# ----------------------------------------------------------------- opening
class OpenError(ValueError):
    """Two holders sent different copies of the same component: one of the two deviated (which, the opening
    cannot tell)."""

    def __init__(self, component: int, holders: tuple[int, int], count: int):
        self.component, self.holders = component, holders
        super().__init__(f"holders {holders[0]} and {holders[1]} disagree on component {component} of an opened "
                         f"value ({count} elements differ): one of them deviated from the protocol")


def open_pairs(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """The value from all three holders' pairs (index order); every component arrives twice and is checked."""
    if len(pairs) != 3:
        raise ValueError(f"open_pairs needs the three holders' pairs, got {len(pairs)}")
    for i in range(3):
        a_next, b_mine = pairs[(i + 1) % 3][0], pairs[i][1]
        if a_next.shape != b_mine.shape:
            raise OpenError((i + 1) % 3, (i, (i + 1) % 3), int(np.prod(a_next.shape)))
        bad = int(np.count_nonzero(a_next != b_mine))
        if bad:
            raise OpenError((i + 1) % 3, (i, (i + 1) % 3), bad)
    return pairs[0][0] + pairs[1][0] + pairs[2][0]


# ----------------------------------------------------------------- three holders in one process
def in_process(fn: Callable[[Holder], object], holders: Sequence[Holder] | None = None) -> list:
    """Run ``fn(holder)`` for the three holders in three threads of this process (tests, benchmarks): the same
    code as between processes, with queues for the exchanges.  ``holders`` from :func:`in_process_holders`
    carry their generators from call to call (as a federation's holders do from step to step)."""
    hs = list(holders) if holders is not None else in_process_holders()
    out: list = [None] * 3
    errs: list = []

    def run(i):
        try:
            out[i] = fn(hs[i])
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs.append(e)
            for q in hs[i].inboxes:
                q.put(None)   # unblock the others
    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for q in hs[0].inboxes:   # a failure's unblocking markers must not reach the next call
        while not q.empty():
            q.get_nowait()
    if errs:
        raise errs[0]
    return out


def in_process_holders(keys: Sequence[bytes] | None = None) -> list[Holder]:
    """Three holders wired to each other by queues (keys k_0, k_1, k_2: holder i shares k_i with its successor)."""
    keys = list(keys) if keys is not None else [os.urandom(KEY_BYTES) for _ in range(3)]
    inbox: list[queue.Queue] = [queue.Queue() for _ in range(3)]

    def exch(i):
        def f(words):
            inbox[(i - 1) % 3].put(words)
            got = inbox[i].get()
            if got is None:
                raise RuntimeError("another holder failed")
            return got
        return f
    hs = [Holder(i, keys[i], keys[(i - 1) % 3], exch(i)) for i in range(3)]
    for h in hs:
        h.inboxes = inbox
    return hs
