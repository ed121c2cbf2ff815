"""What the clients send and how they read what comes back, offline (httpx.MockTransport).

Request bodies are decoded with the server's own codec, so the two halves of the framing are
checked against each other."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from fake_server import FakeServer, json_error

from tensorbits_client import (
    APIConnectionError,
    APIResponseValidationError,
    AsyncClient,
    Client,
    LocalValidationError,
    NotFoundError,
)
from tensorbits_client._codec import Framed, FramingError
from tensorbits_client._constants import DEFAULT_TIMEOUT
from tensorbits_client._streaming import BodySink, iter_parts
from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import DataType, from_numpy, numpy_dtype
from tensorbits_protocol.v2 import InferenceRequest


def binary_response(model: str, outputs: dict[str, np.ndarray]) -> httpx.Response:
    """A response framed by the server's codec (the header padded for alignment, as it does)."""
    document = {
        "model_name": model,
        "outputs": [
            {
                "name": name,
                "shape": list(a.shape),
                "datatype": from_numpy(a.dtype).value,
                "parameters": {"binary_data_size": a.nbytes},
            }
            for name, a in outputs.items()
        ],
    }
    header = codec.dump_header(document)
    buffers = [np.ascontiguousarray(a).tobytes() for a in outputs.values()]
    content = header + b"".join(bytes(b) for b in buffers)
    headers = {
        "Content-Type": codec.BINARY_CONTENT_TYPE,
        codec.HEADER_LENGTH: str(len(header)),
    }
    return httpx.Response(200, content=content, headers=headers)


def decode_request(request: httpx.Request) -> tuple[InferenceRequest, dict[str, np.ndarray]]:
    """The inputs of a v2 request, decoded the way the server decodes them."""
    body = memoryview(request.content)
    length = codec.parse_header_length(request.headers.get(codec.HEADER_LENGTH), len(body))
    header, tail = codec.split_body(body, length)
    document = InferenceRequest.model_validate_json(bytes(header))
    frames = [
        codec.TensorFrame(
            t.name,
            DataType(t.datatype),
            tuple(t.shape),
            t.parameters.binary_data_size if t.parameters else None,
            has_data=t.data is not None,
        )
        for t in document.inputs
    ]
    slices = codec.slice_tensors(frames, tail, "m", header_given=length is not None)
    arrays = {}
    for frame, raw, tensor in zip(frames, slices, document.inputs, strict=True):
        dtype = numpy_dtype(frame.datatype)
        if raw is None:
            arrays[frame.name] = np.asarray(tensor.data, dtype=dtype).reshape(frame.shape)
        else:
            arrays[frame.name] = np.frombuffer(raw, dtype=dtype).reshape(frame.shape)
    return document, arrays


def echo_not(request: httpx.Request) -> httpx.Response:
    """A fake BIT_NOT model: answers ~input in binary."""
    _, arrays = decode_request(request)
    model = request.url.path.split("/")[3]
    (array,) = arrays.values()
    return binary_response(model, {"OutputTensor": ~array.view(f"u{array.dtype.itemsize}")})


# --- request building ---------------------------------------------------------------------------
def test_binary_request_round_trips_through_the_server_codec() -> None:
    server = FakeServer(lambda r: binary_response("x", {"C": np.zeros(3, np.int64)}))
    a = np.array([[1, -2, 3]], dtype=np.int64)
    b = np.array([[-1, 5, 2**62]], dtype=np.int64)
    with server.client() as client:
        client.onnx.bitwise_xor(a, b)
    (request,) = server.requests
    assert request.url.path == "/v2/models/onnx.BitwiseXor-18/infer"
    assert request.headers["Content-Type"] == "application/octet-stream"
    assert int(request.headers["Content-Length"]) == len(request.content)
    assert request.headers["Accept-Encoding"] == "identity"
    document, arrays = decode_request(request)
    assert document.parameters is not None
    assert document.parameters.binary_data_output is True
    np.testing.assert_array_equal(arrays["A"], a)
    np.testing.assert_array_equal(arrays["B"], b)


