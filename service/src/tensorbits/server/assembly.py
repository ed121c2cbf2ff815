"""The server assembled, in one place: its runtime and every listener beside the HTTP app.

``assembled`` is the HTTP app's lifespan (``app.py``): it starts the runtime (the backend the
settings select, the data plane every front end runs its requests through), then, side by
side, the gRPC endpoint and the metrics listener when their ports are set. On the way out it
stops them in the order a drain needs: gRPC refuses new calls as the HTTP listener closes (the
drain's ``stop_accepting``), its calls in flight finish alongside HTTP's, and the metrics
listener goes last, so a scrape during the drain still sees the final figures. uvicorn serves
the HTTP app (``serving.py``), one process or several workers (``workers.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tensorbits import __version__
from tensorbits.api import metrics_endpoint
from tensorbits.config.settings import Settings
from tensorbits.logs import banner
from tensorbits.observability import Metrics
from tensorbits.runtime import Drain, Runtime
from tensorbits_protocol.operators import OPERATORS

logger = logging.getLogger("tensorbits")


def docs_url(settings: Settings) -> str:
    """Where a person finds the interactive docs of a server with ``settings``."""
    scheme = "https" if settings.tls_cert_file is not None else "http"
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"{scheme}://{host}:{settings.port}/docs"


def features_on(settings: Settings) -> dict[str, bool]:
    """Which optional features ``settings`` switch on, as the start-up line reports them."""
    return {
        "api_keys": bool(settings.accepted_api_keys),
        "tls": settings.tls_cert_file is not None,
        "shared_memory": settings.shared_memory,
        "model_repository": settings.model_repository is not None,
    }


@asynccontextmanager
async def assembled(
    settings: Settings, metrics: Metrics, drain: Drain | None = None
) -> AsyncIterator[Runtime]:
    """The runtime of ``settings``, with the gRPC endpoint and the metrics listener beside it
    while the block runs. ``drain``: the server's, begun when it is told to stop (None: the
    runtime's own, never begun)."""
    runtime = Runtime.start(settings, drain, metrics.workers_folder)
    metrics.bind_runtime(runtime)
    backend = runtime.selection.backend
    message, fields = banner(
        __version__,
        f"{backend.name} on {backend.device}",
        runtime.selection.reason,
        docs_url(settings),
        len(OPERATORS),
        graph_models=[model.name for model in runtime.plane.graphs.models()],
        features=features_on(settings),
        workers=settings.workers,
        ports={"http": settings.port, "grpc": settings.grpc_port, "metrics": settings.metrics_port},
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
                # As the HTTP listener closes (the drain's delay over): gRPC refuses new calls
                # from then on too, and its calls in flight finish alongside HTTP's.
                nonlocal grpc_stopped
                if grpc_stopped is None:
                    grpc_stopped = asyncio.ensure_future(grpc_endpoint.stop(grpc_server, grace))

            runtime.drain.on_stop_accepting(stop_grpc)
        yield runtime
    finally:
        # A stop without the drain (an app in a test, a failed start-up): gRPC's stop now.
        runtime.drain.stop_accepting()
        if grpc_stopped is not None:
            await grpc_stopped
        if metrics_listener is not None:
            # Last: a scrape during the drain still sees the server's final figures.
            await metrics_endpoint.stop(metrics_listener)
        runtime.close()


__all__ = ["assembled", "docs_url"]
