"""Prometheus metrics and the request-id/access-log middleware (pure ASGI, no BaseHTTPMiddleware,
whose per-request task group costs small requests dearly).

Every request is counted and logged by one function, whatever its protocol (``record_call``):
the HTTP middleware here calls it as a request ends, the gRPC service as a call (or a stream's
message) is answered, so /metrics and the access log read alike for both.

With several worker processes (``tensorbits serve --workers N``, ``workers.py``) every worker
publishes its request tally and in-flight gauges to a folder the supervisor made, once a second
(``WorkerShare``), and a scrape, whichever worker answers it, adds up its own live figures and
the others' published ones: ``/metrics`` is the whole server's, the others' counts at most a
second old. prometheus_client's multiprocess mode would do the adding with a locked mmap write per
update (four per request, on every request); publishing a snapshot costs nothing per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import re
import time
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from starlette.routing import Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tensorbits.core.models import MODEL_VERSION, Model
from tensorbits.logs import (
    CallNote,
    begin_call,
    call_var,
    log_fields,
    note_model,
    note_refusal,
)
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import TensorbitsError
from tensorbits_protocol.operators import OPERATORS, REGISTRY

logger = logging.getLogger("tensorbits.access")

# A refusal's rule as the server names its rules (``max_body_bytes``, ``http_syntax``): only
# such names become label values, at most MAX_RULE_LABELS of them ("other" past it), so the
# refusals' series stay bounded whatever a rule name were made of.
RULE_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")
MAX_RULE_LABELS = 256

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


@dataclass
class _RouteTally:
    """One route's latency histogram: counts per bucket (not cumulative) and their sum."""

    buckets: list[int]
    seconds: float = 0.0


