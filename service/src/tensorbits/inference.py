"""One v2 inference, from request body to response body: parse, check, plan, run, encode.

``plan`` does everything that can fail on bad input, before any output memory exists: the JSON
header (strict, bounded), the wire model, the limits, the binary framing, the operator's rules,
the JSON data. Binary inputs stay where they arrived: ``np.frombuffer`` views of the request
body. ``execute`` then knows the output's shape and type, so it writes the response's JSON header
first, allocates ONE buffer for header plus output, and has the kernel write the output straight
into that buffer's tail, which is sent as it is (no copy from output to response).

Both are plain functions, CPU-bound; the HTTP layer decides whether to run them on a worker
thread. Every failure is a ``TensorbitsError`` (400, 404, 413), never a bare exception.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel, ValidationError

from tensorbits.backends.base import Backend
from tensorbits.config import Settings
from tensorbits.engine import run_into_host
from tensorbits.header_cache import HeaderCache
from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import BY_NAME, DataType, itemsize, wire_dtype
from tensorbits_protocol.errors import InvalidRequest, OperatorNotFound, PayloadTooLarge
from tensorbits_protocol.jsondata import (
    JsonLimits,
    MemberLimit,
    decode_data,
    encode_data,
    parse_json,
    require_json_form,
)
from tensorbits_protocol.operators import OperatorSpec, get_operator
from tensorbits_protocol.schema_errors import field_path, first_error
from tensorbits_protocol.v2 import InferenceRequest, RequestInput
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

MODEL_VERSION = "1"
MODEL_VERSIONS = (MODEL_VERSION,)
# Room in the JSON value count for what surrounds tensor data: per tensor its keys, shape and
# parameters; per request its id and parameters. max_json_elements then bounds the data itself.
ENVELOPE_VALUES = 64
ENVELOPE_VALUES_PER_TENSOR = 64
# Output parameters of Triton's classification and shared-memory extensions: they change what an
# output means, so they are refused rather than ignored (codec.check_content refuses the input's).
UNSUPPORTED_OUTPUT_PARAMETERS = {
    "classification": "the classification extension",
    "shared_memory_region": "the shared-memory extension",
}
# JSON output costs far more per element than its binary bytes; this weighs it for offloading.
JSON_BYTES_PER_ELEMENT = 8

Model = TypeVar("Model", bound=BaseModel)
Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class Limits:
    """The request limits of ``Settings`` that one inference is held to."""

    max_tensors: int
    max_tensor_elements: int
    max_json_elements: int
    json: JsonLimits

    @classmethod
    def from_settings(cls, settings: Settings) -> Limits:
        envelope = ENVELOPE_VALUES + ENVELOPE_VALUES_PER_TENSOR * settings.max_tensors
        return cls(
            max_tensors=settings.max_tensors,
            max_tensor_elements=settings.max_tensor_elements,
            max_json_elements=settings.max_json_elements,
            json=JsonLimits(
                settings.max_json_depth,
                settings.max_json_elements + envelope,
                members=(
                    MemberLimit(
                        ("inputs", "outputs"),
                        settings.max_tensors,
                        "TENSORBITS_MAX_TENSORS",
                        "max_tensors",
                        "inputs and outputs",
                    ),
                ),
            ),
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """A checked inference, ready to run: nothing about it can be the caller's fault any more."""

    op: OperatorSpec
    call: ResolvedCall
    request_id: str | None
    inputs: list[Array]  # in the operator's input order
    binary_output: bool
    output_nbytes: int
    # The binary response's JSON header when already known (a cached header's plan): it depends
    # on nothing that running the plan decides.
    response_header: bytes | None = None

    @property
    def work_bytes(self) -> int:
        """Memory the run touches: inputs read, output written (and JSON text for JSON output)."""
        out = self.output_nbytes
        if not self.binary_output:
            out += math.prod(self.call.output_shape) * JSON_BYTES_PER_ELEMENT
        return sum(x.nbytes for x in self.inputs) + out


@dataclass(frozen=True, slots=True)
class Encoded:
    """A response body and how to send it."""

    body: bytes | memoryview
    media_type: str
    header_length: int | None  # of the JSON header before binary data; None: all JSON


