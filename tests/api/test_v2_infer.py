"""POST /v2/models/{model}/infer, in process: results bit-exact against the element-by-element
reference (tests/core/bitref.py), in JSON and in binary, and the protocol's options."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from core.bitref import assert_bits_equal, reference
from support.framing import HEADER, framed
from support.inprocess import TestClient
from support.planes import data_plane
from support.v2 import (
    AND,
    NOT,
    binary_input,
    error_of,
    infer_binary,
    infer_json,
    json_input,
    output_array,
    v2_client,
)

from tensorbits.api import rest_infer
from tensorbits.api.fastpath import FastPathMiddleware
from tensorbits.config.settings import Settings
from tensorbits.server.app import create_app
from tensorbits_protocol.dtypes import DTYPES, DataType
from tensorbits_protocol.operators import OPERATORS, Function, OperatorSpec, get_operator
from tensorbits_protocol.v2 import InferenceResponse

RNG = np.random.default_rng(20261121)
# Starlette types Middleware.cls as a factory protocol, which mypy does not match to a class:
# compared as the objects they are.
FAST_PATH: object = FastPathMiddleware
Arr = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v2_client() as c:
        yield c


def random_array(datatype: DataType, shape: tuple[int, ...]) -> Arr:
    """Random stored bits of ``datatype`` (floats included: NaN payloads, -0.0 and all)."""
    info = DTYPES[datatype]
    if datatype is DataType.BOOL:
        return RNG.integers(0, 2, size=shape).astype(np.bool_)
    bits = RNG.integers(0, 2 ** (8 * info.itemsize), size=shape, dtype=np.uint64)
    return bits.astype(info.bits).view(info.numpy)


def inputs_for(
    op: OperatorSpec, datatype: DataType, shape: tuple[int, ...] = (2, 3)
) -> dict[str, Arr]:
    arrays = {name: random_array(datatype, shape) for name in op.inputs}
    if op.function in (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT):
        # Counts around the width, so that the "at or above the width" rule is exercised.
        width = DTYPES[datatype].itemsize * 8
        arrays[op.inputs[1]] = RNG.integers(0, width + 3, size=shape).astype(DTYPES[datatype].numpy)
    return arrays


def variants(op: OperatorSpec) -> list[dict[str, Any]]:
    """The parameter sets that change what ``op`` computes."""
    if op.function is Function.SHIFT:
        return [{"direction": "LEFT"}, {"direction": "RIGHT"}]
    if op.function is Function.COUNT:
        return [{}, {"output_datatype": "UINT32"}]
    return [{}]


CASES = [
    pytest.param(op, datatype, params, id=f"{op.name}-{datatype}-{''.join(params.values())}")
    for op in OPERATORS
    for params in variants(op)
    for datatype in op.support[0].input_types
]


@pytest.mark.parametrize(("op", "datatype", "params"), CASES)
def test_every_model_and_type_in_binary(
    client: TestClient, op: OperatorSpec, datatype: DataType, params: dict[str, Any]
) -> None:
    arrays = inputs_for(op, datatype)
    response = infer_binary(client, op.name, arrays, params)
    assert response.headers["content-type"] == "application/octet-stream"
    assert_bits_equal(output_array(response), reference(op.name, arrays, params))


JSON_CASES = [c for c in CASES if c.values[1] is not DataType.FP16]


@pytest.mark.parametrize(("op", "datatype", "params"), JSON_CASES)
def test_every_model_and_type_in_json(
    client: TestClient, op: OperatorSpec, datatype: DataType, params: dict[str, Any]
) -> None:
    arrays = inputs_for(op, datatype)
    if DTYPES[datatype].numpy.kind == "f":
        # JSON numbers are finite: keep values whose bits survive a float round trip.
        arrays = {n: RNG.normal(size=(2, 3)).astype(DTYPES[datatype].numpy) for n in op.inputs}
    response = infer_json(
        client,
        op.name,
        arrays,
        params,
        outputs=[{"name": op.output, "parameters": {"binary_data": True}}],
    )
    assert_bits_equal(output_array(response), reference(op.name, arrays, params))


@pytest.mark.parametrize(
    "datatype", [DataType.UINT64, DataType.INT64, DataType.INT8, DataType.UINT16]
)
def test_json_output_is_exact_at_the_extremes_of_a_type(
    client: TestClient, datatype: DataType
) -> None:
    info = np.iinfo(DTYPES[datatype].numpy.name)  # by name: the table types it as any dtype
    a = np.array([info.min, info.max, 0, 1, info.max - 1], dtype=DTYPES[datatype].numpy)
    b = np.array([info.max, info.max, info.min, info.max, info.max], dtype=a.dtype)
    response = infer_json(client, "onnx.BitwiseOr-18", {"A": a, "B": b})
    assert response.headers["content-type"] == "application/json"
    assert HEADER.lower() not in response.headers
    output = response.json()["outputs"][0]
    assert output["data"] == (a | b).tolist()  # Python ints: no float rounding anywhere
    assert (output["datatype"], output["shape"]) == (str(datatype), [5])


def test_response_envelope(client: TestClient) -> None:
    a, b = np.array([1, 2, 3], np.int32), np.array([6], np.int32)
    response = infer_json(client, AND, {"A": a, "B": b}, id="req-7")
    assert response.json() == {
        "model_name": AND,
        "model_version": "1",
        "id": "req-7",
        "outputs": [{"name": "C", "shape": [3], "datatype": "INT32", "data": [0, 2, 2]}],
    }
    assert "id" not in infer_json(client, AND, {"A": a, "B": b}).json()
    # The server writes its headers as dicts for speed: they must still be the wire model.
    assert InferenceResponse.model_validate(response.json()).id == "req-7"


def test_binary_response_framing(client: TestClient) -> None:
    x = np.arange(5, dtype=np.uint64)
    response = infer_binary(client, NOT, {"InputTensor": x})
    length = int(response.headers[HEADER])
    assert length % 8 == 0  # the output starts aligned: the header is padded with spaces
    assert int(response.headers["content-length"]) == length + x.nbytes
    header = json.loads(response.content[:length])
    assert header["outputs"] == [
        {
            "name": "OutputTensor",
            "shape": [5],
            "datatype": "UINT64",
            "parameters": {"binary_data_size": 40},
        }
    ]
    assert "data" not in header["outputs"][0]
    assert InferenceResponse.model_validate(header).outputs[0].parameters is not None
    assert response.content[length:] == (~x).tobytes()


def test_inputs_match_by_name_in_any_order(client: TestClient) -> None:
    a, b = np.array([0xF0, 0x0F], np.uint8), np.array([1, 4], np.uint8)
    want = reference("onnx.BitShift-11", {"X": a, "Y": b}, {"direction": "LEFT"})
    response = infer_json(client, "onnx.BitShift-11", {"Y": b, "X": a}, {"direction": "LEFT"})
    assert_bits_equal(output_array(response), want)
    response = infer_binary(client, "onnx.BitShift-11", {"Y": b, "X": a}, {"direction": "LEFT"})
    assert_bits_equal(output_array(response), want)


def test_json_and_binary_inputs_mix(client: TestClient) -> None:
    a, b = np.array([[1, 2], [3, 4]], np.uint16), np.array([[7, 7], [7, 7]], np.uint16)
    header = {"inputs": [json_input("A", a, nested=True), binary_input("B", b)]}
    body, headers = framed(header, b.tobytes())
    response = client.post(f"/v2/models/{AND}/infer", content=body, headers=headers)
    assert_bits_equal(output_array(response), a & b)


@pytest.mark.parametrize("nested", [False, True])
def test_nested_and_flat_data_mean_the_same(client: TestClient, nested: bool) -> None:
    x = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    header = {"inputs": [json_input("X", x, nested=nested)]}
    response = client.post("/v2/models/onnx.BitwiseNot-18/infer", json=header)
    assert_bits_equal(output_array(response), ~x)


@pytest.mark.parametrize(
    ("outputs", "parameters", "binary"),
    [
        (None, None, False),  # the protocol's default: JSON
        (None, {"binary_data_output": True}, True),
        ([], None, False),
        ([{"name": "Y"}], None, False),
        ([{"name": "Y"}], {"binary_data_output": True}, True),
        ([{"name": "Y", "parameters": {"binary_data": True}}], None, True),
        (
            [{"name": "Y", "parameters": {"binary_data": False}}],
            {"binary_data_output": True},
            False,
        ),
    ],
)
def test_output_encoding_follows_the_request(
    client: TestClient, outputs: list[Any] | None, parameters: dict[str, Any] | None, binary: bool
) -> None:
    x = np.array([1, 2, 3], np.uint32)
    header: dict[str, Any] = {"inputs": [json_input("X", x)]}
    if outputs is not None:
        header["outputs"] = outputs
    if parameters is not None:
        header["parameters"] = parameters
    response = client.post("/v2/models/onnx.BitwiseNot-18/infer", json=header)
    expected_type = "application/octet-stream" if binary else "application/json"
    assert response.headers["content-type"] == expected_type
    assert (HEADER.lower() in response.headers) is binary
    assert_bits_equal(output_array(response), ~x)


def test_versioned_infer(client: TestClient) -> None:
    x = np.array([5], np.uint8)
    header = {"inputs": [json_input("X", x)]}
    response = client.post("/v2/models/onnx.BitwiseNot-18/versions/1/infer", json=header)
    assert_bits_equal(output_array(response), ~x)


def test_the_framework_serves_the_infer_routes_without_the_fast_path() -> None:
    # The app serves v2_infer.ROUTES ahead of the framework (api/fastpath.py) and lists the same
    # routes in the framework's route table: without that layer they still answer, the same way.
    app = create_app(Settings(backend="numpy", cpu_threads=2))
    app.user_middleware[:] = [m for m in app.user_middleware if m.cls is not FAST_PATH]
    with TestClient(app) as twin:
        x = np.array([5, 250], np.uint8)
        assert_bits_equal(output_array(infer_binary(twin, NOT, {"InputTensor": x})), ~x)
        header = {"inputs": [json_input("X", x)]}
        response = twin.post("/v2/models/onnx.BitwiseNot-18/versions/1/infer", json=header)
        assert_bits_equal(output_array(response), ~x)
        response = twin.post("/v2/models/onnx.BitwiseNot-18/versions/2/infer", json=header)
        assert "has no version '2'" in error_of(response, 404)
        admission = twin.app.state.runtime.plane.admission  # type: ignore[attr-defined]
        assert (admission.requests_in_flight, admission.bytes_in_flight) == (0, 0)


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_compressed_bodies(client: TestClient, encoding: str, compress: Any) -> None:
    """The header length counts bytes of the decompressed body, as Triton's does."""
    x = np.arange(1000, dtype=np.uint32)
    body, headers = framed({"inputs": [binary_input("InputTensor", x)]}, x.tobytes())
    response = client.post(
        f"/v2/models/{NOT}/infer",
        content=compress(body),
        headers={**headers, "Content-Encoding": encoding},
    )
    assert_bits_equal(output_array(response), ~x)


