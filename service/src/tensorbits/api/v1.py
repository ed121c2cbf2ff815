"""The native API: POST /v1/batch (DirectML's binding model), GET /v1/operators[/{name}].

Thin handlers: read the body, split the framing, decode the header, plan (batch.py checks it
all), admit, run off the event loop, frame the response. docs/batch-api.md has the design.

The batch itself is a plain ASGI app (``run_batch_request``), as v2 inference is (``v2_infer``):
it reads the headers it needs in one pass and sends one response buffer, without a ``Request``,
a ``Response`` or FastAPI's per-request layers. ``ROUTES`` serves it ahead of the framework
(``api/fastpath.py``) where the app lists it; the FastAPI route here runs the same code and
gives the OpenAPI schema.
"""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from tensorbits import batch
from tensorbits.api.deps import runtime_of_app
from tensorbits.api.fastpath import FastRoute, Operation
from tensorbits.api.framed import Exchange
from tensorbits.api.offload import offload
from tensorbits.config import Settings
from tensorbits.header_cache import HeaderCache
from tensorbits.runtime import Runtime
from tensorbits_protocol.catalog import describe, listing
from tensorbits_protocol.codec import (
    BINARY_CONTENT_TYPE,
    HEADER_LENGTH,
    BodyLayout,
    dump_header,
    split_body,
)
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, check_length, check_structure
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.schema_errors import field_path, first_error
from tensorbits_protocol.v1 import (
    BATCH_REQUEST_DATA,
    BatchRequest,
    BatchRequestData,
    BatchResponse,
    OperatorInfo,
    OperatorList,
    OutputBuffer,
)


# --- the header -----------------------------------------------------------------------------------
# The framing around it is the binary extension's, shared with /v2 (tensorbits_protocol.codec):
# a JSON header whose byte length travels in Inference-Header-Content-Length, then raw buffers.
def decode_header(header: memoryview | bytes, limits: JsonLimits) -> BatchRequestData:
    """The batch header; malformed JSON or fields are a 400 naming the first bad field.

    Its bytes are scanned first (``check_structure``: length, depth, values, the counts of
    buffers, dispatches and outputs), so a header past a limit is refused before any object is
    built for it. Then it is read into plain dicts (``BATCH_REQUEST_DATA``, the fast reader); a
    header it refuses is read again by the models, so the error is the documented one, and what
    the models accept is planned whatever the fast reader thought of it."""
    raw = bytes(header)
    check_structure(raw, limits, "header")
    try:
        return BATCH_REQUEST_DATA.validate_json(raw)
    except ValidationError:
        pass
    try:
        request = BatchRequest.model_validate_json(raw)
    except ValidationError as exc:
        loc, message, rule = first_error(exc.errors(include_url=False))
        path = field_path(loc, "header")
        raise InvalidRequest(f"{path}: {message}", field=path, rule=rule) from None
    return cast(BatchRequestData, request.model_dump())


# Below these sizes a batch is planned / run on the event loop (see api/offload.py).
PLAN_INLINE_MAX_BYTES = 64 << 10
RUN_INLINE_MAX_BYTES = 1 << 20


def _plan(
    body: bytearray,
    header_length: int | None,
    settings: Settings,
    cache: HeaderCache[batch.BatchPlan] | None = None,
) -> batch.BatchPlan:
    """The batch's plan; with a ``cache``, a header planned before (for a body of this length)
    is not decoded and checked again (header_cache.py): a plan holds no byte of the body."""
    limits = batch.header_limits(settings)
    head = split_body(memoryview(body), header_length)[0]
    check_length(len(head), limits, "header")  # before the header is copied
    header = bytes(head)
    key = (header, len(body))
    if cache is not None and cache.keeps(header):
        remembered = cache.get(key)
        if remembered is not None:
            return remembered
    plan = batch.plan_batch(
        decode_header(header, limits),
        data_start=len(header),
        body_length=len(body),
        settings=settings,
    )
    if cache is not None:
        cache.put(key, plan, len(header))
    return plan


# --- routes -------------------------------------------------------------------------------------
_TAG = "native batch API"
router = APIRouter(prefix="/v1", tags=[_TAG])

_BATCH_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            f"A JSON header (BatchRequest; its byte length in the {HEADER_LENGTH} header) "
            "followed by the data buffers' bytes, concatenated in declaration order. Without "
            f"{HEADER_LENGTH} the whole body is the JSON header. See docs/batch-api.md."
        ),
        "content": {BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    }
}
_BATCH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": (
            f"A JSON header (BatchResponse; its byte length in the {HEADER_LENGTH} header) "
            "followed by the output buffers' bytes in the order of `outputs`."
        ),
        "content": {BINARY_CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
    },
    400: {"description": "a rule of the batch is broken; `field` names where"},
    413: {"description": "a size or count limit of the server was passed"},
    503: {"description": "too much in flight; retry after Retry-After seconds"},
}


async def run_batch_request(runtime: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """One batch, from the request's body to the response's last byte. Every failure is raised
    before the first byte is sent, so the app's exception handlers answer it."""
    settings = runtime.settings
    # Admitted for the declared body before a byte is read; the grant grows once the plan says
    # what the batch needs while it runs.
    exchange = Exchange(runtime, scope)
    try:
        body, header_length = await exchange.receive(receive)
        # Decoding and planning a batch of thousands of dispatches takes a good part of a second:
        # off the event loop then, like a large run. A small batch is done inline: the hop to a
        # worker thread and back costs more than the work.
        plan = await offload(
            header_length or len(body), PLAN_INLINE_MAX_BYTES, _plan, body, header_length,
            settings, runtime.batch_plans,
        )  # fmt: skip
        layout = _response_layout(plan)
        backend = runtime.selection.backend
        needed = plan.memory_needed(device_copies=not backend.host_memory) + layout.header_length
        if needed > runtime.admission.max_bytes:
            # Past the bound even with nothing else in flight: a 503 would be retried for ever.
            raise PayloadTooLarge(
                f"batch needs {needed} bytes while it runs (body, zero-filled buffers, outputs), "
                f"more than the server's limit of {runtime.admission.max_bytes} "
                "(TENSORBITS_MAX_INFLIGHT_BYTES)",
                field="buffers",
                rule="max_inflight_bytes",
            )
        exchange.grow(needed)
        response, sinks = layout.allocate()
        await offload(needed, RUN_INLINE_MAX_BYTES, batch.run_batch, plan, body, backend, sinks)
        await exchange.send(send, response, BINARY_CONTENT_TYPE, layout.header_length)
    finally:
        exchange.release()


def _response_layout(plan: batch.BatchPlan) -> BodyLayout:
    reply = BatchResponse(
        id=plan.id,
        outputs=[
            OutputBuffer(name=plan.buffers[i].name, byte_size=plan.buffers[i].byte_size)
            for i in plan.outputs
        ],
    )
    # Padded so the first output starts aligned, like a v2 response.
    return BodyLayout(
        dump_header(reply.model_dump(mode="json", exclude_none=True)),
        tuple(plan.buffers[i].byte_size for i in plan.outputs),
    )


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
