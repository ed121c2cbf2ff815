"""The gRPC form of a v2 inference: ``ModelInferRequest`` in, ``ModelInferResponse`` out.

``infer_request`` turns the message into the protocol-neutral ``InferRequest`` that
``inference.plan`` checks, as ``InferRequest.from_rest`` does for the REST form, through the same
checks and in the same words: the request's fields are validated by the REST request's own
pydantic model (``v2.InferenceRequest``: names, data types, shapes, parameter values), then
``check_parameters`` (the parameter policy, ``tensorbits_protocol.parameters``), ``check_unique``,
``codec.check_content`` (one way of giving each input), ``check_sizes``. What is
the gRPC form's own is checked here: inputs given as ``raw_input_contents`` (one per input not in
shared memory, each exactly ``prod(shape) * element size`` bytes), as typed ``contents`` (in the
field of their data type, as many values as the shape has elements; never beside raw contents)
or in shared memory; outputs go back as ``raw_output_contents``, as Triton sends them, or into
their shared-memory region.

``execute`` runs a plan into the response's own bytes: the protobuf-built part (names, types,
shapes), then the output as one entry of ``raw_output_contents`` written by the kernel in place
(``wire.raw_field``). An output written into shared memory still has its entry, empty, as
Triton sends one per output whatever its place: Triton's C++ client (perf_analyzer) reads
``raw_output_contents[i]`` for the i-th output unchecked. ``streamed``: the same response inside
a ``ModelStreamInferResponse``, marked as its request's final one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorbits import inference
from tensorbits.backends.base import Backend
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire
from tensorbits.inference import MODEL_VERSION, Plan
from tensorbits.shared_memory import SharedMemoryRegions
from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import BY_NAME, DataType, wire_dtype
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import (
    InferRequest,
    RequestedOutput,
    RequestLimits,
    Tensor,
    check_parameters,
    check_sizes,
    check_unique,
    shared_reference,
)
from tensorbits_protocol.operators import OperatorSpec
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import InferenceRequest

WHAT = "ModelInferRequest"
# ModelStreamInferResponse.infer_response: a streamed answer is the unary one, framed in it.
STREAM_INFER_RESPONSE = 2
# Appended to each ModelInferResponse of a stream: Triton marks every response of a stream with
# triton_final_response, true on a request's last (every request here has one response). A
# message's fields may come in any order, and map entries anywhere, so it follows the output.
FINAL_RESPONSE = pb.ModelInferResponse(
    parameters={"triton_final_response": pb.InferParameter(bool_param=True)}
).SerializeToString()

# Where a tensor's typed values travel (InferTensorContents): one field per data type; FP16 has
# none, as in the protocol (raw contents only).
CONTENTS_FIELD: Mapping[DataType, str] = {
    DataType.BOOL: "bool_contents",
    DataType.UINT8: "uint_contents",
    DataType.UINT16: "uint_contents",
    DataType.UINT32: "uint_contents",
    DataType.UINT64: "uint64_contents",
    DataType.INT8: "int_contents",
    DataType.INT16: "int_contents",
    DataType.INT32: "int_contents",
    DataType.INT64: "int64_contents",
    DataType.FP32: "fp32_contents",
    DataType.FP64: "fp64_contents",
}
_ALL_CONTENTS_FIELDS = tuple(pb.InferTensorContents.DESCRIPTOR.fields_by_name)


def parameter_value(name: str, parameter: pb.InferParameter) -> Any:
    """An ``InferParameter``'s value: whichever of its oneof members is set."""
    which = parameter.WhichOneof("parameter_choice")
    if which is None:
        raise InvalidRequest(
            f"parameters.{name[:100]}: no value is set (one of bool_param, int64_param, "
            "string_param, double_param, uint64_param)",
            field=f"parameters.{name[:100]}",
            rule="parameter_value",
        )
    return getattr(parameter, which)


