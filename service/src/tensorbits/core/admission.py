"""Admission: the bytes and requests in flight, bounded; past either bound a request is refused
at once. Every front end admits its requests here (HTTP bodies, gRPC messages, /v1 batches)."""

from __future__ import annotations

from dataclasses import dataclass

from tensorbits_protocol.errors import Overloaded, PayloadTooLarge


@dataclass
class Admission:
    """Bounds the bytes and requests in flight; past either bound a request gets 503 at once.

    Answering at once (instead of queueing) keeps memory bounded and lets a load balancer or the
    client's retry with backoff send the work elsewhere. A request is admitted for what it
    declares before its body is read, and its grant grows once the outputs are known."""

    max_bytes: int
    max_requests: int
    bytes_in_flight: int = 0
    requests_in_flight: int = 0
    # Worker processes sharing the server's bounds (each admits 1/workers of them).
    workers: int = 1

    @property
    def bytes_bound_words(self) -> str:
        """The byte bound as a refusal names it: the server's, or a worker's share of it."""
        if self.workers == 1:
            return f"the server's limit of {self.max_bytes} (TENSORBITS_MAX_INFLIGHT_BYTES)"
        return (
            f"this worker's limit of {self.max_bytes} (TENSORBITS_MAX_INFLIGHT_BYTES shared by "
            f"{self.workers} workers)"
        )

    def _take_bytes(self, nbytes: int) -> None:
        # No await between the check and the increment: on one event loop this is atomic.
        if self.bytes_in_flight + nbytes > self.max_bytes:
            raise Overloaded(
                f"server busy: {self.bytes_in_flight} bytes in flight, this request needs "
                f"{nbytes} more, past {self.bytes_bound_words}; retry later",
                field="request",
                rule="max_inflight_bytes",
            )
        self.bytes_in_flight += nbytes

    def acquire(self, nbytes: int) -> Grant:
        """Admit one request for ``nbytes``, or raise Overloaded; the caller must ``release``
        the grant (``dataplane.Call`` does, once the answer is sent)."""
        if self.requests_in_flight >= self.max_requests:
            raise Overloaded(
                f"server busy: {self.requests_in_flight} requests in flight (limit "
                f"{self.max_requests}, TENSORBITS_MAX_INFLIGHT_REQUESTS); retry later",
                field="request",
                rule="max_inflight_requests",
            )
        self._take_bytes(nbytes)
        self.requests_in_flight += 1
        return Grant(self, nbytes)

    def carry(self, nbytes: int) -> Grant:
        """Count ``nbytes`` already made that outlive the request that made them (a gRPC stream's
        answer, until it is sent), never refused: the caller released the grant that made them
        in the same step of the event loop, so the bound holds. Not a request: only the bytes
        count. The caller must ``release`` the grant once they are gone."""
        self.bytes_in_flight += nbytes
        return Grant(self, nbytes, request=False)


@dataclass(slots=True)
class Grant:
    """What one admitted request holds; ``grow`` asks for more, or raises Overloaded."""

    admission: Admission
    nbytes: int
    released: bool = False
    request: bool = True  # counted in ``requests_in_flight`` too (``carry``'s are not)

    def grow(self, extra: int) -> None:
        if extra > 0:
            self.admission._take_bytes(extra)
            self.nbytes += extra

    def hold(self, needed: int, what: str, parts: str, field: str) -> None:
        """Hold ``needed`` bytes in all while the request runs, or raise: 413 when no idle server
        could ever hold them (a 503 would be retried for ever), Overloaded (503) when this one
        is too busy now. ``what`` needs them for ``parts``; ``field`` is where the caller can
        make it smaller. (Every front end's bound: HTTP's AdmittedRequest, gRPC's ModelInfer.)"""
        bound = self.admission.max_bytes
        if needed > bound:
            raise PayloadTooLarge(
                f"{what} needs {needed} bytes while it runs ({parts}), more than "
                f"{self.admission.bytes_bound_words}",
                field=field,
                rule="max_inflight_bytes",
            )
        self.grow(needed - self.nbytes)

    def release(self) -> None:
        """Give back the request and its bytes; once only, however often it is called."""
        if not self.released:
            self.released = True
            self.admission.requests_in_flight -= self.request
            self.admission.bytes_in_flight -= self.nbytes


__all__ = ["Admission", "Grant"]
