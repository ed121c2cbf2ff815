"""uvicorn's httptools protocol with a deadline on every request head (slow-loris defence).

uvicorn times out idle keep-alive connections, but not a client that sends its request line and
headers a byte at a time: that connection never reaches the application, so nothing above this
layer can time it out. Here each request's head (from its first byte, or from the connection's
start) must be complete within ``TENSORBITS_TIMEOUT_HEADER_READ`` seconds, or the connection is
closed. The body has its own deadline in ``api/body.py``.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from tensorbits.config import get_settings

logger = logging.getLogger("tensorbits.http")


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """The deadline is lazy: a request head records when it began and one timer per connection
    checks it, re-armed only when it fires. Arming and cancelling a timer for every request would
    cost a few microseconds each on the small-request path; this costs a clock read."""

    _head_started: float | None = None  # loop time the pending request head began; None: none
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_begins()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_begins()  # a new request has begun: its head must now arrive in time

    def on_headers_complete(self) -> None:
        self._head_started = None
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_started = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_begins(self) -> None:
        self._head_started = self.loop.time()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._timeout(), self._check)

    @staticmethod
    def _timeout() -> float:
        return get_settings().timeout_header_read  # cached: read from the environment once

    def _check(self) -> None:
        self._head_timer = None
        if self._head_started is None:
            return  # no head pending: the next one arms the timer again
        remaining = self._head_started + self._timeout() - self.loop.time()
        if remaining > 0:
            # The head pending now began after the one the timer was armed for.
            self._head_timer = self.loop.call_later(remaining, self._check)
            return
        logger.info("closing a connection whose request head did not arrive in time")
        self.transport.close()
