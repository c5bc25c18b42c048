"""CKKS (approximate homomorphic encryption, via TenSEAL) for float vectors.

Named parameter sets (all at SEAL's 128-bit security level):

========  ======  ==============================  =====  =====  ======================
name      N       coeff_mod_bit_sizes             scale  slots  plaintext multiplies
========  ======  ==============================  =====  =====  ======================
fast      8192    60, 40, 40, 60                  2**40  4096   2
deep      16384   60, 40 x 6, 60                  2**40  8192   6
========  ======  ==============================  =====  =====  ======================

Scale and precision: values are encoded as ``round(x * 2**40)``, so a fresh
encryption decrypts to ``x`` within about ``1e-8`` (absolute, measured for
``|x| <= 1e3``); the outer 60-bit primes leave 20 bits for the integer part,
so every intermediate and final value must satisfy ``|x| < 2**19`` (about 5e5)
or the result is garbage (CKKS cannot detect this; inputs are checked).  Each
multiplication by a plaintext (scalar, vector or matrix) consumes one level and
adds a relative error (measured: up to about 4e-7 per level for "fast" and 4e-6
per level for "deep", whose rescaling primes are further from 2**40) of the sum
of the magnitudes of the products per output.  Stated bounds, which the tests
check: fresh ``|err| <= ABS_TOL_FRESH`` (1e-6, about 100x the measured error);
after ``L`` plaintext multiplications, e.g. one matmul (``L = 1``),
``|err| <= ABS_TOL_FRESH + L * REL_TOL_MUL * (|x| @ |W|)`` with
``REL_TOL_MUL = 1e-5``.

Two ways to compute ``A @ W`` on an encrypted ``A`` (batch x d) with plaintext ``W``:
``encrypt_rows`` + ``rows_matmul`` (one ciphertext per sample, TenSEAL's
``CKKSVector.mm``, needs Galois keys) or ``encrypt_columns`` +
``columns_matmul`` (one ciphertext per feature holding the whole batch, scalar
products and sums, no Galois keys; K output ciphertexts of batch values).

Wire format: ``vector_to_bytes`` (TenSEAL serialisation) or ``to_wire`` (the
same bytes as a ``uint8`` numpy array).  ``public_context_bytes`` serialises
the context without the secret key (public, relinearisation and Galois keys)
for the party that computes; only the key owner can decrypt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tenseal as ts

__all__ = [
    "CKKSParams",
    "PARAMETER_SETS",
    "ABS_TOL_FRESH",
    "REL_TOL_MUL",
    "make_context",
    "slot_count",
    "encrypt_vector",
    "decrypt_vector",
    "vector_to_bytes",
    "vector_from_bytes",
    "to_wire",
    "from_wire",
    "public_context_bytes",
    "context_to_bytes",
    "context_from_bytes",
    "encrypt_rows",
    "rows_matmul",
    "encrypt_columns",
    "columns_matmul",
    "decrypt_vectors",
]

# Stated precision (checked by tests/test_crypto_ckks.py) for the named sets, |x| <= 1e3.
ABS_TOL_FRESH = 1e-6
REL_TOL_MUL = 1e-5
MAX_ABS_VALUE = 2.0 ** 19


@dataclass(frozen=True)
class CKKSParams:
    """CKKS parameters: ring degree N (slots = N/2), modulus chain, scale ``2**scale_bits``."""

    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple
    scale_bits: int

    @property
    def slots(self) -> int:
        return self.poly_modulus_degree // 2

    @property
    def depth(self) -> int:
        """Number of rescaling multiplications the modulus chain allows."""
        return len(self.coeff_mod_bit_sizes) - 2


PARAMETER_SETS = {
    "fast": CKKSParams(8192, (60, 40, 40, 60), 40),
    "deep": CKKSParams(16384, (60, 40, 40, 40, 40, 40, 40, 60), 40),
}


def make_context(params: str | CKKSParams = "fast", *, galois_keys: bool = True,
                 n_threads: int | None = None) -> ts.Context:
    """A private CKKS context (holds the secret key) from a named parameter set.

    ``galois_keys`` are needed for rotations (``rows_matmul``); they dominate the
    public context's size (about 35 MB for "fast", 330 MB for "deep").
    """
    if isinstance(params, str):
        if params not in PARAMETER_SETS:
            raise ValueError(f"unknown CKKS parameter set {params!r}; known: {sorted(PARAMETER_SETS)}")
        params = PARAMETER_SETS[params]
    if not isinstance(params, CKKSParams):
        raise TypeError(f"params must be a name or CKKSParams, got {type(params).__name__}")
    kwargs = {} if n_threads is None else {"n_threads": int(n_threads)}
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, params.poly_modulus_degree,
                     coeff_mod_bit_sizes=list(params.coeff_mod_bit_sizes), **kwargs)
    ctx.global_scale = 2.0 ** params.scale_bits
    if galois_keys:
        ctx.generate_galois_keys()
    return ctx


def slot_count(ctx: ts.Context) -> int:
    """Values one ciphertext holds (N/2)."""
    return int(ctx.seal_context().data.key_context_data().parms().poly_modulus_degree()) // 2


def _as_vector(x, what: str, max_len: int | None = None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{what}: empty vector")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{what}: contains NaN or infinity")
    if np.max(np.abs(x)) >= MAX_ABS_VALUE:
        raise ValueError(f"{what}: |x| must be < 2**19 for scale 2**40, got {np.max(np.abs(x)):g}")
    if max_len is not None and x.size > max_len:
        raise ValueError(f"{what}: {x.size} values exceed the {max_len} slots of one ciphertext")
    return x


def encrypt_vector(ctx: ts.Context, x) -> ts.CKKSVector:
    """Encrypt a 1-D float array (at most ``slot_count(ctx)`` values)."""
    return ts.ckks_vector(ctx, _as_vector(x, "encrypt_vector", slot_count(ctx)).tolist())


def decrypt_vector(vec: ts.CKKSVector) -> np.ndarray:
    """Decrypt with the context's secret key; ``ValueError`` if the context is public."""
    if not vec.context().is_private():
        raise ValueError("decrypt_vector: this context has no secret key")
    return np.asarray(vec.decrypt(), dtype=np.float64)


