"""Where CPU-bound work runs: inline on the event loop when small, on a worker thread when not.

Small work inline because the hop to a worker thread and back costs more than the work itself;
large work off the loop so one big tensor never stalls every other connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

from starlette.concurrency import run_in_threadpool

P = ParamSpec("P")
T = TypeVar("T")


async def offload(
    nbytes: int, limit: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``fn(*args, **kwargs)``, inline when ``nbytes`` is under ``limit``, else on a thread."""
    if nbytes < limit:
        return fn(*args, **kwargs)
    return await run_in_threadpool(fn, *args, **kwargs)
