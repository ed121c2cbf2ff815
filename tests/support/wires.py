"""The two protocols as a test sees them: one inference or one query sent over HTTP (httpx against
/v2, JSON data or the binary tensor data extension) or over gRPC (raw calls with the messages
generated from inference.proto, raw or typed contents), its answer read back into one form that
does not depend on the protocol: an ``Answer`` (what was computed, byte for byte) or a ``Refused``
(the error's class through the one status table, its field, its rule and its words).

Nothing here knows a case: the table is in ``parity_cases.py``, the comparisons in the test module."""

from __future__ import annotations

import json
import urllib.parse
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

import grpc
import httpx
import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from support.framing import framed
from tensorbits.grpc import inference_pb2 as pb

# Where typed values travel in InferTensorContents (CONTENTS_FIELD): the service's table, as
# inference.proto has it. FP16 has no field: a typed FP16 tensor is sent with empty contents, as
# the protocol leaves a client no other way.
from tensorbits.grpc.decode import CONTENTS_FIELD
from tensorbits_protocol.codec import HEADER_LENGTH
from tensorbits_protocol.dtypes import BY_NAME, from_numpy, wire_dtype
from tensorbits_protocol.errors import STATUSES, ModelUnavailable, TensorbitsError
from tensorbits_protocol.integers import INT64_MAX

Arr = np.ndarray[Any, Any]
Param = str | int | float | bool
M = TypeVar("M", bound=Message)

# The service the protocol publishes, whatever the package of the .proto the messages come from.
SERVICE = "inference.GRPCInferenceService"
TIMEOUT_S = 30.0

# Where an InferParameter's value goes, by its Python type (bool before int: a bool is an int);
# an integer past int64_param's range goes in uint64_param.
PARAMETER_FIELD: tuple[tuple[type, str], ...] = (
    (bool, "bool_param"),
    (int, "int64_param"),
    (float, "double_param"),
    (str, "string_param"),
)


# --- what a case sends ------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """An input: its values, and what the request says of them when it lies (``datatype``,
    ``shape``: None for the array's own)."""

    name: str
    array: Arr
    datatype: str | None = None
    shape: tuple[int, ...] | None = None
    parameters: Mapping[str, Param] = field(default_factory=dict)

    @property
    def declared_type(self) -> str:
        return self.datatype or from_numpy(self.array.dtype).value

    @property
    def declared_shape(self) -> list[int]:
        return list(self.array.shape if self.shape is None else self.shape)


@dataclass(frozen=True)
class Output:
    name: str
    parameters: Mapping[str, Param] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """One inference request, protocol-neutral; each wire form writes it its own way."""

    model: str
    inputs: tuple[Tensor, ...]
    parameters: Mapping[str, Param] = field(default_factory=dict)
    outputs: tuple[Output, ...] = ()
    version: str = ""
    id: str = ""


# --- what comes back --------------------------------------------------------------------------


