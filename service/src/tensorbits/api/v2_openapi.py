"""What OpenAPI says about the v2 routes that FastAPI cannot infer from their signatures.

The infer routes are plain ASGI apps served ahead of the framework (``v2_infer.py``), so all of
their operation is declared here, as data (``infer_operation``): the path parameters (the same
descriptions and enumerations the FastAPI routes' ``ModelName`` and ``ModelVersion`` give), the
request schema with examples, the binary framing's header and content types, and the error
bodies. The FastAPI routes that read a raw body attach theirs with ``openapi_extra`` and
``responses``.

What /docs (Swagger UI) offers comes from here too: the model parameter is a list of the operator
names (``MODEL_NAMES``, from the operator table), the request body's examples are one per shape of
request (``infer_examples``: the operators that take the same inputs and required parameters
share one), the first fitting the first model of the list, and each error status has a real
error body as its example (``ERROR_EXAMPLES``, the server's own words).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel

from tensorbits.api.fastpath import Operation
from tensorbits.core.models import MODEL_VERSIONS
from tensorbits_protocol import codec
from tensorbits_protocol.errors import TensorbitsError
from tensorbits_protocol.operators import OPERATORS, OperatorSpec, get_operator
from tensorbits_protocol.v2 import ErrorResponse, InferenceRequest, InferenceResponse

TAG = "v2"
PATH_PARAMETERS = {
    "model": "An operator name, e.g. `onnx.BitwiseAnd-18`",
    "version": 'The model version: only `"1"` exists',
}
MODEL_NAMES = [op.name for op in OPERATORS]
# Listed in the document, so /docs offers a choice; the routes still take any string and answer
# an unknown name with the protocol's 404.
PATH_PARAMETER_SCHEMAS: dict[str, dict[str, Any]] = {
    "model": {"enum": MODEL_NAMES},
    "version": {"enum": list(MODEL_VERSIONS)},
}
ModelName = Annotated[
    str,
    Path(description=PATH_PARAMETERS["model"], json_schema_extra=PATH_PARAMETER_SCHEMAS["model"]),
]
ModelVersion = Annotated[
    str,
    Path(
        description=PATH_PARAMETERS["version"],
        json_schema_extra=PATH_PARAMETER_SCHEMAS["version"],
    ),
]

ERROR_DESCRIPTIONS = {
    400: "Invalid request: the message names the input, parameter or header and the rule",
    404: "Unknown model or version",
    413: "Over a size limit (body, tensor elements, tensor count, JSON data)",
    503: "Not ready, or overloaded (retry after `Retry-After` seconds)",
}


def _refusal_of(call: Callable[[], object]) -> dict[str, Any]:
    """The JSON body of the refusal ``call`` raises: an example in the server's own words."""
    try:
        call()
    except TensorbitsError as exc:
        return exc.to_dict()
    raise AssertionError("the example's call was not refused")


# One real error body per status, as the server words it (tests/api/test_openapi.py sends
# the request behind each and compares): Swagger UI shows them instead of `"string"`.
ERROR_EXAMPLES: dict[int, dict[str, dict[str, Any]]] = {
    400: {
        "datatype": {
            "summary": "Inference: a data type the model does not take",
            "value": {
                "error": "A: data type FP32 is not supported by onnx.BitwiseAnd-18 (allowed: "
                "UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64)",
                "code": "invalid_request",
                "field": "A",
                "rule": "datatype",
            },
        },
        "broadcast": {
            "summary": "Inference: shapes that do not broadcast",
            "value": {
                "error": "B: shapes A [2] and B [3] do not broadcast under NumPy rules for "
                "onnx.BitwiseAnd-18 (allowed: equal sizes or 1, aligned from the last dimension)",
                "code": "invalid_request",
                "field": "B",
                "rule": "broadcast",
            },
        },
        "list_type": {
            "summary": "A body that breaks the request's schema",
            "value": {
                "error": "request body: inputs: Input should be a valid list (got 1)",
                "code": "invalid_request",
                "field": "inputs",
                "rule": "list_type",
            },
        },
    },
    404: {
        "unknown_operator": {
            "summary": "No such model",
            "value": _refusal_of(lambda: get_operator("sha256")),
        },
    },
    413: {
        "max_tensor_elements": {
            "summary": "Inference: a tensor over the element limit",
            "value": {
                "error": "input 'A': shape [1099511627776, 1099511627776] has "
                "1208925819614629174706176 elements, more than the limit of 1073741824 "
                "(TENSORBITS_MAX_TENSOR_ELEMENTS)",
                "code": "payload_too_large",
                "field": "A",
                "rule": "max_tensor_elements",
            },
        },
        "max_body_bytes": {
            "summary": "A body over the limit (here POST /v2/repository/index's 64 KiB)",
            "value": {
                "error": "request body of 65537 bytes exceeds the limit of 65536 bytes "
                "(TENSORBITS_MAX_BODY_BYTES)",
                "code": "payload_too_large",
                "field": "body",
                "rule": "max_body_bytes",
            },
        },
    },
    503: {
        "overloaded": {
            "summary": "Too much in flight",
            "value": {
                "error": (
                    "server busy: 64 requests in flight (limit 64, "
                    "TENSORBITS_MAX_INFLIGHT_REQUESTS); retry later"
                ),
                "code": "overloaded",
                "field": "request",
                "rule": "max_inflight_requests",
            },
        },
    },
}


