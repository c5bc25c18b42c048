"""Slot packing of fixed-point integers into Paillier plaintexts, and the headroom bound that keeps it exact.

Fixed point
    A float ``x`` is the integer ``round(x * 2**frac_bits)``
    (:func:`fedhet.crypto.fixedpoint.quantize`).  A ``PackingSpec`` states
    ``int_bits`` (inputs must satisfy ``|x| < 2**int_bits``) and ``frac_bits``
    (absolute rounding error ``<= 2**-(frac_bits+1)`` per value).

Packing (signed slots, borrow-tolerant decoding)
    ``k = (key_bits - 2) // slot_bits`` values go into one plaintext as the
    *signed* integer ``T = sum_s a_s * 2**(s*slot_bits)`` (:func:`pack_rows`),
    reduced mod n (a negative ``T`` becomes ``n - |T|``).  Paillier adds
    plaintexts mod n and ``c**w`` multiplies them by ``w`` mod n, and because
    ``T`` is an ordinary integer these act slot-wise: ``T1 + T2 = sum_s (a_s +
    b_s) 2**(sB)`` and ``w*T = sum_s (w*a_s) 2**(sB)``, for any signed integer
    ``w`` (a negative ``w`` is the exponent ``n - |w|``, i.e. ``c**-1`` raised
    to ``|w|``).  Decryption lifts ``m`` to ``(-n/2, n/2)`` and peels slots from
    the bottom (:func:`unpack_signed`): the low ``B`` bits read as two's
    complement give ``a_0`` (in ``[-2**(B-1), 2**(B-1))``), subtract it, shift
    by ``B``, repeat.  This is exact whenever every slot satisfies ``|a_s| <
    2**(B-1)`` (then also ``|T| < 2**(k*B-1) <= n/4``), so negative values and
    negative weights need no offsets and no unpacking.

Headroom (what the bound allows)
    Fresh encryptions carry the public bound ``2**(int_bits+frac_bits)`` on
    every slot magnitude; the headroom is ``h = slot_bits - 1 - int_bits -
    frac_bits`` bits.  Every encrypted array tracks a bound: adding two arrays
    adds bounds, multiplying by the integer scalar ``w`` multiplies the bound by
    ``|w|``, a matmul column multiplies it by ``sum_j |W_int[j, k]|``.  An
    operation whose bound would reach ``2**(slot_bits-1)`` raises
    ``PackingOverflowError`` *before* computing (:func:`check_bound`).  So,
    starting from fresh encryptions, any linear combination ``sum_i w_i *
    Enc(x_i)`` with integer weights is allowed while ``sum_i |w_i| < 2**h``:
    e.g. ``2**h - 1`` additions, or one scalar with ``|round(w *
    2**w_frac_bits)| < 2**h``.  Default spec: 64-bit slots, 8 integer + 16
    fractional bits, so ``h = 39`` (31 slots per 2048-bit plaintext); a matmul
    with 16 fractional weight bits then allows ``sum_j |W[j, k]| < 2**23``.
    Plaintext noise added with ``add_plain`` also uses headroom (its bound adds).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .paillier_keys import DEFAULT_KEY_BITS

__all__ = [
    "DEFAULT_WEIGHT_FRAC_BITS",
    "PackingOverflowError",
    "PackingSpec",
    "UNPACKED",
    "pack_rows",
    "unpack_signed",
    "unpack_row",
    "check_bound",
]

DEFAULT_WEIGHT_FRAC_BITS = 16


class PackingOverflowError(OverflowError):
    """An operation would let a slot value reach the slot capacity."""


@dataclass(frozen=True)
class PackingSpec:
    """Fixed-point format and slot layout.

    frac_bits: fractional bits; rounding error per fresh value ``<= 2**-(frac_bits+1)``.
    int_bits:  inputs must satisfy ``|x| < 2**int_bits`` (checked on encryption).
    slot_bits: bits per slot (``None``: one value per ciphertext; the slot is then the
               whole plaintext space, ``|value| < 2**(key_bits-2)``).  Must exceed
               ``int_bits + frac_bits + 1``; the excess is the headroom.
    """

    frac_bits: int = 16
    int_bits: int = 8
    slot_bits: int | None = 64

    def __post_init__(self):
        for name in ("frac_bits", "int_bits"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"PackingSpec.{name} must be a non-negative int, got {v!r}")
        if self.int_bits + self.frac_bits > 62:
            raise ValueError(
                f"PackingSpec: int_bits + frac_bits = {self.int_bits + self.frac_bits} > 62 "
                "(inputs are float64; more bits carry no information)")
        if self.slot_bits is not None:
            if not isinstance(self.slot_bits, (int, np.integer)) or isinstance(self.slot_bits, bool):
                raise ValueError(f"PackingSpec.slot_bits must be an int or None, got {self.slot_bits!r}")
            if self.slot_bits < self.value_bits + 2:
                raise ValueError(
                    f"PackingSpec.slot_bits={self.slot_bits} leaves no headroom: need at least "
                    f"int_bits + frac_bits + 2 = {self.value_bits + 2}")

    @property
    def value_bits(self) -> int:
        return self.int_bits + self.frac_bits

    @property
    def input_bound(self) -> int:
        """Public bound on a fresh slot's integer magnitude."""
        return 1 << self.value_bits

    def layout(self, key_bits: int) -> tuple[int, int]:
        """(effective slot bits, slots per ciphertext) for an n of ``key_bits`` bits."""
        if self.slot_bits is None:
            return key_bits - 1, 1
        k = (key_bits - 2) // self.slot_bits
        if k < 1:
            raise ValueError(f"slot_bits={self.slot_bits} does not fit a {key_bits}-bit key")
        return int(self.slot_bits), int(k)

    def headroom_bits(self, key_bits: int = DEFAULT_KEY_BITS) -> int:
        return self.layout(key_bits)[0] - 1 - self.value_bits