@dataclass(frozen=True)
class OutputData:
    """An answer's output: name, data type, shape and little-endian bytes."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes

    @classmethod
    def of(cls, name: str, array: Arr) -> OutputData:
        datatype = from_numpy(array.dtype)
        data = np.ascontiguousarray(array, wire_dtype(datatype)).tobytes()
        return cls(name, datatype.value, tuple(array.shape), data)

    def __repr__(self) -> str:  # a 1 MiB tensor in a failure report helps nobody: its checksum
        digest = f"{len(self.data)} bytes, crc32 {zlib.crc32(self.data):08x}"
        return f"OutputData({self.name!r}, {self.datatype}, {self.shape}, {digest})"


@dataclass(frozen=True)
class Answer:
    model_name: str
    model_version: str
    id: str
    outputs: tuple[OutputData, ...]


@dataclass(frozen=True)
class Refused:
    """A refusal: the class the status table gives its status and code, and its words."""

    error: type[TensorbitsError]
    field: str | None
    rule: str | None
    message: str


Outcome = Answer | Refused


def error_class(
    code: str, status: int | None = None, grpc_code: str | None = None
) -> type[TensorbitsError]:
    """The one class of ``errors.STATUSES`` answered with this HTTP ``status`` (or gRPC
    ``grpc_code``) whose ``code`` is the one the answer carries; an AssertionError when the table
    has none or several (the answer's status and its code disagree)."""
    found = [
        cls
        for cls, (http, rpc) in STATUSES.items()
        if cls.code == code and (http == status if status is not None else rpc == grpc_code)
    ]
    assert len(found) == 1, f"status {status or grpc_code} with code {code!r}: {found}"
    return found[0]


# --- the wire forms ---------------------------------------------------------------------------


class Form(Enum):
    """A way to send an inference. Each HTTP form has its gRPC twin: binary data and raw
    contents carry bytes, JSON data and typed contents carry values."""

    HTTP_BINARY = "http-binary"
    HTTP_JSON = "http-json"
    GRPC_RAW = "grpc-raw"
    GRPC_TYPED = "grpc-typed"


# The name each form's document goes by at the head of a schema error's message ("inference
# header: input 'X': ..."). The rest of the message is the same words on every form.
DOCUMENT: Mapping[Form, str] = {
    Form.HTTP_BINARY: "inference header: ",
    Form.HTTP_JSON: "request body: ",
    Form.GRPC_RAW: "ModelInferRequest: ",
    Form.GRPC_TYPED: "ModelInferRequest: ",
}


def _words(message: str, form: Form | None) -> str:
    prefix = DOCUMENT[form] if form is not None else ""
    return message.removeprefix(prefix)


def _infer_path(model: str, version: str) -> str:
    versioned = f"/versions/{version}" if version else ""
    return f"/v2/models/{model}{versioned}/infer"


def _json_values(array: Arr) -> list[Any]:
    values: list[Any] = array.reshape(-1).tolist()
    return values


def http_body(request: Request, form: Form) -> tuple[bytes, dict[str, str]]:
    """The body of ``request`` in an HTTP form, and the headers it goes with."""
    binary = form is Form.HTTP_BINARY
    inputs: list[dict[str, Any]] = []
    for tensor in request.inputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "shape": tensor.declared_shape,
            "datatype": tensor.declared_type,
        }
        parameters = dict(tensor.parameters)
        if binary:
            parameters["binary_data_size"] = tensor.array.nbytes
        else:
            entry["data"] = _json_values(tensor.array)
        if parameters:
            entry["parameters"] = parameters
        inputs.append(entry)
    document: dict[str, Any] = {"id": request.id, "inputs": inputs}
    parameters = {**request.parameters, **({"binary_data_output": True} if binary else {})}
    if parameters:
        document["parameters"] = parameters
    if request.outputs:
        document["outputs"] = [
            {"name": o.name, **({"parameters": dict(o.parameters)} if o.parameters else {})}
            for o in request.outputs
        ]
    if binary:
        arrays = (np.ascontiguousarray(t.array).tobytes() for t in request.inputs)
        body, headers = framed(document, *arrays)
    else:
        body, headers = json.dumps(document).encode(), {"Content-Type": "application/json"}
    return body, headers


def grpc_message(request: Request, form: Form) -> pb.ModelInferRequest:
    """``request`` as a ``ModelInferRequest`` in a gRPC form."""
    message = pb.ModelInferRequest(
        model_name=request.model, model_version=request.version, id=request.id
    )
    _set_parameters(message.parameters, request.parameters)
    for tensor in request.inputs:
        entry = message.inputs.add(
            name=tensor.name, datatype=tensor.declared_type, shape=tensor.declared_shape
        )
        _set_parameters(entry.parameters, tensor.parameters)
        if form is Form.GRPC_RAW:
            message.raw_input_contents.append(np.ascontiguousarray(tensor.array).tobytes())
        else:
            entry.contents.SetInParent()  # present even when it holds no value
            contents = CONTENTS_FIELD.get(from_numpy(tensor.array.dtype))
            if contents is not None:
                getattr(entry.contents, contents).extend(_json_values(tensor.array))
    for output in request.outputs:
        _set_parameters(message.outputs.add(name=output.name).parameters, output.parameters)
    return message


class Wires:
    """One real server, over both protocols."""

    def __init__(self, http: httpx.Client, channel: grpc.Channel) -> None:
        self.http = http
        self.channel = channel

    # --- HTTP ---------------------------------------------------------------------------------

    def http_refused(self, response: httpx.Response, form: Form | None = None) -> Refused:
        assert response.headers["content-type"].startswith("application/json"), response.text
        body = response.json()
        return Refused(
            error_class(body["code"], status=response.status_code),
            body.get("field"),
            body.get("rule"),
            _words(body["error"], form),
        )

    def http_infer(self, request: Request, form: Form) -> Outcome:
        body, headers = http_body(request, form)
        path = _infer_path(request.model, request.version)
        response = self.http.post(path, content=body, headers=headers)
        if response.status_code != 200:
            return self.http_refused(response, form)
        return _http_answer(response)

    # --- gRPC ---------------------------------------------------------------------------------

    def call(self, rpc: str, request: Message, response: type[M]) -> M:
        method: grpc.UnaryUnaryMultiCallable[Message, M] = self.channel.unary_unary(
            f"/{SERVICE}/{rpc}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response.FromString,
        )
        return method(request, timeout=TIMEOUT_S)

    def grpc_outcome(self, call: Callable[[], M]) -> M | Refused:
        """``call``'s response, or its refusal: the status code and the trailing metadata that
        carry the class, field and rule, the status details that carry the words."""
        try:
            return call()
        except grpc.RpcError as error:
            metadata = {item.key: item.value for item in error.trailing_metadata() or ()}
            return Refused(
                error_class(str(metadata["tensorbits-error-code"]), grpc_code=error.code().name),
                _field(metadata.get("tensorbits-error-field")),
                _text(metadata.get("tensorbits-error-rule")),
                _words(error.details() or "", Form.GRPC_RAW),
            )

    def grpc_infer(self, request: Request, form: Form) -> Outcome:
        message = grpc_message(request, form)
        response = self.grpc_outcome(
            lambda: self.call("ModelInfer", message, pb.ModelInferResponse)
        )
        if isinstance(response, Refused):
            return response
        return Answer(
            response.model_name,
            response.model_version,
            response.id,
            tuple(
                OutputData(o.name, o.datatype, tuple(o.shape), raw)
                for o, raw in zip(response.outputs, response.raw_output_contents, strict=True)
            ),
        )

    def infer(self, request: Request, form: Form) -> Outcome:
        send = self.http_infer if form in (Form.HTTP_BINARY, Form.HTTP_JSON) else self.grpc_infer
        return send(request, form)


