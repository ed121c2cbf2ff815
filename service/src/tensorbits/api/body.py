"""Reading request bodies under a byte limit, into one buffer, decompressing if asked.

Starlette's ``Request.body()`` joins a list of chunks (twice the body in memory for a moment)
and has no limit. Here the declared Content-Length is checked before a byte is read, the buffer
is allocated once at that size, a chunked body is bounded as it streams, and a compressed body is
bounded after inflation too.

Under ``tensorbits serve`` a body with a declared length is read straight into that buffer: the
server's protocol fills it as the body is parsed and wakes the app once, when it is complete
(``guarded_protocol.BODY_INTO``); elsewhere (another ASGI server, a test transport) the chunks
``receive`` gives are copied in. Either way the buffer is checked here, in the same words. A
large binary v2 body is read in parts instead (``receive_first``, its JSON header; then
``receive_rest``): the request is planned from its header, and an element-wise answer computed,
while the rest arrives (``admitted.AdmittedRequest.receive_planned``).
"""

from __future__ import annotations

import ctypes
import sys
import zlib
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.types import Message, Receive, Scope

from tensorbits.api.compression import WBITS
from tensorbits.deadlines import within_read_deadline
from tensorbits.observability import BODY_INTO, BodyInto
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

# zlib's wbits per coding (gzip, and deflate as HTTP means it): the codings responses use too.
_WBITS = WBITS
_INFLATE_STEP = 1 << 20
# The Content-Encoding values (``coding_of``) of a body sent as it is.
IDENTITY = ("", "identity")


def coding_of(encoding: str | None) -> str:
    """A Content-Encoding header as it is compared: stripped, lower case; none: identity."""
    return (encoding or "identity").strip().lower()


# A declared body at least this large is allocated on transparent huge pages, as NumPy allocates
# its arrays (and the response's buffer, ``codec.BodyLayout.allocate``): the kernel maps it 2 MiB
# at a time as it is written. On 4 KiB pages a 64 MiB bytearray cost 31 ms to zero-fill and
# write (its page faults), on huge pages 11 ms (a 2-core VM); the round trip's largest cost.
HUGE_PAGE_MIN_BYTES = 4 << 20
_PAGE = 4096
_MADV_HUGEPAGE = 14  # Linux's


def _huge_page_allocator() -> Callable[[int], bytearray] | None:
    """``length`` -> a bytearray, not zero-filled (it is written whole before it is read: the
    body is refused otherwise), advised onto huge pages; None where that is not offered."""
    if sys.platform != "linux":
        return None
    try:
        new = ctypes.pythonapi.PyByteArray_FromStringAndSize
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (AttributeError, OSError):
        return None
    new.restype = ctypes.py_object
    new.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    madvise.restype = ctypes.c_int

    def allocate(length: int) -> bytearray:
        buffer: bytearray = new(None, length)
        start = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        first, end = -(-start // _PAGE) * _PAGE, (start + length) // _PAGE * _PAGE
        madvise(first, end - first, _MADV_HUGEPAGE)  # refused (no THP): 4 KiB pages, as before
        return buffer

    return allocate


_allocate_huge = _huge_page_allocator()


def allocate_body(length: int) -> bytearray:
    """The buffer a declared body of ``length`` bytes is read into (the request is admitted for
    it already)."""
    if length < HUGE_PAGE_MIN_BYTES or _allocate_huge is None:
        return bytearray(length)
    return _allocate_huge(length)


def _too_large(what: str, size: int | str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} of {size} bytes exceeds the limit of {limit} bytes (TENSORBITS_MAX_BODY_BYTES)",
        field="body",
        rule="max_body_bytes",
    )


def header_values(scope: Scope, *names: bytes) -> list[str | None]:
    """The first value of each of ``names`` (lower-case) in the request head, in one pass over
    the ASGI headers: cheaper on the hot path than building a ``Headers`` object."""
    values: list[str | None] = [None] * len(names)
    for key, value in scope["headers"]:
        if key in names:
            index = names.index(key)
            if values[index] is None:
                values[index] = value.decode("latin-1")
    return values


def declared_length(raw: str | None, limit: int) -> int | None:
    """The Content-Length header as an int, refused past ``limit`` before anything is read."""
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 20:
        raise InvalidRequest(
            f"Content-Length {raw[:40]!r} is not a non-negative integer",
            field="Content-Length",
            rule="header",
        )
    length = int(raw)
    if length > limit:
        raise _too_large("request body", length, limit)
    return length


async def read_body(request: Request, limit: int) -> bytearray:
    """``receive_body`` for a Starlette request of the tensorbits app, under its read deadline
    (TENSORBITS_TIMEOUT_BODY_READ), as every body and gRPC message is read."""
    # The runtime's settings (None before the lifespan, or on an app that is not tensorbits').
    runtime: Runtime | None = getattr(request.app.state, "runtime", None)
    timeout = None if runtime is None else runtime.settings.timeout_body_read
    length = declared_length(request.headers.get("content-length"), limit)
    encoding = request.headers.get("content-encoding")
    into: BodyInto | None = request.scope.get(BODY_INTO)
    return await receive_body(request.receive, length, encoding, limit, timeout, into)


