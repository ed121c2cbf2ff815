"""What OpenAPI says about the v2 routes that FastAPI cannot infer from their signatures.

The infer handlers read the raw body (no body parameter, so FastAPI never parses or copies it),
so their request schema, the binary framing's header and content types, and the error bodies are
declared here, as data, and attached with ``openapi_extra`` and ``responses``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tensorbits_protocol import codec
from tensorbits_protocol.v2 import ErrorResponse, InferenceRequest

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
EMPTY_OK: dict[int | str, dict[str, Any]] = {200: {"description": "Yes (empty body)"}}
