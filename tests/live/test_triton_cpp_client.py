"""Answers read the way Triton's C++ client library reads them (the library perf_analyzer and
every C++ client link), its parsing written out here from its source (``http_client.cc``'s and
``grpc_client.cc``'s ``InferResult*`` constructors, perf_analyzer's stream callback), since the
library itself needs a newer C runtime than this platform's:

* HTTP: an output that has ``parameters`` is binary data, and must carry ``binary_data_size``
  (else "attempt to access non-existing object member 'binary_data_size'"); so an output written
  into shared memory must come back with neither ``parameters`` nor ``data``, as Triton's does;
* gRPC: the i-th output's bytes are ``raw_output_contents[i]``, read without a bounds check, so
  there is one entry per output, empty for one in shared memory (perf_analyzer crashed without);
* a stream's answer is final unless ``triton_final_response`` says false; perf_analyzer counts a
  request done at its final answer, and counts down its requests in flight at every final one.

The server runs with ``TENSORBITS_SHARED_MEMORY_PREFIX=/``, the setting perf_analyzer's
``--shared-memory system`` needs: its region keys are ``/<tensor name>...``."""

from __future__ import annotations

import json
import os
import queue
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from support.grpc_live import GrpcServer, serve_grpc
from tritonclient.grpc import service_pb2

pytestmark = pytest.mark.integration

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
X = np.arange(64, dtype=np.uint8)


class CppClientError(Exception):
    """Where Triton's C++ client would report an error, or crash."""


# --- the C++ client's parsing, in Python -----------------------------------------------------------


def cpp_http_result(status: int, body: bytes, header_length: str | None) -> dict[str, Any]:
    """``InferResultHttp``'s constructor: the JSON is the first ``Inference-Header-Content-Length``
    bytes of the body (all of it without the header); a non-200 answer's ``error`` is the error;
    then, per output in order, one with ``parameters`` takes the next ``binary_data_size`` bytes
    after the JSON, one with ``data`` is JSON, and one with neither has no bytes (None)."""
    offset = int(header_length) if header_length is not None else 0
    document = json.loads(body[:offset] if offset else body)
    if status != 200:
        raise CppClientError(document.get("error", "inference failed with unknown error"))
    found: dict[str, Any] = {}
    for output in document.get("outputs", []):
        if "parameters" in output:
            size = output["parameters"].get("binary_data_size")
            if not isinstance(size, int) or size < 0:  # TritonJson's MemberAsUInt
                raise CppClientError(
                    "attempt to access non-existing object member 'binary_data_size'"
                )
            found[output["name"]] = body[offset : offset + size]
            offset += size
        elif "data" in output:
            found[output["name"]] = output["data"]
        else:
            found[output["name"]] = None
    return found


class CppGrpcResult(NamedTuple):
    error: str  # RequestStatus: an empty message is success
    buffers: dict[str, bytes]
    final: bool
    null: bool  # no outputs, and final: perf_analyzer's "null response"
    id: str


def cpp_grpc_result(response: Any, error: str = "") -> CppGrpcResult:
    """``InferResultGrpc``'s constructor, for a ``ModelInferResponse`` (or the ``infer_response``
    of a stream's answer, with its ``error_message``): output i's bytes are
    ``raw_output_contents[i]``, indexed unchecked (here a CppClientError: the C++ reads past the
    end); final unless ``triton_final_response`` says otherwise."""
    buffers = {}
    for index, output in enumerate(response.outputs):
        if index >= len(response.raw_output_contents):
            raise CppClientError(f"raw_output_contents[{index}] read out of bounds")
        buffers[output.name] = response.raw_output_contents[index]
    final = True
    if "triton_final_response" in response.parameters:
        final = response.parameters["triton_final_response"].bool_param
    return CppGrpcResult(error, buffers, final, not response.outputs and final, response.id)


class PerfAnalyzerContext:
    """perf_analyzer's ``InferContext::AsyncCallbackFuncImpl``: a response to a request it is
    waiting for is recorded, and the request is done at its final one; every final answer,
    whether or not its request was still awaited, takes one off the requests in flight."""

    def __init__(self) -> None:
        self.waiting: dict[str, int] = {}  # request id -> answers seen
        self.done: dict[str, int] = {}
        self.in_flight = 0

    def sent(self, request_id: str) -> None:
        self.waiting[request_id] = 0
        self.in_flight += 1

    def answered(self, result: CppGrpcResult) -> None:
        if result.error:
            raise CppClientError(result.error)
        if result.id in self.waiting:
            self.waiting[result.id] += 1
            if result.final:
                self.done[result.id] = self.waiting.pop(result.id)
        if result.final:
            self.in_flight -= 1


# --- the server, the regions ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    env = {"TENSORBITS_SHARED_MEMORY": "true", "TENSORBITS_SHARED_MEMORY_PREFIX": "/"}
    with serve_grpc(env) as running:
        yield running


class Regions:
    """perf_analyzer's layout: a region per tensor, keyed ``/<region name>``."""

    def __init__(self, server: GrpcServer) -> None:
        self.client = triton_http.InferenceServerClient(server.http.url)
        self.handles: list[Any] = []

    def make(self, name: str, byte_size: int) -> Any:
        key = f"/{name}_{os.getpid()}"  # outside the default prefix, /tensorbits
        handle = shm.create_shared_memory_region(name, key, byte_size)
        self.handles.append(handle)
        self.client.register_system_shared_memory(name, key, byte_size)
        return handle

    def close(self) -> None:
        self.client.unregister_system_shared_memory()
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)
        self.client.close()