def _builtin_version(name: str) -> str | None:
    """The version a built-in model (an operator) is served at; None for any other name."""
    return MODEL_VERSION if name in REGISTRY else None


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
        # (route, model, status, protocol, version) -> [requests, bytes in, bytes out]
        self.requests: dict[tuple[str, str, int, str, str], list[int]] = {}
        # (protocol, model, status, rule, version) -> refusals (``refuse``)
        self.refusals: dict[tuple[str, str, int, str, str], int] = {}
        self.latency: dict[str, _RouteTally] = {}
        self.share: WorkerShare | None = None  # set by Metrics.create in a worker process
        # The version a name's model is served at, None where it names no model this server
        # serves (graph models too, once the runtime is bound): only served models and their
        # versions become label values, so a caller cannot blow up cardinality.
        self.served_version: Callable[[str], str | None] = _builtin_version
        self.rules: set[str] = set()  # the rule label values given so far (``rule_label``)

    def model_label(self, name: str) -> tuple[str, str]:
        """The ``model`` and ``version`` labels of a call naming ``name``: the model and the
        version it is served at; ("", "") when it names none, ("unknown", "") one not served."""
        if not name:
            return "", ""
        version = self.served_version(name)
        return (name, version) if version is not None else ("unknown", "")

    def add(
        self,
        route: str,
        model: str,
        status: int,
        seconds: float,
        nin: int,
        nout: int,
        protocol: str = "http",
        version: str = "",
    ) -> None:
        key = (route, model, status, protocol, version)
        counts = self.requests.get(key)
        if counts is None:
            counts = self.requests[key] = [0, 0, 0]
        counts[0] += 1
        counts[1] += nin
        counts[2] += nout
        tally = self.latency.get(route)
        if tally is None:
            tally = self.latency[route] = _RouteTally([0] * (len(self.bounds) + 1))
        tally.buckets[bisect_left(self.bounds, seconds)] += 1  # le: a bound is inclusive
        tally.seconds += seconds

    def refuse(
        self, protocol: str, model: str, status: int, rule: str | None, version: str = ""
    ) -> None:
        """Count one refusal (``model`` and ``version`` labels, ``model_label``'s) under its
        ``rule`` (``rule_label``: the server's own names, bounded)."""
        key = (protocol, model, status, self.rule_label(rule), version)
        self.refusals[key] = self.refusals.get(key, 0) + 1

    def rule_label(self, rule: str | None) -> str:
        """The ``rule`` label of a refusal's rule: "" for none; a name of the server's own rules
        (``RULE_NAME``) as it is, up to ``MAX_RULE_LABELS`` of them; anything else "other"."""
        if rule is None:
            return ""
        if rule in self.rules:
            return rule
        if len(self.rules) >= MAX_RULE_LABELS or RULE_NAME.fullmatch(rule) is None:
            return "other"
        self.rules.add(rule)
        return rule

    def snapshot(self) -> dict[str, Any]:
        """The counts as JSON: what a worker publishes for the others (``WorkerShare``)."""
        return {
            "requests": [[*key, *counts] for key, counts in list(self.requests.items())],
            "refusals": [[*key, count] for key, count in list(self.refusals.items())],
            "latency": [
                [route, tally.buckets, tally.seconds] for route, tally in list(self.latency.items())
            ],
        }

    def merged(self, others: list[dict[str, Any]]) -> RequestTally:
        """This tally plus the ``others``' snapshots: a new tally, for one exposition."""
        total = RequestTally(self.bounds)
        total.requests = {key: list(counts) for key, counts in list(self.requests.items())}
        total.refusals = dict(self.refusals)
        total.latency = {
            route: _RouteTally(list(t.buckets), t.seconds)
            for route, t in list(self.latency.items())
        }
        for snapshot in others:
            for route, model, status, protocol, version, *counts in snapshot["requests"]:
                row = total.requests.setdefault(
                    (route, model, status, protocol, version), [0, 0, 0]
                )
                for i, count in enumerate(counts):
                    row[i] += count
            for protocol, model, status, rule, version, count in snapshot.get("refusals", ()):
                key = (protocol, model, status, rule, version)
                total.refusals[key] = total.refusals.get(key, 0) + count
            for route, buckets, seconds in snapshot["latency"]:
                tally = total.latency.setdefault(route, _RouteTally([0] * len(buckets)))
                tally.buckets = [a + b for a, b in zip(tally.buckets, buckets, strict=True)]
                tally.seconds += seconds
        return total

    def collect(self) -> Iterator[Metric]:
        share = self.share
        if share is not None:
            yield from self.merged(share.others_tallies()).exposition()
        else:
            yield from self.exposition()

    def exposition(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "tensorbits_requests", "requests (HTTP) and calls (gRPC) by route, model, the "
            "version served, status and protocol",
            labels=["route", "model", "version", "status", "protocol"],
        )  # fmt: skip
        bytes_in = CounterMetricFamily(
            "tensorbits_request_bytes", "request body bytes received", labels=["route", "protocol"]
        )
        bytes_out = CounterMetricFamily(
            "tensorbits_response_bytes", "response body bytes sent", labels=["route", "protocol"]
        )
        refused = CounterMetricFamily(
            "tensorbits_refusals", "refused requests and calls by protocol, model, the version "
            "served, status and the rule they broke",
            labels=["protocol", "model", "version", "status", "rule"],
        )  # fmt: skip
        per_route: dict[tuple[str, str], list[int]] = {}
        for (route, model, status, protocol, version), (count, nin, nout) in list(
            self.requests.items()
        ):
            requests.add_metric([route, model, version, str(status), protocol], count)
            sums = per_route.setdefault((route, protocol), [0, 0])
            sums[0] += nin
            sums[1] += nout
        for (route, protocol), (nin, nout) in per_route.items():
            bytes_in.add_metric([route, protocol], nin)
            bytes_out.add_metric([route, protocol], nout)
        for (protocol, model, status, rule, version), count in list(self.refusals.items()):
            refused.add_metric([protocol, model, version, str(status), rule], count)
        latency = HistogramMetricFamily(
            "tensorbits_request_duration_seconds", "time from request start to last byte",
            labels=["route"],
        )  # fmt: skip
        for route, tally in list(self.latency.items()):
            cumulative = accumulate(tally.buckets)
            latency.add_metric([route], list(zip(self.le, cumulative, strict=True)), tally.seconds)
        yield from (requests, latency, bytes_in, bytes_out, refused)


