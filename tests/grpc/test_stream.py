"""ModelStreamInfer, the bidirectional stream, driven by the stock ``tritonclient.grpc``
(``start_stream``, ``async_stream_infer``, ``stop_stream``) against a live server: one answer per
request, in the order sent; a refusal as an error in the stream, as Triton sends it, the stream
going on; every reserved request parameter Triton's clients send, over ModelInfer and over the
stream; every answer marked final (``triton_final_response``), so a client that asks for an
empty final response gets no second answer. Then the stream's bounds, as a unary call's: the API
key, the inference slot it holds for its life, the read deadline once idle, the message bound,
admission, statistics and /metrics. In process: at most ``STREAM_MAX_IN_FLIGHT`` messages in
flight, answered in order whatever order they finish in."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, cast

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from prometheus_client.parser import text_string_to_metric_families
from support.grpc_live import GrpcServer, serve_grpc
from support.inprocess import app_client, runtime_of
from tritonclient.grpc import service_pb2
from tritonclient.utils import (
    TRITON_RESERVED_REQUEST_PARAMS,
    TRITON_RESERVED_REQUEST_PARAMS_PREFIX,
    InferenceServerException,
)

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.service import InferenceService
from tensorbits.grpc.status import Context
from tensorbits.grpc.streams import STREAM_MAX_IN_FLIGHT

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
INFER = "/inference.GRPCInferenceService/ModelInfer"
KEY = "stream-key"
MiB = 1 << 20
Answer = tuple[triton.InferResult | None, InferenceServerException | None]


def _x(i: int, n: int = 8) -> np.ndarray[Any, Any]:
    return (np.arange(n) + i).astype(np.uint8)


class Stream:
    """A tritonclient stream whose callback puts each answer on a queue."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.client = triton.InferenceServerClient(url)
        self.answers: queue.Queue[Answer] = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.answers.put((result, error)), headers=headers
        )

    def send(self, i: int = 0, model: str = NOT, n: int = 8, **kwargs: Any) -> None:
        tensor = triton.InferInput("InputTensor", [n], "UINT8")
        tensor.set_data_from_numpy(_x(i, n))
        self.client.async_stream_infer(model, [tensor], request_id=str(i), **kwargs)

    def next(self, timeout: float = 10) -> Answer:
        return self.answers.get(timeout=timeout)

    def result(self, i: int) -> triton.InferResult:
        result, error = self.next()
        assert error is None, error
        assert result is not None
        assert result.get_response().id == str(i)
        np.testing.assert_array_equal(result.as_numpy("OutputTensor"), ~_x(i))
        return result

    def error(self) -> InferenceServerException:
        result, error = self.next()
        assert result is None
        assert error is not None
        return error

    def close(self) -> None:
        self.client.stop_stream()  # waits for every answer in flight
        self.client.close()


@contextmanager
def stream(url: str, headers: dict[str, str] | None = None) -> Iterator[Stream]:
    opened = Stream(url, headers)
    try:
        yield opened
    finally:
        opened.close()


def _request(i: int, model: str = NOT) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model, id=str(i))
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[8])
    request.raw_input_contents.append(_x(i).tobytes())
    return request


def _final(result: triton.InferResult) -> bool:
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and parameters["triton_final_response"].bool_param


# --- answers, in order; refusals in the stream --------------------------------------------------


@pytest.mark.integration
def test_one_answer_per_request_in_the_order_sent(grpc_server: GrpcServer) -> None:
    with stream(grpc_server.grpc_url) as s:
        for i in range(40):
            s.send(i)
        for i in range(40):
            assert _final(s.result(i))  # each request's one response is its final one
    assert s.answers.empty()


