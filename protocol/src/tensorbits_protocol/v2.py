"""Wire models of the Open Inference Protocol (KServe v2 / Triton HTTP/REST), with Triton's
binary tensor data extension. The single source of truth for the server and the client SDK.

Models only: no logic. Each docstring shows the JSON shape the spec writes (``?`` marks an
optional key). Request models are strict (``"1"`` is not a dimension, ``1.0`` is not an integer,
``true`` is not an integer) and refuse unknown keys; ``parameters`` objects take any key whose
value is a string, number or boolean, as the spec allows, and the parameter policy
(``tensorbits_protocol.parameters``) then says which keys are honoured, ignored or refused.

Tensor ``data`` is not validated here (``SkipValidation``): a JSON tensor can hold millions of
elements, and walking them element by element through pydantic costs seconds
(fastapi/fastapi#2072). ``tensorbits_protocol.jsondata`` checks and converts it in bulk instead.

The binary framing (``Inference-Header-Content-Length`` and the raw buffers after the JSON) is
outside JSON Schema; ``tensorbits_protocol.codec`` implements it and ``openapi/README.md``
documents it.
"""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SkipValidation,
    StrictBool,
    StrictInt,
    StrictStr,
)

from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.integers import INT64_MAX, JsonFloat, UInt64, Wide64

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64",
    "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64",
]  # fmt: skip
"""The element types tensorbits serves: the protocol's names, the values of ``dtypes.DataType``.
(The protocol also has BF16 and BYTES; no bitwise operator takes them.)"""

WireParameterValue = StrictBool | Wide64 | JsonFloat | StrictStr
"""A parameter value on the wire, v2 and /v1 alike: the spec allows a string, a number or a
boolean, nothing else; strictly read (``validation.ParameterValue`` is the same set in Python)."""

MAX_WIRE_RANK = 32
"""Dimensions a shape may list on the wire. Operators allow rank 8 at most and say so; this bound
only keeps the product of a hostile shape cheap to compute (Triton's dims are int64 too)."""

Dimension = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
WireShape = Annotated[list[Dimension], Field(max_length=MAX_WIRE_RANK)]
TensorData = list[Any]
"""Row-major tensor elements, nested in the tensor's shape or flat: ``[[1, 2], [3, 4]]`` or
``[1, 2, 3, 4]`` for shape ``[2, 2]``. JSON numbers for integer and float types, ``true``/``false``
for BOOL. FP16 has no JSON form: send it as binary data."""

_STRICT = ConfigDict(strict=True, extra="forbid")
# What the server sends is read leniently, so an older SDK keeps working when a newer server adds
# a field.
_REPLY = ConfigDict(frozen=True)
_PARAMETERS = ConfigDict(strict=True, extra="allow")


# --- inference request --------------------------------------------------------------------------


class InferenceRequestParameters(BaseModel):
    """Request-level ``parameters``: ``{"binary_data_output"?: bool, <operator parameter>: value}``.

    The operator parameters of tensorbits travel here (docs/semantics.md): ``feature_level`` (DML
    models, ``"1_0"`` .. ``"6_4"``, default ``"6_4"``), ``output_datatype`` (DML BIT_COUNT,
    ``"UINT8"`` or ``"UINT32"``), ``auto_broadcast`` (OpenVINO binary operators, ``"numpy"``,
    ``"none"`` or ``"pdpd"``) with ``axis`` (integer, pdpd only, default -1), and ``direction``
    (``onnx.BitShift-11``, ``"LEFT"`` or ``"RIGHT"``, required). Triton's reserved keys
    (``sequence_id``, ``sequence_start``, ``sequence_end``, ``priority``, ``timeout``,
    ``headers`` and any starting ``triton_``) are accepted and ignored; any other key the model
    does not take is a 400 (``unknown_parameter``).
    """

    model_config = ConfigDict(
        **_PARAMETERS,
        json_schema_extra={"examples": [{"binary_data_output": True, "feature_level": "6_4"}]},
    )
    __pydantic_extra__: dict[str, WireParameterValue] = Field(init=False)

    binary_data_output: StrictBool | None = Field(
        None,
        description="Binary tensor data extension: return every output as binary data unless "
        "its own `binary_data` parameter says otherwise (default false: JSON `data`).",
    )


ByteCount = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
MAX_REGION_NAME = 256
"""The longest shared-memory region name a request may give (Triton's names are free text)."""


