"""Prometheus metrics and the request-id/access-log middleware (pure ASGI, no BaseHTTPMiddleware,
whose per-request task group costs small requests dearly)."""

from __future__ import annotations

import logging
import os
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import accumulate

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tensorbits.logs import request_id_var
from tensorbits.runtime import Runtime
from tensorbits_protocol.operators import REGISTRY

logger = logging.getLogger("tensorbits.access")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class _RouteTally:
    """One route's latency histogram: counts per bucket (not cumulative) and their sum."""

    buckets: list[int]
    seconds: float = 0.0


class RequestTally:
    """Per-request counts as plain ints and floats, exported by ``collect`` at scrape time.

    prometheus_client's own counters and histograms take a lock on every update, four updates
    per request: a few microseconds, a noticeable share of a small request. Here a request adds
    to a list; only the server's event loop thread writes (the middleware runs there), and a
    scrape only reads."""

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.bounds = buckets
        # The exposition's "le" labels: Prometheus writes bucket bounds as floats, then +Inf.
        self.le = [*(str(float(b)) for b in buckets), "+Inf"]
        # (route, model, status) -> [requests, bytes in, bytes out]
        self.requests: dict[tuple[str, str, int], list[int]] = {}
        self.latency: dict[str, _RouteTally] = {}

    def add(self, route: str, model: str, status: int, seconds: float, nin: int, nout: int) -> None:
        counts = self.requests.get((route, model, status))
        if counts is None:
            counts = self.requests[(route, model, status)] = [0, 0, 0]
        counts[0] += 1
        counts[1] += nin
        counts[2] += nout
        tally = self.latency.get(route)
        if tally is None:
            tally = self.latency[route] = _RouteTally([0] * (len(self.bounds) + 1))
        tally.buckets[bisect_left(self.bounds, seconds)] += 1  # le: a bound is inclusive
        tally.seconds += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tensorbits_requests", "HTTP requests by route, model and status",
            labels=["route", "model", "status"],
        )  # fmt: skip
        bytes_in = CounterMetricFamily(
            "tensorbits_request_bytes", "request body bytes received", labels=["route"]
        )
        bytes_out = CounterMetricFamily(
            "tensorbits_response_bytes", "response body bytes sent", labels=["route"]
        )
        per_route: dict[str, list[int]] = {}
        for (route, model, status), (count, nin, nout) in list(self.requests.items()):
            requests.add_metric([route, model, str(status)], count)
            sums = per_route.setdefault(route, [0, 0])
            sums[0] += nin
            sums[1] += nout
        for route, (nin, nout) in per_route.items():
            bytes_in.add_metric([route], nin)
            bytes_out.add_metric([route], nout)
        latency = HistogramMetricFamily(
            "tensorbits_request_duration_seconds", "time from request start to last byte",
            labels=["route"],
        )  # fmt: skip
        for route, tally in list(self.latency.items()):
            cumulative = accumulate(tally.buckets)
            latency.add_metric([route], list(zip(self.le, cumulative, strict=True)), tally.seconds)
        yield from (requests, latency, bytes_in, bytes_out)


@dataclass(frozen=True)
class Metrics:
    """The server's metrics, in a registry of their own (one per app, so tests can build many)."""

    registry: CollectorRegistry
    tally: RequestTally
    inflight_requests: Gauge
    inflight_bytes: Gauge
    backend: Gauge
    device_memory: Gauge

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry()
        tally = RequestTally()
        registry.register(tally)
        return cls(
            registry=registry,
            tally=tally,
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


def _route_label(scope: Scope) -> str:
    """The template of the route that answered (FastAPI's routes and ``FastRoute`` record
    themselves as ``scope["route"]``), else of the mount that did, else ``"unmatched"``."""
    route = scope.get("route")
    if route is not None:
        path: str = route.path
        return path
    # A Mount (fastapi-offline's /static-offline-docs, the docs page's scripts and styles)
    # records no route, only its app as the endpoint: find it among the app's mounts, once per
    # such request, and label it by its template, "/static-offline-docs/{path}", a bounded set.
    endpoint = scope.get("endpoint")
    if endpoint is not None:
        for candidate in getattr(scope.get("app"), "routes", ()):
            if isinstance(candidate, Mount) and candidate.app is endpoint:
                return candidate.path_format
    return "unmatched"


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
            route = _route_label(scope)
            metrics = self.metrics()
            if metrics is not None:
                metrics.tally.add(
                    route, _model_label(scope), counts["status"], elapsed, counts["in"],
                    counts["out"],
                )  # fmt: skip
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
