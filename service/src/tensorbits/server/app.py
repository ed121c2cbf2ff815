"""The HTTP application: routers, middleware, error handlers. Served by ``tensorbits serve``,
it runs on the runtime its process started beside it (``assembly.side_by_side``, with the gRPC
endpoint and the metrics listener); in process (a test, ``uvicorn tensorbits.server.main:app``)
its lifespan starts the runtime and the metrics listener itself (``assembly.assembled``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline

from tensorbits import __version__, auth
from tensorbits.api import fastpath, openapi_doc, routers
from tensorbits.api.errors import register_exception_handlers
from tensorbits.api.head import HeadAsGetMiddleware
from tensorbits.api.metrics import router as metrics_router
from tensorbits.config.settings import Settings
from tensorbits.observability import METRICS_STATE, Metrics, ObservabilityMiddleware
from tensorbits.runtime import Drain
from tensorbits.server import assembly


def _operation_id(route: APIRoute) -> str:
    # Stable ids for the committed OpenAPI spec: the route function's name, nothing generated.
    return route.name


def create_app(
    settings: Settings | None = None,
    *,
    drain: Drain | None = None,
    runtime_by_process: bool = False,
) -> FastAPI:
    """The app for ``settings`` (None: from the environment). ``drain``: the server's, begun
    when it is told to stop; readiness turns false then (None: the app's own, never begun).
    ``runtime_by_process``: the process starts the runtime beside its listeners and sets
    ``app.state.runtime`` before the app serves (``assembly.side_by_side``); else the app's
    lifespan starts one, and closes it as the app stops."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        # The lifespan's state reaches uvicorn's protocols too: the HTTP layer counts and
        # logs the requests it refuses before the app in these metrics.
        if runtime_by_process:
            yield {METRICS_STATE: metrics}
            return
        async with assembly.assembled(settings, metrics, drain) as runtime:
            app.state.runtime = runtime
            yield {METRICS_STATE: metrics}

    app = FastAPIOffline(
        title="tensorbits",
        version=__version__,
        summary="Bitwise tensor operators of DirectML, OpenVINO and ONNX over HTTP.",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        # Our metrics are Prometheus (observability.py); FastAPI's OpenTelemetry hooks would
        # only re-read the environment on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    metrics = Metrics.create()
    app.state.metrics = metrics
    register_exception_handlers(app)
    for router in routers.ALL:
        app.include_router(router)
    app.include_router(metrics_router)
    # Added last is outermost: observability wraps HEAD-as-GET, the fast path, the framework.
    fastpath.install(app, routers.FAST_ROUTES)
    app.add_middleware(HeadAsGetMiddleware)
    # API keys (when configured): inside observability, so 401s are counted and logged, and
    # before everything else, so a refused request's body is never read.
    auth.install(app, settings)
    app.add_middleware(ObservabilityMiddleware, metrics=lambda: metrics)
    openapi_doc.install(app)
    return app
