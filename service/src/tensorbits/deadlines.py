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


async def within_read_deadline(awaitable: Awaitable[T], seconds: float | None, what: str) -> T:
    """``awaitable``'s result, if it comes within ``seconds`` (None: no deadline, for what has
    arrived whole already); else ``read_deadline_passed(what, seconds)``, raised."""
    if seconds is None:
        return await awaitable
    # asyncio's own timeout: no task per read (wait_for made one, a tenth of a small gRPC call)
    # and a third of anyio's fail_after per request; the server runs only on asyncio.
    deadline = asyncio.timeout(seconds)
    try:
        async with deadline:
            return await awaitable
    except TimeoutError:
        if not deadline.expired():
            raise  # raised by what was awaited, not by the deadline
        raise read_deadline_passed(what, seconds) from None


__all__ = ["FIELD", "RULE", "SETTING", "read_deadline_passed", "within_read_deadline"]