# --- parsing ------------------------------------------------------------------------------------


def validate_document(model: type[Model], document: object, what: str) -> Model:
    """``document`` as ``model``; pydantic's first complaint becomes a 400 naming the field (and,
    inside ``inputs``/``outputs``, the tensor by its name)."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    loc, message, rule = first_error(errors)
    field = field_path(loc, "body")
    owner = ""
    if len(loc) >= 2 and loc[0] in ("inputs", "outputs") and isinstance(loc[1], int):
        items = document.get(loc[0]) if isinstance(document, dict) else None
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str):
            owner = f"{str(loc[0])[:-1]} '{name[:100]}': "
    where = f"{field}: " if loc else ""
    raise InvalidRequest(f"{what}: {owner}{where}{message}", field=field, rule=rule)


def _frame(tensor: RequestInput) -> codec.TensorFrame:
    parameters = tensor.parameters
    extra = (parameters.model_extra or {}) if parameters is not None else {}
    return codec.TensorFrame(
        name=tensor.name,
        datatype=BY_NAME[tensor.datatype],  # a Literal of the names: always there
        shape=tuple(tensor.shape),
        binary_size=parameters.binary_data_size if parameters is not None else None,
        has_data="data" in tensor.model_fields_set,
        shared_memory="shared_memory_region" in extra,
    )


def _check_elements(frames: list[codec.TensorFrame], limits: Limits) -> None:
    json_elements = 0
    for frame in frames:
        count = math.prod(frame.shape)
        if count > limits.max_tensor_elements:
            raise PayloadTooLarge(
                f"input '{frame.name}': shape {list(frame.shape)} has {count} elements, more than "
                f"the limit of {limits.max_tensor_elements} (TENSORBITS_MAX_TENSOR_ELEMENTS)",
                field=frame.name,
                rule="max_tensor_elements",
            )
        if frame.has_data:
            json_elements += count
    if json_elements > limits.max_json_elements:
        raise PayloadTooLarge(
            f"JSON data of {json_elements} elements exceeds the limit of "
            f"{limits.max_json_elements} (TENSORBITS_MAX_JSON_ELEMENTS); send large tensors as "
            "binary data",
            field="inputs",
            rule="max_json_elements",
        )


def _unique_names(frames: list[codec.TensorFrame]) -> None:
    seen: set[str] = set()
    for frame in frames:
        if frame.name in seen:
            raise InvalidRequest(
                f"input '{frame.name[:100]}' appears more than once",
                field=frame.name[:100],
                rule="duplicate_input",
            )
        seen.add(frame.name)


def _binary_output(op: OperatorSpec, request: InferenceRequest) -> bool:
    """Whether the output goes back as binary data: the request-wide default
    ``binary_data_output``, overridden by the output's own ``binary_data``."""
    default = bool(request.parameters and request.parameters.binary_data_output)
    outputs = request.outputs or []
    seen: set[str] = set()
    for output in outputs:
        if output.name != op.output:
            raise InvalidRequest(
                f"output '{output.name[:100]}': {op.name} has no output of that name "
                f"(outputs: {op.output})",
                field=output.name[:100],
                rule="unknown_output",
            )
        if output.name in seen:
            raise InvalidRequest(
                f"output '{output.name}' is requested more than once",
                field=output.name,
                rule="duplicate_output",
            )
        seen.add(output.name)
        extra = (output.parameters.model_extra or {}) if output.parameters else {}
        for key, what in UNSUPPORTED_OUTPUT_PARAMETERS.items():
            if key in extra:
                raise InvalidRequest(
                    f"output '{output.name}': parameters.{key}: {what} is not supported",
                    field=output.name,
                    rule="unsupported_parameter",
                )
        if output.parameters is not None and output.parameters.binary_data is not None:
            default = output.parameters.binary_data
    return default


def _operator_parameters(request: InferenceRequest) -> dict[str, object]:
    if request.parameters is None:
        return {}
    return request.parameters.model_dump(exclude_none=True)


