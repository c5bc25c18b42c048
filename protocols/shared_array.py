"""Shamir-shared arrays: the algebra on one holder's shares (pure: no parties, no messages).

A :class:`SharedArray` is one holder's t-of-m Shamir share of a fixed-point
array, with the public facts about the hidden value (point, t, fractional
bits, a range bound and an error bound).  :func:`share_array` makes all m
shares locally, :func:`reconstruct_shares` opens any t of them, and the
operations in between (``add sub neg sum_shares add_public scale matmul
lmatmul stack concatenate lift``, indexing, ``reshape``, ``transpose`` and
the operators ``+ - @ *``) are linear, so every holder applies them to its own
share without communication and the shares of the result open to the same
linear function of the secrets.  Moving shares between parties is
:mod:`fedhet.protocols.shamir_share`.

Sharing.  A float array is encoded in fixed point with ``frac_bits`` f
(``round(x * 2**f)`` mod p, :class:`~fedhet.crypto.fixedpoint.FixedPoint`;
integer arrays are encoded exactly) and split with
:func:`fedhet.crypto.shamir.share` over GF(p), by default p = 2**61 - 1.
Shares of different owners can be combined only when they lie at the same
point x and have the same t (:func:`fedhet.protocols.shamir_share.holder_points`
gives every holder its point from the whole holder list).

Operations on shares (holder side, no communication; they are linear, so the
coordinator reconstructs the same linear function of the secrets):
``add sub neg sum_shares add_public scale matmul lmatmul stack concatenate
lift`` and indexing / ``reshape`` / ``transpose``; operators ``+ - @ *``
work too, with public numpy arrays on either side of ``@``.  A public
operand with an integer dtype is used exactly; a float one is encoded with
its own fractional bits (``frac_bits``, default 16), so the product carries
the *sum* of both fractional-bit counts (f + 16 after one product with a
fixed-point matrix, f + 32 after two).  No truncation is done on shares:
rescaling would need an interactive protocol; reconstruct (and re-share)
instead.  Operands of an addition are brought to a common scale by
:func:`lift` (multiplying by the public ``2**d``, exact).

Range and error.  Every :class:`SharedArray` carries two public numbers,
computed only from public data (the owners' declared ``max_abs``, the public
operands, the sequence of operations):

* ``bound``: an upper bound on ``|v|`` for every element v of the encoded
  integer the shares hide (centred).  Each operation computes the new bound
  (sums add bounds; a product with a public matrix M multiplies the bound by
  the largest absolute column sum of the encoded M; ...) and raises
  :class:`ShareRangeError` *before* computing anything if it could exceed
  ``(p - 1) / 2``, beyond which the centred decoding would wrap around.
* ``err``: an upper bound on ``|decoded - exact|`` per element, where exact is
  the same computation done on the owners' original values in exact real
  arithmetic: ``2**-(f + 1)`` from the owners' rounding, propagated through
  the operations together with the rounding of float public operands.  The
  coordinator's :class:`Reconstruction` reports it (up to float64 rounding).

The owner's ``max_abs`` is public (it travels with the shares).  Pass a bound
that follows from public knowledge (a clip, a data range); left out, it is
the smallest power of two at least the largest encoded magnitude, which
reveals that power of two to the holders.

What is revealed (semi-honest parties).  A coalition of at most t - 1 holders
sees shares that are uniformly distributed whatever the secrets are
(:mod:`fedhet.crypto.shamir`), plus the public metadata (shape, t, f, bound,
err, tag); their local computations add nothing.  The coordinator sees the
holders' shares of the *result* only: the non-constant coefficients of the
result polynomial are the public linear map applied to the owners' random
coefficients, so the coordinator learns the result and nothing else, even
together with up to t - 1 holders (their input shares determine those random
coefficients given the result).  Any t holders together can reconstruct every
secret: the trust assumption is that fewer than t of them collude.
"""
from __future__ import annotations

import functools

import math
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from fedhet.crypto import field_matmul, shamir
from fedhet.crypto.field import F61, PrimeField
from fedhet.crypto.fixedpoint import DEFAULT_FRAC_BITS, FixedPoint
from fedhet.crypto.prg import PRG
from fedhet.parties.api import PartyError, PeerFault, PeersDisagree

