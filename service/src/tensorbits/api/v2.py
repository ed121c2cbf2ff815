"""The Open Inference Protocol (KServe v2 / Triton HTTP) endpoints, with Triton's binary tensor
data and model repository extensions: the stock ``tritonclient.http`` works unchanged.

Every operator is a model of the same name, at version ``"1"``. Handlers are thin: the infer
handler reads the body into one buffer (``read_body``: bounded, decompressed), hands it to
``inference.plan`` and ``inference.execute``, and sends what they return. It declares no body
parameter, so FastAPI never parses (or copies) the body; ``openapi_extra`` documents the request
schema instead.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from starlette.routing import Match, Route
from starlette.types import Receive, Scope, Send

from tensorbits import __version__, inference
from tensorbits.api import v2_openapi
from tensorbits.api.body import declared_length, read_body
from tensorbits.api.deps import runtime_of
from tensorbits.api.offload import offload
from tensorbits.runtime import Runtime
from tensorbits_protocol import codec
from tensorbits_protocol.errors import InvalidRequest, OperatorNotFound
from tensorbits_protocol.jsondata import JsonLimits, parse_json
from tensorbits_protocol.operators import OPERATORS, OperatorSpec, get_operator
from tensorbits_protocol.v2 import (
    ErrorResponse,
    InferenceResponse,
    MetadataTensor,
    ModelMetadataResponse,
    RepositoryIndexEntry,
    RepositoryIndexRequest,
    ServerMetadataResponse,
)

SERVER_NAME = "tensorbits"
PLATFORM = "tensorbits"
EXTENSIONS = ("binary_tensor_data", "model_repository")
VERSIONS = (inference.MODEL_VERSION,)
# Work below these sizes runs on the event loop: a hop to a worker thread costs more than it.
# JSON is slow to parse per byte (about 20 ms per MiB), binary tensors fast (about 0.1 ms per MiB).
JSON_INLINE_MAX_BYTES = 64 << 10
COMPUTE_INLINE_MAX_BYTES = 1 << 20
REPOSITORY_BODY_MAX_BYTES = 64 << 10
REPOSITORY_JSON_LIMITS = JsonLimits(max_depth=4, max_values=16)

router = APIRouter(prefix="/v2", tags=["v2"])


ModelName = Annotated[str, Path(description="An operator name, e.g. `onnx.BitwiseAnd-18`")]
ModelVersion = Annotated[str, Path(description='The model version: only `"1"` exists')]


def _runtime(request: Request) -> Runtime | None:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    return runtime


def _is_ready(request: Request) -> bool:
    runtime = _runtime(request)
    return runtime is not None and runtime.ready


def _not_ready() -> JSONResponse:
    body = ErrorResponse(error="server is not ready", code="not_ready")
    return JSONResponse(body.model_dump(exclude_none=True), status_code=503)


def _model(model: str, version: str | None) -> OperatorSpec:
    op = get_operator(model)
    if version is not None and version not in VERSIONS:
        raise OperatorNotFound(
            f"model '{op.name}' has no version '{version[:40]}' (versions: {', '.join(VERSIONS)})",
            field="model_version",
            rule="unknown_version",
        )
    return op


def _metadata(op: OperatorSpec) -> ModelMetadataResponse:
    input_type, output_type = inference.model_metadata_types(op)
    return ModelMetadataResponse(
        name=op.name,
        versions=list(VERSIONS),
        platform=PLATFORM,
        inputs=[MetadataTensor(name=n, datatype=input_type.value, shape=[-1]) for n in op.inputs],
        outputs=[MetadataTensor(name=op.output, datatype=output_type.value, shape=[-1])],
    )


class _HeldResponse(Response):
    """A response that keeps its admission until its last byte is handed to the server: the
    response buffer is part of what admission bounds, and it lives until then."""

    def __init__(self, encoded: inference.Encoded, release: Callable[[], Awaitable[Any]]) -> None:
        super().__init__(encoded.body, media_type=encoded.media_type, headers=encoded.headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._release()


async def _infer(op: OperatorSpec, request: Request) -> Response:
    # The runtime and the header are read here, not declared as a dependency and a Header
    # parameter: FastAPI runs a plain-``def`` dependency (deps.RuntimeDep) on a worker thread, and
    # its parameter machinery costs as much as the rest of a small inference. The header is
    # documented through v2_openapi.INFER_OPENAPI instead.
    runtime = runtime_of(request)
    settings = runtime.settings
    stack = AsyncExitStack()
    # Admitted for the declared body before a byte is read: many clients declaring large bodies
    # at once get 503s instead of each making the server allocate its body.
    declared = declared_length(request, settings.max_body_bytes) or 0
    grant = await stack.enter_async_context(runtime.admission.admit(declared))
    try:
        body = await read_body(request, settings.max_body_bytes, settings.timeout_body_read)
        header_value = request.headers.get(codec.HEADER_LENGTH)
        header_length = codec.parse_header_length(header_value, len(body))
        json_bytes = len(body) if header_length is None else header_length
        limits = inference.Limits.from_settings(settings)
        plan = await offload(
            json_bytes, JSON_INLINE_MAX_BYTES, inference.plan, op, body, header_length, limits
        )
        grant.grow(len(body) - declared + plan.output_nbytes)
        backend = runtime.selection.backend
        encoded = await offload(
            plan.work_bytes, COMPUTE_INLINE_MAX_BYTES, inference.execute, plan, backend
        )
    except BaseException:
        await stack.aclose()
        raise
    return _HeldResponse(encoded, stack.aclose)


# --- inference (registered first: routes are matched in order, and this is the hot one) --------


async def _infer_endpoint(request: Request) -> Response:
    params = request.path_params
    return await _infer(_model(params["model"], params.get("version")), request)


# The hot path as plain Starlette routes, which the app puts ahead of every FastAPI route: they
# skip FastAPI's per-request dependency and parameter solving, about half the cost of a small
# inference. The FastAPI routes below, with the same paths, stay for the OpenAPI schema and the
# docs (and answer only if these are not mounted).
class _Route(Route):
    """A Starlette route that records itself in the scope as FastAPI's routes do, so metrics and
    logs label its requests by the route template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


