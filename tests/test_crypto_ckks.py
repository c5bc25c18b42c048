"""CKKS wrapper: parameter sets, vector ops and split-layer matmul vs numpy, serialisation."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedhet.crypto.ckks import (
    ABS_TOL_FRESH,
    PARAMETER_SETS,
    REL_TOL_MUL,
    columns_matmul,
    context_from_bytes,
    context_to_bytes,
    decrypt_vector,
    decrypt_vectors,
    encrypt_columns,
    encrypt_rows,
    encrypt_vector,
    from_wire,
    make_context,
    public_context_bytes,
    rows_matmul,
    slot_count,
    to_wire,
    vector_from_bytes,
    vector_to_bytes,
)

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)


@pytest.fixture(scope="module")
def ctx():
    return make_context("fast")


def mul_tol(x, w):
    return ABS_TOL_FRESH + REL_TOL_MUL * np.abs(x) * np.abs(w)


def test_parameter_sets():
    assert PARAMETER_SETS["fast"].slots == 4096 and PARAMETER_SETS["fast"].depth == 2
    assert PARAMETER_SETS["deep"].slots == 8192 and PARAMETER_SETS["deep"].depth == 6
    deep = make_context("deep", galois_keys=False)
    assert slot_count(deep) == 8192
    x = np.linspace(-5, 5, 8192)
    v = encrypt_vector(deep, x)
    for _ in range(6):  # the deep chain allows six plaintext multiplications
        v = v * 1.5
    assert np.all(np.abs(decrypt_vector(v) - x * 1.5 ** 6) <= ABS_TOL_FRESH + REL_TOL_MUL * 6 * np.abs(x) * 1.5 ** 6)
    with pytest.raises(ValueError, match="unknown CKKS parameter set"):
        make_context("huge")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=arrays(np.float64, st.integers(1, 4096), elements=st.floats(-1e3, 1e3, allow_nan=False)))
def test_encrypt_decrypt_hypothesis(ctx, x):
    out = decrypt_vector(encrypt_vector(ctx, x))
    assert out.shape == x.shape
    assert np.all(np.abs(out - x) <= ABS_TOL_FRESH)


def test_vector_ops_vs_numpy(ctx):
    rng = np.random.default_rng(0)
    a, b = rng.uniform(-100, 100, 1000), rng.uniform(-100, 100, 1000)
    ea, eb = encrypt_vector(ctx, a), encrypt_vector(ctx, b)
    assert np.all(np.abs(decrypt_vector(ea + eb) - (a + b)) <= 2 * ABS_TOL_FRESH)
    assert np.all(np.abs(decrypt_vector(ea - eb) - (a - b)) <= 2 * ABS_TOL_FRESH)
    assert np.all(np.abs(decrypt_vector(ea * b) - a * b) <= mul_tol(a, b))
    assert np.all(np.abs(decrypt_vector(ea * -2.5) - a * -2.5) <= mul_tol(a, 2.5))
    assert np.all(np.abs(decrypt_vector(ea * eb) - a * b) <= mul_tol(a, b))


def test_rows_matmul_vs_numpy(ctx):
    rng = np.random.default_rng(1)
    A = rng.uniform(-10, 10, (3, 8))
    W = rng.normal(0, 3, (8, 5))
    out = decrypt_vectors(rows_matmul(encrypt_rows(ctx, A), W))
    assert out.shape == (3, 5)
    assert np.all(np.abs(out - A @ W) <= ABS_TOL_FRESH + REL_TOL_MUL * (np.abs(A) @ np.abs(W)))
    with pytest.raises(ValueError, match="does not match"):
        rows_matmul(encrypt_rows(ctx, A), W[:7])


def test_columns_matmul_vs_numpy(ctx):
    rng = np.random.default_rng(2)
    A = rng.uniform(-10, 10, (300, 6))  # batch 300, d 6
    W = rng.normal(0, 3, (6, 4))
    out = decrypt_vectors(columns_matmul(encrypt_columns(ctx, A), W)).T
    assert out.shape == (300, 4)
    assert np.all(np.abs(out - A @ W) <= ABS_TOL_FRESH + REL_TOL_MUL * (np.abs(A) @ np.abs(W)))
    with pytest.raises(ValueError, match="shape"):
        columns_matmul(encrypt_columns(ctx, A), W.T)


def test_input_checks(ctx):
    with pytest.raises(ValueError, match="slots"):
        encrypt_vector(ctx, np.zeros(slot_count(ctx) + 1))
    with pytest.raises(ValueError, match="NaN"):
        encrypt_vector(ctx, np.array([1.0, np.inf]))
    with pytest.raises(ValueError, match="2\\*\\*19"):
        encrypt_vector(ctx, np.array([1e6]))
    with pytest.raises(ValueError, match="1-D"):
        encrypt_vector(ctx, np.zeros((2, 2)))


def test_serialisation_roundtrip_and_public_context(ctx):
    rng = np.random.default_rng(3)
    x = rng.uniform(-50, 50, 64)
    W = rng.normal(size=(64, 3))
    # vector bytes and uint8 wire form
    v = encrypt_vector(ctx, x)
    assert np.array_equal(decrypt_vector(vector_from_bytes(ctx, vector_to_bytes(v))), decrypt_vector(v))
    wire = to_wire(v)
    assert wire.dtype == np.uint8 and wire.ndim == 1
    assert np.array_equal(decrypt_vector(from_wire(ctx, wire)), decrypt_vector(v))
    # the computing party gets a public context: it can compute but not decrypt
    pub = context_from_bytes(public_context_bytes(ctx))
    assert not pub.is_private()
    remote = vector_from_bytes(pub, vector_to_bytes(v))
    result = rows_matmul([remote], W)[0]
    with pytest.raises(ValueError, match="no secret key"):
        decrypt_vector(result)
    back = vector_from_bytes(ctx, vector_to_bytes(result))
    assert np.all(np.abs(decrypt_vector(back) - x @ W) <= ABS_TOL_FRESH + REL_TOL_MUL * (np.abs(x) @ np.abs(W)))
    # the public party can also encrypt for the key owner
    assert np.all(np.abs(decrypt_vector(vector_from_bytes(ctx, vector_to_bytes(encrypt_vector(pub, x)))) - x)
                  <= ABS_TOL_FRESH)
    # the key owner's own full context keeps the secret key
    assert context_from_bytes(context_to_bytes(ctx)).is_private()
    with pytest.raises(ValueError, match="not a serialised"):
        vector_from_bytes(ctx, b"garbage")
    with pytest.raises(ValueError, match="uint8"):
        from_wire(ctx, wire.astype(np.int16))