__all__ = [
    "SharedArray", "ShamirError", "ShareRangeError", "PUBLIC_FRAC_BITS", "PublicOperand",
    "share_array", "reconstruct_shares", "interpolate", "decode_fixed", "check_threshold", "max_signed",
    "add", "sub", "neg", "sum_shares", "add_public", "scale", "matmul", "lmatmul", "batched_lmatmul", "stack",
    "concatenate", "lift", "encode_public", "public_matmul", "contiguous_u64",
]

PUBLIC_FRAC_BITS = DEFAULT_FRAC_BITS  # fractional bits of float public operands unless told otherwise
_MAX_EXACT = 1 << 53                   # integers beyond this do not survive float64


class ShamirError(PartyError):
    """The protocol cannot produce a result: too few holders answered, inconsistent or malformed shares.
    Raised as such for this party's own data; a peer's message is judged by the two below."""


class ShamirFault(ShamirError, PeerFault):
    """A peer's share message is wrong by itself (version, tag, field, range, threshold): names it."""


class ShamirDisagree(ShamirError, PeersDisagree):
    """Shares of several peers do not fit together and nothing shows whose is wrong: names none."""


class ShareRangeError(ValueError):
    """A value, or the result of an operation on shares, could leave the field's signed range."""


# ------------------------------------------------------------- checks
def check_threshold(t, m: int) -> int:
    """``t`` as an int in 1..m (the number of holders); TypeError / ValueError naming it otherwise."""
    if not isinstance(t, (int, np.integer)) or isinstance(t, bool):
        raise TypeError(f"threshold t must be an int, got {type(t).__name__}")
    if not 1 <= int(t) <= m:
        raise ValueError(f"threshold t must be in 1..{m} (the number of holders), got {t}")
    return int(t)


def max_signed(fld: PrimeField) -> int:
    """The largest |v| the centred decoding of ``fld`` represents: (p - 1) / 2."""
    return (fld.p - 1) // 2


def _check_range(bound: int, frac_bits: int, fld: PrimeField, what: str) -> int:
    if bound > max_signed(fld):
        raise ShareRangeError(
            f"{what}: the result could reach |value| = {bound} (= {math.ldexp(float(bound), -frac_bits):.4g} "
            f"at {frac_bits} fractional bits), beyond (p - 1) / 2 = {max_signed(fld)} of {fld!r}, so it could "
            f"wrap around; use fewer fractional bits, a smaller max_abs, or reconstruct (and re-share) first")
    return bound


# ----------------------------------------------------------- shared array
@dataclass(frozen=True, eq=False)
class SharedArray:
    """One holder's Shamir share of an array, with the public facts about the hidden value.

    ``values``: uint64 field elements, the share at point ``x`` of a t-of-m
    sharing; the hidden array is an integer array v with ``|v| <= bound``
    that decodes to ``v * 2**-frac_bits`` within ``err`` of the exact value.
    """
    values: np.ndarray
    x: int
    t: int
    frac_bits: int
    bound: int
    err: float
    field: PrimeField = F61

    __array_ufunc__ = None  # numpy defers to our reflected operators (public array @ shares)

    @property
    def shape(self) -> tuple:
        return self.values.shape

    @property
    def ndim(self) -> int:
        return self.values.ndim

    @property
    def max_abs(self) -> float:
        """Public bound on the absolute value of the hidden (decoded) array."""
        return math.ldexp(float(self.bound), -self.frac_bits)

    def _like(self, values: np.ndarray, **changes) -> "SharedArray":
        return replace(self, values=values, **changes)

    # Shape manipulation is linear and free: every holder does the same to its share.
    def __getitem__(self, idx) -> "SharedArray":
        return self._like(np.asarray(self.values[idx]))

    def reshape(self, *shape) -> "SharedArray":
        return self._like(self.values.reshape(*shape))

    def transpose(self, *axes) -> "SharedArray":
        return self._like(self.values.transpose(*axes))

    @property
    def T(self) -> "SharedArray":
        return self.transpose()

    def __add__(self, other):
        return add(self, other) if isinstance(other, SharedArray) else add_public(self, other)

    __radd__ = __add__

    def __sub__(self, other):
        return sub(self, other) if isinstance(other, SharedArray) else add_public(self, -np.asarray(other))

    def __rsub__(self, other):
        return add_public(neg(self), other)

    def __neg__(self):
        return neg(self)

    def __mul__(self, c):
        if isinstance(c, SharedArray):
            return NotImplemented  # a product of two secrets needs an interactive protocol
        return scale(self, c)

    __rmul__ = __mul__

    def __matmul__(self, m):
        return NotImplemented if isinstance(m, SharedArray) else matmul(self, m)

    def __rmatmul__(self, m):
        return lmatmul(m, self)

    def __repr__(self) -> str:
        return (f"SharedArray(shape={self.shape}, x={self.x}, t={self.t}, frac_bits={self.frac_bits}, "
                f"max_abs={self.max_abs:.4g}, err={self.err:.3g}, field={self.field!r})")


