"""The group primitive of ECDH-PSI: hash items onto Curve25519, blind them with X25519.

Choice: X25519 from ``cryptography`` (OpenSSL) on hashed u-coordinates that
are *restricted to the curve* by try-and-increment.  OpenSSL's x-only ladder
is the fastest scalar multiplication at hand; libsodium's Elligator map
(PyNaCl ``crypto_core_ed25519_from_uniform`` + conversion) would cost about
2.5x as much per item.

Hashing.  An item is first encoded canonically (:func:`encode_item`: a type
tag, then the value; ``1`` and ``"1"`` are different items).  Its point is
BLAKE2b-512 of that encoding, personalised ``fedhet-psi-u`` + attempt number
and salted with a hash of the caller's context (domain separation).  The 64
bytes give two 255-bit candidates u; the first with u < p and
u^3 + A u^2 + u a non-zero square mod p (the Legendre symbol, via gmpy2) is
the x-coordinate of a point on Curve25519 and is taken; if neither is, the
next attempt hashes again (two candidates per item on average).  Modelling
BLAKE2b as a random oracle, u is uniform over the x-coordinates of the curve.

Why not a bare hash straight to a u-coordinate?  X25519 is twist-secure, so
that is *safe* for the blinder's key, but about half the hashes land on the
quadratic twist and blinding preserves curve-vs-twist (anyone can test it with
one Legendre symbol).  Each blinded value would then reveal one bit of H(item)
to the peer, so the peer would learn, e.g., how many of the other side's
non-shared items hash to the twist: a leak beyond the intersection that breaks
the simulation argument.  Restricting to the curve costs ~8 us of CPU per item
(one BLAKE2b, two Legendre symbols on average, measured here) against two
X25519 ladders of 25-45 us each per item, and removes it.

Blinding.  ``blind(k, P) = X25519(k, u(P)) = x([clamp(k)] P)``.  Clamping
makes every scalar a multiple of the cofactor 8 in [2^254, 2^255), so
[clamp(k)] kills the small-order component of P: every blinded value is the
x-coordinate of a point in the prime-order subgroup (order l ~ 2^252), and
clamp(k) mod l is never 0 (8l > 2^255), so blinding is a bijection there.
The x-only ladder commutes: x([a][b]P) = x([b][a]P), and x(P) = x(-P) keeps
the ladder well defined on x alone, so ``blind(a, blind(b, P)) ==
blind(b, blind(a, P))``.  Two items collide only if their hash points agree
up to sign and torsion, probability ~2^-248 per pair.  A small-order input
(hash probability ~2^-250; or a malicious peer's point) makes X25519 output
zero, which OpenSSL refuses; :func:`blind` then raises :class:`PointError`.

Security (semi-honest): under DDH in the prime-order subgroup with H a random
oracle, the multiset {H(x)^a} under a fresh secret scalar is indistinguishable
from random subgroup elements, so a party sees nothing of the other's items
but their number, and what the protocol then reveals on purpose (the
intersection; see ``fedhet.protocols.psi``).  Scalars must be fresh per run
(:func:`new_scalar`, from the OS CSPRNG); reusing one across runs lets a peer
link items between runs.  Try-and-increment is not constant time: the time to
hash a set reveals its total number of attempts (about 1.5 per item), a
negligible signal about local data that never crosses the wire by itself.

Speed.  Batches are flat ``bytes`` (n x 32) walked in one list comprehension
over bound methods, so the Python overhead per item is a few microseconds
beside the ladder; :class:`BlindPool` runs batches in worker processes to use
every core (``workers=0`` runs them inline, for tests and small sets).
"""
from __future__ import annotations

import hashlib
import os
import sys
from concurrent.futures import Future
from typing import Any, Iterable, Sequence

import gmpy2
import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from .pool import process_pool

POINT_BYTES = 32
SCALAR_BYTES = 32
P = 2**255 - 19          # the field prime of Curve25519
A = 486662               # Montgomery coefficient: v^2 = u^3 + A u^2 + u
_P_MPZ = gmpy2.mpz(P)
_MASK = (1 << 255) - 1
_PERSON = b"fedhet-psi-u"  # + 4-byte attempt number = BLAKE2b's 16-byte personalisation
_CTX_PERSON = b"fedhet-psi-ctx"
MAX_ATTEMPTS = 64          # 2^-128 chance that an item needs more; then it is an error


class PointError(ValueError):
    """A point could not be blinded (small order: X25519 would output zero)."""