def _text(value: str | bytes | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def _field(value: str | bytes | None) -> str | None:
    """The refusal's field: percent-encoded in the metadata (grpc/status.py), as grpc-message."""
    text = _text(value)
    return None if text is None else urllib.parse.unquote(text)


def _set_parameters(target: Any, parameters: Mapping[str, Param]) -> None:
    for key, value in parameters.items():
        name = next(name for kind, name in PARAMETER_FIELD if isinstance(value, kind))
        if name == "int64_param" and isinstance(value, int) and value > INT64_MAX:
            name = "uint64_param"
        setattr(target[key], name, value)


def _http_answer(response: httpx.Response) -> Answer:
    """A 200 inference answer, its outputs as JSON data or as binary data after the header."""
    length = response.headers.get(HEADER_LENGTH)
    body = response.content
    header = json.loads(body if length is None else body[: int(length)])
    offset = 0 if length is None else int(length)
    outputs = []
    for output in header["outputs"]:
        dtype = wire_dtype(BY_NAME[output["datatype"]])
        if "data" in output:
            data = np.array(output["data"], dtype=dtype).tobytes()
        else:
            size = output["parameters"]["binary_data_size"]
            data, offset = body[offset : offset + size], offset + size
        outputs.append(OutputData(output["name"], output["datatype"], tuple(output["shape"]), data))
    assert offset == (len(body) if length is not None else 0), "bytes after the last output"
    return Answer(
        header["model_name"], header["model_version"], header.get("id", ""), tuple(outputs)
    )


# --- queries: health, metadata, configuration -----------------------------------------------


class View(Enum):
    """How an HTTP answer reads as its RPC's response, in the protobuf JSON form."""

    BODY = "body"  # the body is the response's JSON
    CONFIG = "config"  # the body is the ModelConfigResponse's ``config``
    STATUS = "status"  # the status is the answer: 200 ready; an unloaded model's 400 not ready


def http_document(
    response: httpx.Response, view: View, refused: Callable[[httpx.Response], Refused]
) -> dict[str, Any] | Refused:
    if view is View.STATUS:
        if response.status_code == 200:
            return {"ready": True}
        refusal = refused(response)
        return {"ready": False} if refusal.error is ModelUnavailable else refusal
    if response.status_code != 200:
        return refused(response)
    body: dict[str, Any] = response.json()
    return {"config": body} if view is View.CONFIG else body


def unknown_keys(document: Mapping[str, Any], descriptor: Any, at: str = "") -> set[str]:
    """The keys of ``document`` (and of the messages in it, not the maps') that ``descriptor``
    has no field for, as dotted paths (``inputs[].datatypes``). ``descriptor``: a message's
    ``DESCRIPTOR`` (typed Any: protobuf's stubs give it two types, by implementation)."""
    found: set[str] = set()
    for key, value in document.items():
        field_descriptor = descriptor.fields_by_name.get(key)
        if field_descriptor is None:
            found.add(at + key)
            continue
        sub = field_descriptor.message_type
        if sub is None or sub.GetOptions().map_entry:
            continue
        repeated = field_descriptor.label == FieldDescriptor.LABEL_REPEATED
        for item in value if repeated else [value]:
            found |= unknown_keys(item, sub, f"{at}{key}{'[]' if repeated else ''}.")
    return found


def as_message_json(document: Mapping[str, Any], message_type: type[Message]) -> dict[str, Any]:
    """``document`` read as a ``message_type`` (its fields alone), written back as protobuf
    JSON: the form a gRPC response is compared in."""
    message = json_format.ParseDict(document, message_type(), ignore_unknown_fields=True)
    return message_json(message)


def message_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