def _same_sharing(items: Sequence[SharedArray], what: str) -> None:
    if not items:
        raise ValueError(f"{what}: nothing to combine")
    for a in items:
        if not isinstance(a, SharedArray):
            raise TypeError(f"{what}: expected SharedArray operands, got {type(a).__name__}")
    a0 = items[0]
    for a in items[1:]:
        if (a.x, a.t, a.field) != (a0.x, a0.t, a0.field):
            raise ValueError(f"{what}: shares of different sharings cannot be combined "
                             f"(point x={a0.x} vs {a.x}, t={a0.t} vs {a.t}, {a0.field!r} vs {a.field!r}); "
                             "every owner must share to the same holder list")


def lift(a: SharedArray, frac_bits: int) -> SharedArray:
    """The same value at ``frac_bits`` >= a.frac_bits fractional bits (shares times the public 2**d)."""
    d = int(frac_bits) - a.frac_bits
    if d < 0:
        raise ValueError(f"lift can only add fractional bits ({a.frac_bits} -> {frac_bits}); "
                         "dropping bits (truncation) needs reconstruction")
    if d == 0:
        return a
    bound = _check_range(a.bound << d, int(frac_bits), a.field, f"lift to {frac_bits} fractional bits")
    return a._like(a.field.mul_pow2(a.values, d), frac_bits=int(frac_bits), bound=bound)


def _aligned(items: Sequence[SharedArray], what: str) -> list[SharedArray]:
    _same_sharing(items, what)
    f = max(a.frac_bits for a in items)
    return [lift(a, f) for a in items]


def add(a: SharedArray, b: SharedArray) -> SharedArray:
    """Shares of a + b (numpy broadcasting); the operands are brought to a common scale first."""
    return sum_shares([a, b])


def sub(a: SharedArray, b: SharedArray) -> SharedArray:
    """Shares of a - b."""
    a, b = _aligned([a, b], "sub")
    bound = _check_range(a.bound + b.bound, a.frac_bits, a.field, "sub")
    return a._like(a.field.sub(a.values, b.values), bound=bound, err=a.err + b.err)


def neg(a: SharedArray) -> SharedArray:
    """Shares of -a."""
    _same_sharing([a], "neg")
    return a._like(a.field.neg(a.values))


def sum_shares(items: Iterable[SharedArray]) -> SharedArray:
    """Shares of the sum of several shared arrays, e.g. over owners (numpy broadcasting)."""
    items = _aligned(list(items), "sum_shares")
    a0 = items[0]
    bound = _check_range(sum(a.bound for a in items), a0.frac_bits, a0.field, f"sum of {len(items)} arrays")
    fld = a0.field
    acc = np.array(a0.values, dtype=np.uint64, copy=True)
    for a in items[1:]:
        shape = _broadcast(acc.shape, a.values.shape, "sum_shares")
        if acc.shape != shape:
            acc = np.broadcast_to(acc, shape).copy()
        fld.add(acc, a.values, out=acc)
    return a0._like(acc, bound=bound, err=sum(a.err for a in items))