@pytest.fixture
def regions(server: GrpcServer) -> Iterator[Regions]:
    made = Regions(server)
    yield made
    made.close()


def _shared(name: str, nbytes: int) -> dict[str, Any]:
    return {"shared_memory_region": name, "shared_memory_byte_size": nbytes}


def _post(server: GrpcServer, document: dict[str, Any]) -> tuple[int, bytes, str | None]:
    request = urllib.request.Request(
        f"{server.http.base_url}/v2/models/{NOT}/infer",
        data=json.dumps(document).encode(),
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            header = response.headers.get("Inference-Header-Content-Length")
            return response.status, response.read(), header
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), None


# --- HTTP ------------------------------------------------------------------------------------------


def test_http_outputs_as_the_cpp_client_reads_them(server: GrpcServer, regions: Regions) -> None:
    source = regions.make("InputTensor", X.nbytes)
    sink = regions.make("OutputTensor", X.nbytes)
    shm.set_shared_memory_region(source, [X])
    tensor = {"name": "InputTensor", "shape": [64], "datatype": "UINT8"}
    shared_in = {**tensor, "parameters": _shared("InputTensor", X.nbytes)}
    # Output into shared memory: no parameters, no data, no bytes after the JSON.
    status, body, header = _post(
        server,
        {
            "inputs": [shared_in],
            "outputs": [{"name": "OutputTensor", "parameters": _shared("OutputTensor", 64)}],
        },
    )
    assert cpp_http_result(status, body, header) == {"OutputTensor": None}
    np.testing.assert_array_equal(shm.get_contents_as_numpy(sink, np.uint8, [64]), ~X)
    # The other forms beside it: binary data (parameters with binary_data_size), JSON data.
    status, body, header = _post(
        server,
        {
            "inputs": [shared_in],
            "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}],
        },
    )
    assert cpp_http_result(status, body, header) == {"OutputTensor": (~X).tobytes()}
    status, body, header = _post(server, {"inputs": [shared_in]})
    assert cpp_http_result(status, body, header) == {"OutputTensor": (~X).tolist()}
    # A refusal: the C++ client's error is the body's "error".
    status, body, header = _post(server, {"inputs": [{**tensor, "data": [0]}]})
    with pytest.raises(CppClientError, match="InputTensor"):
        cpp_http_result(status, body, header)


# --- gRPC ------------------------------------------------------------------------------------------


def _grpc_inputs(shared: bool) -> list[Any]:
    tensor = triton_grpc.InferInput("InputTensor", [64], "UINT8")
    if shared:
        tensor.set_shared_memory("InputTensor", X.nbytes)
    else:
        tensor.set_data_from_numpy(X)
    return [tensor]


def _grpc_output(shared: bool) -> list[Any]:
    output = triton_grpc.InferRequestedOutput("OutputTensor")
    if shared:
        output.set_shared_memory("OutputTensor", X.nbytes)
    return [output]


@pytest.mark.parametrize("output_shared", [True, False])
def test_grpc_outputs_as_the_cpp_client_reads_them(
    server: GrpcServer, regions: Regions, output_shared: bool
) -> None:
    source = regions.make("InputTensor", X.nbytes)
    sink = regions.make("OutputTensor", X.nbytes)
    shm.set_shared_memory_region(source, [X])
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    result = client.infer(NOT, _grpc_inputs(True), outputs=_grpc_output(output_shared))
    client.close()
    parsed = cpp_grpc_result(result.get_response())
    assert parsed.error == ""
    if output_shared:
        assert parsed.buffers == {"OutputTensor": b""}  # its entry, empty
        np.testing.assert_array_equal(shm.get_contents_as_numpy(sink, np.uint8, [64]), ~X)
    else:
        assert parsed.buffers == {"OutputTensor": (~X).tobytes()}


def test_a_stream_as_perf_analyzer_counts_it(server: GrpcServer, regions: Regions) -> None:
    # perf_analyzer --streaming --shared-memory system: each request asks for the empty final
    # response (its default); every request must be done exactly once, with one answer, and the
    # count in flight must come back to zero, never below.
    source = regions.make("InputTensor", X.nbytes)
    regions.make("OutputTensor", X.nbytes)
    shm.set_shared_memory_region(source, [X])
    answers: queue.Queue[Any] = queue.Queue()
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    context = PerfAnalyzerContext()
    count = 12
    for i in range(count):
        context.sent(str(i))
        client.async_stream_infer(
            NOT, _grpc_inputs(i % 2 == 0), outputs=_grpc_output(i % 3 == 0), request_id=str(i),
            enable_empty_final_response=True,
        )  # fmt: skip
    for _ in range(count):
        result, error = answers.get(timeout=10)
        assert error is None, error
        context.answered(cpp_grpc_result(result.get_response()))
    client.stop_stream()
    client.close()
    assert answers.empty()
    assert context.done == {str(i): 1 for i in range(count)}
    assert context.in_flight == 0


def test_a_stream_s_error_as_the_cpp_client_reads_it(server: GrpcServer) -> None:
    request = service_pb2.ModelInferRequest(model_name="nope", id="7")
    with triton_grpc.InferenceServerClient(server.grpc_url) as client:
        (answer,) = client._client_stub.ModelStreamInfer(iter([request]), timeout=30)
    parsed = cpp_grpc_result(answer.infer_response, answer.error_message)
    assert parsed.error.startswith("unknown model or operator 'nope'")
    assert parsed.id == "7"  # the failed request is named
    with pytest.raises(CppClientError, match="unknown model"):
        PerfAnalyzerContext().answered(parsed)
