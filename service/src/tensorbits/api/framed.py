"""One request and its response in the binary extension's framing, on a plain ASGI endpoint
(v2 inference, the /v1 batch): admission, the body, the response, and nothing else per request.

``Exchange`` reads the three request headers the framing needs in one pass, admits the request
for its declared body before a byte is read (many clients declaring large bodies at once get
503s instead of each making the server allocate one), reads the body (``receive_body``: bounded,
timed, decompressed), and sends a response from one buffer. Its grant is released by ``release``
once the last byte is handed to the server: the response buffer is part of what admission bounds.
"""

from __future__ import annotations

from starlette.types import Message, Receive, Scope, Send

from tensorbits.api.body import declared_length, header_values, receive_body
from tensorbits.runtime import Grant, Runtime
from tensorbits_protocol import codec

_HEADER_LENGTH = codec.HEADER_LENGTH.lower().encode()


class Exchange:
    __slots__ = ("encoding", "grant", "header_length_value", "length", "settings")

    def __init__(self, runtime: Runtime, scope: Scope) -> None:
        self.settings = runtime.settings
        length_value, self.encoding, self.header_length_value = header_values(
            scope, b"content-length", b"content-encoding", _HEADER_LENGTH
        )
        # The declared Content-Length (None: a chunked body), refused past the body limit.
        self.length = declared_length(length_value, self.settings.max_body_bytes)
        self.grant: Grant = runtime.admission.acquire(self.length or 0)

    async def receive(self, receive: Receive) -> tuple[bytearray, int | None]:
        """The body and its JSON header's length (None: no Inference-Header-Content-Length, the
        whole body is JSON), checked against each other."""
        settings = self.settings
        body = await receive_body(
            receive, self.length, self.encoding, settings.max_body_bytes, settings.timeout_body_read
        )
        return body, codec.parse_header_length(self.header_length_value, len(body))

    def grow(self, needed: int) -> None:
        """Hold ``needed`` bytes in all while the request runs (or raise Overloaded)."""
        self.grant.grow(needed - self.grant.nbytes)

    @staticmethod
    async def send(
        send: Send, body: bytes | memoryview, media_type: str, header_length: int | None
    ) -> None:
        """A 200 with ``body`` (and its JSON header's length, for a binary body)."""
        headers = [
            (b"content-type", media_type.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        if header_length is not None:
            headers.append((_HEADER_LENGTH, str(header_length).encode()))
        start: Message = {"type": "http.response.start", "status": 200, "headers": headers}
        await send(start)
        await send({"type": "http.response.body", "body": body})

    def release(self) -> None:
        self.grant.release()