@pytest.mark.integration
def test_a_refusal_is_an_error_in_the_stream_and_the_stream_goes_on(
    grpc_server: GrpcServer,
) -> None:
    client = triton.InferenceServerClient(grpc_server.grpc_url)
    unary = []
    for model, parameters in (("nope", None), (NOT, {"feture_level": "6_4"})):
        tensor = triton.InferInput("InputTensor", [8], "UINT8")
        tensor.set_data_from_numpy(_x(0))
        with pytest.raises(InferenceServerException) as caught:
            client.infer(model, [tensor], parameters=parameters)
        unary.append(caught.value.message())
    client.close()
    with stream(grpc_server.grpc_url) as s:
        s.send(0)
        s.send(1, model="nope")
        s.send(2, parameters={"feture_level": "6_4"})
        s.send(3)
        s.result(0)
        # The words ModelInfer answers with (its status details), as the stream's error_message.
        assert s.error().message() == unary[0]
        assert s.error().message() == unary[1]
        s.result(3)


@pytest.mark.integration
def test_an_error_in_the_stream_is_triton_s_form(grpc_server: GrpcServer) -> None:
    # error_message set, infer_response holding only the failed request's id (Triton fills it in
    # "so that the client knows which request failed"); the next request is answered as usual.
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
        answers = [
            service_pb2.ModelStreamInferResponse.FromString(answer)
            for answer in call(
                iter([_request(5, "nope").SerializeToString(), _request(6).SerializeToString()]),
                timeout=30,
            )
        ]
    refused, answered = answers
    assert refused.error_message.startswith("unknown model or operator 'nope'")
    assert refused.HasField("infer_response")
    assert refused.infer_response == service_pb2.ModelInferResponse(id="5")
    assert answered.error_message == ""
    response = answered.infer_response
    assert (response.id, response.model_name, response.model_version) == ("6", NOT, "1")
    assert np.frombuffer(response.raw_output_contents[0], np.uint8).tolist() == (~_x(6)).tolist()


# --- reserved parameters; the empty final response ----------------------------------------------

# Every request parameter Triton reserves (tritonclient's own list, and its prefix), with a value
# of the type Triton's clients send it as.
RESERVED: dict[str, Any] = {
    "sequence_id": 7,
    "sequence_start": True,
    "sequence_end": False,
    "priority": 3,
    "timeout": 1000,
    "headers": "x-request-id",
    "binary_data_output": True,
    "triton_enable_empty_final_response": True,
    f"{TRITON_RESERVED_REQUEST_PARAMS_PREFIX}not_yet_invented": 1.5,
}


def test_the_reserved_list_is_tritonclient_s() -> None:
    assert set(TRITON_RESERVED_REQUEST_PARAMS) <= set(RESERVED)


def _with_parameter(i: int, key: str, value: Any) -> service_pb2.ModelInferRequest:
    request = _request(i)
    parameter = request.parameters[key]
    if isinstance(value, bool):
        parameter.bool_param = value
    elif key == "priority":
        parameter.uint64_param = value  # as tritonclient sets it
    elif isinstance(value, int):
        parameter.int64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = value
    return request


@pytest.mark.integration
@pytest.mark.parametrize("key", list(RESERVED))
def test_each_reserved_parameter_over_modelinfer_and_the_stream(
    grpc_server: GrpcServer, key: str
) -> None:
    request = _with_parameter(9, key, RESERVED[key])
    with grpc.insecure_channel(grpc_server.grpc_url) as channel:
        unary = service_pb2.ModelInferResponse.FromString(
            channel.unary_unary(INFER)(request.SerializeToString(), timeout=30)
        )
        stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
        (streamed,) = [
            service_pb2.ModelStreamInferResponse.FromString(answer)
            for answer in stream(iter([request.SerializeToString()]), timeout=30)
        ]
    assert streamed.error_message == ""
    for response in (unary, streamed.infer_response):
        assert (
            np.frombuffer(response.raw_output_contents[0], np.uint8).tolist() == (~_x(9)).tolist()
        )
    # The unary answer is the plain response; the streamed one is marked final.
    assert "triton_final_response" not in unary.parameters
    assert streamed.infer_response.parameters["triton_final_response"].bool_param


@pytest.mark.integration
def test_an_asked_for_empty_final_response_is_the_response_itself(
    grpc_server: GrpcServer,
) -> None:
    # Triton sends an empty final response only after a decoupled model's last; for a model that
    # is not one it marks the one response final. A client asking for it (perf_analyzer always
    # does) gets exactly one answer per request: an empty one after it would complete the
    # request twice.
    with stream(grpc_server.grpc_url) as s:
        for i in range(3):
            s.send(i, enable_empty_final_response=True)
        s.send(3)
        for i in range(4):
            result = s.result(i)
            assert _final(result)
            assert result.get_response().outputs  # never the empty one
    assert s.answers.empty()


