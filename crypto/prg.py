"""Seeded cryptographic pseudo-random generator (AES-256-CTR keystream).

A :class:`PRG` expands a 256-bit seed into a deterministic stream of uniform
bytes and integers.  Two parties holding the same ``(seed, stream)`` draw the
*identical* sequence, call for call, which is what pairwise masking in secure
aggregation needs.  The keystream is AES-256 in counter mode from the
``cryptography`` package (OpenSSL, AES-NI): the key is the seed, the 16-byte
initial counter block is ``stream`` (8 bytes, big endian) followed by a 64-bit
block counter starting at zero, so distinct ``stream`` values give independent
streams from one seed and a stream can never run into the next one.

Integers:

* mod ``2**k`` for k in {8, 16, 32, 64}: the keystream bytes reinterpreted
  (little endian), nothing discarded; other ``k <= 64``: 64-bit words masked to
  ``k`` bits.
* mod ``m`` for any ``2 <= m <= 2**64``: 64-bit words masked to
  ``bitlen(m - 1)`` bits, and values ``>= m`` are skipped (the output is the
  accepted words in stream order, classic rejection sampling), so there is
  no modulo bias (each value is accepted with probability > 1/2; for the
  Mersenne prime 2**61 - 1 only the single value 2**61 - 1 is rejected, with
  probability 2**-61).  Rejection keeps the output deterministic for a seed.

The stream is consumed in order; every method advances it.  Not thread-safe:
use one PRG per thread.
"""
from __future__ import annotations

import os

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["PRG", "SEED_BYTES", "random_seed"]

SEED_BYTES = 32
# Keystream is produced in pieces of this many bytes: large enough to amortise
# the per-call overhead, small enough that masking a piece happens in cache.
_PIECE = 1 << 18
_ZEROS = memoryview(bytes(_PIECE))


def random_seed() -> bytes:
    """A fresh 256-bit seed from the operating system's CSPRNG."""
    return os.urandom(SEED_BYTES)


def _stream_block(stream: int | bytes) -> bytes:
    if isinstance(stream, (bytes, bytearray, memoryview)):
        stream = bytes(stream)
        if len(stream) != 8:
            raise ValueError(f"PRG stream id as bytes must be 8 bytes long, got {len(stream)}")
        return stream + bytes(8)
    if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool):
        stream = int(stream)
        if not 0 <= stream < 2**64:
            raise ValueError(f"PRG stream id must be in [0, 2**64), got {stream}")
        return stream.to_bytes(8, "big") + bytes(8)
    raise TypeError(f"PRG stream id must be an int or 8 bytes, got {type(stream).__name__}")


