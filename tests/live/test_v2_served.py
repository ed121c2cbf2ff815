"""The real server over real sockets: the stock ``tritonclient.http`` client, unchanged, against
every model in JSON and binary; then raw sockets sending broken framing, after each of which the
server must still answer ``/v2/health/live``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from core.bitref import assert_bits_equal, reference
from support.framing import HEADER, framed
from support.live import LiveServer
from support.rawhttp import ask
from support.v2 import uint8_inputs
from tritonclient.utils import InferenceServerException

from tensorbits_protocol.operators import OPERATORS, OperatorSpec

pytestmark = pytest.mark.integration

RNG = np.random.default_rng(7)
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
Arr = np.ndarray[Any, Any]


@pytest.fixture(scope="module")
def client(live_server: LiveServer) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(live_server.url, network_timeout=30)
    yield c
    c.close()


def infer(
    client: triton.InferenceServerClient,
    model: str,
    arrays: dict[str, Arr],
    *,
    binary: bool,
    output: str | None,
    **kwargs: Any,
) -> Any:
    inputs = []
    for name, array in arrays.items():
        tensor = triton.InferInput(name, list(array.shape), triton_type(array))
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = None if output is None else [triton.InferRequestedOutput(output, binary_data=binary)]
    return client.infer(model, inputs, outputs=outputs, **kwargs)


def triton_type(array: Arr) -> str:
    from tritonclient.utils import np_to_triton_dtype

    name: str = np_to_triton_dtype(array.dtype)
    return name


# --- tritonclient ---------------------------------------------------------------------------------


def test_health_and_metadata(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "tensorbits"
    assert "binary_tensor_data" in metadata["extensions"]
    assert client.is_model_ready(NOT)
    assert client.is_model_ready(NOT, model_version="1")
    model = client.get_model_metadata(NOT)
    assert [t["name"] for t in model["inputs"]] == ["InputTensor"]
    index = client.get_model_repository_index()
    assert {m["name"] for m in index} == {op.name for op in OPERATORS}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("op", OPERATORS, ids=lambda op: op.name)
def test_every_model(client: triton.InferenceServerClient, op: OperatorSpec, binary: bool) -> None:
    arrays, params = uint8_inputs(op, RNG)
    result = infer(client, op.name, arrays, binary=binary, output=op.output, parameters=params)
    assert_bits_equal(result.as_numpy(op.output), reference(op.name, arrays, params))
    response = result.get_response()
    assert (response["model_name"], response["model_version"]) == (op.name, "1")


def test_default_outputs_come_back_binary(client: triton.InferenceServerClient) -> None:
    # With no outputs listed, tritonclient asks for binary_data_output: true.
    x = RNG.integers(0, 2**32, size=(4, 5), dtype=np.uint32)
    result = infer(client, NOT, {"InputTensor": x}, binary=True, output=None, request_id="r1")
    assert_bits_equal(result.as_numpy("OutputTensor"), ~x)
    assert result.get_response()["id"] == "r1"
    assert "binary_data_size" in result.get_output("OutputTensor")["parameters"]


def test_broadcast(client: triton.InferenceServerClient) -> None:
    a = RNG.integers(-(2**63), 2**63, size=(4, 1), dtype=np.int64)
    b = RNG.integers(-(2**63), 2**63, size=(1, 3), dtype=np.int64)
    result = infer(client, "onnx.BitwiseXor-18", {"A": a, "B": b}, binary=True, output="C")
    assert_bits_equal(result.as_numpy("C"), a ^ b)
    assert result.as_numpy("C").shape == (4, 3)


def test_fp16_bits_exact(client: triton.InferenceServerClient) -> None:
    bits = np.array([0x7E01, 0xFC00, 0x8000, 0x0001, 0x3C00, 0x7C00], np.uint16)
    result = infer(
        client, NOT, {"InputTensor": bits.view(np.float16)}, binary=True, output="OutputTensor"
    )
    assert result.as_numpy("OutputTensor").view(np.uint16).tolist() == (~bits).tolist()


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request(client: triton.InferenceServerClient, algorithm: str) -> None:
    x = np.arange(4096, dtype=np.uint16)
    result = infer(
        client, NOT, {"InputTensor": x}, binary=True, output="OutputTensor",
        request_compression_algorithm=algorithm,
    )  # fmt: skip
    assert_bits_equal(result.as_numpy("OutputTensor"), ~x)


def test_large_binary_round_trip(client: triton.InferenceServerClient) -> None:
    x = RNG.integers(0, 256, size=8 << 20, dtype=np.uint8)
    result = infer(client, NOT, {"InputTensor": x}, binary=True, output="OutputTensor")
    assert np.array_equal(result.as_numpy("OutputTensor"), ~x)


def test_dml_feature_level_rejection(client: triton.InferenceServerClient) -> None:
    x = np.array([1, 2], np.int32)
    with pytest.raises(InferenceServerException) as caught:
        infer(
            client, NOT, {"InputTensor": x}, binary=True, output="OutputTensor",
            parameters={"feature_level": "3_0"},
        )  # fmt: skip
    assert caught.value.status() == "400"
    assert caught.value.message() == (
        "InputTensor: data type INT32 is not supported by DML_OPERATOR_ELEMENT_WISE_BIT_NOT at "
        "feature level 3_0 (allowed: UINT8, UINT16, UINT32)"
    )


def test_unknown_model_and_version(client: triton.InferenceServerClient) -> None:
    x = np.array([1], np.uint8)
    with pytest.raises(InferenceServerException) as caught:
        infer(client, "nope", {"InputTensor": x}, binary=True, output=None)
    assert caught.value.status() == "404"
    with pytest.raises(InferenceServerException) as caught:
        infer(client, NOT, {"InputTensor": x}, binary=True, output=None, model_version="2")
    assert caught.value.status() == "404"
    assert "has no version '2'" in str(caught.value.message())
    result = infer(client, NOT, {"InputTensor": x}, binary=True, output=None, model_version="1")
    assert result.as_numpy("OutputTensor").tolist() == [254]


# --- raw sockets: broken framing --------------------------------------------------------------------


def exchange(
    server: LiveServer, head: str, body: bytes = b"", *, close_write: bool = False
) -> tuple[int | None, bytes]:
    """Send raw bytes; return the status and body of the answer (None: the server just closed)."""
    try:
        reply = ask(server, head.encode("latin-1") + body, timeout=15, close_write=close_write)
    except (ConnectionError, TimeoutError):
        return None, b""
    return reply.status, reply.body


def post_head(length: int, extra: dict[str, str] | None = None, model: str = NOT) -> str:
    lines = [
        f"POST /v2/models/{model}/infer HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Length: {length}",
    ]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return "\r\n".join(lines) + "\r\n\r\n"


X = np.arange(8, dtype=np.uint32)
BINARY = {
    "inputs": [
        {
            "name": "InputTensor",
            "shape": [8],
            "datatype": "UINT32",
            "parameters": {"binary_data_size": 32},
        }
    ]
}


@pytest.fixture
def still_live(live_server: LiveServer) -> Iterator[LiveServer]:
    yield live_server
    assert live_server.get("/v2/health/live") == 200


def test_truncated_body(still_live: LiveServer) -> None:
    body, headers = framed(BINARY, X.tobytes())
    head = post_head(len(body) + 1000, headers)
    status, answer = exchange(still_live, head, body, close_write=True)
    # The client is gone before its body is complete: a 400, or just a closed connection.
    assert status in (None, 400), answer


@pytest.mark.parametrize(
    ("tail", "length", "status", "words"),
    [
        (X.tobytes(), "100000", 400, b"inference header size should be in range"),
        (X.tobytes(), "12", 400, b"malformed JSON"),
        (X.tobytes(), "zero", 400, b"Unable to parse Inference-Header-Content-Length"),
        (X.tobytes()[:-4], None, 400, b"expecting 4 additional bytes"),
        (X.tobytes() + b"\0" * 4, None, 400, b"unexpected additional input data"),
    ],
    ids=["header-past-body", "header-inside-json", "header-not-a-number", "short", "leftover"],
)
def test_broken_framing(
    still_live: LiveServer, tail: bytes, length: str | None, status: int, words: bytes
) -> None:
    body, headers = framed(BINARY, tail)
    if length is not None:
        headers[HEADER] = length
    head = post_head(len(body), headers)
    got, answer = exchange(still_live, head, body)
    assert got == status, answer
    assert words in answer, answer


def test_huge_shape(still_live: LiveServer) -> None:
    header = {"inputs": [{"name": "InputTensor", "shape": [2**40, 2**40], "datatype": "UINT8",
                          "parameters": {"binary_data_size": 8}}]}  # fmt: skip
    body, headers = framed(header, b"\0" * 8)
    status, answer = exchange(still_live, post_head(len(body), headers), body)
    assert status == 413, answer
    assert b"elements, more than the limit" in answer, answer


def test_ten_gib_content_length_is_refused_unread(still_live: LiveServer) -> None:
    status, answer = exchange(still_live, post_head(10 << 30))  # the body is never sent
    assert status == 413, answer
    assert b"exceeds the limit" in answer, answer


def test_garbage_request_line(still_live: LiveServer) -> None:
    status, _ = exchange(still_live, "NOT AN HTTP REQUEST\r\n\r\n")
    assert status in (None, 400)


def test_chunked_body(still_live: LiveServer) -> None:
    body, headers = framed(BINARY, X.tobytes())
    chunks = b"".join(
        b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7]) for i in range(0, len(body), 7)
    )
    head = (
        f"POST /v2/models/{NOT}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
        f"{HEADER}: {headers[HEADER]}\r\n\r\n"
    )
    status, answer = exchange(still_live, head, chunks + b"0\r\n\r\n")
    assert status == 200, answer
    # No output asked for as binary: the protocol's default, JSON.
    assert json.loads(answer)["outputs"][0]["data"] == (~X).tolist()