def _stack_like(items: Sequence[SharedArray], what: str, fn) -> SharedArray:
    items = _aligned(list(items), what)
    return items[0]._like(fn([a.values for a in items]), bound=max(a.bound for a in items),
                          err=max(a.err for a in items))


def stack(items: Sequence[SharedArray], axis: int = 0) -> SharedArray:
    """Shares of ``np.stack`` of the hidden arrays (e.g. owners' aligned representations as rows)."""
    return _stack_like(items, "stack", lambda vs: np.stack(vs, axis=axis))


def concatenate(items: Sequence[SharedArray], axis: int = 0) -> SharedArray:
    """Shares of ``np.concatenate`` of the hidden arrays."""
    return _stack_like(items, "concatenate", lambda vs: np.concatenate(vs, axis=axis))


# ------------------------------------------------------- public operands
@dataclass(frozen=True)
class PublicOperand:
    """A public operand encoded for products with shares (:func:`encode_public`)."""

    encoded: np.ndarray | None   # field elements (None: made from ``signed`` when first needed)
    signed: np.ndarray   # the encoded integers (int64), centred
    real: np.ndarray     # the public operand as given (float64)
    frac_bits: int
    field: PrimeField | None = None
    rounding: np.ndarray | None = None   # |encoded / 2**frac_bits - real| per element, when known

    @functools.cached_property
    def enc(self) -> np.ndarray:
        """Field elements; the BLAS products need only ``signed``, so large operands skip this."""
        if self.encoded is not None:
            return self.encoded
        assert self.field is not None
        return self.field.from_int(self.signed)

    @property
    def T(self) -> "PublicOperand":
        return PublicOperand(None if self.encoded is None else self.encoded.T, self.signed.T, self.real.T,
                             self.frac_bits, self.field, None if self.rounding is None else self.rounding.T)


def public_matmul(a: np.ndarray, pub: PublicOperand, fld: PrimeField) -> np.ndarray:
    """``a @ M mod p`` for shares a (..., K) and a public M given by its small signed integers.

    A public operand is a small signed integer (a fixed-point value), unlike a
    share, which is a uniform element of up to 61 bits: only the share is split
    into digits, and one float64 BLAS product does all of them exactly
    (:func:`fedhet.crypto.field_matmul.matmul_trusted`, which falls back to the
    generic :meth:`PrimeField.matmul` when M is too large for an exact split).
    """
    ms = pub.signed
    if a.ndim < 1 or ms.ndim < 1 or a.shape[-1] != ms.shape[0]:
        return fld.matmul(a, pub.enc)
    if a.ndim == 2 and ms.ndim == 2 and a.T.flags.c_contiguous and not a.flags.c_contiguous:
        # a is the transpose of contiguous shares x (lmatmul): a @ M = (M^T @ x)^T, no copy of x
        return field_matmul.lmatmul_trusted(ms.T, a.T, fld).T
    return field_matmul.matmul_trusted(a, ms, fld)


def encode_public(c, frac_bits: int | None, fld: PrimeField, what: str, at: int | None = None) -> PublicOperand:
    """Encode a public operand: integers exactly (0 fractional bits), floats with ``frac_bits`` (default 16).

    ``at`` forces the fractional bits (adding a constant to shares at that scale).
    """
    real, scaled, rounding, fb = _encode_scaled(c, frac_bits, fld, what, at)
    return PublicOperand(None, scaled.astype(np.int64), real, fb, fld, rounding)


