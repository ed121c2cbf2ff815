"""The read deadline's one timer per loop and length (``deadlines._Watch``) keeps each read's own
deadline, as a timer per read (``asyncio.timeout``) did: many reads in flight, begun at different
times, are each cut off at their own deadline and not before; a read that arrives in time leaves
nothing behind; a cancel of the task's own stays a cancel; on uvloop (the server's loop) too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from tensorbits import deadlines
from tensorbits_protocol.errors import RequestTimeout

TICK = 0.002  # the loops' timer resolution (uvloop: 1 ms), with room for float rounding
LOOPS: list[Callable[[], asyncio.AbstractEventLoop]] = [
    asyncio.new_event_loop,
    uvloop.new_event_loop,
]


def _run(
    new_loop: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, None]
) -> None:
    loop = new_loop()
    try:
        loop.run_until_complete(main)
    finally:
        loop.close()


def _entries(seconds: float) -> int:
    return len(deadlines._watch(asyncio.get_running_loop(), seconds).entries)


@pytest.mark.parametrize("new_loop", LOOPS)
def test_each_read_is_cut_off_at_its_own_deadline(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        cut: dict[int, float] = {}

        async def read(index: int) -> None:
            begun = loop.time()
            never: asyncio.Future[bytes] = loop.create_future()  # its own: a cancel cancels it
            with pytest.raises(RequestTimeout) as caught:
                await deadlines.within_read_deadline(never, 0.2, f"message {index}")
            cut[index] = loop.time() - begun
            assert caught.value.message.startswith(f"message {index} did not arrive within 0.2 s")

        reads = []
        for index in range(4):  # begun 0.05 s apart: four deadlines, one timer
            reads.append(asyncio.ensure_future(read(index)))
            await asyncio.sleep(0.05)
        await asyncio.gather(*reads)
        # Not before the deadline but for the loop's clock tick (uvloop's timers count whole
        # milliseconds: a read was seen cut at 0.19999999999709 s), nor long after it.
        assert all(0.2 - TICK <= seconds < 0.35 for seconds in cut.values()), cut
        assert _entries(0.2) == 0

    _run(new_loop, main())


@pytest.mark.parametrize("new_loop", LOOPS)
def test_reads_in_time_pass_and_leave_nothing(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        async def arrives(delay: float) -> bytes:
            await asyncio.sleep(delay)
            return b"message"

        for _ in range(3):
            assert await deadlines.within_read_deadline(arrives(0), 0.1, "m") == b"message"
        assert _entries(0.1) == 0
        # One slow read beside fast ones: each read keeps its own deadline.
        slow = asyncio.ensure_future(deadlines.within_read_deadline(arrives(5), 0.1, "slow"))
        fast = [deadlines.within_read_deadline(arrives(0.02), 0.1, "fast") for _ in range(5)]
        assert await asyncio.gather(*fast) == [b"message"] * 5
        with pytest.raises(RequestTimeout):
            await slow
        assert _entries(0.1) == 0
        # After the timer went quiet, a new read arms it again.
        await asyncio.sleep(0.15)
        with pytest.raises(RequestTimeout):
            await deadlines.within_read_deadline(arrives(5), 0.05, "again")
        assert not deadlines._watch(asyncio.get_running_loop(), 0.05).armed

    _run(new_loop, main())


@pytest.mark.parametrize("new_loop", LOOPS)
def test_a_cancel_of_the_tasks_own_stays_a_cancel(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        never: asyncio.Future[bytes] = loop.create_future()
        task = asyncio.ensure_future(deadlines.within_read_deadline(never, 5.0, "m"))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _entries(5.0) == 0

        # A deadline passing while the task was cancelled already: the task's cancel wins.
        async def held() -> None:
            current = asyncio.current_task()
            assert current is not None
            current.cancel()  # a cancel pending before the read begins
            await deadlines.within_read_deadline(asyncio.sleep(1), 0.01, "m")

        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(held())

        # A read that swallows the deadline's cancel and answers: its answer, the task uncancelled.
        async def stubborn() -> bytes:
            try:
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                return b"late"
            return b"never"

        async def reader() -> int:
            assert await deadlines.within_read_deadline(stubborn(), 0.01, "m") == b"late"
            current = asyncio.current_task()
            assert current is not None
            return current.cancelling()

        assert await asyncio.ensure_future(reader()) == 0

    _run(new_loop, main())
