"""The drain in the order orchestrators route, on a live server (HTTP and gRPC): on SIGTERM,
readiness off at once; for ``TENSORBITS_DRAIN_DELAY`` new connections are still accepted and
served on both protocols, readiness answering 503 and the gRPC health service NOT_SERVING
throughout; then the listeners close and the requests in flight (an HTTP upload, a gRPC stream)
finish. A second SIGTERM ends the delay: the tests wait on states (a refused connection, an
answer), never on a clock, and the delay given is far longer than any of them needs."""

from __future__ import annotations

import contextlib
import queue
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.live import LiveServer, free_port, serve
from support.rawhttp import read_response
from support.v2 import NOT, assert_bit_not, bit_not_request

pytestmark = pytest.mark.integration

DELAY_S = 120  # ended by the second SIGTERM long before: the tests never wait it out
WAIT_S = 30.0


def _within(seconds: float, check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def _health(grpc_port: int) -> int:
    """The gRPC health service's answer for the whole server, on a new channel (a new
    connection: what a probe opens)."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        stub: Any = health_pb2_grpc.HealthStub(channel)  # grpcio's stubs are untyped
        status: int = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        return status


def _http_infer(server: LiveServer, data: np.ndarray[Any, Any]) -> None:
    """One inference on a new connection, its answer checked."""
    with socket.create_connection((server.host, server.port), timeout=WAIT_S) as sock:
        sock.sendall(bit_not_request(data))
        assert_bit_not(read_response(sock), data)


def _grpc_infer(grpc_port: int, data: np.ndarray[Any, Any]) -> None:
    """One ModelInfer on a new client (a new connection), its answer checked."""
    client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        tensor = triton.InferInput("InputTensor", list(data.shape), "UINT8")
        tensor.set_data_from_numpy(data)
        result = client.infer(NOT, [tensor], client_timeout=WAIT_S)
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~data)
    finally:
        client.close()


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_drain_delay_keeps_serving_new_connections_then_finishes_those_in_flight() -> None:
    grpc_port = free_port()
    env = {
        "TENSORBITS_GRPC_PORT": str(grpc_port),
        "TENSORBITS_DRAIN_DELAY": str(DELAY_S),
        "TENSORBITS_TIMEOUT_GRACEFUL_SHUTDOWN": "20",
    }
    big = np.arange(1 << 20, dtype=np.uint32)
    raw = bit_not_request(big)
    half = len(raw) - big.nbytes // 2  # the head and half of the tensor's bytes
    small = np.arange(16, dtype=np.uint8)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    stream = triton.InferenceServerClient(f"127.0.0.1:{grpc_port}")

    def stream_send(i: int) -> None:
        tensor = triton.InferInput("InputTensor", [16], "UINT8")
        tensor.set_data_from_numpy(small + i)
        stream.async_stream_infer(NOT, [tensor], request_id=str(i))

    def stream_answer(i: int) -> None:
        result, error = answers.get(timeout=WAIT_S)
        assert error is None, error
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~(small + i))

    with serve(env) as server, socket.create_connection((server.host, server.port)) as upload:
        try:
            # In flight across the whole drain: an HTTP upload half sent, a gRPC stream open.
            upload.sendall(raw[:half])
            stream.start_stream(callback=lambda result, error: answers.put((result, error)))
            stream_send(0)
            stream_answer(0)
            assert server.get("/v2/health/ready") == 200
            assert _health(grpc_port) == health_pb2.HealthCheckResponse.SERVING

            server.proc.send_signal(signal.SIGTERM)
            assert _within(WAIT_S, lambda: server.get("/v2/health/ready") == 503)

            # The delay: still accepting on both ports, every answer right, readiness off.
            for i in range(3):
                _http_infer(server, small + i)
                _grpc_infer(grpc_port, small + i)
                assert server.get("/v2/health/ready") == 503
                assert server.get("/v2/health/live") == 200
                assert _health(grpc_port) == health_pb2.HealthCheckResponse.NOT_SERVING
            stream_send(1)  # the open stream still carries new requests
            stream_answer(1)
            assert server.proc.poll() is None

            # The delay's end: both listeners close; what is in flight still finishes.
            server.proc.send_signal(signal.SIGTERM)
            assert _within(WAIT_S, lambda: _refused(server.port)), "HTTP still accepting"
            assert _within(WAIT_S, lambda: _refused(grpc_port)), "gRPC still accepting"
            stream_send(2)
            stream_answer(2)
            upload.sendall(raw[half:])
            assert_bit_not(read_response(upload), big)
        finally:
            with contextlib.suppress(Exception):
                stream.stop_stream()
            stream.close()
        assert server.proc.wait(timeout=WAIT_S) == 0  # a clean SIGTERM exits 0


def test_without_a_delay_the_listeners_close_at_once() -> None:
    """The default (no delay): SIGTERM closes the listener without waiting for a second one."""
    with serve() as server:
        server.proc.send_signal(signal.SIGTERM)
        assert _within(WAIT_S, lambda: server.proc.poll() is not None or _refused(server.port))
        assert server.proc.wait(timeout=WAIT_S) == 0  # a clean SIGTERM exits 0
