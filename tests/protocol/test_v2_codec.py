"""The pure pieces under the v2 endpoints: the binary framing (codec), strict JSON and tensor
``data`` (jsondata), and the wire models' agreement with the data-type table."""

from __future__ import annotations

import json
import math
import re
from typing import Any, get_args

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import DTYPES, DataType, from_numpy
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, decode_data, encode_data, parse_json
from tensorbits_protocol.v2 import Datatype, InferenceRequest

LIMITS = JsonLimits(max_depth=8, max_values=1000)
Arr = np.ndarray[Any, Any]


def test_wire_datatypes_are_the_datatype_table() -> None:
    assert get_args(Datatype) == tuple(str(t) for t in DataType)


# --- codec: header length ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "length"), [(None, None), ("0", 0), ("12", 12), (" 7 ", 7), ("100", 100)]
)
def test_header_length_accepted(value: str | None, length: int | None) -> None:
    assert codec.parse_header_length(value, 100) == length


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("", "Unable to parse"),
        ("x1", "Unable to parse"),
        ("-1", "Unable to parse"),
        ("+5", "Unable to parse"),
        ("١٢", "Unable to parse"),  # Unicode digits: isdigit() says yes, ASCII says no
        ("1" * 21, "Unable to parse"),
        ("101", "inference header size should be in range (0, 100), got: 101"),
    ],
)
def test_header_length_refused(value: str, words: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        codec.parse_header_length(value, 100)


# --- codec: slicing and layout -------------------------------------------------------------------

arrays = st.lists(
    st.sampled_from([t for t in DataType]).flatmap(
        lambda t: hnp.arrays(DTYPES[t].numpy, hnp.array_shapes(min_dims=0, max_side=4, min_side=0))
    ),
    min_size=1,
    max_size=4,
)


def frame_of(name: str, array: Arr, binary: bool = True) -> codec.TensorFrame:
    return codec.TensorFrame(
        name=name,
        datatype=from_numpy(array.dtype),
        shape=array.shape,
        binary_size=array.nbytes if binary else None,
        has_data=not binary,
    )


@given(arrays, st.data())
def test_encode_then_slice_round_trips(tensors: list[Arr], data: st.DataObject) -> None:
    binary = [data.draw(st.booleans()) for _ in tensors]
    frames = [frame_of(f"t{i}", a, b) for i, (a, b) in enumerate(zip(tensors, binary, strict=True))]
    document = {"inputs": [{"name": f.name, "binary_data_size": f.binary_size} for f in frames]}
    header = codec.dump_header(document)
    buffers = [a.tobytes() for a, b in zip(tensors, binary, strict=True) if b]
    assert len(header) % codec.ALIGNMENT == 0
    assert json.loads(header) == document
    body = memoryview(header + b"".join(buffers))
    _, tail = codec.split_body(body, len(header))
    slices = codec.slice_tensors(frames, tail, "m", header_given=True)
    for array, is_binary, got in zip(tensors, binary, slices, strict=True):
        if is_binary:
            assert got is not None
            assert got.tobytes() == array.tobytes()
        else:
            assert got is None


@given(arrays, st.integers(-3, 3).filter(bool))
def test_any_wrong_length_is_refused(tensors: list[Arr], delta: int) -> None:
    frames = [frame_of(f"t{i}", a) for i, a in enumerate(tensors)]
    raw = b"".join(a.tobytes() for a in tensors)
    tail = raw + b"\0" * delta if delta > 0 else raw[: max(len(raw) + delta, 0)]
    if len(tail) == len(raw):
        return
    with pytest.raises(InvalidRequest, match=r"unexpected (size for input|additional input data)"):
        codec.slice_tensors(frames, memoryview(tail), "m", header_given=True)


def test_sizes_never_overflow() -> None:
    frame = codec.TensorFrame("x", DataType.UINT64, (2**62, 2**62), binary_size=8)
    assert frame.nbytes == 2**127
    with pytest.raises(InvalidRequest, match=f"Expected {2**127}, got 8"):
        codec.slice_tensors([frame], memoryview(b"\0" * 8), "m", header_given=True)


def test_slices_are_views_of_the_body() -> None:
    body = bytearray(b"{}" + bytes(range(8)))
    frame = codec.TensorFrame("x", DataType.UINT8, (8,), binary_size=8)
    (view,) = codec.slice_tensors([frame], memoryview(body)[2:], "m", header_given=True)
    assert view is not None
    body[2] = 99
    assert view[0] == 99


def test_body_layout_is_one_buffer() -> None:
    layout = codec.BodyLayout(codec.dump_header({"a": 1}), (3, 5))
    assert layout.header_length == 8
    assert layout.total == 16
    body, (first, second) = layout.allocate()
    first[:] = b"abc"
    second[:] = b"defgh"
    assert bytes(body) == b'{"a":1} abcdefgh'
    assert not body.readonly
    assert len(body) == 16


def test_dump_header_refuses_nan() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        codec.dump_header({"x": math.nan})


# --- jsondata: parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "depth_ok"),
    [
        (b"[[[[[[[[1]]]]]]]]", True),  # depth 8
        (b"[[[[[[[[[1]]]]]]]]]", False),  # depth 9
        (b'["[[[[[[[[[[[[[[[["]', True),  # brackets in a string are not nesting
        (b'["\\"[[[[[[[[[[[[[[[[[["]', True),  # nor after an escaped quote
        (b'{"a": {"b": {"c": [{}]}}}', True),
    ],
)
def test_depth_is_counted_outside_strings(doc: bytes, depth_ok: bool) -> None:
    if depth_ok:
        parse_json(doc, LIMITS)
    else:
        with pytest.raises(InvalidRequest, match="nesting depth 9 exceeds the limit of 8"):
            parse_json(doc, LIMITS)