def error_body(status: int) -> dict[str, Any]:
    """The ``content`` of an error response as OpenAPI writes it: ``ErrorResponse`` JSON (the
    component, as FastAPI refers to a model's schema) with ``ERROR_EXAMPLES[status]``."""
    return {
        "application/json": {
            "schema": {"$ref": "#/components/schemas/ErrorResponse"},
            "examples": ERROR_EXAMPLES[status],
        }
    }


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses`` entries (a FastAPI route's, or an ``Operation``'s) of ``ErrorResponse``
    bodies for ``statuses``, each with its examples."""
    return {
        s: {
            "model": ErrorResponse,
            "description": ERROR_DESCRIPTIONS[s],
            "content": {"application/json": {"examples": ERROR_EXAMPLES[s]}},
        }
        for s in statuses
    }


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


# Inputs of the examples: one element type every operator takes, and data any of them accepts
# (shift counts under the width).
_EXAMPLE_DATATYPE = "UINT8"
_EXAMPLE_DATA = ([240, 15, 170, 255], [1, 2, 3, 4])


def _request_style(op: OperatorSpec) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What a request for ``op`` has to name: its inputs, and each required parameter with a
    value it takes."""
    required = tuple(
        (p.name, p.choices[0] if p.choices else str(p.default)) for p in op.parameters if p.required
    )
    return op.inputs, required


def infer_examples() -> dict[str, dict[str, Any]]:
    """One request example per request style, in the order of ``OPERATORS`` (so the first fits
    ``MODEL_NAMES[0]``, the model /docs selects first), each named after its first operator and
    listing every operator it fits."""
    styles: dict[tuple[Any, ...], list[OperatorSpec]] = {}
    for op in OPERATORS:
        styles.setdefault(_request_style(op), []).append(op)
    examples: dict[str, dict[str, Any]] = {}
    for (inputs, required), ops in styles.items():
        value: dict[str, Any] = {
            "inputs": [
                {"name": name, "shape": [4], "datatype": _EXAMPLE_DATATYPE, "data": list(data)}
                for name, data in zip(inputs, _EXAMPLE_DATA, strict=False)
            ]
        }
        if required:
            value["parameters"] = dict(required)
        names = ", ".join(op.name for op in ops)
        examples[ops[0].name] = {
            "summary": f"{', '.join(inputs)}: {names}",
            "description": f"A request that fits {names}.",
            "value": value,
        }
    return examples


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
            "application/json": {
                "schema": request_schema(InferenceRequest),
                "examples": infer_examples(),
            },
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
                "description": "Byte length of the JSON header (binary responses only), "
                "uncompressed",
                "schema": {"type": "integer"},
            },
            "Content-Encoding": {
                "description": "`gzip` or `deflate` when the request's `Accept-Encoding` asked "
                "for it (never otherwise): the body is compressed, the header length above "
                "still counts the uncompressed JSON (openapi/README.md)",
                "schema": {"type": "string", "enum": ["gzip", "deflate"]},
            },
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
        path_parameter_schemas=PATH_PARAMETER_SCHEMAS,
        openapi_extra=INFER_OPENAPI,
        responses=INFER_RESPONSES,
        response_model=InferenceResponse,
    )


EMPTY_OK: dict[int | str, dict[str, Any]] = {200: {"description": "Yes (empty body)"}}
