"""Paillier encryption of float arrays: fixed point, slot packing, obfuscator pool, worker processes.

Keys come from ``phe`` (``generate_paillier_keypair``); all arithmetic is done
with gmpy2 on phe's ``n`` and ``n**2`` with ``g = n + 1``, so a ciphertext of
``m`` is ``(1 + m*n) * r**n mod n**2`` exactly as ``phe``'s ``raw_encrypt``
computes it, and decryption is phe's ``raw_decrypt`` (CRT over p and q).

Fixed point
    A float ``x`` is the integer ``round(x * 2**frac_bits)``.  A ``PackingSpec``
    states ``int_bits`` (inputs must satisfy ``|x| < 2**int_bits``) and
    ``frac_bits`` (absolute rounding error ``<= 2**-(frac_bits+1)`` per value).

Packing (signed slots, borrow-tolerant decoding)
    ``k = (key_bits - 2) // slot_bits`` values go into one plaintext as the
    *signed* integer ``T = sum_s a_s * 2**(s*slot_bits)`` reduced mod n (a
    negative ``T`` becomes ``n - |T|``).  Paillier adds plaintexts mod n and
    ``c**w`` multiplies them by ``w`` mod n, and because ``T`` is an ordinary
    integer these act slot-wise: ``T1 + T2 = sum_s (a_s + b_s) 2**(sB)`` and
    ``w*T = sum_s (w*a_s) 2**(sB)``, for any signed integer ``w`` (a negative
    ``w`` is the exponent ``n - |w|``, i.e. ``c**-1`` raised to ``|w|``).
    Decryption lifts ``m`` to ``(-n/2, n/2)`` and peels slots from the bottom:
    the low ``B`` bits read as two's complement give ``a_0`` (in
    ``[-2**(B-1), 2**(B-1))``), subtract it, shift by ``B``, repeat.  This is
    exact whenever every slot satisfies ``|a_s| < 2**(B-1)`` (then also
    ``|T| < 2**(k*B-1) <= n/4``), so negative values and negative weights need
    no offsets and no unpacking.

Headroom (what the bound allows)
    Fresh encryptions carry the public bound ``2**(int_bits+frac_bits)`` on
    every slot magnitude; the headroom is ``h = slot_bits - 1 - int_bits -
    frac_bits`` bits.  Every ``EncryptedArray`` tracks a bound: adding two
    arrays adds bounds, multiplying by the integer scalar ``w`` multiplies the
    bound by ``|w|``, a matmul column multiplies it by ``sum_j |W_int[j, k]|``.
    An operation whose bound would reach ``2**(slot_bits-1)`` raises
    ``PackingOverflowError`` *before* computing.  So, starting from fresh
    encryptions, any linear combination ``sum_i w_i * Enc(x_i)`` with integer
    weights is allowed while ``sum_i |w_i| < 2**h``: e.g. ``2**h - 1``
    additions, or one scalar with ``|round(w * 2**w_frac_bits)| < 2**h``.
    Default spec: 64-bit slots, 8 integer + 16 fractional bits, so ``h = 39``
    (31 slots per 2048-bit plaintext); a matmul with 16 fractional weight bits
    then allows ``sum_j |W[j, k]| < 2**23``.  Plaintext noise added with
    ``add_plain`` also uses headroom (its bound adds).

Obfuscators ``r**n mod n**2`` dominate encryption cost; ``ObfuscatorPool``
computes them ahead of use (in worker processes or a background thread).  The
key owner can compute them with CRT over ``p**2`` and ``q**2``
(``x**n mod p**2 = (x**q mod p)**p mod p**2``), about 2.5x cheaper.

Results of arithmetic are deterministic functions of the input ciphertexts
and scalars; the key owner could recover the combined randomness and learn
about the scalars, so ``PaillierContext.rerandomize`` a result before sending
it back to the key owner.

Default key length is 2048 bits (``DEFAULT_KEY_BITS``).
"""

from __future__ import annotations

import secrets
import threading
import weakref
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass

import gmpy2
import numpy as np
from phe import paillier as _phe

from .pool import process_pool

__all__ = [
    "DEFAULT_KEY_BITS",
    "DEFAULT_WEIGHT_FRAC_BITS",
    "PackingOverflowError",
    "PackingSpec",
    "UNPACKED",
    "EncryptedArray",
    "ObfuscatorPool",
    "PaillierContext",
    "generate_keypair",
    "packed_matmul",
    "ciphertexts_to_bytes",
    "ciphertexts_from_bytes",
    "public_key_to_bytes",
    "public_key_from_bytes",
]