class PRG:
    """Deterministic AES-256-CTR stream: ``PRG(seed, stream=0)``.

    ``seed`` is 32 bytes (use :func:`random_seed` or :meth:`from_random` for a
    fresh one); ``stream`` (int < 2**64 or 8 bytes) selects one of 2**64
    independent streams under that seed, e.g. the training round.
    """

    __slots__ = ("_enc",)

    def __init__(self, seed: bytes, stream: int | bytes = 0):
        if not isinstance(seed, (bytes, bytearray, memoryview)):
            raise TypeError(f"PRG seed must be bytes, got {type(seed).__name__}")
        seed = bytes(seed)
        if len(seed) != SEED_BYTES:
            raise ValueError(f"PRG seed must be {SEED_BYTES} bytes (256 bits), got {len(seed)}")
        cipher = Cipher(algorithms.AES(seed), modes.CTR(_stream_block(stream)))
        self._enc = cipher.encryptor()

    @classmethod
    def from_random(cls) -> "PRG":
        """A PRG under a fresh OS-random seed (for one-off randomness)."""
        return cls(random_seed())

    # -- raw keystream -------------------------------------------------------
    def fill_bytes(self, buf) -> None:
        """Overwrite a writable C-contiguous buffer (bytearray, numpy array...) with keystream."""
        mv = memoryview(buf)
        if mv.readonly:
            raise ValueError("PRG.fill_bytes needs a writable buffer")
        if not mv.c_contiguous:
            raise ValueError("PRG.fill_bytes needs a C-contiguous buffer")
        mv = mv.cast("B")
        n = len(mv)
        pos = 0
        enc = self._enc
        while pos < n:
            k = min(_PIECE, n - pos)
            # Passing the whole remaining view keeps room past the piece for
            # cryptography versions that want len(buf) >= len(data) + 15.
            try:
                enc.update_into(_ZEROS[:k], mv[pos:])
            except ValueError:
                tmp = bytearray(k + 15)
                got = enc.update_into(_ZEROS[:k], tmp)
                mv[pos:pos + got] = tmp[:got]
            pos += k

    def bytes(self, n: int) -> bytes:
        """The next ``n`` keystream bytes."""
        n = _check_count(n)
        out = bytearray(n)
        if n:
            self.fill_bytes(out)
        return bytes(out)

    # -- integers mod 2**k ---------------------------------------------------
    def uint32(self, shape) -> np.ndarray:
        """Uniform integers mod 2**32 (dtype uint32)."""
        return self.integers_pow2(shape, 32)

    def uint64(self, shape) -> np.ndarray:
        """Uniform integers mod 2**64 (dtype uint64)."""
        return self.integers_pow2(shape, 64)

    def integers_pow2(self, shape, bits: int) -> np.ndarray:
        """Uniform integers mod ``2**bits`` (1 <= bits <= 64).

        dtype is uint8/16/32/64 for bits 8/16/32/64 (raw keystream), else uint64.
        """
        if not isinstance(bits, (int, np.integer)) or not 1 <= int(bits) <= 64:
            raise ValueError(f"bits must be an integer in [1, 64], got {bits!r}")
        bits = int(bits)
        dtype = {8: np.uint8, 16: np.uint16, 32: np.uint32}.get(bits, np.uint64)
        out = np.empty(shape, dtype=dtype)
        if out.size:
            self.fill_bytes(out)
            if bits < 64 and dtype == np.uint64:
                np.bitwise_and(out, np.uint64((1 << bits) - 1), out=out)
        return out

    # -- integers mod m ------------------------------------------------------
    def integers_mod(self, shape, modulus: int) -> np.ndarray:
        """Uniform integers in ``[0, modulus)`` as uint64, no modulo bias."""
        out = np.empty(shape, dtype=np.uint64)
        self.fill_mod(out, modulus)
        return out

    def fill_mod(self, out: np.ndarray, modulus: int) -> None:
        """Fill a C-contiguous uint64 array with uniform integers in ``[0, modulus)``."""
        modulus = _check_modulus(modulus)
        if not isinstance(out, np.ndarray) or out.dtype != np.uint64 or not out.flags.c_contiguous:
            raise ValueError("PRG.fill_mod needs a C-contiguous numpy uint64 array")
        if not out.flags.writeable:
            raise ValueError("PRG.fill_mod needs a writable array")
        flat = out.reshape(-1)
        if modulus == 1 << 64:
            self.fill_bytes(flat)
            return
        mask = np.uint64((1 << (modulus - 1).bit_length()) - 1)
        limit = np.uint64(modulus - 1)
        step = _PIECE // 8
        pos, total = 0, flat.size
        while pos < total:
            piece = flat[pos:pos + step]
            self.fill_bytes(piece)
            np.bitwise_and(piece, mask, out=piece)
            if piece.max() > limit:
                # Keep the accepted words in stream order; the rest of the
                # output continues from the next keystream word.
                good = piece[piece <= limit]
                piece[: good.size] = good
                pos += good.size
            else:
                pos += piece.size


def _check_count(n) -> int:
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or int(n) < 0:
        raise ValueError(f"byte count must be a non-negative int, got {n!r}")
    return int(n)


def _check_modulus(modulus) -> int:
    if not isinstance(modulus, (int, np.integer)) or isinstance(modulus, bool):
        raise TypeError(f"modulus must be an int, got {type(modulus).__name__}")
    modulus = int(modulus)
    if not 2 <= modulus <= 1 << 64:
        raise ValueError(f"modulus must be in [2, 2**64], got {modulus}")
    return modulus