UNPACKED = PackingSpec(slot_bits=None)


def pack_rows(ints: np.ndarray, slot_bits: int, slots: int) -> list[list[int]]:
    """Signed plaintext integers ``sum_s a_s 2**(s*B)`` per chunk of ``slots`` values, per row.

    ``ints`` is a 2-D array of Python ints (rows x length); the last chunk of a row is
    padded with zero slots.  Reduce each result mod n before encrypting.
    """
    m, length = ints.shape
    n_ct = -(-length // slots) if length else 0
    out = []
    for i in range(m):
        row = ints[i].tolist()
        packed = []
        for t in range(n_ct):
            T = 0
            for v in reversed(row[t * slots:(t + 1) * slots]):
                T = (T << slot_bits) + int(v)
            packed.append(T)
        out.append(packed)
    return out


def unpack_signed(residues: list[int], n: int, slot_bits: int, slots: int, length: int) -> list[int]:
    """Decrypted packed plaintexts (residues mod n) -> signed slot integers, inverse of the packing.

    Raises ValueError when a plaintext does not decode into ``slots`` slots of
    ``slot_bits`` bits (wrong key, corrupted data or slot overflow).
    """
    half = n // 2
    if slots == 1:
        return [m - n if m > half else m for m in residues][:length]
    mask = (1 << slot_bits) - 1
    top = 1 << (slot_bits - 1)
    full = 1 << slot_bits
    out = []
    for m in residues:
        T = m - n if m > half else m
        for _ in range(slots):
            u = T & mask
            d = u - full if u >= top else u
            out.append(d)
            T = (T - d) >> slot_bits
        if T != 0:
            raise ValueError(
                "decrypted plaintext does not decode into "
                f"{slots} slots of {slot_bits} bits (wrong key, corrupted data or slot overflow)")
    return out[:length]


def unpack_row(residues: list[int], n: int, slot_bits: int, slots: int, length: int) -> list[int]:
    """One packed row's residues -> its ``length`` signed slot integers; the padding slots must be zero."""
    out = unpack_signed(residues, int(n), slot_bits, slots, len(residues) * slots)
    if any(out[length:]):
        raise ValueError("padding slots decrypted to non-zero values (slot overflow or corrupted data)")
    return out[:length]


def check_bound(bound: int, slot_bits: int, what: str) -> None:
    """PackingOverflowError unless ``bound < 2**(slot_bits - 1)`` (the signed slot capacity)."""
    cap = 1 << (slot_bits - 1)
    if bound >= cap:
        raise PackingOverflowError(
            f"{what}: slot magnitude bound needs {int(bound).bit_length()} bits but a "
            f"{slot_bits}-bit slot holds magnitudes below 2**{slot_bits - 1}; use wider "
            "slots, fewer int/frac bits, or smaller scalars")
