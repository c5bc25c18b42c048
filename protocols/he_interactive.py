"""FATE's homomorphically encrypted interactive layer (hetero NN), between a label owner and one feature party.

Naming: STFL's — the **host** owns the labels and trains the top of the network, the **guest** is the
passive feature party.  FATE uses the reverse words (its label owner is the "guest", its passive party
the "host"); FATE's ``HEInteractiveLayerGuest`` runs here on the host, ``...Host`` on the guest.

The layer computes ``z = A_h @ W_h + b + A_g @ W`` where ``A_g`` (b x d) is the guest's bottom-model
output and ``W`` (d x K) the guest part of the interactive weights.  Nobody holds ``W``: the host
holds ``W_h``, ``b`` and a masked copy ``W_g``, the guest an accumulated noise ``eps`` with
``W = W_g + eps`` (``eps`` starts at zero, so the host knows the initial weights, as in FATE).
Every ciphertext is under the **guest's** key; the host only ever computes on them.

Per training batch (``[[x]]`` = encrypted under the guest's key; messages in brackets)::

  guest  A_g = bottom(x_g) -> [[A_g]]                                   [hei/acts]
         [[eps]]                                                        [hei/noise_ct]
  host   [[A_g W_g + e_B]]   e_B: host's fresh mask; rerandomized       [hei/fwd_ct]
  guest  decrypt, add A_g eps:  A_g W + e_B                             [hei/fwd_masked]
  host   remove e_B: A_g W; z = A_h W_h + b + A_g W; activation, top, loss; delta = dL/dz
  host   [[G + e_W]] = [[A_g]]^T delta + e_W   (weight gradient)        [hei/grad_ct]
  guest  decrypt, add its fresh mask nu:  G + e_W + nu                  [hei/grad_masked]
  host   [[delta (W_g + eps)^T]] = delta W_g^T + delta [[eps]]^T        [hei/ingrad_ct]
  guest  decrypt: delta W^T, the gradient for its bottom model
  host   W_g -= step(G + nu)        guest   eps += step(nu)      =>  W_g + eps = W - step(G)

(FATE adds ``noise/lr`` to the gradient and ``noise`` to its accumulator; ``step`` below is the same
update written in exact integers.)  Prediction runs the forward half only.

What each side learns (semi-honest).  The host: ``A_g W`` per batch (the layer's output, which it
needs), ``G + nu`` and the ciphertexts.  It never sees ``A_g``, ``W`` or ``G``; knowing ``W`` would
let it solve ``A_g`` from ``A_g W`` when ``K >= d``, which is why ``eps`` masks it.  The guest: its own
``A_g``, ``delta W^T`` (its input gradient, as in any split network), ``A_g W_g + e_B`` and
``G + e_W``; ``e_B`` and ``e_W`` hide ``W_g`` (hence ``W``) and ``G`` (hence ``delta``).  Results
computed on the guest's ciphertexts are rerandomized before they go back to it (otherwise the key
owner could recover the combined randomness and, from it, the host's small integer scalars).

Numbers (schemes "paillier" and "naive").  Everything is an exact integer: ``A_g`` is rounded to
``a_frac_bits`` fractional bits (``|A_g| < 2**a_int_bits``, checked), ``W_g``/``eps`` live on the
grid ``2**-w_frac_bits``, the per-sample ``delta`` is clipped to ``|delta| < 2**d_int_bits`` and
rounded to ``d_frac_bits``.  The forward output is then exactly ``round(A_g) @ W``; the weight update
is ``step(X) = round(lr * X / (b * 2**(a_frac+d_frac-w_frac)))`` with ``lr`` on a ``2**-lr_frac_bits``
grid, so ``W_g + eps`` moves by ``-step(G)`` up to one grid unit per step.  Masks are statistical:
the host's ``e_B``, ``e_W`` are uniform over ``+-2**(slot_bits-2)`` and the call fails unless that is
at least ``2**mask_bits`` times the (public) bound of what they hide; the guest's ``nu`` is uniform
over ``2**mask_bits`` times the public bound of ``G`` (``batch_size * 2**(a_int+a_frac+d_int+d_frac)``).
Masked integers travel as fixed-width two's complement bytes (``masked_bytes`` per value).
Sizes with the defaults: ``nu`` has about 83 bits, so ``eps`` (and ``W_g``) about 63 bits on the weight
grid after one step, growing like a random walk; the forward product then needs about 85 bits and
160-bit slots (12 per 2048-bit plaintext) leave ``e_B`` a margin of about 73 bits over ``mask_bits``
= 40 (measured; reported as ``min_mask_sigma``).  128-bit slots would run out after some training.

* ``paillier``: packed, batched Paillier (``fedhet.crypto.paillier``), ``slot_bits``-bit slots.
  ``[[A_g]]`` goes twice, packed along the batch (forward: one ciphertext row per feature) and along
  the features (gradient: one row per sample), because packed slots cannot be summed inside a
  ciphertext.  Obfuscators are precomputed by background threads on both sides.
* ``naive``: ``phe`` ``EncryptedNumber`` objects, one value per ciphertext, no pools; the same
  integers and masks, so the comparison shows what packing and batching buy.
* ``ckks``: TenSEAL CKKS (``fedhet.crypto.ckks``, no Galois keys).  ``A_g`` is flattened row-major and
  repeated ``m`` times in one ciphertext; the host multiplies slot-wise by plaintext patterns of
  ``W_g`` / ``delta`` and adds a float mask per slot; the guest decrypts and does the sums over
  features / samples itself on masked values.  Approximate: float masks uniform over ``+-ckks_mask``
  (default ``2**10``, FATE's own noise range) because CKKS values must stay below ``2**19``; this is
  not statistical hiding, and CKKS results decrypted by the key owner would additionally need noise
  flooding (the CKKS error term depends on the host's inputs), which is not done here.  Precision:
  parameter set "fast" (scale ``2**40``); the layer output is within ``d * (ABS_TOL_FRESH +
  REL_TOL_MUL * (|A W_g| + ckks_mask))`` of the plain product by ``crypto.ckks``'s stated bounds,
  measured about ``1e-5`` absolute for ``d = 8`` and ``|A W| ~ 100``.
"""
from __future__ import annotations

import math
import os
import secrets
import time
from dataclasses import asdict, dataclass

import numpy as np

from fedhet.crypto import paillier as pl
from fedhet.parties.api import PartyError
from fedhet.parties.declare import MessageDecl, declare

SCHEMES = ("paillier", "naive", "ckks")

K_PUBKEY, K_ACTS, K_NOISE = "hei/pubkey", "hei/acts", "hei/noise_ct"
K_FWD_CT, K_FWD_MASKED = "hei/fwd_ct", "hei/fwd_masked"
K_GRAD_CT, K_GRAD_MASKED, K_INGRAD_CT = "hei/grad_ct", "hei/grad_masked", "hei/ingrad_ct"

