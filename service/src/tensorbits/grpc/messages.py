"""The gRPC form of a v2 inference: ``ModelInferRequest`` in, ``ModelInferResponse`` out.

The request is read by ``decode.infer_request`` (the message into the protocol-neutral
``InferRequest`` that the core's ``plan`` checks, by the rules and in the words HTTP's are);
``plan`` plans it, ``plan_and_keep`` keeps its template in the data plane's cache too. Outputs
go back as ``raw_output_contents``, as Triton sends them, or into their shared-memory region.

``encode`` runs a plan into the response's own bytes: the protobuf-built part (names, types,
shapes), then the output as one entry of ``raw_output_contents`` written by the kernel in place
(``wire.raw_field``). An output written into shared memory still has its entry, empty, as
Triton sends one per output whatever its place: Triton's C++ client (perf_analyzer) reads
``raw_output_contents[i]`` for the i-th output unchecked. ``streamed``: the same response inside
a ``ModelStreamInferResponse``, marked as its request's final one.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.models import MODEL_VERSION
from tensorbits.core.plan import Plan, PlanTemplate
from tensorbits.core.plan import plan as plan_request
from tensorbits.core.run import run_to_host, run_to_region
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits.grpc import answer_bytes, wire
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.decode import infer_request
from tensorbits_protocol.dtypes import BY_NAME, wire_dtype
from tensorbits_protocol.operators import OperatorSpec

# ModelStreamInferResponse.infer_response: a streamed answer is the unary one, framed in it.
STREAM_INFER_RESPONSE = 2
# Appended to each ModelInferResponse of a stream: Triton marks every response of a stream with
# triton_final_response, true on a request's last (every request here has one response). A
# message's fields may come in any order, and map entries anywhere, so it follows the output.
FINAL_RESPONSE = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=True)}
).SerializeToString()


def plan(
    plane: DataPlane, op: OperatorSpec, message: pb.ModelInferRequest, raw: list[memoryview]
) -> Plan:
    """``message`` checked and planned for ``op``: ``infer_request``, then the core's ``plan``."""
    return plan_request(op, infer_request(message, raw, plane.limits), plane.limits, plane.regions)


def plan_and_keep(
    plane: DataPlane,
    op: OperatorSpec,
    message: pb.ModelInferRequest,
    raw: list[memoryview],
    key: Hashable,
    size: int,
) -> Plan:
    """``plan``, its template kept in the plane's cache under ``key`` (the message of ``size``
    bytes without its raw contents, and their sizes) when it has one worth keeping; the plan
    then has the template's response head, made once."""
    planned = plan(plane, op, message, raw)
    if plane.keeps(size):
        template = template_of(planned, message, plane.backend)
        if template is not None:
            plane.remember(key, template, size)
            planned = planned._replace(response_head=template.response_head)
    return planned


def _response(plan: Plan) -> pb.ModelInferResponse:
    call = plan.call
    output = pb.ModelInferResponse.InferOutputTensor(
        name=plan.op.output, datatype=call.output_datatype.value, shape=call.output_shape
    )
    return pb.ModelInferResponse(
        model_name=plan.op.name,
        model_version=MODEL_VERSION,
        id=plan.request_id or "",
        outputs=[output],
    )


def response_head(plan: Plan) -> bytes:
    """The serialized response before its output's bytes: everything but them, then the tag
    and length of ``raw_output_contents[0]`` (``wire.raw_field``)."""
    return _response(plan).SerializeToString() + wire.raw_field(
        wire.RAW_OUTPUT_CONTENTS, plan.output_nbytes
    )


def region_answer(plan: Plan) -> bytes:
    """The serialized response to a plan whose output goes into shared memory: all of it (the
    output's bytes are in the region), with that output's entry of ``raw_output_contents``
    empty, as Triton sends one per output."""
    response = _response(plan)
    response.raw_output_contents.append(b"")
    return response.SerializeToString()


def encode(
    plan: Plan,
    backend: Backend,
    regions: SharedMemoryRegions | None = None,
    *,
    streamed: bool = False,
) -> bytes:
    """Run ``plan`` into a serialized ``ModelInferResponse``: its one output's bytes, written by
    the kernel in place after its head (``response_head``; the plan's when a template knew it), as
    ``raw_output_contents[0]`` (grpcio sends only ``bytes``: a large answer is made as one and
    written in place, ``answer_bytes.fresh``; protobuf would have copied the output twice); or, for
    an output in shared memory, written into
    its region, its entry of ``raw_output_contents`` empty and its parameters none, as Triton
    answers (the caller named the region). ``streamed``: a ``ModelStreamInferResponse`` holding
    that response, marked final (``FINAL_RESPONSE``), framed around it in the same buffer."""
    if plan.shared_output is not None:
        assert regions is not None  # the core's plan refused shared memory without regions
        run_to_region(plan, backend, regions)
        if not streamed:  # the whole answer: the template's, made once, when it has one
            return region_answer(plan) if plan.response_head is None else plan.response_head
        response = _response(plan)
        response.raw_output_contents.append(b"")
        response.parameters["triton_final_response"].bool_param = True
        return pb.ModelStreamInferResponse(infer_response=response).SerializeToString()
    call = plan.call
    head = response_head(plan) if plan.response_head is None else plan.response_head
    nbytes = plan.output_nbytes
    tail = frame = b""
    if streamed:
        tail = FINAL_RESPONSE
        frame = wire.raw_field(STREAM_INFER_RESPONSE, len(head) + nbytes + len(tail))
    start = len(frame) + len(head)
    size = start + nbytes + len(tail)
    # Every byte is written below: the frame, the head, the output (by the kernel), the tail.
    answer: bytes | None = None
    body: bytearray | memoryview
    if size >= answer_bytes.FRESH_MIN_BYTES:
        answer, body = answer_bytes.fresh(size)
    else:
        body = bytearray(size)
    body[len(frame) : start] = head
    if streamed:
        body[: len(frame)] = frame
        body[start + nbytes :] = tail
    shape = call.output_shape
    out = np.frombuffer(body, wire_dtype(call.output_datatype), math.prod(shape), start)
    # Flat already when the output is (a reshape to its own shape is a new view: 0.3 us).
    run_to_host(plan, backend, regions, out if len(shape) == 1 else out.reshape(shape))
    return bytes(body) if answer is None else answer


def template_of(
    planned: Plan, message: pb.ModelInferRequest, backend: Backend
) -> PlanTemplate | None:
    """The template of a plan (each raw input's buffer its raw contents, whole, in the order
    sent; one in shared memory located again at each use; the response's head; what its runs on
    ``backend`` hold and touch), or None when an input has typed contents (not worth keeping).
    The data plane keeps it under the message without its raw contents
    (``wire.SplitRequest.message``, which names the regions) and their sizes."""
    if any(tensor.HasField("contents") for tensor in message.inputs):
        return None
    in_regions = {shared.name for shared in planned.shared_inputs}
    raw_inputs = (tensor for tensor in message.inputs if tensor.name not in in_regions)
    whole = slice(None)
    where = {
        tensor.name: (index, whole, wire_dtype(BY_NAME[tensor.datatype]), tuple(tensor.shape))
        for index, tensor in enumerate(raw_inputs)
    }
    # An output in shared memory has no bytes in the answer: its head is the whole answer.
    head = response_head(planned) if planned.shared_output is None else region_answer(planned)
    return PlanTemplate.decided(planned, where, backend, response_head=head)


__all__ = [
    "FINAL_RESPONSE",
    "encode",
    "plan",
    "plan_and_keep",
    "region_answer",
    "response_head",
    "template_of",
]
