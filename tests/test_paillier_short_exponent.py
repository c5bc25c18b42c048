"""Short-exponent (DJN) obfuscators and the multi-exponentiation matmul against the standard form and raw phe.

A ciphertext made with ``h**x`` decrypts with the ordinary private key (phe's and ours) to the same
plaintext as one made with ``r**n``, on random and edge plaintexts; homomorphic addition and scalar
multiplication still act on the plaintexts; fixed-base tables and the CRT path compute the plain powers.
"""
import secrets

import gmpy2
import numpy as np
import pytest
from phe import paillier as phe

from fedhet.crypto.paillier import PackingSpec, PaillierContext, packed_matmul, packed_matmul_ints
from fedhet.crypto.paillier_array import multi_pow, window_table
from fedhet.crypto.paillier_keys import (FixedBaseTable, ShortExponentObfuscator, key_view, short_exponent_base)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


@pytest.fixture(scope="module")
def keys():
    pk, sk = phe.generate_paillier_keypair(n_length=1024)
    return pk, sk


def test_fixed_base_table_is_powmod():
    m = gmpy2.next_prime(gmpy2.mpz(2) ** 300) * gmpy2.next_prime(gmpy2.mpz(3) ** 150)
    g = gmpy2.mpz(123456789123456789)
    t = FixedBaseTable(g, m, 70)
    for e in [0, 1, 255, 256, 2 ** 69, 2 ** 70 - 1, secrets.randbits(70)]:
        assert t.pow(e) == gmpy2.powmod(g, e, m)
    with pytest.raises(ValueError, match="table covers 70"):
        t.pow(2 ** 70)


def test_short_base_is_an_nth_residue_and_crt_matches_public(keys):
    pk, sk = keys
    kpub, kown = key_view(pk.n), key_view(pk.n, sk.p, sk.q)
    h = short_exponent_base(pk.n)
    # h**lambda = 1 mod n**2: an n-th residue, so it decrypts to 0
    assert sk.raw_decrypt(int(h)) == 0
    pub, own = ShortExponentObfuscator(kpub, h), ShortExponentObfuscator(kown, h)
    for x in [0, 1, 2 ** 256 - 1, secrets.randbits(256)]:
        assert pub.power(x) == own.power(x) == gmpy2.powmod(h, x, kpub.n2)
    with pytest.raises(ValueError, match="kappa"):
        ShortExponentObfuscator(kpub, h, kappa=8)
    with pytest.raises(ValueError, match="unit"):
        ShortExponentObfuscator(kpub, pk.n)


