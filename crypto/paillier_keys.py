"""Paillier keys and the raw arithmetic on them: key pairs, gmpy2 key views, public-key bytes, obfuscators.

Keys come from ``phe`` (``generate_paillier_keypair``); all arithmetic is done
with gmpy2 on phe's ``n`` and ``n**2`` with ``g = n + 1``, so a ciphertext of
``m`` is ``(1 + m*n) * r**n mod n**2`` exactly as ``phe``'s ``raw_encrypt``
computes it, and decryption is phe's ``raw_decrypt`` (CRT over p and q).

Obfuscators ``r**n mod n**2`` (:func:`obfuscator`) dominate encryption cost.
The key owner can compute them with CRT over ``p**2`` and ``q**2``
(``x**n mod p**2 = (x**q mod p)**p mod p**2``), about 2.5x cheaper.

Public key on the wire: the big-endian bytes of ``n`` (the whole public key,
since ``g = n + 1``).  Default key length is 2048 bits (``DEFAULT_KEY_BITS``).
"""
from __future__ import annotations

import secrets
from typing import Any

import gmpy2
import numpy as np
from phe import paillier as _phe

__all__ = [
    "DEFAULT_KEY_BITS",
    "MIN_KEY_BITS",
    "KeyView",
    "key_view",
    "generate_keypair",
    "public_key_to_bytes",
    "public_key_from_bytes",
    "random_unit",
    "obfuscator",
]

DEFAULT_KEY_BITS = 2048
MIN_KEY_BITS = 128  # phe would accept less; below this nothing useful fits


def generate_keypair(key_bits: int = DEFAULT_KEY_BITS):
    """phe key pair with an ``n`` of exactly ``key_bits`` bits (default 2048)."""
    if not isinstance(key_bits, (int, np.integer)) or key_bits < MIN_KEY_BITS or key_bits % 2:
        raise ValueError(f"key_bits must be an even integer >= {MIN_KEY_BITS}, got {key_bits!r}")
    return _phe.generate_paillier_keypair(n_length=int(key_bits))


class KeyView:
    """gmpy2 views of a key: ``n``, ``n2 = n**2``, ``half = n // 2``, ciphertext byte ``width``;
    with the factors also ``p``, ``q``, their squares, the CRT constant and phe's private key."""

    __slots__ = ("n", "n2", "half", "width", "p", "q", "p2", "q2", "p2_inv", "phe_private")

    def __init__(self, n: int, p: int | None = None, q: int | None = None):
        self.n = gmpy2.mpz(n)
        self.n2 = self.n * self.n
        self.half = self.n // 2
        self.width = (int(self.n2.bit_length()) + 7) // 8
        # Factors (key owner only); None on a public view.
        self.p: Any = None
        self.q: Any = None
        self.p2: Any = None
        self.q2: Any = None
        self.p2_inv: Any = None
        self.phe_private: Any = None  # phe PaillierPrivateKey, set by key_view
        if p is not None:
            if q is None or gmpy2.mpz(p) * gmpy2.mpz(q) != self.n:
                raise ValueError("private key factors do not match the public modulus")
            self.p, self.q = gmpy2.mpz(p), gmpy2.mpz(q)
            self.p2, self.q2 = self.p * self.p, self.q * self.q
            self.p2_inv = gmpy2.invert(self.p2, self.q2)


_KEYS: dict[tuple, KeyView] = {}


def key_view(n: int, p: int | None = None, q: int | None = None) -> KeyView:
    """The :class:`KeyView` of ``n`` (with the factors when given), cached per process."""
    k = _KEYS.get((int(n), p is not None))
    if k is None:
        k = KeyView(n, p, q)
        if p is not None and q is not None:
            k.phe_private = _phe.PaillierPrivateKey(_phe.PaillierPublicKey(int(n)), int(p), int(q))
        if len(_KEYS) > 64:
            _KEYS.clear()
        _KEYS[(int(n), p is not None)] = k
    return k


def public_key_to_bytes(public_key) -> bytes:
    """Big-endian bytes of n (the whole Paillier public key, since g = n + 1)."""
    n = int(public_key.n)
    return n.to_bytes((n.bit_length() + 7) // 8, "big")


def public_key_from_bytes(data: bytes):
    """Inverse of :func:`public_key_to_bytes`; returns a phe ``PaillierPublicKey``."""
    data = bytes(data)
    n = int.from_bytes(data, "big")
    if n.bit_length() < MIN_KEY_BITS or n % 2 == 0:
        raise ValueError(f"not a Paillier modulus: {n.bit_length()}-bit value")
    return _phe.PaillierPublicKey(n)


def random_unit(n) -> gmpy2.mpz:
    """A uniform unit of Z/n from the OS CSPRNG."""
    while True:
        r = gmpy2.mpz(secrets.randbelow(int(n) - 1) + 1)
        if gmpy2.gcd(r, n) == 1:
            return r


def obfuscator(k: KeyView, x=None) -> gmpy2.mpz:
    """``x**n mod n**2`` for the unit x (a fresh random one by default); CRT path when the factors are known."""
    if x is None:
        x = random_unit(k.n)
    if k.p is None:
        return gmpy2.powmod(x, k.n, k.n2)
    # (y + t*p)**p = y**p mod p**2, so x**(p*q) mod p**2 only needs x**q mod p.
    sp = gmpy2.powmod(gmpy2.powmod(x % k.p, k.q, k.p), k.p, k.p2)
    sq = gmpy2.powmod(gmpy2.powmod(x % k.q, k.p, k.q), k.q, k.q2)
    return sp + k.p2 * (((sq - sp) * k.p2_inv) % k.q2)
