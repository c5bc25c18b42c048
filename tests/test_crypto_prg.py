"""PRG: keystream equals plain AES-256-CTR, determinism, independence, uniformity, no modulo bias."""
from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedhet.crypto.field import P61
from fedhet.crypto.prg import PRG, SEED_BYTES, random_seed

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

SEED = bytes(range(32))
# Chi-square tests use fixed seeds, so each result is deterministic; a correct
# PRG passes these thresholds except with negligible probability.
ALPHA = 1e-4


def aes_ctr_keystream(seed: bytes, stream: int, n: int) -> bytes:
    """Plain reference: AES-256-CTR of zeros, counter block = stream (8 bytes BE) || 0^8."""
    iv = stream.to_bytes(8, "big") + bytes(8)
    return Cipher(algorithms.AES(seed), modes.CTR(iv)).encryptor().update(bytes(n))


def reference_mod(seed: bytes, stream: int, count: int, modulus: int) -> list[int]:
    """Plain rejection sampling with Python ints over the keystream's 64-bit words."""
    mask = (1 << (modulus - 1).bit_length()) - 1
    out, offset, chunk = [], 0, 8 * max(64, 4 * count)
    ks = b""
    while len(out) < count:
        if offset + 8 > len(ks):
            ks = aes_ctr_keystream(seed, stream, len(ks) + chunk)
        w = int.from_bytes(ks[offset:offset + 8], "little") & mask
        offset += 8
        if w < modulus:
            out.append(w)
    return out


def test_keystream_matches_plain_aes_ctr():
    n = (1 << 18) + 13  # spans several internal pieces and an odd tail
    assert PRG(SEED).bytes(n) == aes_ctr_keystream(SEED, 0, n)
    assert PRG(SEED, stream=7).bytes(100) == aes_ctr_keystream(SEED, 7, 100)
    assert PRG(SEED, stream=(7).to_bytes(8, "big")).bytes(100) == aes_ctr_keystream(SEED, 7, 100)


def test_uint_views_are_the_little_endian_keystream():
    raw = aes_ctr_keystream(SEED, 3, 8 * 1000)
    assert np.array_equal(PRG(SEED, 3).uint64(1000), np.frombuffer(raw, "<u8"))
    assert np.array_equal(PRG(SEED, 3).uint32((50, 40)).ravel(), np.frombuffer(raw[:8000], "<u4"))
    got = PRG(SEED, 3).integers_pow2(1000, 20)
    assert got.dtype == np.uint64
    assert np.array_equal(got, np.frombuffer(raw, "<u8") & np.uint64((1 << 20) - 1))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=6))
def test_stream_is_continuous_across_calls(sizes):
    prg = PRG(SEED)
    joined = b"".join(prg.bytes(k) for k in sizes)
    assert joined == aes_ctr_keystream(SEED, 0, sum(sizes))


@pytest.mark.parametrize("modulus", [2, 3, 5, 7, 1000003, 3 << 62, P61, (1 << 64) - 59])
def test_integers_mod_matches_plain_rejection_sampling(modulus):
    count = 3000
    got = PRG(SEED, 1).integers_mod(count, modulus)
    assert got.dtype == np.uint64
    assert [int(v) for v in got] == reference_mod(SEED, 1, count, modulus)


def test_fill_mod_with_many_rejections_is_deterministic_and_in_range():
    # modulus 5: words are masked to 3 bits and 5, 6, 7 are rejected (3/8 of them),
    # so several refill rounds happen inside one piece.
    a = PRG(SEED).integers_mod(100_000, 5)
    b = PRG(SEED).integers_mod(100_000, 5)
    assert np.array_equal(a, b)
    assert a.max() < 5
    counts = np.bincount(a.astype(np.int64), minlength=5)
    assert stats.chisquare(counts).pvalue > ALPHA


def test_same_seed_same_stream_different_seeds_or_streams_differ():
    a = PRG(SEED).uint64(4096)
    assert np.array_equal(a, PRG(SEED).uint64(4096))
    other_seed = bytes([1]) + SEED[1:]
    assert not np.array_equal(a, PRG(other_seed).uint64(4096))
    assert not np.array_equal(a, PRG(SEED, stream=1).uint64(4096))
    # Not even a shifted copy: no word of one stream appears in the other.
    assert not np.intersect1d(a, PRG(SEED, stream=1).uint64(4096)).size
    assert random_seed() != random_seed()
    assert len(random_seed()) == SEED_BYTES


def test_byte_uniformity_chi_square():
    data = np.frombuffer(PRG(SEED, 11).bytes(1 << 20), dtype=np.uint8)
    assert stats.chisquare(np.bincount(data, minlength=256)).pvalue > ALPHA
    # Pairs of consecutive bytes too (65536 cells), catches short-range correlation.
    pairs = data[0::2].astype(np.int64) * 256 + data[1::2]
    assert stats.chisquare(np.bincount(pairs, minlength=1 << 16)).pvalue > ALPHA


@pytest.mark.parametrize("modulus", [3 << 62, P61, 1000003])
def test_no_modulo_bias(modulus):
    # For m = 3 * 2**62, taking a 64-bit word mod m would make [0, 2**62) twice
    # as likely as the rest; equal-width buckets over [0, m) must be uniform.
    vals = PRG(SEED, 5).integers_mod(200_000, modulus)
    assert vals.max() < modulus
    buckets = 12
    idx = (vals.astype(object) * buckets // modulus).astype(np.int64)
    assert stats.chisquare(np.bincount(idx, minlength=buckets)).pvalue > ALPHA
    # Low residues mod 3 are uniform too.
    assert stats.chisquare(np.bincount((vals % np.uint64(3)).astype(np.int64), minlength=3)).pvalue > ALPHA


def test_a_biased_sampler_would_fail_the_bucket_test():
    # The test above can fail: plain "word mod m" is caught by the same statistic.
    m = 3 << 62
    naive = PRG(SEED, 5).uint64(200_000) % np.uint64(m)
    idx = (naive.astype(object) * 12 // m).astype(np.int64)
    assert stats.chisquare(np.bincount(idx, minlength=12)).pvalue < ALPHA


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="32 bytes"):
        PRG(b"short")
    with pytest.raises(TypeError, match="seed must be bytes"):
        PRG("0" * 32)
    with pytest.raises(ValueError, match="stream id"):
        PRG(SEED, stream=-1)
    with pytest.raises(ValueError, match="8 bytes"):
        PRG(SEED, stream=b"abc")
    with pytest.raises(ValueError, match="modulus"):
        PRG(SEED).integers_mod(3, 1)
    with pytest.raises(ValueError, match="bits"):
        PRG(SEED).integers_pow2(3, 65)
    with pytest.raises(ValueError, match="uint64"):
        PRG(SEED).fill_mod(np.zeros(4, dtype=np.int64), 7)
    with pytest.raises(ValueError, match="non-negative"):
        PRG(SEED).bytes(-1)


def test_fill_bytes_into_numpy_buffer_and_empty_outputs():
    buf = np.zeros(1000, dtype=np.uint16)
    PRG(SEED).fill_bytes(buf)
    assert buf.tobytes() == aes_ctr_keystream(SEED, 0, 2000)
    assert PRG(SEED).bytes(0) == b""
    assert PRG(SEED).uint64(0).shape == (0,)
    assert PRG(SEED).integers_mod((0, 3), P61).shape == (0, 3)