# ------------------------------------------------------------------ encoding
def encode_item(item: Any) -> bytes:
    """Canonical, type-tagged bytes of one ID: ``s``+UTF-8 for str, ``i``+decimal for int, ``b``+raw for bytes.

    The tag keeps types apart (``1`` and ``"1"`` are different IDs); strings
    are compared as Python compares them (code points, no Unicode
    normalisation; lone surrogates are kept via ``surrogatepass``).  bool and
    float are refused: ``True == 1`` and ``1.0 == 1`` in Python, so they have
    no unambiguous identity as IDs.  Integer IDs may have at most
    ``sys.get_int_max_str_digits()`` decimal digits (4,300 by default,
    Python's limit on int/str conversion); a longer one is refused with a
    ValueError that says so (pass such IDs as str or bytes).
    """
    t = type(item)
    if t is str:
        return b"s" + item.encode("utf-8", "surrogatepass")
    if t is int:
        return _encode_int(item)
    if isinstance(item, (bool, np.bool_)):
        raise TypeError(f"ID {item!r} is a bool; use int or str IDs")
    if isinstance(item, str):
        return b"s" + str(item).encode("utf-8", "surrogatepass")
    if isinstance(item, (int, np.integer)):
        return _encode_int(int(item))
    if isinstance(item, (bytes, bytearray, memoryview)):
        return b"b" + bytes(item)
    raise TypeError(f"ID {item!r} has type {type(item).__name__}; IDs must be str, int or bytes")


def _encode_int(x: int) -> bytes:
    try:
        return b"i" + str(x).encode()
    except ValueError:  # more digits than sys.get_int_max_str_digits() allows
        raise _int_too_long(x) from None


def _int_too_long(x: int) -> ValueError:
    digits = int(x.bit_length() * 0.30103) + 1  # the value itself cannot be printed
    return ValueError(f"an integer ID of about {digits} digits; integer IDs may have at most "
                      f"{sys.get_int_max_str_digits()} digits (Python's int/str conversion limit): "
                      "pass such IDs as str or bytes")


def encode_items(items: Iterable[Any]) -> list[bytes]:
    """:func:`encode_item` over a collection; the error names the position of a bad ID.

    A list of only str (or only int) IDs is encoded in a few C calls: joined with NUL separators,
    encoded once and split (when no ID contains a NUL and every int converts); anything else item by item.
    """
    if type(items) is list and len(items) > 1:
        kinds = set(map(type, items))
        if kinds == {str}:
            text = "s" + "\0s".join(items)
            if text.count("\0") == len(items) - 1:
                return text.encode("utf-8", "surrogatepass").split(b"\0")
        elif kinds == {int}:
            try:
                return ("i" + "\0i".join(map(str, items))).encode().split(b"\0")
            except ValueError:
                pass  # an int too long to print: the loop below names it
    out: list = []
    ap = out.append
    for i, x in enumerate(items):
        t = type(x)
        try:
            if t is str:
                ap(b"s" + x.encode("utf-8", "surrogatepass"))
            elif t is int:
                ap(b"i" + str(x).encode())
            else:
                ap(encode_item(x))
        except (TypeError, ValueError) as err:
            # an int that str() refused has more digits than Python converts
            cause = _int_too_long(x) if t is int else err
            raise type(cause)(f"ID at position {i}: {cause}") from None
    return out


def sort_key(item: Any) -> tuple:
    """A total order on IDs of mixed types: ints numerically, then bytes, then strings (by code point).

    For bytes and strings this is the order of their encodings (UTF-8 keeps
    code-point order), which is how :func:`canonical_order` sorts them.
    """
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)):
        return (0, int(item))
    if isinstance(item, str):
        return (2, str(item))
    return (1, bytes(item))


def canonical_order(encoded: Sequence[bytes]) -> np.ndarray:
    """Positions (int64) of encoded IDs in :func:`sort_key` order, sorting encodings rather than objects.

    Ints (tag ``i``) first by value, then the rest in bytes order of their encodings (tag ``b`` before
    ``s``; UTF-8 keeps code-point order).  Large lists sort in numpy: ints that fit in 64 bits by value
    (:func:`_int_order`), bytes by big-endian 64-bit words (:func:`_bytes_order`).
    """
    n = len(encoded)
    if n < 1024:
        ints = np.array([k for k, e in enumerate(encoded) if e[:1] == b"i"], dtype=np.int64)
    else:
        tags = np.array(encoded, dtype="S1").view(np.uint8)      # first byte of each encoding
        ints = np.nonzero(tags == ord("i"))[0]
    if len(ints) == 0:
        return _bytes_order(encoded)
    rest = np.setdiff1d(np.arange(n, dtype=np.int64), ints, assume_unique=True)
    out = ints[_int_order([encoded[k][1:] for k in ints.tolist()])]
    if len(rest) == 0:
        return out
    return np.concatenate([out, rest[_bytes_order([encoded[k] for k in rest.tolist()])]])