FAST_ROUTES = [
    _Route("/v2/models/{model}/infer", _infer_endpoint, methods=["POST"]),
    _Route("/v2/models/{model}/versions/{version}/infer", _infer_endpoint, methods=["POST"]),
]


@router.post(
    "/models/{model}/infer",
    response_model=InferenceResponse,
    response_model_exclude_none=True,
    responses=v2_openapi.INFER_RESPONSES,
    openapi_extra=v2_openapi.INFER_OPENAPI,
    summary="Run the operator",
)
async def model_infer(model: ModelName, request: Request) -> Response:
    return await _infer(_model(model, None), request)


@router.post(
    "/models/{model}/versions/{version}/infer",
    response_model=InferenceResponse,
    response_model_exclude_none=True,
    responses=v2_openapi.INFER_RESPONSES,
    openapi_extra=v2_openapi.INFER_OPENAPI,
    summary="Run the operator (one version)",
)
async def model_version_infer(
    model: ModelName, version: ModelVersion, request: Request
) -> Response:
    return await _infer(_model(model, version), request)


# --- server --------------------------------------------------------------------------------------


@router.get("", response_model=ServerMetadataResponse, summary="Server metadata")
async def server_metadata() -> ServerMetadataResponse:
    return ServerMetadataResponse(
        name=SERVER_NAME, version=__version__, extensions=list(EXTENSIONS)
    )


@router.get(
    "/health/live",
    response_class=Response,
    responses=v2_openapi.EMPTY_OK,
    summary="Liveness: 200 with an empty body while the process serves",
)
async def server_live() -> Response:
    return Response(status_code=200)


@router.get(
    "/health/ready",
    response_class=Response,
    responses={**v2_openapi.EMPTY_OK, **v2_openapi.errors(503)},
    summary="Readiness: 200 once the backend is up, 503 before that and while draining",
)
async def server_ready(request: Request) -> Response:
    return Response(status_code=200) if _is_ready(request) else _not_ready()


# --- model repository extension ------------------------------------------------------------------


@router.post(
    "/repository/index",
    response_model=list[RepositoryIndexEntry],
    response_model_exclude_none=True,
    responses=v2_openapi.errors(400, 413),
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {
                "application/json": {"schema": v2_openapi.request_schema(RepositoryIndexRequest)}
            },
        }
    },
    summary="Every model (operator), with its version and state",
)
async def repository_index(request: Request) -> list[RepositoryIndexEntry]:
    body = await read_body(request, REPOSITORY_BODY_MAX_BYTES)
    query = RepositoryIndexRequest()
    if body.strip():
        document = parse_json(body, REPOSITORY_JSON_LIMITS, "request body")
        query = inference.validate_document(RepositoryIndexRequest, document, "request body")
    ready = _is_ready(request)
    if query.ready and not ready:
        return []
    return [
        RepositoryIndexEntry(
            name=op.name,
            version=inference.MODEL_VERSION,
            state="READY" if ready else "UNAVAILABLE",
            reason=None if ready else "server is not ready",
        )
        for op in OPERATORS
    ]


@router.post(
    "/repository/models/{model}/load",
    response_class=Response,
    responses={**v2_openapi.EMPTY_OK, **v2_openapi.errors(404)},
    summary="Load a model: every operator is built in and always loaded, so this only checks it",
)
async def repository_model_load(model: ModelName) -> Response:
    get_operator(model)
    return Response(status_code=200)


@router.post(
    "/repository/models/{model}/unload",
    response_class=Response,
    responses=v2_openapi.errors(400, 404),
    summary="Unload a model: refused, operators are built in",
)
async def repository_model_unload(model: ModelName) -> Response:
    op = get_operator(model)
    raise InvalidRequest(
        f"model '{op.name}' is built in and cannot be unloaded",
        field="model_name",
        rule="builtin_model",
    )


# --- models --------------------------------------------------------------------------------------


@router.get(
    "/models/{model}",
    response_model=ModelMetadataResponse,
    response_model_exclude_none=True,
    responses=v2_openapi.errors(404),
    summary="Model metadata: input and output names, a data type, shape [-1]",
)
async def model_metadata(model: ModelName) -> ModelMetadataResponse:
    return _metadata(_model(model, None))


@router.get(
    "/models/{model}/versions/{version}",
    response_model=ModelMetadataResponse,
    response_model_exclude_none=True,
    responses=v2_openapi.errors(404),
    summary="Model metadata of one version",
)
async def model_version_metadata(model: ModelName, version: ModelVersion) -> ModelMetadataResponse:
    return _metadata(_model(model, version))


@router.get(
    "/models/{model}/ready",
    response_class=Response,
    responses={**v2_openapi.EMPTY_OK, **v2_openapi.errors(404, 503)},
    summary="Model readiness",
)
async def model_ready(model: ModelName, request: Request) -> Response:
    _model(model, None)
    return Response(status_code=200) if _is_ready(request) else _not_ready()


@router.get(
    "/models/{model}/versions/{version}/ready",
    response_class=Response,
    responses={**v2_openapi.EMPTY_OK, **v2_openapi.errors(404, 503)},
    summary="Model readiness of one version",
)
async def model_version_ready(
    model: ModelName, version: ModelVersion, request: Request
) -> Response:
    _model(model, version)
    return Response(status_code=200) if _is_ready(request) else _not_ready()
