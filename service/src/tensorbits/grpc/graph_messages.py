"""The gRPC form of a graph model's inference: ``ModelInferRequest`` in (raw or typed contents,
read by ``decode.infer_request`` as for an operator), ``ModelInferResponse`` out with every output
asked for, each as an entry of ``raw_output_contents`` in the outputs' order, as Triton answers,
written by the graph in place in the answer's bytes as the operators' encoder (``messages.py``)
writes their one output (``answer_bytes``). An output written
into shared memory has its entry, empty, and no parameters, as an operator's has; the tensors in
shared memory are located in the data plane's regions."""

from __future__ import annotations

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.request import GraphRequest, plan_request, run_request
from tensorbits.grpc import answer_bytes, wire
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.decode import infer_request
from tensorbits.grpc.messages import STREAM_INFER_RESPONSE
from tensorbits_protocol.dtypes import wire_dtype


def plan(
    plane: DataPlane, model: GraphModel, message: pb.ModelInferRequest, raw: list[memoryview]
) -> GraphRequest:
    """``message`` checked and planned for the graph model."""
    request = infer_request(message, raw, plane.limits)
    return plan_request(model, request, plane.limits, plane.regions)


def encode(request: GraphRequest, backend: Backend, *, streamed: bool = False) -> bytes:
    """Run the graph into a serialized ``ModelInferResponse`` (``streamed``: inside a
    ``ModelStreamInferResponse``, marked final), written once: the protobuf-built part (names,
    types, shapes; for a stream the final-response parameter, where protobuf would put it),
    then each output's ``raw_output_contents`` entry, its tag and length and a hole the graph
    writes its bytes into (``answer_bytes.laid_out``). The bytes are those protobuf serializes
    from the same response, with no copy of an output made on the way."""
    answered = request.answered
    response = pb.ModelInferResponse(
        model_name=request.model.name,
        model_version=request.model.version,
        id=request.request_id or "",
        outputs=[
            pb.ModelInferResponse.InferOutputTensor(
                name=a.planned.name, datatype=a.planned.datatype.value, shape=a.planned.shape
            )
            for a in answered
        ],
    )
    if streamed:
        response.parameters["triton_final_response"].bool_param = True
    head = response.SerializeToString()
    sizes = [0 if a.shared is not None else a.nbytes for a in answered]
    parts: list[bytes | int] = [head]
    for size in sizes:
        parts += [wire.raw_field(wire.RAW_OUTPUT_CONTENTS, size), size]
    if streamed:
        inner = sum(len(p) if isinstance(p, bytes) else p for p in parts)
        parts.insert(0, wire.raw_field(STREAM_INFER_RESPONSE, inner))
    answer = answer_bytes.laid_out(parts)
    into = {
        a.planned.name: np.frombuffer(hole, wire_dtype(a.planned.datatype)).reshape(a.planned.shape)
        for a, hole in zip(answered, answer.holes, strict=True)
        if a.shared is None
    }
    run_request(request, backend, into)
    del into
    return answer.finish()


__all__ = ["encode", "plan"]
