"""Domain errors shared by the server and the client's local checks.

    TensorbitsError                  (status 500)
    ├── InvalidRequest               (400) names the field and the rule broken
    ├── Unauthorized                 (401) no API key, or not one the server accepts
    ├── OperatorNotFound             (404) unknown model / operator name
    ├── RequestTimeout               (408) the body did not arrive in time
    ├── PayloadTooLarge              (413) a size limit of the server was passed
    ├── UriTooLong                   (414) the request line's target passed the head limit
    ├── HeadTooLarge                 (431) the request line and headers passed the head limit
    ├── Overloaded                   (503) too much work in flight; retry later
    └── BackendFailure               (503) the compute backend failed (e.g. GPU out of memory)

Each class carries its HTTP status as data, so the mapping is tested, not written in prose.
No web framework is imported here.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TensorbitsError(Exception):
    """Base of every error tensorbits raises on purpose."""

    status_code: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, field: str | None = None, rule: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.rule = rule

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body: the protocol's ``error`` string plus machine-readable fields."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        if self.field is not None:
            body["field"] = self.field
        if self.rule is not None:
            body["rule"] = self.rule
        return body


class InvalidRequest(TensorbitsError):
    """Raised when a request breaks a rule of the protocol or of an operator (400)."""

    status_code = 400
    code = "invalid_request"


class Unauthorized(TensorbitsError):
    """Raised when a server with API keys gets a request without one of them (401).

    The message never repeats the key that was sent."""

    status_code = 401
    code = "unauthorized"


class OperatorNotFound(TensorbitsError):
    """Raised when a model or operator name is not one of ours (404)."""

    status_code = 404
    code = "not_found"


class RequestTimeout(TensorbitsError):
    """Raised when a client sends its request body too slowly (408); the connection is closed."""

    status_code = 408
    code = "request_timeout"


class PayloadTooLarge(TensorbitsError):
    """Raised when a body, a tensor or a count is over a configured limit (413)."""

    status_code = 413
    code = "payload_too_large"


class UriTooLong(TensorbitsError):
    """Raised by the HTTP layer when a request's target alone passes the head limit (414)."""

    status_code = 414
    code = "uri_too_long"


class HeadTooLarge(TensorbitsError):
    """Raised by the HTTP layer when a request line and headers pass the head limit (431)."""

    status_code = 431
    code = "request_header_fields_too_large"


class Overloaded(TensorbitsError):
    """Raised when in-flight work is at its bound; the client should retry later (503)."""

    status_code = 503
    code = "overloaded"

    def __init__(self, message: str, *, retry_after: int = 1) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendFailure(TensorbitsError):
    """Raised when the compute backend fails on valid input, e.g. GPU out of memory (503)."""

    status_code = 503
    code = "backend_failure"
