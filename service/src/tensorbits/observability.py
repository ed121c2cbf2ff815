"""Prometheus metrics and the request-id/access-log middleware (pure ASGI, no BaseHTTPMiddleware,
whose per-request task group costs small requests dearly)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tensorbits.logs import request_id_var
from tensorbits.runtime import Runtime
from tensorbits_protocol.operators import REGISTRY

logger = logging.getLogger("tensorbits.access")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass(frozen=True)
class Metrics:
    """The server's metrics, in a registry of their own (one per app, so tests can build many)."""

    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    bytes_in: Counter
    bytes_out: Counter
    inflight_requests: Gauge
    inflight_bytes: Gauge
    backend: Gauge
    device_memory: Gauge
    _children: dict[tuple[str, str, int], tuple[Any, Any, Any, Any]] = field(default_factory=dict)

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            requests=Counter(
                "tensorbits_requests", "HTTP requests by route, model and status",
                ["route", "model", "status"], registry=registry,
            ),
            latency=Histogram(
                "tensorbits_request_duration_seconds", "time from request start to last byte",
                ["route"], buckets=LATENCY_BUCKETS, registry=registry,
            ),
            bytes_in=Counter(
                "tensorbits_request_bytes", "request body bytes received", ["route"],
                registry=registry,
            ),
            bytes_out=Counter(
                "tensorbits_response_bytes", "response body bytes sent", ["route"],
                registry=registry,
            ),
            inflight_requests=Gauge(
                "tensorbits_inflight_requests", "requests admitted and not yet finished",
                registry=registry,
            ),
            inflight_bytes=Gauge(
                "tensorbits_inflight_bytes", "bytes reserved by admitted requests",
                registry=registry,
            ),
            backend=Gauge(
                "tensorbits_backend_info", "the compute backend in use (value 1)",
                ["backend", "device", "reason"], registry=registry,
            ),
            device_memory=Gauge(
                "tensorbits_device_memory_bytes", "device memory held by the backend's pool "
                "(CuPy only)", registry=registry,
            ),
        )  # fmt: skip

    def children(self, route: str, model: str, status: int) -> tuple[Any, Any, Any, Any]:
        """The labelled series of one (route, model, status), looked up once and then cached:
        ``labels()`` costs a few microseconds, four times per request otherwise."""
        key = (route, model, status)
        found = self._children.get(key)
        if found is None:
            found = (
                self.requests.labels(route, model, str(status)),
                self.latency.labels(route),
                self.bytes_in.labels(route),
                self.bytes_out.labels(route),
            )
            self._children[key] = found
        return found

    def bind_runtime(self, runtime: Runtime) -> None:
        """Gauges read live from the runtime at scrape time."""
        backend = runtime.selection.backend
        self.backend.labels(backend.name, backend.device, runtime.selection.reason).set(1)
        admission = runtime.admission
        self.inflight_requests.set_function(lambda: admission.requests_in_flight)
        self.inflight_bytes.set_function(lambda: admission.bytes_in_flight)
        self.device_memory.set_function(lambda: float(backend.memory_in_use() or 0))


def _model_label(scope: Scope) -> str:
    # Only names of real operators become label values: a caller cannot blow up cardinality.
    model = scope.get("path_params", {}).get("model")
    if model is None:
        return ""
    return model if model in REGISTRY else "unknown"


class ObservabilityMiddleware:
    """Gives every request an id (echoing ``X-Request-ID``), counts and times it, logs one line."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], Metrics | None]) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _header(scope, b"x-request-id") or os.urandom(16).hex()
        token = request_id_var.set(request_id)
        start = time.perf_counter()
        counts = {"in": 0, "out": 0, "status": 500}

        async def receive_counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                counts["in"] += len(message.get("body", b""))
            return message

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                counts["status"] = message["status"]
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", request_id.encode()),
                ]
            elif message["type"] == "http.response.body":
                counts["out"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive_counted, send_tagged)
        finally:
            elapsed = time.perf_counter() - start
            route = getattr(scope.get("route"), "path", "unmatched")
            metrics = self.metrics()
            if metrics is not None:
                requests, latency, bytes_in, bytes_out = metrics.children(
                    route, _model_label(scope), counts["status"]
                )
                requests.inc()
                latency.observe(elapsed)
                bytes_in.inc(counts["in"])
                bytes_out.inc(counts["out"])
            if logger.isEnabledFor(logging.INFO):
                self._log(scope, counts, route, elapsed)
            request_id_var.reset(token)

    @staticmethod
    def _log(scope: Scope, counts: dict[str, int], route: str, elapsed: float) -> None:
        logger.info(
            "%s %s %d",
            scope["method"],
            scope["path"],
            counts["status"],
            extra={
                "status": counts["status"],
                "route": route,
                "duration_ms": round(elapsed * 1000, 3),
                "bytes_in": counts["in"],
                "bytes_out": counts["out"],
            },
        )


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            # Bounded and printable only: the id goes into logs and back into a header.
            text = value[:128].decode("latin-1")
            return text if text.isprintable() else None
    return None
