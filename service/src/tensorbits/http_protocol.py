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
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a new request has begun: its head must now arrive in time

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        timeout = get_settings().timeout_header_read  # cached: read from the environment once
        self._head_deadline = self.loop.call_later(timeout, self._expire)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _expire(self) -> None:
        self._head_deadline = None
        logger.info("closing a connection whose request head did not arrive in time")
        self.transport.close()