def _encode_scaled(c, frac_bits: int | None, fld: PrimeField, what: str, at: int | None = None) -> tuple:
    """:func:`encode_public`'s checks and rounding: (real float64, the encoded integers as float64 (exact,
    |x| < 2**53), |encoded / 2**f - real| per element, f).  Large products use the float form directly."""
    if isinstance(c, SharedArray):
        raise TypeError(f"{what}: the operand must be public (a number or array), not shares; a product of two "
                        "shared values needs an interactive protocol")
    if hasattr(c, "detach"):  # torch tensor
        c = c.detach().cpu().numpy()
    arr = np.asarray(c)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{what}: public operand must be numeric, got dtype {arr.dtype}")
    real = arr.astype(np.float64, copy=False)
    if real.size and not np.all(np.isfinite(real)):
        raise ValueError(f"{what}: the public operand contains NaN or inf")
    if at is not None:
        fb = int(at)
    elif arr.dtype.kind in "iu":
        fb = 0
    else:
        fb = PUBLIC_FRAC_BITS if frac_bits is None else int(frac_bits)
        if not 0 <= fb < 62:
            raise ValueError(f"{what}: frac_bits must be in [0, 62), got {fb}")
    if arr.dtype.kind in "iu" and real.size and float(np.max(np.abs(real))) >= _MAX_EXACT:
        raise ShareRangeError(f"{what}: public integers must stay below 2**53 in absolute value")
    # times 2**fb by multiplication: exact like np.ldexp (a power of two) and about 8x faster, which
    # matters for F³'s per-sample graphs (every holder encodes one (batch, n, n) operand per step)
    exact = np.multiply(real, math.ldexp(1.0, fb), out=np.empty(real.shape))
    scaled = np.rint(exact)
    top = max(float(scaled.max()), -float(scaled.min())) if scaled.size else 0.0
    if top >= _MAX_EXACT or top > max_signed(fld):
        raise ShareRangeError(f"{what}: the public operand times 2**{fb} reaches {top:.4g}, beyond 2**53 or "
                              f"(p - 1) / 2 of {fld!r}; use fewer fractional bits")
    # |encoded / 2**f - real|, from the arrays at hand (the difference of two close floats is exact)
    np.subtract(scaled, exact, out=exact)
    np.abs(exact, out=exact)
    return real, scaled, np.multiply(exact, math.ldexp(1.0, -fb), out=exact), fb


def _broadcast(s1: tuple, s2: tuple, what: str) -> tuple:
    try:
        return np.broadcast_shapes(s1, s2)
    except ValueError:
        raise ValueError(f"{what}: shapes {s1} and {s2} do not broadcast") from None


def _abs_sum_max(signed: np.ndarray, axis) -> int:
    """max over the other axes of sum over ``axis`` of |signed|, exactly (Python int)."""
    a = np.abs(signed)
    if a.size == 0:
        return 0
    n = a.shape[axis] if axis is not None else a.size
    if int(a.max()) * max(n, 1) < (1 << 62):
        return int(np.sum(a, axis=axis).max())
    return int(np.max(np.sum(a.astype(object), axis=axis)))


def _enc_err(pub: PublicOperand) -> np.ndarray:
    """|encoded / 2**f - real| per element: the rounding of the public operand."""
    if pub.rounding is not None:
        return pub.rounding
    return np.abs(pub.signed.astype(np.float64) * math.ldexp(1.0, -pub.frac_bits) - pub.real)


def _product_meta(a: SharedArray, pub_frac_bits: int, int_norm: int, real_norm: float, err_norm: float,
                  what: str) -> tuple[int, int, float]:
    f = a.frac_bits + pub_frac_bits
    bound = _check_range(a.bound * int_norm, f, a.field, what)
    # |a_enc M_enc - a M| <= |a_enc| |M_enc - M| + |a_enc - a| |M|, summed along the contraction
    err = a.max_abs * err_norm + a.err * real_norm
    return f, bound, err


def scale(a: SharedArray, c, frac_bits: int | None = None) -> SharedArray:
    """Shares of ``a * c`` for a public scalar or array c (elementwise, broadcasting)."""
    _same_sharing([a], "scale")
    pub = encode_public(c, frac_bits, a.field, "scale")
    _broadcast(a.shape, pub.enc.shape, "scale")
    int_norm = int(np.abs(pub.signed).max()) if pub.signed.size else 0
    real_norm = float(np.abs(pub.real).max()) if pub.real.size else 0.0
    err_norm = float(_enc_err(pub).max()) if pub.real.size else 0.0
    f, bound, err = _product_meta(a, pub.frac_bits, int_norm, real_norm, err_norm, "scale")
    return a._like(a.field.mul(a.values, pub.enc), frac_bits=f, bound=bound, err=err)


