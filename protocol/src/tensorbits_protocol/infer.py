"""A v2 inference request and response, whatever protocol carries them, with their REST form.

``InferRequest`` and ``InferResponse`` say what an inference asks and answers: named tensors
(data type, shape, and either their bytes or JSON ``data``), request parameters, the outputs
asked for. They are what the server plans from and what the client reads; a front end turns its
wire form into them. This module holds the REST form (the JSON of ``tensorbits_protocol.v2``
with Triton's binary tensor data extension, framed by ``codec``): ``InferRequest.from_rest`` /
``to_rest`` and ``InferResponse.from_rest`` / ``to_rest``, the one encoder and decoder of each
message, used by the client and the server alike. The gRPC form lives with the server's gRPC
front end (``tensorbits.grpc.decode``: only the server speaks gRPC, and this package needs no
protobuf); it builds the same ``InferRequest`` by the same rules (``descriptors``: the REST
models' bounds as a table, and ``descriptors.check_parameter_keys``, ``check_unique``,
``check_sizes``, ``codec.check_content``).

The documents are written as plain dicts, not built through the pydantic models: building and
dumping the models costs more than the rest of a small inference. The tests validate what these
write against the models (``v2.InferenceRequest``, ``v2.InferenceResponse``), which stay the
contract, and decode it again (round trips). Decoding goes through the models.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from tensorbits_protocol import codec, texts
from tensorbits_protocol.descriptors import check_parameter_keys
from tensorbits_protocol.dtypes import BY_NAME, DataType, itemsize, wire_dtype
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.jsondata import (
    JsonLimits,
    decode_data,
    parse_json,
    require_json_form,
)
from tensorbits_protocol.parameters import POLICY, Level
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import (
    InferenceRequest,
    InferenceResponse,
    RequestInput,
    RequestOutput,
    SharedMemoryParameters,
)

# The messages are NamedTuples, not frozen dataclasses: one is built per tensor of every request,
# and a NamedTuple is built in a fraction of the time (the hot path's budget is microseconds).
_NO_PARAMETERS: Mapping[str, Any] = MappingProxyType({})

HostArray = np.ndarray[
    Any, Any
]  # a NumPy array in host memory (kernels.DeviceArray: any backend's)

# The output parameters refused as unsupported (Triton's classification extension: it changes
# what an output means), with the feature each belongs to: parameters.POLICY's, which refuses
# them as the request is decoded; the server's plan refuses them again for a request built directly.
UNSUPPORTED_OUTPUT_PARAMETERS = {
    key: found.what for key, found in POLICY[Level.OUTPUT].items() if found.refused
}


# What a v2 request body that is not JSON is told besides the JSON reader's words.
HEADER_LENGTH_HINT = (
    "; if the body is a JSON header followed by binary tensor data, give the header's length in "
    "bytes as Inference-Header-Content-Length"
)


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """The bounds a decoded request is held to before any tensor is read (the server's
    settings: ``TENSORBITS_MAX_TENSORS``, ``_MAX_TENSOR_ELEMENTS``, ``_MAX_JSON_ELEMENTS`` and
    the JSON reader's)."""

    max_tensors: int
    max_tensor_elements: int
    max_json_elements: int
    json: JsonLimits


class SharedMemoryRef(NamedTuple):
    """Where a tensor's bytes are in a registered shared-memory region (the shared-memory
    extension's parameters): ``byte_size`` bytes from ``offset`` within region ``region``."""

    region: str
    byte_size: int
    offset: int = 0

    def parameters(self) -> dict[str, Any]:
        """The tensor parameters that say so, as the protocol writes them."""
        entry: dict[str, Any] = {
            "shared_memory_region": self.region,
            "shared_memory_byte_size": self.byte_size,
        }
        if self.offset:
            entry["shared_memory_offset"] = self.offset
        return entry


class Tensor(NamedTuple):
    """A named tensor of a request or a response: its bytes (``raw``, little-endian, row-major),
    its JSON ``data`` (nested or flat, as sent; checked when read), or where they are in shared
    memory (``shared_memory``); none for an output whose bytes are yet to be written."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    raw: memoryview | None = None
    data: list[Any] | None = None
    shared_memory: SharedMemoryRef | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.datatype)

    def document(self, *, response: bool = False) -> dict[str, Any]:
        """The tensor as the REST JSON writes it (``v2.RequestInput``, ``v2.ResponseOutput``):
        with its ``data``, in shared memory, or as binary data of ``binary_data_size`` bytes.

        A ``response``'s output in shared memory is its name, type and shape alone, as Triton
        writes it: Triton's C++ client reads any output that has ``parameters`` as binary data
        and fails on one without ``binary_data_size``; the caller named the region anyway."""
        entry: dict[str, Any] = {
            "name": self.name,
            "shape": list(self.shape),
            "datatype": self.datatype.value,
        }
        if self.shared_memory is not None:
            if not response:
                entry["parameters"] = self.shared_memory.parameters()
        elif self.data is None:
            size = self.nbytes if self.raw is None else self.raw.nbytes
            entry["parameters"] = {"binary_data_size": size}
        else:
            entry["data"] = self.data
        return entry

    def array(self, direction: str = "input") -> HostArray:
        """The tensor as a NumPy array: a view of ``raw`` (no copy; it may be misaligned for its
        type, which NumPy handles, about 20% slower, still cheaper than the copy that would
        align it), or ``data`` checked and converted (``jsondata.decode_data``)."""
        if self.raw is not None:
            return np.frombuffer(self.raw, wire_dtype(self.datatype)).reshape(self.shape)
        if self.data is None:
            raise InvalidRequest(
                f"{direction} '{self.name[:100]}' has neither data nor binary_data_size",
                field=self.name[:100],
                rule="content",
            )
        return decode_data(self.name, self.datatype, self.shape, self.data)


class RequestedOutput(NamedTuple):
    """An output the caller asks for: ``binary`` is its ``binary_data`` parameter (None: the
    request's default), ``shared_memory`` where to write it instead (the shared-memory
    extension), ``parameters`` the names of its other parameters (Triton's reserved ones, which
    are ignored; a decoder has refused any other: ``check_parameters``)."""

    name: str
    binary: bool | None = None
    parameters: tuple[str, ...] = ()
    shared_memory: SharedMemoryRef | None = None


class InferRequest(NamedTuple):
    """One inference request: inputs in the order sent, request-level parameters (operator
    parameters and the protocol's own, e.g. ``binary_data_output``), the outputs asked for
    (None: every output); ``model_name`` and ``model_version`` when a REST body names them
    beside its URL (KServe's client does: the server checks they are the URL's)."""

    inputs: tuple[Tensor, ...]
    parameters: Mapping[str, Any] = _NO_PARAMETERS
    outputs: tuple[RequestedOutput, ...] | None = None
    id: str | None = None
    model_name: str | None = None
    model_version: str | None = None

    @property
    def binary_output(self) -> bool:
        """The request-wide default of ``binary_data_output``."""
        return bool(self.parameters.get("binary_data_output"))

    @classmethod
    def from_rest(
        cls,
        header: bytes,
        tail: memoryview,
        *,
        model: str,
        header_given: bool,
        limits: RequestLimits,
    ) -> InferRequest:
        """Decode the JSON header and the binary tail of a REST request (strict JSON, bounded
        before it is parsed; the wire model; the framing; the tensor counts), in that order:
        every check that needs no operator. The tensors' bytes stay views of ``tail``."""
        what = "inference header" if header_given else "request body"
        try:
            document = parse_json(header, limits.json, what)  # tensors counted before parsing
        except InvalidRequest as exc:
            if header_given or exc.rule != "json":
                raise
            # A whole body that is not JSON is most often JSON followed by binary tensor data
            # sent without the header that says where the JSON ends.
            raise InvalidRequest(
                exc.message + HEADER_LENGTH_HINT, field=exc.field, rule=exc.rule
            ) from None
        texts.check_document(document)  # every string, as gRPC's wire bounds them
        request = validate_document(InferenceRequest, document, what)
        check_parameters(request)
        frames = [_frame(tensor) for tensor in request.inputs]
        check_unique(frames)
        for frame in frames:
            codec.check_content(frame)
            if frame.has_data:
                require_json_form(frame.name, frame.datatype, "input")
        check_sizes(frames, limits)
        slices = codec.slice_tensors(frames, tail, model, header_given=header_given)
        inputs = tuple(
            Tensor(
                frame.name, frame.datatype, frame.shape, raw, tensor.data,
                shared_reference(tensor.parameters, frame.name, "input"),
            )
            for frame, tensor, raw in zip(frames, request.inputs, slices, strict=True)
        )  # fmt: skip
        outputs = None
        if request.outputs is not None:
            outputs = tuple(map(_requested, request.outputs))
        parameters = (
            {} if request.parameters is None else request.parameters.model_dump(exclude_none=True)
        )
        return cls(
            inputs, parameters, outputs, request.id, request.model_name, request.model_version
        )

    def to_rest(self) -> tuple[bytes, list[memoryview]]:
        """The JSON header (aligned when binary data follows) and the buffers to send after it,
        with ``Inference-Header-Content-Length: len(header)`` when there are any. Inputs with
        ``data`` go with it, the others as binary data (their ``raw``)."""
        document: dict[str, Any] = {}
        if self.id is not None:
            document["id"] = self.id
        if self.model_name is not None:
            document["model_name"] = self.model_name
        if self.model_version is not None:
            document["model_version"] = self.model_version
        if self.parameters:
            document["parameters"] = dict(self.parameters)
        document["inputs"] = [tensor.document() for tensor in self.inputs]
        buffers = [t.raw for t in self.inputs if t.data is None and t.raw is not None]
        if self.outputs is not None:
            document["outputs"] = [_output_document(output) for output in self.outputs]
        return codec.dump_header(document, align=bool(buffers)), buffers


def _requested(output: RequestOutput) -> RequestedOutput:
    parameters = output.parameters
    if parameters is None:
        return RequestedOutput(output.name)
    extra = parameters.model_extra
    return RequestedOutput(
        output.name,
        parameters.binary_data,
        tuple(extra) if extra else (),
        shared_reference(parameters, output.name, "output"),
    )


def _output_document(output: RequestedOutput) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": output.name}
    parameters: dict[str, Any] = {}
    if output.binary is not None:
        parameters["binary_data"] = output.binary
    if output.shared_memory is not None:
        parameters.update(output.shared_memory.parameters())
    if parameters:
        entry["parameters"] = parameters
    return entry


def shared_reference(
    parameters: SharedMemoryParameters | None, name: str, direction: str
) -> SharedMemoryRef | None:
    """A tensor's shared-memory parameters as a reference (None: not in shared memory); the
    region and its byte size go together, as the extension requires."""
    if parameters is None or (
        parameters.shared_memory_region is None
        and parameters.shared_memory_byte_size is None
        and parameters.shared_memory_offset is None
    ):
        return None
    if parameters.shared_memory_region is None or parameters.shared_memory_byte_size is None:
        raise InvalidRequest(
            f"{direction} '{name[:100]}': shared_memory_region and shared_memory_byte_size go "
            "together (shared_memory_offset is optional, default 0)",
            field=name[:100],
            rule="shared_memory",
        )
    return SharedMemoryRef(
        parameters.shared_memory_region,
        parameters.shared_memory_byte_size,
        parameters.shared_memory_offset or 0,
    )


class InferResponse(NamedTuple):
    """One inference response: its outputs, in order, with their bytes (``raw``), their JSON
    ``data``, or, on the server before the kernel has run, neither (bytes to be written)."""

    model_name: str
    outputs: tuple[Tensor, ...]
    model_version: str | None = None
    id: str | None = None
    parameters: Mapping[str, Any] = _NO_PARAMETERS

    def document(self) -> dict[str, Any]:
        """The JSON header in the shape of ``v2.InferenceResponse`` (``exclude_none``)."""
        document: dict[str, Any] = {"model_name": self.model_name}
        if self.model_version is not None:
            document["model_version"] = self.model_version
        if self.id is not None:
            document["id"] = self.id
        if self.parameters:
            document["parameters"] = dict(self.parameters)
        document["outputs"] = [tensor.document(response=True) for tensor in self.outputs]
        return document

    def to_rest(self) -> codec.BodyLayout:
        """The response laid out before its binary outputs exist: the JSON header (aligned when
        binary data follows), then room for each output without ``data`` or a shared-memory
        region, in order. A body without binary outputs is the header alone, all JSON."""
        document = self.document()
        sizes = tuple(
            [t.nbytes for t in self.outputs if t.data is None and t.shared_memory is None]
        )
        return codec.BodyLayout(codec.dump_header(document, align=bool(sizes)), sizes)

    @classmethod
    def from_rest(cls, header: bytes, tail: memoryview, *, header_given: bool) -> InferResponse:
        """Decode a REST response: the model, then the framing (sizes against shapes, nothing
        short, nothing left over: the same checks as a request's). Binary outputs are views of
        ``tail``; an output written into shared memory comes with neither bytes nor ``data``
        (the caller knows the region it named). Raises pydantic's ValidationError or
        InvalidRequest when malformed."""
        document = InferenceResponse.model_validate_json(header)
        frames = [
            codec.TensorFrame(
                output.name,
                DataType(output.datatype),
                tuple(output.shape),
                None if output.parameters is None else output.parameters.binary_data_size,
            )
            for output in document.outputs
        ]
        slices = codec.slice_tensors(frames, tail, document.model_name, header_given=header_given)
        outputs = tuple(
            Tensor(
                frame.name, frame.datatype, frame.shape, raw, output.data,
                shared_reference(output.parameters, frame.name, "output"),
            )
            for frame, output, raw in zip(frames, document.outputs, slices, strict=True)
        )  # fmt: skip
        return cls(
            document.model_name,
            outputs,
            document.model_version,
            document.id,
            dict(document.parameters or {}),
        )


# --- checks every front end makes -----------------------------------------------------------------


def _frame(tensor: RequestInput) -> codec.TensorFrame:
    parameters = tensor.parameters
    return codec.TensorFrame(
        name=tensor.name,
        datatype=BY_NAME[tensor.datatype],  # a Literal of the names: always there
        shape=tuple(tensor.shape),
        binary_size=parameters.binary_data_size if parameters is not None else None,
        has_data="data" in tensor.model_fields_set,
        shared_memory=parameters is not None and parameters.shared_memory_region is not None,
    )


def check_parameters(request: InferenceRequest) -> None:
    """Every input's and requested output's parameters known and not refused
    (``parameters.POLICY``), by ``descriptors.check_parameter_keys``, as every front end checks
    them; the request's own are checked with the operator's (``validation.resolve_parameters``).
    The keys the models declare are the table's honoured ones, so only the rest, in
    ``model_extra``, need looking up."""
    for index, tensor in enumerate(request.inputs):
        if tensor.parameters is not None:
            _check_map(Level.INPUT, index, tensor.name, tensor.parameters)
    for index, output in enumerate(request.outputs or ()):
        if output.parameters is not None:
            _check_map(Level.OUTPUT, index, output.name, output.parameters)


def _check_map(level: Level, index: int, name: str, parameters: SharedMemoryParameters) -> None:
    # The keys given: declared ones set and extra ones (pydantic lists the extra among the set).
    extra = parameters.model_extra or {}
    count = len(parameters.model_fields_set | extra.keys())
    check_parameter_keys(level, index, name, count, extra)


def check_unique(frames: Sequence[codec.TensorFrame]) -> None:
    """Each input named once."""
    seen: set[str] = set()
    for frame in frames:
        if frame.name in seen:
            raise InvalidRequest(
                f"input '{frame.name[:100]}' appears more than once",
                field=frame.name[:100],
                rule="duplicate_input",
            )
        seen.add(frame.name)


def check_sizes(frames: Sequence[codec.TensorFrame], limits: RequestLimits) -> None:
    """Each input within the element limit, and the JSON data of all within its own, judged on
    the shapes alone: before a byte of any tensor is read."""
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


__all__ = [
    "HEADER_LENGTH_HINT",
    "UNSUPPORTED_OUTPUT_PARAMETERS",
    "HostArray",
    "InferRequest",
    "InferResponse",
    "RequestLimits",
    "RequestedOutput",
    "SharedMemoryRef",
    "Tensor",
    "check_parameters",
    "check_sizes",
    "check_unique",
]