DEFAULT_KEY_BITS = 2048
DEFAULT_WEIGHT_FRAC_BITS = 16
_MIN_KEY_BITS = 128  # phe would accept less; below this nothing useful fits


class PackingOverflowError(OverflowError):
    """An operation would let a slot value reach the slot capacity."""


# --------------------------------------------------------------------------- keys


def generate_keypair(key_bits: int = DEFAULT_KEY_BITS):
    """phe key pair with an ``n`` of exactly ``key_bits`` bits (default 2048)."""
    if not isinstance(key_bits, (int, np.integer)) or key_bits < _MIN_KEY_BITS or key_bits % 2:
        raise ValueError(f"key_bits must be an even integer >= {_MIN_KEY_BITS}, got {key_bits!r}")
    return _phe.generate_paillier_keypair(n_length=int(key_bits))


class _Key:
    """gmpy2 views of a key, cached per n (process-local)."""

    __slots__ = ("n", "n2", "half", "width", "p", "q", "p2", "q2", "p2_inv", "phe_private")

    def __init__(self, n: int, p: int | None = None, q: int | None = None):
        self.n = gmpy2.mpz(n)
        self.n2 = self.n * self.n
        self.half = self.n // 2
        self.width = (int(self.n2.bit_length()) + 7) // 8
        self.p = self.q = self.p2 = self.q2 = self.p2_inv = self.phe_private = None
        if p is not None:
            if gmpy2.mpz(p) * gmpy2.mpz(q) != self.n:
                raise ValueError("private key factors do not match the public modulus")
            self.p, self.q = gmpy2.mpz(p), gmpy2.mpz(q)
            self.p2, self.q2 = self.p * self.p, self.q * self.q
            self.p2_inv = gmpy2.invert(self.p2, self.q2)


_KEYS: dict[tuple, _Key] = {}


def _key(n: int, p: int | None = None, q: int | None = None) -> _Key:
    k = _KEYS.get((int(n), p is not None))
    if k is None:
        k = _Key(n, p, q)
        if p is not None:
            k.phe_private = _phe.PaillierPrivateKey(_phe.PaillierPublicKey(int(n)), int(p), int(q))
        if len(_KEYS) > 64:
            _KEYS.clear()
        _KEYS[(int(n), p is not None)] = k
    return k


def _pub_key(public_key) -> _Key:
    return _key(public_key.n)


