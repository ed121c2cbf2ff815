"""Domain errors shared by the server and the client's local checks.

    TensorbitsError                  (500, INTERNAL)
    ├── InvalidRequest               (400, INVALID_ARGUMENT) names the field and the rule broken
    │   └── ModelUnavailable         (400, FAILED_PRECONDITION) the model is unloaded
    ├── Unauthorized                 (401, UNAUTHENTICATED) no API key, or not an accepted one
    ├── OperatorNotFound             (404, NOT_FOUND) unknown model / operator name
    ├── RequestTimeout               (408, DEADLINE_EXCEEDED) the body did not arrive in time
    ├── PayloadTooLarge              (413, RESOURCE_EXHAUSTED) a size limit was passed
    ├── UriTooLong                   (414, RESOURCE_EXHAUSTED) the target passed the head limit
    ├── HeadTooLarge                 (431, RESOURCE_EXHAUSTED) the head passed the head limit
    ├── Overloaded                   (503, UNAVAILABLE) too much work in flight; retry later
    └── BackendFailure               (503, UNAVAILABLE) the backend failed (GPU out of memory)

Each class carries its answer on both protocols as data: its HTTP status (``status_code``) and
its gRPC status code (``grpc_code``, the name of a ``grpc.StatusCode``). That is the one table
both front ends answer from (``STATUSES`` lists it), so the two cannot drift; docs/reliability.md
argues each code. No web framework or gRPC library is imported here.
"""

from __future__ import annotations

from typing import Any, ClassVar


class TensorbitsError(Exception):
    """Base of every error tensorbits raises on purpose."""

    status_code: ClassVar[int] = 500
    grpc_code: ClassVar[str] = "INTERNAL"
    code: ClassVar[str] = "internal"

    def __init__(self, message: str, *, field: str | None = None, rule: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.rule = rule

    def __init_subclass__(
        cls, *, status_code: int, grpc_code: str, code: str, **kwargs: Any
    ) -> None:
        # Each class states its answer on both protocols in its header, as a row of STATUSES.
        super().__init_subclass__(**kwargs)
        cls.status_code = status_code
        cls.grpc_code = grpc_code
        cls.code = code

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body: the protocol's ``error`` string plus machine-readable fields."""
        body: dict[str, Any] = {"error": self.message, "code": self.code}
        if self.field is not None:
            body["field"] = self.field
        if self.rule is not None:
            body["rule"] = self.rule
        return body


class InvalidRequest(
    TensorbitsError, status_code=400, grpc_code="INVALID_ARGUMENT", code="invalid_request"
):
    """Raised when a request breaks a rule of the protocol or of an operator (400)."""


class ModelUnavailable(
    InvalidRequest, status_code=400, grpc_code="FAILED_PRECONDITION", code="model_unavailable"
):
    """Raised when a request names a model that is unloaded (the model repository extension).

    HTTP 400, as before the gRPC twin existed and as a probe's "not ready" must be (4xx); gRPC
    FAILED_PRECONDITION, HTTP 400's canonical twin for a request that is valid but needs the
    server in another state: here a load. Not UNAVAILABLE (Triton's code), which gRPC clients
    retry automatically against a server that will keep refusing until someone loads it."""


class Unauthorized(
    TensorbitsError, status_code=401, grpc_code="UNAUTHENTICATED", code="unauthorized"
):
    """Raised when a server with API keys gets a request without one of them (401).

    The message never repeats the key that was sent."""


class OperatorNotFound(TensorbitsError, status_code=404, grpc_code="NOT_FOUND", code="not_found"):
    """Raised when a model or operator name is not one of ours (404)."""


class RequestTimeout(
    TensorbitsError, status_code=408, grpc_code="DEADLINE_EXCEEDED", code="request_timeout"
):
    """Raised when a client sends its request body too slowly (408); the connection is closed."""


class PayloadTooLarge(
    TensorbitsError, status_code=413, grpc_code="RESOURCE_EXHAUSTED", code="payload_too_large"
):
    """Raised when a body, a tensor or a count is over a configured limit (413)."""


class UriTooLong(
    TensorbitsError, status_code=414, grpc_code="RESOURCE_EXHAUSTED", code="uri_too_long"
):
    """Raised by the HTTP layer when a request's target alone passes the head limit (414)."""


class HeadTooLarge(
    TensorbitsError,
    status_code=431,
    grpc_code="RESOURCE_EXHAUSTED",
    code="request_header_fields_too_large",
):
    """Raised by the HTTP layer when a request line and headers pass the head limit (431)."""


class Overloaded(TensorbitsError, status_code=503, grpc_code="UNAVAILABLE", code="overloaded"):
    """Raised when in-flight work is at its bound; the client should retry later (503)."""

    def __init__(self, message: str, *, field: str, rule: str, retry_after: int = 1) -> None:
        # A refusal under load names its bound as every other refusal does: which count (field)
        # passed which limit (rule), so a client and a log line can tell the two apart.
        super().__init__(message, field=field, rule=rule)
        self.retry_after = retry_after


class BackendFailure(
    TensorbitsError, status_code=503, grpc_code="UNAVAILABLE", code="backend_failure"
):
    """Raised when the compute backend fails on valid input, e.g. GPU out of memory (503)."""


def _classes(root: type[TensorbitsError]) -> list[type[TensorbitsError]]:
    return [root, *(c for sub in root.__subclasses__() for c in _classes(sub))]


STATUSES: dict[type[TensorbitsError], tuple[int, str]] = {
    cls: (cls.status_code, cls.grpc_code) for cls in _classes(TensorbitsError)
}
"""Every error class, and its answer: (HTTP status, gRPC status code name)."""