def test_no_content_type_needed(client: TestClient) -> None:
    x = np.array([3], np.uint8)
    body, headers = framed({"inputs": [binary_input("InputTensor", x)]}, x.tobytes())
    request = client.build_request("POST", f"/v2/models/{NOT}/infer", content=body, headers=headers)
    assert "content-type" not in request.headers
    assert_bits_equal(output_array(client.send(request)), ~x)


@pytest.mark.parametrize("pad", range(8))
def test_inputs_at_any_alignment(client: TestClient, pad: int) -> None:
    """The header's length puts the first input at any offset; misaligned views still work."""
    a, b = random_array(DataType.UINT64, (33,)), random_array(DataType.UINT64, (33,))
    header = {"inputs": [binary_input("A", a), binary_input("B", b)], "id": "x" * pad}
    body, headers = framed(header, a.tobytes(), b.tobytes())
    response = client.post(f"/v2/models/{AND}/infer", content=body, headers=headers)
    assert_bits_equal(output_array(response), a & b)


def test_broadcast_onnx(client: TestClient) -> None:
    a = random_array(DataType.INT32, (3, 1))
    b = random_array(DataType.INT32, (1, 4))
    response = infer_binary(client, "onnx.BitwiseXor-18", {"A": a, "B": b})
    assert_bits_equal(output_array(response), reference("onnx.BitwiseXor-18", {"A": a, "B": b}))
    assert output_array(response).shape == (3, 4)


