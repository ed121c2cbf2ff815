"""What a gRPC call holds, and for how long, against a live server over real sockets.

A unary call's message is let go when its call ends, answered or refused: the server's resident
memory stays flat across ten 32 MiB ModelInfer calls, and across ten refused 16 MiB calls (each
bound below, and in docs/reliability.md). A stream's answers stay counted in admission until
grpc has sent them: streams whose answers are never read are refused by admission, with
``tensorbits_inflight_bytes`` showing what they hold, and memory stays under the admission bound.
One connection holding ModelInfer calls open without sending takes at most its share of the
inference pool: another client's ModelInfer is served. A client cancelling a stream with answers
unread is normal: the server logs nothing at error level for it."""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any, TypeAlias, cast

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from support.grpc_live import GrpcServer
from support.live import free_port, metric_samples, serve
from tritonclient.grpc import service_pb2

from tensorbits.grpc.pools import CONTROL_SLOTS

MiB = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
XOR = "onnx.BitwiseXor-18"
SERVICE = "/inference.GRPCInferenceService"
INFER = f"{SERVICE}/ModelInfer"
STREAM = f"{SERVICE}/ModelStreamInfer"
LOAD = f"{SERVICE}/RepositoryModelLoad"
Unary: TypeAlias = "grpc.UnaryUnaryMultiCallable[bytes, bytes]"
UNBOUNDED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]

CALLS = 10
# What ten calls may leave in the server's resident memory once the first two have warmed its
# allocator up: less than four of their messages (the allocator's arenas and the threads'
# buffers vary by a message or two). Kept, the messages grew it by one a call: ten 32 MiB
# calls, +240 to +340 MiB; ten refused 16 MiB calls, +160 MiB.
FLAT_BOUND_MESSAGES = 4
INFLIGHT_BYTES = 128 * MiB
INFLIGHT = 8  # the inference pool: TENSORBITS_MAX_INFLIGHT_REQUESTS


@contextmanager
def live(env: dict[str, str], stderr: IO[bytes] | None = None) -> Iterator[GrpcServer]:
    """``support.live.serve`` with gRPC on a free port, its log to ``stderr`` when given."""
    port = free_port()
    with serve({"TENSORBITS_GRPC_PORT": str(port), **env}, stderr=stderr) as server:
        yield GrpcServer(server, port)


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    env = {
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(INFLIGHT_BYTES),
        "TENSORBITS_MAX_BODY_BYTES": str(40 * MiB),
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": str(INFLIGHT),
        "TENSORBITS_TIMEOUT_BODY_READ": "30",
    }
    with live(env) as started:
        yield started


def _not_request(size: int, model: str = NOT) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id="big")
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[size])
    request.raw_input_contents.append(bytes(size))
    message: bytes = request.SerializeToString()
    return message


def _broadcast_request(i: int, side: int = 4096) -> bytes:
    """An 8 KiB request whose output is ``side`` x ``side`` bytes by broadcasting (16 MiB)."""
    request = service_pb2.ModelInferRequest(model_name=XOR, id=str(i))
    request.inputs.add(name="A", datatype="UINT8", shape=[side, 1])
    request.inputs.add(name="B", datatype="UINT8", shape=[1, side])
    request.raw_input_contents.extend([bytes(side), bytes(side)])
    message: bytes = request.SerializeToString()
    return message


def _flat_across(server: GrpcServer, call: Any, size: int) -> tuple[int, list[int]]:
    """RSS growth over ``CALLS`` calls of ``call`` once two have warmed up, and each RSS."""
    for _ in range(2):
        call()
    baseline = server.http.rss()
    seen = []
    for _ in range(CALLS):
        call()
        seen.append(server.http.rss())
    grown = seen[-1] - baseline
    steps = " ".join(f"{(rss - baseline) / MiB:+.0f}" for rss in seen)
    print(f"{CALLS} calls of {size / MiB:.0f} MiB: RSS {steps} MiB")
    assert grown < FLAT_BOUND_MESSAGES * size, [f"{(r - baseline) / MiB:.0f}" for r in seen]
    return grown, seen


def test_answered_calls_let_their_messages_go(server: GrpcServer) -> None:
    size = 32 * MiB
    message = _not_request(size)
    with grpc.insecure_channel(server.grpc_url, options=UNBOUNDED) as channel:
        infer: Unary = channel.unary_unary(INFER)

        def call() -> None:
            reply = service_pb2.ModelInferResponse.FromString(infer(message, timeout=60))
            assert reply.raw_output_contents[0][:4] == b"\xff" * 4

        _flat_across(server, call, size)