def add_public(a: SharedArray, c) -> SharedArray:
    """Shares of ``a + c`` for a public c (e.g. a bias): every holder adds c, encoded at a's scale."""
    _same_sharing([a], "add_public")
    pub = encode_public(c, None, a.field, "add_public", at=a.frac_bits)
    shape = _broadcast(a.shape, pub.enc.shape, "add_public")
    top = int(np.abs(pub.signed).max()) if pub.signed.size else 0
    bound = _check_range(a.bound + top, a.frac_bits, a.field, "add_public")
    err = a.err + (float(_enc_err(pub).max()) if pub.signed.size else 0.0)
    vals = a.field.add(np.broadcast_to(a.values, shape), np.broadcast_to(pub.enc, shape))
    return a._like(vals, bound=bound, err=err)


def matmul(a: SharedArray, m, frac_bits: int | None = None) -> SharedArray:
    """Shares of ``a @ m`` for a public matrix (or vector) m (numpy matmul semantics, a of shape (..., K))."""
    _same_sharing([a], "matmul")
    pub = encode_public(m, frac_bits, a.field, "matmul")
    if pub.signed.ndim not in (1, 2) or a.ndim < 1:
        raise ValueError(f"matmul: needs shares of shape (..., K) and a public (K, N) or (K,), "
                         f"got {a.shape} @ {pub.signed.shape}")
    if a.shape[-1] != pub.signed.shape[0]:
        raise ValueError(f"matmul: shape mismatch {a.shape} @ {pub.signed.shape}")
    # output element j sums over the rows k of column j
    int_norm = _abs_sum_max(pub.signed, 0)
    real_norm = float(np.abs(pub.real).sum(axis=0).max()) if pub.real.size else 0.0
    err_norm = float(_enc_err(pub).sum(axis=0).max()) if pub.real.size else 0.0
    f, bound, err = _product_meta(a, pub.frac_bits, int_norm, real_norm, err_norm, "matmul")
    return a._like(public_matmul(a.values, pub, a.field), frac_bits=f, bound=bound, err=err)


def lmatmul(m, a: SharedArray, frac_bits: int | None = None) -> SharedArray:
    """Shares of ``m @ a`` for a public matrix (or vector) m: numpy semantics, a of shape (K,) or (..., K, N).

    With a batch of stacked owner representations H (batch, n, d) and the
    graph's normalised adjacency (n, n), ``lmatmul(A_hat, H)`` aggregates over
    owners for every sample.
    """
    _same_sharing([a], "lmatmul")
    pub = encode_public(m, frac_bits, a.field, "lmatmul")
    if pub.signed.ndim not in (1, 2) or a.ndim < 1:
        raise ValueError(f"lmatmul: needs a public (J, K) or (K,) and shares of shape (K,) or (..., K, N), "
                         f"got {pub.signed.shape} @ {a.shape}")
    K = a.shape[0] if a.ndim == 1 else a.shape[-2]
    if pub.signed.shape[-1] != K:
        raise ValueError(f"lmatmul: shape mismatch {pub.signed.shape} @ {a.shape}")
    # output row j sums over the columns k of row j
    int_norm = _abs_sum_max(pub.signed, -1)
    real_norm = float(np.abs(pub.real).sum(axis=-1).max()) if pub.real.size else 0.0
    err_norm = float(_enc_err(pub).sum(axis=-1).max()) if pub.real.size else 0.0
    f, bound, err = _product_meta(a, pub.frac_bits, int_norm, real_norm, err_norm, "lmatmul")
    fld = a.field
    if a.ndim == 1:
        vals = public_matmul(a.values, pub.T, fld)          # m @ a == a @ m^T for a vector a
    else:
        vals = public_matmul(np.swapaxes(a.values, -1, -2), pub.T, fld)   # (..., N, J) or (..., N)
        if pub.signed.ndim == 2:
            vals = np.swapaxes(vals, -1, -2)
    return a._like(contiguous_u64(vals), frac_bits=f, bound=bound, err=err)


