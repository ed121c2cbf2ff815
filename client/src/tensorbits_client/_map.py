"""``map``: many independent calls pipelined over a bounded number of connections.

Items are taken from the iterable lazily, only as slots free up, so an input generator larger
than memory works; results come back in input order. The first failure cancels the calls in
flight and is raised as itself (not wrapped in an ExceptionGroup).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence, Sized
from typing import Any, Protocol, TypeVar

import numpy as np

from tensorbits_client._types import Inputs

T = TypeVar("T")
I = TypeVar("I")  # noqa: E741


class Progress(Protocol):
    def update(self, n: int = 1) -> object: ...
    def close(self) -> None: ...


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def open_progress(enabled: bool, total: int | None, description: str) -> Progress:
    """A tqdm bar when asked for (tqdm is the optional ``progress`` extra), else a no-op."""
    if not enabled:
        return _NoProgress()
    try:
        auto = importlib.import_module("tqdm.auto")  # untyped, and optional: imported by name
    except ImportError:
        # The client is installed from the repository, not from PyPI: name commands that work.
        raise ImportError(
            "progress=True needs tqdm: pip install tqdm (or install the client with its "
            "progress extra, from the repository: pip install ./protocol './client[progress]')"
        ) from None
    bar: Progress = auto.tqdm(total=total, desc=description, unit="call")
    return bar


def as_inputs(item: object) -> Inputs:
    """One call's inputs (an ``infer`` argument, a ``map`` item): an array alone is the single
    input of a unary operator, not a sequence of inputs (its rows)."""
    if isinstance(item, np.ndarray):
        return [item]
    if isinstance(item, Mapping):
        return item
    if isinstance(item, Sequence) and not isinstance(item, str | bytes):
        return item
    raise TypeError(f"inputs are an array, or a sequence or mapping of arrays, not {type(item)}")


async def pipeline(
    items: Iterable[I],
    call: Callable[[I], Awaitable[T]],
    *,
    concurrency: int,
    progress: Progress,
) -> list[T]:
    """``[await call(item) for item in items]`` with up to ``concurrency`` calls in flight."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    results: dict[int, T] = {}
    slots = asyncio.Semaphore(concurrency)

    async def one(index: int, item: I) -> None:
        try:
            results[index] = await call(item)
            progress.update(1)
        finally:
            slots.release()

    count = 0
    try:
        async with asyncio.TaskGroup() as group:
            for count, item in enumerate(items, start=1):
                await slots.acquire()  # backpressure: the next item is read only when a slot frees
                group.create_task(one(count - 1, item))
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [results[i] for i in range(count)]


def total_of(items: Iterable[Any]) -> int | None:
    return len(items) if isinstance(items, Sized) else None


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, even inside a running event loop
    (e.g. Jupyter), where it gets a loop of its own in a worker thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as executor:
        return executor.submit(asyncio.run, coroutine).result()