def _parameters(parameters: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    return {name: parameter_value(name, value) for name, value in parameters.items()}


def _document(message: pb.ModelInferRequest) -> dict[str, Any]:
    """The message's fields in the REST request's shape, to be checked by its model."""
    document: dict[str, Any] = {
        "inputs": [
            {
                "name": tensor.name,
                "shape": list(tensor.shape),
                "datatype": tensor.datatype,
                "parameters": _parameters(tensor.parameters),
            }
            for tensor in message.inputs
        ],
    }
    if message.id:
        document["id"] = message.id
    if message.parameters:
        document["parameters"] = _parameters(message.parameters)
    if message.outputs:
        document["outputs"] = [
            {"name": output.name, "parameters": _parameters(output.parameters)}
            for output in message.outputs
        ]
    return document


def _contents(tensor: pb.ModelInferRequest.InferInputTensor, datatype: DataType) -> list[Any]:
    """A tensor's typed values, from the one field its data type travels in."""
    name = tensor.name
    field = CONTENTS_FIELD.get(datatype)
    contents = tensor.contents
    given = [f for f in _ALL_CONTENTS_FIELDS if len(getattr(contents, f))]
    if field is None:
        raise InvalidRequest(
            f"input '{name}': {datatype} has no typed contents in the protocol; send it in "
            "raw_input_contents",
            field=name,
            rule="typed_datatype",  # HTTP's rule for a type with no JSON form: one rule
        )
    if given and given != [field]:
        raise InvalidRequest(
            f"input '{name}': {datatype} values go in contents.{field}, not in "
            f"{', '.join('contents.' + f for f in given)}",
            field=name,
            rule="contents",
        )
    values = getattr(contents, field)
    count = math.prod(tensor.shape)
    if len(values) != count:
        raise InvalidRequest(
            f"input '{name}': contents.{field} has {len(values)} values, shape "
            f"{list(tensor.shape)} has {count} elements",
            field=name,
            rule="data_size",  # as HTTP's JSON data of the wrong length
        )
    return list(values)


def infer_request(
    message: pb.ModelInferRequest, raw: list[memoryview], limits: RequestLimits
) -> InferRequest:
    """The protocol-neutral request of ``message`` (whose raw contents ``wire`` split off as
    ``raw``), checked as far as it can be without the operator. An input's bytes come one of
    three ways: typed ``contents``, an entry of ``raw_input_contents`` (one per input that is
    not in shared memory, in order; never beside typed contents, as in Triton), or the
    shared-memory parameters."""
    request = validate_document(InferenceRequest, _document(message), WHAT)
    check_parameters(request)
    shared = [
        shared_reference(checked.parameters, checked.name, "input") for checked in request.inputs
    ]
    unshared = sum(ref is None for ref in shared)
    if raw and len(raw) != unshared:
        raise InvalidRequest(
            f"raw_input_contents has {len(raw)} entries for {unshared} inputs not in shared "
            "memory: give one per such input, in the order of the inputs",
            field="raw_input_contents",
            rule="raw_contents",
        )
    frames = []
    raw_of: list[memoryview | None] = []
    next_raw = iter(raw)
    for tensor, checked, ref in zip(message.inputs, request.inputs, shared, strict=True):
        has_contents = tensor.HasField("contents")
        if raw and has_contents:
            raise InvalidRequest(
                f"input '{tensor.name}': contents must not be given when the request has "
                "raw_input_contents",
                field=tensor.name,
                rule="contents",
            )
        if ref is None and not raw and not has_contents:
            raise InvalidRequest(
                f"input '{tensor.name}' has no contents, and the request no raw_input_contents",
                field=tensor.name,
                rule="contents",
            )
        own_raw = next(next_raw) if raw and ref is None else None
        raw_of.append(own_raw)
        frames.append(
            codec.TensorFrame(
                name=checked.name,
                datatype=BY_NAME[checked.datatype],
                shape=tuple(checked.shape),
                binary_size=own_raw.nbytes if own_raw is not None else None,
                has_data=has_contents,
                shared_memory=ref is not None,
            )
        )
    check_unique(frames)
    for frame in frames:
        codec.check_content(frame)
    check_sizes(frames, limits)
    inputs = []
    for index, (frame, tensor, own_raw, ref) in enumerate(
        zip(frames, message.inputs, raw_of, shared, strict=True)
    ):
        if ref is not None:
            inputs.append(Tensor(frame.name, frame.datatype, frame.shape, shared_memory=ref))
        elif own_raw is not None:
            if own_raw.nbytes != frame.nbytes:
                raise InvalidRequest(
                    f"input '{frame.name}': raw_input_contents[{index - raw_of[:index].count(None)}]"
                    f" has {own_raw.nbytes} bytes, {frame.datatype} {list(frame.shape)} needs "
                    f"{frame.nbytes}",
                    field=frame.name,
                    rule="binary_data_size",  # as HTTP's binary data of the wrong size
                )
            inputs.append(Tensor(frame.name, frame.datatype, frame.shape, raw=own_raw))
        else:
            data = _contents(tensor, frame.datatype)
            inputs.append(Tensor(frame.name, frame.datatype, frame.shape, data=data))
    parameters = {} if request.parameters is None else request.parameters.model_dump()
    # Outputs go back as raw_output_contents whatever the request says (Triton does the same),
    # or into their shared-memory region: binary_data_output and binary_data are ignored here,
    # as binary_data_size is (raw contents carry their own lengths), as parameters.POLICY says.
    parameters["binary_data_output"] = True
    outputs = None
    if request.outputs is not None:
        outputs = tuple(
            RequestedOutput(
                output.name,
                True,
                tuple(output.parameters.model_extra or ()) if output.parameters else (),
                shared_reference(output.parameters, output.name, "output"),
            )
            for output in request.outputs
        )
    return InferRequest(tuple(inputs), parameters, outputs, request.id)


def plan(
    op: OperatorSpec,
    message: pb.ModelInferRequest,
    raw: list[memoryview],
    limits: RequestLimits,
    regions: SharedMemoryRegions | None = None,
) -> Plan:
    """``message`` checked and planned for ``op``: ``infer_request``, then ``inference.plan``."""
    return inference.plan(op, infer_request(message, raw, limits), limits, regions)


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


def execute(
    plan: Plan,
    backend: Backend,
    regions: SharedMemoryRegions | None = None,
    head: bytes | None = None,
    *,
    streamed: bool = False,
) -> bytes:
    """Run ``plan`` into a serialized ``ModelInferResponse``: its one output's bytes, written by
    the kernel in place after ``head`` (``response_head``; given when a template knows it), as
    ``raw_output_contents[0]`` (grpcio sends only ``bytes``: the one copy of the output is that
    conversion; protobuf would have made two); or, for an output in shared memory, written into
    its region, its entry of ``raw_output_contents`` empty and its parameters none, as Triton
    answers (the caller named the region). ``streamed``: a ``ModelStreamInferResponse`` holding
    that response, marked final (``FINAL_RESPONSE``), framed around it in the same buffer."""
    if plan.shared_output is not None:
        assert regions is not None  # inference.plan refused shared memory without regions
        inference.run_to_region(plan, backend, regions)
        response = _response(plan)
        response.raw_output_contents.append(b"")
        if not streamed:
            return response.SerializeToString()
        response.parameters["triton_final_response"].bool_param = True
        return pb.ModelStreamInferResponse(infer_response=response).SerializeToString()
    call = plan.call
    head = response_head(plan) if head is None else head
    tail = FINAL_RESPONSE if streamed else b""
    inner = len(head) + plan.output_nbytes + len(tail)
    frame = wire.raw_field(STREAM_INFER_RESPONSE, inner) if streamed else b""
    start = len(frame) + len(head)
    body = bytearray(start + plan.output_nbytes + len(tail))
    body[: len(frame)] = frame
    body[len(frame) : start] = head
    body[start + plan.output_nbytes :] = tail
    count = math.prod(call.output_shape)
    out = np.frombuffer(body, wire_dtype(call.output_datatype), count, start)
    inference.run_to_host(plan, backend, regions, out.reshape(call.output_shape))
    return bytes(body)


@dataclass(frozen=True, slots=True)
class PlanTemplate(inference.PlanTemplate):
    """``inference.PlanTemplate`` for a ``ModelInferRequest`` whose inputs are all raw contents
    (each input's buffer is its raw contents, whole), and the response's head. Keyed by the
    message without its raw contents (``wire.SplitRequest.message``) and the raw contents'
    sizes."""

    head: bytes

    @classmethod
    def of(cls, planned: Plan, message: pb.ModelInferRequest) -> PlanTemplate | None:
        """The template of a plan, or None when its request is not all raw contents (typed
        contents or shared memory: not worth keeping, or not the same on the next call)."""
        if planned.shared_inputs or planned.shared_output is not None:
            return None
        if any(tensor.HasField("contents") for tensor in message.inputs):
            return None
        whole = slice(None)
        where = {
            tensor.name: (index, whole, wire_dtype(BY_NAME[tensor.datatype]), tuple(tensor.shape))
            for index, tensor in enumerate(message.inputs)
        }
        return cls.decided(
            planned, where, binary_output=True, response_header=None, head=response_head(planned)
        )


__all__ = [
    "CONTENTS_FIELD",
    "FINAL_RESPONSE",
    "PlanTemplate",
    "execute",
    "infer_request",
    "parameter_value",
    "plan",
    "response_head",
]
