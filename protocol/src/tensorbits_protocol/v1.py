"""Wire models of the native batch API (``/v1``): the one definition the server and the SDK share.

DirectML's binding model over HTTP. A batch declares named byte buffers, then dispatches
operators whose tensors are DML buffer tensor descriptions bound at byte offsets of those
buffers, and names the buffers to return::

    POST /v1/batch                     Inference-Header-Content-Length: <n>
    <n bytes of BatchRequest JSON><the data buffers' bytes, concatenated in declaration order>

    200 application/octet-stream       Inference-Header-Content-Length: <m>
    <m bytes of BatchResponse JSON><the output buffers' bytes, in ``outputs`` order>

The models only check the shape of the JSON (types, required fields, lengths of names). Every
rule that relates one field to another (bounds, aliasing, the operators' tables) is checked by
the server's planner, which names the field path of the first violation. docs/batch-api.md has
the design.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from tensorbits_protocol.integers import UInt64, Wide64
from tensorbits_protocol.operators import Encoding, Function, ShapeRule

# The rule-table rows and parameters are the v2 model metadata's too: one definition, in v2.
from tensorbits_protocol.v2 import ParameterInfo, SupportRowInfo, WireParameterValue

# Names are echoed in error messages, so they are short; 128 characters is plenty for a label.
Name = Annotated[str, Field(min_length=1, max_length=128)]
OperatorName = Annotated[str, Field(min_length=1, max_length=256)]

# The v2 spellings of every DataType plus DirectML's FLOAT16/32/64 (dtypes.parse_datatype reads
# both). A Literal so the OpenAPI schema lists them; tests keep it equal to DataType + aliases.
DataTypeName = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "FLOAT16", "FLOAT32", "FLOAT64",
]  # fmt: skip


class _Request(BaseModel):
    # What callers send is read strictly: "4" is not 4 and 4.0 is not 4, and a misspelt field
    # ("stride") is an error rather than silently the default.
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _Reply(BaseModel):
    # What the server sends is read leniently, so an older SDK keeps working when a newer
    # server adds a field.
    model_config = ConfigDict(frozen=True)


# --- POST /v1/batch request ---------------------------------------------------------------------
class TensorDescription(_Request):
    """DML_BUFFER_TENSOR_DESC. Sizes and strides are in elements; strides absent = packed row-major,
    a stride of 0 broadcasts along its dimension (inputs only)."""

    datatype: DataTypeName
    sizes: list[Wide64]
    strides: list[Wide64] | None = None
    total_size: Wide64 | None = Field(
        None, description="TotalTensorSizeInBytes; absent: the minimum implied size"
    )
    alignment: Wide64 = Field(0, description="GuaranteedBaseOffsetAlignment; 0: none (16)")


class BufferBinding(_Request):
    """DML_BUFFER_BINDING: a byte range [offset, offset + size) of a declared buffer, read
    through ``desc``."""

    buffer: Name
    offset: Wide64 = 0
    size: Wide64 | None = Field(None, description="bytes bound; absent: desc's total size")
    desc: TensorDescription


class Dispatch(_Request):
    """One operator run: every tensor of the operator (inputs and output) bound by name."""

    operator: OperatorName
    parameters: dict[Name, WireParameterValue] = Field(default_factory=dict)
    bindings: dict[Name, BufferBinding]


class BufferDeclaration(_Request):
    """A named buffer. Without ``init`` its ``byte_size`` bytes follow the header in the body;
    with ``init: "zeros"`` the server allocates it zero-filled and the body carries nothing."""

    name: Name
    byte_size: UInt64
    init: Literal["zeros"] | None = None


class BatchRequest(_Request):
    """The JSON header of POST /v1/batch."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": "hamming-1",
                    "buffers": [
                        {"name": "codes", "byte_size": 256},
                        {"name": "query", "byte_size": 64},
                        {"name": "diff", "byte_size": 256, "init": "zeros"},
                        {"name": "counts", "byte_size": 32, "init": "zeros"},
                    ],
                    "dispatches": [
                        {
                            "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_XOR",
                            "bindings": {
                                "ATensor": {
                                    "buffer": "codes",
                                    "desc": {"datatype": "UINT64", "sizes": [4, 8]},
                                },
                                "BTensor": {
                                    "buffer": "query",
                                    "desc": {
                                        "datatype": "UINT64",
                                        "sizes": [4, 8],
                                        "strides": [0, 1],
                                    },
                                },
                                "OutputTensor": {
                                    "buffer": "diff",
                                    "desc": {"datatype": "UINT64", "sizes": [4, 8]},
                                },
                            },
                        },
                        {
                            "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT",
                            "bindings": {
                                "InputTensor": {
                                    "buffer": "diff",
                                    "desc": {"datatype": "UINT64", "sizes": [4, 8]},
                                },
                                "OutputTensor": {
                                    "buffer": "counts",
                                    "desc": {"datatype": "UINT8", "sizes": [4, 8]},
                                },
                            },
                        },
                    ],
                    "outputs": ["counts"],
                }
            ]
        }
    )

    id: Annotated[str, Field(max_length=256)] | None = None
    buffers: list[BufferDeclaration]
    dispatches: list[Dispatch]
    outputs: list[Name]


