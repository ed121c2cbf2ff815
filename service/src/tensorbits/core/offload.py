"""Where CPU-bound work runs: inline on the event loop when small, on a worker thread when not.

Small work inline because the hop to a worker thread and back costs more than the work itself;
large work off the loop so one big tensor never stalls every other connection. Both front ends
use it through the data plane (core/dataplane.py), with the same limits for every request.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import anyio.to_thread

P = ParamSpec("P")
T = TypeVar("T")

# v2 inference below these sizes runs on the event loop: a hop to a worker thread costs more than
# it. JSON is slow to parse per byte (about 20 ms per MiB), binary tensors fast (about 0.1 ms per
# MiB). The same for an HTTP request and a gRPC one: the same planner and executor run both.
JSON_INLINE_MAX_BYTES = 64 << 10
COMPUTE_INLINE_MAX_BYTES = 1 << 20


async def offload(
    nbytes: int, limit: int, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """``fn(*args, **kwargs)``, inline when ``nbytes`` is under ``limit``, else on a thread."""
    if nbytes < limit:
        return fn(*args, **kwargs)
    # anyio's worker threads, the ones Starlette runs its own blocking work on: one thread
    # limit for the whole server, whichever front end the work came from.
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