def test_value_count_is_bounded_before_parsing() -> None:
    parse_json(b"[" + b"0," * 999 + b"0]", LIMITS)
    with pytest.raises(PayloadTooLarge, match="more than 1000 values"):
        parse_json(b"[" + b"0," * 1000 + b"0]", LIMITS)


@pytest.mark.parametrize(
    "doc", [b"NaN", b"[Infinity]", b'{"a": -Infinity}', b'{"a": 1, "a": 2}', b"[1,]", b"'x'"]
)
def test_only_rfc8259(doc: bytes) -> None:
    with pytest.raises(InvalidRequest):
        parse_json(doc, LIMITS)


def test_parse_accepts_memoryview_and_big_integers() -> None:
    assert parse_json(memoryview(b'{"x": [18446744073709551615, -1e-5]}'), LIMITS) == {
        "x": [2**64 - 1, -1e-5]
    }


# --- jsondata: tensor data -----------------------------------------------------------------------

decodable = st.sampled_from([t for t in DataType if t is not DataType.FP16]).flatmap(
    lambda t: hnp.arrays(
        DTYPES[t].numpy,
        hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3),
        elements={"allow_nan": False, "allow_infinity": False} if t.name.startswith("FP") else None,
    )
)


@given(decodable, st.booleans())
def test_data_round_trips_bit_exact(array: Arr, nested: bool) -> None:
    datatype = from_numpy(array.dtype)
    data = array.tolist() if nested and array.ndim else encode_data("y", array)
    back = decode_data("x", datatype, array.shape, json.loads(json.dumps(data)))
    assert back.dtype == array.dtype
    assert back.shape == array.shape
    assert back.tobytes() == array.tobytes()


def test_encode_is_flat() -> None:
    assert encode_data("y", np.arange(6, dtype=np.int8).reshape(2, 3)) == [0, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_encode_refuses_non_finite(value: float) -> None:
    with pytest.raises(InvalidRequest, match="output 'y': the result holds NaN or infinity"):
        encode_data("y", np.array([1.0, value], np.float32))


@pytest.mark.parametrize(
    ("datatype", "data", "words"),
    [
        (DataType.UINT8, [256], "value 256 is out of range for UINT8"),
        (DataType.INT16, [-32769], "value -32769 is out of range for INT16"),
        (DataType.UINT32, [2.0], "2.0 is not a valid UINT32 element"),
        (DataType.INT64, [False], "false is not a valid INT64 element"),
        (DataType.BOOL, [0], "0 is not a valid BOOL element (allowed: true or false)"),
        (DataType.FP32, [3.5e38], "out of range for FP32"),
        (DataType.FP32, [[1.0]], "[1.0] is not a valid FP32 element"),
        (DataType.FP16, [1.0], "FP16 has no JSON representation"),
    ],
)
def test_decode_refuses(datatype: DataType, data: list[Any], words: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(words)):
        decode_data("x", datatype, (1,), data)


def test_fp32_accepts_integers_and_rounds() -> None:
    got = decode_data("x", DataType.FP32, (3,), [1, 0.1, -2])
    assert got.tolist() == [1.0, np.float32(0.1), -2.0]


def test_request_model_keeps_data_unvalidated() -> None:
    data = [[1, 2], [3, 4]]
    request = InferenceRequest.model_validate(
        {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "UINT8", "data": data}]}
    )
    assert request.inputs[0].data is data  # not walked, not copied
