"""Device work launched inline on the event loop, awaited by a CUDA stream's callback instead of
a blocking synchronize.

A run wholly in CUDA regions touches no host byte, so the data plane runs it inline on the event
loop (``Plan.work_bytes`` 0, dataplane.py): the hop to a worker thread would cost more than the
launch. Its kernels must still finish before the answer goes out and before the client's
regions are let go, and a ``stream.synchronize()`` there would stop every connection of the
loop for the kernels' whole time. So the data plane runs such an encode inside ``run_woken``:

- where a run would synchronize it calls ``finish(backend)``: on a backend that can call back
  (``when_done``: the CuPy backend's stream callback, fired from the driver's thread once the
  calling thread's stream has run everything issued so far) it asks for that callback, which
  hands the outcome to the loop with ``call_soon_threadsafe``; elsewhere (a host backend, a
  worker thread, no loop) it synchronizes, as before;
- a region held for the run (``hold``) stays held until every callback asked for has fired;
- ``run_woken`` then awaits the callbacks, the loop serving other requests meanwhile, releases
  the holds, and returns the answer, or raises the error a callback reported (the request's
  error). The admission grant is released when the call's block ends, after that.

A request cancelled while it waits keeps its holds until the callbacks fire (the device may
still be writing the client's memory); only the waiting stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from contextvars import ContextVar
from typing import Any, TypeVar

from tensorbits.core.offload import offload

PlanT = TypeVar("PlanT")
AnswerT = TypeVar("AnswerT")
T = TypeVar("T")

# Called once, from any thread, when the device work is done: None, or the error it met.
Done = Callable[[BaseException | None], None]


class Waits:
    """What one inline run waits for: a future per ``finish``, and the holds it keeps (made on
    first use: most inline runs launch nothing, and this is on every small request's path)."""

    __slots__ = ("_holds", "futures")

    def __init__(self) -> None:
        self.futures: list[asyncio.Future[None]] = []
        self._holds: ExitStack | None = None

    @property
    def holds(self) -> ExitStack:
        if self._holds is None:
            self._holds = ExitStack()
        return self._holds

    def release(self) -> None:
        """Let go of every hold (once what they were held for is done)."""
        if self._holds is not None:
            self._holds.close()

    def done_callback(self) -> Done:
        """A callback for the backend: resolves a new future of this run, on the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self.futures.append(future)

        def settle(error: BaseException | None) -> None:
            if future.done():  # cancelled with the loop's shutdown
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        def done(error: BaseException | None) -> None:
            loop.call_soon_threadsafe(settle, error)

        return done

    async def settled(self) -> None:
        """Wait for every callback, then release the holds; the first error a callback
        reported is raised."""
        every = asyncio.gather(*self.futures, return_exceptions=True)
        try:
            outcomes = await asyncio.shield(every)
        except asyncio.CancelledError:
            every.add_done_callback(lambda _: self.release())
            raise
        self.release()
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome


_waits: ContextVar[Waits | None] = ContextVar("tensorbits_device_waits", default=None)


def finish(backend: Any) -> None:
    """Device work the calling thread launched is to be finished: awaited by ``run_woken``
    where it runs this thread's encode and the backend can call back, else waited for now
    (``backend.synchronize()``)."""
    waits = _waits.get()
    when_done = getattr(backend, "when_done", None)
    if waits is None or when_done is None:
        backend.synchronize()
        return
    when_done(waits.done_callback())


def hold(context: AbstractContextManager[T], stack: ExitStack) -> T:
    """Enter ``context`` (a region's hold) until ``stack`` closes, or, inside ``run_woken``,
    until the device work it awaits is done, whichever is later."""
    waits = _waits.get()
    return (waits.holds if waits is not None else stack).enter_context(context)


async def run_woken(
    nbytes: int, limit: int, encode: Callable[[PlanT], AnswerT], plan: PlanT
) -> AnswerT:
    """``encode(plan)``: on a worker thread from ``limit`` bytes (``offload``); inline below
    it, its device work awaited (``finish``) and its holds released only once that is done."""
    if nbytes >= limit:
        return await offload(nbytes, limit, encode, plan)
    waits = Waits()
    token = _waits.set(waits)
    try:
        answer = encode(plan)
    except BaseException:
        _waits.reset(token)
        if waits.futures:
            # Launched work may still use what is held: wait for it; the encode's error is the
            # request's.
            with contextlib.suppress(Exception):
                await waits.settled()
        waits.release()
        raise
    _waits.reset(token)
    if waits.futures:
        await waits.settled()  # the loop serves others meanwhile
    else:
        waits.release()
    return answer


__all__ = ["Done", "Waits", "finish", "hold", "run_woken"]