def _check_output(call: ResolvedCall, binary: bool, limits: Limits) -> None:
    name, count = call.op.output, math.prod(call.output_shape)
    if count > limits.max_tensor_elements:
        raise PayloadTooLarge(
            f"output '{name}': shape {list(call.output_shape)} has {count} elements, more than "
            f"the limit of {limits.max_tensor_elements} (TENSORBITS_MAX_TENSOR_ELEMENTS)",
            field=name,
            rule="max_tensor_elements",
        )
    if binary:
        return
    require_json_form(name, call.output_datatype, "output")
    if count > limits.max_json_elements:
        raise PayloadTooLarge(
            f"output '{name}': {count} elements are too many for JSON data (limit "
            f"{limits.max_json_elements}, TENSORBITS_MAX_JSON_ELEMENTS); request binary data",
            field=name,
            rule="max_json_elements",
        )


@dataclass(frozen=True, slots=True)
class PlanTemplate:
    """What one all-binary request header decides: everything in a plan but the tensors' bytes,
    and where those lie in the body's tail (per operator input: wire dtype, shape, start, end)."""

    call: ResolvedCall
    request_id: str | None
    binary_output: bool
    output_nbytes: int
    inputs: tuple[tuple[np.dtype[Any], tuple[int, ...], int, int], ...]
    response_header: bytes | None  # for binary output

    def plan(self, op: OperatorSpec, tail: memoryview) -> Plan:
        return Plan(
            op=op,
            call=self.call,
            request_id=self.request_id,
            inputs=[
                np.frombuffer(tail[start:end], dtype).reshape(shape)
                for dtype, shape, start, end in self.inputs
            ],
            binary_output=self.binary_output,
            output_nbytes=self.output_nbytes,
            response_header=self.response_header,
        )


# The longest v2 header worth remembering: a few inputs' names, shapes and parameters.
CACHED_HEADER_MAX_BYTES = 4096


def plan(
    op: OperatorSpec,
    body: bytearray,
    header_length: int | None,
    limits: Limits,
    cache: HeaderCache[PlanTemplate] | None = None,
) -> Plan:
    """Parse and check one inference request for ``op``; raise on anything wrong with it.

    With a ``cache``, an all-binary header planned before is not parsed again (header_cache.py):
    the plan is rebuilt from what it decided, with views of this body's bytes."""
    head, tail = codec.split_body(memoryview(body), header_length)
    header = bytes(head)
    key: tuple[str, bytes, int] | None = None
    if cache is not None and header_length is not None and cache.keeps(header):
        key = (op.name, header, len(tail))
        template = cache.get(key)
        if template is not None:
            return template.plan(op, tail)
    what = "inference header" if header_length is not None else "request body"
    document = parse_json(header, limits.json, what)  # tensors counted before it is parsed
    request = validate_document(InferenceRequest, document, what)
    frames = [_frame(tensor) for tensor in request.inputs]
    _unique_names(frames)
    for frame in frames:
        codec.check_content(frame)
        if frame.has_data:
            require_json_form(frame.name, frame.datatype, "input")
    _check_elements(frames, limits)
    slices = codec.slice_tensors(frames, tail, op.name, header_given=header_length is not None)
    call = validate_call(
        op,
        {f.name: TensorSpec(f.datatype, f.shape) for f in frames},
        _operator_parameters(request),
    )
    binary = _binary_output(op, request)
    _check_output(call, binary, limits)
    arrays: dict[str, Array] = {}
    for frame, tensor, raw in zip(frames, request.inputs, slices, strict=True):
        if raw is not None:
            # A view of the request body, not a copy. It may be misaligned for its type (the
            # header before it has any length); NumPy handles that, about 20% slower, which is
            # still cheaper than the copy that would align it.
            arrays[frame.name] = np.frombuffer(raw, wire_dtype(frame.datatype)).reshape(frame.shape)
        else:
            arrays[frame.name] = decode_data(frame.name, frame.datatype, frame.shape, tensor.data)
    planned = Plan(
        op=op,
        call=call,
        request_id=request.id,
        inputs=[arrays[name] for name in op.inputs],
        binary_output=binary,
        output_nbytes=math.prod(call.output_shape) * itemsize(call.output_datatype),
    )
    if cache is not None and key is not None and all(raw is not None for raw in slices):
        cache.put(key, _template(planned, frames, slices), len(header))
    return planned


