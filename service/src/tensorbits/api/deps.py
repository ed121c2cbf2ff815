"""Dependency aliases, so route signatures read as intent."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import BackendFailure


def get_runtime(request: Request) -> Runtime:
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    if runtime is None or not runtime.started:
        raise BackendFailure("server is not ready: the backend is not initialised")
    return runtime


RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
