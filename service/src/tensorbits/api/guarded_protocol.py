"""uvicorn's httptools protocol, hardened where a request never reaches the application.

These things happen below the ASGI app, where nothing above this layer can see them:

- **The request head is bounded in time and in bytes.** Each request's line and headers must be
  complete within ``header_timeout`` seconds (``TENSORBITS_TIMEOUT_HEADER_READ``; slow loris) and
  within ``max_head_bytes`` bytes (``TENSORBITS_MAX_HEAD_BYTES``; 431, or 414 when the target
  alone is too long). The byte
  count is kept per chunk read, so a head is refused as soon as it passes the limit: it is never
  accumulated (httptools and uvicorn join its pieces with ``bytes +=``, quadratic in its size).
- **The parser's refusals are JSON.** A malformed request line, an unknown method, a bad chunk
  size, conflicting or duplicate framing headers: httptools refuses them, and uvicorn answers
  ``text/plain``. Here the answer is the same JSON error body every other 4xx carries
  (``{"error", "code", "field", "rule"}``), with ``Connection: close``.
- **A body read whole is marked.** Once a request's body is complete, its scope has
  ``BODY_RECEIVED`` set: the app reads it without arming the body deadline, which could not
  fire there (nothing left to wait for) and costs a small request more than anything it guards.
- **A body is read straight into the app's buffer.** The app admits a request, allocates the
  buffer for its declared body and hands it over (``BODY_INTO`` in the scope:
  ``OneWriteCycle.receive_into``). What uvicorn queued is copied in; the rest is read by the
  transport into the buffer itself (``get_buffer``), around httptools, whose parser is then
  replaced by a fresh one for the next request; the app is woken once, when the body is
  complete, the client is gone or the request is refused. No read is paused every 64 KiB and
  no chunk is copied on its way (uvicorn's path: the app woken per chunk, each copied three
  times). uvloop reads into a protocol's buffers only when it is no ``asyncio.Protocol``, so
  the transport is handed a stand-in (``_Buffered``) once connected; outside such a body it
  reads into one buffer per thread, parsed at once. A body the app stops waiting for (its
  deadline passed) is framed here to its declared end, as the parser would have framed it,
  and skipped or lingered over as any body answered before it was read; on a connection that
  closes after it, or framed otherwise than by its Content-Length, the parser reads it on.
- **Refusals are answered in order.** A valid request followed on the same connection by a
  malformed one gets its response first; the refusal is written after it, then the connection
  is closed (uvicorn writes the 400 at once and closes, losing the earlier response).
- **A connection closed after a response lingers.** Closing a socket with bytes unread makes
  Linux send RST, and a client still sending (a body refused before it was read: a 413 for its
  declared length, a 503 from admission, a 401) gets a reset instead of the answer; clients
  that send a whole body before reading (``http.client``, ``requests``, ``tritonclient.http``)
  then never see it. So the server shuts its sending side (the client reads the response, then
  EOF), reads and discards what still comes (counted, never kept), then closes once the client
  has sent the rest of its declared body or closed, or once a bound ends it: nginx's lingering
  close (``linger_bounds``).
- **A body answered before it was read is skipped, under the same bounds.** A response sent
  before its request's body was read whole keeps the connection when the declared length is
  within ``TENSORBITS_MAX_BODY_BYTES`` (the rest is parsed past and dropped, as uvicorn drops
  it); otherwise it says ``Connection: close`` and lingers. A client that goes idle mid-body or
  trickles is closed at the idle or the total bound either way, as it would be were its body
  read: a refused request costs at most a legal request's reading, however much is sent.

The bounds are the protocol's constructor arguments: ``serve`` hands uvicorn
``guarded_protocol(settings)``, a picklable ``functools.partial`` it calls as it calls a protocol
class (worker processes get it with the rest of uvicorn's config), so the settings reach each
connection from the server that read them.

The body has its own deadline and limits in ``api/body.py``. This subclass relies on httptools'
callbacks (``on_message_begin``, ``on_url``, ``on_header``, ``on_headers_complete``,
``on_body``) and on uvicorn's ``pipeline``/``cycle`` attributes; the live tests in
``tests/live/test_http_layer.py`` and ``tests/live/test_body_in_place.py`` fail if an upgrade
changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, cast

import httptools
from starlette.types import Scope
from uvicorn._types import ASGI3Application, ASGISendEvent
from uvicorn.config import Config
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT, service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string
from uvicorn.server import ServerState

from tensorbits.config.settings import Settings
from tensorbits.logs import bounded
from tensorbits.observability import (
    BODY_INTO,
    METRICS_STATE,
    NO_ROUTE,
    record_http_layer_refusal,
    route_label,
)
from tensorbits_protocol.errors import (
    HeadTooLarge,
    InvalidRequest,
    RequestTimeout,
    TensorbitsError,
    UriTooLong,
)

logger = logging.getLogger("tensorbits.http")

# The part of the request an httptools refusal is about, from the words of llhttp's reason (its
# reasons are fixed strings, never bytes of the request). First match wins; "request" otherwise.
PARSER_ERROR_FIELDS: tuple[tuple[str, str], ...] = (
    ("method", "method"),
    ("url", "url"),
    ("version", "version"),
    ("http/", "version"),
    ("dot", "version"),  # "Expected dot": HTTP/11
    ("transfer-encoding", "Transfer-Encoding"),
    ("content-length", "Content-Length"),
    ("chunk", "body"),
    ("header", "headers"),
    ("connection", "Connection"),
)


def parser_error(reason: str) -> InvalidRequest:
    """The JSON error for a request httptools refused with ``reason``."""
    lowered = reason.lower()
    field = next((f for word, f in PARSER_ERROR_FIELDS if word in lowered), "request")
    return InvalidRequest(
        f"malformed HTTP request: {reason[:200]}", field=field, rule="http_syntax"
    )


# The most characters of a refused request's target its access-log line carries.
MAX_LOGGED_TARGET = 200


def head_read_timeout(seconds: float) -> RequestTimeout:
    """A request whose head began and did not end within ``seconds``: closed unanswered (the
    client is gone or stalling), logged and counted as 408, as nginx logs it."""
    return RequestTimeout(
        f"request head did not arrive within {seconds:g} s (TENSORBITS_TIMEOUT_HEADER_READ)",
        field="headers",
        rule="header_read_timeout",
    )


def linger_timeout(bound: str) -> RequestTimeout:
    """A body answered before it was read that did not end within the lingering close's
    ``bound`` ("idle" or "total", ``LingerBounds``): its connection is closed."""
    return RequestTimeout(
        f"the body answered before it was read did not end within the {bound} bound",
        field="body",
        rule=f"linger_{bound}",
    )


def head_too_large(received: int, limit: int, *, target_only: bool) -> TensorbitsError:
    """414 when the request target alone is past the limit, 431 otherwise."""
    what = "request target (URL)" if target_only else "request head (request line and headers)"
    message = (
        f"{what} of at least {received} bytes is past the limit of {limit} bytes "
        "(TENSORBITS_MAX_HEAD_BYTES)"
    )
    if target_only:
        return UriTooLong(message, field="url", rule="max_head_bytes")
    return HeadTooLarge(message, field="headers", rule="max_head_bytes")


# The scope key set once a request's whole body has been read off the connection: its app can
# then read the body without a deadline (the body deadline is for a body still arriving).
BODY_RECEIVED = "tensorbits.body_received"

# Up to this many body bytes go out in the same write as the response's head (joined: one copy);
# a larger body is written apart from its head, as uvicorn writes both (no copy of it).
JOINED_BODY_MAX_BYTES = 64 << 10
# ``OneWriteCycle.wake_at`` when no ``receive_into`` waits for a part of its body: past any body.
NO_WAKE = 1 << 62

# nginx's lingering close: lingering_time (all the discarding of one response) and
# lingering_timeout (the client idle between two reads). A client sending a large body over a
# slow link needs the first; the second ends a client that stopped sending without closing.
LINGER_TOTAL_S = 30.0
LINGER_IDLE_S = 5.0
# Bodies' worth of bytes discarded at most after an early refusal. One is not enough: a client
# past the body limit by a little more than its socket buffers hold would be cut off (RST) and
# read a broken pipe instead of its 413; twice the limit lets a client that overshoots by up to
# the limit itself read its answer, and still bounds the reading by the limit, not by the body.
LINGER_BODIES = 2


class LingerBounds(NamedTuple):
    """What the server discards after answering a request whose body it did not read."""

    idle_s: float  # the client sends nothing for this long: closed
    total_s: float  # from the response on: closed
    max_bytes: int  # discarded after a response that closes: then cut off (RST)
    skip_bytes: int  # a declared body up to this long is skipped, the connection kept


def linger_bounds(settings: Settings) -> LingerBounds:
    """The bounds of ``settings``: nginx's times, or the server's own where shorter (the body
    read deadline: a body is never read for longer; the keep-alive timeout: a connection is
    never idle for longer); in bytes, ``LINGER_BODIES`` legal requests' bodies and a head (a
    refused request costs reading in proportion to the limit, not to what is sent)."""
    total = min(LINGER_TOTAL_S, settings.timeout_body_read)
    return LingerBounds(
        idle_s=min(LINGER_IDLE_S, settings.timeout_keep_alive, total),
        total_s=total,
        max_bytes=LINGER_BODIES * settings.max_body_bytes + settings.max_head_bytes,
        skip_bytes=settings.max_body_bytes,
    )


class OneWriteCycle(RequestResponseCycle):
    """uvicorn's request cycle with a response's head written together with its body: one
    ``transport.write`` per small response instead of two.

    On loopback each write is a syscall that runs the receiver's TCP path and wakes it: the
    second write was a third of a small request's time under load (a profile of the server under
    wrk). The head is built and checked as uvicorn builds and checks it (this is
    its ``send``, 0.3x), kept until the first body message, and written with it (joined up to
    ``JOINED_BODY_MAX_BYTES``, else apart, first). A HEAD response, which writes no body, and a
    response whose app fails before its body writes its head then, alone or not at all (the
    connection is closed: the client sees no half response)."""

    _head: bytes | None = None  # the response's status line and headers, not written yet
    # The longest declared body skipped to keep the connection (LingerBounds.skip_bytes).
    skip_bytes = 0
    # How the connection is closed after a response that does not keep it (the protocol's
    # lingering close; None: at once).
    close_connection: Callable[[], None] | None = None
    # The app's buffer the body is parsed into (``receive_into``), and the body bytes parsed so
    # far; None: the body is queued in ``body`` for ``receive``, as uvicorn queues it.
    into: memoryview | None = None
    filled = 0
    # The fill at which a ``receive_into`` waiting with ``until`` is woken (past any: none waits).
    wake_at = NO_WAKE

    async def receive_into(self, view: memoryview, until: int | None = None) -> tuple[int, bool]:
        """The body read into ``view`` (``BODY_INTO``): what is queued copied in, then every
        chunk parsed from now on written in place by ``on_body``, with no read paused at
        uvicorn's high-water mark and no wake of the app per chunk: it is woken once, when the
        body is complete, the client disconnects or the request is refused, or (``until``)
        when that many bytes are in; the rest is still written into ``view`` as it arrives,
        for the next call with the same view, until the response starts. ``receive``'s
        semantics otherwise (a 100 Continue owed is sent; a disconnect or a response complete
        ends it unended)."""
        if self.into is not view:  # the first call for this body
            if self.waiting_for_100_continue and not self.transport.is_closing():
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                self.waiting_for_100_continue = False
            queued = self.body
            filled = len(queued)
            if filled:
                put(view, 0, queued)
                self.body = bytearray()
            if not self._arriving():
                return filled, not (self.more_body or self.disconnected or self.response_complete)
            self.into, self.filled = view, filled
            self.flow.resume_reading()  # paused at the high-water mark before the app came
        self.wake_at = NO_WAKE if until is None else until
        try:
            while self._arriving() and self.filled < self.wake_at:
                await self.message_event.wait()
                self.message_event.clear()
        except BaseException:
            self.into = None  # cancelled (the body deadline): nothing is written past this point
            raise
        finally:
            self.wake_at = NO_WAKE
        filled = self.filled
        if not self._arriving():
            self.into = None
        return filled, not (self.more_body or self.disconnected or self.response_complete)

    def _arriving(self) -> bool:
        """Whether more of the body may still arrive for the app."""
        return self.more_body and not (self.disconnected or self.response_complete)

    async def send(self, message: ASGISendEvent) -> None:
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.start', but got '{message['type']}'."
                )
            self.response_started = True
            self.waiting_for_100_continue = False
            self.into = None  # the app is done with its body: the rest is not written there
            status_code = message["status"]
            if self.access_log:  # off in tensorbits serve (the middleware logs); kept for others
                self.access_logger.info(
                    '%s - "%s %s HTTP/%s" %d',
                    get_client_addr(self.scope),
                    self.scope["method"],
                    get_path_with_query_string(self.scope),
                    self.scope["http_version"],
                    status_code,
                )
            self._head = self._response_head(status_code, message.get("headers", ()))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(
                    f"Expected ASGI message 'http.response.body', but got '{message['type']}'."
                )
            self._send_body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(
                f"Unexpected ASGI message '{message['type']}' sent, after response already "
                "completed."
            )

    def _response_head(self, status_code: int, headers: Iterable[tuple[bytes, bytes]]) -> bytes:
        if self.more_body and not self._rest_is_skippable():
            # The app answered without the rest of its request's body: keeping the connection
            # would mean reading all of it, however long. The connection is closed instead.
            self.keep_alive = False
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in itertools.chain(self.default_headers, headers):
            if HEADER_RE.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if HEADER_VALUE_RE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection":
                connection = [token.lower().strip() for token in value.split(b",")]
                if b"close" in connection:
                    self.keep_alive = False
                    has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if (
            self.chunked_encoding is None
            and self.scope["method"] != "HEAD"
            and status_code not in (204, 304)
        ):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    def _rest_is_skippable(self) -> bool:
        """Whether the request's body, not read whole, is one a legal request could send, to be
        read past and the connection kept: a declared length (chunked: unknown) within the body
        limit."""
        length = declared_length(self.scope)
        return length is not None and length <= self.skip_bytes

    def _send_body(self, body: bytes, more_body: bool) -> None:
        head, self._head = self._head, None
        out: bytes | None
        if self.scope["method"] == "HEAD":
            self.expected_content_length = 0
            out = None
        elif self.chunked_encoding:
            chunks = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                chunks.append(b"0\r\n\r\n")
            out = b"".join(chunks)
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            out = body
        if head is not None:
            if out is not None and len(out) <= JOINED_BODY_MAX_BYTES:
                out = head + out
            else:
                self.transport.write(head)
        if out is not None:
            self.transport.write(out)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            # The scope holds this cycle's receive_into and this cycle its scope: a reference
            # cycle per request unless broken here, left to the garbage collector (measured
            # under wrk: six times the collections, 90 us of CPU per small request against 77).
            self.scope.pop(BODY_INTO, None)  # type: ignore[misc]
            self.message_event.set()
            if not self.keep_alive:
                (self.close_connection or self.transport.close)()
            self.on_response()


def put(view: memoryview, filled: int, chunk: bytes | bytearray) -> None:
    """``chunk`` written into ``view`` at ``filled``, what fits of it (the rest, past a declared
    length, is counted by the caller and refused by the app)."""
    end = filled + len(chunk)
    if end <= len(view):
        view[filled:end] = chunk
    elif filled < len(view):
        view[filled:] = memoryview(chunk)[: len(view) - filled]


def declared_length(scope: Any) -> int | None:
    """The request's Content-Length (None: none, or not a number)."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def framed_length(scope: Any) -> int | None:
    """The length the parser frames the request's body by: its Content-Length, where it has no
    Transfer-Encoding (None otherwise, or where the length is not a number; the parser has
    refused conflicting lengths already)."""
    if any(name == b"transfer-encoding" for name, _ in scope["headers"]):
        return None
    return declared_length(scope)


