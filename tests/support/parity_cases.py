"""The cases, as data: each inference is sent over HTTP and over gRPC and must come back the same;
each query (health, metadata, configuration) must say the same over both.

An inference case expects the reference's answer (``core.bitref``, element by element; None), an
array given outright, or a ``Refusal``: the error class, the field, the rule and words the
message must contain. ``pairs`` are the wire forms it is sent in, each HTTP form beside its gRPC
twin (binary data with raw contents, JSON data with typed contents); FP16 has no JSON or typed
form, so its cases travel as bytes only. ``drift`` names a known disagreement between the two
protocols: the case is then expected to fail, strictly, until the two agree."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from google.protobuf.message import Message

from support.wires import Arr, Form, Output, Param, Request, Tensor, View
from tensorbits.grpc import inference_pb2 as pb
from tensorbits_protocol.errors import (
    InvalidRequest,
    ModelUnavailable,
    OperatorNotFound,
    PayloadTooLarge,
    TensorbitsError,
)
from tensorbits_protocol.operators import OPERATORS
from tensorbits_protocol.texts import MAX_TEXT_BYTES

RNG = np.random.default_rng(20)


class Pair(NamedTuple):
    """An HTTP wire form and its gRPC twin."""

    name: str
    http: Form
    grpc: Form


BINARY = Pair("binary", Form.HTTP_BINARY, Form.GRPC_RAW)
VALUES = Pair("values", Form.HTTP_JSON, Form.GRPC_TYPED)
BOTH = (BINARY, VALUES)

# Unloaded for the cases that need a model unloaded, loaded again after; no other case uses it.
UNLOADED = "openvino.BitwiseOr-13"

DML_NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
DML_AND = "DML_OPERATOR_ELEMENT_WISE_BIT_AND"
DML_COUNT = "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT"
DML_SHL = "DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT"
OV_AND = "openvino.BitwiseAnd-13"
OV_XOR = "openvino.BitwiseXor-13"
OV_SHR = "openvino.BitwiseRightShift-15"
ONNX_XOR = "onnx.BitwiseXor-18"
ONNX_NOT = "onnx.BitwiseNot-18"
ONNX_SHIFT = "onnx.BitShift-11"


@dataclass(frozen=True)
class Refusal:
    error: type[TensorbitsError]
    field: str
    rule: str
    words: tuple[str, ...] = ()


@dataclass(frozen=True)
class Infer:
    id: str
    request: Request
    expect: Arr | Refusal | None = None  # None: the reference's answer
    pairs: tuple[Pair, ...] = BOTH
    unload: str | None = None
    drift: str | None = None
    # The data's own fields differ by wire (HTTP's data and binary_data_size, gRPC's contents.*
    # and raw_input_contents): the same class, field and rule, each in words naming its own.
    own_words: bool = False


def u8(*values: int) -> Arr:
    return np.array(values, np.uint8)


def infer(
    id: str,
    model: str,
    *inputs: Tensor,
    parameters: Mapping[str, Param] | None = None,
    outputs: tuple[Output, ...] = (),
    version: str = "",
    expect: Arr | Refusal | None = None,
    pairs: tuple[Pair, ...] = BOTH,
    unload: str | None = None,
    drift: str | None = None,
    own_words: bool = False,
    request_id: str | None = None,
) -> Infer:
    """A case named ``id``, sent with the request id ``request_id`` (its name when None)."""
    request = Request(
        model,
        inputs,
        dict(parameters or {}),
        outputs,
        version,
        id if request_id is None else request_id,
    )
    return Infer(id, request, expect, pairs, unload, drift, own_words)


def ins(**arrays: Arr) -> tuple[Tensor, ...]:
    return tuple(Tensor(name, array) for name, array in arrays.items())


X8 = RNG.integers(0, 256, size=(2, 3), dtype=np.uint8)
Y8 = RNG.integers(0, 256, size=(2, 3), dtype=np.uint8)
U64 = np.array([0, 1, 2**63, 2**64 - 1, 0x0123456789ABCDEF], np.uint64)
I64_COLUMN = RNG.integers(-(2**63), 2**63, size=(4, 1), dtype=np.int64)
I64_ROW = RNG.integers(-(2**63), 2**63, size=(1, 3), dtype=np.int64)
# FP16 bit patterns that a float conversion would change: NaN payloads, -0, a denormal, inf.
FP16 = np.array([0x7E01, 0xFC00, 0x8000, 0x0001, 0x3C00, 0x7C00], np.uint16).view(np.float16)
FP16_NUMBERS = np.array([1.0, -0.0, 0.5], np.float16)  # no NaN: JSON could not carry the request
# Signed shifts at the rule's edges: a count at or past the width, a negative count, a negative
# value shifted right (docs/semantics.md, the shift rule).
SHIFTED = np.array([-128, -1, 64, 5, -7, 3], np.int8)
COUNTS = np.array([9, -1, 1, 8, 7, -56], np.int8)
MIB = RNG.integers(0, 256, size=(1024, 1024), dtype=np.uint8)
NOT_X = Tensor("InputTensor", u8(1, 2, 3, 4))

INFERS: tuple[Infer, ...] = (
    # Every operator family, and a model version named outright.
    infer("dml", DML_AND, *ins(ATensor=X8, BTensor=Y8)),
    infer("dml-count-uint32", DML_COUNT, Tensor("InputTensor", U64),
          parameters={"output_datatype": "UINT32"}),
    infer("openvino", OV_XOR, *ins(input_1=X8, input_2=Y8)),
    infer("onnx", ONNX_NOT, *ins(X=X8)),
    infer("onnx-bitshift", ONNX_SHIFT, *ins(X=U64, Y=np.array([0, 1, 63, 64, 65], np.uint64)),
          parameters={"direction": "RIGHT"}),
    infer("version-1", DML_NOT, NOT_X, version="1"),
    # Broadcasting: NumPy rules (ONNX), OpenVINO's numpy and pdpd with an integer parameter.
    infer("broadcast-onnx", ONNX_XOR, *ins(A=I64_COLUMN, B=I64_ROW)),
    infer("broadcast-openvino", OV_AND, *ins(input_1=X8, input_2=u8(0x0F, 0xF0, 0xFF))),
    infer("broadcast-pdpd", OV_AND, *ins(input_1=X8, input_2=u8(0x3C, 0xC3)[:, None]),
          parameters={"auto_broadcast": "pdpd", "axis": 0}),
    # Each class of data type.
    infer("bool", OV_XOR, *ins(input_1=np.array([True, False, True, False]),
                               input_2=np.array([True, True, False, False]))),
    infer("int8", OV_AND, *ins(input_1=np.array([-128, -1, 0, 127], np.int8),
                                input_2=np.array([-1, 85, -86, 15], np.int8))),
    infer("uint64", ONNX_NOT, *ins(X=U64)),
    infer("fp16", DML_NOT, Tensor("InputTensor", FP16), pairs=(BINARY,)),
    # The shift rule.
    infer("shift-count-rule", OV_SHR, *ins(input_1=SHIFTED, input_2=COUNTS)),
    # An empty tensor, alone and broadcast.
    infer("empty", ONNX_NOT, *ins(X=np.zeros((0,), np.uint8))),
    infer("empty-broadcast", ONNX_XOR, *ins(A=np.zeros((0, 3), np.int32),
                                            B=np.ones((1, 3), np.int32))),
    # 1 MiB each way.
    infer("1mib", DML_NOT, Tensor("InputTensor", MIB), expect=~MIB),
    # Triton's reserved parameters, at each level: accepted and ignored.
    infer("triton-parameters-ignored", DML_NOT,
          Tensor("InputTensor", u8(1, 2, 3, 4), parameters={"triton_input_hint": "x"}),
          parameters={"triton_enable_empty_final_response": True, "triton_anything": 3},
          outputs=(Output("OutputTensor", {"triton_output_hint": False}),)),
    # The protocol's own keys that ask for what this server has no use for: accepted, ignored.
    infer("protocol-parameters-ignored", DML_NOT, NOT_X,
          parameters={"priority": 1, "sequence_id": 7, "sequence_start": True, "timeout": 5}),
    infer("output-requested", DML_NOT, NOT_X, outputs=(Output("OutputTensor"),)),
    # Refusals: the model and its version.
    infer("unknown-model", "DML_OPERATOR_ELEMENT_WISE_BIT_NOPE", NOT_X,
          expect=Refusal(OperatorNotFound, "model_name", "unknown_operator",
                         ("unknown model or operator", f"did you mean '{DML_NOT}'"))),
    infer("unknown-version", DML_NOT, NOT_X, version="2",
          expect=Refusal(OperatorNotFound, "model_version", "unknown_version",
                         ("has no version '2'", "versions: 1"))),
    infer("unloaded-model", UNLOADED, *ins(input_1=X8, input_2=Y8), unload=UNLOADED,
          expect=Refusal(ModelUnavailable, "model_name", "model_unloaded", ("unloaded",))),
    # Refusals: data types.
    infer("wrong-datatype", DML_NOT, Tensor("InputTensor", np.array([True, False])),
          expect=Refusal(InvalidRequest, "InputTensor", "datatype",
                         ("data type BOOL is not supported", "feature level 6_4"))),
    infer("datatype-at-feature-level", DML_NOT, Tensor("InputTensor", np.array([1, 2], np.int32)),
          parameters={"feature_level": "3_0"},
          expect=Refusal(InvalidRequest, "InputTensor", "datatype",
                         ("INT32 is not supported", "feature level 3_0",
                          "allowed: UINT8, UINT16, UINT32"))),
    infer("signed-dml-shift", DML_SHL, *ins(ATensor=SHIFTED, BTensor=COUNTS),
          expect=Refusal(InvalidRequest, "ATensor", "datatype", ("data type INT8",))),
    infer("mixed-datatypes", ONNX_XOR, *ins(A=u8(1, 2), B=np.array([1, 2], np.uint16)),
          expect=Refusal(InvalidRequest, "B", "mixed_datatype", ("differs from A's UINT8",))),
    infer("datatype-not-in-protocol", DML_NOT, Tensor("InputTensor", u8(1, 2), datatype="UINT9"),
          expect=Refusal(InvalidRequest, "inputs[0].datatype", "literal_error",
                         ("got 'UINT9'", "did you mean 'UINT8'"))),
    infer("fp16", DML_NOT, Tensor("InputTensor", FP16_NUMBERS), pairs=(VALUES,),
          expect=Refusal(InvalidRequest, "InputTensor", "typed_datatype", ("FP16",)),
          own_words=True),
    # Refusals: shapes and sizes.
    infer("shape-mismatch", DML_AND, *ins(ATensor=u8(1, 2, 3, 4), BTensor=u8(1, 2, 3, 4)[None]),
          expect=Refusal(InvalidRequest, "BTensor", "shape",
                         ("shape [1, 4] differs from ATensor [4]", "identical Sizes"))),
    infer("no-broadcast", ONNX_XOR, *ins(A=u8(1, 2, 3), B=u8(1, 2, 3, 4)),
          expect=Refusal(InvalidRequest, "B", "broadcast", ("A [3] and B [4] do not broadcast",))),
    infer("no-broadcast-openvino-none", OV_AND, *ins(input_1=X8, input_2=u8(1, 2, 3)),
          parameters={"auto_broadcast": "none"},
          expect=Refusal(InvalidRequest, "input_2", "shape", ("requires equal shapes",))),
    infer("rank-past-8", ONNX_NOT, *ins(X=np.zeros((1,) * 9, np.uint8)),
          expect=Refusal(InvalidRequest, "X", "rank", ("rank 9",))),
    infer("empty-dml", DML_NOT, Tensor("InputTensor", np.zeros((0,), np.uint8)),
          expect=Refusal(InvalidRequest, "InputTensor", "empty", ("dimension 0 has size 0",))),
    infer("element-count", DML_NOT, Tensor("InputTensor", u8(1, 2, 3), shape=(4,)),
          expect=Refusal(InvalidRequest, "InputTensor", "binary_data_size", ("Expected 4, got 3",)),
          pairs=(BINARY,), own_words=True),
    infer("element-count", DML_NOT, Tensor("InputTensor", u8(1, 2, 3), shape=(4,)),
          expect=Refusal(InvalidRequest, "InputTensor", "data_size", ("data has 3 elements",)),
          pairs=(VALUES,), own_words=True),
    infer("too-many-elements", DML_NOT, Tensor("InputTensor", u8(), shape=(1 << 20, 1 << 20)),
          expect=Refusal(PayloadTooLarge, "InputTensor", "max_tensor_elements",
                         ("1099511627776 elements", "TENSORBITS_MAX_TENSOR_ELEMENTS"))),
    infer("negative-dimension", DML_NOT, Tensor("InputTensor", u8(1, 2), shape=(-2,)),
          expect=Refusal(InvalidRequest, "inputs[0].shape[0]", "greater_than_equal", ("got -2",))),
    # Refusals: inputs and outputs.
    infer("missing-input", ONNX_XOR, *ins(A=u8(1, 2)),
          expect=Refusal(InvalidRequest, "B", "missing_input", ("missing input", "got 1"))),
    infer("extra-input", DML_NOT, NOT_X, Tensor("Extra", u8(1, 2, 3, 4)),
          expect=Refusal(InvalidRequest, "Extra", "unknown_input", ("no input of that name",))),
    infer("duplicate-input", DML_NOT, NOT_X, NOT_X,
          expect=Refusal(InvalidRequest, "InputTensor", "duplicate_input", ("more than once",))),
    infer("unknown-output", DML_NOT, NOT_X, outputs=(Output("Nope"),),
          expect=Refusal(InvalidRequest, "Nope", "unknown_output",
                         ("no output of that name", "outputs: OutputTensor"))),
    infer("duplicate-output", DML_NOT, NOT_X, outputs=(Output("OutputTensor"),) * 2,
          expect=Refusal(InvalidRequest, "OutputTensor", "duplicate_output",
                         ("requested more than once",))),
    # Refusals: parameters.
    infer("unknown-parameter", DML_NOT, NOT_X, parameters={"featurelevel": "3_0"},
          expect=Refusal(InvalidRequest, "parameters.featurelevel", "unknown_parameter",
                         ("unknown parameter", "did you mean 'feature_level'"))),
    infer("unknown-input-parameter", DML_NOT,
          Tensor("InputTensor", u8(1, 2), parameters={"bogus": 1}),
          expect=Refusal(InvalidRequest, "inputs[0].parameters.bogus", "unknown_parameter",
                         ("input 'InputTensor'", "unknown parameter"))),
    infer("classification-refused", DML_NOT, NOT_X,
          outputs=(Output("OutputTensor", {"classification": 2}),),
          expect=Refusal(InvalidRequest, "outputs[0].parameters.classification",
                         "unsupported_parameter", ("classification extension",))),
    infer("parameter-value", DML_NOT, NOT_X, parameters={"feature_level": "9_9"},
          expect=Refusal(InvalidRequest, "parameters.feature_level", "parameter_value",
                         ("'9_9' is not a valid value",))),
    infer("parameter-type", OV_AND, *ins(input_1=X8, input_2=u8(1, 2)),
          parameters={"auto_broadcast": "pdpd", "axis": "first"},
          expect=Refusal(InvalidRequest, "parameters.axis", "parameter_type",
                         ("is not an integer",))),
    # A value of the wrong kind: a JSON boolean or number, a bool_param or int64_param.
    infer("parameter-bool-for-string", ONNX_SHIFT, *ins(X=u8(1, 2), Y=u8(1, 1)),
          parameters={"direction": True},
          expect=Refusal(InvalidRequest, "parameters.direction", "parameter_value",
                         ("True is not a valid value", "allowed: LEFT, RIGHT"))),
    infer("parameter-int-for-string", DML_NOT, NOT_X, parameters={"feature_level": 3},
          expect=Refusal(InvalidRequest, "parameters.feature_level", "parameter_value",
                         ("3 is not a valid value",))),
    # Refusals: a string's bound (MAX_TEXT_BYTES), the id and a parameter's value named by its
    # key, and the tensors' (inputs and outputs together).
    infer("id-past-bound", DML_NOT, NOT_X, request_id="i" * (MAX_TEXT_BYTES + 1),
          expect=Refusal(InvalidRequest, "id", "max_text_bytes",
                         (f"id is {MAX_TEXT_BYTES + 1} bytes long", "MAX_TEXT_BYTES"))),
    infer("id-of-1mib", DML_NOT, NOT_X, request_id="i" * (1 << 20),
          expect=Refusal(InvalidRequest, "id", "max_text_bytes", ("1048576 bytes long",))),
    infer("id-at-bound", DML_NOT, NOT_X, request_id="é" * (MAX_TEXT_BYTES // 2)),
    infer("parameter-value-past-bound", DML_NOT, NOT_X, parameters={"triton_x": "v" * (10 << 20)},
          expect=Refusal(InvalidRequest, "parameters.triton_x", "max_text_bytes",
                         ("parameters.triton_x is 10485760 bytes long",))),
    infer("input-parameter-value-past-bound", DML_NOT,
          Tensor("InputTensor", u8(1, 2, 3, 4), parameters={"kéy": "v" * (MAX_TEXT_BYTES + 1)}),
          expect=Refusal(InvalidRequest, "inputs[0].parameters.kéy", "max_text_bytes", ())),
    infer("operator-parameter-past-bound", DML_NOT, NOT_X,
          parameters={"feature_level": "v" * (MAX_TEXT_BYTES + 1)},
          expect=Refusal(InvalidRequest, "parameters.feature_level", "max_text_bytes", ())),
    # Every other string of the request: the model and its version (HTTP's URL path, gRPC's
    # fields), each tensor's name and data type, a parameter's key (named by its first 100
    # characters, as any parameter is), counted in UTF-8 bytes.
    infer("model-name-past-bound", "m" * (MAX_TEXT_BYTES + 1), NOT_X,
          expect=Refusal(InvalidRequest, "model_name", "max_text_bytes",
                         (f"model_name is {MAX_TEXT_BYTES + 1} bytes long", "MAX_TEXT_BYTES"))),
    infer("model-name-past-bound-utf8", "é" * (MAX_TEXT_BYTES // 2 + 1), NOT_X,
          expect=Refusal(InvalidRequest, "model_name", "max_text_bytes",
                         (f"model_name is {MAX_TEXT_BYTES + 2} bytes long",))),
    infer("model-name-at-bound", "m" * MAX_TEXT_BYTES, NOT_X,
          expect=Refusal(OperatorNotFound, "model_name", "unknown_operator",
                         ("unknown model or operator",))),
    infer("model-version-past-bound", DML_NOT, NOT_X, version="1" * (MAX_TEXT_BYTES + 1),
          expect=Refusal(InvalidRequest, "model_version", "max_text_bytes",
                         (f"model_version is {MAX_TEXT_BYTES + 1} bytes long",))),
    infer("input-name-past-bound", DML_NOT, Tensor("n" * (MAX_TEXT_BYTES + 1), u8(1, 2, 3, 4)),
          expect=Refusal(InvalidRequest, "inputs[0].name", "max_text_bytes",
                         (f"inputs[0].name is {MAX_TEXT_BYTES + 1} bytes long",))),
    infer("second-input-name-past-bound", ONNX_XOR,
          Tensor("A", u8(1, 2)), Tensor("é" * (MAX_TEXT_BYTES // 2 + 1), u8(1, 2)),
          expect=Refusal(InvalidRequest, "inputs[1].name", "max_text_bytes",
                         (f"inputs[1].name is {MAX_TEXT_BYTES + 2} bytes long",))),
    infer("input-datatype-past-bound", DML_NOT,
          Tensor("InputTensor", u8(1, 2, 3, 4), datatype="U" * (MAX_TEXT_BYTES + 1)),
          expect=Refusal(InvalidRequest, "inputs[0].datatype", "max_text_bytes",
                         (f"inputs[0].datatype is {MAX_TEXT_BYTES + 1} bytes long",))),
    infer("output-name-past-bound", DML_NOT, NOT_X, outputs=(Output("o" * (1 << 20)),),
          expect=Refusal(InvalidRequest, "outputs[0].name", "max_text_bytes",
                         ("outputs[0].name is 1048576 bytes long",))),
    infer("parameter-key-past-bound", DML_NOT, NOT_X,
          parameters={"k" * (MAX_TEXT_BYTES + 1): 1},
          expect=Refusal(InvalidRequest, f"parameters.{'k' * 100}...", "max_text_bytes",
                         (f"is {MAX_TEXT_BYTES + 1} bytes long",))),
    infer("input-parameter-key-past-bound", DML_NOT,
          Tensor("InputTensor", u8(1, 2, 3, 4), parameters={"é" * (MAX_TEXT_BYTES // 2 + 1): 1}),
          expect=Refusal(InvalidRequest, f"inputs[0].parameters.{'é' * 100}...", "max_text_bytes",
                         (f"is {MAX_TEXT_BYTES + 2} bytes long",))),
    infer("output-parameter-key-past-bound", DML_NOT, NOT_X,
          outputs=(Output("OutputTensor", {"k" * (MAX_TEXT_BYTES + 1): True}),),
          expect=Refusal(InvalidRequest, f"outputs[0].parameters.{'k' * 100}...",
                         "max_text_bytes", (f"is {MAX_TEXT_BYTES + 1} bytes long",))),
    infer("inputs-and-outputs-past-bound", DML_NOT,
          *(Tensor(f"t{i}", u8(1)) for i in range(40)),
          outputs=tuple(Output(f"o{i}") for i in range(40)),
          expect=Refusal(PayloadTooLarge, "inputs", "max_tensors",
                         ("more than 64 inputs and outputs listed", "TENSORBITS_MAX_TENSORS"))),
    infer("inputs-past-bound", DML_NOT, *(Tensor(f"t{i}", u8(1)) for i in range(65)),
          expect=Refusal(PayloadTooLarge, "inputs", "max_tensors",
                         ("inputs and outputs listed", "limit of 64 (TENSORBITS_MAX_TENSORS)")),
          own_words=True),  # HTTP counts a small document exactly, the wire stops at 65
    # A name outside ASCII, as the refusal names it (percent-encoded in gRPC's metadata).
    infer("non-ascii-name", DML_NOT, NOT_X, Tensor("Éxtra→", u8(1, 2, 3, 4)),
          expect=Refusal(InvalidRequest, "Éxtra→", "unknown_input", ("Éxtra→: ",))),
    infer("required-parameter", ONNX_SHIFT, *ins(X=u8(1, 2), Y=u8(1, 1)),
          expect=Refusal(InvalidRequest, "parameters.direction", "required_parameter",
                         ("required by onnx.BitShift-11", "allowed: LEFT, RIGHT"))),
)  # fmt: skip


# --- queries ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """A GET over HTTP and its RPC over gRPC. ``expect``: fields of the response (protobuf JSON)
    that must hold, or the refusal; ``dropped``: the keys of the HTTP document the message may
    have no field for (paths as ``wires.unknown_keys`` writes them); any other must travel."""

    id: str
    http: str
    rpc: str
    request: Message
    response: type[Message]
    expect: Mapping[str, Any] | Refusal
    view: View = View.BODY
    dropped: frozenset[str] = frozenset()
    unload: str | None = None


# Model metadata over HTTP says more than TensorMetadata holds: types, ranks, parameters and the
# support table (model_info.py); gRPC's ModelConfig carries them as parameters instead.
METADATA_EXTRAS = frozenset(
    {"parameters", "support", "support_parameter", "shape_rule"}
    | {
        f"{kind}[].{key}"
        for kind in ("inputs", "outputs")
        for key in ("datatypes", "min_rank", "max_rank")
    }
)
# One model of each family: its metadata and configuration.
FAMILIES = tuple(
    next(op.name for op in OPERATORS if op.spec == spec) for spec in ("dml", "openvino", "onnx")
)


def _model_path(model: str, version: str) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "")


def metadata(model: str, version: str = "", expect: Refusal | None = None) -> Query:
    path = _model_path(model, version)
    return Query(
        f"metadata{path}", path, "ModelMetadata",
        pb.ModelMetadataRequest(name=model, version=version), pb.ModelMetadataResponse,
        expect or {"name": model, "versions": ["1"], "platform": "tensorbits"},
        dropped=METADATA_EXTRAS,
    )  # fmt: skip


def config(model: str, version: str = "", expect: Refusal | None = None) -> Query:
    path = _model_path(model, version)
    return Query(
        f"config{path}", f"{path}/config", "ModelConfig",
        pb.ModelConfigRequest(name=model, version=version), pb.ModelConfigResponse,
        expect or {"config": {"name": model}}, view=View.CONFIG,
    )  # fmt: skip


def ready(
    model: str,
    version: str = "",
    expect: Mapping[str, Any] | Refusal | None = None,
    unload: str | None = None,
) -> Query:
    path = _model_path(model, version)
    return Query(
        f"ready{path}", f"{path}/ready", "ModelReady",
        pb.ModelReadyRequest(name=model, version=version), pb.ModelReadyResponse,
        expect or {"ready": True}, view=View.STATUS, unload=unload,
    )  # fmt: skip


NOPE = Refusal(
    OperatorNotFound, "model_name", "unknown_operator", ("unknown model or operator 'nope'",)
)
NO_VERSION = Refusal(OperatorNotFound, "model_version", "unknown_version", ("has no version '2'",))

QUERIES: tuple[Query, ...] = (
    Query("server-metadata", "/v2", "ServerMetadata", pb.ServerMetadataRequest(),
          pb.ServerMetadataResponse, {"name": "tensorbits"}),
    Query("server-live", "/v2/health/live", "ServerLive", pb.ServerLiveRequest(),
          pb.ServerLiveResponse, {"live": True}),
    Query("server-ready", "/v2/health/ready", "ServerReady", pb.ServerReadyRequest(),
          pb.ServerReadyResponse, {"ready": True}),
    *(metadata(model) for model in FAMILIES),
    *(config(model) for model in FAMILIES),
    metadata(DML_COUNT, "1"),
    config(ONNX_SHIFT, "1"),
    ready(DML_NOT),
    ready(OV_XOR, "1"),
    ready(UNLOADED, unload=UNLOADED, expect={"ready": False}),
    # Refusals.
    metadata("nope", expect=NOPE),
    metadata(DML_NOT, "2", expect=NO_VERSION),
    config("nope", expect=NOPE),
    config(ONNX_NOT, "2", expect=NO_VERSION),
    ready("nope", expect=NOPE),
    ready(DML_NOT, "2", expect=NO_VERSION),
)  # fmt: skip