# Set in a worker process before its app is built (``share_with_workers``): where the workers
# publish their figures. None: one process, no sharing.
_SHARED_FOLDER: Path | None = None
PUBLISH_EVERY_S = 1.0


def share_with_workers(folder: Path | None) -> None:
    """Make this process's metrics (``Metrics.create`` from now on) one worker's share of the
    server's, published in ``folder``, where the other workers publish theirs."""
    global _SHARED_FOLDER
    _SHARED_FOLDER = folder


class WorkerShare:
    """One worker's figures, published as ``<pid>.json`` in the workers' folder, and the other
    workers' figures, read from theirs at scrape time. A worker that exited leaves its file: its
    counts stay in the sums (counters never go down); its gauges (what it had in flight) do not
    count once its process is gone."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pid = os.getpid()
        self.path = folder / f"{self.pid}.json"
        self._timer: asyncio.TimerHandle | None = None
        self._gauges: dict[str, Callable[[], float]] = {}
        self._statistics: Callable[[], dict[str, list[int]]] = dict

    def start(
        self,
        tally: RequestTally,
        gauges: dict[str, Callable[[], float]],
        statistics: Callable[[], dict[str, list[int]]],
    ) -> None:
        """Publish ``tally``, ``gauges`` and the inference ``statistics`` (``Statistics.snapshot``)
        now and every ``PUBLISH_EVERY_S`` seconds on the running loop (until it stops)."""
        self._tally, self._gauges, self._statistics = tally, gauges, statistics
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.publish()
            self._timer = loop.call_later(PUBLISH_EVERY_S, tick)

        tick()

    def publish(self) -> None:
        tally = getattr(self, "_tally", None)
        if tally is None:
            return  # not started: the worker's runtime never came up
        gauges = {name: read() for name, read in self._gauges.items()}
        document = {
            "pid": self.pid,
            "tally": tally.snapshot(),
            "gauges": gauges,
            "statistics": self._statistics(),
        }
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(document))
        partial.replace(self.path)  # atomic: a reader sees the old file or the new one

    def others(self) -> list[dict[str, Any]]:
        found = []
        for path in self.folder.glob("*.json"):
            if path == self.path:
                continue
            with contextlib.suppress(OSError, ValueError):  # a worker's file being replaced
                found.append(json.loads(path.read_text()))
        return found

    def others_tallies(self) -> list[dict[str, Any]]:
        return [document["tally"] for document in self.others()]

    def live_others(self) -> list[dict[str, Any]]:
        return [document for document in self.others() if _alive(document["pid"])]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PlacementCounts:
    """``tensorbits_placements_total``: where a CuPy server's work computed, by work kind
    (operator, graph, batch) and place (host, device), as ``TENSORBITS_PLACEMENT`` decided it
    (core/backends/placement.py). Read from the data plane's backend at each scrape; no samples
    where it does not place (a NumPy server, or placement ``device``: all on the device). A GPU
    server runs one worker per device, so this worker's counts are the server's."""

    def __init__(self) -> None:
        # Set once the runtime exists (``Metrics.bind_runtime``).
        self.counts: Callable[[], dict[tuple[str, str], int] | None] = lambda: None

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "tensorbits_placements",
            "work placed by TENSORBITS_PLACEMENT, by kind of work and where it computed",
            labels=["work", "place"],
        )
        for (work, place), count in sorted((self.counts() or {}).items()):
            family.add_metric([work, place], count)
        yield family


@dataclass(frozen=True)
class Metrics:
    """The server's metrics, in a registry of their own (one per app, so tests can build many)."""

    registry: CollectorRegistry
    tally: RequestTally
    inflight_requests: Gauge
    inflight_bytes: Gauge
    inflight_requests_limit: Gauge
    inflight_bytes_limit: Gauge
    backend: Gauge
    device_memory: Gauge
    workers: Gauge
    placements: PlacementCounts

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry()
        tally = RequestTally()
        if _SHARED_FOLDER is not None:
            tally.share = WorkerShare(_SHARED_FOLDER)
        registry.register(tally)
        placements = PlacementCounts()
        registry.register(placements)
        return cls(
            registry=registry,
            tally=tally,
            placements=placements,
            inflight_requests=Gauge(
                "tensorbits_inflight_requests", "requests admitted and not yet finished",
                registry=registry,
            ),
            inflight_bytes=Gauge(
                "tensorbits_inflight_bytes", "bytes reserved by admitted requests",
                registry=registry,
            ),
            inflight_requests_limit=Gauge(
                "tensorbits_inflight_requests_limit", "requests admission lets in flight at "
                "once (TENSORBITS_MAX_INFLIGHT_REQUESTS: with workers, the sum of their shares)",
                registry=registry,
            ),
            inflight_bytes_limit=Gauge(
                "tensorbits_inflight_bytes_limit", "bytes admission lets admitted requests "
                "reserve at once (TENSORBITS_MAX_INFLIGHT_BYTES: with workers, the sum of "
                "their shares)", registry=registry,
            ),
            backend=Gauge(
                "tensorbits_backend_info", "the compute backend in use (value 1)",
                ["backend", "device", "reason"], registry=registry,
            ),
            device_memory=Gauge(
                "tensorbits_device_memory_bytes", "device memory held by the backend's pool "
                "(CuPy only)", registry=registry,
            ),
            workers=Gauge(
                "tensorbits_worker_processes", "worker processes whose figures these add up",
                registry=registry,
            ),
        )  # fmt: skip

    @property
    def workers_folder(self) -> Path | None:
        """The folder this worker shares with the server's others (``share_with_workers``),
        where the model store is kept too (``model_store.py``); None in a server of one
        process."""
        share = self.tally.share
        return None if share is None else share.folder

    def bind_runtime(self, runtime: Runtime) -> None:
        """Gauges read live from the runtime at scrape time."""
        backend = runtime.selection.backend
        graphs = runtime.plane.graphs

        def served_version(name: str) -> str | None:
            graph = graphs.get(name)
            return graph.version if graph is not None else _builtin_version(name)

        self.tally.served_version = served_version
        self.backend.labels(backend.name, backend.device, runtime.selection.reason).set(1)
        plane = runtime.plane

        def placements() -> dict[tuple[str, str], int] | None:
            counts: Callable[[], dict[tuple[str, str], int]] | None = getattr(
                plane.backend, "counts", None
            )
            return None if counts is None else counts()

        self.placements.counts = placements
        admission = runtime.plane.admission
        own: dict[str, Callable[[], float]] = {
            "inflight_requests": lambda: admission.requests_in_flight,
            "inflight_bytes": lambda: admission.bytes_in_flight,
            # Each worker admits its share of the bounds (``Admission.workers``): summed like
            # the in-flight figures, the bound those figures are held to.
            "inflight_requests_limit": lambda: admission.max_requests,
            "inflight_bytes_limit": lambda: admission.max_bytes,
            "device_memory": lambda: float(backend.memory_in_use() or 0),
        }
        share = self.tally.share
        if share is None:
            self.inflight_requests.set_function(own["inflight_requests"])
            self.inflight_bytes.set_function(own["inflight_bytes"])
            self.inflight_requests_limit.set_function(own["inflight_requests_limit"])
            self.inflight_bytes_limit.set_function(own["inflight_bytes_limit"])
            self.device_memory.set_function(own["device_memory"])
            self.workers.set(1)
            return

        def summed(name: str) -> Callable[[], float]:
            mine = own[name]
            return lambda: mine() + sum(d["gauges"].get(name, 0) for d in share.live_others())

        self.inflight_requests.set_function(summed("inflight_requests"))
        self.inflight_bytes.set_function(summed("inflight_bytes"))
        self.inflight_requests_limit.set_function(summed("inflight_requests_limit"))
        self.inflight_bytes_limit.set_function(summed("inflight_bytes_limit"))
        self.device_memory.set_function(summed("device_memory"))
        self.workers.set_function(lambda: 1 + len(share.live_others()))
        share.start(self.tally, own, runtime.plane.statistics.snapshot)

    def other_workers_statistics(self) -> list[dict[str, list[int]]]:
        """The inference statistics the server's other workers published (``Statistics.snapshot``
        each, at most a second old), for ``Statistics.response(..., others=...)``; none in a
        server of one process."""
        share = self.tally.share
        if share is None:
            return []
        return [document.get("statistics", {}) for document in share.others()]

    def publish(self) -> None:
        """Publish this worker's figures now (a worker does once a second, and as it exits)."""
        if self.tally.share is not None:
            self.tally.share.publish()

    def exposition(self, runtime: Runtime | None) -> bytes:
        """What ``GET /metrics`` answers: the registry's metrics, then Triton's per-model ones
        (``triton_exposition``) from ``runtime``'s statistics with the other workers' added in
        (none before the runtime exists)."""
        text = generate_latest(self.registry)
        if runtime is None:
            return text
        models: list[Model] = [*OPERATORS, *runtime.plane.graphs.models()]
        document = runtime.plane.statistics.response(models, self.other_workers_statistics())
        return text + triton_exposition(document["model_stats"])