async def receive_body(
    receive: Receive,
    length: int | None,
    encoding: str | None,
    limit: int,
    timeout: float | None,
    into: BodyInto | None = None,
) -> bytearray:
    """The whole request body, decompressed, never more than ``limit`` bytes at any stage, and
    all of it within ``timeout`` seconds: a client trickling bytes (slow loris) gets a 408 instead
    of holding its buffer and its admission for ever. ``length`` is the declared Content-Length
    (None: chunked), already checked against ``limit`` by ``declared_length``. ``timeout`` None:
    no deadline (a body already read whole: api/admitted.py). The deadline and its refusal are
    every protocol's (``deadlines.py``). ``into``: the server's ``BODY_INTO`` (None: the body
    is read with ``receive``)."""
    buffer = await within_read_deadline(
        _receive(receive, length, limit, into), timeout, "the request body"
    )
    encoding = coding_of(encoding)
    if encoding in IDENTITY:
        return buffer
    if encoding not in _WBITS:
        raise InvalidRequest(
            f"Content-Encoding {encoding[:40]!r} is not supported (allowed: gzip, deflate, identity)",
            field="Content-Encoding",
            rule="header",
        )
    return inflate(buffer, encoding, limit)


async def _receive(
    receive: Receive, length: int | None, limit: int, into: BodyInto | None
) -> bytearray:
    if length is None:
        return await _receive_chunked(receive, limit)
    return await _receive_declared(receive, length, into)


def _chunk(message: Message) -> tuple[bytes, bool]:
    """A body message's bytes and whether more follow, as Starlette's Request.stream reads it
    (a plain loop over this, not an async generator: it runs on every request)."""
    if message["type"] == "http.disconnect":
        raise _disconnected()
    return message.get("body", b""), message.get("more_body", False)


def _disconnected() -> InvalidRequest:
    return InvalidRequest(
        "client disconnected before the request body was complete", field="body", rule="truncated"
    )


async def _receive_declared(receive: Receive, length: int, into: BodyInto | None) -> bytearray:
    # One allocation of the declared size, made here (the request is admitted for it already),
    # filled in place by the server (``into``) or with the chunks ``receive`` gives.
    buffer = allocate_body(length)
    with memoryview(buffer) as view:
        filled, ended = await (_receive_into(receive, view) if into is None else into(view))
    check_declared(filled, ended, length)
    return buffer


async def receive_first(into: BodyInto, view: memoryview, until: int) -> tuple[int, bool]:
    """The first ``until`` bytes of a declared body read into ``view`` (``into``: the server's
    ``BODY_INTO``), the rest still arriving there: (bytes in, whether the body ended), refused
    as ``receive_body`` refuses a body when it ended early, or long, or the client left."""
    filled, ended = await into(view, until)
    if ended or filled < until:
        check_declared(filled, ended, len(view))
    return filled, ended


async def receive_rest(
    into: BodyInto,
    view: memoryview,
    read: tuple[int, bool],
    step: int,
    arrived: Callable[[int], Awaitable[None]] | None,
) -> None:
    """The rest of a declared body whose ``read`` = (bytes in, ended) came from
    ``receive_first``, into ``view``: ``arrived`` told of the bytes in at least every ``step``
    bytes and awaited (the body keeps arriving in place meanwhile); refused as ``receive_body``
    refuses it."""
    filled, ended = read
    if not ended and arrived is None:
        filled, ended = await into(view)
    while not ended and arrived is not None:
        until = filled + step
        filled, ended = await into(view, until)
        if ended or filled < until:  # the end, or it will not come (the client left)
            break
        await arrived(min(filled, len(view)))
    check_declared(filled, ended, len(view))


def check_declared(filled: int, ended: bool, length: int) -> None:
    """A declared body's refusal, if it is one: ``filled`` bytes of the ``length`` declared
    arrived (more: it is longer), ``ended`` or not (the client left first)."""
    if filled > length:
        raise InvalidRequest(
            f"request body is longer than its Content-Length {length}",
            field="Content-Length",
            rule="body_length",
        )
    if not ended:
        raise _disconnected()
    if filled != length:
        raise InvalidRequest(
            f"request body ended after {filled} of its {length} declared bytes",
            field="body",
            rule="truncated",
        )


async def _receive_into(receive: Receive, view: memoryview) -> tuple[int, bool]:
    """``BODY_INTO``'s contract over ``receive``: the bytes of the body, True where it ended
    (False: disconnected); a count past ``view`` (not written) as soon as it is longer."""
    filled = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return filled, False
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        end = filled + len(chunk)
        if end > len(view):
            return end, True
        view[filled:end] = chunk
        filled = end
    return filled, True


async def _receive_chunked(receive: Receive, limit: int) -> bytearray:
    # No length to size a buffer from: grow it, but never past the limit.
    buffer = bytearray()
    more = True
    while more:
        chunk, more = _chunk(await receive())
        if len(buffer) + len(chunk) > limit:
            raise _too_large("chunked request body", f"more than {limit}", limit)
        buffer += chunk
    return buffer


def inflate(data: bytes | bytearray, encoding: str, limit: int) -> bytearray:
    """Decompress ``data``; stop with 413 as soon as the output would pass ``limit``."""
    inflater = zlib.decompressobj(_WBITS[encoding])
    out = bytearray()
    pending: bytes | bytearray = data
    try:
        # At most _INFLATE_STEP bytes of output per call, so a small "zip bomb" is stopped as
        # soon as it passes the limit; a call with no new input drains what zlib holds back.
        while not inflater.eof:
            chunk = inflater.decompress(pending, _INFLATE_STEP)
            out += chunk
            if len(out) > limit:
                raise _too_large("decompressed request body", f"more than {limit}", limit)
            pending = inflater.unconsumed_tail
            if not pending and not chunk:
                break
    except zlib.error as exc:
        raise InvalidRequest(
            f"request body is not valid {encoding} data: {exc}", field="body", rule="encoding"
        ) from None
    if not inflater.eof:
        raise InvalidRequest(f"{encoding} request body is truncated", field="body", rule="encoding")
    if inflater.unused_data:
        raise InvalidRequest(
            f"{len(inflater.unused_data)} bytes follow the end of the {encoding} stream",
            field="body",
            rule="encoding",
        )
    return out
