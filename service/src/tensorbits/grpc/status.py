"""A refusal as a gRPC client sees it: the status its class carries and the trailing metadata.

A refusal is the same ``TensorbitsError`` with the same words on both protocols, sent as the
gRPC status its class carries (``errors.STATUSES``: one table for both protocols) with trailing
metadata naming the field and the rule, as the HTTP JSON error does. ``Context`` is the call's
context a refusal is aborted through.

Its own module because both ways a call ends with a refusal read it: a unary call's
(``service.py``) and a whole stream's (``streams.py``).
"""

from __future__ import annotations

from typing import Any

import grpc

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


def _metadata_value(text: str) -> str:
    # Metadata values are printable ASCII; a field name is the caller's and may be anything.
    return "".join(c if " " <= c <= "~" else "?" for c in text[:200])


__all__ = ["Context", "error_metadata", "status_code"]