# Triton's per-model inference metrics, beside tensorbits' own, so that what scrapes Triton
# (dashboards, alerts, autoscalers) reads this server unchanged: Triton's names, its labels
# (model, version; failures also by reason) and units (durations in microseconds, successful
# requests only), from the statistics extension's figures (core/statistics.py), every worker's.
# Each: the name, its help, and where its value is in one model's ModelStatistics document.
TRITON_COUNTERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("nv_inference_request_success", "Successful inference requests",
     ("inference_stats", "success", "count")),
    ("nv_inference_request_failure", "Failed inference requests (every failure here is "
     "reason OTHER: refused, or failed while running)", ("inference_stats", "fail", "count")),
    ("nv_inference_count", "Inferences performed (no model here batches: one per request)",
     ("inference_count",)),
    ("nv_inference_exec_count", "Model executions (one per request)", ("execution_count",)),
    ("nv_inference_request_duration_us", "Time of the successful requests in the server, "
     "microseconds", ("inference_stats", "success", "ns")),
    ("nv_inference_queue_duration_us", "Time the successful requests waited for admission, "
     "microseconds", ("inference_stats", "queue", "ns")),
    ("nv_inference_compute_input_duration_us", "Time the successful requests took to decode "
     "and check their inputs, microseconds", ("inference_stats", "compute_input", "ns")),
    ("nv_inference_compute_infer_duration_us", "Time the successful requests took to compute, "
     "microseconds", ("inference_stats", "compute_infer", "ns")),
    ("nv_inference_compute_output_duration_us", "Time the successful requests took to hand "
     "their outputs on, microseconds", ("inference_stats", "compute_output", "ns")),
)  # fmt: skip
# Triton labels a failure by why it failed; its catch-all is this one's every failure.
FAILURE_REASON = "OTHER"