def test_json_request_and_response() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert codec.HEADER_LENGTH not in request.headers
        assert request.headers["Content-Type"] == "application/json"
        document = json.loads(request.content)
        assert document["inputs"][0]["data"] == [1, 2, 3, 4]
        assert "parameters" not in document  # nothing to say: no binary_data_output
        out = {"name": "Y", "shape": [2, 2], "datatype": "INT16", "data": [-2, -3, -4, -5]}
        return httpx.Response(200, json={"model_name": "onnx.BitwiseNot-18", "outputs": [out]})

    with FakeServer(handler).client() as client:
        result = client.infer(
            "onnx.BitwiseNot-18", {"X": np.arange(1, 5, dtype=np.int16).reshape(2, 2)}, binary=False
        )
    assert result.output.dtype == np.int16
    np.testing.assert_array_equal(result.output, [[-2, -3], [-4, -5]])


@pytest.mark.parametrize(
    "array",
    [
        np.arange(12, dtype=">u4").reshape(3, 4),  # big-endian: converted
        np.arange(24, dtype=np.uint16).reshape(4, 6)[::2, 1::2],  # strided: made contiguous
        np.asfortranarray(np.arange(6, dtype=np.uint8).reshape(2, 3)),
        np.array(7, dtype=np.uint64),  # 0-d
        np.zeros((0, 3), dtype=np.uint8),  # empty
    ],
)
def test_any_layout_is_sent_as_row_major_little_endian(array: np.ndarray) -> None:
    server = FakeServer(echo_not)
    with server.client() as client:
        out = client.openvino.bitwise_not(array)
    _, arrays = decode_request(server.requests[0])
    sent = arrays["input_1"]
    assert sent.shape == array.shape
    np.testing.assert_array_equal(sent, array)
    assert out.shape == array.shape


def test_sequence_inputs_take_the_operators_names() -> None:
    server = FakeServer(echo_not)
    with server.client() as client:
        client.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [np.arange(3, dtype=np.uint8)])
    _, arrays = decode_request(server.requests[0])
    assert list(arrays) == ["InputTensor"]


