"""The Open Inference Protocol (KServe v2 / Triton HTTP) endpoints, with Triton's binary tensor
data, model repository, model configuration and statistics extensions: the stock
``tritonclient.http`` works unchanged. What the metadata and configuration routes say comes from
``model_info.py``, what the statistics route says from ``runtime.plane.statistics``: the gRPC front
end answers from the same.

Every operator is a model of the same name, at version ``"1"``. Inference itself, the hot path,
is a plain ASGI endpoint in ``v2_infer.py``, registered there (``ROUTES``) and documented by
``v2_openapi.infer_operation``; the FastAPI routes here are the rest of the protocol. The one that
reads a body declares no body parameter, so FastAPI never parses (or copies) it, and
``openapi_extra`` documents its schema.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from tensorbits import load_bounds, model_info, model_lifecycle
from tensorbits.api import v2_openapi
from tensorbits.api.body import declared_length, read_body
from tensorbits.api.deps import RuntimeDep, runtime_of
from tensorbits.api.load_body import read_load_body
from tensorbits.api.v2_openapi import ModelName, ModelVersion
from tensorbits.core.models import Model, ModelStates, resolve_served, version_of
from tensorbits.core.offload import JSON_INLINE_MAX_BYTES, offload
from tensorbits.logs import note_version
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, parse_json
from tensorbits_protocol.operators import OPERATORS
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import (
    ErrorResponse,
    LoadRequest,
    ModelConfigResponse,
    ModelMetadataResponse,
    ModelStatisticsResponse,
    RepositoryIndexEntry,
    RepositoryIndexRequest,
    ServerLiveResponse,
    ServerMetadataResponse,
    ServerReadyResponse,
)

REPOSITORY_BODY_MAX_BYTES = 64 << 10
REPOSITORY_JSON_LIMITS = JsonLimits(max_depth=4, max_values=16)

router = APIRouter(prefix="/v2", tags=[v2_openapi.TAG])


# The model a path names, as a dependency (async: FastAPI runs a plain-def one on a worker
# thread): an unknown model or version is a 404 before the route runs.
async def _model(request: Request, model: ModelName) -> Model:
    return _resolve(request, model, None)


async def _model_version(request: Request, model: ModelName, version: ModelVersion) -> Model:
    return _resolve(request, model, version)


def _resolve(request: Request, model: str, version: str | None) -> Model:
    """A graph model loaded on this server, or an operator."""
    served = resolve_served(runtime_of(request).plane.graphs, model, version)
    note_version(version_of(served))
    return served


# Each path's model, as an endpoint's default for ``op`` (FastAPI's ``Depends`` marker): the
# routes of a model and of a model version share their endpoint (``_per_model_route``).
_PER_MODEL = (
    ("/models/{model}", "model", Depends(_model)),
    ("/models/{model}/versions/{version}", "model_version", Depends(_model_version)),
)


def _per_model_route(
    tail: str,
    name: str,
    summaries: tuple[str, str],
    endpoint_for: Callable[[Any], Callable[..., Awaitable[Any]]],
    **route: Any,
) -> None:
    """``/models/{model}<tail>`` and ``/models/{model}/versions/{version}<tail>``, named
    ``model_<name>`` and ``model_version_<name>`` (their operationIds): one endpoint, made by
    ``endpoint_for`` around each path's model dependency."""
    for (path, prefix, resolved), summary in zip(_PER_MODEL, summaries, strict=True):
        router.add_api_route(
            path + tail, endpoint_for(resolved), name=f"{prefix}_{name}", summary=summary, **route
        )


def _is_ready(request: Request) -> bool:
    # The probe is answered before the lifespan has made a runtime too: not ready then.
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    return runtime is not None and runtime.ready


def _not_ready() -> JSONResponse:
    body = ErrorResponse(error="server is not ready", code="not_ready")
    return JSONResponse(body.model_dump(exclude_none=True), status_code=503)


# The health answers' bodies, encoded once: probes call them often. KServe's REST client reads
# them; Triton's clients and Kubernetes read the status alone.
_LIVE = ServerLiveResponse(live=True).model_dump_json().encode()
_READY = ServerReadyResponse(ready=True).model_dump_json().encode()


# The endpoint of the server's readiness route. No docstring on it or on the model readiness
# endpoints below: FastAPI would print it as their description.
async def _readiness(request: Request) -> Response:
    if _is_ready(request):
        return Response(_READY, media_type="application/json")
    return _not_ready()