@pytest.mark.parametrize(
    ("method", "code", "rule"),
    [
        (INFER, grpc.StatusCode.NOT_FOUND, "unknown_operator"),
        (LOAD, grpc.StatusCode.NOT_FOUND, "unknown_repository"),
    ],
)
def test_refused_calls_let_their_messages_go(
    server: GrpcServer, method: str, code: grpc.StatusCode, rule: str
) -> None:
    size = 16 * MiB
    if method == INFER:
        message = _not_request(size, model="no-such-model")
    else:
        load = service_pb2.RepositoryModelLoadRequest(repository_name="other", model_name="m")
        load.parameters["file:model.onnx"].bytes_param = bytes(size)
        message = load.SerializeToString()
    with grpc.insecure_channel(server.grpc_url, options=UNBOUNDED) as channel:
        unary: Unary = channel.unary_unary(method)

        def call() -> None:
            with pytest.raises(grpc.RpcError) as caught:
                unary(message, timeout=60)
            error = cast(grpc.Call, caught.value)
            assert error.code() == code, error.details()
            trailing = dict(error.trailing_metadata() or ())
            assert trailing["tensorbits-error-rule"] == rule

        _flat_across(server, call, size)


# --- streams whose answers are never read --------------------------------------------------------


class Unread:
    """A ModelStreamInfer stream that sends ``count`` broadcast requests, then waits, its
    answers unread until ``answers`` is called."""

    def __init__(self, channel: grpc.Channel, count: int) -> None:
        self.done = threading.Event()
        stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
        self.call = cast(Any, stream(self._requests(count), timeout=120))

    def _requests(self, count: int) -> Iterator[bytes]:
        for i in range(count):
            yield _broadcast_request(i)
        self.done.wait(120)

    def answers(self, count: int) -> list[service_pb2.ModelStreamInferResponse]:
        return [
            service_pb2.ModelStreamInferResponse.FromString(next(self.call)) for _ in range(count)
        ]

    def cancel(self) -> None:
        self.done.set()
        self.call.cancel()


def _settled_inflight_bytes(server: GrpcServer, seconds: float = 60) -> float:
    """``tensorbits_inflight_bytes`` once it stopped changing (the streams read what they will;
    on a loaded machine that takes a while)."""
    deadline = time.monotonic() + seconds
    last = -1.0
    while time.monotonic() < deadline:
        now = metric_samples(server.http.base_url)["tensorbits_inflight_bytes"]
        if now == last and now > 0:
            return now
        last = now
        time.sleep(0.5)
    return last


def test_unread_stream_answers_stay_admitted(server: GrpcServer) -> None:
    streams, each = 4, 16  # 64 answers of 16 MiB: eight times the admission bound
    baseline = server.http.reset_peak_rss()
    with grpc.insecure_channel(server.grpc_url, options=UNBOUNDED) as channel:
        unread = [Unread(channel, each) for _ in range(streams)]
        try:
            held = _settled_inflight_bytes(server)
            grown = server.http.peak_rss() - baseline
            answers = [answer for stream in unread for answer in stream.answers(each)]
        finally:
            for stream in unread:
                stream.cancel()
    print(f"held {held / MiB:.0f} MiB, peak RSS +{grown / MiB:.0f} MiB")
    assert 0 < held <= INFLIGHT_BYTES, held
    # Admission's bound and what grpc and the streams hold beyond it (messages being read,
    # a sent answer grpc buffers per stream): never what the 64 answers would take (1 GiB).
    assert grown < INFLIGHT_BYTES + streams * 2 * 16 * MiB + 64 * MiB, grown / MiB
    refused = [answer for answer in answers if answer.error_message]
    assert refused, "no request of an unread stream was refused by admission"
    assert all("server busy" in answer.error_message for answer in refused), refused[0]
    assert {answer.infer_response.id for answer in refused} <= {str(i) for i in range(each)}
    served = [answer for answer in answers if not answer.error_message]
    assert served
    assert all(len(a.infer_response.raw_output_contents[0]) == 16 * MiB for a in served)
    # Given back once sent: nothing stays counted.
    deadline = time.monotonic() + 10
    while metric_samples(server.http.base_url)["tensorbits_inflight_bytes"]:
        assert time.monotonic() < deadline, "stream answers stayed counted after the streams"
        time.sleep(0.1)


# --- one connection's share of the inference pool ------------------------------------------------