_CHUNK = 48  # bits per exact float digit when big integers go through the float API of crypto.paillier


# ------------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class LayerSpec:
    """Scheme, key and fixed-point/masking parameters; both sides must use the same."""

    scheme: str = "paillier"
    key_bits: int = 2048
    slot_bits: int = 160
    a_int_bits: int = 6
    a_frac_bits: int = 12
    w_frac_bits: int = 16
    d_int_bits: int = 2
    d_frac_bits: int = 16
    mask_bits: int = 40
    lr: float = 0.1
    lr_frac_bits: int = 30
    batch_size: int = 128  # public bound on rows per batch (sizes the guest's gradient mask)
    ckks_params: str = "fast"
    ckks_mask: float = 1024.0
    pool: bool = True  # precompute Paillier obfuscators in background threads
    workers: int = 1   # worker processes for Paillier (1: in-process)

    def __post_init__(self):
        if self.scheme not in SCHEMES:
            raise ValueError(f"he scheme must be one of {SCHEMES}, got {self.scheme!r}")
        for f in ("key_bits", "slot_bits", "a_int_bits", "a_frac_bits", "w_frac_bits", "d_int_bits",
                  "d_frac_bits", "mask_bits", "lr_frac_bits", "batch_size", "workers"):
            v = getattr(self, f)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"LayerSpec.{f} must be a non-negative int, got {v!r}")
        if self.batch_size < 1 or self.workers < 1:
            raise ValueError("LayerSpec: batch_size and workers must be >= 1")
        if self.a_int_bits + self.a_frac_bits > 48 or self.d_int_bits + self.d_frac_bits > 48:
            raise ValueError("LayerSpec: int + frac bits of activations and gradients must be <= 48")
        if self.a_frac_bits + self.d_frac_bits < self.w_frac_bits:
            raise ValueError("LayerSpec: need a_frac_bits + d_frac_bits >= w_frac_bits")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"LayerSpec.lr must be a positive number, got {self.lr!r}")
        if round(self.lr * 2 ** self.lr_frac_bits) < 1:
            raise ValueError(f"LayerSpec.lr={self.lr} rounds to 0 on the 2**-{self.lr_frac_bits} grid")
        if self.scheme == "paillier" and (self.key_bits - 2) // self.slot_bits < 1:
            raise ValueError(f"slot_bits={self.slot_bits} does not fit a {self.key_bits}-bit key")
        if self.scheme != "ckks" and self.slot_bits < self.mask_bits + 8:
            raise ValueError(f"slot_bits={self.slot_bits} leaves no room for {self.mask_bits}-bit masks")
        if not self.ckks_mask > 0:
            raise ValueError("LayerSpec.ckks_mask must be positive")

    @property
    def masked_bytes(self) -> int:
        """Bytes per masked integer on the wire (two's complement, little-endian)."""
        return masked_bytes(self.slot_bits)

    @property
    def lr_int(self) -> int:
        return int(round(self.lr * 2 ** self.lr_frac_bits))

    @property
    def a_bound_bits(self) -> int:
        return self.a_int_bits + self.a_frac_bits

    @property
    def grad_public_bits(self) -> int:
        """Bits of the public bound on |G| (integer units), which the guest's mask must cover."""
        return (int(self.batch_size).bit_length() + self.a_int_bits + self.a_frac_bits
                + self.d_int_bits + self.d_frac_bits)


def masked_bytes(slot_bits: int) -> int:
    # Masked values are below 2**(slot_bits-1) plus the guest's much smaller additions; two more bytes.
    return (int(slot_bits) + 16) // 8


@dataclass
class LayerStats:
    """Counters of one side of one link (seconds are wall time inside this side's calls)."""

    encrypted: int = 0       # ciphertexts made (Paillier) or vectors encrypted (CKKS)
    decrypted: int = 0
    rerandomized: int = 0
    s_encrypt: float = 0.0
    s_decrypt: float = 0.0
    s_compute: float = 0.0   # homomorphic arithmetic and masks
    s_rerandomize: float = 0.0  # rerandomization (obfuscators not ready in the pool are computed here)
    s_wait: float = 0.0      # blocked in recv
    pool_misses: int = 0     # obfuscators the background pool had not ready in time
    delta_clipped: int = 0   # per-sample gradient entries clipped to |delta| < 2**d_int_bits
    min_mask_sigma: int | None = None  # smallest statistical mask margin used, bits (int schemes)
    max_bound_bits: int = 0  # largest slot bound met before masking (int schemes)

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------ helpers
def _obj(x) -> np.ndarray:
    """Object array of Python ints."""
    a = np.asarray(x)
    if a.dtype == object:
        return a
    return a.astype(np.int64).astype(object) if a.dtype.kind in "iu" else np.vectorize(int, otypes=[object])(a)


def quantize(x, frac_bits: int) -> np.ndarray:
    """round(x * 2**frac_bits) as Python ints (object array)."""
    x = np.asarray(x, dtype=np.float64)
    return np.rint(np.ldexp(x, int(frac_bits))).astype(np.int64).astype(object)


def _max_abs(a: np.ndarray) -> int:
    return max((abs(int(v)) for v in np.asarray(a, dtype=object).ravel()), default=0)