class SharedMemoryParameters(BaseModel):
    """The shared-memory extension's tensor parameters (Triton's ``system_shared_memory``):
    ``{"shared_memory_region": str, "shared_memory_byte_size": int,
    "shared_memory_offset"?: int}``: the tensor's bytes are in a registered region, at the
    offset (default 0) within it, ``shared_memory_byte_size`` of them. Only when the server has
    the extension on (``TENSORBITS_SHARED_MEMORY``); refused with a 400 otherwise."""

    model_config = _PARAMETERS

    shared_memory_region: Annotated[StrictStr, Field(max_length=MAX_REGION_NAME)] | None = Field(
        None, description="the registered region holding the tensor's bytes"
    )
    shared_memory_byte_size: ByteCount | None = Field(
        None, description="bytes of the tensor in the region (required with the region)"
    )
    shared_memory_offset: ByteCount | None = Field(
        None, description="where the tensor's bytes start in the region (default 0)"
    )


class RequestInputParameters(SharedMemoryParameters):
    """An input's ``parameters``: ``{"binary_data_size"?: int}`` or the shared-memory ones.

    ``binary_data_size`` (binary tensor data extension) says the tensor's bytes follow the JSON
    header instead of a ``data`` array: little-endian, row-major, exactly
    ``prod(shape) * element size`` bytes (over gRPC, where ``raw_input_contents`` carries them,
    it is ignored). ``shared_memory_*`` (``SharedMemoryParameters``) says they are in a registered
    shared-memory region instead. Keys starting ``triton_`` are ignored; any other is a 400
    (``unknown_parameter``).
    """

    model_config = _PARAMETERS
    __pydantic_extra__: dict[str, WireParameterValue] = Field(init=False)

    binary_data_size: UInt64 | None = None


class RequestInput(BaseModel):
    """``{"name": str, "shape": [int], "datatype": str, "parameters"?: {...}, "data"?: [...]}``.

    Exactly one of ``data`` and ``parameters.binary_data_size`` is given.
    """

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra={
            "examples": [
                {"name": "InputTensor", "shape": [2, 2], "datatype": "UINT8", "data": [1, 2, 3, 4]},
                {
                    "name": "InputTensor",
                    "shape": [1024],
                    "datatype": "FP16",
                    "parameters": {"binary_data_size": 2048},
                },
            ]
        },
    )

    name: StrictStr
    shape: WireShape
    datatype: Datatype
    parameters: RequestInputParameters | None = None
    data: SkipValidation[TensorData] | None = None


class RequestOutputParameters(SharedMemoryParameters):
    """A requested output's ``parameters``: ``{"binary_data"?: bool}`` (binary extension;
    ignored over gRPC, where outputs always go back as ``raw_output_contents``), or the
    shared-memory ones: the output is written into the region, and the response lists it with
    those parameters and no data. ``classification`` (Triton's classification extension) is a
    400 (``unsupported_parameter``); keys starting ``triton_`` are ignored; any other is a 400
    (``unknown_parameter``)."""

    model_config = _PARAMETERS
    __pydantic_extra__: dict[str, WireParameterValue] = Field(init=False)

    binary_data: StrictBool | None = Field(
        None, description="true: return this output as binary data; false: as JSON `data`"
    )


class RequestOutput(BaseModel):
    """``{"name": str, "parameters"?: {...}}``: an output the caller wants, and how."""

    model_config = _STRICT

    name: StrictStr
    parameters: RequestOutputParameters | None = None


class InferenceRequest(BaseModel):
    """``{"id"?: str, "parameters"?: {...}, "inputs": [$request_input], "outputs"?: [...]}``.

    Inputs may come in any order; they are matched by name. Without ``outputs`` every output is
    returned, as JSON unless ``parameters.binary_data_output`` is true. ``model_name`` and
    ``model_version`` are KServe's: its REST client names the model in the body too; the
    server takes them when they are the URL's and refuses them, naming both, when not.
    """

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra={
            "examples": [
                {
                    "id": "42",
                    "inputs": [
                        {"name": "A", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]},
                        {"name": "B", "shape": [1], "datatype": "INT32", "data": [6]},
                    ],
                    "outputs": [{"name": "C"}],
                }
            ]
        },
    )

    id: StrictStr | None = None
    model_name: StrictStr | None = Field(
        None, description="The model the URL names (KServe's REST client repeats it here)."
    )
    model_version: StrictStr | None = Field(
        None, description="A version of that model: the URL's, when the URL names one."
    )
    parameters: InferenceRequestParameters | None = None
    inputs: list[RequestInput]
    outputs: list[RequestOutput] | None = None


# --- inference response -------------------------------------------------------------------------


