"""The single place where exceptions become HTTP responses.

Every error body is ``{"error": "<message>"}`` as the Open Inference Protocol says, with
machine-readable ``code``, ``field`` and ``rule`` beside it. Bad input is always a 4xx: FastAPI's
422 for a malformed body becomes 400 (the protocol's status for an invalid request), and an
unexpected exception is a 500 whose body names no internals.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from tensorbits.refusals import INTERNAL, forget_frames, refusal_of
from tensorbits_protocol.errors import Overloaded, TensorbitsError

logger = logging.getLogger("tensorbits.http")


def error_response(exc: TensorbitsError) -> JSONResponse:
    headers = {"Retry-After": str(exc.retry_after)} if isinstance(exc, Overloaded) else None
    response = JSONResponse(exc.to_dict(), status_code=exc.status_code, headers=headers)
    forget_frames(exc)
    return response


async def _tensorbits_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, TensorbitsError)
    return error_response(exc)


def _location(loc: tuple[int | str, ...]) -> str:
    # FastAPI prefixes "body"/"path"/"query"; the field path after it is what the caller wrote.
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "path", "query") else []
    return ".".join(parts) or ".".join(str(p) for p in loc) or "body"


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0] if exc.errors() else {"loc": ("body",), "msg": "invalid request"}
    field = _location(tuple(first.get("loc", ())))
    message = f"{field}: {first.get('msg', 'invalid value')}"
    body = {"error": message, "code": "invalid_request", "field": field, "rule": first.get("type")}
    forget_frames(exc)
    return JSONResponse(body, status_code=400)


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
    forget_frames(exc)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _out_of_memory(request: Request, exc: Exception) -> JSONResponse:
    # Valid input the backend could not hold (CuPy's OutOfMemoryError is a MemoryError too):
    # a 503 the client may retry, not a 500. Admission is released by the handler's own exit.
    logger.warning("backend out of memory on %s %s", request.method, request.url.path)
    forget_frames(exc)  # its frames hold the arrays it could not fit
    refusal = refusal_of(exc)
    assert refusal is not None  # a MemoryError is one
    return error_response(refusal)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse({"error": INTERNAL, "code": "internal"}, status_code=500)


Handler = Callable[[Request, Exception], Awaitable[Response]]

# Exception class -> the handler that answers it; the most derived class listed wins.
HANDLERS: dict[type[Exception], Handler] = {
    TensorbitsError: _tensorbits_error,
    RequestValidationError: _validation_error,
    StarletteHTTPException: _http_error,
    MemoryError: _out_of_memory,
    Exception: _unexpected,
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
