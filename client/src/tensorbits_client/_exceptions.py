"""The exceptions the client raises.

    TensorbitsClientError
    ├── LocalValidationError              the call breaks an operator rule; nothing was sent
    └── APIError                          a request was made (or tried) and failed
        ├── APIConnectionError            no response: refused, reset, DNS, protocol error
        │   └── APITimeoutError           no response in time (connect, read, write or pool)
        ├── APIResponseValidationError    a 2xx response whose body does not follow the framing
        └── APIStatusError                the server answered 4xx/5xx
            ├── BadRequestError           400: the request breaks a protocol or operator rule
            ├── AuthenticationError       401: no API key, or one the server does not accept
            ├── NotFoundError             404: unknown model, operator or route
            ├── PayloadTooLargeError      413: a size limit of the server was passed
            ├── UnprocessableEntityError  422
            ├── RateLimitError            429: retried with backoff before it is raised
            └── InternalServerError       5xx
                └── OverloadedError       503: too much in flight (or the backend failed);
                                               retried with backoff before it is raised

``OverloadedError`` is an ``InternalServerError`` because "the server could not do it now" is
what callers who catch 5xx mean; ``code`` tells an overload (``overloaded``) from a failed backend
(``backend_failure``). ``LocalValidationError`` carries the same message, ``code``, ``field`` and
``rule`` as the ``BadRequestError`` the server would have answered, so catch
``(BadRequestError, LocalValidationError)`` to handle an invalid call either way.

No ``__str__`` here can raise: the message is computed once, when the error is built, and falls
back to the HTTP status text when the body says nothing usable.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import httpx

from tensorbits_protocol.errors import TensorbitsError

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "InternalServerError",
    "LocalValidationError",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "RateLimitError",
    "TensorbitsClientError",
    "UnprocessableEntityError",
]


class TensorbitsClientError(Exception):
    """Base of every exception the client raises on purpose."""

    message: str

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        # Never raise from __str__ (a failing one shows up as "<exception str() failed>").
        try:
            return str(self.message)
        except Exception:
            return type(self).__name__


class LocalValidationError(TensorbitsClientError, ValueError):
    """Raised before sending when a call breaks an operator rule (what the server answers 400)."""

    status_code: ClassVar[Literal[400]] = 400

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid_request",
        field: str | None = None,
        rule: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.field = field
        self.rule = rule

    @classmethod
    def from_protocol(cls, exc: TensorbitsError) -> LocalValidationError:
        """Wrap the shared rule tables' error, keeping its message, code, field and rule."""
        return cls(exc.message, code=exc.code, field=exc.field, rule=exc.rule)


class APIError(TensorbitsClientError):
    """Raised when a request to the server fails; ``body`` is what came back, if anything.

    ``body`` is the decoded JSON when the body was JSON, else its text, else its raw bytes.
    """

    request: httpx.Request
    body: object | None

    def __init__(self, message: str, request: httpx.Request, *, body: object | None) -> None:
        super().__init__(message)
        self.request = request
        self.body = body


def _attempted(reason: str, request: httpx.Request, attempts: int) -> str:
    """``reason`` with the request it was about and how often it was tried: "Connection refused"
    alone does not say which server, nor whether the retries were used."""
    url = request.url
    if url.userinfo:  # a password in the URL stays out of messages and logs
        url = url.copy_with(userinfo=b"")
    tries = "1 attempt" if attempts == 1 else f"{attempts} attempts"
    return f"{reason.rstrip('.')} ({request.method} {url}, {tries})"


class APIConnectionError(APIError):
    """Raised when no response came back: connection refused or reset, DNS, protocol error.

    The message names the URL tried and ``attempts``, how many times it was tried (the first
    attempt and the retries taken); ``reason`` is the message without them."""

    reason: str
    attempts: int

    def __init__(
        self, request: httpx.Request, message: str = "Connection error.", *, attempts: int = 1
    ) -> None:
        super().__init__(_attempted(message, request, attempts), request, body=None)
        self.reason = message
        self.attempts = attempts

    def _set_attempts(self, attempts: int) -> None:
        # The retry loop knows the count only once it gives up, after the error was built.
        self.attempts = attempts
        self.message = _attempted(self.reason, self.request, attempts)
        self.args = (self.message,)


class APITimeoutError(APIConnectionError):
    """Raised when connecting, sending, waiting or reading took longer than the timeout."""

    def __init__(
        self, request: httpx.Request, message: str = "Request timed out.", *, attempts: int = 1
    ) -> None:
        super().__init__(request, message, attempts=attempts)


class APIResponseValidationError(APIError):
    """Raised when a successful response's body does not follow the wire format."""

    def __init__(self, response: httpx.Response, message: str, *, body: object | None) -> None:
        super().__init__(message, response.request, body=body)
        self.response = response
        self.status_code = response.status_code


class APIStatusError(APIError):
    """Raised when the server answers with a 4xx or 5xx status.

    ``code``, ``field`` and ``rule`` are the server's machine-readable error fields (None when
    the body, e.g. a proxy's HTML page, has none).
    """

    response: httpx.Response
    status_code: int
    code: str | None
    field: str | None
    rule: str | None

    def __init__(
        self,
        message: str,
        *,
        response: httpx.Response,
        body: object | None,
        code: str | None = None,
        field: str | None = None,
        rule: str | None = None,
    ) -> None:
        super().__init__(message, response.request, body=body)
        self.response = response
        self.status_code = response.status_code
        self.code = code
        self.field = field
        self.rule = rule


class BadRequestError(APIStatusError):
    """Raised on 400: the request breaks a protocol or operator rule; ``field`` names where."""

    status_code: Literal[400]


class AuthenticationError(APIStatusError):
    """Raised on 401: the server wants an API key (``api_key=`` or ``$TENSORBITS_API_KEY``) and
    got none, or one it does not accept. Not retried: the same key would be refused again."""

    status_code: Literal[401]


class NotFoundError(APIStatusError):
    """Raised on 404: the model, operator or route does not exist."""

    status_code: Literal[404]


class PayloadTooLargeError(APIStatusError):
    """Raised on 413: a body, tensor or count is over a limit of the server."""

    status_code: Literal[413]


class UnprocessableEntityError(APIStatusError):
    """Raised on 422: the server understood the request but cannot process it."""

    status_code: Literal[422]


class RateLimitError(APIStatusError):
    """Raised on 429, after the retries allowed have been used."""

    status_code: Literal[429]


class InternalServerError(APIStatusError):
    """Raised on any 5xx status."""


class OverloadedError(InternalServerError):
    """Raised on 503 after the retries allowed: the server is busy or its backend failed."""

    status_code: Literal[503]