class ResponseOutputParameters(SharedMemoryParameters):
    """An output's ``parameters`` in a response: ``{"binary_data_size"?: int}``, or the
    shared-memory ones of an output written into a region (no data then)."""

    model_config = ConfigDict(extra="allow")

    binary_data_size: int | None = Field(
        None,
        description="The output's bytes follow the JSON header (after the bytes of the outputs "
        "listed before it); there is no `data` then.",
    )


class ResponseOutput(BaseModel):
    """``{"name", "shape", "datatype", "parameters"?: {...}, "data"?: [...]}``.

    ``data`` is flat (row-major), as Triton returns it.
    """

    name: str
    shape: list[int]
    datatype: Datatype
    parameters: ResponseOutputParameters | None = None
    data: TensorData | None = None


class InferenceResponse(BaseModel):
    """``{"model_name", "model_version"?, "id"?, "parameters"?, "outputs": [$response_output]}``.

    ``id`` echoes the request's and is left out when the request had none (as Triton does).
    """

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "model_name": "onnx.BitwiseAnd-18",
                    "model_version": "1",
                    "id": "42",
                    "outputs": [
                        {"name": "C", "shape": [3], "datatype": "INT32", "data": [0, 2, 2]}
                    ],
                }
            ]
        }
    )

    model_name: str
    model_version: str | None = None
    id: str | None = None
    parameters: dict[str, WireParameterValue] | None = None
    outputs: list[ResponseOutput]


# --- server, model and repository metadata ------------------------------------------------------


class ServerLiveResponse(BaseModel):
    """``GET /v2/health/live``: ``{"live": true}``. KServe's REST client reads this body; Triton's
    clients read the status alone (the protocol's answer is the status)."""

    live: bool


class ServerReadyResponse(BaseModel):
    """``GET /v2/health/ready`` once ready: ``{"ready": true}`` (KServe's REST client reads it;
    Triton's, the status); before that and while draining, a 503 error."""

    ready: bool


class ServerMetadataResponse(BaseModel):
    """``GET /v2``: ``{"name": str, "version": str, "extensions": [str]}``."""

    name: str
    version: str
    extensions: list[str]


class SupportRowInfo(BaseModel):
    """One row of a tensor-support table: from ``since`` on (DML feature level; null for
    OpenVINO/ONNX), these ranks and data types. ``output_types`` null: the input's type."""

    model_config = _REPLY

    since: str | None = None
    min_rank: int
    max_rank: int
    input_types: list[DataType]
    output_types: list[DataType] | None = None


class ParameterInfo(BaseModel):
    """An operator parameter: a string from ``choices``, or an integer when ``choices`` is null."""

    model_config = _REPLY

    name: str
    type: Literal["string", "integer"]
    choices: list[str] | None = None
    default: str | int | None = None
    required: bool = False
    description: str = ""


class MetadataTensor(BaseModel):
    """``$metadata_tensor = {"name": str, "datatype": str, "shape": [int]}``; -1 is a variable
    dimension. tensorbits adds what one ``datatype`` and one ``shape`` cannot say, at the model's
    default parameters: ``datatypes`` (every type the tensor takes, or may come back as) and
    ``min_rank``/``max_rank`` (the ranks it takes). ``datatype`` and ``shape`` stay valid for
    stock clients: one type of ``datatypes`` that every version of the operator accepts, and one
    rank it accepts, every dimension variable."""

    model_config = _REPLY

    name: str
    datatype: Datatype
    shape: list[int]
    datatypes: list[Datatype] | None = None
    min_rank: int | None = None
    max_rank: int | None = None


class ModelMetadataResponse(BaseModel):
    """``GET /v2/models/{model}``:
    ``{"name", "versions"?: [str], "platform": str, "inputs": [...], "outputs": [...]}``, and
    tensorbits' additions (openapi/README.md, "Model metadata"): ``parameters`` (the request
    parameters the model takes, with choices and defaults), ``support`` (its tensor-support table,
    newest row first: the ranks and data types from each ``support_parameter`` value on) and
    ``shape_rule`` (how input shapes combine). The same words are in the model configuration's
    ``parameters`` (``GET /v2/models/{model}/config``), where gRPC clients find them.
    """

    model_config = _REPLY

    name: str
    versions: list[str] | None = None
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]
    parameters: list[ParameterInfo] | None = None
    support: list[SupportRowInfo] | None = None
    support_parameter: str | None = Field(
        None, description="the parameter whose value picks the row of `support` (null: one row)"
    )
    shape_rule: Literal["identical", "numpy", "auto_broadcast"] | None = None


# --- model configuration extension (Triton's ModelConfig, protobuf JSON) --------------------------


