"""The native API: POST /v1/batch (DirectML's binding model), GET /v1/operators[/{name}].

Thin handlers: read the body, plan (``batch.plan_rest`` decodes and checks it all), admit, run
(``batch.execute``) off the event loop when large, send: the data plane's lifecycle
(``Call.serve``). docs/batch-api.md has the design.

The batch itself is a plain ASGI app (``run_batch_request``), served as v2 inference is
(``v2_infer.through_the_plane``): it reads the headers it needs in one pass and sends one
response buffer, without a ``Request``, a ``Response`` or FastAPI's per-request layers. ``ROUTES``
registers it once, served ahead of the framework (``api/fastpath.py``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from fastapi import APIRouter
from starlette.types import Receive, Scope, Send

from tensorbits.api.deps import runtime_of_app
from tensorbits.api.fastpath import FastRoute, Operation
from tensorbits.api.v2_infer import through_the_plane
from tensorbits.api.v2_openapi import ERROR_EXAMPLES, request_schema
from tensorbits.core import batch
from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.placement import placed
from tensorbits.core.dataplane import Call, DataPlane, HoldWords, Needs
from tensorbits.runtime import Runtime
from tensorbits_protocol import codec
from tensorbits_protocol.catalog import describe, listing
from tensorbits_protocol.codec import BINARY_CONTENT_TYPE, HEADER_LENGTH
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.v1 import BatchRequest, OperatorInfo, OperatorList
from tensorbits_protocol.v2 import ErrorResponse

# --- routes -------------------------------------------------------------------------------------
_TAG = "native batch API"
router = APIRouter(prefix="/v1", tags=[_TAG])


def _zeros_batch(
    request_id: str, buffers: tuple[str, ...], steps: tuple[tuple[str, str, str], ...], output: str
) -> dict[str, Any]:
    """A batch of 16-byte zero-filled ``buffers`` and DML ``steps`` (operator suffix, input
    buffer, output buffer) over them as UINT8, returning ``output``."""
    desc = {"datatype": "UINT8", "sizes": [16]}
    return {
        "id": request_id,
        "buffers": [{"name": name, "byte_size": 16, "init": "zeros"} for name in buffers],
        "dispatches": [
            {
                "operator": f"DML_OPERATOR_ELEMENT_WISE_{suffix}",
                "bindings": {
                    "InputTensor": {"buffer": source, "desc": desc},
                    "OutputTensor": {"buffer": target, "desc": desc},
                },
            }
            for suffix, source, target in steps
        ],
        "outputs": [output],
    }


# Runnable from /docs: JSON alone (no Inference-Header-Content-Length), every buffer zero-filled.
_BATCH_EXAMPLES: dict[str, dict[str, Any]] = {
    "bit_not": {
        "summary": "BIT_NOT of a zero-filled buffer (16 bytes of 0xFF back)",
        "value": _zeros_batch(
            "not-zeros", ("zeros", "ones"), (("BIT_NOT", "zeros", "ones"),), "ones"
        ),
    },
    "not_then_count": {
        "summary": "BIT_NOT, then BIT_COUNT of its output (16 bytes of 8 back)",
        "value": _zeros_batch(
            "count-ones",
            ("bits", "counts"),
            (("BIT_NOT", "bits", "bits"), ("BIT_COUNT", "bits", "counts")),
            "counts",
        ),
    },
}
_BATCH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            f"A JSON header (BatchRequest; its byte length in the {HEADER_LENGTH} header) "
            "followed by the data buffers' bytes, concatenated in declaration order. Without "
            f"{HEADER_LENGTH} the whole body is the JSON header: `application/json`, every "
            'buffer then `"init": "zeros"` (the examples run as they are). See '
            "docs/batch-api.md."
        ),
        "content": {
            "application/json": {
                "schema": request_schema(BatchRequest),
                "examples": _BATCH_EXAMPLES,
            },
            BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}
# The server's own words (tests/api/test_openapi.py sends the request behind each).
_BATCH_ERROR_EXAMPLES: dict[int, dict[str, dict[str, Any]]] = {
    400: {
        "unknown_buffer": {
            "summary": "A binding names no declared buffer",
            "value": {
                "error": "dispatches[0].bindings.InputTensor.buffer: no buffer named 'zz' "
                "(declared: zeros, ones)",
                "code": "invalid_request",
                "field": "dispatches[0].bindings.InputTensor.buffer",
                "rule": "unknown_buffer",
            },
        },
        "json": {
            "summary": "A header that is not JSON",
            "value": {
                "error": "header: malformed JSON: Expecting property name enclosed in double "
                "quotes at line 1 column 2",
                "code": "invalid_request",
                "field": "header",
                "rule": "json",
            },
        },
    },
    413: {
        "max_temporary_bytes": {
            "summary": "Zero-filled buffers over the limit",
            "value": {
                "error": "buffers: 4611686018427387920 bytes of zero-filled buffers, more than "
                "the limit of 268435456 (TENSORBITS_MAX_BODY_BYTES)",
                "code": "payload_too_large",
                "field": "buffers",
                "rule": "max_temporary_bytes",
            },
        },
    },
    503: ERROR_EXAMPLES[503],
}
_BATCH_ERRORS = {
    400: "a rule of the batch is broken; `field` names where",
    413: "a size or count limit of the server was passed",
    503: "too much in flight; retry after Retry-After seconds",
}
_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            f"A JSON header (BatchResponse; its byte length in the {HEADER_LENGTH} header) "
            "followed by the output buffers' bytes in the order of `outputs`. /docs shows the "
            "headers and offers the body as a file to download."
        ),
        "content": {BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    },
    **{
        status: {
            "model": ErrorResponse,
            "description": description,
            "content": {"application/json": {"examples": _BATCH_ERROR_EXAMPLES[status]}},
        }
        for status, description in _BATCH_ERRORS.items()
    },
}


# What a refusal to hold a batch's memory names: its buffers are what the caller can shrink.
BATCH_WORDS = HoldWords("batch", "body, zero-filled buffers, outputs", "buffers")


def _needs(plan: batch.BatchPlan, backend: Backend) -> Needs:
    """What a planned batch holds and touches while it runs on ``backend`` (on a server that
    places work, the backend its placement chooses: a batch on the device holds its copies
    there), and what its statistics count it for: each dispatch an inference of its operator."""
    on = placed(backend, batch.batch_work(plan))
    needed = plan.memory_needed(device_copies=not on.host_memory)
    return Needs(needed, needed, [dispatch.call.op.name for dispatch in plan.dispatches])


async def _serve_batch(
    plane: DataPlane, call: Call, body: bytearray, header_length: int | None
) -> codec.Framed:
    """A batch's part of its call (``Call.serve``): decoded and planned (a batch of thousands
    of dispatches takes a good part of a second: off the event loop then, like a large run),
    held for what the plan says it needs, run."""
    return await call.serve(
        partial(batch.plan_rest, body, header_length, plane.batch_limits, plane.batch_plans),
        header_length or len(body),
        partial(_needs, backend=plane.backend),
        BATCH_WORDS,
        partial(batch.execute, body=body, backend=plane.backend),
    )


async def run_batch_request(runtime: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """One batch, from the request's body to the response's last byte, through the data
    plane's lifecycle as one inference is (``v2_infer.through_the_plane``): counted in the
    statistics once planned, each dispatch an inference of its operator."""
    await through_the_plane(runtime, scope, receive, send, (), partial(_serve_batch, runtime.plane))


class BatchEndpoint:
    """The ASGI app of ``POST /v1/batch``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await run_batch_request(runtime_of_app(scope["app"]), scope, receive, send)


# For ``routers.FAST_ROUTES``, served ahead of the framework: FastAPI's layers cost about 0.15 ms
# a batch. Registered once; the OpenAPI document has its operation from here.
ROUTES = [
    FastRoute(
        "/v1/batch",
        BatchEndpoint(),
        methods=["POST"],
        operation=Operation(
            operation_id="v1_batch",
            summary="Run a batch of dispatches over bound buffers",
            tags=[_TAG],
            responses=_BATCH_RESPONSES,
            openapi_extra=_BATCH_BODY,
        ),
    )
]


_LISTING = listing()


@router.get("/operators", summary="Every operator with its rule tables")
async def v1_list_operators() -> OperatorList:
    return _LISTING


@router.get("/operators/{name}", summary="One operator's rule tables")
async def v1_get_operator(name: str) -> OperatorInfo:
    return describe(get_operator(name))