def _model_readiness(request: Request, op: Model) -> Response:
    runtime = runtime_of(request)
    if not runtime.ready:
        return _not_ready()
    # An unloaded model: 400, as Triton answers (tritonclient's is_model_ready is then False),
    # with the same words as an inference of it gets.
    runtime.plane.models.check_loaded(op.name)
    return Response(status_code=200)


def _model_ready(resolved: Any) -> Callable[..., Awaitable[Response]]:
    async def endpoint(request: Request, op: Model = resolved) -> Response:
        return _model_readiness(request, op)

    return endpoint


# --- server --------------------------------------------------------------------------------------


@router.get("", response_model=ServerMetadataResponse, summary="Server metadata")
async def server_metadata(runtime: RuntimeDep) -> ServerMetadataResponse:
    return model_info.server_metadata(runtime.plane.regions)


@router.get(
    "/health/live",
    response_class=Response,
    responses={200: {"model": ServerLiveResponse, "description": "Live"}},
    summary='Liveness: 200 with {"live": true} while the process serves',
)
async def server_live() -> Response:
    return Response(_LIVE, media_type="application/json")


router.add_api_route(
    "/health/ready",
    _readiness,
    methods=["GET"],
    name="server_ready",
    response_class=Response,
    responses={
        200: {"model": ServerReadyResponse, "description": "Ready"},
        **v2_openapi.errors(503),
    },
    summary='Readiness: 200 with {"ready": true} once the backend is up, 503 before that and '
    "while draining",
)


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
async def repository_index(request: Request, runtime: RuntimeDep) -> list[RepositoryIndexEntry]:
    body = await read_body(request, REPOSITORY_BODY_MAX_BYTES)
    query = RepositoryIndexRequest()
    if body.strip():
        document = parse_json(body, REPOSITORY_JSON_LIMITS, "request body")
        query = validate_document(RepositoryIndexRequest, document, "request body")
    listed = runtime.plane.repository_index(
        server_ready=runtime.ready, ready_only=bool(query.ready)
    )
    return [
        RepositoryIndexEntry(
            name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
        )
        for entry in listed
    ]


_DONE: dict[int | str, dict[str, Any]] = {200: {"description": "Done (empty body)"}}


def _unloaded_example(name: str) -> dict[str, Any]:
    """What the server answers for ``name`` unloaded: the example is its own words."""
    states = ModelStates()
    states.unload(name)
    try:
        states.check_loaded(name)
    except InvalidRequest as exc:
        return {"summary": "The model is unloaded", "value": exc.to_dict()}
    raise AssertionError("an unloaded model passed check_loaded")


_UNLOADED: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorResponse,
        "description": "The model is unloaded: not ready until `POST "
        "/v2/repository/models/{model}/load`",
        "content": {
            "application/json": {
                "examples": {"model_unloaded": _unloaded_example(OPERATORS[0].name)}
            }
        },
    }
}


# Loading with files brings a graph model (an ONNX file and its configuration, Triton's load
# parameters); loading without files and unloading change whether this server serves a model
# through v2 (model_lifecycle.py), which is what Triton clients see of a model's lifecycle.
_LIFECYCLE: dict[str, Any] = {
    "response_class": Response,
    # 400: loads and unloads refused where the model control mode is not explicit.
    "responses": {**_DONE, **v2_openapi.errors(400, 404, 503)},
}


@router.post(
    "/repository/models/{model}/load",
    name="repository_model_load",
    summary="Load a model: a built-in one again, or a graph model from its configuration and "
    "ONNX file (Triton's load parameters)",
    response_class=Response,
    responses={**_DONE, **v2_openapi.errors(400, 404, 413, 503)},
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": v2_openapi.request_schema(LoadRequest)}},
        }
    },
)
async def repository_model_load(
    model: ModelName, request: Request, runtime: RuntimeDep
) -> Response:
    model_lifecycle.check_explicit(runtime)  # before a byte of the body is read
    bound = load_bounds.max_load_bytes(runtime.settings.max_model_bytes)
    async with runtime.plane.call() as call:
        # Admitted as an inference is: for the body it declares before a byte is read (past the
        # load's bound, refused), then for the copies decoding makes, held until the answer.
        call.admit(_declared_load(request, bound))
        body = await _read_load(request, bound)
        call.hold(model_lifecycle.LOAD_COPIES * len(body), "model load", "body, copies", "body")
        # Counted, cut and decoded on a worker thread (load_body.py): never the event loop's.
        parts = await offload(len(body), JSON_INLINE_MAX_BYTES, read_load_body, body, runtime)
        del body  # the decoded file is what the load reads from here
        await model_lifecycle.load_model(runtime, model, parts.config, parts.files)
    return Response(status_code=200)