class ModelParameter(BaseModel):
    """``{"string_value": str}``: one entry of a model configuration's ``parameters``."""

    model_config = _REPLY

    string_value: str


class ModelTensorConfig(BaseModel):
    """``{"name", "data_type": "TYPE_UINT8", "dims": [int]}``: Triton's ModelInput/ModelOutput.
    ``dims`` is the full shape here (``max_batch_size`` is 0), -1 a variable dimension."""

    model_config = _REPLY

    name: str
    data_type: str
    dims: list[int]


class ModelConfigResponse(BaseModel):
    """``GET /v2/models/{model}[/versions/{v}]/config``: the protobuf JSON of Triton's
    ``inference.ModelConfig`` (snake_case field names), as tritonclient's ``get_model_config``
    reads it. ``parameters`` carries the model metadata's additions as strings (see
    ``ModelMetadataResponse``)."""

    model_config = _REPLY

    name: str
    platform: str = ""
    backend: str = ""
    max_batch_size: int = 0
    version_policy: dict[str, Any] | None = None
    input: list[ModelTensorConfig]
    output: list[ModelTensorConfig]
    parameters: dict[str, ModelParameter] = Field(default_factory=dict)


# --- statistics extension (Triton's ModelStatistics, protobuf JSON) -------------------------------


class StatisticDuration(BaseModel):
    """``{"count": int, "ns": int}``: how many, and their summed nanoseconds."""

    model_config = _REPLY

    count: int = 0
    ns: int = 0


class InferStatistics(BaseModel):
    """Triton's ``InferStatistics``: ``success`` and ``fail`` (requests and their whole time),
    the successes' phases (``queue``, ``compute_input``, ``compute_infer``, ``compute_output``),
    and the response cache's (always 0 here). The server's core/statistics.py says what each
    phase covers."""

    model_config = _REPLY

    success: StatisticDuration = Field(default_factory=StatisticDuration)
    fail: StatisticDuration = Field(default_factory=StatisticDuration)
    queue: StatisticDuration = Field(default_factory=StatisticDuration)
    compute_input: StatisticDuration = Field(default_factory=StatisticDuration)
    compute_infer: StatisticDuration = Field(default_factory=StatisticDuration)
    compute_output: StatisticDuration = Field(default_factory=StatisticDuration)
    cache_hit: StatisticDuration = Field(default_factory=StatisticDuration)
    cache_miss: StatisticDuration = Field(default_factory=StatisticDuration)


class ModelStatistics(BaseModel):
    """One model's ``{"name", "version", "last_inference" (ms since the epoch, 0: none),
    "inference_count", "execution_count", "inference_stats", "batch_stats"}``."""

    model_config = _REPLY

    name: str
    version: str
    last_inference: int = 0
    inference_count: int = 0
    execution_count: int = 0
    inference_stats: InferStatistics = Field(default_factory=InferStatistics)
    batch_stats: list[dict[str, Any]] = Field(default_factory=list)


class ModelStatisticsResponse(BaseModel):
    """``GET /v2/models[/{model}[/versions/{v}]]/stats``: ``{"model_stats": [...]}``, the
    protobuf JSON of Triton's ``inference.ModelStatisticsResponse``."""

    model_config = _REPLY

    model_stats: list[ModelStatistics]


class RepositoryIndexRequest(BaseModel):
    """``POST /v2/repository/index`` body: ``{"ready"?: bool}`` (an empty body is ``{}``)."""

    model_config = _STRICT

    ready: StrictBool | None = Field(None, description="true: list only the models ready now")


class LoadRequest(BaseModel):
    """``POST /v2/repository/models/{m}/load`` body, Triton's: ``{"parameters"?: {"config":
    "<the model configuration, JSON text>", "file:1/model.onnx": "<the file, base64>"}}``. An
    empty body (or no files) loads a built-in model unloaded before; with the file, a graph
    model (docs/graph-models.md)."""

    model_config = _STRICT

    parameters: dict[str, StrictStr] | None = Field(
        None,
        description='config: the model configuration as JSON text (e.g. {"backend": '
        '"onnxruntime"}); file:1/model.onnx: the ONNX file, base64',
    )


class RepositoryIndexEntry(BaseModel):
    """``{"name": str, "version"?: str, "state"?: str, "reason"?: str}``."""

    name: str
    version: str | None = None
    state: Literal["READY", "UNAVAILABLE"]
    reason: str | None = None


class ErrorResponse(BaseModel):
    """``{"error": str}``, as the protocol says, with tensorbits' machine-readable fields beside it:
    ``code`` (stable: ``invalid_request``, ``not_found``, ``payload_too_large``, ``overloaded``
    ...), ``field`` (the input, parameter or header at fault) and ``rule`` (the rule broken)."""

    error: str
    code: str | None = None
    field: str | None = None
    rule: str | None = None