def triton_exposition(model_stats: Iterable[Mapping[str, Any]]) -> bytes:
    """Triton's per-model counters (``TRITON_COUNTERS``) in the Prometheus text format, from
    the statistics extension's ``model_stats`` entries. Written here rather than through
    prometheus_client, which would name each counter ``..._total``: Triton's names have no
    suffix, and a scraper's queries name them as Triton writes them."""
    stats = list(model_stats)
    lines = []
    for name, help_text, path in TRITON_COUNTERS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for entry in stats:
            value: Any = entry
            for key in path:
                value = value[key]
            if name.endswith("_us"):
                value //= 1000  # nanoseconds counted, microseconds shown
            labels = {"model": entry["name"], "version": entry["version"]}
            if name == "nv_inference_request_failure":
                labels["reason"] = FAILURE_REASON
            text = ",".join(f'{key}="{_label_value(v)}"' for key, v in sorted(labels.items()))
            lines.append(f"{name}{{{text}}} {value}")
    return ("\n".join(lines) + "\n").encode()


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _note_path_model(scope: Scope) -> None:
    """The model (and version) an HTTP request's path names, noted for its access-log line."""
    path = scope.get("path_params", {})
    model = path.get("model")
    if isinstance(model, str):
        version = path.get("version")
        # The version the model is served at, where the endpoint resolved it (logs.note_version).
        note = call_var.get()
        served = note.version if note is not None else ""
        note_model(model, served or (version if isinstance(version, str) else ""))


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else ""


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
        request_id = _header(scope, b"x-request-id") or new_request_id()
        end_call = begin_call(request_id, _client(scope))
        start = time.perf_counter()
        counts = {"in": 0, "out": 0, "status": 500}
        id_header = (b"x-request-id", request_id.encode())

        async def receive_counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                counts["in"] += len(message.get("body", b""))
            return message

        into = scope.get(BODY_INTO)
        if into is not None:  # the server reads the body into the app's buffer: counted here

            async def into_counted(view: memoryview, until: int | None = None) -> tuple[int, bool]:
                filled, ended = await into(view, until)
                # Called again as a body arrives (``until``): the bytes in so far, counted once.
                counts["in"] = max(counts["in"], min(filled, len(view)))
                return filled, ended

            scope[BODY_INTO] = into_counted

        async def send_tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                counts["status"] = message["status"]
                message["headers"] = [*message.get("headers", ()), id_header]
            elif message["type"] == "http.response.body":
                counts["out"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive_counted, send_tagged)
        finally:
            _note_path_model(scope)
            record_call(
                self.metrics(), "http", scope["method"], scope["path"], _route_label(scope),
                "", counts["status"], time.perf_counter() - start, counts["in"], counts["out"],
            )  # fmt: skip
            end_call()