# --- a graph model in the binding model (model.json) --------------------------------------------
class GraphTensor(_Request):
    """A graph model's input or output: a whole declared buffer, read as one packed tensor of
    this type and shape (the buffer's ``byte_size`` is the tensor's bytes)."""

    name: Name
    datatype: DataTypeName
    shape: list[Wide64]
    buffer: Name


class BindingGraph(_Request):
    """A graph model written in the batch API's binding model (a model's ``model.json``): the
    buffers and dispatches of a batch, with named model inputs and outputs mapped onto buffers.
    Each inference fills the input buffers with its inputs, zero-fills the others, runs the
    dispatches in order and answers the output buffers: DirectML's feature levels, strides,
    offsets and in-place bindings, served as a model of the v2 protocol."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "inputs": [
                        {"name": "codes", "datatype": "UINT32", "shape": [4, 8], "buffer": "codes"},
                        {"name": "query", "datatype": "UINT32", "shape": [8], "buffer": "query"},
                    ],
                    "outputs": [
                        {
                            "name": "distance",
                            "datatype": "UINT8",
                            "shape": [4, 8],
                            "buffer": "counts",
                        }
                    ],
                    "buffers": [
                        {"name": "codes", "byte_size": 128},
                        {"name": "query", "byte_size": 32},
                        {"name": "counts", "byte_size": 32, "init": "zeros"},
                    ],
                    "dispatches": [
                        {
                            "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_XOR",
                            "bindings": {
                                "ATensor": {
                                    "buffer": "codes",
                                    "desc": {"datatype": "UINT32", "sizes": [4, 8]},
                                },
                                "BTensor": {
                                    "buffer": "query",
                                    "desc": {
                                        "datatype": "UINT32",
                                        "sizes": [4, 8],
                                        "strides": [0, 1],
                                    },
                                },
                                "OutputTensor": {
                                    "buffer": "codes",
                                    "desc": {"datatype": "UINT32", "sizes": [4, 8]},
                                },
                            },
                        },
                        {
                            "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT",
                            "parameters": {"feature_level": "4_1"},
                            "bindings": {
                                "InputTensor": {
                                    "buffer": "codes",
                                    "desc": {"datatype": "UINT32", "sizes": [4, 8]},
                                },
                                "OutputTensor": {
                                    "buffer": "counts",
                                    "desc": {"datatype": "UINT8", "sizes": [4, 8]},
                                },
                            },
                        },
                    ],
                }
            ]
        }
    )

    inputs: list[GraphTensor]
    outputs: list[GraphTensor]
    buffers: list[BufferDeclaration]
    dispatches: list[Dispatch]


# --- POST /v1/batch response --------------------------------------------------------------------
class OutputBuffer(_Reply):
    name: str
    byte_size: int


class BatchResponse(_Reply):
    """The JSON header of a POST /v1/batch response; the buffers' bytes follow in this order."""

    id: str | None = None
    outputs: list[OutputBuffer]


# --- GET /v1/operators --------------------------------------------------------------------------
class OperatorInfo(_Reply):
    """Every rule table of one operator; ``catalog.from_wire`` rebuilds the OperatorSpec."""

    name: str
    spec: Literal["dml", "openvino", "onnx"]
    function: Function
    inputs: list[str]
    output: str
    shape_rule: ShapeRule
    encoding: Encoding
    support: list[SupportRowInfo] = Field(description="newest first")
    parameters: list[ParameterInfo]
    in_place: list[str] = Field(
        description="inputs the output may be bound to, range and desc equal"
    )
    allow_empty: bool
    summary: str = ""


class OperatorList(_Reply):
    operators: list[OperatorInfo]