def test_broadcast_openvino_pdpd(client: TestClient) -> None:
    a = random_array(DataType.UINT16, (2, 3, 4))
    b = random_array(DataType.UINT16, (3,))
    params = {"auto_broadcast": "pdpd", "axis": 1}
    response = infer_binary(client, "openvino.BitwiseAnd-13", {"input_1": a, "input_2": b}, params)
    want = reference("openvino.BitwiseAnd-13", {"input_1": a, "input_2": b}, params)
    assert_bits_equal(output_array(response), want)


def test_openvino_bool_is_logical(client: TestClient) -> None:
    header = {
        "inputs": [
            {
                "name": "input_1",
                "shape": [4],
                "datatype": "BOOL",
                "data": [True, False, True, False],
            }
        ]
    }
    response = client.post("/v2/models/openvino.BitwiseNot-13/infer", json=header)
    assert response.json()["outputs"][0]["data"] == [False, True, False, True]


def test_dml_feature_level_picks_the_table(client: TestClient) -> None:
    x = np.array([1, -2], np.int32)
    ok = infer_binary(client, NOT, {"InputTensor": x}, {"feature_level": "4_1"})
    assert_bits_equal(output_array(ok), ~x)
    refused = infer_binary(client, NOT, {"InputTensor": x}, {"feature_level": "3_0"})
    assert error_of(refused, 400) == (
        "InputTensor: data type INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_NOT at "
        "feature level 3_0 (allowed: UINT8, UINT16, UINT32)"
    )


