"""What a running server holds: its settings, its backend, and the admission bound."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from tensorbits.backends import Selection, select_backend
from tensorbits.config import Settings
from tensorbits_protocol.errors import Overloaded


@dataclass
class Admission:
    """Bounds the bytes and requests in flight; past either bound a request gets 503 at once.

    Answering at once (instead of queueing) keeps memory bounded and lets a load balancer or the
    client's retry with backoff send the work elsewhere."""

    max_bytes: int
    max_requests: int
    bytes_in_flight: int = 0
    requests_in_flight: int = 0

    @asynccontextmanager
    async def admit(self, nbytes: int) -> AsyncIterator[None]:
        # No await between the checks and the increments: on one event loop this is atomic.
        if self.requests_in_flight >= self.max_requests:
            raise Overloaded(
                f"server busy: {self.requests_in_flight} requests in flight "
                f"(limit {self.max_requests}); retry later"
            )
        if self.bytes_in_flight + nbytes > self.max_bytes:
            raise Overloaded(
                f"server busy: {self.bytes_in_flight} bytes in flight, this request needs "
                f"{nbytes} more (limit {self.max_bytes}); retry later"
            )
        self.requests_in_flight += 1
        self.bytes_in_flight += nbytes
        try:
            yield
        finally:
            self.requests_in_flight -= 1
            self.bytes_in_flight -= nbytes


# Set when the process is told to stop (SIGTERM): readiness turns false first, so a load balancer
# stops sending work while the requests already in flight finish.
DRAINING = threading.Event()


@dataclass
class Runtime:
    settings: Settings
    selection: Selection
    admission: Admission
    started: bool = True

    @property
    def ready(self) -> bool:
        return self.started and not DRAINING.is_set()

    @classmethod
    def start(cls, settings: Settings) -> Runtime:
        selection = select_backend(
            settings.backend, device_id=settings.device_id, cpu_threads=settings.cpu_threads
        )
        return cls(
            settings=settings,
            selection=selection,
            admission=Admission(settings.max_inflight_bytes, settings.max_inflight_requests),
        )

    def close(self) -> None:
        self.started = False
        self.selection.backend.close()
