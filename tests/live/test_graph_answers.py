"""Graph models' answers on a real server: over gRPC (ModelInfer and ModelStreamInfer) the bytes
on the wire are exactly those protobuf serializes from the response, as they were when protobuf
built them; stock tritonclient reads the same outputs over HTTP and gRPC; an output nobody asked
for is not computed (a request for a small one costs no memory for a large one beside it, past
the element bound though it is), while one asked for past the bound is refused in the same words
on both protocols; and a 32 MiB answer over gRPC grows the server's peak memory by at most
``ANSWER_RSS_MULTIPLE`` answers (docs/reliability.md, "Graph models")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from core.graph_models import model_bytes, tensor
from core.test_graph_outputs_asked import wide_and_narrow_model
from live.test_graph_models_served import CONFIG, MODEL_FILE, assert_identical
from onnx import TensorProto, helper
from support.grpc_live import GrpcServer, serve_grpc
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.integration

MiB = 1 << 20
BOUND = 1 << 25  # TENSORBITS_MAX_TENSOR_ELEMENTS here: the 32 MiB UINT8 answer, no more
ANSWER_RSS_MULTIPLE = 5  # docs/reliability.md, "Graph models": peak memory, in answers
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
PROTOCOLS = ("http", "grpc")


def not_model() -> bytes:
    """z = NOT x, UINT8 of any length."""
    elem = TensorProto.UINT8
    return model_bytes(
        [helper.make_node("BitwiseNot", ["x"], ["z"])],
        [tensor("x", elem, ["n"])],
        [tensor("z", elem, ["n"])],
    )


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc({"TENSORBITS_MAX_TENSOR_ELEMENTS": str(BOUND)}) as running:
        client = triton_grpc.InferenceServerClient(running.grpc_url)
        client.load_model("wide_narrow", config=CONFIG, files={MODEL_FILE: wide_and_narrow_model()})
        client.load_model("not8", config=CONFIG, files={MODEL_FILE: not_model()})
        client.close()
        yield running


@pytest.fixture(scope="module")
def channel(server: GrpcServer) -> Iterator[grpc.Channel]:
    options = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(server.grpc_url, options=options) as opened:
        yield opened


def _inputs(rows: int) -> dict[str, np.ndarray[Any, Any]]:
    return {
        "a": (np.arange(rows, dtype=np.uint8) * 7).reshape(rows, 1),
        "b": (np.arange(rows, dtype=np.uint8) * 13).reshape(1, rows),
    }


def _expected(feeds: dict[str, np.ndarray[Any, Any]]) -> dict[str, np.ndarray[Any, Any]]:
    return {"wide": feeds["a"] ^ feeds["b"], "narrow": ~feeds["a"]}


def _message(
    model: str, feeds: dict[str, np.ndarray[Any, Any]], outputs: tuple[str, ...] | None
) -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id="graph-answer")
    for name, array in feeds.items():
        request.inputs.add(name=name, datatype="UINT8", shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    for name in outputs or ():
        request.outputs.add(name=name)
    data: bytes = request.SerializeToString()
    return data


def _protobuf_answer(
    model: str, outputs: dict[str, np.ndarray[Any, Any]], *, streamed: bool
) -> bytes:
    """The response protobuf serializes for these outputs: what the server sent when protobuf
    built its answers."""
    response = service_pb2.ModelInferResponse(
        model_name=model,
        model_version="1",
        id="graph-answer",
        outputs=[
            service_pb2.ModelInferResponse.InferOutputTensor(
                name=name, datatype="UINT8", shape=list(array.shape)
            )
            for name, array in outputs.items()
        ],
        raw_output_contents=[array.tobytes() for array in outputs.values()],
    )
    if not streamed:
        data: bytes = response.SerializeToString()
        return data
    response.parameters["triton_final_response"].bool_param = True
    framed: bytes = service_pb2.ModelStreamInferResponse(
        infer_response=response
    ).SerializeToString()
    return framed


def _unary(channel: grpc.Channel, message: bytes) -> bytes:
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(INFER)
    answer: bytes = call(message, timeout=60)
    return answer


def _streamed(channel: grpc.Channel, message: bytes) -> bytes:
    call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(STREAM)
    answers: list[bytes] = list(call(iter([message]), timeout=60))
    assert len(answers) == 1
    answer: bytes = answers[0]
    return answer


@pytest.mark.parametrize("outputs", [None, ("narrow",), ("narrow", "wide"), ("wide",)])
@pytest.mark.parametrize("rows", [5, 400])  # wide: 25 B, 156 KiB (written in place)
def test_grpc_answers_are_the_bytes_protobuf_serializes(
    channel: grpc.Channel, rows: int, outputs: tuple[str, ...] | None
) -> None:
    feeds = _inputs(rows)
    want = _expected(feeds)
    asked = outputs or ("wide", "narrow")
    arrays = {name: want[name] for name in asked}
    message = _message("wide_narrow", feeds, outputs)
    assert _unary(channel, message) == _protobuf_answer("wide_narrow", arrays, streamed=False)
    assert _streamed(channel, message) == _protobuf_answer("wide_narrow", arrays, streamed=True)


def _infer(
    protocol: str, server: GrpcServer, rows: int, outputs: tuple[str, ...]
) -> dict[str, np.ndarray[Any, Any]]:
    module: Any = triton_http if protocol == "http" else triton_grpc
    url = server.http.base_url.removeprefix("http://") if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    try:
        inputs = []
        for name, array in _inputs(rows).items():
            entry = module.InferInput(name, list(array.shape), "UINT8")
            entry.set_data_from_numpy(array)
            inputs.append(entry)
        requested = [module.InferRequestedOutput(name) for name in outputs]
        result = client.infer("wide_narrow", inputs, outputs=requested)
        return {name: result.as_numpy(name) for name in outputs}
    finally:
        client.close()


def test_an_output_not_asked_for_costs_nothing_though_past_the_bound(
    server: GrpcServer,
) -> None:
    """``wide`` would be 8192 * 8192 elements (64 MiB), twice the bound; asked for ``narrow``
    alone, each protocol answers it, and the server's peak memory grows by far less than
    ``wide`` would take."""
    rows = 8192
    want = _expected(_inputs(rows))
    for protocol in PROTOCOLS:
        _infer(protocol, server, rows, ("narrow",))  # warm: the plan made, the pools started
        baseline = server.http.reset_peak_rss()
        got = _infer(protocol, server, rows, ("narrow",))
        grown = server.http.peak_rss() - baseline
        assert_identical(got, {"narrow": want["narrow"]})
        assert grown < 16 * MiB, (protocol, grown)


def test_an_output_asked_for_past_the_bound_is_refused_alike() -> None:
    """A small server bound, so the refusal costs nothing to provoke."""
    with serve_grpc({"TENSORBITS_MAX_TENSOR_ELEMENTS": "1000"}) as small:
        client = triton_grpc.InferenceServerClient(small.grpc_url)
        client.load_model("wide_narrow", config=CONFIG, files={MODEL_FILE: wide_and_narrow_model()})
        client.close()
        refusals = {}
        for protocol in PROTOCOLS:
            with pytest.raises(InferenceServerException) as refused:
                _infer(protocol, small, 100, ("narrow", "wide"))
            refusals[protocol] = refused.value
        assert refusals["http"].status() == "413"
        assert refusals["grpc"].status() == "StatusCode.RESOURCE_EXHAUSTED"
        words = (
            "output 'wide': shape [100, 100] has 10000 elements, more than the limit of 1000 "
            "(TENSORBITS_MAX_TENSOR_ELEMENTS)"
        )
        assert refusals["http"].message() == refusals["grpc"].message() == words
        # Asked for alone, the output within the bound is answered on both.
        want = _expected(_inputs(30))["narrow"]
        for protocol in PROTOCOLS:
            assert_identical(_infer(protocol, small, 30, ("narrow",)), {"narrow": want})


@pytest.mark.parametrize("streamed", [False, True])
def test_a_32_mib_grpc_answer_grows_memory_by_a_small_multiple_of_it(
    server: GrpcServer, channel: grpc.Channel, streamed: bool
) -> None:
    x = np.arange(32 * MiB, dtype=np.uint8) * np.uint8(31)
    message = _message("not8", {"x": x}, None)
    send = _streamed if streamed else _unary
    send(channel, message)  # warm: the plan made, the pools started
    baseline = server.http.reset_peak_rss()
    answer = send(channel, message)
    grown = server.http.peak_rss() - baseline
    assert answer == _protobuf_answer("not8", {"z": ~x}, streamed=streamed)
    print(f"streamed={streamed}: +{grown / MiB:.0f} MiB for a {len(answer) / MiB:.0f} MiB answer")
    assert grown <= ANSWER_RSS_MULTIPLE * len(answer), (grown, len(answer))
