"""The single place where exceptions become HTTP responses.

Every error body is ``{"error": "<message>"}`` as the Open Inference Protocol says, with
machine-readable ``code``, ``field`` and ``rule`` beside it. What an exception is answered with,
and its status, is decided where the gRPC front end decides it too: a refusal by its class
(``errors.STATUSES``), any other exception by ``refusals.answer_for`` (out of memory: 503; a
bug: a 500 whose body names no internals). FastAPI's 422 for a malformed body is an
InvalidRequest, 400 (the protocol's status for an invalid request). Only the framework's own
refusals (no route: 404, wrong method: 405) keep the framework's status: no gRPC call has them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from tensorbits.logs import note_refusal
from tensorbits.refusals import answer_for, forget_frames
from tensorbits_protocol.errors import InvalidRequest, Overloaded, TensorbitsError

logger = logging.getLogger("tensorbits.http")


def error_response(exc: TensorbitsError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Overloaded) else None
    response = JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=headers)
    forget_frames(exc)
    return response


async def _tensorbits_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TensorbitsError)
    return error_response(answer_for(exc, logger, request.url.path[:200]))


def _location(loc: tuple[int | str, ...]) -> str:
    # FastAPI prefixes "body"/"path"/"query"; the field path after it is what the caller wrote.
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "path", "query") else []
    return ".".join(parts) or ".".join(str(p) for p in loc) or "body"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
    field = _location(tuple(first.get("loc", ())))
    message = f"{field}: {first.get('msg', 'invalid value')}"
    rule = first.get("type")
    forget_frames(exc)
    refusal = InvalidRequest(message, field=field, rule=rule if isinstance(rule, str) else None)
    return error_response(answer_for(refusal, logger, request.url.path[:200]))


# The framework's own refusals: what part of the request each is about, and the rule.
_HTTP_ERROR_FIELDS: dict[int, tuple[str, str]] = {
    404: ("path", "no_route"),
    405: ("method", "method_not_allowed"),
}


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    detail = exc.detail if isinstance(exc.detail, str) else "request failed"
    if exc.status_code == 404 and detail == "Not Found":
        detail = f"no endpoint at {request.method[:20]} {request.url.path[:200]}"
    elif exc.status_code == 405 and detail == "Method Not Allowed":
        allowed = (exc.headers or {}).get("Allow", "")
        detail = f"{request.method[:20]} is not allowed on {request.url.path[:200]} ({allowed})"
    body: dict[str, str] = {"error": detail, "code": "http_error"}
    if exc.status_code in _HTTP_ERROR_FIELDS:
        body["field"], body["rule"] = _HTTP_ERROR_FIELDS[exc.status_code]
    note_refusal("http_error", "", body.get("rule"), body.get("field"))
    forget_frames(exc)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _answered(request: Request, exc: Exception) -> JSONResponse:
    # What is not a refusal of its own, answered as on every protocol (refusals.answer_for):
    # out of memory (CuPy's OutOfMemoryError is a MemoryError too) a 503 the client may retry,
    # anything else a 500 naming no internals. Admission is released by the handler's own exit.
    where = f"{request.method[:20]} {request.url.path[:200]}"
    return error_response(answer_for(exc, logger, where))


Handler = Callable[[Request, Exception], Awaitable[Response]]

# Exception class -> the handler that answers it; the most derived class listed wins.
HANDLERS: dict[type[Exception], Handler] = {
    TensorbitsError: _tensorbits_error,
    RequestValidationError: _validation_error,
    StarletteHTTPException: _http_error,
    MemoryError: _answered,
    Exception: _answered,
}


def handler_for(exc: Exception) -> Handler | None:
    """The handler ``HANDLERS`` gives ``exc``, short of the catch-all for unexpected errors
    (those propagate, so the server's error middleware answers 500 and logs them)."""
    for cls in type(exc).__mro__:
        if cls is Exception:
            return None
        if cls in HANDLERS:
            return HANDLERS[cls]
    return None


def register_exception_handlers(app: FastAPI) -> None:
    for exc_class, handler in HANDLERS.items():
        app.add_exception_handler(exc_class, handler)