def record_call(
    metrics: Metrics | None,
    protocol: str,
    method: str,
    target: str,
    route: str,
    model: str,
    status: int,
    seconds: float,
    size_in: int,
    size_out: int,
    *,
    request: bool = True,
) -> None:
    """Count one answered request in ``metrics`` (None: none yet) and write its access-log line,
    whatever its ``protocol`` ("http": this module's middleware; "grpc": a call, or a stream's
    message, in grpc/service.py and grpc/streams.py). ``method`` and ``target`` name it in the
    line ("GET /v2", "gRPC /inference.GRPCInferenceService/ServerLive"); ``route``, ``model``
    ("": the one the call in hand noted, ``logs.note_model``) and ``status`` (an HTTP status: a
    gRPC refusal's is its error's, ``errors.STATUSES``) are its labels in /metrics, ``size_in``
    and ``size_out`` its bytes each way. The line says the rest of what the call noted
    (``logs.CallNote``): its id, client, model, and the refusal's class, rule and field; a
    refusal is counted by its rule too (``tensorbits_refusals_total``). ``request`` False: no
    request of its own, counted already (a connection cut after its request was answered,
    ``record_http_layer_refusal``): its refusal is counted and logged, not another request."""
    note = call_var.get()
    if not model and note is not None:
        model = note.model
    if metrics is not None:
        label, version = metrics.tally.model_label(model)
        if request:
            metrics.tally.add(route, label, status, seconds, size_in, size_out, protocol, version)
        if note is not None and note.refusal is not None:
            metrics.tally.refuse(protocol, label, status, note.rule, version)
    if logger.isEnabledFor(logging.INFO):  # the fields cost a dict per request: only if logged
        shown = protocol_status(protocol, status, note)
        fields = access_fields(protocol, route, shown, seconds, size_in, size_out, note)
        log_fields(logger, logging.INFO, fields, "%s %s %s", method, target, shown)


# The scope key where ``tensorbits serve``'s protocol (``guarded_protocol.OneWriteCycle``) puts
# its way to read the body into the buffer the app allocated once admitted (``BodyInto``; here,
# below both, and the middleware counts what it reads).
BODY_INTO = "tensorbits.body_into"


