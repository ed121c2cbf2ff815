"""The data plane: one request's lifecycle, written once for every front end.

A front end (HTTP's v2 and /v1 endpoints, gRPC's ModelInfer and ModelStreamInfer) decodes its
wire form and hands the work to a ``Call``, which holds the lifecycle:

    admit (a grant for the bytes the request declares, refused at once past the bounds)
    -> plan (the front end's decoder and the core's checks; inline when small, else on a thread)
    -> hold (the grant grown to what the plan says the run needs: 413 past what any idle server
       could hold, 503 when this one is too busy now)
    -> run (the front end's encoder around ``core.run``; inline when small, else on a thread)
    -> the answer sent by the front end, the grant released, the models' statistics recorded
       (statistics.py: its phases' durations, or a failure).

``DataPlane`` holds what every call shares: the backend, admission, the limits as values, the
shared-memory regions, the models' states, the statistics and the one cache of planned
inference requests (``PlanTemplate``s, keyed by each front end's own wire form). Nothing here
knows a protocol: no Starlette, no grpc, no settings.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from time import perf_counter_ns
from types import TracebackType
from typing import ParamSpec, TypeVar

from tensorbits.core.admission import Admission, Grant
from tensorbits.core.backends.base import Backend
from tensorbits.core.batch import BatchLimits, BatchPlan
from tensorbits.core.graphs.models import GraphModel, GraphModels
from tensorbits.core.header_cache import HeaderCache
from tensorbits.core.models import ModelStates
from tensorbits.core.offload import COMPUTE_INLINE_MAX_BYTES, JSON_INLINE_MAX_BYTES, offload
from tensorbits.core.plan import PlanTemplate
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits.core.statistics import Statistics
from tensorbits_protocol.infer import RequestLimits

P = ParamSpec("P")
T = TypeVar("T")


class DataPlane:
    """What every request of one server shares, and the way each runs (``call``)."""

    __slots__ = (
        "admission", "backend", "batch_limits", "batch_plans", "graphs", "limits", "models",
        "plans", "regions", "statistics",
    )  # fmt: skip

    def __init__(
        self,
        backend: Backend,
        admission: Admission,
        limits: RequestLimits,
        batch_limits: BatchLimits,
        *,
        plans: HeaderCache[PlanTemplate] | None = None,
        batch_plans: HeaderCache[BatchPlan] | None = None,
        regions: SharedMemoryRegions | None = None,
        models: ModelStates | None = None,
        statistics: Statistics | None = None,
        graphs: GraphModels | None = None,
    ) -> None:
        self.backend = backend
        self.admission = admission
        self.limits = limits
        self.batch_limits = batch_limits
        # Inference requests planned before, HTTP's and gRPC's in one budget (each keyed by its
        # front end's wire form, tagged with it); /v1 batches, whose headers are longer, apart.
        self.plans = plans
        self.batch_plans = batch_plans
        # The shared-memory extensions' regions, system and CUDA; None when they are off.
        self.regions = regions
        # The repository extension's unloaded models, checked before each inference.
        self.models = models if models is not None else ModelStates()
        # Per-model inference counts and durations, fed by every front end.
        self.statistics = statistics if statistics is not None else Statistics()
        # The graph models loaded beside the operators (core/graphs/models.py).
        self.graphs = graphs if graphs is not None else GraphModels()

    def load_graph(self, name: str, config: str | bytes, files: Mapping[str, bytes]) -> GraphModel:
        """Load (or replace) graph model ``name``: read, checked, then served and counted."""
        model = self.graphs.load(name, config, files, self.batch_limits)
        self.statistics.add(name)
        return model

    def add_graph(self, model: GraphModel) -> None:
        """Serve a graph model built already (the repository folder's, at start)."""
        self.graphs.add(model)
        self.statistics.add(model.name)

    def unload_graph(self, name: str) -> bool:
        """Stop serving graph model ``name`` (its counts go with it); whether there was one."""
        found = self.graphs.unload(name)
        if found:
            self.statistics.remove(name)
        return found

    def call(self, models: Sequence[str] = ()) -> Call:
        """One request's lifecycle, as an async context manager: ``async with plane.call(...)
        as call``. ``models``: what its statistics count it for, when already known (a v2
        inference: its model; a batch learns its dispatches' once planned)."""
        return Call(self, models)

    def template(self, key: Hashable, size: int) -> PlanTemplate | None:
        """The template planned before for ``key`` (a request of ``size`` bytes without its
        tensors' bytes), or None: no cache, too long to be kept, or not seen."""
        plans = self.plans
        if plans is None or size > plans.max_header_bytes:
            return None
        return plans.get(key)

    def remember(self, key: Hashable, template: PlanTemplate, size: int) -> None:
        if self.plans is not None:
            self.plans.put(key, template, size)


class Call:
    """One request through the data plane (``DataPlane.call``): its grant, the models it counts
    for, and the times its phases ended. On leaving the block, the grant is released and the
    statistics record the call: a success, or a failure once its models are known."""

    __slots__ = ("executed", "grant", "models", "plane", "planned", "received", "started")

    def __init__(self, plane: DataPlane, models: Sequence[str]) -> None:
        self.plane = plane
        self.models = models
        self.grant: Grant | None = None
        self.started = self.received = self.planned = self.executed = 0

    async def __aenter__(self) -> Call:
        self.started = self.received = perf_counter_ns()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.grant is not None:
            self.grant.release()
        if not self.models:
            return  # refused before it was known what it asked for: no model to count it for
        ended = perf_counter_ns()
        statistics, models = self.plane.statistics, self.models
        if exc is not None:
            statistics.record_batch_failure(models, ended - self.started)
            return
        phases = (
            0, self.planned - self.received, self.executed - self.planned,
            ended - self.executed, ended - self.started,
        )  # fmt: skip
        if len(models) == 1:  # an inference: its model's tally at once, no counting out
            statistics.record(models[0], *phases)
        else:
            statistics.record_batch(models, *phases)

    def admit(self, nbytes: int) -> Grant:
        """Admit the call for the ``nbytes`` it declares (Overloaded past the bounds)."""
        self.grant = self.plane.admission.acquire(nbytes)
        return self.grant

    def admitted(self, grant: Grant) -> None:
        """Take a grant the front end acquired itself (HTTP admits a body for its declared
        length while reading the headers it needs); released with the call."""
        self.grant = grant

    def mark_received(self) -> None:
        """The request's bytes are all here: planning starts (a call that arrived whole, as a
        gRPC message does, starts planning when it starts)."""
        self.received = perf_counter_ns()

    async def plan(
        self, size: int, planner: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``planner(*args, **kwargs)``: on a worker thread when the ``size`` bytes it decodes
        are many (JSON parses at about 20 ms per MiB), inline when not."""
        return await offload(size, JSON_INLINE_MAX_BYTES, planner, *args, **kwargs)

    def hold(self, needed: int, what: str, parts: str, field: str) -> None:
        """Grow the grant to the ``needed`` bytes the planned run holds (``Grant.hold``)."""
        assert self.grant is not None, "a call holds memory only once admitted"
        self.grant.hold(needed, what, parts, field)
        self.planned = perf_counter_ns()

    async def run(
        self, work_bytes: int, runner: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``runner(*args, **kwargs)`` (a front end's encoder around ``core.run``): on a worker
        thread when it touches ``work_bytes`` of memory or more, inline when less."""
        result = await offload(work_bytes, COMPUTE_INLINE_MAX_BYTES, runner, *args, **kwargs)
        self.executed = perf_counter_ns()
        return result


__all__ = ["Call", "DataPlane"]
