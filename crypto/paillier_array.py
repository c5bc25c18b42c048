"""Encrypted arrays: packed Paillier ciphertexts of a float array, their arithmetic and their wire format.

An :class:`EncryptedArray` holds the ciphertexts of a 1-D or 2-D array packed
along its last axis (:mod:`fedhet.crypto.paillier_packing`), the current
fixed-point scale and the public bound on every slot; arithmetic (addition,
plaintext addition, signed scalars, :func:`packed_matmul` with a plaintext
matrix) needs only the public key and checks the bound before computing.

Results of arithmetic are deterministic functions of the input ciphertexts
and scalars; the key owner could recover the combined randomness and learn
about the scalars, so rerandomize a result (``PaillierContext.rerandomize``)
before sending it back to the key owner.

Wire format: each ciphertext is big-endian, fixed width ``ceil(bits(n**2)/8)``
bytes (512 for a 2048-bit key), a ``uint8`` array ``(count, width)``
(:func:`ciphertexts_to_bytes`); an array adds msgpack-friendly metadata
(shape, frac_bits, bound, spec, key_bits; :meth:`EncryptedArray.to_wire`).
"""

from __future__ import annotations

from concurrent.futures import Executor

import gmpy2
import numpy as np

from .fixedpoint import quantize
from .paillier_keys import key_view
from .paillier_packing import DEFAULT_WEIGHT_FRAC_BITS, PackingSpec, check_bound, pack_rows
from .pool import process_pool

__all__ = [
    "EncryptedArray",
    "packed_matmul",
    "packed_matmul_ints",
    "multi_pow",
    "multiexp_window",
    "window_table",
    "ciphertexts_to_bytes",
    "ciphertexts_from_bytes",
]