class BodyInto(Protocol):
    """``into(view, until)``: the body read into ``view``, returning once it is all in, or the
    client is gone, with (bytes of the body parsed, True where it ended; False: disconnected or
    refused first). Bytes past the view's end are counted, never written: a count past its
    length is a body longer than declared. ``until``: return as soon as that many bytes are in
    (the body not ended yet), the rest still read into ``view`` as it arrives; call again with
    the same view for more. The reading stops once the response starts."""

    def __call__(
        self, view: memoryview, until: int | None = None, /
    ) -> Awaitable[tuple[int, bool]]: ...


# Where a request's route is unknown: the HTTP layer refused it before the app routed it.
NO_ROUTE = ""
# The lifespan state key (``app.py``) under which the app hands its metrics to the HTTP layer:
# uvicorn gives each connection's protocol the lifespan's state (``guarded_protocol.py``).
METRICS_STATE = "tensorbits.metrics"


def record_http_layer_refusal(
    metrics: Metrics | None,
    client: str,
    method: str,
    target: str,
    refusal: TensorbitsError,
    seconds: float,
    size_in: int,
    size_out: int,
    *,
    route: str = NO_ROUTE,
    request: bool = True,
) -> None:
    """Count and log, as ``record_call`` does the app's, a request the HTTP layer refused
    before the app saw it (``guarded_protocol.py``: a malformed or oversized head, a head not
    in time, a body not in time after its answer): a request id of its own, ``client``
    ("host:port"), ``method`` and ``target`` ("-" where not read), ``refusal``'s class, rule
    and field. ``request`` False: its request was answered and counted already."""
    end_call = begin_call(new_request_id(), client)
    try:
        note_refusal(refusal.code, refusal.grpc_code, refusal.rule, refusal.field)
        record_call(
            metrics, "http", method, target, route, "", refusal.status_code, seconds, size_in,
            size_out, request=request,
        )  # fmt: skip
    finally:
        end_call()


def route_label(scope: Scope) -> str:
    """The route label of the request ``scope`` is (``_route_label``)."""
    return _route_label(scope)


# A gRPC call's code name by the HTTP status it is counted under, where no refusal was noted
# (a refusal's own code is noted with it: 400 is INVALID_ARGUMENT or FAILED_PRECONDITION).
GRPC_STATUS_NAMES: Mapping[int, str] = {200: "OK", 499: "CANCELLED"}


def protocol_status(protocol: str, status: int, note: CallNote | None) -> int | str:
    """The status as the call's protocol said it: HTTP's code; gRPC's code name."""
    if protocol != "grpc":
        return status
    if note is not None and note.grpc_status is not None:
        return note.grpc_status
    return GRPC_STATUS_NAMES.get(status, "UNKNOWN")


def access_fields(
    protocol: str,
    route: str,
    status: int | str,
    seconds: float,
    bytes_in: int,
    bytes_out: int,
    note: CallNote | None = None,
) -> dict[str, object]:
    """The fields of one access-log record (``record_call``), the same names on every protocol;
    a refusal's class, rule and field only on a refused call's."""
    fields: dict[str, object] = {
        "protocol": protocol,
        "status": status,
        "route": route,
        "duration_ms": round(seconds * 1000, 3),
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
    }
    if note is not None:
        fields.update(
            request_id=note.request_id, client=note.client, model=note.model, version=note.version
        )
        if note.refusal is not None:
            fields.update(refusal=note.refusal, rule=note.rule, field=note.field)
    return fields


class _RequestIds:
    """Request ids made here: 32 hex digits, a random half per process and a counter. Unique
    across the server's workers and restarts (as ``os.urandom(16)`` was), not secret, and
    without a ``getrandom`` syscall per request (1.5 % of a small request's time under load)."""

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)  # a forked child is another process

    def reset(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.counter) & 0xFFFFFFFFFFFFFFFF:016x}"


new_request_id = _RequestIds()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            # Bounded and printable only: the id goes into logs and back into a header.
            text = value[:128].decode("latin-1")
            return text if text.isprintable() else None
    return None
