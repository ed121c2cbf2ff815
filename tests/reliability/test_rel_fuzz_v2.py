"""Hypothesis fuzz of POST /v2/models/{model}/infer, binary and JSON framing.

Property: every request gets a 200 whose result equals NumPy's, or a 4xx with a JSON body whose
``error`` is a string; never a 5xx. Requests are built valid and then (mostly) broken by one or
more mutations: lying header lengths, binary_data_size mismatches, hostile shapes, unknown data
types, parameters of the wrong type, deep nesting, NaN literals, truncated or padded bodies,
gzip garbage.
"""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rel_support import FUZZ, HEADER, TestClient, assert_not_server_error, small_client

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

MODELS = {
    "onnx.BitwiseAnd-18": (("A", "B"), np.bitwise_and),
    "onnx.BitwiseXor-18": (("A", "B"), np.bitwise_xor),
    "DML_OPERATOR_ELEMENT_WISE_BIT_OR": (("ATensor", "BTensor"), np.bitwise_or),
    "openvino.BitwiseNot-13": (("input_1",), np.invert),
}
DTYPES = {"UINT8": np.uint8, "INT16": np.int16, "UINT32": np.uint32, "INT64": np.int64}
HUGE = [2**31, 2**32, 2**63 - 1, 2**63, 2**64, 2**64 + 1, 10**30, -1, -(2**63)]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with small_client() as c:
        yield c


# --- valid requests -----------------------------------------------------------------------------


@st.composite
def valid_requests(draw: st.DrawFn) -> dict[str, Any]:
    model = draw(st.sampled_from(sorted(MODELS)))
    names, fn = MODELS[model]
    dtype_name = draw(st.sampled_from(sorted(DTYPES)))
    dtype = np.dtype(DTYPES[dtype_name])
    shape = draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    arrays = [
        rng.integers(
            np.iinfo(dtype).min, np.iinfo(dtype).max, size=shape, dtype=dtype, endpoint=True
        )
        for _ in names
    ]
    binary_in = draw(st.booleans())
    binary_out = draw(st.booleans())
    inputs: list[dict[str, Any]] = []
    buffers: list[bytes] = []
    for name, array in zip(names, arrays, strict=True):
        tensor: dict[str, Any] = {"name": name, "shape": list(shape), "datatype": dtype_name}
        if binary_in:
            tensor["parameters"] = {"binary_data_size": array.nbytes}
            buffers.append(array.astype(dtype.newbyteorder("<")).tobytes())
        else:
            tensor["data"] = array.reshape(-1).tolist()
        inputs.append(tensor)
    header: dict[str, Any] = {"inputs": inputs, "parameters": {"binary_data_output": binary_out}}
    if draw(st.booleans()):
        header["id"] = draw(st.text(max_size=8))
    expected = fn(*arrays)
    return {
        "model": model,
        "header": header,
        "buffers": buffers,
        "framed": binary_in or draw(st.booleans()),
        "encoding": draw(st.sampled_from([None, None, "gzip", "deflate"])),
        "expected": expected,
    }


def encode(request: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    head = json.dumps(request["header"]).encode()
    body = head + b"".join(request["buffers"])
    headers: dict[str, str] = {}
    if request["framed"]:
        headers[HEADER] = str(len(head))
    else:
        headers["Content-Type"] = "application/json"
    if request["encoding"] == "gzip":
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    elif request["encoding"] == "deflate":
        body = zlib.compress(body)
        headers["Content-Encoding"] = "deflate"
    return body, headers


def check_result(response: Any, expected: np.ndarray[Any, Any]) -> None:
    content_type = response.headers.get("content-type", "")
    if HEADER in response.headers:
        n = int(response.headers[HEADER])
        document = json.loads(response.content[:n])
        (output,) = document["outputs"]
        got = np.frombuffer(response.content[n:], expected.dtype.newbyteorder("<"))
        assert output["parameters"]["binary_data_size"] == expected.nbytes
    else:
        assert content_type.startswith("application/json")
        (output,) = response.json()["outputs"]
        got = np.array(output["data"], dtype=expected.dtype)
    assert output["shape"] == list(expected.shape)
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)