def test_bit_count_output_type(client: TestClient) -> None:
    x = np.array([-1, 0, 5], np.int64)
    model = "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT"
    response = infer_json(client, model, {"InputTensor": x}, {"output_datatype": "UINT32"})
    output = response.json()["outputs"][0]
    assert (output["datatype"], output["data"]) == ("UINT32", [64, 0, 2])


def test_fp16_bits_pass_through_exactly(client: TestClient) -> None:
    """NaN payloads, signed zeros, denormals and infinities: bit-exact, both ways."""
    bits = np.array([0x7E01, 0xFC00, 0x8000, 0x0001, 0x7BFF, 0xFE5A], np.uint16)
    x = bits.view(np.float16)
    response = infer_binary(client, NOT, {"InputTensor": x})
    assert output_array(response).view(np.uint16).tolist() == (~bits).tolist()
    y = np.full(6, 0xFFFF, np.uint16).view(np.float16)  # NaN with every payload bit set
    response = infer_binary(
        client, "DML_OPERATOR_ELEMENT_WISE_BIT_AND", {"ATensor": x, "BTensor": y}
    )
    assert output_array(response).view(np.uint16).tolist() == bits.tolist()


def test_scalars_and_empty_tensors(client: TestClient) -> None:
    scalar = {"inputs": [{"name": "X", "shape": [], "datatype": "INT8", "data": [5]}]}
    output = client.post("/v2/models/onnx.BitwiseNot-18/infer", json=scalar).json()["outputs"][0]
    assert (output["shape"], output["data"]) == ([], [-6])
    empty = np.zeros((2, 0), np.uint8)
    response = infer_binary(client, "openvino.BitwiseNot-13", {"input_1": empty})
    assert output_array(response).shape == (2, 0)
    output = infer_json(client, "openvino.BitwiseNot-13", {"input_1": empty}).json()["outputs"][0]
    assert (output["shape"], output["data"]) == ([2, 0], [])


def test_large_tensors_take_the_worker_thread_path(client: TestClient) -> None:
    x = random_array(DataType.UINT32, (3 << 18,))  # 3 MiB in, 3 MiB out: past the inline bound
    response = infer_binary(client, NOT, {"InputTensor": x})
    assert_bits_equal(output_array(response), ~x)
    big_json = random_array(DataType.UINT8, (40_000,))  # about 150 KiB of JSON
    assert_bits_equal(output_array(infer_json(client, NOT, {"InputTensor": big_json})), ~big_json)


def test_admission_is_released_after_each_request(client: TestClient) -> None:
    admission = client.app.state.runtime.plane.admission  # type: ignore[attr-defined]
    x = np.arange(100, dtype=np.uint8)
    infer_binary(client, NOT, {"InputTensor": x})
    infer_json(client, NOT, {"InputTensor": x})
    nan = np.zeros(1, np.float32)  # NOT of +0.0 is a NaN: JSON refuses it after the run
    error_of(infer_json(client, NOT, {"InputTensor": nan}), 400)
    assert (admission.requests_in_flight, admission.bytes_in_flight) == (0, 0)


class _DeviceLike:
    """A backend that is not NumPy (as CuPy is not): its arrays are copies, results come back
    through ``to_host(result, out)``. Exercises execute()'s device path without a GPU."""

    name = "device-like"
    host_memory = False

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.copies_in = 0

    def asarray(self, host: Arr) -> Arr:
        self.copies_in += 1
        return np.array(host, copy=True)

    def to_host(self, array: Arr, out: Arr | None = None) -> Arr:
        assert out is not None
        np.copyto(out, array)
        return out

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Arr:
        return np.empty(shape, dtype)

    def run(self, call: Any, inputs: Any, out: Arr) -> None:
        self.inner.run(call, inputs, out)


@pytest.mark.parametrize("binary", [True, False])
def test_non_numpy_backends_copy_back_into_the_response(numpy_backend: Any, binary: bool) -> None:
    a, b = random_array(DataType.UINT32, (5, 3)), random_array(DataType.UINT32, (3,))
    header = {
        "inputs": [binary_input("A", a), binary_input("B", b)],
        "parameters": {"binary_data_output": binary},
    }
    body, headers = framed(header, a.tobytes(), b.tobytes())
    plane = data_plane(Settings(backend="numpy"), backend=numpy_backend)
    plan = rest_infer.plan(plane, get_operator(AND), bytearray(body), int(headers[HEADER]))
    backend = _DeviceLike(numpy_backend)
    encoded = rest_infer.encode(plan, backend)  # type: ignore[arg-type]
    assert backend.copies_in == 2
    raw = b"".join(encoded.parts)
    if binary:
        length = encoded.header_length
        assert length is not None
        got = np.frombuffer(raw[length:], np.uint32).reshape(5, 3)
    else:
        got = np.array(json.loads(raw)["outputs"][0]["data"], np.uint32).reshape(5, 3)
    assert_bits_equal(got, a & b)
