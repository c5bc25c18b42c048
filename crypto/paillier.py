"""Paillier encryption of float arrays: the entry point (a key, a worker pool, an obfuscator pool).

The pieces live in one module per idea; this module re-exports their public names:

* :mod:`fedhet.crypto.paillier_keys`: key pairs (phe), gmpy2 key views, public-key bytes, and the
  raw arithmetic ``Enc(m) = (1 + m*n) * s mod n**2`` with an obfuscator ``s`` in one of two forms
  (``obfuscation=``): ``"standard"`` ``s = r**n mod n**2`` (the default here: textbook Paillier,
  DCR only, statistically hiding rerandomization) or ``"short_exponent"`` ``s = h**x mod n**2``
  with a public fixed base ``h`` and a ``2*kappa``-bit ``x`` from precomputed tables (DJN; 20-80x
  cheaper, rests on the extra short-exponent assumption stated in that module); both with a CRT
  path for the key owner;
* :mod:`fedhet.crypto.paillier_packing`: fixed point (``round(x * 2**frac_bits)``, the one
  rounding of :mod:`fedhet.crypto.fixedpoint`), signed slot packing, and the headroom bound
  that raises ``PackingOverflowError`` before any slot could overflow;
* :mod:`fedhet.crypto.paillier_array`: ``EncryptedArray`` (packed ciphertexts, their
  arithmetic and wire format) and ``packed_matmul``.

Here: ``ObfuscatorPool`` computes obfuscators ahead of use (in worker processes or a background
thread), since they dominate encryption cost, and ``PaillierContext`` ties a key, a pool of worker
processes and an obfuscator pool together to encrypt (packed along the last axis), rerandomize
and decrypt (CRT, in the workers).

Results of arithmetic are deterministic functions of the input ciphertexts and scalars; the key
owner could recover the combined randomness and learn about the scalars, so
``PaillierContext.rerandomize`` a result before sending it back to the key owner.

Default key length is 2048 bits (``DEFAULT_KEY_BITS``).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from concurrent.futures import Executor, ProcessPoolExecutor

import gmpy2
import numpy as np

from .fixedpoint import quantize
from .paillier_array import (
    EncryptedArray,
    ciphertexts_from_bytes,
    ciphertexts_to_bytes,
    packed_matmul,
    packed_matmul_ints,
)
from .paillier_keys import (
    DEFAULT_KAPPA,
    DEFAULT_KEY_BITS,
    OBFUSCATIONS,
    decrypt_list,
    generate_keypair,
    short_exponent_base,
    short_exponent_obfuscator,
    key_view,
    obfuscator,
    public_key_from_bytes,
    public_key_to_bytes,
)
from .paillier_packing import (
    DEFAULT_WEIGHT_FRAC_BITS,
    UNPACKED,
    PackingOverflowError,
    PackingSpec,
    pack_rows,
    unpack_row,
    unpack_signed,
)
from .pool import process_pool

__all__ = [
    "DEFAULT_KAPPA",
    "DEFAULT_KEY_BITS",
    "OBFUSCATIONS",
    "DEFAULT_WEIGHT_FRAC_BITS",
    "PackingOverflowError",
    "PackingSpec",
    "UNPACKED",
    "EncryptedArray",
    "ObfuscatorPool",
    "PaillierContext",
    "generate_keypair",
    "packed_matmul",
    "packed_matmul_ints",
    "ciphertexts_to_bytes",
    "ciphertexts_from_bytes",
    "public_key_to_bytes",
    "public_key_from_bytes",
    "unpack_signed",
]


def _obfuscator_chunk(n: int, p, q, count: int, h=None, kappa: int = DEFAULT_KAPPA) -> list:
    k = key_view(n, p, q)
    if h is None:
        return [obfuscator(k) for _ in range(count)]
    make = short_exponent_obfuscator(k, h, kappa)  # tables built once per process
    return [make() for _ in range(count)]


def _check_obfuscation(obfuscation: str, kappa) -> None:
    if obfuscation not in OBFUSCATIONS:
        raise ValueError(f"obfuscation must be one of {OBFUSCATIONS}, got {obfuscation!r}")
    if not isinstance(kappa, (int, np.integer)) or isinstance(kappa, bool) or kappa < 32:
        raise ValueError(f"kappa must be an int >= 32, got {kappa!r}")


def _decrypt_chunk(n: int, p: int, q: int, cts: list) -> list:
    return decrypt_list(key_view(n, p, q), [int(c) for c in cts])


# --------------------------------------------------------------------------- obfuscator pool


class ObfuscatorPool:
    """Precomputed obfuscators (``r**n`` or ``h**x mod n**2``, see ``obfuscation``), filled ahead of use.

    ``fill(count)`` computes now (spread over ``executor`` when given);
    ``start_background(target)`` keeps at least ``target`` ready from a
    background thread (which hands work to ``executor``, or computes with
    gmpy2 releasing the GIL); ``take(count)`` pops, computing any shortfall on
    the spot (counted in ``misses``).  With ``private_key`` the CRT path is
    used.  ``obfuscation="short_exponent"`` draws ``h**x`` with the fixed base ``short_base``
    (:func:`~fedhet.crypto.paillier_keys.short_exponent_base`; a fresh one when None) and
    ``2*kappa``-bit exponents.  Obfuscators are used once and never returned.
    """

    def __init__(self, public_key, private_key=None, *, executor: Executor | None = None,
                 obfuscation: str = "standard", kappa: int = DEFAULT_KAPPA, short_base=None):
        _check_obfuscation(obfuscation, kappa)
        self.obfuscation, self.kappa = obfuscation, int(kappa)
        self.short_base = None
        if obfuscation == "short_exponent":
            self.short_base = int(short_exponent_base(public_key.n) if short_base is None else short_base)
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
            out = _obfuscator_chunk(self._n, self._p, self._q, count, self.short_base, self.kappa)
        else:
            nw = max(1, getattr(self.executor, "_max_workers", 2))
            n_chunks = min(count, 4 * nw)
            sizes = [count // n_chunks + (i < count % n_chunks) for i in range(n_chunks)]
            futs = [self.executor.submit(_obfuscator_chunk, self._n, self._p, self._q, s, self.short_base,
                                         self.kappa) for s in sizes]
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
    obfuscator path.  ``obfuscation`` is ``"standard"`` (default: textbook
    ``r**n``, DCR only) or ``"short_exponent"`` (``h**x`` with the public fixed
    base ``short_base``, fresh when None, and ``2*kappa``-bit ``x``; see
    :mod:`fedhet.crypto.paillier_keys` for the assumption).  Both decrypt with
    the same private key.  Use as a context manager or call ``close()``.
    """

    def __init__(self, public_key, private_key=None, *, workers: int = 1, mp_context: str = "spawn",
                 crt_obfuscators: bool | None = None, obfuscation: str = "standard",
                 kappa: int = DEFAULT_KAPPA, short_base=None):
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
        self.pool = ObfuscatorPool(public_key, private_key if use_crt else None, obfuscation=obfuscation,
                                   kappa=kappa, short_base=short_base)

    @property
    def obfuscation(self) -> str:
        return self.pool.obfuscation

    @property
    def short_base(self) -> int | None:
        """The public fixed base ``h`` of the short-exponent form (None in the standard form)."""
        return self.pool.short_base

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
        """A context with only the public key (what the other party gets); same obfuscation form and
        base unless ``kwargs`` say otherwise."""
        kwargs.setdefault("obfuscation", self.obfuscation)
        kwargs.setdefault("kappa", self.pool.kappa)
        if kwargs["obfuscation"] == self.obfuscation:
            kwargs.setdefault("short_base", self.short_base)
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
        ints = quantize(x, spec.frac_bits, "encrypt").reshape(rows, x.shape[-1])
        packed = pack_rows(ints, slot_bits, slots)
        k = key_view(self.public_key.n)
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
        n2 = key_view(self.public_key.n).n2
        cts = np.empty_like(enc.ciphertexts)
        for i, idx in enumerate(np.ndindex(cts.shape)):
            cts[idx] = enc.ciphertexts[idx] * obf[i] % n2
        return EncryptedArray(enc.public_key, cts, enc.shape, enc.spec, enc.frac_bits, enc.bound)

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
        k = key_view(self.public_key.n)
        ms = self.decrypt_raw(enc.ciphertexts.ravel())
        n_ct = enc.n_ct_per_row
        out = np.empty((enc.rows, enc.length), dtype=np.float64)
        scale = 1 << enc.frac_bits
        for i in range(enc.rows):
            ints = unpack_row(ms[i * n_ct:(i + 1) * n_ct], k.n, enc.slot_bits, enc.slots, enc.length)
            out[i] = [v / scale for v in ints]
        return out.reshape(enc.shape)

    def matmul(self, enc: EncryptedArray, W, w_frac_bits: int = DEFAULT_WEIGHT_FRAC_BITS) -> EncryptedArray:
        """:func:`packed_matmul` using this context's workers."""
        return packed_matmul(enc, W, w_frac_bits=w_frac_bits, executor=self.executor)