# --- statistics and /metrics ----------------------------------------------------------------------


def _sample(server: GrpcServer, name: str, **labels: str) -> float:
    """The sample ``name`` of /metrics whose labels include ``labels`` (0 when none is)."""
    with urllib.request.urlopen(f"{server.http.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        # The parser names a counter's sample ``_total`` whether the text did or not (Triton's
        # counters do not).
        if sample.name in (name, f"{name}_total") and labels.items() <= sample.labels.items()
    )


@pytest.mark.integration
def test_each_message_is_counted_as_a_call(grpc_server: GrpcServer) -> None:
    client = triton.InferenceServerClient(grpc_server.grpc_url)

    calls = {"route": STREAM, "model": NOT, "protocol": "grpc"}

    def counts() -> tuple[int, int, float, float, float]:
        (stats,) = client.get_inference_statistics(NOT).model_stats
        return (
            stats.inference_stats.success.count,
            stats.inference_stats.fail.count,
            _sample(grpc_server, "tensorbits_requests_total", **calls, status="200"),
            _sample(grpc_server, "tensorbits_requests_total", **calls, status="400"),
            _sample(grpc_server, "nv_inference_request_success", model=NOT, version="1"),
        )

    before = counts()
    with stream(grpc_server.grpc_url) as s:
        for i in range(5):
            s.send(i)
        s.send(5, parameters={"feture_level": "6_4"})  # refused: a failure of this model
        for i in range(5):
            s.result(i)
        s.error()
    after = counts()
    client.close()
    assert tuple(b - a for a, b in zip(before, after, strict=True)) == (5, 1, 5, 1, 5)


# --- bounds: a server of small ones ----------------------------------------------------------------

BOUNDED = {
    "TENSORBITS_API_KEYS": KEY,
    "TENSORBITS_MAX_INFLIGHT_REQUESTS": "1",  # one inference slot: a stream holds it
    "TENSORBITS_TIMEOUT_BODY_READ": "1",
    "TENSORBITS_MAX_BODY_BYTES": str(MiB),
    "TENSORBITS_MAX_INFLIGHT_BYTES": str(MiB),
}
WITH_KEY = {"authorization": f"Bearer {KEY}"}
KEY_METADATA = (("authorization", f"Bearer {KEY}"),)


@pytest.fixture(scope="module")
def bounded() -> Iterator[GrpcServer]:
    with serve_grpc(BOUNDED) as server:
        yield server


@pytest.mark.integration
def test_a_stream_needs_the_api_key(bounded: GrpcServer) -> None:
    with stream(bounded.grpc_url) as s:
        error = s.error()  # at the stream's start, before any message
    assert error.status() == "StatusCode.UNAUTHENTICATED"
    assert "an API key is required" in str(error.message())
    with stream(bounded.grpc_url, WITH_KEY) as s:
        s.send(1)
        s.result(1)


def _unary_status(server: GrpcServer) -> grpc.StatusCode:
    with grpc.insecure_channel(server.grpc_url) as channel:
        try:
            channel.unary_unary(INFER)(
                _request(0).SerializeToString(), timeout=10, metadata=KEY_METADATA
            )
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.integration
def test_a_stream_holds_a_stream_slot_for_its_life(bounded: GrpcServer) -> None:
    with stream(bounded.grpc_url, WITH_KEY) as s:
        s.send(0)
        s.result(0)  # started: its slot is the one stream slot the server has
        # An open stream leaves ModelInfer its own slot: a unary call is served.
        assert _unary_status(bounded) == grpc.StatusCode.OK
        with stream(bounded.grpc_url, WITH_KEY) as other:  # refused at its start
            error = other.error()
        assert error.status() == "StatusCode.UNAVAILABLE"
        assert "ModelStreamInfer calls in progress" in str(error.message())
        s.send(2)  # the stream itself goes on
        s.result(2)
    deadline = time.monotonic() + 5
    while True:  # given back as the stream ends: a new stream is served
        with stream(bounded.grpc_url, WITH_KEY) as again:
            again.send(3)
            _, error = again.next()
        if error is None:
            break
        assert time.monotonic() < deadline, "the stream's slot was not given back"
        time.sleep(0.05)


