"""The envelope codec: lossless round trips, no pickle, every limit enforced."""
import msgpack
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedhet.parties import codec
from fedhet.parties.codec import MalformedMessage

pytestmark = pytest.mark.unit   # the tier (tests/conftest.py)

DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.bool_, np.uint64, np.int8, np.float16]


def roundtrip(payload, **kw):
    frames = codec.encode("run", "a", "b", "k", 3, payload, round=2)
    return codec.decode([bytes(f) for f in frames], **kw)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(st.sampled_from(DTYPES), hnp.array_shapes(min_dims=0, max_dims=4, max_side=6)))
def test_numpy_arrays_roundtrip_bit_exact(a):
    env = roundtrip({"x": a, "n": [a, 1]})
    for got in (env.payload["x"], env.payload["n"][0]):
        assert got.dtype == a.dtype and got.shape == a.shape
        assert got.tobytes() == a.tobytes()
    assert env.payload["n"][1] == 1
    assert (env.frm, env.to, env.kind, env.seq, env.round) == ("a", "b", "k", 3, 2)


def test_torch_tensors_come_back_as_torch_and_writable():
    t = torch.randn(4, 5, dtype=torch.float32)
    env = roundtrip({"t": t, "i": torch.arange(3)})
    assert isinstance(env.payload["t"], torch.Tensor)
    assert torch.equal(env.payload["t"], t) and torch.equal(env.payload["i"], torch.arange(3))
    env.payload["t"] += 1  # receivers own their copy


def test_big_endian_and_noncontiguous_arrays_are_normalised():
    a = np.arange(12, dtype=">f8").reshape(3, 4)[:, ::2]
    got = roundtrip(a).payload
    assert got.dtype == np.dtype("<f8") and np.array_equal(got, a)


@pytest.mark.parametrize("bad", [object(), {1.5: 2}, np.array(["a"]), np.array([{}], dtype=object), {3, 4}])
def test_values_that_are_not_data_are_refused_on_send(bad):
    with pytest.raises(TypeError):
        codec.encode("r", "a", "b", "k", 0, bad)


def test_digest_is_the_same_on_both_sides():
    frames = codec.encode("r", "a", "b", "k", 0, {"w": np.ones(5)})
    d, n = codec.frames_digest(frames)
    env = codec.decode([bytes(f) for f in frames])
    assert env.digest == d and env.nbytes == n


def _header(**over):
    h = {"v": 1, "run": "r", "frm": "a", "to": "b", "kind": "k", "seq": 0, "round": 0,
         "body": {"__fedhet_array__": 0}, "arrays": [{"t": "np", "dtype": "<f4", "shape": [2]}]}
    h.update(over)
    return msgpack.packb(h)


@pytest.mark.parametrize("frames,why", [
    ([], "no frames"),
    ([b"\xc1"], "not msgpack"),
    ([msgpack.packb([1, 2])], "not a map"),
    ([_header(v=9), b"\0" * 8], "version"),
    ([_header(), b"\0" * 7], "7 bytes where the header announces 8"),
    ([_header()], "announces"),
    ([_header(arrays=[{"t": "np", "dtype": "|O", "shape": [1]}]), b"\0" * 8], "not allowed"),
    ([_header(arrays=[{"t": "np", "dtype": "<f4", "shape": [-1]}]), b"\0" * 8], "bad shape"),
    ([_header(body={"__fedhet_array__": 5}), b"\0" * 8], "bad array reference"),
    ([_header(body=None), b"\0" * 8], "not referenced"),
    ([_header(seq=-1), b"\0" * 8], "sequence"),
    ([_header(frm=""), b"\0" * 8], "not a string of 1..128"),
    ([_header(arrays=[{"t": "np", "dtype": "<f4", "shape": [1 << 40, 1 << 40]}]), b"\0" * 8], "exceeds the limit"),
])
def test_malformed_frames_are_rejected_with_a_reason(frames, why):
    with pytest.raises(MalformedMessage, match=why):
        codec.decode(frames)


def test_size_limit_applies_to_the_whole_message():
    frames = codec.encode("r", "a", "b", "k", 0, np.zeros(1000))
    with pytest.raises(MalformedMessage, match="exceeds the limit"):
        codec.decode([bytes(f) for f in frames], max_bytes=1000)


def test_no_pickle_on_the_wire():
    frames = codec.encode("r", "a", "b", "k", 0, {"x": np.arange(3), "s": "text"})
    assert b"numpy" not in bytes(frames[0]) and b"\x80\x04" not in bytes(frames[0])


def test_empty_and_zero_dimensional_arrays_roundtrip():
    for a in (np.zeros((0, 5)), np.zeros((3, 0), dtype=np.int32), np.full((), 2.5, dtype=np.float32), torch.zeros(0, 3)):
        got = roundtrip(a).payload
        assert tuple(got.shape) == tuple(a.shape) and type(got) is type(a)


def test_large_arrays_are_chunked_into_bounded_frames_and_roundtrip():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(1000, 37))  # 296,000 bytes
    b = np.arange(10, dtype=np.int32)
    frames = codec.encode("r", "a", "b", "k", 0, {"a": a, "b": b, "t": torch.arange(5)}, chunk_bytes=4096)
    sizes = [len(memoryview(f)) for f in frames[1:]]
    assert max(sizes) <= 4096 and len(sizes) == -(-a.nbytes // 4096) + 2
    env = codec.decode([bytes(f) for f in frames])
    assert env.payload["a"].tobytes() == a.tobytes() and env.payload["a"].shape == a.shape
    assert np.array_equal(env.payload["b"], b) and torch.equal(env.payload["t"], torch.arange(5))
    assert env.arrays == [("<f8", (1000, 37)), ("<i4", (10,)), ("<i8", (5,))]
    p = codec.plan(frames[0])
    assert p.frame_sizes == sizes and p.chunk == 4096
    # a missing or resized chunk is refused
    with pytest.raises(MalformedMessage, match="data frames came"):
        codec.decode([bytes(f) for f in frames[:-1]])
    with pytest.raises(MalformedMessage, match="where the header announces"):
        codec.decode([bytes(f) for f in frames[:1]] + [bytes(frames[1])[:-8] + b"\0" * 4]
                     + [bytes(f) for f in frames[2:]])


def test_messages_below_the_chunk_size_keep_their_frames():
    payload = {"w": np.ones(1000), "n": 3}
    frames = codec.encode("r", "a", "b", "k", 0, payload)
    head = msgpack.unpackb(bytes(frames[0]))
    assert "chunk_bytes" not in head and len(frames) == 2 and len(memoryview(frames[1])) == 8000


def test_header_over_the_frame_limit_is_refused_on_send():
    with pytest.raises(ValueError, match="header of"):
        codec.encode("r", "a", "b", "k", 0, {"blob": b"x" * (codec.MAX_HEADER_BYTES + 1)})
