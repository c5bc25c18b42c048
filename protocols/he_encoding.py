"""Encodings of the HE interactive layer: its settings, and how its numbers become exact integers and bytes.

The layer (:mod:`fedhet.protocols.he_interactive`) computes on exact integers for the schemes
"paillier" and "naive":

* ``A_g`` is rounded to ``a_frac_bits`` fractional bits (``|A_g| < 2**a_int_bits``, checked;
  :func:`quantize_acts`), ``W_g``/``eps`` live on the grid ``2**-w_frac_bits``
  (:func:`quantize`, the rounding of :mod:`fedhet.crypto.fixedpoint`), the per-sample ``delta``
  is clipped to ``|delta| < 2**d_int_bits`` and rounded to ``d_frac_bits``
  (:func:`quantize_delta`).  The forward output is then exactly ``round(A_g) @ W``
  (:func:`int_dot`).
* The weight update is ``step(X) = round(lr * X / (b * 2**(a_frac+d_frac-w_frac)))`` with ``lr``
  on a ``2**-lr_frac_bits`` grid (:func:`weight_step`), so ``W_g + eps`` moves by ``-step(G)``
  up to one grid unit per step.
* Masks are statistical (:func:`uniform_ints`, from the OS CSPRNG): the host's ``e_B``, ``e_W``
  are uniform over ``+-2**(slot_bits-2)`` and the call fails unless that is at least
  ``2**mask_bits`` times the (public) bound of what they hide (:func:`int_bound`;
  :class:`SlotOverflowError`, a ``PartyError``, naming what to raise); the guest's ``nu`` is uniform
  over ``2**mask_bits`` times the public bound of ``G`` for the batch's ``rows``
  (``rows * 2**(a_int+a_frac+d_int+d_frac)``, :meth:`LayerSpec.grad_bits`).
* Masked integers travel as fixed-width two's complement little-endian bytes
  (:func:`encode_masked` / :func:`decode_masked`, ``masked_bytes`` per value).
* Integers too large for a float64 go through the float API of :mod:`fedhet.crypto.paillier`
  as signed digits of ``DIGIT_BITS`` bits each (:func:`digits`), every one exact in a float64.

Slot width (``slot_bits = "auto"``, the default; an int overrides it): :func:`slot_budget` derives
it from public parameters only, so host, guest and the message declarations agree.  In grid units,
with ``a = a_int+a_frac``, ``g = d_int+d_frac``, ``sh = a_frac+d_frac-w_frac+lr_frac`` and
``L = lr * 2**lr_frac``, for a link of guest width ``d`` and interactive width ``K``:

* one step moves ``eps`` by ``step(nu)``, ``|step(nu)| <= s = ceil(L 2**(mask+a+g+1-sh)) + 1``
  (``nu`` is sized by the batch's rows, so ``s`` does not depend on them; ``|E step(nu)| <= mu =
  ceil(L 2**-(sh+1)) + 1``) and the true weight ``W`` by ``step(G)``, at most
  ``s_G = ceil(L 2**(a+g-sh)) + 1``;
* ``eps`` is a random walk of independent steps: by Hoeffding's maximal inequality, with
  probability at least ``1 - 2**-SLOT_FAILURE_BITS`` every entry of it stays within
  ``T mu + x``, ``x = (s + mu) sqrt(2 T ln(2 d K 2**SLOT_FAILURE_BITS))``, over ``T = max_steps``
  training steps; so ``|W_g| = |W - eps| <= W_max = 2**w_frac + T s_G + T mu + x`` (``|W_0| <= 1``);
* forward (``d`` products summed per output): ``int_bound <= 2**a * d * W_max`` and ``e_B`` needs
  ``mask_bits`` + 2 bits above it;
* weight gradient (``batch_size`` products): ``|G| < 2**(bitlen(batch_size)+a+g)`` (the guest's
  ``nu`` on top stays below ``2**(slot_bits-2)``) plus ``mask_bits`` + 2;
* input gradient (``K`` products): ``[[delta eps^T]] + delta W_g^T`` is tracked below
  ``K 2**g (2 |eps| + W_max) <= 3 K 2**g W_max`` and must stay under the signed capacity
  ``2**(slot_bits-1)``;
* and at least ``mask_bits + 8``.  The width is the largest of these.

With he_split's defaults (``mask_bits`` 40, ``a`` = ``g`` = 18, ``w_frac`` 16, ``lr`` 0.3,
``batch_size`` 128, ``d`` = ``K`` = 8): ``s`` is about ``2**63.3`` and the walk adds 3-13 bits:
``x`` is about ``2**66.3`` for T = 1, ``2**70.1`` for T = 200 (cancer's 100 epochs),
``2**72.9`` for 9,400 (payment's), ``2**76.1`` for 819,200 (he_split's default plan for 100 epochs,
``he_max_steps``) and ``2**76.3`` for ``DEFAULT_MAX_STEPS`` = 2**20.  The forward bound is the
largest term: 130, 134, 136, 140 and 140-bit slots (15, 15, 15, 14 and 14 per 2048-bit plaintext,
against 12 of 160 bits); the weight gradient needs 86 bits and the input gradient 90-100.
Running past ``max_steps`` is still safe: every mask checks its margin against
the actual values and fails with :class:`SlotOverflowError` naming ``max_steps`` and ``slot_bits``.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

import numpy as np

from fedhet.crypto.fixedpoint import quantize
from fedhet.crypto.paillier_packing import PackingOverflowError
from fedhet.parties.api import PartyError

__all__ = [
    "SCHEMES", "DIGIT_BITS", "AUTO", "DEFAULT_MAX_STEPS", "SLOT_FAILURE_BITS", "LayerSpec", "SlotBudget",
    "SlotOverflowError", "slot_budget", "masked_bytes", "quantize", "max_abs_int", "digits", "uniform_ints",
    "encode_masked", "decode_masked", "round_div", "weight_step", "quantize_delta", "count_clipped",
    "quantize_acts", "int_dot", "int_bound",
]

SCHEMES = ("paillier", "naive", "ckks")
DIGIT_BITS = 48  # bits per exact float digit when big integers go through the float API of crypto.paillier
AUTO = "auto"  # slot_bits: derive the width from the other parameters (slot_budget)
DEFAULT_MAX_STEPS = 1 << 20  # training steps an auto slot width is sized for unless told
SLOT_FAILURE_BITS = 40  # a run within max_steps outgrows auto slots with probability below 2**-40


class SlotOverflowError(PartyError, PackingOverflowError):
    """Values outgrew the slots (too little mask margin or slot capacity); the text names what to raise."""


@dataclass(frozen=True)
class LayerSpec:
    """Scheme, key and fixed-point/masking parameters; both sides must use the same."""

    scheme: str = "paillier"
    key_bits: int = 2048
    slot_bits: int | str = AUTO  # bits per slot, or "auto": slot_budget(...) once the widths are known (resolve)
    a_int_bits: int = 6
    a_frac_bits: int = 12
    w_frac_bits: int = 16
    d_int_bits: int = 2
    d_frac_bits: int = 16
    mask_bits: int = 40
    lr: float = 0.1
    lr_frac_bits: int = 30
    batch_size: int = 128  # public bound on rows per batch (sizes the gradient's slot budget)
    max_steps: int = DEFAULT_MAX_STEPS  # training steps an auto slot width is sized for
    ckks_params: str = "fast"
    ckks_mask: float = 1024.0
    pool: bool = True  # precompute Paillier obfuscators in background threads
    workers: int = 1   # worker processes for Paillier (1: in-process)
    # Paillier obfuscators: "short_exponent" (DJN h**x, 2*kappa-bit x, fixed-base tables; the default, since
    # decrypted values and so trained models are the same either way) or "standard" (r**n, DCR only).
    obfuscation: str = "short_exponent"
    kappa: int = 128

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"he scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.slot_bits != AUTO and (not isinstance(self.slot_bits, (int, np.integer))
                                       or isinstance(self.slot_bits, bool) or self.slot_bits < 1):
            raise ValueError(f"LayerSpec.slot_bits must be a positive int or {AUTO!r}, got {self.slot_bits!r}")
        for f in ("key_bits", "max_steps", "a_int_bits", "a_frac_bits", "w_frac_bits", "d_int_bits",
                  "d_frac_bits", "mask_bits", "lr_frac_bits", "batch_size", "workers"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"LayerSpec.{f} must be a non-negative int, got {v!r}")
        if self.batch_size < 1 or self.workers < 1 or self.max_steps < 1:
            raise ValueError("LayerSpec: batch_size, workers and max_steps must be >= 1")
        if self.a_int_bits + self.a_frac_bits > 48 or self.d_int_bits + self.d_frac_bits > 48:
            raise ValueError("LayerSpec: int + frac bits of activations and gradients must be <= 48")
        if self.a_frac_bits + self.d_frac_bits < self.w_frac_bits:
            raise ValueError("LayerSpec: need a_frac_bits + d_frac_bits >= w_frac_bits")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"LayerSpec.lr must be a positive number, got {self.lr!r}")
        if round(self.lr * 2 ** self.lr_frac_bits) < 1:
            raise ValueError(f"LayerSpec.lr={self.lr} rounds to 0 on the 2**-{self.lr_frac_bits} grid")
        if self.slot_bits != AUTO:
            if self.scheme == "paillier" and (self.key_bits - 2) // int(self.slot_bits) < 1:
                raise ValueError(f"slot_bits={self.slot_bits} does not fit a {self.key_bits}-bit key")
            if self.scheme != "ckks" and int(self.slot_bits) < self.mask_bits + 8:
                raise ValueError(f"slot_bits={self.slot_bits} leaves no room for {self.mask_bits}-bit masks")
        if self.obfuscation not in ("standard", "short_exponent"):
            raise ValueError(f"LayerSpec.obfuscation must be 'standard' or 'short_exponent', got {self.obfuscation!r}")
        if not isinstance(self.kappa, (int, np.integer)) or isinstance(self.kappa, bool) or self.kappa < 64:
            raise ValueError(f"LayerSpec.kappa must be an int >= 64, got {self.kappa!r}")
        if not self.ckks_mask > 0:
            raise ValueError("LayerSpec.ckks_mask must be positive")

    @property
    def auto(self) -> bool:
        return self.slot_bits == AUTO

    def resolve(self, d: int, K: int) -> "LayerSpec":
        """This spec with an int ``slot_bits`` for a link of guest width ``d`` and interactive width ``K``
        (``slot_budget``'s width when "auto"; an explicit width as it is)."""
        if not self.auto:
            return self
        width = slot_budget(self, d, K).slot_bits
        try:
            return dataclasses.replace(self, slot_bits=width)
        except ValueError as e:
            raise ValueError(f"auto slot width for d={d}, K={K}, max_steps={self.max_steps}: {e}; lower "
                             "max_steps or mask_bits, or use a larger key") from None

    @property
    def masked_bytes(self) -> int:
        """Bytes per masked integer on the wire (two's complement, little-endian)."""
        if self.auto:
            raise ValueError("LayerSpec.masked_bytes of an auto slot width: resolve(d, K) first")
        return masked_bytes(int(self.slot_bits))

    @property
    def lr_int(self) -> int:
        return int(round(self.lr * 2 ** self.lr_frac_bits))

    @property
    def a_bound_bits(self) -> int:
        return self.a_int_bits + self.a_frac_bits

    def grad_bits(self, rows: int) -> int:
        """Bits of the public bound on |G| (integer units) for a batch of ``rows``: the guest's mask covers it."""
        return int(rows).bit_length() + self.a_int_bits + self.a_frac_bits + self.d_int_bits + self.d_frac_bits

    @property
    def grad_public_bits(self) -> int:
        """:meth:`grad_bits` of a full batch (``batch_size`` rows)."""
        return self.grad_bits(self.batch_size)


@dataclass(frozen=True)
class SlotBudget:
    """The terms of an auto slot width (see the module docstring); bits are bit lengths."""

    step: int          # s: bound on one step of eps (grid units)
    true_step: int     # s_G: bound on one step of the true weight W
    drift: int         # mu: bound on the mean of one step of eps
    walk: int          # x: bound on the centred random walk of eps over max_steps
    w_max: int         # bound on |W_g| over max_steps
    forward_bits: int      # width the forward mask check needs
    gradient_bits: int     # width the weight-gradient mask check needs
    input_grad_bits: int   # width the input gradient's slot capacity needs
    slot_bits: int         # the largest of these and mask_bits + 8

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _ceil_shift(v: int, sh: int) -> int:
    """ceil(v * 2**sh) for ints v >= 0 and any int sh."""
    return v << sh if sh >= 0 else -((-v) >> -sh)


def _isqrt_ceil(v: int) -> int:
    r = math.isqrt(v)
    return r if r * r >= v else r + 1


def slot_budget(spec: LayerSpec, d: int, K: int) -> SlotBudget:
    """The slot width a link of guest width ``d`` and interactive width ``K`` needs for ``spec.max_steps``
    training steps (the module docstring derives it).  Exact integer arithmetic, so every party
    computes the same width; ``ln 2`` is bounded by 7/10 and ``ln(2 d K)`` by ``bitlen(2 d K) ln 2``."""
    d, K, T = int(d), int(K), int(spec.max_steps)
    if d < 1 or K < 1:
        raise ValueError(f"slot_budget: widths must be >= 1, got d={d}, K={K}")
    a, g = spec.a_bound_bits, spec.d_int_bits + spec.d_frac_bits
    sh = spec.a_frac_bits + spec.d_frac_bits - spec.w_frac_bits + spec.lr_frac_bits
    L = spec.lr_int
    s = _ceil_shift(L, spec.mask_bits + a + g + 1 - sh) + 1
    s_G = _ceil_shift(L, a + g - sh) + 1
    mu = _ceil_shift(L, -(sh + 1)) + 1
    c = s + mu
    log_terms = SLOT_FAILURE_BITS + (2 * d * K).bit_length()  # log2(2 d K / delta), rounded up
    x = _isqrt_ceil(2 * T * c * c * log_terms * 7 // 10 + 1)  # c sqrt(2 T ln(2 d K / delta))
    w_max = (1 << spec.w_frac_bits) + T * (s_G + mu) + x
    forward = a + (d * w_max).bit_length() + spec.mask_bits + 2
    gradient = spec.grad_public_bits + spec.mask_bits + 2
    input_grad = g + (3 * K * w_max).bit_length() + 1
    width = max(forward, gradient, input_grad, spec.mask_bits + 8)
    return SlotBudget(s, s_G, mu, x, w_max, forward, gradient, input_grad, width)


def masked_bytes(slot_bits: int) -> int:
    # Masked values are below 2**(slot_bits-1) plus the guest's much smaller additions; two more bytes.
    return (int(slot_bits) + 16) // 8


def max_abs_int(a: np.ndarray) -> int:
    """Largest magnitude in an array of (Python) integers; 0 when empty."""
    return max((abs(int(v)) for v in np.asarray(a, dtype=object).ravel()), default=0)


def digits(a: np.ndarray, chunk: int = DIGIT_BITS) -> list[np.ndarray]:
    """Signed digits d_t (|d_t| < 2**chunk, float64, exact) with a = sum_t d_t * 2**(chunk*t)."""
    a = np.asarray(a, dtype=object)
    n = max(1, -(-max_abs_int(a).bit_length() // chunk))
    mask = (1 << chunk) - 1
    flat = a.ravel().tolist()
    out = []
    for t in range(n):
        sh = chunk * t
        out.append(np.array([float((abs(v) >> sh) & mask) * (1 if v >= 0 else -1) for v in flat],
                            dtype=np.float64).reshape(a.shape))
    return out


def uniform_ints(shape, bits: int) -> np.ndarray:
    """Uniform integers in [-2**bits, 2**bits) from the OS CSPRNG."""
    count = int(np.prod(shape)) if len(shape) else 1
    nbytes = (bits + 1 + 7) // 8
    raw = os.urandom(nbytes * count)
    mask = (1 << (bits + 1)) - 1
    off = 1 << bits
    vals = [(int.from_bytes(raw[i * nbytes:(i + 1) * nbytes], "little") & mask) - off for i in range(count)]
    return np.array(vals, dtype=object).reshape(shape)


def encode_masked(ints: np.ndarray, width: int) -> np.ndarray:
    """Signed ints -> uint8 array (*shape, width), two's complement little-endian."""
    a = np.asarray(ints, dtype=object)
    lim = 1 << (8 * width - 1)
    buf = bytearray()
    for v in a.ravel().tolist():
        v = int(v)
        if not -lim <= v < lim:
            raise OverflowError(f"masked value needs more than {width} bytes")
        buf += (v % (1 << (8 * width))).to_bytes(width, "little")
    return np.frombuffer(bytes(buf), dtype=np.uint8).reshape(*a.shape, width).copy()


def decode_masked(arr: np.ndarray, width: int, shape: tuple | None = None) -> np.ndarray:
    """uint8 array (*shape, width) -> signed Python ints; PartyError naming a wrong dtype or shape."""
    arr = np.asarray(arr)
    if arr.dtype != np.uint8 or arr.ndim < 1 or arr.shape[-1] != width:
        raise PartyError(f"masked integers must be uint8 (..., {width}), got {arr.dtype} {arr.shape}")
    if shape is not None and tuple(arr.shape[:-1]) != tuple(shape):
        raise PartyError(f"masked integers have shape {arr.shape[:-1]}, expected {tuple(shape)}")
    raw = np.ascontiguousarray(arr).tobytes()
    top = 1 << (8 * width - 1)
    full = 1 << (8 * width)
    vals = []
    for i in range(len(raw) // width):
        u = int.from_bytes(raw[i * width:(i + 1) * width], "little")
        vals.append(u - full if u >= top else u)
    return np.array(vals, dtype=object).reshape(arr.shape[:-1])


def round_div(num: int, den: int) -> int:
    """round(num / den), halves up, exact for Python ints (den > 0)."""
    return (2 * num + den) // (2 * den)


def weight_step(x: np.ndarray, rows: int, spec: LayerSpec) -> np.ndarray:
    """step(X) = round(lr * X / (rows * 2**(a_frac + d_frac - w_frac))) on the w grid (ints)."""
    shift = spec.a_frac_bits + spec.d_frac_bits - spec.w_frac_bits + spec.lr_frac_bits
    den = int(rows) << shift
    L = spec.lr_int
    x = np.asarray(x, dtype=object)
    return np.array([round_div(int(v) * L, den) for v in x.ravel().tolist()], dtype=object).reshape(x.shape)


def quantize_delta(delta_ps: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """Per-sample dL/dz clipped to |delta| < 2**d_int_bits, rounded to d_frac_bits (ints)."""
    lim = 2.0 ** spec.d_int_bits - 2.0 ** -spec.d_frac_bits
    return quantize(np.clip(np.asarray(delta_ps, dtype=np.float64), -lim, lim), spec.d_frac_bits,
                    "per-sample gradient delta")


def count_clipped(delta_ps, spec: LayerSpec) -> int:
    """How many per-sample gradient entries :func:`quantize_delta` clips."""
    return int(np.sum(np.abs(np.asarray(delta_ps, dtype=np.float64)) >= 2.0 ** spec.d_int_bits))


def quantize_acts(A: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """The guest's activations rounded to a_frac_bits (ints); ValueError unless finite with |A| < 2**a_int_bits."""
    A = np.asarray(A, dtype=np.float64)
    if not np.all(np.isfinite(A)):
        raise ValueError("guest bottom-model output contains NaN or infinity")
    q = quantize(A, spec.a_frac_bits)
    if A.size and max_abs_int(q) >= 1 << spec.a_bound_bits:
        raise ValueError(f"guest bottom-model output reaches |A| = {np.max(np.abs(A)):.4g}, not below "
                         f"2**a_int_bits = {2 ** spec.a_int_bits}; raise a_int_bits (and slot_bits) or lower "
                         "the learning rate")
    return q


def int_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer matrix product of object arrays."""
    return np.dot(np.asarray(a, dtype=object), np.asarray(b, dtype=object))


def int_bound(a_bits: int, W: np.ndarray) -> int:
    """Public-style bound of |A W| slots: 2**a_bits * max_k sum_j |W[j, k]|."""
    W = np.asarray(W, dtype=object)
    cols = [sum(abs(int(v)) for v in W[:, k]) for k in range(W.shape[1])] if W.size else [0]
    return (1 << a_bits) * max(cols)