def multiexp_window(max_bits: int, uses: int) -> int:
    """Window width (bits) of the tables of :func:`multi_pow`: a table of ``2**w`` powers per base is
    paid once and reused by ``uses`` products, each costing ``max_bits / w`` multiplications per base."""
    if max_bits <= 1:
        return 1
    return min(range(1, 8), key=lambda w: ((1 << w) - 2) / max(1, uses) + -(-max_bits // w))


def window_table(c, n2, w: int) -> list:
    """``[1, c, c**2, ..., c**(2**w - 1)] mod n2``."""
    tab = [gmpy2.mpz(1), c]
    for _ in range((1 << w) - 2):
        tab.append(tab[-1] * c % n2)
    return tab


def multi_pow(tables: list, exps: list, n2, w: int):
    """``prod_i base_i**e_i mod n2`` (Straus: one chain of squarings shared by all bases).

    ``tables[i]`` is :func:`window_table` of base i with window ``w``; ``e_i >= 0``.
    """
    top = max((e.bit_length() for e in exps), default=0)
    if top == 0:
        return gmpy2.mpz(1)
    mask = (1 << w) - 1
    acc = None
    for i in range(-(-top // w) - 1, -1, -1):
        if acc is not None:
            for _ in range(w):
                acc = acc * acc % n2
        sh = i * w
        for tab, e in zip(tables, exps):
            dgt = (e >> sh) & mask
            if dgt:
                acc = tab[dgt] if acc is None else acc * tab[dgt] % n2
    return gmpy2.mpz(1) if acc is None else acc


def _matmul_chunk(n2, cts: np.ndarray, w_cols: np.ndarray) -> np.ndarray:
    """``out[k, t] = prod_j cts[j, t] ** w_cols[j, k] mod n2`` (signed exponents).

    A multi-exponentiation per output (:func:`multi_pow`) with window tables per input
    ciphertext shared by all columns; a negative weight uses the table of the ciphertext's
    inverse.  The result is the same number as the product of single powers.
    """
    n2 = gmpy2.mpz(n2)
    d, n_ct = cts.shape
    kk = w_cols.shape[1]
    W = [[int(w_cols[j, kcol]) for kcol in range(kk)] for j in range(d)]
    max_bits = max((abs(v).bit_length() for row in W for v in row), default=0)
    win = multiexp_window(max_bits, kk)
    out = np.empty((kk, n_ct), dtype=object)
    for t in range(n_ct):
        pos: dict = {}
        neg: dict = {}
        for kcol in range(kk):
            tables, exps = [], []
            for j in range(d):
                v = W[j][kcol]
                if v > 0:
                    if j not in pos:
                        pos[j] = window_table(cts[j, t], n2, win)
                    tables.append(pos[j])
                    exps.append(v)
                elif v < 0:
                    if j not in neg:
                        neg[j] = window_table(gmpy2.invert(cts[j, t], n2), n2, win)
                    tables.append(neg[j])
                    exps.append(-v)
            out[kcol, t] = multi_pow(tables, exps, n2, win)
    return out


def ciphertexts_to_bytes(cts, public_key) -> np.ndarray:
    """Ciphertexts as a ``uint8`` array of shape ``(count, width)``.

    Each ciphertext is big-endian, fixed width ``width = ceil(bits(n**2)/8)``
    (``2*key_bits/8``: 512 bytes for a 2048-bit key).
    """
    k = key_view(public_key.n)
    width = k.width
    flat = list(np.asarray(cts, dtype=object).ravel())
    buf = b"".join(int(c).to_bytes(width, "big") for c in flat)
    return np.frombuffer(buf, dtype=np.uint8).reshape(len(flat), width).copy()


def ciphertexts_from_bytes(data: np.ndarray, public_key) -> list:
    """Inverse of :func:`ciphertexts_to_bytes`; every ciphertext must be a unit mod n**2.

    A valid ciphertext lies in Z*_{n**2}: ``0 < c < n**2`` and ``gcd(c, n) = 1``.  One that is
    not (``c = n``, a multiple of p or q) has no inverse, so the arithmetic would fail later
    (``invert()``) or decrypt to garbage; it is refused here, naming its index.  The gcd is
    checked once for the whole batch, on the product mod n (a unit exactly when every factor
    is), and per ciphertext only when that fails.
    """
    k = key_view(public_key.n)
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != k.width:
        raise ValueError(
            f"ciphertext bytes must be uint8 of shape (count, {k.width}), got {data.dtype} {data.shape}")
    raw = np.ascontiguousarray(data).tobytes()
    w = k.width
    n = gmpy2.mpz(public_key.n)
    out = []
    prod = gmpy2.mpz(1)
    for i in range(data.shape[0]):
        c = gmpy2.mpz(int.from_bytes(raw[i * w:(i + 1) * w], "big"))
        if not 0 < c < k.n2:
            raise ValueError(f"ciphertext {i} is not in (0, n**2)")
        out.append(c)
        prod = prod * c % n
    if gmpy2.gcd(prod, n) != 1:
        i = next(i for i, c in enumerate(out) if gmpy2.gcd(c, n) != 1)
        raise ValueError(f"ciphertext {i} is not a unit mod n**2 (it shares a factor with n): no valid "
                         "encryption is")
    return out


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
        check_bound(self.bound, self.slot_bits, "EncryptedArray")

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
        return self.n_ciphertexts * key_view(self.public_key.n).width

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
            check_bound(bound, self.slot_bits, "addition")
            n2 = key_view(self.public_key.n).n2
            cts = np.empty_like(a.ciphertexts)
            for idx in np.ndindex(cts.shape):
                cts[idx] = a.ciphertexts[idx] * b.ciphertexts[idx] % n2
            return self._like(cts, frac_bits=f, bound=bound)
        return self.add_plain(other)

    __radd__ = __add__

    def __neg__(self):
        n2 = key_view(self.public_key.n).n2
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
        ints = quantize(x, self.frac_bits, "add_plain").reshape(self.rows, self.length)
        actual = max((abs(int(v)) for v in ints.ravel()), default=0)
        if bound is None:
            bound = actual
        elif bound < actual:
            raise ValueError(f"add_plain: declared bound {bound} is below the actual maximum {actual}")
        new_bound = self.bound + int(bound)
        check_bound(new_bound, self.slot_bits, "add_plain")
        k = key_view(self.public_key.n)
        packed = pack_rows(ints, self.slot_bits, self.slots)
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
            wi = int(quantize(np.float64(w), fb, "scalar"))
        new_bound = self.bound * abs(wi)
        check_bound(new_bound, self.slot_bits, f"multiplication by {w!r}")
        n2 = key_view(self.public_key.n).n2
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
    return packed_matmul_ints(enc, quantize(W, int(w_frac_bits), "W"), w_frac_bits=int(w_frac_bits),
                              executor=executor, workers=workers)


def packed_matmul_ints(enc: EncryptedArray, w_int, *, w_frac_bits: int = 0, executor: Executor | None = None,
                       workers: int = 1) -> EncryptedArray:
    """:func:`packed_matmul` for an integer matrix ``w_int`` (Python/numpy ints of any size, used exactly).

    The result's scale grows by ``w_frac_bits`` (the caller's fixed point of ``w_int``); its bound is
    ``enc.bound * max_k sum_j |w_int[j, k]|``, checked before any work (``PackingOverflowError``).
    """
    if not isinstance(enc, EncryptedArray):
        raise TypeError(f"packed_matmul_ints expects an EncryptedArray, got {type(enc).__name__}")
    w_int = np.asarray(w_int, dtype=object)
    if w_int.ndim != 2 or w_int.shape[0] != enc.rows:
        raise ValueError(f"W must have shape ({enc.rows}, K) to match {enc.rows} packed rows, got {w_int.shape}")
    if len(enc.shape) != 2:
        raise ValueError("packed_matmul needs a 2-D EncryptedArray (rows = vectors to combine)")
    for v in w_int.ravel():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool):
            raise TypeError(f"packed_matmul_ints: weights must be integers, got {type(v).__name__}")
    W = w_int
    col_sums = [sum(abs(int(v)) for v in w_int[:, kcol]) for kcol in range(W.shape[1])]
    new_bound = enc.bound * max(col_sums, default=0)
    check_bound(new_bound, enc.slot_bits, "packed_matmul")
    n2 = key_view(enc.public_key.n).n2
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
