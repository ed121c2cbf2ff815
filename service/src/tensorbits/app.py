"""The application factory: routers, error handlers, and the backend chosen in ``lifespan``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline

from tensorbits import __version__, auth
from tensorbits.api import fastpath, metrics_endpoint, openapi_doc, routers
from tensorbits.api.errors import register_exception_handlers
from tensorbits.api.head import HeadAsGetMiddleware
from tensorbits.api.metrics import router as metrics_router
from tensorbits.config import Settings
from tensorbits.logs import banner
from tensorbits.observability import Metrics, ObservabilityMiddleware
from tensorbits.runtime import Drain, Runtime
from tensorbits_protocol.operators import OPERATORS

logger = logging.getLogger("tensorbits")


def _operation_id(route: APIRoute) -> str:
    # Stable ids for the committed OpenAPI spec: the route function's name, nothing generated.
    return route.name


def docs_url(settings: Settings) -> str:
    """Where a person finds the interactive docs of a server with ``settings``."""
    scheme = "https" if settings.tls_cert_file is not None else "http"
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"{scheme}://{host}:{settings.port}/docs"


def create_app(settings: Settings | None = None, *, drain: Drain | None = None) -> FastAPI:
    """The app for ``settings`` (None: from the environment). ``drain``: the server's, begun
    when it is told to stop; readiness turns false then (None: the app's own, never begun)."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime.start(settings, drain)
        app.state.runtime = runtime
        metrics.bind_runtime(runtime)
        backend = runtime.selection.backend
        message, fields = banner(
            __version__,
            f"{backend.name} on {backend.device}",
            runtime.selection.reason,
            docs_url(settings),
            len(OPERATORS),
        )
        logger.info(message, extra=fields)
        grpc_stopped: asyncio.Task[None] | None = None
        metrics_listener = None
        try:
            if settings.metrics_port:
                metrics_listener = await metrics_endpoint.start(settings, metrics, runtime)
            if settings.grpc_port:
                from tensorbits.grpc import server as grpc_endpoint  # grpcio only when it serves

                grpc_server = await grpc_endpoint.start(runtime, metrics)
                grace = settings.timeout_graceful_shutdown

                def stop_grpc() -> None:
                    # As the HTTP listener closes (the drain's delay over): gRPC refuses new
                    # calls from then on too, and its calls in flight finish alongside HTTP's.
                    nonlocal grpc_stopped
                    if grpc_stopped is None:
                        grpc_stopped = asyncio.ensure_future(grpc_endpoint.stop(grpc_server, grace))

                runtime.drain.on_stop_accepting(stop_grpc)
            yield
        finally:
            # A stop without the drain (an app in a test, a failed start-up): gRPC's stop now.
            runtime.drain.stop_accepting()
            if grpc_stopped is not None:
                await grpc_stopped
            if metrics_listener is not None:
                # Last: a scrape during the drain still sees the server's final figures.
                await metrics_endpoint.stop(metrics_listener)
            runtime.close()

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
    app.state.settings = settings
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