# --- system shared-memory extension ------------------------------------------------------------


class SystemSharedMemoryRegisterRequest(BaseModel):
    """``POST /v2/systemsharedmemory/region/{name}/register``:
    ``{"key": str, "offset"?: int, "byte_size": int}``: ``byte_size`` bytes from ``offset`` of
    the POSIX shared-memory object ``key`` (its ``shm_open`` name) become region ``name``."""

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra={"examples": [{"key": "/tensorbits_in", "offset": 0, "byte_size": 64}]},
    )

    key: Annotated[StrictStr, Field(max_length=255)]
    offset: ByteCount = 0
    byte_size: ByteCount


class SystemSharedMemoryRegion(BaseModel):
    """One registered region in ``GET /v2/systemsharedmemory[/region/{name}]/status``."""

    name: str
    key: str
    offset: int
    byte_size: int


CUDA_IPC_HANDLE_BYTES = 64
"""A ``cudaIpcMemHandle_t``: CUDA_IPC_HANDLE_SIZE opaque bytes."""
MAX_RAW_HANDLE_CHARS = 128
"""The longest base64 text of a handle read (its 64 bytes are 88 characters)."""


class CudaRawHandle(BaseModel):
    """``{"b64": str}``: a ``cudaIpcMemHandle_t`` in base64, as ``tritonclient`` sends it."""

    model_config = _STRICT

    b64: Annotated[StrictStr, Field(max_length=MAX_RAW_HANDLE_CHARS)]

    def handle(self) -> bytes:
        """The handle's bytes: base64 of exactly ``CUDA_IPC_HANDLE_BYTES`` bytes, else a 400."""
        try:
            handle = base64.b64decode(self.b64, validate=True)
        except binascii.Error:
            raise InvalidRequest(
                "raw_handle.b64 is not base64 text", field="raw_handle", rule="cuda_ipc_handle"
            ) from None
        if len(handle) != CUDA_IPC_HANDLE_BYTES:
            raise InvalidRequest(
                f"raw_handle has {len(handle)} bytes; a cudaIpcMemHandle_t has "
                f"{CUDA_IPC_HANDLE_BYTES}",
                field="raw_handle",
                rule="cuda_ipc_handle",
            )
        return handle


class CudaSharedMemoryRegisterRequest(BaseModel):
    """``POST /v2/cudasharedmemory/region/{name}/register``:
    ``{"raw_handle": {"b64": str}, "device_id": int, "byte_size": int}``: the first
    ``byte_size`` bytes of the device memory the CUDA IPC handle names, on device ``device_id``,
    become region ``name`` (the CuPy backend only)."""

    model_config = ConfigDict(
        **_STRICT,
        json_schema_extra={
            "examples": [
                {"raw_handle": {"b64": "<88 characters>"}, "device_id": 0, "byte_size": 64}
            ]
        },
    )

    raw_handle: CudaRawHandle
    device_id: Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
    byte_size: ByteCount


class CudaSharedMemoryRegion(BaseModel):
    """One registered region in ``GET /v2/cudasharedmemory[/region/{name}]/status``."""

    name: str
    device_id: int
    byte_size: int


__all__ = [
    "CUDA_IPC_HANDLE_BYTES",
    "MAX_WIRE_RANK",
    "CudaRawHandle",
    "CudaSharedMemoryRegion",
    "CudaSharedMemoryRegisterRequest",
    "Datatype",
    "Dimension",
    "ErrorResponse",
    "InferStatistics",
    "InferenceRequest",
    "InferenceRequestParameters",
    "InferenceResponse",
    "LoadRequest",
    "MetadataTensor",
    "ModelConfigResponse",
    "ModelMetadataResponse",
    "ModelParameter",
    "ModelStatistics",
    "ModelStatisticsResponse",
    "ModelTensorConfig",
    "ParameterInfo",
    "RepositoryIndexEntry",
    "RepositoryIndexRequest",
    "RequestInput",
    "RequestInputParameters",
    "RequestOutput",
    "RequestOutputParameters",
    "ResponseOutput",
    "ResponseOutputParameters",
    "ServerLiveResponse",
    "ServerMetadataResponse",
    "ServerReadyResponse",
    "StatisticDuration",
    "SupportRowInfo",
    "SystemSharedMemoryRegion",
    "SystemSharedMemoryRegisterRequest",
    "TensorData",
    "WireParameterValue",
    "WireShape",
]
