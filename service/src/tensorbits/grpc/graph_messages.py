"""The gRPC form of a graph model's inference: ``ModelInferRequest`` in (raw or typed contents,
read by ``decode.infer_request`` as for an operator), ``ModelInferResponse`` out with every output
asked for, each as an entry of ``raw_output_contents`` in the outputs' order, as Triton answers
(the operators' encoder, ``messages.py``, writes their one output in place). An output written
into shared memory has its entry, empty, and no parameters, as an operator's has; the tensors in
shared memory are located in the data plane's regions."""

from __future__ import annotations

from tensorbits.backends.base import Backend
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.request import GraphRequest, plan_request, run_request
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.decode import infer_request
from tensorbits.grpc.messages import FINAL_RESPONSE


def plan(
    plane: DataPlane, model: GraphModel, message: pb.ModelInferRequest, raw: list[memoryview]
) -> GraphRequest:
    """``message`` checked and planned for the graph model."""
    request = infer_request(message, raw, plane.limits)
    return plan_request(model, request, plane.limits, plane.regions)


def encode(request: GraphRequest, backend: Backend, *, streamed: bool = False) -> bytes:
    """Run the graph into a serialized ``ModelInferResponse`` (``streamed``: inside a
    ``ModelStreamInferResponse``, marked final)."""
    arrays = run_request(request, backend)
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
        raw_output_contents=[
            b"" if a.shared is not None else arrays[a.planned.name].tobytes()
            for a in request.answered
        ],
    )
    data = response.SerializeToString()
    if not streamed:
        return data
    return pb.ModelStreamInferResponse(
        infer_response=pb.ModelInferResponse.FromString(data + FINAL_RESPONSE)
    ).SerializeToString()


__all__ = ["encode", "plan"]