def batched_lmatmul(m, a: SharedArray, frac_bits: int | None = None) -> SharedArray:
    """Shares of ``m[b] @ a[b]`` for every b: a public (B, J, K) and shares (B, K, N).

    F³'s graph per sample: ``batched_lmatmul(A_hat, G)`` with A_hat (batch, n, n) and G (batch, n, d)
    is one call instead of one :func:`lmatmul` per sample (same result, same bound).
    """
    _same_sharing([a], "batched_lmatmul")
    # the encoded integers stay float64 (exact): the product wants them as float64, and at F³'s
    # (batch, n, n) graphs two int64 <-> float64 conversions cost as much as the encoding
    real, scaled, rounding, fb = _encode_scaled(m, frac_bits, a.field, "batched_lmatmul")
    ps = scaled.shape
    if len(ps) != 3 or a.ndim != 3 or ps[0] != a.shape[0] or ps[2] != a.shape[1]:
        raise ValueError(f"batched_lmatmul: needs a public (B, J, K) and shares (B, K, N), got {ps} @ "
                         f"{a.shape}")
    if not scaled.size:
        int_norm, real_norm, err_norm = 0, 0.0, 0.0
    else:
        mag = np.abs(scaled)
        # a float64 sum of K integers below 2**53 / K is exact; beyond that, the exact integer path
        int_norm = (int(mag.sum(axis=-1).max()) if float(mag.max()) * ps[2] < _MAX_EXACT
                    else _abs_sum_max(scaled.astype(np.int64), -1))
        real_norm = float(np.abs(real).sum(axis=-1).max())
        err_norm = float(rounding.sum(axis=-1).max())
    f, bound, err = _product_meta(a, fb, int_norm, real_norm, err_norm, "batched_lmatmul")
    vals = field_matmul.batched_lmatmul_trusted(scaled, contiguous_u64(a.values), a.field, rowmax=int_norm)
    return a._like(vals, frac_bits=f, bound=bound, err=err)


# ----------------------------------------------------------- local sharing
def _as_numeric(array) -> np.ndarray:
    if hasattr(array, "detach"):  # torch tensor
        array = array.detach().cpu().numpy()
    arr = np.asarray(array)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"can only share numeric arrays, got dtype {arr.dtype}")
    return arr


def share_array(array, m: int, t: int, *, frac_bits: int = DEFAULT_FRAC_BITS, max_abs: float | None = None,
                field: PrimeField = F61, prg: PRG | None = None) -> list[SharedArray]:
    """Fixed-point encode and t-of-m share an array locally: one :class:`SharedArray` per point 1..m.

    ``max_abs`` is the public bound on |array| (ValueError if the data exceed
    it); None: the smallest power of two >= the largest encoded magnitude
    (which the holders then learn).  Integer arrays are encoded exactly.
    """
    arr = _as_numeric(array)
    if not isinstance(m, (int, np.integer)) or isinstance(m, bool) or int(m) < 1:
        raise ValueError(f"number of holders m must be a positive int, got {m!r}")
    m, t = int(m), check_threshold(t, int(m))
    if not isinstance(frac_bits, (int, np.integer)) or isinstance(frac_bits, bool) or not 0 <= int(frac_bits) < 62:
        raise ValueError(f"frac_bits must be an int in [0, 62), got {frac_bits!r}")
    f = int(frac_bits)
    exact = arr.dtype.kind in "iu"
    if exact and arr.size and float(np.max(np.abs(arr.astype(np.float64)))) * 2.0**f >= _MAX_EXACT:
        raise ShareRangeError("integer array times 2**frac_bits reaches 2**53; it would lose precision in float64")
    x = arr.astype(np.float64)
    if x.size and not np.all(np.isfinite(x)):
        raise ValueError("cannot share NaN or inf")
    top = float(np.max(np.abs(x))) if x.size else 0.0
    if top * 2.0**f > max_signed(field):
        raise ShareRangeError(f"array has |x| = {top:.6g}, beyond the field's range at {f} fractional bits "
                              f"(|x| <= {math.ldexp(float(max_signed(field)), -f):.6g}); use fewer fractional bits")
    if max_abs is None:
        # Reveal only the power of two above the largest encoded magnitude.
        enc_top = max(1, int(np.rint(math.ldexp(top, f))))
        bound = 1 << (enc_top - 1).bit_length()
    else:
        max_abs = float(max_abs)
        if not (math.isfinite(max_abs) and max_abs >= 0):
            raise ValueError(f"max_abs must be a finite non-negative number, got {max_abs}")
        if top > max_abs:
            raise ValueError(f"array has |x| = {top:.6g} > max_abs = {max_abs:.6g}, the declared public bound")
        bound = math.ceil(math.ldexp(max_abs, f))
    _check_range(bound, f, field, f"sharing with max_abs = {math.ldexp(float(bound), -f):.4g}")
    enc = FixedPoint(f, modulus=field.p).encode(x)
    rows = shamir.share(enc, m, t, prg=prg, field=field)
    err = 0.0 if exact else math.ldexp(1.0, -(f + 1))
    return [SharedArray(rows[i], i + 1, t, f, int(bound), err, field) for i in range(m)]