def public_key_to_bytes(public_key) -> bytes:
    """Big-endian bytes of n (the whole Paillier public key, since g = n + 1)."""
    n = int(public_key.n)
    return n.to_bytes((n.bit_length() + 7) // 8, "big")


def public_key_from_bytes(data: bytes):
    """Inverse of :func:`public_key_to_bytes`; returns a phe ``PaillierPublicKey``."""
    data = bytes(data)
    n = int.from_bytes(data, "big")
    if n.bit_length() < _MIN_KEY_BITS or n % 2 == 0:
        raise ValueError(f"not a Paillier modulus: {n.bit_length()}-bit value")
    return _phe.PaillierPublicKey(n)


# --------------------------------------------------------------------------- primitives


def _random_unit(n) -> gmpy2.mpz:
    while True:
        r = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(r, n) == 1:
            return r


def _obfuscator(k: _Key, x=None) -> gmpy2.mpz:
    """``x**n mod n**2`` for a random unit x (CRT path when the factors are known)."""
    if x is None:
        x = _random_unit(k.n)
    if k.p is None:
        return gmpy2.powmod(x, k.n, k.n2)
    # (y + t*p)**p = y**p mod p**2, so x**(p*q) mod p**2 only needs x**q mod p.
    sp = gmpy2.powmod(gmpy2.powmod(x % k.p, k.q, k.p), k.p, k.p2)
    sq = gmpy2.powmod(gmpy2.powmod(x % k.q, k.p, k.q), k.q, k.q2)
    return sp + k.p2 * (((sq - sp) * k.p2_inv) % k.q2)


def _obfuscator_chunk(n: int, p, q, count: int) -> list:
    k = _key(n, p, q)
    return [_obfuscator(k) for _ in range(count)]


def _decrypt_chunk(n: int, p: int, q: int, cts: list) -> list:
    dec = _key(n, p, q).phe_private.raw_decrypt
    return [dec(int(c)) for c in cts]


def _matmul_chunk(n2, cts: np.ndarray, w_cols: np.ndarray) -> np.ndarray:
    """``out[k, t] = prod_j cts[j, t] ** w_cols[j, k] mod n2`` (signed exponents)."""
    n2 = gmpy2.mpz(n2)
    d, n_ct = cts.shape
    kk = w_cols.shape[1]
    inv = [None] * d
    out = np.empty((kk, n_ct), dtype=object)
    for kcol in range(kk):
        acc = [gmpy2.mpz(1)] * n_ct
        for j in range(d):
            w = int(w_cols[j, kcol])
            if w == 0:
                continue
            if w < 0:
                if inv[j] is None:
                    inv[j] = [gmpy2.invert(c, n2) for c in cts[j]]
                base, e = inv[j], -w
            else:
                base, e = cts[j], w
            if e == 1:
                acc = [a * b % n2 for a, b in zip(acc, base)]
            else:
                acc = [a * gmpy2.powmod(b, e, n2) % n2 for a, b in zip(acc, base)]
        out[kcol] = acc
    return out


# --------------------------------------------------------------------------- fixed point + packing


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


def _encode_ints(x: np.ndarray, frac_bits: int, what: str) -> np.ndarray:
    """round(x * 2**frac_bits) as an object array of Python ints."""
    x = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: contains NaN or infinity")
    scaled = np.rint(np.ldexp(x, frac_bits))
    if scaled.size and np.max(np.abs(scaled)) < 2.0 ** 62:
        return scaled.astype(np.int64).astype(object)
    return np.array([int(v) for v in scaled.ravel()], dtype=object).reshape(scaled.shape)


def _pack_rows(ints: np.ndarray, slot_bits: int, slots: int) -> list[list[int]]:
    """Signed plaintext integers ``sum_s a_s 2**(s*B)`` per chunk of ``slots`` values, per row."""
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


def _unpack(ms: list[int], k: _Key, slot_bits: int, slots: int, length: int) -> list[int]:
    """Inverse of packing for one row: decrypted residues -> signed slot integers."""
    out = unpack_signed(ms, int(k.n), slot_bits, slots, len(ms) * slots)
    if any(out[length:]):
        raise ValueError("padding slots decrypted to non-zero values (slot overflow or corrupted data)")
    return out[:length]


def _check_bound(bound: int, slot_bits: int, what: str) -> None:
    cap = 1 << (slot_bits - 1)
    if bound >= cap:
        raise PackingOverflowError(
            f"{what}: slot magnitude bound needs {int(bound).bit_length()} bits but a "
            f"{slot_bits}-bit slot holds magnitudes below 2**{slot_bits - 1}; use wider "
            "slots, fewer int/frac bits, or smaller scalars")


# --------------------------------------------------------------------------- ciphertext wire format


def ciphertexts_to_bytes(cts, public_key) -> np.ndarray:
    """Ciphertexts as a ``uint8`` array of shape ``(count, width)``.

    Each ciphertext is big-endian, fixed width ``width = ceil(bits(n**2)/8)``
    (``2*key_bits/8``: 512 bytes for a 2048-bit key).
    """
    k = _pub_key(public_key)
    width = k.width
    flat = list(np.asarray(cts, dtype=object).ravel())
    buf = b"".join(int(c).to_bytes(width, "big") for c in flat)
    return np.frombuffer(buf, dtype=np.uint8).reshape(len(flat), width).copy()


def ciphertexts_from_bytes(data: np.ndarray, public_key) -> list:
    """Inverse of :func:`ciphertexts_to_bytes`; checks width and range ``0 < c < n**2``."""
    k = _pub_key(public_key)
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != k.width:
        raise ValueError(
            f"ciphertext bytes must be uint8 of shape (count, {k.width}), got {data.dtype} {data.shape}")
    raw = np.ascontiguousarray(data).tobytes()
    w = k.width
    out = []
    for i in range(data.shape[0]):
        c = gmpy2.mpz(int.from_bytes(raw[i * w:(i + 1) * w], "big"))
        if not 0 < c < k.n2:
            raise ValueError(f"ciphertext {i} is not in (0, n**2)")
        out.append(c)
    return out


# --------------------------------------------------------------------------- encrypted arrays


class EncryptedArray:
    """Paillier ciphertexts of a 1-D or 2-D float array, packed along the last axis.

    A 2-D array of shape ``(m, L)`` is ``m`` packed rows of ``L`` values; each
    row takes ``ceil(L / slots)`` ciphertexts.  ``frac_bits`` is the current
    fixed-point scale (it grows by ``w_frac_bits`` with every scalar product)
    and ``bound`` the guaranteed bound on every slot's integer magnitude.
    Arithmetic needs only the public key.
    """

    # numpy arrays on the left must defer to our reflected operators (c - enc, W * enc)
    __array_ufunc__ = None

    def __init__(self, public_key, ciphertexts: np.ndarray, shape: tuple, spec: PackingSpec,
                 frac_bits: int, bound: int):
        self.public_key = public_key
        self.ciphertexts = ciphertexts
        self.shape = tuple(int(s) for s in shape)
        self.spec = spec
        self.frac_bits = int(frac_bits)
        self.bound = int(bound)
        self.key_bits = int(public_key.n.bit_length())
        self.slot_bits, self.slots = spec.layout(self.key_bits)
        if ciphertexts.ndim != 2 or ciphertexts.shape != (self.rows, self.n_ct_per_row):
            raise ValueError(
                f"ciphertext grid {ciphertexts.shape} does not match shape {self.shape} "
                f"with {self.slots} slots per ciphertext")
        _check_bound(self.bound, self.slot_bits, "EncryptedArray")

    # -- layout
    @property
    def rows(self) -> int:
        return self.shape[0] if len(self.shape) == 2 else 1

    @property
    def length(self) -> int:
        return self.shape[-1]

    @property
    def n_ct_per_row(self) -> int:
        return -(-self.length // self.slots)

    @property
    def n_ciphertexts(self) -> int:
        return int(self.ciphertexts.size)

    @property
    def nbytes(self) -> int:
        """Bytes of ciphertext on the wire (fixed width per ciphertext)."""
        return self.n_ciphertexts * _pub_key(self.public_key).width

    @property
    def headroom_bits(self) -> int:
        """Bits left before the bound reaches the slot capacity."""
        return (self.slot_bits - 1) - self.bound.bit_length()

    def _like(self, cts, shape=None, frac_bits=None, bound=None) -> "EncryptedArray":
        return EncryptedArray(self.public_key, cts, self.shape if shape is None else shape, self.spec,
                              self.frac_bits if frac_bits is None else frac_bits,
                              self.bound if bound is None else bound)

    def _check_compatible(self, other: "EncryptedArray") -> None:
        if int(other.public_key.n) != int(self.public_key.n):
            raise ValueError("EncryptedArray operands are under different public keys")
        if other.shape != self.shape:
            raise ValueError(f"EncryptedArray shapes differ: {self.shape} vs {other.shape}")
        if (other.slot_bits, other.slots) != (self.slot_bits, self.slots):
            raise ValueError(
                f"EncryptedArray layouts differ: {self.slots}x{self.slot_bits} vs "
                f"{other.slots}x{other.slot_bits} bits")

    # -- arithmetic
    def _scaled_to(self, frac_bits: int) -> "EncryptedArray":
        if frac_bits == self.frac_bits:
            return self
        if frac_bits < self.frac_bits:
            raise ValueError("cannot lower the fixed-point scale of ciphertexts")
        return self.mul_scalar(1 << (frac_bits - self.frac_bits))

    def __add__(self, other):
        if isinstance(other, EncryptedArray):
            self._check_compatible(other)
            f = max(self.frac_bits, other.frac_bits)
            a, b = self._scaled_to(f), other._scaled_to(f)
            bound = a.bound + b.bound
            _check_bound(bound, self.slot_bits, "addition")
            n2 = _pub_key(self.public_key).n2
            cts = np.empty_like(a.ciphertexts)
            for idx in np.ndindex(cts.shape):
                cts[idx] = a.ciphertexts[idx] * b.ciphertexts[idx] % n2
            return self._like(cts, frac_bits=f, bound=bound)
        return self.add_plain(other)

    __radd__ = __add__

    def __neg__(self):
        n2 = _pub_key(self.public_key).n2
        cts = np.empty_like(self.ciphertexts)
        for idx in np.ndindex(cts.shape):
            cts[idx] = gmpy2.invert(self.ciphertexts[idx], n2)
        return self._like(cts)

    def __sub__(self, other):
        if isinstance(other, EncryptedArray):
            return self + (-other)
        return self.add_plain(-np.asarray(other, dtype=np.float64))

    def __rsub__(self, other):
        return (-self).add_plain(other)

    def add_plain(self, x, bound: int | None = None) -> "EncryptedArray":
        """Add a plaintext array (broadcast to ``shape``) at the current scale.

        ``bound`` optionally declares a public bound on ``|round(x * 2**frac_bits)|``
        (e.g. the noise distribution's range) so the tracked bound does not
        reveal the actual maximum; it must not be below the actual maximum.
        """
        if bound is not None and (not isinstance(bound, (int, np.integer)) or bound < 0):
            raise ValueError(f"add_plain: bound must be a non-negative int, got {bound!r}")
        x = np.broadcast_to(np.asarray(x, dtype=np.float64), self.shape)
        ints = _encode_ints(x, self.frac_bits, "add_plain").reshape(self.rows, self.length)
        actual = max((abs(int(v)) for v in ints.ravel()), default=0)
        if bound is None:
            bound = actual
        elif bound < actual:
            raise ValueError(f"add_plain: declared bound {bound} is below the actual maximum {actual}")
        new_bound = self.bound + int(bound)
        _check_bound(new_bound, self.slot_bits, "add_plain")
        k = _pub_key(self.public_key)
        packed = _pack_rows(ints, self.slot_bits, self.slots)
        cts = np.empty_like(self.ciphertexts)
        for i in range(self.rows):
            for t in range(self.n_ct_per_row):
                cts[i, t] = self.ciphertexts[i, t] * ((1 + (packed[i][t] % k.n) * k.n) % k.n2) % k.n2
        return self._like(cts, bound=new_bound)

    def mul_scalar(self, w, frac_bits: int | None = None) -> "EncryptedArray":
        """Multiply every slot by the same signed scalar.

        Integer scalars (Python/numpy ints) are used exactly (``frac_bits=0``);
        floats are rounded to ``frac_bits`` fractional bits (default
        ``DEFAULT_WEIGHT_FRAC_BITS``) and the result's scale grows by that much.
        """
        if isinstance(w, (int, np.integer)) and not isinstance(w, bool) and frac_bits is None:
            wi, fb = int(w), 0
        else:
            fb = DEFAULT_WEIGHT_FRAC_BITS if frac_bits is None else int(frac_bits)
            wi = int(_encode_ints(np.float64(w), fb, "scalar"))
        new_bound = self.bound * abs(wi)
        _check_bound(new_bound, self.slot_bits, f"multiplication by {w!r}")
        n2 = _pub_key(self.public_key).n2
        cts = np.empty_like(self.ciphertexts)
        for idx in np.ndindex(cts.shape):
            cts[idx] = gmpy2.powmod(self.ciphertexts[idx], wi, n2)
        return self._like(cts, frac_bits=self.frac_bits + fb, bound=new_bound)

    def __mul__(self, w):
        if isinstance(w, EncryptedArray):
            raise TypeError("Paillier cannot multiply two ciphertexts")
        return self.mul_scalar(w)

    __rmul__ = __mul__

    def matmul(self, W, w_frac_bits: int = DEFAULT_WEIGHT_FRAC_BITS, executor: Executor | None = None,
               workers: int = 1) -> "EncryptedArray":
        """See :func:`packed_matmul`."""
        return packed_matmul(self, W, w_frac_bits=w_frac_bits, executor=executor, workers=workers)

    # -- wire
    def to_wire(self, include_bound: bool = True) -> tuple[dict, np.ndarray]:
        """(metadata dict, uint8 array ``(n_ciphertexts, 2*key_bits/8)``), msgpack-friendly.

        The bound reveals an upper bound on the slot magnitudes (for results of
        computations with private scalars, a bound on those scalars); pass
        ``include_bound=False`` to send the slot capacity instead, which still
        decrypts correctly but allows no further arithmetic at the receiver.
        """
        bound = self.bound if include_bound else (1 << (self.slot_bits - 1)) - 1
        meta = {
            "shape": list(self.shape),
            "frac_bits": self.frac_bits,
            "bound": str(bound),
            "spec": [self.spec.frac_bits, self.spec.int_bits, self.spec.slot_bits],
            "key_bits": self.key_bits,
        }
        return meta, ciphertexts_to_bytes(self.ciphertexts, self.public_key)

    @classmethod
    def from_wire(cls, public_key, meta: dict, data: np.ndarray) -> "EncryptedArray":
        try:
            shape = tuple(int(s) for s in meta["shape"])
            spec = PackingSpec(*meta["spec"])
            frac_bits = int(meta["frac_bits"])
            bound = int(meta["bound"])
            key_bits = int(meta["key_bits"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"malformed EncryptedArray metadata: {e}") from e
        if key_bits != public_key.n.bit_length():
            raise ValueError(f"metadata says {key_bits}-bit key, public key has {public_key.n.bit_length()}")
        if len(shape) not in (1, 2) or any(s < 0 for s in shape) or frac_bits < 0 or bound < 0:
            raise ValueError(f"malformed EncryptedArray metadata: shape={shape}, frac_bits={frac_bits}")
        slot_bits, slots = spec.layout(key_bits)
        if bound >= 1 << (slot_bits - 1):
            raise ValueError(f"metadata bound {bound} does not fit {slot_bits}-bit slots")
        cts = ciphertexts_from_bytes(data, public_key)
        rows = shape[0] if len(shape) == 2 else 1
        n_ct = -(-shape[-1] // slots)
        if len(cts) != rows * n_ct:
            raise ValueError(f"expected {rows * n_ct} ciphertexts for shape {shape}, got {len(cts)}")
        grid = np.empty((rows, n_ct), dtype=object)
        for i, c in enumerate(cts):
            grid[i // n_ct, i % n_ct] = c
        return cls(public_key, grid, shape, spec, frac_bits, bound)


def packed_matmul(enc: EncryptedArray, W, *, w_frac_bits: int = DEFAULT_WEIGHT_FRAC_BITS,
                  executor: Executor | None = None, workers: int = 1) -> EncryptedArray:
    """Packed ``Enc(W.T @ X)`` from packed ``Enc(X)`` and a plaintext float matrix ``W``.

    The rows of ``enc`` are the vectors ``X[j, :]`` (shape ``(d, L)``); the result is the
    packed ``(K, L)`` array ``Y[k, :] = sum_j W[j, k] * X[j, :]`` for ``W`` of shape
    ``(d, K)``, negative entries allowed (signed slots, see the module docstring).

    For a split layer ``Z = A @ W`` with ``A`` of shape ``(batch, d)``: encrypt ``A.T``
    (each column of A packed along the batch), and the result decrypts to ``Z.T``.
    Each ``W[j, k]`` is rounded to ``w_frac_bits`` fractional bits (error ``<= 2**-(w_frac_bits+1)``
    per weight); the result has ``enc.frac_bits + w_frac_bits`` fractional bits and slot
    bound ``enc.bound * max_k sum_j |round(W[j, k] * 2**w_frac_bits)|``, checked before any
    work.  Columns are spread over ``executor`` (or a fresh pool of ``workers`` processes).
    """
    if not isinstance(enc, EncryptedArray):
        raise TypeError(f"packed_matmul expects an EncryptedArray, got {type(enc).__name__}")
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] != enc.rows:
        raise ValueError(f"W must have shape ({enc.rows}, K) to match {enc.rows} packed rows, got {W.shape}")
    if len(enc.shape) != 2:
        raise ValueError("packed_matmul needs a 2-D EncryptedArray (rows = vectors to combine)")
    w_int = _encode_ints(W, int(w_frac_bits), "W")
    col_sums = [sum(abs(int(v)) for v in w_int[:, kcol]) for kcol in range(W.shape[1])]
    new_bound = enc.bound * max(col_sums, default=0)
    _check_bound(new_bound, enc.slot_bits, "packed_matmul")
    n2 = _pub_key(enc.public_key).n2
    kk = W.shape[1]
    own = None
    if executor is None and workers > 1:
        own = executor = process_pool(workers)
    try:
        if executor is None or kk < 2:
            out = _matmul_chunk(n2, enc.ciphertexts, w_int)
        else:
            n_chunks = min(kk, 4 * max(1, getattr(executor, "_max_workers", 2)))
            bounds = np.linspace(0, kk, n_chunks + 1).astype(int)
            futs = [executor.submit(_matmul_chunk, n2, enc.ciphertexts, w_int[:, a:b])
                    for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
            out = np.concatenate([f.result() for f in futs], axis=0)
    finally:
        if own is not None:
            own.shutdown()
    return EncryptedArray(enc.public_key, out, (kk, enc.length), enc.spec,
                          enc.frac_bits + int(w_frac_bits), new_bound)


# --------------------------------------------------------------------------- obfuscator pool


class ObfuscatorPool:
    """Precomputed obfuscators ``r**n mod n**2``, filled ahead of use.

    ``fill(count)`` computes now (spread over ``executor`` when given);
    ``start_background(target)`` keeps at least ``target`` ready from a
    background thread (which hands work to ``executor``, or computes with
    gmpy2 releasing the GIL); ``take(count)`` pops, computing any shortfall on
    the spot (counted in ``misses``).  With ``private_key`` the CRT path is
    used.  Obfuscators are used once and never returned.
    """

    def __init__(self, public_key, private_key=None, *, executor: Executor | None = None):
        self.public_key = public_key
        self._n = int(public_key.n)
        self._p = int(private_key.p) if private_key is not None else None
        self._q = int(private_key.q) if private_key is not None else None
        if private_key is not None and int(private_key.public_key.n) != self._n:
            raise ValueError("ObfuscatorPool: private key does not belong to the public key")
        self.executor = executor
        self._items: deque = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._target = 0
        self.misses = 0
        self.generated = 0

    def __len__(self) -> int:
        return len(self._items)

    def _generate(self, count: int) -> list:
        if count <= 0:
            return []
        if self.executor is None or count < 2:
            out = _obfuscator_chunk(self._n, self._p, self._q, count)
        else:
            nw = max(1, getattr(self.executor, "_max_workers", 2))
            n_chunks = min(count, 4 * nw)
            sizes = [count // n_chunks + (i < count % n_chunks) for i in range(n_chunks)]
            futs = [self.executor.submit(_obfuscator_chunk, self._n, self._p, self._q, s) for s in sizes]
            out = [o for f in futs for o in f.result()]
        self.generated += len(out)
        return out

    def fill(self, count: int) -> None:
        """Compute ``count`` more obfuscators now."""
        new = self._generate(int(count))
        with self._cond:
            self._items.extend(new)

    def take(self, count: int) -> list:
        """Pop ``count`` obfuscators, computing any shortfall now."""
        count = int(count)
        with self._cond:
            got = [self._items.popleft() for _ in range(min(count, len(self._items)))]
            self._cond.notify_all()
        missing = count - len(got)
        if missing:
            self.misses += missing
            got.extend(self._generate(missing))
        return got

    def start_background(self, target: int, batch: int = 16) -> None:
        """Keep at least ``target`` obfuscators ready from a daemon thread."""
        self._target = int(target)
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()

        def run():
            gmpy2.get_context().allow_release_gil = True
            while not self._stop.is_set():
                with self._cond:
                    while len(self._items) >= self._target and not self._stop.is_set():
                        self._cond.wait(0.5)
                    need = self._target - len(self._items)
                if self._stop.is_set():
                    break
                if self.executor is not None:
                    n = min(max(need, 1), batch * max(1, getattr(self.executor, "_max_workers", 1)))
                else:
                    n = min(max(need, 1), batch)
                try:
                    new = self._generate(n)
                except Exception:  # executor shut down under us: stop quietly
                    break
                with self._cond:
                    self._items.extend(new)
                    self._cond.notify_all()

        self._thread = threading.Thread(target=run, name="paillier-obfuscators", daemon=True)
        self._thread.start()

    def wait_ready(self, count: int, timeout: float | None = None) -> bool:
        """Block until ``count`` obfuscators are ready (background filling); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._items) >= count, timeout)

    def stop_background(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


# --------------------------------------------------------------------------- context


def _shutdown(executor):
    executor.shutdown(wait=False, cancel_futures=True)


class PaillierContext:
    """A key (public, optionally private), a worker pool and an obfuscator pool.

    ``workers=1`` computes in-process; ``workers>1`` uses a
    ``ProcessPoolExecutor`` (``mp_context``, default ``"spawn"`` so it is safe
    next to threads) for obfuscators, decryption and matmul.  ``crt_obfuscators``
    (default: when the private key is present) uses the key owner's faster
    obfuscator path.  Use as a context manager or call ``close()``.
    """

    def __init__(self, public_key, private_key=None, *, workers: int = 1, mp_context: str = "spawn",
                 crt_obfuscators: bool | None = None):
        if not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if private_key is not None and int(private_key.public_key.n) != int(public_key.n):
            raise ValueError("private key does not belong to the public key")
        self.public_key = public_key
        self.private_key = private_key
        self.workers = int(workers)
        self.key_bits = int(public_key.n.bit_length())
        self._mp_context = mp_context
        self._executor: ProcessPoolExecutor | None = None
        use_crt = private_key is not None if crt_obfuscators is None else bool(crt_obfuscators)
        if use_crt and private_key is None:
            raise ValueError("crt_obfuscators needs the private key")
        self.pool = ObfuscatorPool(public_key, private_key if use_crt else None)

    def prefill(self, count: int) -> None:
        """Compute ``count`` obfuscators now (in the worker processes when ``workers > 1``)."""
        self.pool.executor = self.executor
        self.pool.fill(count)

    def start_background_pool(self, target: int) -> None:
        """Keep ``target`` obfuscators ready, computed in the background."""
        self.pool.executor = self.executor
        self.pool.start_background(target)

    @classmethod
    def generate(cls, key_bits: int = DEFAULT_KEY_BITS, **kwargs) -> "PaillierContext":
        pk, sk = generate_keypair(key_bits)
        return cls(pk, sk, **kwargs)

    def public(self, **kwargs) -> "PaillierContext":
        """A context with only the public key (what the other party gets)."""
        return PaillierContext(self.public_key, None, **kwargs)

    @property
    def executor(self) -> ProcessPoolExecutor | None:
        if self.workers > 1 and self._executor is None:
            self._executor = process_pool(self.workers, self._mp_context)
            weakref.finalize(self, _shutdown, self._executor)
        return self._executor

    def close(self) -> None:
        self.pool.stop_background()
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None
            self.pool.executor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- encryption
    def encrypt(self, x, spec: PackingSpec = PackingSpec()) -> EncryptedArray:
        """Encrypt a 1-D or 2-D float array packed along its last axis.

        Raises ``ValueError`` for NaN/inf or ``|x| >= 2**spec.int_bits``.
        """
        x = np.asarray(x, dtype=np.float64)
        if x.ndim not in (1, 2):
            raise ValueError(f"encrypt expects a 1-D or 2-D array, got shape {x.shape}")
        if not np.all(np.isfinite(x)):
            raise ValueError("encrypt: input contains NaN or infinity")
        limit = 2.0 ** spec.int_bits
        if x.size and np.max(np.abs(x)) >= limit:
            raise ValueError(
                f"encrypt: |x| must be < 2**int_bits = {limit:g}, got max |x| = {np.max(np.abs(x)):g}")
        slot_bits, slots = spec.layout(self.key_bits)
        rows = x.shape[0] if x.ndim == 2 else 1
        ints = _encode_ints(x, spec.frac_bits, "encrypt").reshape(rows, x.shape[-1])
        packed = _pack_rows(ints, slot_bits, slots)
        k = _pub_key(self.public_key)
        n_ct = -(-x.shape[-1] // slots)
        self.pool.executor = self.executor
        obf = self.pool.take(rows * n_ct)
        cts = np.empty((rows, n_ct), dtype=object)
        for i in range(rows):
            for t in range(n_ct):
                cts[i, t] = (1 + (packed[i][t] % k.n) * k.n) * obf[i * n_ct + t] % k.n2
        return EncryptedArray(self.public_key, cts, x.shape, spec, spec.frac_bits, spec.input_bound)

    def rerandomize(self, enc: EncryptedArray) -> EncryptedArray:
        """Multiply every ciphertext by a fresh obfuscator (hides how it was computed)."""
        self.pool.executor = self.executor
        obf = self.pool.take(enc.n_ciphertexts)
        n2 = _pub_key(self.public_key).n2
        cts = np.empty_like(enc.ciphertexts)
        for i, idx in enumerate(np.ndindex(cts.shape)):
            cts[idx] = enc.ciphertexts[idx] * obf[i] % n2
        return enc._like(cts)

    # -- decryption
    def decrypt_raw(self, cts) -> list[int]:
        """Plaintext residues (``0 <= m < n``) of a flat list of ciphertexts, CRT-decrypted."""
        if self.private_key is None:
            raise ValueError("this PaillierContext has no private key")
        cts = list(cts)
        n, p, q = int(self.public_key.n), int(self.private_key.p), int(self.private_key.q)
        ex = self.executor
        if ex is None or len(cts) < 2:
            return _decrypt_chunk(n, p, q, cts)
        n_chunks = min(len(cts), 4 * self.workers)
        b = np.linspace(0, len(cts), n_chunks + 1).astype(int)
        futs = [ex.submit(_decrypt_chunk, n, p, q, cts[lo:hi]) for lo, hi in zip(b[:-1], b[1:]) if hi > lo]
        return [m for f in futs for m in f.result()]

    def decrypt(self, enc: EncryptedArray) -> np.ndarray:
        """Float64 array of ``enc.shape``; error ``<= 2**-(frac_bits+1)`` per fresh value."""
        if not isinstance(enc, EncryptedArray):
            raise TypeError(f"decrypt expects an EncryptedArray, got {type(enc).__name__}")
        if int(enc.public_key.n) != int(self.public_key.n):
            raise ValueError("EncryptedArray was encrypted under a different key")
        k = _pub_key(self.public_key)
        ms = self.decrypt_raw(enc.ciphertexts.ravel())
        n_ct = enc.n_ct_per_row
        out = np.empty((enc.rows, enc.length), dtype=np.float64)
        scale = 1 << enc.frac_bits
        for i in range(enc.rows):
            ints = _unpack(ms[i * n_ct:(i + 1) * n_ct], k, enc.slot_bits, enc.slots, enc.length)
            out[i] = [v / scale for v in ints]
        return out.reshape(enc.shape)

    def matmul(self, enc: EncryptedArray, W, w_frac_bits: int = DEFAULT_WEIGHT_FRAC_BITS) -> EncryptedArray:
        """:func:`packed_matmul` using this context's workers."""
        return packed_matmul(enc, W, w_frac_bits=w_frac_bits, executor=self.executor)


