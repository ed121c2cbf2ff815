"""Dependency aliases, so route signatures read as intent."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.applications import Starlette

from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import BackendFailure


def runtime_of(request: Request) -> Runtime:
    """The app's runtime; 503 before the lifespan has built the backend."""
    return runtime_of_app(request.app)


def runtime_of_app(app: Starlette) -> Runtime:
    """``runtime_of`` for an ASGI endpoint, which has the app (``scope["app"]``) but no request."""
    runtime: Runtime | None = getattr(app.state, "runtime", None)
    if runtime is None or not runtime.started:
        raise BackendFailure("server is not ready: the backend is not initialised")
    return runtime


async def get_runtime(request: Request) -> Runtime:
    # async on purpose: FastAPI runs a plain-def dependency on a worker thread, per request.
    return runtime_of(request)


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
