"""Reading request bodies under a byte limit, into one buffer, decompressing if asked.

Starlette's ``Request.body()`` joins a list of chunks (twice the body in memory for a moment)
and has no limit. Here the declared Content-Length is checked before a byte is read, the buffer
is allocated once at that size, a chunked body is bounded as it streams, and a compressed body is
bounded after inflation too.
"""

from __future__ import annotations

import zlib

import anyio
from starlette.requests import ClientDisconnect, Request

from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, RequestTimeout

# zlib's wbits: gzip framing, and deflate as HTTP means it (zlib framing, RFC 9110).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
_INFLATE_STEP = 1 << 20


def _too_large(what: str, size: int | str, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} of {size} bytes exceeds the limit of {limit} bytes (TENSORBITS_MAX_BODY_BYTES)",
        field="body",
        rule="max_body_bytes",
    )


def declared_length(request: Request, limit: int) -> int | None:
    """The Content-Length header as an int, refused past ``limit`` before anything is read."""
    raw = request.headers.get("content-length")
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


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytearray:
    """The whole request body, decompressed, never more than ``limit`` bytes at any stage, and
    all of it within ``timeout`` seconds: a client trickling bytes (slow loris) gets a 408 instead
    of holding its buffer and its admission for ever."""
    length = declared_length(request, limit)
    try:
        with anyio.fail_after(timeout):
            if length is None:
                buffer = await _read_chunked(request, limit)
            else:
                buffer = await _read_declared(request, length)
    except TimeoutError:
        raise RequestTimeout(
            f"request body not received within {timeout:g} s (TENSORBITS_TIMEOUT_BODY_READ)",
            field="body",
            rule="body_read_timeout",
        ) from None
    except ClientDisconnect:
        raise InvalidRequest(
            "client disconnected before the request body was complete",
            field="body",
            rule="truncated",
        ) from None
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity"):
        return buffer
    if encoding not in _WBITS:
        raise InvalidRequest(
            f"Content-Encoding {encoding[:40]!r} is not supported (allowed: gzip, deflate, identity)",
            field="Content-Encoding",
            rule="header",
        )
    return inflate(buffer, encoding, limit)


async def _read_declared(request: Request, length: int) -> bytearray:
    # One allocation of the declared size; chunks are copied straight into place.
    buffer = bytearray(length)
    filled = 0
    with memoryview(buffer) as view:
        async for chunk in request.stream():
            end = filled + len(chunk)
            if end > length:
                raise InvalidRequest(
                    f"request body is longer than its Content-Length {length}",
                    field="Content-Length",
                    rule="body_length",
                )
            view[filled:end] = chunk
            filled = end
    if filled != length:
        raise InvalidRequest(
            f"request body ended after {filled} of its {length} declared bytes",
            field="body",
            rule="truncated",
        )
    return buffer


async def _read_chunked(request: Request, limit: int) -> bytearray:
    # No length to size a buffer from: grow it, but never past the limit.
    buffer = bytearray()
    async for chunk in request.stream():
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
