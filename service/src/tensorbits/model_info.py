"""What the server says about itself and its models, for every front end: the server metadata,
each model's metadata and its model configuration (Triton's ``ModelConfig``), all read off the
operator tables (``tensorbits_protocol.operators``), nothing written by hand.

The HTTP routes (``api/v2.py``) answer with these; the gRPC service turns the same documents into
its messages (``json_format.ParseDict``: ``model_config`` is the protobuf JSON of
``inference.ModelConfig``, with its own snake_case field names).

How polymorphic models are described (openapi/README.md, "Model metadata"): the protocol gives a
tensor one ``datatype`` and one ``shape``, which stay valid for stock clients (a type every
version of the operator accepts, and a rank it accepts at its default parameters, every
dimension -1). Beside them the metadata says, at the default parameters, every type each tensor
takes (``datatypes``) and its ranks (``min_rank``, ``max_rank``); for the model, its request
parameters with choices and defaults, its whole tensor-support table (by feature level for
DirectML) and its shape rule. gRPC's TensorMetadata has no room for these, so the model
configuration's ``parameters`` (a map of strings) carries the same words, flattened
(``config_parameters``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from tensorbits import __version__
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.models import MODEL_VERSIONS, Model
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.operators import FEATURE_LEVEL, OperatorSpec, SupportRow
from tensorbits_protocol.v2 import (
    MetadataTensor,
    ModelConfigResponse,
    ModelMetadataResponse,
    ParameterInfo,
    ServerMetadataResponse,
    SupportRowInfo,
)
from tensorbits_protocol.validation import support_row

SERVER_NAME = "tensorbits"
PLATFORM = "tensorbits"
# The extensions this server serves (GET /v2 lists them), and the one served only when switched
# on (TENSORBITS_SHARED_MEMORY). Not gRPC, which is a protocol, not an extension.
EXTENSIONS = ("binary_tensor_data", "model_repository", "model_configuration", "statistics")
# Triton's data_type names are the protocol's, prefixed (model_config.proto, DataType).
CONFIG_TYPE_PREFIX = "TYPE_"


def server_metadata(shared_memory: SharedMemoryRegions | None = None) -> ServerMetadataResponse:
    """``GET /v2``: the server's name, version and extensions (the shared-memory extensions
    that ``shared_memory``, the server's regions when they are on, serves)."""
    extensions = [*EXTENSIONS, *(shared_memory.extensions if shared_memory is not None else ())]
    return ServerMetadataResponse(name=SERVER_NAME, version=__version__, extensions=extensions)


def default_parameters(op: OperatorSpec) -> dict[str, str | int]:
    """The parameters a request that names none runs with."""
    return {p.name: p.default for p in op.parameters if p.default is not None}


def support_parameter(op: OperatorSpec) -> str | None:
    """The parameter whose value picks the support row (``validation.support_row``: the feature
    level of a DirectML operator); None where the table has one row for every request."""
    return FEATURE_LEVEL.name if any(row.since is not None for row in op.support) else None


def _output_types(row: SupportRow) -> tuple[DataType, ...]:
    return row.output_types if row.output_types is not None else row.input_types


def _tensor(
    name: str, datatype: DataType, types: tuple[DataType, ...], row: SupportRow
) -> MetadataTensor:
    # One rank every request at the default parameters may use: 1 where the row allows it.
    rank = min(max(row.min_rank, 1), row.max_rank)
    return MetadataTensor(
        name=name,
        datatype=datatype.value,
        shape=[-1] * rank,
        datatypes=[t.value for t in types],
        min_rank=row.min_rank,
        max_rank=row.max_rank,
    )


def model_metadata(op: Model) -> ModelMetadataResponse:
    """``GET /v2/models/{model}``: the protocol's fields, valid for stock clients, and the
    operator's types, ranks, parameters and support table (see the module's docstring); a
    graph model's inputs and outputs as its file declares them."""
    if isinstance(op, GraphModel):
        return graph_metadata(op)
    row = support_row(op, default_parameters(op))
    oldest = op.support[-1]
    # The one datatype: the first input type of the oldest row (every feature level and version
    # takes it), and the output type it gives at the default parameters (BIT_COUNT: the first of
    # its output types, output_datatype's default).
    input_type = oldest.input_types[0]
    output_type = input_type if row.output_types is None else row.output_types[0]
    return ModelMetadataResponse(
        name=op.name,
        versions=list(MODEL_VERSIONS),
        platform=PLATFORM,
        inputs=[_tensor(name, input_type, row.input_types, row) for name in op.inputs],
        outputs=[_tensor(op.output, output_type, _output_types(row), row)],
        parameters=[ParameterInfo.model_validate(p, from_attributes=True) for p in op.parameters],
        support=[SupportRowInfo.model_validate(r, from_attributes=True) for r in op.support],
        support_parameter=support_parameter(op),
        shape_rule=op.shape_rule.value,
    )


