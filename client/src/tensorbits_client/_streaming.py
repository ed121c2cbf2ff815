"""Moving big bodies through httpx without extra copies.

Sending: the parts of an ``Framed`` are yielded as ``memoryview`` slices of at most
``SEND_CHUNK_BYTES`` (see ``_constants``), with an explicit Content-Length, so httpx streams them
as they are instead of joining them into one ``bytes``.

Receiving: the body is copied chunk by chunk into ONE buffer allocated up front from the
Content-Length (``np.empty``: unlike ``bytearray(n)`` it does not zero 64 MiB first), placed so that
the first byte after the JSON header is 64-byte aligned, which makes the output views aligned.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import numpy as np
import numpy.typing as npt

from tensorbits_client._codec import Body, Framed, FramingError
from tensorbits_client._constants import SEND_CHUNK_BYTES

ALIGNMENT = 64
#: Parts smaller than this are joined with their neighbours before sending (a cheap copy).
COALESCE_BYTES = 64 << 10


def iter_parts(body: Framed, chunk: int = SEND_CHUNK_BYTES) -> Iterator[bytes | memoryview]:
    """The body in pieces of at most ``chunk`` bytes: small parts coalesced (h11 writes each
    piece with its own ``send``, so a small request in four parts cost three extra syscalls and
    packets), large ones sliced without a copy."""
    pending: list[bytes | memoryview] = []
    pending_size = 0
    for part in body.parts:
        size = len(part)
        if size < COALESCE_BYTES and pending_size + size <= chunk:
            pending.append(part)
            pending_size += size
            continue
        if pending:
            yield b"".join(pending)
            pending, pending_size = [], 0
        view = memoryview(part)
        for start in range(0, size, chunk):
            yield view[start : start + chunk]
    if pending_size:
        yield b"".join(pending)


async def aiter_parts(body: Framed) -> AsyncIterator[bytes | memoryview]:
    for part in iter_parts(body):
        yield part


def aligned_buffer(size: int, aligned_at: int) -> tuple[npt.NDArray[np.uint8], int]:
    """An uninitialised buffer of ``size`` bytes and the start offset that puts byte
    ``aligned_at`` of it on an ``ALIGNMENT`` boundary."""
    buffer = np.empty(size + ALIGNMENT, dtype=np.uint8)
    return buffer, -(buffer.ctypes.data + aligned_at) % ALIGNMENT


class BodySink:
    """Collects a response body into one preallocated buffer; without a length, chunks are
    collected and copied into one at the end."""

    def __init__(self, content_length: int | None, header_length: int | None) -> None:
        self._length = content_length
        self._aligned_at = header_length or 0
        self._chunks: list[bytes] = []
        if content_length is None:
            return
        self._buffer, self._start = aligned_buffer(content_length, self._aligned_at)
        self._view = self._buffer.data
        self._filled = self._start

    def feed(self, chunk: bytes) -> None:
        if self._length is None:
            self._chunks.append(chunk)
            return
        end = self._filled + len(chunk)
        if end > self._start + self._length:
            raise FramingError(f"response body is longer than its Content-Length {self._length}")
        self._view[self._filled : end] = chunk
        self._filled = end

    def finish(self) -> Body:
        if self._length is None:
            size = sum(len(c) for c in self._chunks)
            buffer, start = aligned_buffer(size, self._aligned_at)
            offset = start
            for chunk in self._chunks:
                buffer[offset : offset + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
                offset += len(chunk)
            return Body(buffer, start, offset)
        self._view.release()
        if self._filled != self._start + self._length:
            got = self._filled - self._start
            raise FramingError(f"response body ended after {got} of its {self._length} bytes")
        return Body(self._buffer, self._start, self._filled)
