"""The Open Inference Protocol (KServe v2 / Triton HTTP) endpoints, with Triton's binary tensor
data and model repository extensions: the stock ``tritonclient.http`` works unchanged.

Every operator is a model of the same name, at version ``"1"``. Inference itself, the hot path,
is a plain ASGI endpoint in ``v2_infer.py``; the FastAPI routes here declare no body parameter,
so FastAPI never parses (or copies) a body, and ``openapi_extra`` documents the request schema.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from tensorbits import __version__, inference
from tensorbits.api import v2_openapi
from tensorbits.api.body import read_body
from tensorbits.api.deps import runtime_of
from tensorbits.api.v2_infer import run_inference
from tensorbits.inference import resolve_model
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest
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


def _metadata(op: OperatorSpec) -> ModelMetadataResponse:
    input_type, output_type = inference.model_metadata_types(op)
    return ModelMetadataResponse(
        name=op.name,
        versions=list(inference.MODEL_VERSIONS),
        platform=PLATFORM,
        inputs=[MetadataTensor(name=n, datatype=input_type.value, shape=[-1]) for n in op.inputs],
        outputs=[MetadataTensor(name=op.output, datatype=output_type.value, shape=[-1])],
    )


class _Inference(Response):
    """What the FastAPI twins of the infer routes return: ``run_inference``, run when the
    response is sent (it sends its own). The app matches ``v2_infer.ROUTES`` first, so these
    twins mostly serve the OpenAPI schema; they stay correct for an app mounted without them."""

    def __init__(self, op: OperatorSpec, runtime: Runtime) -> None:
        super().__init__()
        self.op, self.runtime = op, runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await run_inference(self.op, self.runtime, scope, receive, send)


@router.post(
    "/models/{model}/infer",
    response_model=InferenceResponse,
    response_model_exclude_none=True,
    responses=v2_openapi.INFER_RESPONSES,
    openapi_extra=v2_openapi.INFER_OPENAPI,
    summary="Run the operator",
)
async def model_infer(model: ModelName, request: Request) -> Response:
    return _Inference(resolve_model(model, None), runtime_of(request))


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
    return _Inference(resolve_model(model, version), runtime_of(request))


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
    return _metadata(resolve_model(model, None))


@router.get(
    "/models/{model}/versions/{version}",
    response_model=ModelMetadataResponse,
    response_model_exclude_none=True,
    responses=v2_openapi.errors(404),
    summary="Model metadata of one version",
)
async def model_version_metadata(model: ModelName, version: ModelVersion) -> ModelMetadataResponse:
    return _metadata(resolve_model(model, version))


@router.get(
    "/models/{model}/ready",
    response_class=Response,
    responses={**v2_openapi.EMPTY_OK, **v2_openapi.errors(404, 503)},
    summary="Model readiness",
)
async def model_ready(model: ModelName, request: Request) -> Response:
    resolve_model(model, None)
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
    resolve_model(model, version)
    return Response(status_code=200) if _is_ready(request) else _not_ready()