def _raw_stream(server: GrpcServer, messages: list[bytes], hold: threading.Event) -> list[Any]:
    """A stream that sends ``messages`` and then nothing until ``hold`` is set: its answers,
    and how the call ended (the RpcError's code, or OK)."""

    def requests() -> Iterator[bytes]:
        yield from messages
        hold.wait(30)

    seen: list[Any] = []
    started = time.monotonic()
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
        try:
            for answer in stream(requests(), timeout=30, metadata=KEY_METADATA):
                seen.append(service_pb2.ModelStreamInferResponse.FromString(answer))
            seen.append(grpc.StatusCode.OK)
        except grpc.RpcError as exc:
            seen += [exc.code(), exc.details(), time.monotonic() - started]
        finally:
            hold.set()
    return seen


@pytest.mark.integration
def test_an_idle_stream_ends_at_the_read_deadline(bounded: GrpcServer) -> None:
    # Nothing sent at all: DEADLINE_EXCEEDED after TENSORBITS_TIMEOUT_BODY_READ (1 s here).
    code, details, seconds = _raw_stream(bounded, [], threading.Event())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "TENSORBITS_TIMEOUT_BODY_READ" in details
    assert 0.9 < seconds < 10
    # One message answered, then silence: the answer, then the same end.
    answer, code, details, _ = _raw_stream(
        bounded, [_request(4).SerializeToString()], threading.Event()
    )
    assert answer.infer_response.id == "4"
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED


@pytest.mark.integration
def test_a_message_past_the_bound_and_past_admission(bounded: GrpcServer) -> None:
    # Within TENSORBITS_MAX_BODY_BYTES, but its body and output need more than the 1 MiB the
    # server admits: a 413's words in the stream, which goes on.
    big = service_pb2.ModelInferRequest(model_name=NOT, id="big")
    big.inputs.add(name="InputTensor", datatype="UINT8", shape=[600 << 10])
    big.raw_input_contents.append(bytes(600 << 10))
    refused, answered, end = _raw_stream(
        bounded,
        [big.SerializeToString(), _request(1).SerializeToString()],
        threading.Event(),
    )[:3]
    assert "more than the server's limit" in refused.error_message
    assert refused.infer_response.id == "big"
    assert answered.infer_response.id == "1"
    assert end == grpc.StatusCode.DEADLINE_EXCEEDED  # idle afterwards
    # Past TENSORBITS_MAX_BODY_BYTES: grpcio's bound ends the call, as it does a unary one.
    huge = service_pb2.ModelInferRequest(model_name=NOT)
    huge.inputs.add(name="InputTensor", datatype="UINT8", shape=[2 * MiB])
    huge.raw_input_contents.append(bytes(2 * MiB))
    code = _raw_stream(bounded, [huge.SerializeToString()], threading.Event())[0]
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED


def _stream_call(
    server: GrpcServer, messages: Iterator[bytes], metadata: tuple[tuple[str, str], ...]
) -> tuple[list[str], grpc.StatusCode, dict[str, str]]:
    """A stream that sends ``messages``: its answers' ids, how it ended and its trailing
    metadata."""
    with grpc.insecure_channel(server.grpc_url) as channel:
        stream: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
        call = stream(messages, timeout=30, metadata=metadata)
        ids: list[str] = []
        try:
            for answer in call:
                ids.append(
                    service_pb2.ModelStreamInferResponse.FromString(answer).infer_response.id
                )
            code, trailing = grpc.StatusCode.OK, dict(call.trailing_metadata() or ())
        except grpc.RpcError as exc:
            code = exc.code()
            trailing = {item.key: item.value for item in exc.trailing_metadata() or ()}
    return ids, code, {key: str(value) for key, value in trailing.items()}