class Stalled:
    """``count`` ModelInfer calls on ``channel`` that open and send nothing until ``release``."""

    def __init__(self, channel: grpc.Channel, count: int, method: str = INFER) -> None:
        self.gate = threading.Event()
        call: grpc.StreamUnaryMultiCallable[bytes, bytes] = channel.stream_unary(method)
        self.futures = [call.future(self._never(), timeout=60) for _ in range(count)]

    def _never(self) -> Iterator[bytes]:
        self.gate.wait(60)
        yield from ()

    def refused(self, timeout: float) -> list[grpc.Call]:
        """The calls ended within ``timeout`` seconds (those past the connection's share)."""
        deadline = time.monotonic() + timeout
        ended = []
        for future in self.futures:
            try:
                error = future.exception(timeout=max(deadline - time.monotonic(), 0.01))
            except grpc.FutureTimeoutError:
                continue
            ended.append(cast(grpc.Call, error))
        return ended

    def release(self) -> None:
        self.gate.set()
        for future in self.futures:
            future.exception(timeout=60)


def test_one_connection_cannot_take_every_inference_slot(server: GrpcServer) -> None:
    with grpc.insecure_channel(server.grpc_url) as attacker:
        stalled = Stalled(attacker, 100)
        try:
            refused = stalled.refused(timeout=3)
            assert len(refused) == 100 - INFLIGHT // 2, len(refused)
            for error in refused:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
                trailing = dict(error.trailing_metadata() or ())
                assert trailing["tensorbits-error-rule"] == "connection_share", trailing
                assert "this connection" in str(error.details())
            # Another client, the stock tritonclient on a connection of its own, is served.
            client = triton.InferenceServerClient(server.grpc_url)
            try:
                tensor = triton.InferInput("InputTensor", [4], "UINT8")
                tensor.set_data_from_numpy(np.arange(4, dtype=np.uint8))
                for _ in range(3):
                    result = client.infer(NOT, [tensor], client_timeout=10)
                    assert result.as_numpy("OutputTensor").tolist() == [255, 254, 253, 252]
            finally:
                client.close()
        finally:
            stalled.release()


def test_one_connection_cannot_take_every_control_slot(server: GrpcServer) -> None:
    # Loads, unloads, configuration and shared-memory RPCs share the control pool: one
    # connection holding loads open without sending takes at most half of it.
    with grpc.insecure_channel(server.grpc_url) as attacker:
        stalled = Stalled(attacker, 100, LOAD)
        try:
            refused = stalled.refused(timeout=3)
            assert len(refused) == 100 - CONTROL_SLOTS // 2, len(refused)
            for error in refused:
                assert error.code() == grpc.StatusCode.UNAVAILABLE, error.details()
                trailing = dict(error.trailing_metadata() or ())
                assert trailing["tensorbits-error-field"] == "peer", trailing
                assert trailing["tensorbits-error-rule"] == "connection_share", trailing
            # Another client, the stock tritonclient on a connection of its own, is served.
            client = triton.InferenceServerClient(server.grpc_url)
            try:
                for _ in range(3):
                    names = {model.name for model in client.get_model_repository_index().models}
                    assert NOT in names
                    assert client.get_model_config(NOT).config.name == NOT
            finally:
                client.close()
        finally:
            stalled.release()


# --- a stream cancelled with answers unread ------------------------------------------------------


def test_a_cancelled_stream_with_unread_answers_logs_no_error() -> None:
    env = {
        "TENSORBITS_LOG_LEVEL": "info",
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(INFLIGHT_BYTES),
        "TENSORBITS_MAX_BODY_BYTES": str(MiB),
    }
    with tempfile.TemporaryFile() as log:
        with (
            live(env, stderr=log) as started,
            grpc.insecure_channel(started.grpc_url, options=UNBOUNDED) as channel,
        ):
            for _ in range(3):
                unread = Unread(channel, 12)
                _settled_inflight_bytes(started)
                unread.cancel()
            time.sleep(1)  # what the cancels leave behind is logged by now
            live_call: Unary = channel.unary_unary(f"{SERVICE}/ServerLive")
            assert service_pb2.ServerLiveResponse.FromString(live_call(b"", timeout=10)).live
        log.seek(0)
        raw = log.read().decode(errors="replace")
    lines = [json.loads(line) for line in raw.splitlines() if line.startswith("{")]
    loud = [line for line in lines if line.get("level") in ("error", "critical")]
    assert not loud, loud[:3]
    assert "Traceback" not in raw, raw[-2000:]
    assert any(line.get("route") == STREAM for line in lines), "the streams' calls were not logged"
