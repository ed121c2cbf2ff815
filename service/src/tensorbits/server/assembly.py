"""The server assembled, in one place: its runtime and every listener beside it.

``side_by_side`` owns one server process's lifetime (``serving.serve``, for ``tensorbits serve``
and each of its ``--workers``): it starts the runtime (the backend the settings select, the
data plane every front end runs its requests through) with the metrics listener
(``assembled``), then the gRPC endpoint (``grpc_beside``) and the HTTP server (uvicorn, the app
of ``app.py``) as siblings on that runtime. One drain stops both: gRPC refuses new calls as the
HTTP listener closes (the drain's ``stop_accepting``), its calls in flight finish alongside
HTTP's, and the metrics listener goes last, so a scrape during the drain still sees the final
figures. One failing to start stops the other (``StartFailure``, which says which and why).

An app in process (a test's, ``uvicorn tensorbits.server.main:app``) has no such owner: its
lifespan starts the runtime itself (``assembled``), and a test that wants gRPC beside it starts
``grpc_beside`` on that runtime.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING

from tensorbits import __version__
from tensorbits.api import metrics_endpoint
from tensorbits.config.settings import Settings
from tensorbits.logs import banner
from tensorbits.observability import Metrics
from tensorbits.runtime import Drain, Runtime
from tensorbits_protocol.operators import OPERATORS

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

logger = logging.getLogger("tensorbits")


class StartFailure(Exception):
    """A listener of the process could not start; those started beside it were stopped. The
    message says which listener and why (or where the error was logged)."""


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
    """The runtime of ``settings``, with the metrics listener beside it while the block runs.
    ``drain``: the server's, begun when it is told to stop (None: the runtime's own, never
    begun)."""
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
    metrics_listener = None
    try:
        if settings.metrics_port:
            metrics_listener = await metrics_endpoint.start(settings, metrics, runtime)
        yield runtime
    finally:
        if metrics_listener is not None:
            # Last: a scrape during the drain still sees the server's final figures.
            await metrics_endpoint.stop(metrics_listener)
        runtime.close()


class _GrpcStop:
    """The gRPC endpoint's stop, begun once: when the drain stops accepting (the HTTP listener
    closes then too) or, failing that, when the block beside it ends."""

    def __init__(self, stop_endpoint: Callable[[], Awaitable[None]]) -> None:
        self.stop_endpoint = stop_endpoint
        self.stopped: asyncio.Future[None] | None = None

    def begin(self) -> None:
        if self.stopped is None:
            self.stopped = asyncio.ensure_future(self.stop_endpoint())

    async def finished(self) -> None:
        self.begin()
        assert self.stopped is not None
        await self.stopped


@asynccontextmanager
async def grpc_beside(runtime: Runtime, metrics: Metrics) -> AsyncIterator[None]:
    """The gRPC endpoint on ``runtime`` while the block runs, when ``TENSORBITS_GRPC_PORT`` is
    set (nothing when it is 0); its calls counted in ``metrics``. It refuses new calls as the
    runtime's drain stops accepting, and its calls in flight finish within the graceful timeout
    alongside HTTP's; the block's end waits for that (or begins it: a stop without the drain).
    ``StartFailure`` when it cannot start."""
    settings = runtime.settings
    if not settings.grpc_port:
        yield
        return
    from tensorbits.grpc import server as grpc_endpoint  # grpcio only when it serves

    try:
        grpc_server = await grpc_endpoint.start(runtime, metrics)
    except Exception as exc:
        raise StartFailure(
            f"the gRPC endpoint could not start on port {settings.grpc_port}: {exc}"
        ) from exc
    stop = _GrpcStop(lambda: grpc_endpoint.stop(grpc_server, settings.timeout_graceful_shutdown))
    runtime.drain.on_stop_accepting(stop.begin)
    try:
        yield
    finally:
        runtime.drain.stop_accepting()
        await stop.finished()


async def side_by_side(
    http: uvicorn.Server,
    app: FastAPI,
    settings: Settings,
    drain: Drain,
    sockets: list[socket.socket] | None = None,
) -> None:
    """One server process from start to stop: the runtime with the metrics listener, then the
    gRPC endpoint and ``http`` (uvicorn serving ``app``, built with ``runtime_by_process``, on
    ``sockets`` or its configured port) beside each other on it, until ``drain`` stops them.
    ``StartFailure`` when one cannot start: whatever had started is stopped first."""
    metrics: Metrics = app.state.metrics
    async with AsyncExitStack() as started:
        try:
            runtime = await started.enter_async_context(assembled(settings, metrics, drain))
        except Exception as exc:
            logger.exception("the server could not start")
            raise StartFailure(f"the server could not start: {exc}") from exc
        app.state.runtime = runtime  # the app's, as its lifespan would have set it
        await started.enter_async_context(grpc_beside(runtime, metrics))
        try:
            await http.serve(sockets)
        except SystemExit:
            if http.started:
                raise
            # uvicorn exits when its listener or the app's lifespan fails to start (logged).
            where = f"the HTTP server could not start on port {settings.port} (the error above)"
            beside = "; the gRPC endpoint is stopped with it" if settings.grpc_port else ""
            raise StartFailure(where + beside) from None


__all__ = ["StartFailure", "assembled", "docs_url", "grpc_beside", "side_by_side"]
