"""One request admitted on a plain ASGI endpoint (v2 inference, the /v1 batch): its admission,
its body, its response in the binary extension's framing, and nothing else per request.

``AdmittedRequest`` is mostly admission: it reads the three request headers the framing needs in
one pass, admits the request for its declared body before a byte is read (many clients declaring
large bodies at once get 503s instead of each making the server allocate one), reads the body
(``receive_body``: bounded, timed, decompressed), and sends a response from the one buffer it
was written into. Its grant goes to the data plane's call (core/dataplane.py), which grows it to
what the plan says the request needs while it runs (413 when no idle server could hold it) and
releases it once the last byte is handed to the server: the response buffer is part of what
admission bounds.

A request whose ``Accept-Encoding`` asks for gzip or deflate gets its response compressed
(``compression.py``), as Triton answers tritonclient's ``response_compression_algorithm``:
``Content-Encoding`` set, ``Content-Length`` the compressed length, and
``Inference-Header-Content-Length`` still the uncompressed JSON header's (the client inflates,
then splits). The compressed copy is admitted too, for its bound before a byte is compressed;
when admission cannot hold it the response goes uncompressed (identity is always acceptable),
never refused for it. Large bodies are compressed off the event loop.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.types import Message, Receive, Scope, Send

from tensorbits.api.body import (
    IDENTITY,
    allocate_body,
    coding_of,
    declared_length,
    header_values,
    receive_body,
    receive_first,
    receive_rest,
)
from tensorbits.api.compression import accepted_coding, compress, compressed_bound
from tensorbits.api.guarded_protocol import BODY_RECEIVED
from tensorbits.core.admission import Admission, Grant
from tensorbits.core.arrival import LOOK_BYTES, Arrival
from tensorbits.core.offload import offload
from tensorbits.deadlines import within_read_deadline
from tensorbits.observability import BODY_INTO, BodyInto
from tensorbits.runtime import Runtime
from tensorbits_protocol import codec
from tensorbits_protocol.errors import Overloaded

_HEADER_LENGTH = codec.HEADER_LENGTH.lower().encode()
# codec.Framed.media_type's values, encoded once (the send runs for every response).
_ENCODED_TYPES = {t: t.encode() for t in (codec.JSON_CONTENT_TYPE, codec.BINARY_CONTENT_TYPE)}
# Bodies up to this size are compressed on the event loop (level 1 runs at about 100 MiB/s and
# more: well under a millisecond); larger ones on a worker thread (offload.py).
COMPRESS_INLINE_MAX_BYTES = 64 << 10
# A declared binary body at least this large is planned from its JSON header while the rest
# arrives (``header_first``): an element-wise answer is then computed as the tensors arrive.
# Below it the whole body arrives in a few milliseconds, and one plan after it costs less.
ARRIVING_MIN_BYTES = 8 << 20


class AdmittedRequest:
    __slots__ = (
        "accept_encoding", "admission", "body_received", "encoding", "grant",
        "header_length_value", "into", "length", "settings",
    )  # fmt: skip

    def __init__(self, runtime: Runtime, scope: Scope) -> None:
        self.settings = runtime.settings
        self.admission: Admission = runtime.plane.admission
        length_value, self.encoding, self.header_length_value, self.accept_encoding = header_values(
            scope, b"content-length", b"content-encoding", _HEADER_LENGTH, b"accept-encoding"
        )
        # The declared Content-Length (None: a chunked body), refused past the body limit.
        self.length = declared_length(length_value, self.settings.max_body_bytes)
        self.grant: Grant = self.admission.acquire(self.length or 0)
        self.body_received: bool = scope.get(BODY_RECEIVED, False)
        # The server's way to read the body into its buffer (None: another ASGI server).
        self.into: BodyInto | None = scope.get(BODY_INTO)

    async def receive(self, receive: Receive) -> tuple[bytearray, int | None]:
        """The body and its JSON header's length (None: no Inference-Header-Content-Length, the
        whole body is JSON), checked against each other."""
        settings = self.settings
        # A body the server has read whole already (guarded_protocol.BODY_RECEIVED, set before
        # the app runs for most small requests) is taken without a deadline: nothing is left
        # to wait for. Any other is read under TENSORBITS_TIMEOUT_BODY_READ.
        timeout = None if self.body_received else settings.timeout_body_read
        body = await receive_body(
            receive, self.length, self.encoding, settings.max_body_bytes, timeout, self.into
        )
        return body, codec.parse_header_length(self.header_length_value, len(body))

    def header_first(self) -> int | None:
        """The JSON header's length of a body that is planned from that header while the rest
        arrives (``receive_planned``): a declared binary body of ``ARRIVING_MIN_BYTES`` or more,
        not compressed, read by the server into the app's buffer and not here whole already;
        None: read it whole first (``receive``). Refused as ``receive`` refuses the header."""
        length = self.length
        if (
            length is None
            or length < ARRIVING_MIN_BYTES
            or self.into is None
            or self.body_received
            or self.header_length_value is None
            or coding_of(self.encoding) not in IDENTITY
        ):
            return None
        header_length = codec.parse_header_length(self.header_length_value, length)
        return header_length if header_length and header_length < length else None

    def allocate(self) -> bytearray:
        """The buffer of a declared body (``header_first``), admitted already."""
        assert self.length is not None
        return allocate_body(self.length)

    async def receive_planned(
        self,
        body: bytearray,
        header_length: int,
        planned: Callable[[], Awaitable[Arrival | None]],
    ) -> Arrival | None:
        """``body`` (``allocate``) read under the read deadline, from its first byte to its last,
        as ``receive`` reads it: its JSON header first, then ``planned()`` (the request planned
        and held from it, and how it is computed as the rest arrives: ``Arrival``; None: once
        it is all in), then the rest, in place, that ``Arrival`` told of every ``LOOK_BYTES``
        in. Every refusal of a body read whole, in its words; returns ``planned``'s."""
        into = self.into
        assert into is not None

        async def read() -> Arrival | None:
            view = memoryview(body)  # not released here: the server may still write it
            first = await receive_first(into, view, header_length)
            arrival = await planned()
            arrived = None if arrival is None else arrival.arrived
            await receive_rest(into, view, first, LOOK_BYTES, arrived)
            return arrival

        return await within_read_deadline(
            read(), self.settings.timeout_body_read, "the request body"
        )

    async def send(self, send: Send, framed: codec.Framed) -> None:
        """A 200 with the framed body (its parts in order; one message when it is one part),
        compressed when the request asked for it and admission can hold the compressed copy."""
        parts, header_length = framed
        # A server response is one buffer: no sum over parts, no loop below.
        length = len(parts[0]) if len(parts) == 1 else sum(map(len, parts))
        headers = [(b"content-type", _ENCODED_TYPES[framed.media_type])]
        coding = accepted_coding(self.accept_encoding) if self.accept_encoding else None
        if coding is not None and self._admit_compressed(length):
            parts = tuple(await offload(length, COMPRESS_INLINE_MAX_BYTES, compress, parts, coding))
            length = sum(map(len, parts))
            headers.append((b"content-encoding", coding.encode()))
            headers.append((b"vary", b"Accept-Encoding"))
        headers.append((b"content-length", str(length).encode()))
        if header_length is not None:
            # The uncompressed JSON header's length, as Triton sends it: clients inflate first.
            headers.append((_HEADER_LENGTH, str(header_length).encode()))
        start: Message = {"type": "http.response.start", "status": 200, "headers": headers}
        await send(start)
        for part in parts[:-1]:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": parts[-1] if parts else b""})

    def _admit_compressed(self, length: int) -> bool:
        """Whether admission holds the compressed copy of a ``length``-byte body too (its
        bound, grown onto this request's grant); False: send the body as it is."""
        extra = compressed_bound(length)
        if self.grant.nbytes + extra > self.admission.max_bytes:
            return False
        try:
            self.grant.grow(extra)
        except Overloaded:
            return False
        return True