@pytest.mark.integration
def test_a_stream_sends_back_the_request_id_of_its_call(bounded: GrpcServer) -> None:
    def messages() -> Iterator[bytes]:
        return (_request(i).SerializeToString() for i in (5, 6))

    # Each message's own id is on its answer; the call's (its x-request-id) ends the stream.
    ids, code, trailing = _stream_call(
        bounded, messages(), (*KEY_METADATA, ("x-request-id", "stream-9"))
    )
    assert (ids, code) == (["5", "6"], grpc.StatusCode.OK)
    assert trailing["x-request-id"] == "stream-9"
    # Without one, the id the server made for the call, as a unary call's.
    ids, code, trailing = _stream_call(bounded, messages(), KEY_METADATA)
    assert (ids, code) == (["5", "6"], grpc.StatusCode.OK)
    assert len(trailing["x-request-id"]) == 32, trailing
    # A stream refused at its start, or ended by the read deadline, names it beside its refusal.
    _, code, trailing = _stream_call(bounded, messages(), (("x-request-id", "stream-10"),))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert (trailing["x-request-id"], trailing["tensorbits-error-rule"]) == ("stream-10", "api_key")
    hold = threading.Event()

    def silence() -> Iterator[bytes]:
        yield from messages()
        hold.wait(30)

    try:
        ids, code, trailing = _stream_call(
            bounded, silence(), (*KEY_METADATA, ("x-request-id", "stream-11"))
        )
    finally:
        hold.set()
    assert (ids, code) == (["5", "6"], grpc.StatusCode.DEADLINE_EXCEEDED)
    assert (trailing["x-request-id"], trailing["tensorbits-error-rule"]) == (
        "stream-11",
        "body_read_timeout",
    )


# --- in process: the bound on messages in flight -------------------------------------------------


class _Written:
    """A stream's context as the stream uses it when it refuses nothing: its peer, its
    metadata (none), and where its answers are written."""

    def __init__(self) -> None:
        self.answers: list[bytes] = []

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    async def write(self, answer: bytes) -> None:
        self.answers.append(answer)

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata


def test_at_most_the_bound_in_flight_answered_in_order() -> None:
    # The service's own stream behaviour on a real runtime, its inference timed: each answer is
    # held until STREAM_MAX_IN_FLIGHT are waiting, then released last first. The stream reads
    # no further while that many are in flight, and answers in the order the messages came.
    count = 3 * STREAM_MAX_IN_FLIGHT
    with app_client(grpc_port=0) as client:
        service = InferenceService(runtime_of(client))
        real = service._infer
        waiting = 0
        most = 0

        async def run() -> list[pb.ModelStreamInferResponse]:
            nonlocal waiting, most
            full = asyncio.Event()

            async def timed(data: bytes, *args: Any, **kwargs: Any) -> bytes:
                nonlocal waiting, most
                answer = await real(data, *args, **kwargs)
                index = int(pb.ModelInferRequest.FromString(data).id)
                waiting += 1
                most = max(most, waiting)
                if waiting == STREAM_MAX_IN_FLIGHT or index == count - 1:
                    full.set()
                await full.wait()
                await asyncio.sleep(0.002 * (count - index))  # the later, the sooner done
                waiting -= 1
                if not waiting:
                    full.clear()
                return answer

            service._infer = timed  # type: ignore[method-assign]

            async def requests() -> AsyncIterator[bytes]:
                for i in range(count):
                    yield _request(i).SerializeToString()

            behaviour = service.stream("ModelStreamInfer")
            # No API keys and no refusal of the call: the context is asked only its peer and
            # to write each answer.
            context = _Written()
            await behaviour(requests(), cast(Context, context))
            return [pb.ModelStreamInferResponse.FromString(answer) for answer in context.answers]

        answers = asyncio.run(run())
    assert most == STREAM_MAX_IN_FLIGHT
    assert [answer.infer_response.id for answer in answers] == [str(i) for i in range(count)]
    for i, answer in enumerate(answers):
        values = np.frombuffer(answer.infer_response.raw_output_contents[0], np.uint8)
        assert values.tolist() == (~_x(i)).tolist()
