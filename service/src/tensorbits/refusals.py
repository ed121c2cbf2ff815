"""What an exception is answered with, on every protocol.

A refusal (``TensorbitsError``) is answered as itself: its class carries its HTTP status and its
gRPC code (``tensorbits_protocol.errors.STATUSES``). A few other exceptions are refusals too:
``MemoryError`` (CuPy's ``OutOfMemoryError`` is one) means valid input the backend could not hold
now, answered as BackendFailure (503 / UNAVAILABLE: retry later or send less). Anything else is a
bug, answered as 500 / INTERNAL naming no internals.

``answer_for`` is the one place an exception becomes its answer, on every protocol: HTTP's
exception handlers (``api/errors.py``) and the gRPC calls and streams (``grpc/service.py``,
``grpc/streams.py``) each only send what it returns, its status read from its class
(``errors.STATUSES``). It also logs what needs a log, once: a bug with its traceback, an out of
memory as a warning (the server is short of memory, not the client wrong); a refusal is not,
but its class, rule and field are noted for the call's access-log line (``logs.note_refusal``).
"""

from __future__ import annotations

import logging

from tensorbits.logs import note_refusal
from tensorbits_protocol.errors import BackendFailure, TensorbitsError

OUT_OF_MEMORY = "the backend ran out of memory running this request; retry later or send less"


def forget_frames(exc: BaseException) -> None:
    """Drop the tracebacks of a refusal, once answered, and of what it was raised from.

    A refusal's traceback holds the frames it passed through, and they hold the request's body
    (tens of MiB for a refused batch). Through the event loop's futures and tasks those frames
    sit in reference cycles, so without this the body lives until the garbage collector's next
    full pass: under a stream of refused requests, a sawtooth of resident memory past the
    admission bound. A refusal is never logged with its traceback, so nothing is lost."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        current.__traceback__ = None
        current = current.__cause__ or current.__context__


def refusal_of(exc: BaseException) -> TensorbitsError | None:
    """The refusal ``exc`` is answered with, or None when it is not one (a bug)."""
    if isinstance(exc, TensorbitsError):
        return exc
    if isinstance(exc, MemoryError):
        return BackendFailure(OUT_OF_MEMORY, rule="out_of_memory")
    return None


def answer_for(exc: BaseException, logger: logging.Logger, where: str) -> TensorbitsError:
    """What ``exc``, raised while serving ``where``, is answered with: its refusal, its frames
    let go (``forget_frames``); or, for a bug, an internal error naming nothing of it, the bug
    logged with its traceback to ``logger``. An out of memory is logged as a warning. Either way
    the answer is noted for the call's access-log line."""
    refusal = refusal_of(exc)
    if refusal is None:
        logger.error("unexpected error in %s", where, exc_info=exc)
        internal = TensorbitsError(INTERNAL)
        note_refusal(internal.code, internal.grpc_code, "internal", None)
        return internal
    note_refusal(refusal.code, refusal.grpc_code, refusal.rule, refusal.field)
    if isinstance(exc, MemoryError):
        logger.warning("backend out of memory in %s", where)
    forget_frames(exc)  # a MemoryError's frames hold the arrays it could not fit
    return refusal


INTERNAL = "internal server error"

__all__ = ["INTERNAL", "OUT_OF_MEMORY", "answer_for", "forget_frames", "refusal_of"]