def _declared_load(request: Request, bound: int) -> int:
    """The Content-Length, refused past the load's bound (0: chunked, bounded while read)."""
    length = declared_length(request.headers.get("content-length"), sys.maxsize) or 0
    load_bounds.check_load_size(length, bound)
    return length


async def _read_load(request: Request, bound: int) -> bytearray:
    """The body, read under the load's bound: a chunked or compressed body past it is refused
    as a declared one is, naming the load's bound, not the body's."""
    try:
        return await read_body(request, bound)
    except PayloadTooLarge as exc:
        if exc.rule != "max_body_bytes":
            raise
        raise load_bounds.load_too_large(None, bound) from None


@router.post(
    "/repository/models/{model}/unload",
    name="repository_model_unload",
    summary="Unload a model: a graph model is removed (load it again with its file), a built-in "
    "one UNAVAILABLE, not ready, its inferences refused until it is loaded",
    **_LIFECYCLE,
)
async def repository_model_unload(model: ModelName, runtime: RuntimeDep) -> Response:
    model_lifecycle.unload_model(runtime, model)
    return Response(status_code=200)


# --- models --------------------------------------------------------------------------------------
_METADATA: dict[str, Any] = {
    "response_model": ModelMetadataResponse,
    "response_model_exclude_none": True,
    "responses": v2_openapi.errors(404),
}
# The readiness routes of a model and of a model version: 400 for a model unloaded, 503 while
# the server is not ready.
_MODEL_READY: dict[str, Any] = {
    "methods": ["GET"],
    "response_class": Response,
    "responses": {**v2_openapi.EMPTY_OK, **_UNLOADED, **v2_openapi.errors(404, 503)},
}


# --- statistics extension (before /models/{model}: "stats" is no model name) ---------------------
_STATS: dict[str, Any] = {
    "response_model": ModelStatisticsResponse,
    "responses": v2_openapi.errors(404, 503),
}


def _statistics(request: Request, runtime: Runtime, models: list[Model]) -> ModelStatisticsResponse:
    # With several workers, each counts its own: the others' published counts are added in.
    others = request.app.state.metrics.other_workers_statistics()
    return ModelStatisticsResponse.model_validate(runtime.plane.statistics.response(models, others))


@router.get(
    "/models/stats",
    **_STATS,
    summary="Inference statistics of every model (statistics extension)",
)
async def models_statistics(request: Request, runtime: RuntimeDep) -> ModelStatisticsResponse:
    return _statistics(request, runtime, [*OPERATORS, *runtime.plane.graphs.models()])


def _model_statistics(resolved: Any) -> Callable[..., Awaitable[Any]]:
    async def endpoint(
        request: Request, op: Model = resolved, *, runtime: RuntimeDep
    ) -> ModelStatisticsResponse:
        return _statistics(request, runtime, [op])

    return endpoint


_per_model_route(
    "/stats",
    "statistics",
    ("Inference statistics of one model", "Inference statistics of one model version"),
    _model_statistics,
    **_STATS,
)


def _from_tables(
    answer: Callable[[Model], BaseModel],
) -> Callable[[Any], Callable[..., Awaitable[Any]]]:
    """The endpoints of a route answered from the operator's tables alone (its response model
    is the route's ``response_model``)."""

    def endpoint_for(resolved: Any) -> Callable[..., Awaitable[Any]]:
        async def endpoint(op: Model = resolved) -> BaseModel:
            return answer(op)

        return endpoint

    return endpoint_for


_per_model_route(
    "",
    "metadata",
    (
        "Model metadata: input and output names, data types, ranks, parameters",
        "Model metadata of one version",
    ),
    _from_tables(model_info.model_metadata),
    **_METADATA,
)


# --- model configuration extension ---------------------------------------------------------------
_CONFIG: dict[str, Any] = {
    "response_model": ModelConfigResponse,
    "response_model_exclude_none": True,
    "responses": v2_openapi.errors(404),
}


_per_model_route(
    "/config",
    "config",
    ("Model configuration: Triton's ModelConfig as JSON", "Model configuration of one version"),
    _from_tables(model_info.model_config_response),
    **_CONFIG,
)
_per_model_route(
    "/ready",
    "ready",
    ("Model readiness", "Model readiness of one version"),
    _model_ready,
    **_MODEL_READY,
)