# Bytes read at most at a time outside a body read in place: uvloop's own read buffer's size.
READ_BUFFER_BYTES = 256 << 10
_read_buffers = threading.local()


def read_buffer() -> memoryview:
    """This thread's buffer for reads outside a body read in place, shared by its connections as
    uvloop shares its own: what is read into it is parsed before the next read (httptools hands
    on copies), so no connection's bytes outlive their read."""
    view: memoryview | None = getattr(_read_buffers, "view", None)
    if view is None:
        view = _read_buffers.view = memoryview(bytearray(READ_BUFFER_BYTES))
    return view


class _Buffered(asyncio.BufferedProtocol):
    """The connection's protocol as the transport is handed it once connected: a buffered one,
    so the rest of a body can be read straight into the app's buffer (``get_buffer``). uvloop
    reads into a protocol's buffers only when it is no ``asyncio.Protocol``, which uvicorn's
    protocol is; so this stands in for it, every call passed on."""

    def __init__(self, protocol: GuardedHttpProtocol) -> None:
        self.protocol = protocol
        # Each read calls these two: the protocol's own, found on this object with no call
        # between (a method here would cost a frame per read).
        self.__dict__.update(get_buffer=protocol.get_buffer, buffer_updated=protocol.buffer_updated)

    def get_buffer(self, sizehint: int) -> memoryview:  # replaced in __init__
        return self.protocol.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:  # replaced in __init__
        self.protocol.buffer_updated(nbytes)

    def data_received(self, data: bytes) -> None:  # a transport that hands bytes on still can
        self.protocol.data_received(data)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.protocol.connection_made(transport)  # type: ignore[arg-type]

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.connection_lost(exc)

    def eof_received(self) -> bool | None:
        self.protocol.eof_received()
        return None

    def pause_writing(self) -> None:
        self.protocol.pause_writing()

    def resume_writing(self) -> None:
        self.protocol.resume_writing()


