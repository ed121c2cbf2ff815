"""A refusal as a gRPC client sees it: the status its class carries and the trailing metadata.

A refusal is the same ``TensorbitsError`` with the same words on both protocols, sent as the
gRPC status its class carries (``errors.STATUSES``: one table for both protocols) with trailing
metadata naming the field and the rule, as the HTTP JSON error does. The field is the caller's
words (a tensor's or a parameter's name) and metadata values are printable ASCII: it is
percent-encoded UTF-8 as grpc-message is, a plain ASCII name unchanged. ``Context`` is the
call's context a refusal is aborted through.

Also the call's request id as metadata carries it (``x-request-id``, as HTTP's header), read
as a call begins and sent back in its trailing metadata: a unary call's is the id its line
names (its request's ``id`` once read), a stream's the id of its call (each message's own id is
on its answer and its line).

Its own module because both ways a call ends with a refusal read it: a unary call's
(``service.py``) and a whole stream's (``streams.py``).
"""

from __future__ import annotations

from typing import Any

import grpc

from tensorbits.observability import new_request_id
from tensorbits_protocol.errors import TensorbitsError

Context = grpc.aio.ServicerContext[Any, Any]


def status_code(error: TensorbitsError) -> grpc.StatusCode:
    """The gRPC status of a refusal: the one its class carries (``errors.STATUSES``)."""
    return grpc.StatusCode[error.grpc_code]


def error_metadata(error: TensorbitsError) -> tuple[tuple[str, str], ...]:
    pairs = [("tensorbits-error-code", error.code)]
    if error.field is not None:
        pairs.append(("tensorbits-error-field", _metadata_value(error.field)))
    if error.rule is not None:
        pairs.append(("tensorbits-error-rule", error.rule))
    return tuple(pairs)


_KEPT = frozenset(range(0x20, 0x7F)) - {ord("%")}  # grpc-message's unreserved bytes
_ESCAPES = tuple(chr(b) if b in _KEPT else f"%{b:02X}" for b in range(256))


def _metadata_value(text: str) -> str:
    """A field name as a metadata value: percent-encoded UTF-8, as grpc-message is, so that a
    name outside printable ASCII (the caller's, and may be anything) reads back whole with
    ``urllib.parse.unquote``; bounded to its first 200 characters."""
    return "".join(_ESCAPES[b] for b in text[:200].encode(errors="backslashreplace"))


# The metadata key of a call's request id, as HTTP's header: sent by a client, answered back.
REQUEST_ID_KEY = "x-request-id"


def call_request_id(context: Context) -> str:
    """The id a call begins with: its ``x-request-id`` metadata (bounded and printable, as
    HTTP's header), else a new one. A ModelInfer request's own ``id`` replaces it once read."""
    for key, value in context.invocation_metadata() or ():
        if key == REQUEST_ID_KEY and isinstance(value, str) and value[:128].isprintable():
            return value[:128]
    return new_request_id()


def request_id_metadata(request_id: str) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that tells the client the id its call was logged under (none for
    an id metadata cannot carry: a request's own ``id`` may be any text)."""
    if not request_id or not request_id.isascii():
        return ()
    return ((REQUEST_ID_KEY, request_id),)


__all__ = [
    "REQUEST_ID_KEY",
    "Context",
    "call_request_id",
    "error_metadata",
    "request_id_metadata",
    "status_code",
]
