"""A graph model's gRPC answer is written once (``graph_messages.encode``): laid out whole, each
output written by the graph in place in the answer's bytes. Its bytes are exactly those protobuf
serializes from the same response (unary, and inside a ``ModelStreamInferResponse`` marked
final), for every choice of outputs, on both sides of ``answer_bytes.FRESH_MIN_BYTES``; and the
memory Python allocates meanwhile is about the answer's size, with no copy of an output."""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
from core.test_graph_outputs_asked import MODEL

from tensorbits.config.settings import Settings
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.graphs.request import GraphRequest, plan_request, run_request
from tensorbits.core.limits import request_limits
from tensorbits.grpc import answer_bytes, graph_messages
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.decode import infer_request

BACKEND = NumpyBackend(1)
LIMITS = request_limits(Settings().core_limits)
MiB = 1 << 20


def _planned(rows: int, outputs: tuple[str, ...] | None) -> GraphRequest:
    a = (np.arange(rows, dtype=np.uint8) * 7).reshape(rows, 1)
    b = (np.arange(rows, dtype=np.uint8) * 13).reshape(1, rows)
    message = pb.ModelInferRequest(model_name=MODEL.name, id="answer-7")
    message.inputs.add(name="a", datatype="UINT8", shape=[rows, 1])
    message.inputs.add(name="b", datatype="UINT8", shape=[1, rows])
    for name in outputs or ():
        message.outputs.add(name=name)
    raw = [memoryview(a.tobytes()), memoryview(b.tobytes())]
    return plan_request(MODEL, infer_request(message, raw, LIMITS), LIMITS)


def _protobuf_answer(request: GraphRequest, *, streamed: bool) -> bytes:
    """The same response built and serialized by protobuf from the outputs' arrays."""
    arrays = run_request(request, BACKEND)
    response = pb.ModelInferResponse(
        model_name=request.model.name,
        model_version=request.model.version,
        id=request.request_id or "",
        outputs=[
            pb.ModelInferResponse.InferOutputTensor(
                name=a.planned.name, datatype=a.planned.datatype.value, shape=a.planned.shape
            )
            for a in request.answered
        ],
        raw_output_contents=[arrays[a.planned.name].tobytes() for a in request.answered],
    )
    if not streamed:
        data: bytes = response.SerializeToString()
        return data
    response.parameters["triton_final_response"].bool_param = True
    framed: bytes = pb.ModelStreamInferResponse(infer_response=response).SerializeToString()
    return framed


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("outputs", [None, ("narrow",), ("narrow", "wide"), ("wide",)])
@pytest.mark.parametrize("rows", [0, 3, 200, 1024])  # wide: 0 B, 9 B, 39 KiB, 1 MiB
def test_answers_are_the_bytes_protobuf_serializes(
    rows: int, outputs: tuple[str, ...] | None, streamed: bool
) -> None:
    request = _planned(rows, outputs)
    answer = graph_messages.encode(request, BACKEND, streamed=streamed)
    assert type(answer) is bytes
    assert answer == _protobuf_answer(request, streamed=streamed)
    if streamed:
        parsed: Any = pb.ModelStreamInferResponse.FromString(answer).infer_response
        assert parsed.parameters["triton_final_response"].bool_param
    else:
        parsed = pb.ModelInferResponse.FromString(answer)
    asked = ("wide", "narrow") if outputs is None else outputs
    assert [o.name for o in parsed.outputs] == list(asked)


def test_a_large_answer_is_written_once() -> None:
    """Python allocates the answer and little more: not the outputs' arrays beside it, nor
    their copies as bytes, nor a serialized copy of the message."""
    rows = 2048  # wide: 4 MiB
    request = _planned(rows, ("wide", "narrow"))
    size = rows * rows + rows
    assert size >= answer_bytes.FRESH_MIN_BYTES
    tracemalloc.start()
    try:
        answer = graph_messages.encode(request, BACKEND)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size < len(answer) < size + 1024
    assert peak < len(answer) + MiB // 4, (peak, len(answer))