@pytest.mark.parametrize("shape", [(3,), (1,), (2, 2)])
def test_a_bare_array_is_the_one_input_of_a_unary_operator(shape: tuple[int, ...]) -> None:
    """As ``map`` takes it: the whole array is the input, not split into its rows."""
    array = np.arange(np.prod(shape), dtype=np.uint8).reshape(shape)
    server = FakeServer(echo_not)
    with server.client() as client:
        result = client.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", array)
    _, arrays = decode_request(server.requests[0])
    assert list(arrays) == ["InputTensor"]
    np.testing.assert_array_equal(arrays["InputTensor"], array)
    np.testing.assert_array_equal(result.output, ~array)

    async def run() -> np.ndarray:
        async with server.async_client() as client:
            return (await client.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", array)).output

    np.testing.assert_array_equal(asyncio.run(run()), ~array)


def test_a_bare_array_to_a_binary_operator_is_refused_by_count() -> None:
    server = FakeServer(echo_not)
    with server.client() as client, pytest.raises(LocalValidationError) as caught:
        client.infer("onnx.BitwiseAnd-18", np.zeros(2, np.uint8))
    assert caught.value.message.endswith("onnx.BitwiseAnd-18 takes 2 inputs (A, B), got 1")
    assert server.requests == []


@pytest.mark.parametrize(
    ("words", "grpc_port"),
    [
        ("illegal request line", True),  # h11: the answer's first byte begins no HTTP/1 line
        ("illegal status line: bytearray(b'\\x00\\x00\\x1e\\x04')", True),
        ("illegal status line: bytearray(b'SSH-2.0-OpenSSH_9.6')", False),
        ("Server disconnected without sending a response.", False),
    ],
)
def test_only_an_answer_of_http2_frames_is_taken_for_the_grpc_port(
    words: str, grpc_port: bool
) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError(words, request=request)

    http = httpx.Client(transport=httpx.MockTransport(broken))
    client = Client("http://tensorbits.test", http_client=http, max_retries=0)
    with client, pytest.raises(APIConnectionError) as caught:
        client.repository_index()
    assert ("is this the gRPC port?" in caught.value.reason) is grpc_port
    assert (words in caught.value.reason) is not grpc_port


def test_operator_tables_are_fetched_once_and_shared_with_copies() -> None:
    gets: list[str] = []

    def transport(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/operators":
            gets.append(request.url.path)
        return FakeServer(echo_not)(request)

    http = httpx.Client(transport=httpx.MockTransport(transport))
    with Client("http://tensorbits.test", http_client=http) as client:
        for _ in range(3):
            client.dml.bit_not(np.arange(3, dtype=np.uint8))
        client.with_options(timeout=5).dml.bit_not(np.arange(3, dtype=np.uint8))
        assert client.operators()["DML_OPERATOR_ELEMENT_WISE_BIT_NOT"].inputs == ("InputTensor",)
    assert gets == ["/v1/operators"]


def test_no_operator_tables_fetched_without_local_validation() -> None:
    server = FakeServer(echo_not)
    transport_calls: list[str] = []

    def transport(request: httpx.Request) -> httpx.Response:
        transport_calls.append(request.url.path)
        return server(request)

    http = httpx.Client(transport=httpx.MockTransport(transport))
    with Client("http://t.test", http_client=http, local_validation=False) as client:
        client.dml.bit_not(np.arange(3, dtype=np.uint8))
    assert transport_calls == ["/v2/models/DML_OPERATOR_ELEMENT_WISE_BIT_NOT/infer"]


def test_server_without_operator_listing_falls_back_to_bundled_tables() -> None:
    def transport(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/operators":
            return json_error(404, "no endpoint")
        return echo_not(request)

    http = httpx.Client(transport=httpx.MockTransport(transport))
    with Client("http://t.test", http_client=http) as client:
        with pytest.raises(LocalValidationError):
            client.dml.bit_not(np.arange(3, dtype=np.int32), feature_level="3_0")
        assert client._catalog.source == "bundled"


def test_unsendable_dtype_fails_locally_whatever_the_settings() -> None:
    client = FakeServer(echo_not).client(local_validation=False)
    with client, pytest.raises(LocalValidationError, match="X: dtype complex128"):
        client.onnx.bitwise_not(np.zeros(2, dtype=np.complex128))


# --- configuration ------------------------------------------------------------------------------
def test_base_url_argument_then_environment_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORBITS_URL", "http://from-env:9000")
    assert str(Client("http://arg:1").base_url) == "http://arg:1"
    assert str(Client().base_url) == "http://from-env:9000"
    monkeypatch.delenv("TENSORBITS_URL")
    assert str(Client().base_url) == "http://127.0.0.1:8000"


def test_base_url_with_a_path_prefix() -> None:
    server = FakeServer(echo_not)
    http = httpx.Client(transport=httpx.MockTransport(server))
    with Client("http://gw.test/tensorbits/", http_client=http) as client:
        client.dml.bit_not(np.arange(2, dtype=np.uint8))
    assert (
        server.requests[0].url.path
        == "/tensorbits/v2/models/DML_OPERATOR_ELEMENT_WISE_BIT_NOT/infer"
    )


def _timeouts(request: httpx.Request) -> dict[str, float | None]:
    timeouts: dict[str, float | None] = request.extensions["timeout"]
    return timeouts


def test_timeouts_default_per_call_and_with_options() -> None:
    server = FakeServer(echo_not)
    x = np.arange(2, dtype=np.uint8)
    with server.client() as client:
        client.dml.bit_not(x)
        client.dml.bit_not(x, timeout=2.5)
        client.dml.bit_not(x, timeout=None)
        client.with_options(timeout=httpx.Timeout(9, connect=1)).dml.bit_not(x)
    default, per_call, none, copied = (_timeouts(r) for r in server.requests)
    assert (
        default
        == DEFAULT_TIMEOUT.as_dict()
        == {"connect": 5.0, "read": 60.0, "write": 60.0, "pool": 60.0}
    )
    assert set(per_call.values()) == {2.5}
    assert set(none.values()) == {None}
    assert copied["connect"] == 1
    assert copied["read"] == 9


def test_with_options_shares_the_pool_and_does_not_close_it() -> None:
    client = Client("http://t.test", max_retries=5, default_headers={"X-A": "1"})
    copy = client.with_options(max_retries=0, default_headers={"X-B": "2"})
    assert copy._http is client._http
    assert (copy.max_retries, client.max_retries) == (0, 5)
    assert copy.default_headers == {"X-A": "1", "X-B": "2"}
    assert copy._catalog is client._catalog
    assert client.with_options(base_url="http://other.test")._catalog is not client._catalog
    copy.close()
    assert not client._http.is_closed
    client.close()
    assert client._http.is_closed


def test_injected_http_client_is_left_open() -> None:
    http = httpx.Client()
    with Client("http://t.test", http_client=http):
        pass
    assert not http.is_closed
    http.close()


def test_negative_max_retries_is_refused() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        Client("http://t.test", max_retries=-1)


def test_default_headers_are_sent() -> None:
    server = FakeServer(echo_not)
    with server.client(default_headers={"Authorization": "Bearer t"}) as client:
        client.dml.bit_not(np.arange(2, dtype=np.uint8))
    assert server.requests[0].headers["Authorization"] == "Bearer t"


# --- responses ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "array",
    [
        np.array([np.nan, -0.0, np.inf, 6.1e-5], dtype=np.float16),
        np.array([np.iinfo(np.int64).min, -1, np.iinfo(np.int64).max], dtype=np.int64),
        np.array([2**64 - 1, 2**63], dtype=np.uint64),
        np.array([[True, False], [False, True]]),
        np.array(3, dtype=np.int8),
        np.zeros((2, 0, 3), dtype=np.uint16),
    ],
)
def test_outputs_keep_dtype_shape_and_bits(array: np.ndarray) -> None:
    server = FakeServer(lambda r: binary_response("m", {"Y": array}))
    with server.client(local_validation=False) as client:
        out = client.infer("m", {"X": np.zeros(1, np.uint8)}).output
    assert out.dtype == array.dtype
    assert out.shape == array.shape
    assert out.tobytes() == array.tobytes()


def _root(array: np.ndarray) -> object:
    """What an array's memory ultimately belongs to (through views and memoryviews)."""
    owner: object = array
    while True:
        if isinstance(owner, np.ndarray) and owner.base is not None:
            owner = owner.base
        elif isinstance(owner, memoryview):
            owner = owner.obj
        else:
            return owner


def test_outputs_are_aligned_writable_views_of_one_buffer() -> None:
    a, b = np.arange(5, dtype=np.uint8), np.arange(7, dtype=np.uint64)
    server = FakeServer(lambda r: binary_response("m", {"A": a, "B": b}))
    with server.client(local_validation=False) as client:
        result = client.infer("m", {"X": np.zeros(1, np.uint8)})
    first, second = result.outputs["A"], result.outputs["B"]
    assert first.ctypes.data % 64 == 0
    assert first.flags.writeable
    assert second.flags.writeable
    # Both are views of the one buffer the body was read into.
    assert _root(first) is _root(second)
    np.testing.assert_array_equal(second, b)
    with pytest.raises(ValueError, match="2 outputs"):
        _ = result.output


@pytest.mark.parametrize(
    ("content", "header_length", "match"),
    [
        (
            b'{"model_name":"m","outputs":[{"name":"Y","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":3}}]}abc',
            100,
            "mismatch",
        ),
        (
            b'{"model_name":"m","outputs":[{"name":"Y","shape":[2],"datatype":"UINT8","parameters":{"binary_data_size":2}}]}abc',
            100,
            "additional",
        ),
        (
            b'{"model_name":"m","outputs":[{"name":"Y","shape":[4],"datatype":"UINT8","parameters":{"binary_data_size":4}}]}ab',
            100,
            "additional bytes",
        ),
        (b"not json at all", 8, "malformed"),
        (b"{}", 99, "should be in range"),  # the shared codec's check and message
    ],
)
def test_malformed_responses_raise_response_validation_error(
    content: bytes, header_length: int, match: str
) -> None:
    if header_length == 100:
        header_length = content.index(b"}]}") + 3
    response = httpx.Response(
        200, content=content, headers={codec.HEADER_LENGTH: str(header_length)}
    )
    client = FakeServer(lambda r: response).client(local_validation=False)
    with client, pytest.raises(APIResponseValidationError, match=match) as caught:
        client.infer("m", {"X": np.zeros(1, np.uint8)})
    assert caught.value.status_code == 200


# --- sync/async parity --------------------------------------------------------------------------
def _sync_requests(call: Any, handler: Any) -> tuple[list[httpx.Request], BaseException | None]:
    server = FakeServer(handler)
    error = None
    with server.client(max_retries=0) as client:
        try:
            call(client)
        except Exception as exc:
            error = exc
    return server.requests, error


def _async_requests(call: Any, handler: Any) -> tuple[list[httpx.Request], BaseException | None]:
    server = FakeServer(handler)

    async def main() -> BaseException | None:
        async with server.async_client(max_retries=0) as client:
            try:
                await call(client)
            except Exception as exc:
                return exc
        return None

    error = asyncio.run(main())
    return server.requests, error


x8 = np.arange(6, dtype=np.uint8).reshape(2, 3)
CALLS = {
    "dml.bit_count": lambda c: c.dml.bit_count(x8, output_datatype="UINT32", feature_level="5_0"),
    "dml.bit_shift_left": lambda c: c.dml.bit_shift_left(x8, x8, timeout=3),
    "openvino.right_shift": lambda c: c.openvino.right_shift(
        x8, x8[:1], auto_broadcast="pdpd", axis=0
    ),
    "onnx.bit_shift": lambda c: c.onnx.bit_shift(x8, x8, direction="RIGHT"),
    "infer.json": lambda c: c.infer("onnx.BitwiseAnd-18", [x8, x8], binary=False, request_id="7"),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_sync_and_async_send_the_same_request(name: str) -> None:
    call = CALLS[name]
    sync_requests, _ = _sync_requests(call, lambda r: binary_response("m", {"Y": x8}))
    async_requests, _ = _async_requests(call, lambda r: binary_response("m", {"Y": x8}))
    (s,), (a,) = sync_requests, async_requests
    assert (s.method, s.url, s.content) == (a.method, a.url, a.content)
    assert dict(s.headers) | {"user-agent": ""} == dict(a.headers) | {"user-agent": ""}
    assert s.extensions["timeout"] == a.extensions["timeout"]


@pytest.mark.parametrize(
    "respond",
    [
        lambda: json_error(400, "X: bad", code="invalid_request", field="X", rule="r"),
        lambda: json_error(404, "unknown model", code="not_found"),
        lambda: json_error(413, "too big", code="payload_too_large"),
        lambda: json_error(503, "busy", code="overloaded", retry_after="1"),
        lambda: httpx.Response(502, content=b"<html>bad gateway</html>"),
    ],
)
def test_sync_and_async_map_errors_alike(respond: Callable[[], httpx.Response]) -> None:
    def call(c: Any) -> Any:
        return c.infer("onnx.BitwiseNot-18", {"X": x8})

    _, sync_error = _sync_requests(call, lambda r: respond())
    _, async_error = _async_requests(call, lambda r: respond())
    assert type(sync_error) is type(async_error)
    assert str(sync_error) == str(async_error)
    for attribute in ("status_code", "code", "field", "rule", "body"):
        assert getattr(sync_error, attribute) == getattr(async_error, attribute)


def test_not_found_from_the_server_is_not_second_guessed() -> None:
    server = FakeServer(lambda r: json_error(404, "unknown model 'nope'", code="not_found"))
    with server.client() as client, pytest.raises(NotFoundError, match="unknown model 'nope'"):
        client.infer("nope", [x8])
    _, arrays = decode_request(server.requests[0])
    assert list(arrays) == ["input_0"]


def test_async_client_api_mirrors_the_sync_one() -> None:
    public = {n for n in dir(Client) if not n.startswith("_")}
    assert public == {n for n in dir(AsyncClient) if not n.startswith("_")}


# --- the transport's pieces ---------------------------------------------------------------------
def test_small_parts_are_coalesced_and_large_ones_sliced_without_copy() -> None:
    big = np.arange(3 << 20, dtype=np.uint8)
    body = Framed.framed(b"{}", [memoryview(b"ab"), big.data, memoryview(b"cd")])
    pieces = list(iter_parts(body, chunk=1 << 20))
    assert pieces[0] == b"{}ab"  # header and a tiny tensor in one write
    assert [len(p) for p in pieces[1:4]] == [1 << 20] * 3
    owner: object = big  # memoryview.obj is typed as a Buffer, which ndarray's stubs are not
    assert all(isinstance(p, memoryview) and p.obj is owner for p in pieces[1:4])
    assert pieces[4] == b"cd"
    assert b"".join(pieces) == b"{}ab" + big.tobytes() + b"cd"


def test_body_sink_without_a_length_still_aligns() -> None:
    sink = BodySink(None, header_length=5)
    for chunk in (b"hello", b"world", b"!"):
        sink.feed(chunk)
    body = sink.finish()
    assert body.buffer[body.start : body.end].tobytes() == b"helloworld!"
    assert (body.buffer.ctypes.data + body.start + 5) % 64 == 0


def test_body_sink_refuses_a_body_longer_or_shorter_than_declared() -> None:
    sink = BodySink(4, header_length=0)
    with pytest.raises(FramingError, match="longer"):
        sink.feed(b"12345")
    short = BodySink(4, header_length=0)
    short.feed(b"12")
    with pytest.raises(FramingError, match="ended after 2 of its 4"):
        short.finish()
