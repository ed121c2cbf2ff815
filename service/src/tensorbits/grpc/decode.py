"""The gRPC form of a v2 inference request, read: ``ModelInferRequest`` in, the protocol-neutral
``InferRequest`` out.

``infer_request`` checks the message by the rules every front end shares, in the words HTTP
gives for the same mistake: each descriptor and parameter value by the rule table
(``tensorbits_protocol.descriptors``: data types, shapes, parameter values, checked on the
parsed message, in the order the REST model checks a document), then the parameter policy
(``descriptors.check_parameter_keys``), ``check_unique``, ``codec.check_content`` (one way of
giving each input), ``check_sizes``. What is the gRPC form's own is checked here: a parameter
with no value set; inputs given as ``raw_input_contents`` (one per input not in shared memory,
each exactly ``prod(shape) * element size`` bytes), as typed ``contents`` (in the field of their
data type, as many values as the shape has elements; never beside raw contents) or in shared
memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from tensorbits.grpc import inference_pb2 as pb
from tensorbits_protocol import codec
from tensorbits_protocol.descriptors import (
    PARAMETER_VALUES,
    Where,
    check_datatype,
    check_parameter_keys,
    check_parameter_values,
    check_shape,
)
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import (
    InferRequest,
    RequestedOutput,
    RequestLimits,
    SharedMemoryRef,
    Tensor,
    check_sizes,
    check_unique,
)
from tensorbits_protocol.parameters import Level

WHAT = "ModelInferRequest"

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
_NO_VALUES: Mapping[str, Any] = MappingProxyType({})
_SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")
_REQUEST = Where(WHAT)  # the request's own parameters: no tensor to name


def _output(index: int, name: str) -> Where:
    return Where(WHAT, "outputs", index, name)


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


def _parameters(
    level: Level, parameters: Mapping[str, pb.InferParameter], where: Where
) -> Mapping[str, Any]:
    """A parameter map's values, each checked by its key's rule at ``level``."""
    if not parameters:
        return _NO_VALUES  # the common case: nothing to read, nothing built
    values = {name: parameter_value(name, value) for name, value in parameters.items()}
    check_parameter_values(level, values, where)
    return values


def _extra(level: Level, values: Mapping[str, Any]) -> tuple[str, ...]:
    """The keys of a tensor's parameters the rule table does not name, in the map's order: the
    ones the parameter policy looks up (as the REST model's ``model_extra``)."""
    named = PARAMETER_VALUES[level]
    return tuple(key for key in values if key not in named)


def _shared_reference(
    values: Mapping[str, Any], name: str, direction: str
) -> SharedMemoryRef | None:
    """A tensor's shared-memory parameters (checked by the rule table) as a reference, None
    when it has none: ``infer.shared_reference``'s rule and words, on the values themselves."""
    if not values:
        return None
    region, byte_size, offset = (values.get(key) for key in _SHARED_MEMORY_KEYS)
    if region is None and byte_size is None and offset is None:
        return None
    if region is None or byte_size is None:
        raise InvalidRequest(
            f"{direction} '{name[:100]}': shared_memory_region and shared_memory_byte_size go "
            "together (shared_memory_offset is optional, default 0)",
            field=name[:100],
            rule="shared_memory",
        )
    return SharedMemoryRef(region, byte_size, offset or 0)


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
    # The descriptors and parameter values first, all of them, in the REST model's order (the
    # request's parameters, then each input's shape, data type and parameters, then each
    # output's parameters), so that the first mistake is the one HTTP names. Each protobuf
    # container is read once: every read of one builds a wrapper (a tenth of a microsecond).
    parameters = dict(_parameters(Level.REQUEST, message.parameters, _REQUEST))
    described = []
    for index, tensor in enumerate(message.inputs):
        name = tensor.name
        where = Where(WHAT, "inputs", index, name)
        shape = check_shape(tuple(tensor.shape), where)
        datatype = check_datatype(tensor.datatype, where)
        values = _parameters(Level.INPUT, tensor.parameters, where)
        described.append((tensor, name, shape, datatype, values))
    requested = [
        (output.name, _parameters(Level.OUTPUT, output.parameters, _output(index, output.name)))
        for index, output in enumerate(message.outputs)
    ]
    # Then the parameter policy: every key known and none refused.
    for index, (_, name, _, _, values) in enumerate(described):
        if values:
            check_parameter_keys(Level.INPUT, index, name, len(values), _extra(Level.INPUT, values))
    for index, (name, values) in enumerate(requested):
        if values:
            check_parameter_keys(
                Level.OUTPUT, index, name, len(values), _extra(Level.OUTPUT, values)
            )
    shared = [_shared_reference(values, name, "input") for _, name, _, _, values in described]
    unshared = shared.count(None)
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
    for (tensor, name, shape, datatype, _), ref in zip(described, shared, strict=True):
        has_contents = tensor.HasField("contents")
        if raw and has_contents:
            raise InvalidRequest(
                f"input '{name}': contents must not be given when the request has "
                "raw_input_contents",
                field=name,
                rule="contents",
            )
        if ref is None and not raw and not has_contents:
            raise InvalidRequest(
                f"input '{name}' has no contents, and the request no raw_input_contents",
                field=name,
                rule="contents",
            )
        own_raw = next(next_raw) if raw and ref is None else None
        raw_of.append(own_raw)
        frames.append(
            codec.TensorFrame(
                name=name,
                datatype=datatype,
                shape=shape,
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
    for index, (frame, (tensor, *_), own_raw, ref) in enumerate(
        zip(frames, described, raw_of, shared, strict=True)
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
    # Outputs go back as raw_output_contents whatever the request says (Triton does the same),
    # or into their shared-memory region: binary_data_output and binary_data are ignored here,
    # as binary_data_size is (raw contents carry their own lengths), as parameters.POLICY says.
    parameters["binary_data_output"] = True
    outputs = None
    if requested:
        outputs = tuple(
            RequestedOutput(
                name, True, _extra(Level.OUTPUT, values), _shared_reference(values, name, "output")
            )
            for name, values in requested
        )
    return InferRequest(tuple(inputs), parameters, outputs, message.id or None)


__all__ = ["CONTENTS_FIELD", "WHAT", "infer_request", "parameter_value"]