class _Refused(Exception):
    """Raised inside a parser callback to stop parsing; the error is in ``_refusal``."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the request head bounded, and refusals in JSON, in order.

    The deadline is lazy: a request head records when it began and one timer per connection
    checks it, re-armed only when it fires. Arming and cancelling a timer for every request would
    cost a few microseconds each on the small-request path; this costs a clock read. The byte
    count is kept in the parser's callbacks and per chunk read (``data_received``)."""

    _head_started: float | None = None  # loop time the pending request head began; None: none
    _message_started: float | None = None  # loop time the newest request began; None: ended
    _head_timer: asyncio.TimerHandle | None = None
    _messages = 0  # requests begun on this connection: tells a head begun within a chunk
    _head_parsed = 0  # bytes of the pending head's target and complete headers
    _head_fed = 0  # bytes of the chunks read while it was pending, after the one it began in
    _url_bytes = 0  # bytes of its request target
    _in_body = False  # the newest request's head is read, its body is not complete
    _refusal: TensorbitsError | None = None  # set once the connection is refused; read no more
    _refusal_owed: bytes | None = None  # the refusal's response, written after those owed first
    _running: RequestResponseCycle | None = None  # the request whose app runs or ran last
    _body_bytes = 0  # body bytes of the newest request parsed so far
    _linger_left: int | None = None  # bytes still to discard once closing; None: not closing
    # Discarding a body answered already (closing, or skipping it): the loop times it must end
    # by and it was last read at, and one timer for both (re-armed when it fires early).
    _discard_until = 0.0
    _discard_read = 0.0
    _discard_timer: asyncio.TimerHandle | None = None
    # The rest of a body read around the parser, straight into the app's buffer: its bytes not
    # read yet (0: the parser frames the body), and whether the last read was into that buffer.
    _body_left = 0
    _reading_into = False

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        max_head_bytes: int,
        header_timeout: float,
        linger: LingerBounds,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._limit = max_head_bytes  # bytes of one request's target and headers
        self._header_timeout = header_timeout  # seconds one request head may take to arrive
        self._linger = linger

    # --- the connection -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._read_buffer = read_buffer()
        with contextlib.suppress(NotImplementedError):  # a transport that cannot (a test's)
            transport.set_protocol(_Buffered(self))
        self._head_begins()

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_started = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._discard_ends()
        super().connection_lost(exc)

    def get_buffer(self, sizehint: int) -> memoryview:
        cycle: OneWriteCycle | None = self.cycle  # type: ignore[assignment]
        if cycle is not None and cycle.into is not None and self._in_body:
            into = self._body_buffer(cycle, cycle.into)
            if into is not None:
                self._reading_into = True
                return into
        self._reading_into = False
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        if not self._reading_into:
            self.data_received(self._read_buffer[:nbytes])  # type: ignore[arg-type]
            return
        self._reading_into = False
        cycle: OneWriteCycle = self.cycle  # type: ignore[assignment]
        cycle.filled += nbytes
        self._body_bytes += nbytes
        self._body_left -= nbytes
        if not self._body_left:
            self.on_message_complete()  # the parser's callback, as it would have called it
        elif cycle.filled >= cycle.wake_at:
            cycle.message_event.set()

    def _body_buffer(self, cycle: OneWriteCycle, into: memoryview) -> memoryview | None:
        """Where the rest of the body is read: the part of the app's buffer not filled yet, once
        the parser has handed on every body byte it parsed and the body's end is known to the
        byte (a Content-Length, the buffer's length); None: read it for the parser. Its rest is
        then read around the parser, which is replaced by a fresh one for the next request, as
        if it had parsed the body (a kept connection only: a closing one ends here anyway)."""
        if not self._body_left:
            if (
                not cycle.keep_alive
                or cycle.filled != self._body_bytes
                or self._linger_left is not None
                or self._refusal is not None
                or self.parser.should_upgrade()
                or framed_length(cycle.scope) != len(into)
                or cycle.filled >= len(into)
            ):
                return None
            self._body_left = len(into) - cycle.filled
            self.parser = self._new_parser()
        return into[cycle.filled :]

    def _new_parser(self) -> httptools.HttpRequestParser:
        parser = httptools.HttpRequestParser(self)
        parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn makes its own
        return parser

    def _body_rest(self, data: bytes) -> bytes:
        """``data`` read for the parser while the rest of a body is framed here (the app stopped
        waiting for it: a deadline passed): its body bytes go where the parser would have put
        them (``on_body``), the body's end ends the message; what follows is returned."""
        take = min(len(data), self._body_left)
        self._body_left -= take
        self.on_body(bytes(data[:take]))
        if not self._body_left:
            self.on_message_complete()
        return data[take:]

    def data_received(self, data: bytes) -> None:
        if self._discard_timer is not None:
            self._discard_read = self.loop.time()
        if self._linger_left is not None:
            self._linger_left -= len(data)  # discarded: a closing connection reads no request
            if self._linger_left <= 0:  # the declared body is in, or the bound is reached
                self.transport.close()
            return
        if self._refusal is not None:
            return  # the parser stopped at the refused request; what follows is not read
        if self._body_left:
            data = self._body_rest(data)
            if not data:
                return
        self._unset_keepalive_if_required()
        messages_before, in_body_before = self._messages, self._in_body
        head_open_before = self._head_started is not None and messages_before > 0
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            self._refuse(self._refusal or parser_error(str(exc)))
            return
        if self._head_started is None:
            return
        # A head is still incomplete after this chunk. Both counts are at most its true size, so
        # a head within the limit is never refused: the callbacks count its target and complete
        # headers, and a chunk that is head from end to end counts whole (one that continues the
        # head, or one that began it with nothing of an earlier request before it). What neither
        # counts (a header begun after an earlier request's end in the same chunk) is less than
        # one chunk.
        begun = self._messages - messages_before
        if (head_open_before and begun == 0) or (
            begun == 1 and not head_open_before and not in_body_before
        ):
            self._head_fed += len(data)
        received = max(self._head_parsed, self._head_fed)
        if received > self._limit:
            self._refuse(
                head_too_large(received, self._limit, target_only=self._url_bytes > self._limit)
            )

    # --- parser callbacks -----------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._messages += 1
        self._head_parsed = self._head_fed = self._url_bytes = self._body_bytes = 0
        self._in_body = False
        self._head_begins()  # a new request has begun: its head must now arrive in time
        self._message_started = self._head_started

    # on_url and on_header do what uvicorn's do, inline: they run for every header of every
    # request, and a call to the parent's would cost as much again. They only count; the limit
    # is checked once per chunk (``data_received``) and once per head (``on_headers_complete``).
    def on_url(self, url: bytes) -> None:
        self._url_bytes += len(url)
        self._head_parsed += len(url)
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_parsed += len(name) + len(value) + 4  # ": " and CRLF
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._head_parsed > self._limit:  # a head that arrived whole within one chunk
            url_only = self._url_bytes > self._limit
            self._stop(head_too_large(self._head_parsed, self._limit, target_only=url_only))
        if self.url[:1] != b"/":
            self._absolute_form()
        self._head_started = None
        self._begin_cycle()
        self._in_body = True  # only now is ``self.cycle`` this request's

    def _begin_cycle(self) -> None:
        """uvicorn's ``on_headers_complete`` (0.3x), its request cycle a ``OneWriteCycle``: the
        scope's method, path and query, then the cycle, started now or queued behind the one
        whose response is still owed (pipelining)."""
        parser = self.parser
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        app = self.app
        limit = self.limit_concurrency
        if limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing_cycle = self.cycle
        self.cycle = OneWriteCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
        )
        self.cycle.close_connection = self._close_lingering
        self.cycle.skip_bytes = self._linger.skip_bytes
        scope[BODY_INTO] = self.cycle.receive_into  # type: ignore[literal-required]
        if existing_cycle is None or existing_cycle.response_complete:
            self._start_asgi_task(self.cycle, app)
        else:
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, app))

    def _absolute_form(self) -> None:
        """The absolute form with no path ("http://host?q"; RFC 9112 §3.2.2) means the path "/";
        uvicorn would fail on its missing path. (What it reads of any target is path and query.)"""
        with contextlib.suppress(httptools.HttpParserInvalidURLError):
            parsed = httptools.parse_url(self.url)
            path: bytes | None = parsed.path  # None despite httptools' stub, for "http://host"
            if path is None:
                self.url = b"/?" + parsed.query if parsed.query else b"/"

    def on_body(self, body: bytes) -> None:
        # uvicorn's, inline (it runs for every chunk of every body), counting the bytes: a
        # lingering close discards the declared rest and no more.
        self._body_bytes += len(body)
        cycle: OneWriteCycle = self.cycle  # type: ignore[assignment]
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        into = cycle.into
        if into is not None:  # the app's buffer (receive_into): the app is woken once, at the end
            put(into, cycle.filled, body)
            cycle.filled += len(body)
            if cycle.filled >= cycle.wake_at:  # or as it asked, before (``until``)
                cycle.message_event.set()
            return
        cycle.body += body
        if len(cycle.body) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        self._in_body = False
        self._message_started = None
        if self._discard_timer is not None:
            # The body answered already is all skipped. The reads of it cancelled uvicorn's
            # keep-alive timer: the next request's head is timed from now instead, as on a new
            # connection (its first byte, if it comes, times it anew).
            self._discard_ends()
            self._head_begins()
        # Read by the app before it waits for the body (``api/admitted.py``): a body already
        # here needs no deadline, and arming one costs a small request about a tenth of its
        # time (a profile of the server under wrk). (``self.scope`` is
        # this message's.)
        self.scope[BODY_RECEIVED] = True  # type: ignore[literal-required]
        super().on_message_complete()

    def on_response_complete(self) -> None:
        if self._linger_left is not None:
            # The connection is closing: no request queued behind this one starts, and no
            # keep-alive timer is armed (uvicorn's returns early on a closing transport).
            self.server_state.total_requests += 1
            return
        super().on_response_complete()
        if self._in_body and self._running is self.cycle and not self.transport.is_closing():
            self._discard_begins()  # answered before its body was read whole: skipped, timed
        if self._refusal_owed is not None and not self._responses_owed():
            self._write_refusal()

    def shutdown(self) -> None:
        if self._linger_left is not None:
            self.transport.close()  # the server is stopping: no more reading for the client
            return
        super().shutdown()

    # --- closing --------------------------------------------------------------------------------
    def _close_lingering(self) -> None:
        """Close after the response just written, without losing it to a reset: shut the
        sending side (the client reads the response, then EOF), read and discard what the
        client still sends until it closes too, has sent the rest of the body it declared, or
        the bounds end it (``LingerBounds``: idle, total time, bytes), then close. A transport
        without a socket under it has no receive buffer for a close to reset over; it is
        closed at once."""
        transport = self.transport
        if transport.is_closing() or self._linger_left is not None:
            return
        if transport.get_extra_info("socket") is None:
            transport.close()
            return
        left = self._linger.max_bytes
        length = declared_length(self.cycle.scope) if self._in_body and self.cycle else None
        if length is not None:  # a body's declared rest: the client closes after it, or not
            left = min(left, length - self._body_bytes)
            if left <= 0:
                transport.close()
                return
        self._linger_left = left
        self._head_started = None  # what comes now is discarded, not a request head
        if transport.can_write_eof():  # not over TLS: the client relies on Content-Length there
            transport.write_eof()  # sent once what is written has gone out
        self.flow.resume_reading()  # paused for a queued request or a body the app had not read
        self._discard_begins()

    def _discard_begins(self) -> None:
        """Time what is discarded from now on: closed once the client has sent nothing for
        ``idle_s``, or ``total_s`` from now. One timer, armed for the earlier of the two and
        checked when it fires (a read moves the idle bound on without touching it)."""
        now = self.loop.time()
        self._discard_until = now + self._linger.total_s
        self._discard_read = now
        if self._discard_timer is not None:
            self._discard_timer.cancel()
        self._discard_timer = self.loop.call_at(now + self._linger.idle_s, self._discard_check)

    def _discard_check(self) -> None:
        # The loop may run a timer a clock tick early: its time counts as reached.
        now = self.loop.time() + 0.001
        due = min(self._discard_until, self._discard_read + self._linger.idle_s)
        if now < due:
            self._discard_timer = self.loop.call_at(due, self._discard_check)
            return
        self._discard_timer = None
        refusal = linger_timeout("idle" if due < self._discard_until else "total")
        # Its request was answered and counted already: this is logged under its route.
        scope = cast(Scope, self.cycle.scope)
        self._record(
            refusal, 0, request=False, method=scope["method"],
            target=bounded(scope["path"], MAX_LOGGED_TARGET), route=route_label(scope),
        )  # fmt: skip
        self.transport.close()

    def _discard_ends(self) -> None:
        if self._discard_timer is not None:
            self._discard_timer.cancel()
            self._discard_timer = None

    # --- refusals -------------------------------------------------------------------------------
    def _stop(self, error: TensorbitsError) -> None:
        self._refusal = error
        raise _Refused  # httptools turns it into an HttpParserError that feed_data raises

    def _refuse(self, error: TensorbitsError) -> None:
        """Answer ``error`` once every response owed on this connection is sent, then close."""
        self._refusal = error
        self._head_started = None
        if self._in_body and self.cycle is not None:
            self._abandon(self.cycle)  # the refused bytes are this request's body: it is the one
        self._refusal_owed = self._error_response(error)
        self._record(error, len(self._refusal_owed))
        if self._responses_owed():
            self.flow.pause_reading()
        else:
            self._write_refusal()

    def _abandon(self, cycle: RequestResponseCycle) -> None:
        """The newest request is the refused one: its response is the refusal, not its app's.
        Queued, it never starts; running, its app reads a disconnect and what it sends is
        dropped. Either way it is no response owed."""
        if self.pipeline and self.pipeline[0][0] is cycle:
            self.pipeline.popleft()
        cycle.disconnected = True
        cycle.message_event.set()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        self._running = cycle  # (``self.cycle`` is the newest request, maybe still queued)
        super()._start_asgi_task(cycle, app)

    def _responses_owed(self) -> bool:
        if self.pipeline:
            return True
        cycle = self._running
        return cycle is not None and not cycle.response_complete and not cycle.disconnected

    def _record(
        self,
        error: TensorbitsError,
        size_out: int,
        *,
        request: bool = True,
        method: str | None = None,
        target: str | None = None,
        route: str = NO_ROUTE,
    ) -> None:
        """Log and count ``error``, refused here, as the app's refusals are
        (``observability.record_http_layer_refusal``): the newest request's method and target
        where its request line was read ("-" where not), its bytes, its time since it began."""
        if method is None or target is None:
            method = target = "-"
            if self.url:  # the target is read, so the method before it is
                method = self.parser.get_method().decode("ascii", "replace")
                target = bounded(self.url.decode("latin-1"), MAX_LOGGED_TARGET)
        began = self._message_started
        seconds = 0.0 if began is None else max(self.loop.time() - began, 0.0)
        client = f"{self.client[0]}:{self.client[1]}" if self.client else ""
        size_in = max(self._head_parsed, self._head_fed) + self._body_bytes
        metrics = self.app_state.get(METRICS_STATE)
        record_http_layer_refusal(
            metrics, client, method, target, error, seconds, size_in, size_out,
            route=route, request=request,
        )  # fmt: skip

    def _write_refusal(self) -> None:
        response, self._refusal_owed = self._refusal_owed, None
        if response is not None and not self.transport.is_closing():
            self.transport.write(response)
            self._close_lingering()

    def _error_response(self, error: TensorbitsError) -> bytes:
        body = json.dumps(error.to_dict()).encode()
        length = len(body)
        if isinstance(error, (HeadTooLarge, UriTooLong)) and self.parser.get_method() == b"HEAD":
            # A valid request line (its target has been read) of a HEAD request: the length the
            # answer would have, and no content (RFC 9110 §9.3.2). A request the parser refused
            # is no HEAD request: its method may not even be whole.
            body = b""
        lines = [STATUS_LINE[error.status_code]]
        for name, value in self.server_state.default_headers:
            lines += [name, b": ", value, b"\r\n"]
        lines += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % length,
            b"connection: close\r\n\r\n",
            body,
        ]
        return b"".join(lines)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's own refusals (an unsupported upgrade, say) take the same path as ours.
        self._refuse(parser_error(msg))

    # --- the head deadline ----------------------------------------------------------------------
    def _head_begins(self) -> None:
        self._head_started = self.loop.time()
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._header_timeout, self._check)

    def _check(self) -> None:
        self._head_timer = None
        if self._head_started is None:
            return  # no head pending: the next one arms the timer again
        remaining = self._head_started + self._header_timeout - self.loop.time()
        if remaining > 0:
            # The head pending now began after the one the timer was armed for.
            self._head_timer = self.loop.call_later(remaining, self._check)
            return
        if self._message_started is None:  # not a byte of a request: an idle connection
            logger.info("closing a connection whose request head did not arrive in time")
        else:
            self._record(head_read_timeout(self._header_timeout), 0)
        self.transport.close()


def guarded_protocol(settings: Settings) -> functools.partial[GuardedHttpProtocol]:
    """What ``uvicorn.Config(http=...)`` takes: the protocol, bounded by ``settings``. A partial
    of a module-level class pickles, so ``--workers N`` hands it to each spawned worker."""
    return functools.partial(
        GuardedHttpProtocol,
        max_head_bytes=settings.max_head_bytes,
        header_timeout=settings.timeout_header_read,
        linger=linger_bounds(settings),
    )