def decrypt_vectors(vecs) -> np.ndarray:
    """Stack the decryptions of equally long vectors into a 2-D array."""
    return np.stack([decrypt_vector(v) for v in vecs])


def vector_to_bytes(vec: ts.CKKSVector) -> bytes:
    return vec.serialize()


def vector_from_bytes(ctx: ts.Context, data) -> ts.CKKSVector:
    try:
        return ts.ckks_vector_from(ctx, bytes(data))
    except Exception as e:  # TenSEAL raises several types for malformed input
        raise ValueError(f"not a serialised CKKS vector for this context: {e}") from e


def to_wire(vec: ts.CKKSVector) -> np.ndarray:
    """The serialised vector as a ``uint8`` array (for the party transport)."""
    return np.frombuffer(vec.serialize(), dtype=np.uint8).copy()


def from_wire(ctx: ts.Context, data: np.ndarray) -> ts.CKKSVector:
    data = np.asarray(data)
    if data.dtype != np.uint8 or data.ndim != 1:
        raise ValueError(f"CKKS wire data must be a 1-D uint8 array, got {data.dtype} {data.shape}")
    return vector_from_bytes(ctx, data.tobytes())


def public_context_bytes(ctx: ts.Context) -> bytes:
    """Serialise without the secret key: public, relinearisation and (if present) Galois keys."""
    return ctx.serialize(save_public_key=True, save_secret_key=False,
                         save_galois_keys=True, save_relin_keys=True)


def context_to_bytes(ctx: ts.Context) -> bytes:
    """Full serialisation, secret key included (for the key owner's own storage only)."""
    return ctx.serialize(save_secret_key=True)


def context_from_bytes(data) -> ts.Context:
    try:
        return ts.context_from(bytes(data))
    except Exception as e:
        raise ValueError(f"not a serialised TenSEAL context: {e}") from e


# --------------------------------------------------------------------------- split-layer matmul


def encrypt_rows(ctx: ts.Context, A) -> list:
    """One ciphertext per row of ``A`` (batch x d)."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"encrypt_rows: expected a 2-D array, got shape {A.shape}")
    return [encrypt_vector(ctx, row) for row in A]


def rows_matmul(enc_rows, W) -> list:
    """``Enc(A[i] @ W)`` for every encrypted row (TenSEAL ``CKKSVector.mm``; needs Galois keys)."""
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or not np.all(np.isfinite(W)):
        raise ValueError(f"rows_matmul: W must be a finite 2-D array, got shape {W.shape}")
    out = []
    for v in enc_rows:
        if v.size() != W.shape[0]:
            raise ValueError(f"rows_matmul: row length {v.size()} does not match W with {W.shape[0]} rows")
        out.append(v.mm(W.tolist()))
    return out


def encrypt_columns(ctx: ts.Context, A) -> list:
    """One ciphertext per column of ``A`` (batch x d), each holding the batch."""
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 2:
        raise ValueError(f"encrypt_columns: expected a 2-D array, got shape {A.shape}")
    return [encrypt_vector(ctx, col) for col in A.T]


def columns_matmul(enc_cols, W) -> list:
    """``Enc((A @ W)[:, k])`` for k < K from ``encrypt_columns(A)``: ``sum_j W[j, k] * Enc(A[:, j])``.

    Uses only plaintext-scalar products and additions (one level, no Galois keys).
    """
    W = np.asarray(W, dtype=np.float64)
    enc_cols = list(enc_cols)
    if W.ndim != 2 or W.shape[0] != len(enc_cols) or not np.all(np.isfinite(W)):
        raise ValueError(f"columns_matmul: W must be finite with shape ({len(enc_cols)}, K), got {W.shape}")
    out = []
    for k in range(W.shape[1]):
        acc = None
        for j, c in enumerate(enc_cols):
            term = c * float(W[j, k])
            acc = term if acc is None else acc + term
        out.append(acc)
    return out
