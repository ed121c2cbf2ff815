"""The read deadline, on every protocol: a request's body must arrive within
TENSORBITS_TIMEOUT_BODY_READ, or the request is refused with a ``RequestTimeout`` (HTTP 408, gRPC
DEADLINE_EXCEEDED through the one status table).

An HTTP body (``api/body.py``), a unary gRPC call's one message (``grpc/service.py``) and the
next message of an idle ModelStreamInfer stream (``grpc/streams.py``) are each the request's
body on their protocol, so each is read under this one deadline and refused in these one words,
field and rule: a client trickling bytes, or opening a call and sending nothing, holds its slot
and its admission no longer on one protocol than on the other. Each front end only names what it
waits for (``what``: "the request body", "the ServerLive request message").

No web framework or gRPC library is imported here.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable
from typing import TypeVar

from tensorbits_protocol.errors import RequestTimeout

T = TypeVar("T")

SETTING = "TENSORBITS_TIMEOUT_BODY_READ"
# What the refusal names, whatever the protocol: the request's body (on gRPC, its message).
FIELD = "body"
RULE = "body_read_timeout"


def read_deadline_passed(what: str, seconds: float) -> RequestTimeout:
    """The refusal of a request whose ``what`` did not arrive within ``seconds``."""
    return RequestTimeout(
        f"{what} did not arrive within {seconds:g} s ({SETTING})", field=FIELD, rule=RULE
    )


class _Entry:
    """One read under a deadline: its task, the task's cancel requests when the read began (a
    cancel of the task's own stays the task's), and whether the deadline passed first."""

    __slots__ = ("cancelling", "expired", "task")

    def __init__(self, task: asyncio.Task[object]) -> None:
        self.task = task
        self.cancelling = task.cancelling()
        self.expired = False


class _Watch:
    """Every read of one event loop under a deadline of the same ``seconds``, by their entries
    in the order they began, which is the order their deadlines pass: one timer, armed for the
    earliest, stands for all of them. ``asyncio.timeout`` arms and cancels a timer per read
    (4.3 us of a small gRPC call, measured; this costs about 1): a read that ends takes its
    entry out, and the timer, when it fires, cancels the reads past their deadline and is armed
    again for the earliest left. Each read is cut off at its own deadline, as with a timer of
    its own, and its task's cancel is undone as ``asyncio.timeout`` undoes it."""

    __slots__ = ("armed", "entries", "seconds")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.entries: dict[_Entry, float] = {}  # each read's deadline, earliest first
        self.armed = False

    def enter(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[object]) -> _Entry:
        entry = _Entry(task)
        deadline = loop.time() + self.seconds
        self.entries[entry] = deadline
        if not self.armed:
            self.armed = True
            loop.call_at(deadline, self._expire, loop, deadline)
        return entry

    def leave(self, entry: _Entry) -> bool:
        """Take ``entry`` out; whether its deadline passed (its task was cancelled for it)."""
        if entry.expired:
            return True
        del self.entries[entry]
        return False

    def _expire(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        """The timer armed for ``when``: cut off every read whose deadline is past (the loop
        may run a timer a clock tick early: ``when`` itself counts as past)."""
        now = max(loop.time(), when)
        entries = self.entries
        past: list[_Entry] = []
        for entry, deadline in entries.items():
            if deadline > now:
                loop.call_at(deadline, self._expire, loop, deadline)
                break
            past.append(entry)
        else:
            self.armed = False
        for entry in past:
            del entries[entry]
            entry.expired = True
            entry.task.cancel()


# Each loop's watches, by seconds; the last loop's at hand (a server runs on one).
_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[float, _Watch]] = (
    weakref.WeakKeyDictionary()
)
_last: tuple[asyncio.AbstractEventLoop | None, dict[float, _Watch]] = (None, {})


def _watch(loop: asyncio.AbstractEventLoop, seconds: float) -> _Watch:
    global _last
    last_loop, watches = _last
    if last_loop is not loop:
        watches = _watches.setdefault(loop, {})
        _last = (loop, watches)
    watch = watches.get(seconds)
    if watch is None:
        watch = watches[seconds] = _Watch(seconds)
    return watch


async def within_read_deadline(awaitable: Awaitable[T], seconds: float | None, what: str) -> T:
    """``awaitable``'s result, if it comes within ``seconds`` (None: no deadline, for what has
    arrived whole already); else ``read_deadline_passed(what, seconds)``, raised."""
    if seconds is None:
        return await awaitable
    loop = asyncio.get_running_loop()
    task = asyncio.current_task(loop)
    if task is None:
        raise RuntimeError("a read deadline is kept only inside a task")
    watch = _watch(loop, seconds)
    entry = watch.enter(loop, task)
    try:
        result = await awaitable
    except BaseException as exc:
        # Left, the deadline's cancel undone; a CancelledError that is its alone is the refusal.
        if (
            watch.leave(entry)
            and task.uncancel() <= entry.cancelling
            and isinstance(exc, asyncio.CancelledError)
        ):
            raise read_deadline_passed(what, seconds) from None
        raise
    if watch.leave(entry):
        task.uncancel()  # passed as it arrived: the deadline's cancel is not the task's
    return result


__all__ = ["FIELD", "RULE", "SETTING", "read_deadline_passed", "within_read_deadline"]