def _template(
    planned: Plan, frames: list[codec.TensorFrame], slices: list[memoryview | None]
) -> PlanTemplate:
    # Where each input's slice lies in the tail, in the operator's input order.
    where: dict[str, tuple[np.dtype[Any], tuple[int, ...], int, int]] = {}
    start = 0
    for frame, raw in zip(frames, slices, strict=True):
        assert raw is not None  # all-binary headers only
        where[frame.name] = (wire_dtype(frame.datatype), frame.shape, start, start + len(raw))
        start += len(raw)
    return PlanTemplate(
        call=planned.call,
        request_id=planned.request_id,
        binary_output=planned.binary_output,
        output_nbytes=planned.output_nbytes,
        inputs=tuple(where[name] for name in planned.op.inputs),
        response_header=binary_response_header(planned) if planned.binary_output else None,
    )


# --- running and encoding -----------------------------------------------------------------------


def _response_document(plan: Plan, binary_size: int | None) -> dict[str, Any]:
    """The response header, in the shape of ``v2.InferenceResponse`` (exclude_none).

    Written as a dict: building and dumping the pydantic models costs more than the rest of a
    small inference. tests/service/test_v2_infer.py validates responses against the model."""
    call = plan.call
    output: dict[str, Any] = {
        "name": plan.op.output,
        "shape": list(call.output_shape),
        "datatype": call.output_datatype.value,
    }
    if binary_size is not None:
        output["parameters"] = {"binary_data_size": binary_size}
    document: dict[str, Any] = {"model_name": plan.op.name, "model_version": MODEL_VERSION}
    if plan.request_id is not None:
        document["id"] = plan.request_id
    document["outputs"] = [output]
    return document


def binary_response_header(plan: Plan) -> bytes:
    """The JSON header of the plan's response with its output as binary data."""
    return codec.dump_header(_response_document(plan, plan.output_nbytes))


def execute(plan: Plan, backend: Backend) -> Encoded:
    """Run a plan and encode the response (binary: one buffer, written in place)."""
    call = plan.call
    dtype = wire_dtype(call.output_datatype)
    if plan.binary_output:
        header = plan.response_header or binary_response_header(plan)
        layout = codec.BodyLayout(header, (plan.output_nbytes,))
        body, (tail,) = layout.allocate()
        out = np.frombuffer(tail, dtype).reshape(call.output_shape)
        run_into_host(backend, call, plan.inputs, out)
        return Encoded(body, codec.BINARY_CONTENT_TYPE, layout.header_length)
    out = np.empty(call.output_shape, dtype)
    run_into_host(backend, call, plan.inputs, out)
    document = _response_document(plan, None)
    document["outputs"][0]["data"] = encode_data(plan.op.output, out)
    return Encoded(codec.dump_header(document, align=False), codec.JSON_CONTENT_TYPE, None)


def resolve_model(name: str, version: str | None) -> OperatorSpec:
    """The operator a v2 model name (and optional version) names; 404 for any other."""
    op = get_operator(name)
    if version is not None and version not in MODEL_VERSIONS:
        raise OperatorNotFound(
            f"model '{op.name}' has no version '{version[:40]}' "
            f"(versions: {', '.join(MODEL_VERSIONS)})",
            field="model_version",
            rule="unknown_version",
        )
    return op


def model_metadata_types(op: OperatorSpec) -> tuple[DataType, DataType]:
    """The one input and output data type the v2 metadata reports for ``op``: the first type of
    its oldest support row, which every feature level and version accepts (UINT8 throughout),
    and what the output is for it (BIT_COUNT: its default, the first of its output types)."""
    oldest = op.support[-1]
    input_type = oldest.input_types[0]
    return input_type, oldest.output_types[0] if oldest.output_types else input_type


__all__ = [
    "MODEL_VERSION",
    "MODEL_VERSIONS",
    "Encoded",
    "Limits",
    "Plan",
    "PlanTemplate",
    "execute",
    "model_metadata_types",
    "plan",
    "resolve_model",
    "validate_document",
]