def _digits(a: np.ndarray, chunk: int = _CHUNK) -> list[np.ndarray]:
    """Signed digits d_t (|d_t| < 2**chunk, float64, exact) with a = sum_t d_t * 2**(chunk*t)."""
    a = np.asarray(a, dtype=object)
    n = max(1, -(-_max_abs(a).bit_length() // chunk))
    mask = (1 << chunk) - 1
    flat = a.ravel().tolist()
    out = []
    for t in range(n):
        sh = chunk * t
        out.append(np.array([float((abs(v) >> sh) & mask) * (1 if v >= 0 else -1) for v in flat],
                            dtype=np.float64).reshape(a.shape))
    return out


def _uniform_ints(shape, bits: int) -> np.ndarray:
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


def _round_div(num: int, den: int) -> int:
    """round(num / den), halves up, exact for Python ints (den > 0)."""
    return (2 * num + den) // (2 * den)


def weight_step(x: np.ndarray, rows: int, spec: LayerSpec) -> np.ndarray:
    """step(X) = round(lr * X / (rows * 2**(a_frac + d_frac - w_frac))) on the w grid (ints)."""
    shift = spec.a_frac_bits + spec.d_frac_bits - spec.w_frac_bits + spec.lr_frac_bits
    den = int(rows) << shift
    L = spec.lr_int
    x = np.asarray(x, dtype=object)
    return np.array([_round_div(int(v) * L, den) for v in x.ravel().tolist()], dtype=object).reshape(x.shape)


def quantize_delta(delta_ps: np.ndarray, spec: LayerSpec) -> np.ndarray:
    """Per-sample dL/dz clipped to |delta| < 2**d_int_bits, rounded to d_frac_bits (ints)."""
    lim = 2.0 ** spec.d_int_bits - 2.0 ** -spec.d_frac_bits
    return quantize(np.clip(np.asarray(delta_ps, dtype=np.float64), -lim, lim), spec.d_frac_bits)


def _count_clipped(delta_ps, spec: LayerSpec) -> int:
    return int(np.sum(np.abs(np.asarray(delta_ps, dtype=np.float64)) >= 2.0 ** spec.d_int_bits))


def quantize_acts(A: np.ndarray, spec: LayerSpec) -> np.ndarray:
    A = np.asarray(A, dtype=np.float64)
    if not np.all(np.isfinite(A)):
        raise ValueError("guest bottom-model output contains NaN or infinity")
    q = quantize(A, spec.a_frac_bits)
    if A.size and _max_abs(q) >= 1 << spec.a_bound_bits:
        raise ValueError(f"guest bottom-model output reaches |A| = {np.max(np.abs(A)):.4g}, not below "
                         f"2**a_int_bits = {2 ** spec.a_int_bits}; raise a_int_bits (and slot_bits) or lower "
                         "the learning rate")
    return q


def _int_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer matrix product of object arrays."""
    return np.dot(np.asarray(a, dtype=object), np.asarray(b, dtype=object))


def _unpack_signed(residues: list, n: int, slot_bits: int, slots: int, length: int) -> list[int]:
    """Decrypted packed plaintexts -> signed slot integers (crypto.paillier's packing, inverted)."""
    try:
        return pl.unpack_signed(residues, n, slot_bits, slots, length)
    except ValueError as e:
        raise PartyError(str(e)) from None


def _recv(party, frm: str, kind: str, stats: LayerStats):
    t0 = time.perf_counter()
    msg = party.recv(frm, kind)
    stats.s_wait += time.perf_counter() - t0
    return msg


def _need(msg, keys, kind, frm):
    if not isinstance(msg, dict) or any(k not in msg for k in keys):
        raise PartyError(f"{kind} from {frm!r} must be a dict with keys {list(keys)}")
    return msg


# ------------------------------------------------------------------------------------------ integer HE backends
class _PackedOps:
    """Exact-integer matrix operations on packed Paillier ciphertexts (crypto.paillier)."""

    two_layouts = True  # packed slots cannot be summed inside a ciphertext: send [[A]] both ways

    def __init__(self, ctx: "pl.PaillierContext", spec: LayerSpec):
        self.ctx, self.spec = ctx, spec
        self.pk = ctx.public_key
        self.n = int(self.pk.n)
        self.slot_bits, self.slots = pl.PackingSpec(0, 1, spec.slot_bits).layout(ctx.key_bits)

    def count(self, rows: int, length: int) -> int:
        return rows * -(-length // self.slots)

    def encrypt(self, ints: np.ndarray, bound_bits: int | None = None) -> "pl.EncryptedArray":
        ints = np.asarray(ints, dtype=object)
        top = _max_abs(ints)
        bits = max(bound_bits or 0, top.bit_length(), 1)
        if bits <= _CHUNK:
            spec = pl.PackingSpec(frac_bits=0, int_bits=bits, slot_bits=self.slot_bits)
            return self.ctx.encrypt(ints.astype(np.float64), spec)
        ds = _digits(ints)
        spec = pl.PackingSpec(frac_bits=0, int_bits=_CHUNK, slot_bits=self.slot_bits)
        enc = self.ctx.encrypt(ds[0], spec)
        for t, d in enumerate(ds[1:], 1):
            enc = enc.add_plain(np.ldexp(d, _CHUNK * t))
        # A power-of-two public bound: says no more than the magnitude's bit length.
        return pl.EncryptedArray(self.pk, enc.ciphertexts, enc.shape, spec, 0, 1 << bits)

    def matmul(self, enc, W: np.ndarray):
        """``Y[k, :] = sum_j W[j, k] X[j, :]`` for integer W of any size."""
        ds = _digits(W)
        out = None
        for t, d in enumerate(ds):
            if not np.any(d):
                continue
            y = pl.packed_matmul(enc, d, w_frac_bits=0, executor=self.ctx.executor)
            if t:
                y = y.mul_scalar(1 << (_CHUNK * t))
            out = y if out is None else out + y
        if out is None:  # all-zero W
            out = pl.packed_matmul(enc, ds[0], w_frac_bits=0)
        return out

    def add_ints(self, enc, ints: np.ndarray):
        for t, d in enumerate(_digits(ints)):
            if np.any(d):
                enc = enc.add_plain(np.ldexp(d, _CHUNK * t - enc.frac_bits))
        return enc

    def bound(self, enc) -> int:
        return int(enc.bound)

    def rerandomize(self, enc):
        return self.ctx.rerandomize(enc)

    def decrypt(self, enc) -> np.ndarray:
        ms = self.ctx.decrypt_raw(enc.ciphertexts.ravel())
        n_ct = enc.n_ct_per_row
        rows = [_unpack_signed(ms[i * n_ct:(i + 1) * n_ct], self.n, enc.slot_bits, enc.slots, enc.length)
                for i in range(enc.rows)]
        return np.array(rows, dtype=object).reshape(enc.rows, enc.length)

    def n_ct(self, enc) -> int:
        return enc.n_ciphertexts

    def to_wire(self, enc, include_bound: bool) -> dict:
        meta, arr = enc.to_wire(include_bound=include_bound)
        return {"meta": meta, "ct": arr}

    def from_wire(self, msg, what: str):
        try:
            return pl.EncryptedArray.from_wire(self.pk, msg["meta"], msg["ct"])
        except (KeyError, TypeError, ValueError) as e:
            raise PartyError(f"{what}: malformed ciphertexts: {e}") from None


class _NaiveOps:
    """The same operations with python-paillier, one ``EncryptedNumber`` per value."""

    two_layouts = False

    def __init__(self, public_key, private_key, spec: LayerSpec):
        from phe import paillier as phe_paillier

        self._phe = phe_paillier
        self.pk, self.sk, self.spec = public_key, private_key, spec
        self.key_bits = int(public_key.n.bit_length())

    def count(self, rows: int, length: int) -> int:
        return rows * length

    def encrypt(self, ints: np.ndarray, bound_bits: int | None = None) -> np.ndarray:
        ints = np.asarray(ints, dtype=object)
        out = np.empty(ints.shape, dtype=object)
        for idx in np.ndindex(ints.shape):
            out[idx] = self.pk.encrypt(int(ints[idx]))
        return out

    def matmul(self, X: np.ndarray, W: np.ndarray) -> np.ndarray:
        r, L = X.shape
        K = W.shape[1]
        Y = np.empty((K, L), dtype=object)
        for k in range(K):
            acc = None
            for j in range(r):
                w = int(W[j, k])
                if w == 0:
                    continue
                term = [x * w for x in X[j]]
                acc = term if acc is None else [a + t for a, t in zip(acc, term)]
            if acc is None:
                acc = [self.pk.encrypt(0, r_value=1) for _ in range(L)]
            Y[k] = acc
        return Y

    def add_ints(self, Y: np.ndarray, ints: np.ndarray) -> np.ndarray:
        out = np.empty(Y.shape, dtype=object)
        for idx in np.ndindex(Y.shape):
            out[idx] = Y[idx] + int(ints[idx])
        return out

    def rerandomize(self, Y: np.ndarray) -> np.ndarray:
        for y in Y.ravel():
            y.obfuscate()
        return Y

    def decrypt(self, Y: np.ndarray) -> np.ndarray:
        out = np.empty(Y.shape, dtype=object)
        for idx in np.ndindex(Y.shape):
            out[idx] = int(self.sk.decrypt(Y[idx]))
        return out

    def n_ct(self, Y) -> int:
        return int(Y.size)

    def to_wire(self, Y: np.ndarray, include_bound: bool = False) -> dict:
        cts = [y.ciphertext(be_secure=False) for y in Y.ravel()]
        return {"meta": {"shape": list(Y.shape)}, "ct": pl.ciphertexts_to_bytes(cts, self.pk)}

    def from_wire(self, msg, what: str) -> np.ndarray:
        try:
            shape = tuple(int(s) for s in msg["meta"]["shape"])
            cts = pl.ciphertexts_from_bytes(msg["ct"], self.pk)
        except (KeyError, TypeError, ValueError) as e:
            raise PartyError(f"{what}: malformed ciphertexts: {e}") from None
        if len(shape) != 2 or len(cts) != shape[0] * shape[1]:
            raise PartyError(f"{what}: {len(cts)} ciphertexts do not fill shape {shape}")
        out = np.empty(len(cts), dtype=object)
        for i, c in enumerate(cts):
            out[i] = self._phe.EncryptedNumber(self.pk, int(c), 0)
        return out.reshape(shape)

    def transpose(self, Y):
        return Y.T


def _int_bound(a_bits: int, W: np.ndarray) -> int:
    """Public-style bound of |A W| slots: 2**a_bits * max_k sum_j |W[j, k]|."""
    W = np.asarray(W, dtype=object)
    cols = [sum(abs(int(v)) for v in W[:, k]) for k in range(W.shape[1])] if W.size else [0]
    return (1 << a_bits) * max(cols)


# ------------------------------------------------------------------------------------------ integer schemes
class _IntGuest:
    """Guest side (key owner) for "paillier" and "naive"."""

    def __init__(self, party, host: str, spec: LayerSpec, d: int, width: int):
        self.party, self.host, self.spec = party, host, spec
        self.d, self.K = int(d), int(width)
        self.stats = LayerStats()
        self.eps = np.zeros((self.d, self.K), dtype=object)  # accumulated noise, w grid
        self._A = None
        self._ctx = None

    def setup(self) -> None:
        t0 = time.perf_counter()
        if self.spec.scheme == "paillier":
            self._ctx = pl.PaillierContext.generate(self.spec.key_bits, workers=self.spec.workers)
            self.ops = _PackedOps(self._ctx, self.spec)
            pk = self._ctx.public_key
            if self.spec.pool:
                s = self.spec
                per_batch = (self.ops.count(self.d, s.batch_size) + self.ops.count(s.batch_size, self.d)
                             + self.ops.count(self.K, self.d))
                self._ctx.start_background_pool(per_batch)
        else:
            pk, sk = pl.generate_keypair(self.spec.key_bits)
            self.ops = _NaiveOps(pk, sk, self.spec)
        self.stats.s_encrypt += time.perf_counter() - t0
        key = np.frombuffer(pl.public_key_to_bytes(pk), dtype=np.uint8).copy()
        self.party.send(self.host, K_PUBKEY, {"scheme": self.spec.scheme, "key": key})

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()

    # -- forward
    def forward(self, A: np.ndarray, train: bool) -> None:
        """Send [[A]] (and [[eps]] when training), finish the masked forward for the host."""
        s, st = self.spec, self.stats
        A_int = quantize_acts(A, s)
        if A_int.ndim != 2 or A_int.shape[1] != self.d:
            raise ValueError(f"guest activations must have shape (rows, {self.d}), got {A_int.shape}")
        b = A_int.shape[0]
        if b > s.batch_size:
            raise ValueError(f"batch of {b} rows exceeds batch_size={s.batch_size} (the public gradient bound)")
        self._A = A_int
        t0 = time.perf_counter()
        msg = {"rows": b}
        if self.ops.two_layouts:
            msg["fwd"] = self.ops.to_wire(self.ops.encrypt(A_int.T, s.a_bound_bits), True)
            st.encrypted += self.ops.count(self.d, b)
            if train:
                msg["grad"] = self.ops.to_wire(self.ops.encrypt(A_int, s.a_bound_bits), True)
                st.encrypted += self.ops.count(b, self.d)
        else:
            msg["all"] = self.ops.to_wire(self.ops.encrypt(A_int, s.a_bound_bits), True)
            st.encrypted += self.ops.count(b, self.d)
        st.s_encrypt += time.perf_counter() - t0
        self.party.send(self.host, K_ACTS, msg)
        if train:
            # [[eps]] now: its encryption overlaps the host's forward work; eps only changes after backward.
            t0 = time.perf_counter()
            enc = self.ops.encrypt(self.eps.T)
            st.encrypted += self.ops.count(self.K, self.d)
            st.s_encrypt += time.perf_counter() - t0
            self.party.send(self.host, K_NOISE, self.ops.to_wire(enc, True))
        if self._ctx is not None:
            st.pool_misses = int(self._ctx.pool.misses)
        ct = self.ops.from_wire(_recv(self.party, self.host, K_FWD_CT, st), K_FWD_CT)
        t0 = time.perf_counter()
        dec = self.ops.decrypt(ct)  # (K, b): A W_g + e_B
        st.decrypted += self.ops.n_ct(ct)
        st.s_decrypt += time.perf_counter() - t0
        if dec.shape != (self.K, b):
            raise PartyError(f"{K_FWD_CT}: expected ({self.K}, {b}) values, got {dec.shape}")
        masked = dec + _int_dot(self.eps.T, A_int.T)  # + A eps: now A W + e_B
        self.party.send(self.host, K_FWD_MASKED, encode_masked(masked, s.masked_bytes))

    # -- backward
    def backward(self) -> np.ndarray:
        """Masked weight gradient for the host; returns dL/dA (rows x d, mean over the batch)."""
        s, st = self.spec, self.stats
        b = self._A.shape[0]
        ct = self.ops.from_wire(_recv(self.party, self.host, K_GRAD_CT, st), K_GRAD_CT)
        t0 = time.perf_counter()
        dec = self.ops.decrypt(ct)  # (K, d): G^T + e_W
        st.decrypted += self.ops.n_ct(ct)
        st.s_decrypt += time.perf_counter() - t0
        if dec.shape != (self.K, self.d):
            raise PartyError(f"{K_GRAD_CT}: expected ({self.K}, {self.d}) values, got {dec.shape}")
        nu = _uniform_ints(dec.shape, s.mask_bits + s.grad_public_bits)
        self.party.send(self.host, K_GRAD_MASKED, encode_masked(dec + nu, s.masked_bytes))
        ct = self.ops.from_wire(_recv(self.party, self.host, K_INGRAD_CT, st), K_INGRAD_CT)
        t0 = time.perf_counter()
        g = self.ops.decrypt(ct)  # (b, d): delta W^T, frac d_frac + w_frac
        st.decrypted += self.ops.n_ct(ct)
        st.s_decrypt += time.perf_counter() - t0
        if g.shape != (b, self.d):
            raise PartyError(f"{K_INGRAD_CT}: expected ({b}, {self.d}) values, got {g.shape}")
        self.eps = self.eps + weight_step(nu, b, s).T
        self._A = None
        scale = 2.0 ** -(s.d_frac_bits + s.w_frac_bits) / b
        return np.array([float(v) for v in g.ravel()], dtype=np.float64).reshape(g.shape) * scale


class _IntHost:
    """Host side (label owner, computes on the guest's ciphertexts) for "paillier" and "naive"."""

    def __init__(self, party, guest: str, spec: LayerSpec, W_init: np.ndarray):
        self.party, self.guest, self.spec = party, guest, spec
        W_init = np.asarray(W_init, dtype=np.float64)
        self.d, self.K = W_init.shape
        self.W = quantize(W_init, spec.w_frac_bits)  # the host's masked copy W_g (exact ints)
        self.stats = LayerStats()
        self._ctx = None

    def setup(self) -> None:
        msg = _need(self.party.recv(self.guest, K_PUBKEY), ("scheme", "key"), K_PUBKEY, self.guest)
        if msg["scheme"] != self.spec.scheme:
            raise PartyError(f"guest {self.guest!r} uses HE scheme {msg['scheme']!r}, host {self.spec.scheme!r}")
        try:
            pk = pl.public_key_from_bytes(np.asarray(msg["key"], dtype=np.uint8).tobytes())
        except ValueError as e:
            raise PartyError(f"{K_PUBKEY} from {self.guest!r}: {e}") from None
        if pk.n.bit_length() != self.spec.key_bits:
            raise PartyError(f"guest {self.guest!r} sent a {pk.n.bit_length()}-bit key, expected {self.spec.key_bits}")
        if self.spec.scheme == "paillier":
            self._ctx = pl.PaillierContext(pk, None, workers=self.spec.workers)
            self.ops = _PackedOps(self._ctx, self.spec)
            if self.spec.pool:
                s = self.spec
                per_batch = (self.ops.count(self.K, s.batch_size) + self.ops.count(self.K, self.d)
                             + self.ops.count(s.batch_size, self.d))
                self._ctx.start_background_pool(per_batch)
        else:
            self.ops = _NaiveOps(pk, None, self.spec)

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.close()

    def true_weight_share(self) -> np.ndarray:
        """The host's share W_g as floats (the true weight is W_g + eps; eps only the guest knows)."""
        return np.array([float(v) for v in self.W.ravel()]).reshape(self.W.shape) * 2.0 ** -self.spec.w_frac_bits

    def _mask(self, enc, bound: int, what: str):
        """Add the host's mask, uniform over +-2**(slot_bits-2), and check its statistical margin."""
        s, st = self.spec, self.stats
        sigma = (s.slot_bits - 2) - int(bound).bit_length()
        st.max_bound_bits = max(st.max_bound_bits, int(bound).bit_length())
        if sigma < s.mask_bits:
            raise pl.PackingOverflowError(
                f"{what}: values need {int(bound).bit_length()} bits, so a mask in {s.slot_bits}-bit slots "
                f"hides them by only {sigma} < mask_bits={s.mask_bits} bits; raise slot_bits")
        st.min_mask_sigma = sigma if st.min_mask_sigma is None else min(st.min_mask_sigma, sigma)
        noise = _uniform_ints(self._shape(enc), s.slot_bits - 2)
        return self.ops.add_ints(enc, noise), noise

    def _shape(self, enc):
        return tuple(enc.shape) if hasattr(enc, "shape") else enc.shape

    def _send_ct(self, kind: str, enc) -> None:
        t0 = time.perf_counter()
        enc = self.ops.rerandomize(enc)
        self.stats.rerandomized += self.ops.n_ct(enc)
        self.stats.s_rerandomize += time.perf_counter() - t0
        if self._ctx is not None:
            self.stats.pool_misses = int(self._ctx.pool.misses)
        self.party.send(self.guest, kind, self.ops.to_wire(enc, False))

    # -- forward
    def recv_acts(self) -> None:
        msg = _need(_recv(self.party, self.guest, K_ACTS, self.stats), ("rows",), K_ACTS, self.guest)
        self.rows = int(msg["rows"])
        if not 0 < self.rows <= self.spec.batch_size:
            raise PartyError(f"{K_ACTS}: {self.rows} rows is outside 1..batch_size={self.spec.batch_size}")
        if self.ops.two_layouts:
            self.X_fwd = self.ops.from_wire(msg.get("fwd"), K_ACTS)
            self.X_grad = self.ops.from_wire(msg["grad"], K_ACTS) if "grad" in msg else None
        else:
            X = self.ops.from_wire(msg.get("all"), K_ACTS)
            self.X_fwd, self.X_grad = self.ops.transpose(X), X
        if tuple(self.X_fwd.shape) != (self.d, self.rows) or (
                self.X_grad is not None and tuple(self.X_grad.shape) != (self.rows, self.d)):
            raise PartyError(f"{K_ACTS}: activations of shape {tuple(self.X_fwd.shape)}, "
                             f"expected ({self.d}, {self.rows})")
        if self.spec.scheme == "paillier" and self.X_fwd.bound > 1 << self.spec.a_bound_bits:
            raise PartyError(f"{K_ACTS}: slot bound exceeds 2**(a_int_bits + a_frac_bits)")

    def send_forward(self) -> None:
        t0 = time.perf_counter()
        Y = self.ops.matmul(self.X_fwd, self.W)  # (K, rows)
        bound = _int_bound(self.spec.a_bound_bits, self.W)
        Y, self._e_fwd = self._mask(Y, bound, "forward")
        self.stats.s_compute += time.perf_counter() - t0
        self._send_ct(K_FWD_CT, Y)

    def recv_forward(self) -> np.ndarray:
        """The guest part of the layer output, A_g W (rows x K), exact on the 2**-(a_frac+w_frac) grid."""
        arr = _recv(self.party, self.guest, K_FWD_MASKED, self.stats)
        masked = decode_masked(arr, self.spec.masked_bytes, (self.K, self.rows))
        Z = masked - self._e_fwd
        self._e_fwd = None
        scale = 2.0 ** -(self.spec.a_frac_bits + self.spec.w_frac_bits)
        return np.array([float(v) for v in Z.T.ravel()], dtype=np.float64).reshape(self.rows, self.K) * scale

    # -- backward
    def send_gradient(self, delta_ps: np.ndarray) -> None:
        """delta_ps: per-sample dL/dz (rows x K), i.e. the batch-mean gradient times rows."""
        if self.X_grad is None:
            raise PartyError("send_gradient after a forward without training activations")
        t0 = time.perf_counter()
        self.stats.delta_clipped += _count_clipped(delta_ps, self.spec)
        self._delta = quantize_delta(delta_ps, self.spec)
        if self._delta.shape != (self.rows, self.K):
            raise ValueError(f"delta must have shape ({self.rows}, {self.K}), got {self._delta.shape}")
        Y = self.ops.matmul(self.X_grad, self._delta)  # (K, d): G^T
        bound = _int_bound(self.spec.a_bound_bits, self._delta)
        Y, self._e_grad = self._mask(Y, bound, "weight gradient")
        self.stats.s_compute += time.perf_counter() - t0
        self._send_ct(K_GRAD_CT, Y)

    def finish_backward(self) -> None:
        """Unmask G + nu, send [[delta W^T]] (old weights), then W_g -= step(G + nu)."""
        s = self.spec
        arr = _recv(self.party, self.guest, K_GRAD_MASKED, self.stats)
        M = decode_masked(arr, s.masked_bytes, (self.K, self.d)) - self._e_grad
        enc_eps = self.ops.from_wire(_recv(self.party, self.guest, K_NOISE, self.stats), K_NOISE)
        if tuple(enc_eps.shape) != (self.K, self.d):
            raise PartyError(f"{K_NOISE}: shape {tuple(enc_eps.shape)}, expected ({self.K}, {self.d})")
        t0 = time.perf_counter()
        Y = self.ops.matmul(enc_eps, self._delta.T)  # (rows, d): delta eps^T
        Y = self.ops.add_ints(Y, _int_dot(self._delta, self.W.T))  # + delta W_g^T
        self.stats.s_compute += time.perf_counter() - t0
        self._send_ct(K_INGRAD_CT, Y)
        self.W = self.W - weight_step(M, self.rows, s).T
        self._delta = self._e_grad = self.X_grad = self.X_fwd = None


# ------------------------------------------------------------------------------------------ CKKS
class _CKKSLayout:
    """Flattened row-major activations (rows x d), repeated m times, split into ciphertext chunks."""

    def __init__(self, rows: int, d: int, K: int, slots: int):
        self.rows, self.d, self.K = rows, d, K
        self.L = rows * d
        self.m = max(1, min(K, slots // self.L))
        self.groups = -(-K // self.m)
        self.total = self.m * self.L
        self.slots = slots
        self.chunks = -(-self.total // slots)

    def cols(self, g: int) -> list[int]:
        return [g * self.m + t for t in range(self.m)]

    def split(self, v: np.ndarray) -> list[np.ndarray]:
        return [v[c * self.slots:(c + 1) * self.slots] for c in range(self.chunks)]

    def per_col(self, g: int, make) -> np.ndarray:
        """Concatenate make(k) (length L) for the m columns of group g; zeros past K."""
        parts = [make(k) if k < self.K else np.zeros(self.L) for k in self.cols(g)]
        return np.concatenate(parts)


class _CKKSGuest:
    def __init__(self, party, host: str, spec: LayerSpec, d: int, width: int):
        self.party, self.host, self.spec = party, host, spec
        self.d, self.K = int(d), int(width)
        self.stats = LayerStats()
        self.eps = np.zeros((self.d, self.K))
        self._A = None

    def setup(self) -> None:
        from fedhet.crypto import ckks

        self.ck = ckks
        t0 = time.perf_counter()
        self.ctx = ckks.make_context(self.spec.ckks_params, galois_keys=False)
        self.slots = ckks.slot_count(self.ctx)
        self.stats.s_encrypt += time.perf_counter() - t0
        key = np.frombuffer(ckks.public_context_bytes(self.ctx), dtype=np.uint8).copy()
        self.party.send(self.host, K_PUBKEY, {"scheme": "ckks", "key": key})

    def close(self) -> None:
        pass

    def _enc(self, v: np.ndarray, lay: _CKKSLayout) -> list:
        out = [self.ck.to_wire(self.ck.encrypt_vector(self.ctx, c)) for c in lay.split(v)]
        self.stats.encrypted += len(out)
        return out

    def _dec(self, msg, lay: _CKKSLayout, groups: int, what: str) -> list[np.ndarray]:
        """Decrypt groups x chunks vectors into `groups` arrays of length m*L."""
        if not isinstance(msg, list) or len(msg) != groups * lay.chunks:
            raise PartyError(f"{what}: expected {groups * lay.chunks} CKKS vectors")
        t0 = time.perf_counter()
        out = []
        for g in range(groups):
            parts = [self.ck.decrypt_vector(self.ck.from_wire(self.ctx, a)) for a in
                     msg[g * lay.chunks:(g + 1) * lay.chunks]]
            out.append(np.concatenate(parts)[:lay.total])
        self.stats.decrypted += len(msg)
        self.stats.s_decrypt += time.perf_counter() - t0
        return out

    def forward(self, A: np.ndarray, train: bool) -> None:
        A = np.asarray(A, dtype=np.float64)
        if A.ndim != 2 or A.shape[1] != self.d:
            raise ValueError(f"guest activations must have shape (rows, {self.d}), got {A.shape}")
        if not np.all(np.isfinite(A)) or (A.size and np.max(np.abs(A)) >= 2.0 ** self.spec.a_int_bits):
            raise ValueError("guest bottom-model output must be finite with |A| < 2**a_int_bits")
        b = A.shape[0]
        lay = self.lay = _CKKSLayout(b, self.d, self.K, self.slots)
        self._A = A
        t0 = time.perf_counter()
        cts = self._enc(np.tile(A.ravel(), lay.m), lay)
        self.stats.s_encrypt += time.perf_counter() - t0
        self.party.send(self.host, K_ACTS, {"rows": b, "ckks": cts})
        if train:
            t0 = time.perf_counter()
            cts = []
            for g in range(lay.groups):
                cts += self._enc(lay.per_col(g, lambda k: np.tile(self.eps[:, k], b)), lay)
            self.stats.s_encrypt += time.perf_counter() - t0
            self.party.send(self.host, K_NOISE, cts)
        vs = self._dec(_recv(self.party, self.host, K_FWD_CT, self.stats), lay, lay.groups, K_FWD_CT)
        S = np.zeros((self.K, b))
        for g, v in enumerate(vs):
            sums = v.reshape(lay.m, b, self.d).sum(axis=2)  # sum over features of masked products
            for t, k in enumerate(lay.cols(g)):
                if k < self.K:
                    S[k] = sums[t]
        masked = S.T + A @ self.eps  # (b, K): A W + masks
        self.party.send(self.host, K_FWD_MASKED, masked.astype(np.float64))

    def backward(self) -> np.ndarray:
        lay, b, s = self.lay, self._A.shape[0], self.spec
        vs = self._dec(_recv(self.party, self.host, K_GRAD_CT, self.stats), lay, lay.groups, K_GRAD_CT)
        GT = np.zeros((self.K, self.d))
        for g, v in enumerate(vs):
            sums = v.reshape(lay.m, b, self.d).sum(axis=1)  # sum over samples
            for t, k in enumerate(lay.cols(g)):
                if k < self.K:
                    GT[k] = sums[t]
        rng = np.random.default_rng(secrets.randbits(128))
        nu = rng.uniform(-s.ckks_mask, s.ckks_mask, size=GT.shape)
        self.party.send(self.host, K_GRAD_MASKED, (GT + nu).astype(np.float64))
        (v,) = self._dec(_recv(self.party, self.host, K_INGRAD_CT, self.stats), lay, 1, K_INGRAD_CT)
        g = v.reshape(lay.m, b, self.d).sum(axis=0)  # partial sums over interactive units per copy
        self.eps = self.eps + (s.lr / b) * nu.T
        self._A = None
        return g / b


class _CKKSHost:
    def __init__(self, party, guest: str, spec: LayerSpec, W_init: np.ndarray):
        self.party, self.guest, self.spec = party, guest, spec
        self.W = np.array(W_init, dtype=np.float64)
        self.d, self.K = self.W.shape
        self.stats = LayerStats()

    def setup(self) -> None:
        from fedhet.crypto import ckks

        self.ck = ckks
        msg = _need(self.party.recv(self.guest, K_PUBKEY), ("scheme", "key"), K_PUBKEY, self.guest)
        if msg["scheme"] != "ckks":
            raise PartyError(f"guest {self.guest!r} uses HE scheme {msg['scheme']!r}, host 'ckks'")
        try:
            self.ctx = ckks.context_from_bytes(np.asarray(msg["key"], dtype=np.uint8).tobytes())
        except ValueError as e:
            raise PartyError(f"{K_PUBKEY} from {self.guest!r}: {e}") from None
        if self.ctx.is_private():
            raise PartyError(f"guest {self.guest!r} sent its secret key")
        self.slots = ckks.slot_count(self.ctx)

    def close(self) -> None:
        pass

    def true_weight_share(self) -> np.ndarray:
        return self.W.copy()

    def _vecs(self, arrs, count: int, what: str) -> list:
        if not isinstance(arrs, list) or len(arrs) != count:
            raise PartyError(f"{what}: expected {count} CKKS vectors")
        try:
            return [self.ck.from_wire(self.ctx, a) for a in arrs]
        except ValueError as e:
            raise PartyError(f"{what}: {e}") from None

    def _noise(self, n: int) -> np.ndarray:
        rng = np.random.default_rng(secrets.randbits(128))
        return rng.uniform(-self.spec.ckks_mask, self.spec.ckks_mask, size=n)

    def _send(self, kind: str, vecs: list) -> None:
        t0 = time.perf_counter()
        wire = [self.ck.to_wire(v) for v in vecs]
        self.stats.s_compute += time.perf_counter() - t0
        self.party.send(self.guest, kind, wire)

    def _products(self, pattern, sum_axis: int):
        """For each group: C * pattern(g) + per-slot noise; returns vectors and the noise sums (K, .)."""
        lay = self.lay
        out, sums = [], {}
        for g in range(lay.groups):
            P = pattern(g)
            N = self._noise(lay.total)
            for c, (Pc, Nc) in enumerate(zip(lay.split(P), lay.split(N))):
                out.append(self.C[c] * Pc.tolist() + Nc.tolist())
            red = N.reshape(lay.m, lay.rows, lay.d).sum(axis=sum_axis)
            for t, k in enumerate(lay.cols(g)):
                if k < self.K:
                    sums[k] = red[t]
        return out, np.stack([sums[k] for k in range(self.K)])

    def recv_acts(self) -> None:
        msg = _need(_recv(self.party, self.guest, K_ACTS, self.stats), ("rows", "ckks"), K_ACTS, self.guest)
        self.rows = int(msg["rows"])
        if not 0 < self.rows <= self.spec.batch_size:
            raise PartyError(f"{K_ACTS}: {self.rows} rows is outside 1..batch_size={self.spec.batch_size}")
        self.lay = _CKKSLayout(self.rows, self.d, self.K, self.slots)
        self.C = self._vecs(msg["ckks"], self.lay.chunks, K_ACTS)

    def send_forward(self) -> None:
        lay = self.lay
        t0 = time.perf_counter()
        vecs, self._n_fwd = self._products(lambda g: lay.per_col(g, lambda k: np.tile(self.W[:, k], lay.rows)), 2)
        self.stats.s_compute += time.perf_counter() - t0
        self._send(K_FWD_CT, vecs)

    def recv_forward(self) -> np.ndarray:
        masked = np.asarray(_recv(self.party, self.guest, K_FWD_MASKED, self.stats), dtype=np.float64)
        if masked.shape != (self.rows, self.K):
            raise PartyError(f"{K_FWD_MASKED}: shape {masked.shape}, expected ({self.rows}, {self.K})")
        return masked - self._n_fwd.T

    def send_gradient(self, delta_ps: np.ndarray) -> None:
        lim = 2.0 ** self.spec.d_int_bits
        self.stats.delta_clipped += _count_clipped(delta_ps, self.spec)
        self._delta = np.clip(np.asarray(delta_ps, dtype=np.float64), -lim, lim)
        lay = self.lay
        t0 = time.perf_counter()
        vecs, self._n_grad = self._products(
            lambda g: lay.per_col(g, lambda k: np.repeat(self._delta[:, k], lay.d)), 1)
        self.stats.s_compute += time.perf_counter() - t0
        self._send(K_GRAD_CT, vecs)

    def finish_backward(self) -> None:
        lay = self.lay
        M = np.asarray(_recv(self.party, self.guest, K_GRAD_MASKED, self.stats), dtype=np.float64)
        if M.shape != (self.K, self.d):
            raise PartyError(f"{K_GRAD_MASKED}: shape {M.shape}, expected ({self.K}, {self.d})")
        M = M - self._n_grad
        E = self._vecs(_recv(self.party, self.guest, K_NOISE, self.stats), lay.groups * lay.chunks, K_NOISE)
        t0 = time.perf_counter()
        acc = [None] * lay.chunks
        for g in range(lay.groups):
            Q = lay.split(lay.per_col(g, lambda k: np.repeat(self._delta[:, k], lay.d)))
            for c in range(lay.chunks):
                term = E[g * lay.chunks + c] * Q[c].tolist()
                acc[c] = term if acc[c] is None else acc[c] + term
        plain = np.zeros(lay.total)
        plain[:lay.L] = (self._delta @ self.W.T).ravel()  # delta W_g^T, in copy 0 only
        acc = [a + p.tolist() for a, p in zip(acc, lay.split(plain))]
        self.stats.s_compute += time.perf_counter() - t0
        self._send(K_INGRAD_CT, acc)
        self.W = self.W - (self.spec.lr / self.rows) * M.T
        self._delta = self.C = None


# ------------------------------------------------------------------------------------------ public API
def guest_layer(party, host: str, spec: LayerSpec, d: int, width: int):
    """The guest (passive party, key owner) side of one link; call ``setup()`` first."""
    cls = _CKKSGuest if spec.scheme == "ckks" else _IntGuest
    return cls(party, host, spec, d, width)


def host_layer(party, guest: str, spec: LayerSpec, W_init: np.ndarray):
    """The host (label owner) side of one link, holding the masked copy of ``W_init`` (d x K)."""
    cls = _CKKSHost if spec.scheme == "ckks" else _IntHost
    return cls(party, guest, spec, W_init)


def true_weight(host_side, guest_side) -> np.ndarray:
    """W = W_g + eps as floats (test helper: needs both parties' private state)."""
    if isinstance(host_side, _CKKSHost):
        return host_side.W + guest_side.eps
    s = host_side.spec
    W = host_side.W + guest_side.eps
    return np.array([float(v) for v in W.ravel()]).reshape(W.shape) * 2.0 ** -s.w_frac_bits


# ------------------------------------------------------------------------------------------ declarations
def _cfg_spec(cfg: dict, defaults: dict) -> dict:
    out = dict(defaults)
    out.update({k: cfg[k] for k in defaults if k in cfg})
    return out


def declarations(host: str = "host", guest: str = "guest", *, scheme_key: str = "he",
                 width_key: str = "interactive_width", defaults: dict | None = None) -> list[MessageDecl]:
    """The layer's message kinds with checks on dtypes and shapes; ``cfg[scheme_key]`` picks the scheme."""
    dflt = {scheme_key: "paillier", "key_bits": LayerSpec.key_bits, "slot_bits": LayerSpec.slot_bits,
            width_key: 16}
    dflt.update(defaults or {})

    def params(cfg):
        c = _cfg_spec(cfg, dflt)
        return c[scheme_key], int(c["key_bits"]), int(c["slot_bits"]), int(c[width_key])

    def ct_check(arrays, cfg):
        scheme, key_bits, _, _ = params(cfg)
        if not arrays:
            return "expected ciphertexts, got no arrays"
        for dt, shape in arrays:
            if scheme == "ckks":
                if dt != "|u1" or len(shape) != 1:
                    return f"CKKS ciphertexts must be 1-D uint8 (serialised vectors), got {dt}{list(shape)}"
            elif dt != "|u1" or len(shape) != 2 or shape[1] != key_bits // 4:
                return f"Paillier ciphertexts must be uint8 (n, {key_bits // 4}), got {dt}{list(shape)}"
        return None

    def masked_check(arrays, cfg):
        scheme, _, slot_bits, K = params(cfg)
        if len(arrays) != 1:
            return f"expected one masked array, got {len(arrays)}"
        dt, shape = arrays[0]
        if scheme == "ckks":
            if dt != "<f8" or len(shape) != 2 or K not in shape:
                return f"CKKS masked values must be float64 with one axis of width {K}, got {dt}{list(shape)}"
            return None
        w = masked_bytes(slot_bits)
        if dt != "|u1" or len(shape) != 3 or shape[0] != K or shape[2] != w:
            return (f"masked integers must be uint8 ({K}, n, {w}) (K rows of {w}-byte two's complement "
                    f"values), got {dt}{list(shape)}")
        return None

    def key_check(arrays, cfg):
        scheme, key_bits, _, _ = params(cfg)
        if len(arrays) != 1 or arrays[0][0] != "|u1" or len(arrays[0][1]) != 1:
            return f"expected one 1-D uint8 public key, got {arrays}"
        if scheme != "ckks" and arrays[0][1][0] != key_bits // 8:
            return f"a {key_bits}-bit Paillier public key is {key_bits // 8} bytes, got {arrays[0][1][0]}"
        return None

    ct = ("; Paillier (packed or naive): uint8 (n_ciphertexts, key_bits/4), one fixed-width big-endian ciphertext mod n**2 "
          "per row (512 bytes for 2048-bit keys), plus shape metadata; CKKS: 1-D uint8 serialised vectors")
    masked = ("; Paillier (packed or naive): uint8 ({dims}, masked_bytes) two's complement integers, masked_bytes = "
              "(slot_bits + 16) // 8 (22 for 160-bit slots); CKKS: float64 {ck}")
    return [
        declare(K_PUBKEY, guest, host, "guest's public key: Paillier n as uint8 (key_bits/8,), or a TenSEAL "
                "context without the secret key as 1-D uint8", key_check),
        declare(K_ACTS, guest, host, "guest's bottom-model output encrypted under its own key, packed along "
                "the batch and (training) along the features" + ct, ct_check),
        declare(K_NOISE, guest, host, "guest's accumulated weight noise eps, encrypted under its own key" + ct,
                ct_check),
        declare(K_FWD_CT, host, guest, "[[A_g W_g + e_B]]: host's product on the guest's ciphertexts plus "
                "the host's mask, rerandomized" + ct, ct_check),
        declare(K_FWD_MASKED, guest, host, "A_g W + e_B: the layer output still masked by the host's noise"
                + masked.format(dims="K, rows", ck="(rows, K)"), masked_check),
        declare(K_GRAD_CT, host, guest, "[[A_g^T delta + e_W]]: weight gradient masked by the host, "
                "rerandomized" + ct, ct_check),
        declare(K_GRAD_MASKED, guest, host, "G + e_W + nu: weight gradient masked by both parties' noise"
                + masked.format(dims="K, d", ck="(K, d)"), masked_check),
        declare(K_INGRAD_CT, host, guest, "[[delta (W_g + eps)^T]]: the guest's input gradient, encrypted, "
                "rerandomized" + ct, ct_check),
    ]


DECLARATIONS = declarations()