@FUZZ
@given(request=valid_requests())
def test_rel_fuzz_v2_valid(client: TestClient, request: dict[str, Any]) -> None:
    body, headers = encode(request)
    response = client.post(f"/v2/models/{request['model']}/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text[:300]
    check_result(response, request["expected"])


# --- hostile requests ---------------------------------------------------------------------------

weird_values = st.one_of(
    st.sampled_from(HUGE),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
hostile_shapes = st.one_of(
    st.lists(st.sampled_from([*HUGE, 0, 1, 7]), min_size=1, max_size=6),
    st.lists(weird_values, max_size=3),
    st.just([2**32] * 4),
    st.just([]),
    st.just([-1, -1]),
    weird_values,
)
header_lengths = st.one_of(
    st.sampled_from(["-1", "abc", "", " ", "1e3", "0x10", "+5", "9" * 40, "1.5", "0"]),
    st.integers(-(2**70), 2**70).map(str),
)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@st.composite
def mutation(draw: st.DrawFn, request: dict[str, Any]) -> None:
    """Break ``request`` (in place) in one of many ways."""
    header = request["header"]
    inputs = header["inputs"]
    tensor = draw(st.sampled_from(inputs))
    kind = draw(
        st.sampled_from(
            [
                "binary_size",
                "shape",
                "datatype",
                "params",
                "tensor_params",
                "name",
                "drop_field",
                "extra_inputs",
                "outputs",
                "data",
                "deep",
            ]
        )
    )
    if kind == "binary_size":
        params = tensor.get("parameters")
        tensor["parameters"] = {**(params if isinstance(params, dict) else {})}
        tensor["parameters"]["binary_data_size"] = draw(weird_values)
    elif kind == "shape":
        tensor["shape"] = draw(hostile_shapes)
    elif kind == "datatype":
        tensor["datatype"] = draw(
            st.one_of(
                st.sampled_from(["BF16", "BYTES", "FP8", "uint8", "BOOL", "FP32", "INT128", ""]),
                weird_values,
            )
        )
    elif kind == "params":
        header["parameters"] = draw(
            st.one_of(
                weird_values,
                st.dictionaries(
                    st.sampled_from(["binary_data_output", "feature_level", "direction", "x"]),
                    weird_values,
                    max_size=3,
                ),
            )
        )
    elif kind == "tensor_params":
        tensor["parameters"] = draw(
            st.one_of(
                weird_values,
                st.dictionaries(
                    st.sampled_from(
                        ["binary_data_size", "shared_memory_region", "binary_data", "y"]
                    ),
                    weird_values,
                    max_size=3,
                ),
            )
        )
    elif kind == "name":
        tensor["name"] = draw(st.one_of(weird_values, st.text(max_size=20)))
    elif kind == "drop_field":
        key = draw(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]))
        tensor.pop(key, None)
    elif kind == "extra_inputs":
        inputs.extend([dict(tensor) for _ in range(draw(st.integers(1, 12)))])
    elif kind == "outputs":
        header["outputs"] = draw(
            st.one_of(
                weird_values,
                st.lists(
                    st.fixed_dictionaries(
                        {"name": st.sampled_from(["C", "Y", "OutputTensor", "output_1", "zz"])},
                        optional={"parameters": weird_values},
                    ),
                    max_size=12,
                ),
            )
        )
    elif kind == "data":
        tensor["data"] = draw(st.one_of(weird_values, st.lists(weird_values, max_size=5)))
    elif kind == "deep":
        where = draw(st.sampled_from(["data", "parameters", "id"]))
        value = nested(draw(st.integers(10, 3000)))
        if where == "id":
            header["id"] = value
        else:
            tensor[where] = value


@st.composite
def hostile_requests(draw: st.DrawFn) -> tuple[str, bytes, dict[str, str]]:
    request = draw(valid_requests())
    for _ in range(draw(st.integers(0, 3))):
        draw(mutation(request))
    model = request["model"]
    if draw(st.integers(0, 15)) >= 14:  # now and then a bad model name
        model = draw(st.sampled_from(["nope", "..%2F..", "A" * 300]))
    try:
        body, headers = encode(request)
    except (ValueError, TypeError, RecursionError):
        body, headers = b"{}", {}
    raw = draw(
        st.sampled_from(
            ["none"] * 6
            + ["header_len", "truncate", "leftover", "nan", "garbage", "gzip", "header_only"]
        )
    )
    if raw == "header_len":
        headers[HEADER] = draw(header_lengths)
    elif raw == "truncate" and body:
        body = body[: draw(st.integers(0, len(body) - 1))]
    elif raw == "leftover":
        body += draw(st.binary(min_size=1, max_size=64))
    elif raw == "nan":
        literal = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-0"]))
        body = body.replace(b"[", b"[" + literal + b",", 1)
    elif raw == "garbage":
        body = draw(st.binary(max_size=256))
        if draw(st.booleans()):
            headers[HEADER] = str(draw(st.integers(0, len(body))))
    elif raw == "gzip":
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate", "br", "gzip, gzip"]))
        choice = draw(st.integers(0, 2))
        if choice == 0:
            body = draw(st.binary(max_size=128))
        elif choice == 1:
            body = gzip.compress(body)[: draw(st.integers(0, 40))]
        else:
            body = gzip.compress(body) + draw(st.binary(min_size=1, max_size=8))
    elif raw == "header_only":
        headers[HEADER] = str(len(body))
    return model, body, headers


@FUZZ
@given(case=hostile_requests())
def test_rel_fuzz_v2_hostile(client: TestClient, case: tuple[str, bytes, dict[str, str]]) -> None:
    model, body, headers = case
    response = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert_not_server_error(
        response.status_code, response.content, response.headers.get("content-type", "")
    )


def test_rel_v2_zip_bomb(client: TestClient) -> None:
    """A 64 MiB-of-zeros gzip bomb (about 64 KiB compressed) stops at the body limit with 413."""
    bomb = gzip.compress(bytes(64 << 20), compresslevel=9)
    response = client.post(
        "/v2/models/onnx.BitwiseAnd-18/infer",
        content=bomb,
        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
    )
    assert response.status_code == 413, response.text
    assert response.json()["rule"] == "max_body_bytes"


def test_rel_v2_overflowing_shape_product(client: TestClient) -> None:
    """Dims whose product overflows int64 (2^32 * 2^32) are a 413, never a wrap to 0."""
    header = {
        "inputs": [
            {
                "name": n,
                "shape": [2**32, 2**32],
                "datatype": "UINT8",
                "parameters": {"binary_data_size": 0},
            }
            for n in ("A", "B")
        ]
    }
    head = json.dumps(header).encode()
    response = client.post(
        "/v2/models/onnx.BitwiseAnd-18/infer", content=head, headers={HEADER: str(len(head))}
    )
    assert response.status_code == 413, response.text
