"""Graph models on a real server, more of the protocol: inferences over gRPC's ModelStreamInfer
with the stock ``tritonclient.grpc`` stream (several outputs, chosen or all, compared with ONNX
Runtime byte for byte; a refusal in the stream, which goes on), and the HTTP load route's body
read under TENSORBITS_TIMEOUT_BODY_READ as an inference body is (a stalled body: 408, nothing
loaded, others served meanwhile)."""

from __future__ import annotations

import base64
import json
import queue
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from core.graph_models import several_outputs_model
from live.test_graph_models_served import CONFIG, MODEL_FILE, assert_identical, expected
from support.grpc_live import GrpcServer, serve_grpc
from support.live import serve
from support.rawhttp import read_response
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

MASK = np.array([0xFFFF0000, 0x0F0F0F0F, 0xFFFFFFFF, 0, 0x12345678, 0x80000001], np.uint32)
VALUE = np.array([7], np.uint32)
MODEL = several_outputs_model(MASK, VALUE)
OUTPUTS = ("b", "b_copy", "a", "not_b", "x_again")
Answer = tuple[triton_grpc.InferResult | None, InferenceServerException | None]


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc() as running:
        client = triton_grpc.InferenceServerClient(running.grpc_url)
        client.load_model("several", config=CONFIG, files={MODEL_FILE: MODEL})
        client.close()
        yield running


def _x(i: int) -> np.ndarray[Any, Any]:
    return (np.arange(6, dtype=np.uint32) * 0x01010101 * (i + 3)) ^ np.uint32(i)


def test_a_stream_of_graph_inferences_with_several_outputs(server: GrpcServer) -> None:
    """Every output, then chosen ones in the order asked, then an unknown output refused in the
    stream in the operators' words; each answer in order, the stream going on after the
    refusal."""
    answers: queue.Queue[Answer] = queue.Queue()
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    chosen: list[tuple[str, ...] | None] = [None, ("not_b", "a"), ("nope",), ("x_again", "b")]
    try:
        for i, names in enumerate(chosen):
            tensor = triton_grpc.InferInput("x", [6], "UINT32")
            tensor.set_data_from_numpy(_x(i))
            outputs = None
            if names is not None:
                outputs = [triton_grpc.InferRequestedOutput(name) for name in names]
            client.async_stream_infer("several", [tensor], outputs=outputs, request_id=str(i))
        for i, names in enumerate(chosen):
            result, error = answers.get(timeout=10)
            if names == ("nope",):
                assert result is None
                assert error is not None
                assert str(error.message()) == (
                    "output 'nope': several has no output of that name (outputs: b, b_copy, a, "
                    "not_b, x_again)"
                )
                continue
            assert error is None, error
            assert result is not None
            response = result.get_response()
            assert response.id == str(i)
            assert response.parameters["triton_final_response"].bool_param
            want = expected(MODEL, {"x": _x(i)})
            asked = OUTPUTS if names is None else names
            assert [o.name for o in response.outputs] == list(asked)
            got = {name: result.as_numpy(name) for name in asked}
            assert_identical(got, {name: want[name] for name in asked})
    finally:
        client.stop_stream()
        client.close()
    assert answers.empty()


def _load_body() -> bytes:
    document = {"parameters": {"config": CONFIG, MODEL_FILE: base64.b64encode(MODEL).decode()}}
    return json.dumps(document).encode()


def _load_head(name: str, length: int) -> bytes:
    return (
        f"POST /v2/repository/models/{name}/load HTTP/1.1\r\nHost: x\r\n"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def test_a_load_whose_body_stalls_gets_408_and_nothing_is_loaded() -> None:
    body = _load_body()
    half = len(body) // 2
    with serve({"TENSORBITS_TIMEOUT_BODY_READ": "1"}) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as slow:
            slow.sendall(_load_head("stalled", len(body)) + body[:half])
            started = time.monotonic()
            for sent in range(half, half + 5):  # a trickle, each byte well inside the deadline
                slow.sendall(body[sent : sent + 1])
                assert server.get("/v2/health/live") == 200  # others are served meanwhile
                time.sleep(0.1)
            slow.settimeout(10)
            status, _, answer = read_response(slow)
            assert status == 408
            error = json.loads(answer)
            assert error["rule"] == "body_read_timeout"
            assert error["error"] == (
                "the request body did not arrive within 1 s (TENSORBITS_TIMEOUT_BODY_READ)"
            )
            assert time.monotonic() - started < 5
        assert server.get("/v2/models/stalled/ready") == 404
        # The same body sent whole is loaded: only its stalling was refused.
        with socket.create_connection(("127.0.0.1", server.port)) as whole:
            whole.sendall(_load_head("stalled", len(body)) + body)
            whole.settimeout(10)
            assert read_response(whole)[0] == 200
        assert server.get("/v2/models/stalled/ready") == 200
