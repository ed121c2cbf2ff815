"""What a running server holds: its settings, its backend, and the admission bound."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tensorbits.backends import Selection, select_backend
from tensorbits.batch import BatchLimits, BatchPlan
from tensorbits.config import Settings
from tensorbits.header_cache import HeaderCache, PlanT
from tensorbits.inference import CACHED_HEADER_MAX_BYTES, PlanTemplate, request_limits
from tensorbits.shared_memory import SharedMemoryRegions
from tensorbits.statistics import Statistics
from tensorbits_protocol.errors import ModelUnavailable, Overloaded, PayloadTooLarge
from tensorbits_protocol.infer import RequestLimits


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
                f"{nbytes} more (limit {self.max_bytes}); retry later"
            )
        self.bytes_in_flight += nbytes

    def acquire(self, nbytes: int) -> Grant:
        """Admit one request for ``nbytes``, or raise Overloaded; the caller must ``release``
        the grant (``api/admitted.py`` does, once the response is sent)."""
        if self.requests_in_flight >= self.max_requests:
            raise Overloaded(
                f"server busy: {self.requests_in_flight} requests in flight "
                f"(limit {self.max_requests}); retry later"
            )
        self._take_bytes(nbytes)
        self.requests_in_flight += 1
        return Grant(self, nbytes)


@dataclass(slots=True)
class Grant:
    """What one admitted request holds; ``grow`` asks for more, or raises Overloaded."""

    admission: Admission
    nbytes: int
    released: bool = False

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
            self.admission.requests_in_flight -= 1
            self.admission.bytes_in_flight -= self.nbytes


class Drain:
    """Whether the server has been told to stop (SIGTERM), in the order load balancers route.

    ``begin`` (the signal, ``serving.draining_server``) turns the runtime's readiness false first,
    while every listener still accepts: a load balancer or a Kubernetes Service, which only
    learns of the stop from failing probes (or the endpoint's removal, seconds later), stops
    sending work before any connection is refused. ``stop_accepting`` (after
    ``TENSORBITS_DRAIN_DELAY``) runs the hooks the endpoints registered (gRPC's stop), as the
    HTTP listener closes; the requests in flight then finish within the graceful timeout."""

    __slots__ = ("_begun", "_on_stop", "_stopping")

    def __init__(self) -> None:
        self._begun = threading.Event()  # set from a signal handler, read on the event loop
        self._stopping = False
        self._on_stop: list[Callable[[], object]] = []

    def begin(self) -> None:
        self._begun.set()

    @property
    def begun(self) -> bool:
        return self._begun.is_set()

    def on_stop_accepting(self, hook: Callable[[], object]) -> None:
        """Call ``hook`` (on the event loop) when the server stops accepting new work."""
        self._on_stop.append(hook)

    def stop_accepting(self) -> None:
        """The end of the delay: every registered hook, once, in the order registered."""
        if self._stopping:
            return
        self._stopping = True
        for hook in self._on_stop:
            hook()


class ModelStates:
    """Which models the v2 repository extension has unloaded on this server (every other one is
    loaded): ``POST /v2/repository/models/{m}/unload`` and ``.../load``, as Triton clients expect.

    The operators stay compiled in; an unloaded one is only refused, by name, until it is loaded
    again. The state is this process's alone, like Triton's own repository: replicas share none.
    Writers (the load and unload routes) swap in a new frozenset under a lock; readers (every
    inference) test membership in whichever set is current, without the lock."""

    __slots__ = ("_lock", "_unloaded")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unloaded: frozenset[str] = frozenset()

    def load(self, name: str) -> None:
        with self._lock:
            self._unloaded = self._unloaded - {name}

    def unload(self, name: str) -> None:
        with self._lock:
            self._unloaded = self._unloaded | {name}

    def is_loaded(self, name: str) -> bool:
        return name not in self._unloaded

    def check_loaded(self, name: str) -> None:
        """Raise ModelUnavailable (400, FAILED_PRECONDITION over gRPC) naming the model, its
        state and the way back, if ``name`` is unloaded."""
        if name in self._unloaded:
            raise ModelUnavailable(
                f"model '{name}' is unloaded (state UNAVAILABLE): load it again with "
                f"POST /v2/repository/models/{name}/load",
                field="model_name",
                rule="model_unloaded",
            )


@dataclass
class Runtime:
    settings: Settings
    selection: Selection
    admission: Admission
    # The settings' request limits in the form each API checks them: built once, not per call.
    limits: RequestLimits
    batch_limits: BatchLimits
    # Request headers already planned (header_cache.py), v2 and /v1; None when switched off.
    v2_plans: HeaderCache[PlanTemplate] | None
    batch_plans: HeaderCache[BatchPlan] | None
    started: bool = True
    drain: Drain = field(default_factory=Drain)  # the server's: begun when it is told to stop
    # The v2 repository extension's unloaded models (load/unload), checked before each inference.
    models: ModelStates = field(default_factory=ModelStates)
    # Per-model inference counts and durations (statistics.py), fed by every front end.
    statistics: Statistics = field(default_factory=Statistics)
    # The shared-memory extensions' regions, system and CUDA; None when they are off (the default).
    shared_memory: SharedMemoryRegions | None = None

    @property
    def ready(self) -> bool:
        return self.started and not self.drain.begun

    def unavailable_because(self, model: str) -> str | None:
        """Why ``model`` is not READY (the repository index's reason, both protocols); None
        when it is."""
        if not self.ready:
            return "server is not ready"
        if not self.models.is_loaded(model):
            return "unloaded"  # Triton's reason for a model unloaded through the extension
        return None

    @classmethod
    def start(cls, settings: Settings, drain: Drain | None = None) -> Runtime:
        selection = select_backend(
            settings.backend, device_id=settings.device_id, cpu_threads=settings.cpu_threads
        )
        return cls(
            settings=settings,
            selection=selection,
            # One worker's share: with N workers the limits hold for the server as a whole.
            admission=Admission(
                settings.worker_inflight_bytes,
                settings.worker_inflight_requests,
                workers=settings.workers,
            ),
            limits=request_limits(settings),
            batch_limits=BatchLimits.from_settings(settings),
            v2_plans=_cache(settings, CACHED_HEADER_MAX_BYTES),
            # A batch header is as long as its dispatches are many: keep up to 1/16 of the budget.
            batch_plans=_cache(settings, settings.header_cache_bytes // 16),
            drain=drain or Drain(),
            shared_memory=(
                SharedMemoryRegions(
                    settings.shared_memory_prefix,
                    settings.max_shared_memory_regions,
                    settings.max_shared_memory_bytes,
                    selection.backend.device_memory,
                    f"{selection.backend.name} on {selection.backend.device}",
                )
                if settings.shared_memory
                else None
            ),
        )

    def close(self) -> None:
        self.started = False
        if self.shared_memory is not None:
            self.shared_memory.close()
        self.selection.backend.close()


def _cache(settings: Settings, max_header_bytes: int) -> HeaderCache[PlanT] | None:
    budget = settings.header_cache_bytes
    return HeaderCache(budget, max_header_bytes) if budget and max_header_bytes else None
