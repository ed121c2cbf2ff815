"""The gRPC endpoint of a real server, driven by the stock ``tritonclient.grpc``, unchanged: every
model with raw and with typed contents, the protocol's corners (broadcast, FP16 bits, 64-bit
values, BOOL), refusals with their words and status codes, and the hostile cases of the HTTP
side where they apply. After each refusal the server still answers; no call gets INTERNAL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from core.bitref import assert_bits_equal, reference
from grpc_health.v1 import health_pb2
from support.grpc_live import GrpcServer, health_check
from support.v2 import uint8_inputs
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tensorbits_protocol.operators import OPERATORS, OperatorSpec

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(11)
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
XOR = "onnx.BitwiseXor-18"
Arr = np.ndarray[Any, Any]
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def channel(grpc_server: GrpcServer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(
        grpc_server.grpc_url, options=[("grpc.max_send_message_length", -1)]
    ) as c:
        yield c


def infer(
    client: triton.InferenceServerClient,
    model: str,
    arrays: dict[str, Arr],
    *,
    typed: bool = False,
    **kwargs: Any,
) -> triton.InferResult:
    """An inference as a tritonclient user writes it: raw contents (set_data_from_numpy), or
    typed contents (the request's InferTensorContents filled by hand: tritonclient has no helper)."""
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if not typed:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    if not typed:
        return client.infer(model, inputs, **kwargs)
    # tritonclient sends typed contents only through its request message: build it the same way.
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in arrays.items():
        tensor = request.inputs.add(
            name=name, datatype=np_to_triton_dtype(array.dtype), shape=list(array.shape)
        )
        field = {"b": "bool_contents", "u": "uint_contents", "i": "int_contents"}[array.dtype.kind]
        if array.dtype.itemsize == 8:
            field = {"u": "uint64_contents", "i": "int64_contents"}[array.dtype.kind]
        getattr(tensor.contents, field).extend(array.ravel().tolist())
    for key, value in kwargs.get("parameters", {}).items():
        request.parameters[key].string_param = value
    response = client._client_stub.ModelInfer(request)  # the stock stub tritonclient calls
    return triton.InferResult(response)


def refused(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    assert caught.value.status() != "StatusCode.INTERNAL"
    return caught.value


# --- health, metadata, repository ------------------------------------------------------------------


def test_health_and_metadata(grpc_client: triton.InferenceServerClient) -> None:
    assert grpc_client.is_server_live()
    assert grpc_client.is_server_ready()
    assert grpc_client.is_model_ready(NOT)
    assert grpc_client.is_model_ready(NOT, model_version="1")
    metadata = grpc_client.get_server_metadata()
    assert metadata.name == "tensorbits"
    assert "binary_tensor_data" in metadata.extensions
    model = grpc_client.get_model_metadata(NOT)
    assert (model.name, list(model.versions)) == (NOT, ["1"])
    assert [t.name for t in model.inputs] == ["InputTensor"]
    assert [t.name for t in model.outputs] == ["OutputTensor"]
    index = grpc_client.get_model_repository_index()
    assert {m.name for m in index.models} == {op.name for op in OPERATORS}
    assert {m.state for m in index.models} == {"READY"}


def test_unknown_model_and_version(grpc_client: triton.InferenceServerClient) -> None:
    error = refused(lambda: grpc_client.is_model_ready("nope"))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "unknown model or operator 'nope'" in str(error.message())
    error = refused(lambda: grpc_client.get_model_metadata(NOT, model_version="2"))
    assert error.status() == "StatusCode.NOT_FOUND"
    assert "has no version '2'" in str(error.message())
    x = np.array([1], np.uint8)
    error = refused(lambda: infer(grpc_client, "nope", {"InputTensor": x}))
    assert error.status() == "StatusCode.NOT_FOUND"


def test_health_service(grpc_server: GrpcServer, channel: grpc.Channel) -> None:
    check = health_check(channel)
    for service in ("", "inference.GRPCInferenceService"):
        answer = check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as caught:
        check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_unload_and_load(grpc_client: triton.InferenceServerClient) -> None:
    model = "openvino.BitwiseOr-13"
    grpc_client.unload_model(model)
    try:
        assert not grpc_client.is_model_ready(model)
        states = {m.name: m.state for m in grpc_client.get_model_repository_index().models}
        assert states[model] == "UNAVAILABLE"
        x = np.ones(3, np.uint8)
        error = refused(lambda: infer(grpc_client, model, {"A": x, "B": x}))
        assert error.status() == "StatusCode.FAILED_PRECONDITION"
        assert "unloaded" in str(error.message())
    finally:
        grpc_client.load_model(model)
    assert grpc_client.is_model_ready(model)


# --- inference ------------------------------------------------------------------------------------


@pytest.mark.parametrize("typed", [False, True], ids=["raw", "typed"])
@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_model(
    grpc_client: triton.InferenceServerClient, op: OperatorSpec, typed: bool
) -> None:
    arrays, params = uint8_inputs(op, RNG)
    result = infer(grpc_client, op.name, arrays, typed=typed, parameters=params)
    assert_bits_equal(result.as_numpy(op.output), reference(op.name, arrays, params))
    response = result.get_response()
    assert (response.model_name, response.model_version) == (op.name, "1")


def test_request_id_echoed(grpc_client: triton.InferenceServerClient) -> None:
    x = RNG.integers(0, 2**32, size=(4, 5), dtype=np.uint32)
    result = infer(grpc_client, NOT, {"InputTensor": x}, request_id="r1")
    assert_bits_equal(result.as_numpy("OutputTensor"), ~x)
    assert result.get_response().id == "r1"


def test_broadcast_and_64_bit_values(grpc_client: triton.InferenceServerClient) -> None:
    a = RNG.integers(-(2**63), 2**63, size=(4, 1), dtype=np.int64)
    b = RNG.integers(-(2**63), 2**63, size=(1, 3), dtype=np.int64)
    for typed in (False, True):
        result = infer(grpc_client, XOR, {"A": a, "B": b}, typed=typed)
        assert_bits_equal(result.as_numpy("C"), a ^ b)
    u = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    result = infer(grpc_client, "onnx.BitwiseNot-18", {"X": u}, typed=True)
    assert_bits_equal(result.as_numpy("Y"), ~u)


def test_fp16_bits_exact(grpc_client: triton.InferenceServerClient) -> None:
    bits = np.array([0x7E01, 0xFC00, 0x8000, 0x0001, 0x3C00, 0x7C00], np.uint16)
    result = infer(grpc_client, NOT, {"InputTensor": bits.view(np.float16)})
    assert result.as_numpy("OutputTensor").view(np.uint16).tolist() == (~bits).tolist()


def test_bool(grpc_client: triton.InferenceServerClient) -> None:
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    for typed in (False, True):
        result = infer(
            grpc_client, "openvino.BitwiseXor-13", {"input_1": a, "input_2": b}, typed=typed
        )
        assert result.as_numpy("output_1").tolist() == (a ^ b).tolist()


def test_feature_level_rejection(grpc_client: triton.InferenceServerClient) -> None:
    x = np.array([1, 2], np.int32)
    error = refused(
        lambda: infer(grpc_client, NOT, {"InputTensor": x}, parameters={"feature_level": "3_0"})
    )
    assert error.status() == "StatusCode.INVALID_ARGUMENT"
    # The HTTP side's words, exactly (tests/live/test_v2_served.py).
    assert error.message() == (
        "InputTensor: data type INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_NOT at "
        "feature level 3_0 (allowed: UINT8, UINT16, UINT32)"
    )


def test_large_raw_round_trip(grpc_client: triton.InferenceServerClient) -> None:
    x = RNG.integers(0, 256, size=8 << 20, dtype=np.uint8)
    result = infer(grpc_client, NOT, {"InputTensor": x})
    assert np.array_equal(result.as_numpy("OutputTensor"), ~x)


# --- refusals and hostile calls ---------------------------------------------------------------------


def raw_call(channel: grpc.Channel, request: bytes, method: str = INFER) -> grpc.RpcError:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value


def test_lying_shapes(grpc_client: triton.InferenceServerClient, channel: grpc.Channel) -> None:
    request = service_pb2.ModelInferRequest(model_name=NOT)
    request.inputs.add(name="InputTensor", datatype="UINT32", shape=[4])
    request.raw_input_contents.append(b"\x00" * 12)  # 3 elements' bytes for 4
    error = raw_call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == (
        "input 'InputTensor': raw_input_contents[0] has 12 bytes, UINT32 [4] needs 16"
    )
    metadata = {item.key: str(item.value) for item in error.trailing_metadata() or ()}
    assert metadata["tensorbits-error-field"] == "InputTensor"
    assert metadata["tensorbits-error-rule"] == "binary_data_size"
    request.inputs[0].contents.uint_contents.extend([1, 2, 3, 4])  # both raw and typed
    error = raw_call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "contents must not be given" in str(error.details())
    assert grpc_client.is_server_live()


@pytest.mark.parametrize(
    ("contents", "words"),
    [
        ({"int_contents": [1, 2]}, "UINT8 values go in contents.uint_contents"),
        ({"uint_contents": [1, 2, 3]}, "has 3 values, shape [2] has 2 elements"),
        ({"uint_contents": [1, 256]}, "256"),
    ],
    ids=["wrong field", "wrong count", "out of range"],
)
def test_typed_contents_refused(
    channel: grpc.Channel, contents: dict[str, list[int]], words: str
) -> None:
    request = service_pb2.ModelInferRequest(model_name=NOT)
    tensor = request.inputs.add(name="InputTensor", datatype="UINT8", shape=[2])
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    error = raw_call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in str(error.details())


def test_malformed_messages(
    grpc_client: triton.InferenceServerClient, channel: grpc.Channel
) -> None:
    for garbage in (b"\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x3a\x05ab", b"\x00\x00"):
        error = raw_call(channel, garbage)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, garbage
        assert "malformed ModelInferRequest" in str(error.details())
    error = raw_call(channel, b"\xff", "/inference.GRPCInferenceService/ModelMetadata")
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_client.is_server_live()


def test_too_many_tensors(channel: grpc.Channel) -> None:
    request = service_pb2.ModelInferRequest(model_name=NOT)
    for _ in range(100_000):  # empty entries: a small message listing very many tensors
        request.raw_input_contents.append(b"")
    error = raw_call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "TENSORBITS_MAX_TENSORS" in str(error.details())


def test_oversized_message(grpc_server: GrpcServer, channel: grpc.Channel) -> None:
    # The default body limit is 64 MiB; grpcio refuses a longer message before the handler.
    request = service_pb2.ModelInferRequest(model_name=NOT)
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[65 << 20])
    request.raw_input_contents.append(bytes(65 << 20))
    error = raw_call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_server.http.get("/v2/health/live") == 200


def test_element_limit(channel: grpc.Channel) -> None:
    # A shape of 2^40 elements with no data: refused on the shape, before anything is read.
    request = service_pb2.ModelInferRequest(model_name=NOT)
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[1 << 20, 1 << 20])
    request.raw_input_contents.append(b"")
    error = raw_call(channel, request.SerializeToString())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "TENSORBITS_MAX_TENSOR_ELEMENTS" in str(error.details())


def test_unknown_rpc_is_unimplemented(channel: grpc.Channel) -> None:
    error = raw_call(channel, b"", "/inference.GRPCInferenceService/ModelDecoupledInfer")
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