def reconstruct_shares(items: Sequence[SharedArray], t: int | None = None) -> np.ndarray:
    """Decode the hidden array from shares at distinct points (at least t of them); float64."""
    items = list(items)
    _same_sharing_but_points(items, "reconstruct")
    a0 = items[0]
    t = a0.t if t is None else int(t)
    if len(items) < t:
        raise ShamirError(f"need at least t={t} shares to reconstruct, got {len(items)}")
    raw = interpolate([a.values for a in items], [a.x for a in items], t, a0.field, [str(a.x) for a in items])
    return decode_fixed(raw, a0.frac_bits, a0.field)


def _same_sharing_but_points(items: Sequence[SharedArray], what: str) -> None:
    if not items:
        raise ShamirError(f"{what}: no shares")
    a0 = items[0]
    for a in items:
        if not isinstance(a, SharedArray):
            raise TypeError(f"{what}: expected SharedArray, got {type(a).__name__}")
        if (a.t, a.field, a.frac_bits, a.shape) != (a0.t, a0.field, a0.frac_bits, a0.shape):
            raise ShamirError(f"{what}: shares disagree on t, field, frac_bits or shape")
    if len({a.x for a in items}) != len(items):
        raise ShamirError(f"{what}: two shares at the same point")


def decode_fixed(raw: np.ndarray, frac_bits: int, fld: PrimeField) -> np.ndarray:
    """Field elements -> float64 (centred, times 2**-frac_bits), any shape."""
    # FixedPoint.decode works on 1-d and up; a 0-d result goes through shape (1,)
    return FixedPoint(0, modulus=fld.p).decode(raw.reshape(-1), frac_bits=frac_bits).reshape(raw.shape)


def interpolate(rows: list[np.ndarray], xs: list[int], t: int, fld: PrimeField, names: list[str]) -> np.ndarray:
    """The secret (field elements) from the first t shares; every further share must lie on the same polynomial.

    ``names[i]`` names the sender of ``rows[i]`` in the error raised when it does not.
    """
    base_x = xs[:t]
    raw = shamir.reconstruct(np.stack(rows[:t]), base_x, field=fld)
    for r, x, who in zip(rows[t:], xs[t:], names[t:]):
        lam = shamir.lagrange_coefficients(base_x, at=x, field=fld)
        pred = fld.mul(rows[0], lam[0])
        for i in range(1, t):
            fld.add(pred, fld.mul(rows[i], lam[i]), out=pred)
        if not np.array_equal(pred, r):
            raise ShamirDisagree("", list(names), "shares", f"inconsistent shares: the share of {who} (x={x}) does "
                                 f"not lie on the polynomial through the shares at x={base_x}; a holder computed "
                                 "something else or sent corrupted data")
    return raw


def contiguous_u64(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous uint64 array of the same shape (0-d stays 0-d)."""
    # np.ascontiguousarray would turn a 0-d array into shape (1,)
    return np.require(a, dtype=np.uint64, requirements="C")