# --- the model configuration ---------------------------------------------------------------------


def _words(values: list[Any] | None) -> str:
    return ",".join(str(v) for v in values or ())


def graph_metadata(model: GraphModel) -> ModelMetadataResponse:
    """A graph model's metadata: its file's inputs and outputs (-1: a variable dimension; an
    output whose shape the file leaves out: [-1]); with ``max_batch_size`` above 0, the batch
    dimension first (-1), then its configuration's dims, as Triton shows them."""
    config = model.config
    batch = [-1] if model.max_batch_size > 0 else []  # Triton's: the batch dimension first
    return ModelMetadataResponse(
        name=model.name,
        versions=[model.version],
        platform=config["platform"],
        inputs=[_graph_tensor(t, batch) for t in config["input"]],
        outputs=[_graph_tensor(t, batch) for t in config["output"]],
    )


def _graph_tensor(entry: Mapping[str, Any], batch: list[int]) -> MetadataTensor:
    return MetadataTensor(
        name=entry["name"],
        datatype=entry["data_type"].removeprefix(CONFIG_TYPE_PREFIX),
        shape=[*batch, *entry["dims"]],
    )


def config_parameters(metadata: ModelMetadataResponse) -> Iterator[tuple[str, str]]:
    """The metadata's additions as ModelConfig ``parameters`` (strings only): lists comma-joined,
    booleans ``true``/``false``, an absent value left out. Keys::

        input.<name>.datatypes / .min_rank / .max_rank     (at the default parameters)
        output.<name>.datatypes / .min_rank / .max_rank
        parameter.<name>.type / .choices / .default / .required / .description
        support_parameter, shape_rule
        support.<i>.since / .min_rank / .max_rank / .input_types / .output_types   (0: newest)
    """
    for kind, tensors in (("input", metadata.inputs), ("output", metadata.outputs)):
        for tensor in tensors:
            yield f"{kind}.{tensor.name}.datatypes", _words(tensor.datatypes)
            yield f"{kind}.{tensor.name}.min_rank", str(tensor.min_rank)
            yield f"{kind}.{tensor.name}.max_rank", str(tensor.max_rank)
    for parameter in metadata.parameters or ():
        key = f"parameter.{parameter.name}"
        yield f"{key}.type", parameter.type
        if parameter.choices is not None:
            yield f"{key}.choices", _words(parameter.choices)
        if parameter.default is not None:
            yield f"{key}.default", str(parameter.default)
        yield f"{key}.required", str(parameter.required).lower()
        yield f"{key}.description", parameter.description
    if metadata.support_parameter is not None:
        yield "support_parameter", metadata.support_parameter
    if metadata.shape_rule is not None:
        yield "shape_rule", metadata.shape_rule
    for index, row in enumerate(metadata.support or ()):
        key = f"support.{index}"
        if row.since is not None:
            yield f"{key}.since", row.since
        yield f"{key}.min_rank", str(row.min_rank)
        yield f"{key}.max_rank", str(row.max_rank)
        yield f"{key}.input_types", _words(row.input_types)
        if row.output_types is not None:
            yield f"{key}.output_types", _words(row.output_types)


def _config_tensor(tensor: MetadataTensor) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "data_type": CONFIG_TYPE_PREFIX + tensor.datatype,
        "dims": tensor.shape,
    }


def model_config(op: Model) -> dict[str, Any]:
    """``GET /v2/models/{model}/config`` and gRPC ModelConfig: the protobuf JSON of Triton's
    ``inference.ModelConfig``, built from ``model_metadata`` (the same types, shapes and words).
    ``max_batch_size`` 0: no implicit batch dimension, ``dims`` is the whole shape. A graph
    model's is the one it was loaded with, completed from its file (platform onnxruntime_onnx)."""
    if isinstance(op, GraphModel):
        return dict(op.config)
    metadata = model_metadata(op)
    return {
        "name": op.name,
        "platform": PLATFORM,
        "backend": PLATFORM,
        "max_batch_size": 0,
        "version_policy": {"specific": {"versions": [int(v) for v in MODEL_VERSIONS]}},
        "input": [_config_tensor(t) for t in metadata.inputs],
        "output": [_config_tensor(t) for t in metadata.outputs],
        "parameters": {key: {"string_value": value} for key, value in config_parameters(metadata)},
    }


def model_config_response(op: Model) -> ModelConfigResponse:
    """``model_config`` as the wire model the HTTP route answers with."""
    return ModelConfigResponse.model_validate(model_config(op))


__all__ = [
    "EXTENSIONS",
    "PLATFORM",
    "SERVER_NAME",
    "config_parameters",
    "default_parameters",
    "graph_metadata",
    "model_config",
    "model_config_response",
    "model_metadata",
    "server_metadata",
    "support_parameter",
]
