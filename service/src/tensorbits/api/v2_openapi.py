"""What OpenAPI says about the v2 routes that FastAPI cannot infer from their signatures.

The infer routes are plain ASGI apps served ahead of the framework (``v2_infer.py``), so all of
their operation is declared here, as data (``infer_operation``): the path parameters (the same
descriptions the FastAPI routes' ``ModelName`` and ``ModelVersion`` give), the request schema, the
binary framing's header and content types, and the error bodies. The FastAPI routes that read a
raw body attach theirs with ``openapi_extra`` and ``responses``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel

from tensorbits.api.fastpath import Operation
from tensorbits_protocol import codec
from tensorbits_protocol.v2 import ErrorResponse, InferenceRequest, InferenceResponse

TAG = "v2"
PATH_PARAMETERS = {
    "model": "An operator name, e.g. `onnx.BitwiseAnd-18`",
    "version": 'The model version: only `"1"` exists',
}
ModelName = Annotated[str, Path(description=PATH_PARAMETERS["model"])]
ModelVersion = Annotated[str, Path(description=PATH_PARAMETERS["version"])]

ERROR_DESCRIPTIONS = {
    400: "Invalid request: the message names the input, parameter or header and the rule",
    404: "Unknown model or version",
    413: "Over a size limit (body, tensor elements, tensor count, JSON data)",
    503: "Not ready, or overloaded (retry after `Retry-After` seconds)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    return {s: {"model": ErrorResponse, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


def _inline_refs(node: Any, defs: dict[str, Any]) -> Any:
    """A JSON Schema with every ``#/$defs/X`` reference replaced by its definition.

    ``openapi_extra`` cannot add components, and a ``$defs`` reference inside an OpenAPI document
    resolves against the document's root, so the request schema is written out whole."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline_refs(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def request_schema(model: type[BaseModel]) -> Any:
    schema = model.model_json_schema()
    return _inline_refs(schema, schema.get("$defs", {}))


INFER_OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": codec.HEADER_LENGTH,
            "in": "header",
            "required": False,
            "description": "Binary tensor data extension: byte length of the JSON header at the "
            "start of the body; absent, the whole body is JSON",
            "schema": {"type": "integer", "minimum": 0},
        }
    ],
    "requestBody": {
        "required": True,
        "description": (
            "An inference request. Either all JSON (`application/json`, or no Content-Type), or "
            "Triton's binary tensor data extension: the JSON header, then the raw tensors of the "
            "inputs that set `parameters.binary_data_size`, back to back in header order, with "
            "`Inference-Header-Content-Length` giving the JSON's byte length. See "
            "openapi/README.md. `Content-Encoding: gzip` or `deflate` is accepted."
        ),
        "content": {
            "application/json": {"schema": request_schema(InferenceRequest)},
            codec.BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}},
        },
    },
}
INFER_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            "The inference response: JSON, or (when an output is requested as binary data) "
            "`application/octet-stream` with `Inference-Header-Content-Length`: the JSON header, "
            "then each binary output's bytes."
        ),
        "content": {codec.BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
        "headers": {
            codec.HEADER_LENGTH: {
                "description": "Byte length of the JSON header (binary responses only)",
                "schema": {"type": "integer"},
            }
        },
    },
    **errors(400, 404, 413, 503),
}


def infer_operation(operation_id: str, summary: str) -> Operation:
    """The operation of a ``POST /v2/models/{model}[/versions/{version}]/infer`` route."""
    return Operation(
        operation_id=operation_id,
        summary=summary,
        tags=[TAG],
        path_parameters=PATH_PARAMETERS,
        openapi_extra=INFER_OPENAPI,
        responses=INFER_RESPONSES,
        response_model=InferenceResponse,
    )


EMPTY_OK: dict[int | str, dict[str, Any]] = {200: {"description": "Yes (empty body)"}}