def _int_order(digits: list[bytes]) -> np.ndarray:
    """Positions of decimal integers (as ASCII bytes) in numeric order: numpy's parse and sort where
    every one fits in int64, else Python's."""
    if len(digits) >= 1024 and max(map(len, digits)) <= 18:   # |x| < 10^18 < 2^63
        return np.argsort(np.array(digits, dtype="S18").astype(np.int64), kind="stable")
    vals = [int(d) for d in digits]
    return np.array(sorted(range(len(vals)), key=vals.__getitem__), dtype=np.int64)


def _bytes_order(encoded: Sequence[bytes]) -> np.ndarray:
    """Positions of byte strings in bytes order.  Zero-padded to whole 64-bit words, read big-endian,
    the order of the words is bytes order for strings that do not end in NUL (the usual case): one
    argsort of the first words, then the rows whose first words tie sorted on all words; otherwise
    Python's sort."""
    n = len(encoded)
    if n < 1024:
        return np.array(sorted(range(n), key=encoded.__getitem__), dtype=np.int64)
    lens = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    width = max(1, int(lens.max()))
    arr = np.array(encoded, dtype=f"S{width}")
    u8 = arr.view(np.uint8).reshape(n, width)
    last = u8[np.arange(n), np.maximum(lens, 1) - 1]
    if (lens == 0).any() or (last == 0).any():
        return np.array(sorted(range(n), key=encoded.__getitem__), dtype=np.int64)
    words = -(-width // 8)
    pad = np.zeros((n, words * 8), dtype=np.uint8)
    pad[:, :width] = u8
    w = pad.view(">u8")
    order = np.argsort(w[:, 0], kind="stable")
    if words > 1:
        first = w[order, 0]
        tie = np.nonzero(first[1:] == first[:-1])[0]
        if len(tie):   # whole runs of equal first words, at ascending positions: sort them on every word
            involved = np.zeros(n, dtype=bool)
            involved[tie] = True
            involved[tie + 1] = True
            pos = np.nonzero(involved)[0]
            sub = order[pos]
            order[pos] = sub[np.lexsort(tuple(w[sub, j] for j in range(words - 1, -1, -1)))]
    return order.astype(np.int64, copy=False)


# ------------------------------------------------------------------- hashing
def _context_salt(context: bytes) -> bytes:
    return hashlib.blake2b(bytes(context), digest_size=16, person=_CTX_PERSON).digest()


def _on_curve(u: int) -> bool:
    """u < p and u^3 + A u^2 + u is a non-zero square mod p (so u is a curve point's x)."""
    if u >= P:
        return False
    m = gmpy2.mpz(u)
    return gmpy2.legendre(m * (m * (m + A) + 1) % _P_MPZ, _P_MPZ) == 1


def hash_to_point(encoded: bytes, context: bytes = b"") -> bytes:
    """The 32-byte u-coordinate (little endian) of the curve point of one encoded item."""
    return hash_to_points([encoded], context)


def _hash_slow(x: bytes, salt: bytes) -> bytes:
    for attempt in range(1, MAX_ATTEMPTS):
        h = hashlib.blake2b(x, digest_size=64, person=_PERSON + attempt.to_bytes(4, "little"), salt=salt).digest()
        for half in (h[:32], h[32:]):
            u = int.from_bytes(half, "little") & _MASK
            if _on_curve(u):
                return u.to_bytes(32, "little")
    raise PointError(f"no curve point for item {x[:32]!r} after {MAX_ATTEMPTS} attempts")


def hash_to_points(encoded: Sequence[bytes], context: bytes = b"") -> bytes:
    """u-coordinates of the curve points of encoded items, concatenated (len = 32 n)."""
    salt = _context_salt(context)
    person0 = _PERSON + (0).to_bytes(4, "little")
    b2 = hashlib.blake2b
    fb = int.from_bytes
    mpz = gmpy2.mpz
    leg = gmpy2.legendre
    pm = _P_MPZ
    mask = _MASK
    p = P
    out: list = []
    ap = out.append
    # The loop is the hot path of hashing: locals only, two candidates per hash.
    for x in encoded:
        h = b2(x, digest_size=64, person=person0, salt=salt).digest()
        u = fb(h[:32], "little") & mask
        m = mpz(u)
        if u < p and leg(m * (m * (m + A) + 1) % pm, pm) == 1:
            ap(u.to_bytes(32, "little"))
            continue
        u = fb(h[32:], "little") & mask
        m = mpz(u)
        if u < p and leg(m * (m * (m + A) + 1) % pm, pm) == 1:
            ap(u.to_bytes(32, "little"))
            continue
        ap(_hash_slow(x, salt))
    return b"".join(out)


# ------------------------------------------------------------------ blinding
def new_scalar() -> bytes:
    """A fresh secret scalar from the OS CSPRNG (X25519 clamps it when used)."""
    return os.urandom(SCALAR_BYTES)


def _as_bytes(points: Any) -> bytes:
    if isinstance(points, np.ndarray):
        if points.dtype != np.uint8 or points.ndim != 2 or points.shape[1] != POINT_BYTES:
            raise ValueError(f"points must be a uint8 array of shape (n, 32), got {points.dtype}{list(points.shape)}")
        return points.tobytes()
    b = bytes(points)
    if len(b) % POINT_BYTES:
        raise ValueError(f"points must be a multiple of 32 bytes long, got {len(b)}")
    return b


def blind(scalar: bytes, points: Any) -> bytes:
    """X25519(scalar, u) for every 32-byte u in ``points`` (bytes or (n, 32) uint8); concatenated."""
    if len(scalar) != SCALAR_BYTES:
        raise ValueError(f"scalar must be {SCALAR_BYTES} bytes, got {len(scalar)}")
    buf = _as_bytes(points)
    ex = X25519PrivateKey.from_private_bytes(bytes(scalar)).exchange
    fp = X25519PublicKey.from_public_bytes
    try:
        return b"".join([ex(fp(buf[i:i + 32])) for i in range(0, len(buf), 32)])
    except ValueError:
        pass
    # Slow path only to name the offending point.
    for i in range(0, len(buf), 32):
        try:
            ex(fp(buf[i:i + 32]))
        except ValueError as e:
            raise PointError(f"point #{i // 32} ({buf[i:i + 32].hex()}) cannot be blinded: small order "
                             f"or invalid ({e})") from None
    raise PointError("blinding failed")  # pragma: no cover - the loop above re-raises


def hash_and_blind(scalar: bytes, encoded: Sequence[bytes], context: bytes = b"") -> bytes:
    return blind(scalar, hash_to_points(encoded, context))


def as_array(points: bytes) -> np.ndarray:
    """Flat point bytes as a read-only (n, 32) uint8 view (what goes on the wire)."""
    return np.frombuffer(points, dtype=np.uint8).reshape(-1, POINT_BYTES)


# ---------------------------------------------------------------------- pool
class BlindPool:
    """Hash-and-blind / blind batches in worker processes; ``workers=0`` computes inline.

    Workers are started with ``spawn`` (safe inside a party process that
    already runs ZeroMQ threads) and exit when the party process does, even
    when it is killed (``fedhet.crypto.pool``).  Each task carries its scalar, so one pool
    serves both blinding steps.  Tasks run in submission order (FIFO), and
    results come back as futures of flat point bytes.
    """

    def __init__(self, workers: int = 0):
        if workers < 0:
            raise ValueError(f"workers must be >= 0, got {workers}")
        self.workers = int(workers)
        self._ex = process_pool(self.workers) if self.workers > 0 else None

    def start(self) -> None:
        """Begin starting every worker now, without waiting, so start-up overlaps the caller's work."""
        if self._ex is not None:
            for _ in range(self.workers):
                self._ex.submit(_noop)

    def _run(self, fn, *args) -> Future:
        if self._ex is not None:
            return self._ex.submit(fn, *args)
        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - delivered through the future, like the pool does
            f.set_exception(e)
        return f

    def submit_hash_blind(self, scalar: bytes, encoded: Sequence[bytes], context: bytes = b"") -> Future:
        return self._run(hash_and_blind, scalar, list(encoded), bytes(context))

    def submit_blind(self, scalar: bytes, points: Any) -> Future:
        return self._run(blind, scalar, _as_bytes(points))

    def close(self, cancel: bool = False) -> None:
        if self._ex is not None:
            self._ex.shutdown(wait=True, cancel_futures=cancel)
            self._ex = None

    def __enter__(self) -> "BlindPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(cancel=exc_type is not None)


def _noop() -> None:
    return None