def _edge_plaintexts(n):
    return [0, 1, 2, n - 1, n - 2, n // 2, n // 2 + 1, (n - 12345) % n, secrets.randbelow(n), secrets.randbelow(n)]


@pytest.mark.parametrize("owner", [False, True], ids=["public", "key-owner-crt"])
def test_short_form_decrypts_like_standard_and_phe(keys, owner):
    pk, sk = keys
    short = PaillierContext(pk, sk if owner else None, obfuscation="short_exponent")
    std = PaillierContext(pk, sk if owner else None, obfuscation="standard")
    dec = PaillierContext(pk, sk)
    n = int(pk.n)
    ms = _edge_plaintexts(n)
    for m in ms:
        c_short = (1 + m * n) * short.pool.take(1)[0] % (n * n)
        c_std = (1 + m * n) * std.pool.take(1)[0] % (n * n)
        assert c_short != c_std
        assert sk.raw_decrypt(int(c_short)) == sk.raw_decrypt(int(c_std)) == m
        assert dec.decrypt_raw([c_short]) == [m]
        # phe's EncryptedNumber on our ciphertext: homomorphic add and scalar mul still hold
        e = phe.EncryptedNumber(pk, int(c_short))
        assert sk.raw_decrypt((e + 5).ciphertext(be_secure=False)) == (m + 5) % n
        assert sk.raw_decrypt((e * 7).ciphertext(be_secure=False)) == (m * 7) % n
        assert sk.raw_decrypt((e + e).ciphertext(be_secure=False)) == (2 * m) % n
    # phe's own encryptions of signed values, read by our decryption, against short-form ones
    for v in [0, -1, 1, -(2 ** 40), 2 ** 40]:
        c_phe = pk.raw_encrypt(v % n)
        c_short = (1 + (v % n) * n) * short.pool.take(1)[0] % (n * n)
        assert dec.decrypt_raw([c_phe]) == dec.decrypt_raw([c_short]) == [v % n]
    for c in (short, std, dec):
        c.close()


@pytest.mark.parametrize("spec", [PackingSpec(16, 8, 64), PackingSpec(0, 18, 160), PackingSpec(16, 8, None)],
                         ids=["64bit", "160bit", "unpacked"])
def test_packed_arrays_short_vs_standard(keys, spec):
    """Random, zero, negative and maximal packed values decrypt equal in both forms; arithmetic still works."""
    pk, sk = keys
    lim = 2.0 ** spec.int_bits - 2.0 ** -spec.frac_bits
    rng = np.random.default_rng(3)
    x = rng.uniform(-lim, lim, (3, 40))
    x[0, :6] = [0.0, -0.0, lim, -lim, 2.0 ** -spec.frac_bits, -(2.0 ** -spec.frac_bits)]
    x[1, :] = lim  # every slot at the maximum
    x[2, :] = -lim
    with PaillierContext(pk, sk, obfuscation="short_exponent") as own, \
            PaillierContext(pk, None, obfuscation="short_exponent") as pub, \
            PaillierContext(pk, sk, obfuscation="standard") as std:
        want = std.decrypt(std.encrypt(x, spec))
        for ctx in (own, pub):
            enc = ctx.encrypt(x, spec)
            got = own.decrypt(enc)
            assert np.array_equal(got, want)
            assert np.all(np.abs(got - x) <= 2.0 ** -(spec.frac_bits + 1))
            if spec.slot_bits is not None and spec.slot_bits >= 100:
                s = own.decrypt(enc + enc)
                assert np.array_equal(s, 2 * want)
                assert np.array_equal(own.decrypt(enc.mul_scalar(-3)), -3 * want)
                assert np.array_equal(own.decrypt(own.rerandomize(pub.rerandomize(enc))), want)


def test_multi_pow_matches_single_powers():
    n2 = gmpy2.next_prime(gmpy2.mpz(2) ** 200) ** 2
    bases = [gmpy2.mpz(secrets.randbelow(int(n2) - 2) + 2) for _ in range(5)]
    exps = [0, 1, 2 ** 70 + 3, secrets.randbits(50), secrets.randbits(9)]
    want = 1
    for b, e in zip(bases, exps):
        want = want * pow(int(b), e, int(n2)) % int(n2)
    for w in (1, 3, 4, 6):
        assert multi_pow([window_table(b, n2, w) for b in bases], exps, n2, w) == want


def test_matmul_ints_equals_float_matmul_and_exact_big_weights(keys):
    pk, sk = keys
    with PaillierContext(pk, sk, obfuscation="short_exponent") as ctx:
        spec = PackingSpec(0, 18, 160)
        X = np.random.default_rng(5).integers(-2 ** 17, 2 ** 17, (4, 30)).astype(np.float64)
        enc = ctx.encrypt(X, spec)
        W = np.array([[1.5, -2.25], [0.0, 3.0], [-0.5, 0.0], [2.0, -1.0]])
        a = packed_matmul(enc, W, w_frac_bits=2)
        b = packed_matmul_ints(enc, np.array([[6, -9], [0, 12], [-2, 0], [8, -4]], dtype=object), w_frac_bits=2)
        assert [int(c) for c in a.ciphertexts.ravel()] == [int(c) for c in b.ciphertexts.ravel()]
        big = np.array([[2 ** 70 + 1, -(2 ** 65)], [3, 0], [-(2 ** 60), 1], [0, 2 ** 50]], dtype=object)
        got = packed_matmul_ints(enc, big)
        ints = [[int(v) for v in row] for row in X.astype(np.int64)]
        want = [[sum(big[j, k] * ints[j][t] for j in range(4)) for t in range(30)] for k in range(2)]
        dec = ctx.decrypt_raw(got.ciphertexts.ravel())
        from fedhet.crypto.paillier import unpack_signed
        m = got.n_ct_per_row
        assert [unpack_signed(dec[k * m:(k + 1) * m], int(pk.n), 160, got.slots, 30) for k in range(2)] == want
        with pytest.raises(TypeError, match="integers"):
            packed_matmul_ints(enc, np.ones((4, 2)))


def test_bad_obfuscation_names_the_choices(keys):
    pk, _ = keys
    with pytest.raises(ValueError, match="obfuscation must be one of"):
        PaillierContext(pk, None, obfuscation="djn")


def test_decrypt_list_equals_phe_raw_decrypt(keys):
    from fedhet.crypto.paillier_keys import decrypt_list
    pk, sk = keys
    k = key_view(pk.n, sk.p, sk.q)
    n = int(pk.n)
    ms = [0, 1, n - 1, n // 2, *(secrets.randbelow(n) for _ in range(20))]
    cts = [pk.raw_encrypt(m) for m in ms] + [secrets.randbelow(n * n)]   # a random ciphertext too
    want = [sk.raw_decrypt(c) for c in cts]
    assert decrypt_list(k, cts) == want == decrypt_list(k, cts, threads=False)
    assert want[:len(ms)] == ms
    assert decrypt_list(k, []) == []
    with pytest.raises(ValueError, match="key owner"):
        decrypt_list(key_view(pk.n), cts)


def test_decrypt_list_threads_work_in_a_forked_child(keys):
    import multiprocessing as mp
    from fedhet.crypto.paillier_keys import decrypt_list
    pk, sk = keys
    k = key_view(pk.n, sk.p, sk.q)
    cts = [pk.raw_encrypt(m) for m in range(16)]
    assert decrypt_list(k, cts) == list(range(16))     # the parent's thread pool exists now
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(decrypt_list, (k, cts)).get(timeout=60)
    assert got == list(range(16))
