"""The data plane: one request's lifecycle, written once for every front end.

A front end (HTTP's v2 and /v1 endpoints, gRPC's ModelInfer and ModelStreamInfer) admits its
request and hands the rest to ``Call.serve`` with its decoder, what its plans need held and its
encoder; the lifecycle is written once, there:

    admit (a grant for the bytes the request declares, refused at once past the bounds; the
       front end's, as it reads: HTTP admits a body before reading it)
    -> plan (the front end's decoder and the core's checks; inline when small, else on a thread)
    -> hold (the grant grown to what the plan says the run needs: 413 past what any idle server
       could hold, 503 when this one is too busy now)
    -> run (the front end's encoder around ``core.run``; inline when small, else on a thread)
    -> the answer sent by the front end, the grant released, the models' statistics recorded
       (statistics.py: its phases' durations, or a failure).

``DataPlane`` holds what every call shares: the backend, admission, the limits as values, the
shared-memory regions, the models' states, the statistics, the one cache of planned inference
requests (``PlanTemplate``s, one kind for both front ends, each keyed by its own wire form) and
the repository index both protocols list. Nothing here knows a protocol: no Starlette, no grpc,
no settings.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from time import perf_counter_ns
from types import TracebackType
from typing import NamedTuple, Protocol, TypeVar

from tensorbits.core.admission import Admission, Grant
from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.batch import BatchLimits, BatchPlan
from tensorbits.core.device_wait import run_woken
from tensorbits.core.graphs.models import GraphModel, GraphModels
from tensorbits.core.header_cache import HeaderCache
from tensorbits.core.models import MODEL_VERSION, ModelStates
from tensorbits.core.offload import COMPUTE_INLINE_MAX_BYTES, JSON_INLINE_MAX_BYTES, offload
from tensorbits.core.plan import PlanTemplate
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits.core.statistics import Statistics
from tensorbits_protocol.infer import RequestLimits
from tensorbits_protocol.operators import OPERATORS

PlanT = TypeVar("PlanT")
AnswerT = TypeVar("AnswerT")
PlanT_co = TypeVar("PlanT_co", covariant=True)
PlanT_contra = TypeVar("PlanT_contra", contravariant=True)
AnswerT_co = TypeVar("AnswerT_co", covariant=True)

# Why a model is not READY while the server is not (the index's reason, both protocols).
SERVER_NOT_READY = "server is not ready"


class Needs(NamedTuple):
    """What one planned run needs, as its front end reckons it from the plan."""

    held: int  # bytes held in all while it runs, the request's own among them
    work: int  # bytes it touches: it runs on a worker thread from COMPUTE_INLINE_MAX_BYTES
    # What its statistics count it for, when only the plan knows (a batch: its dispatches').
    models: Sequence[str] | None = None


class HoldWords(NamedTuple):
    """How a refusal to hold what a run needs names it (``Grant.hold``): the request's kind,
    the parts of it that take the memory, and the field the caller can make smaller."""

    what: str
    parts: str
    field: str


class Decoder(Protocol[PlanT_co]):
    """A front end's planner with its request bound: the wire form decoded and checked by the
    core's rules into a plan, or the refusal raised."""

    def __call__(self) -> PlanT_co: ...


class Reckoner(Protocol[PlanT_contra]):
    """What a front end reads of its plan: the ``Needs`` of running it."""

    def __call__(self, plan: PlanT_contra, /) -> Needs: ...


class Encoder(Protocol[PlanT_contra, AnswerT_co]):
    """A front end's encoder around ``core.run``: the plan run into the answer's bytes."""

    def __call__(self, plan: PlanT_contra, /) -> AnswerT_co: ...


class IndexEntry(NamedTuple):
    """A model of the repository index: its version ("" when a repository folder's model failed
    to load) and why it is not READY (None: it is)."""

    name: str
    version: str
    reason: str | None

    @property
    def state(self) -> str:
        return "READY" if self.reason is None else "UNAVAILABLE"


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

    def unavailable_because(self, model: str, *, server_ready: bool) -> str | None:
        """Why ``model`` is not READY (the repository index's reason, both protocols); None
        when it is."""
        if not server_ready:
            return SERVER_NOT_READY
        failed = self.graphs.failed().get(model)
        if failed is not None:
            return failed
        if not self.models.is_loaded(model):
            return "unloaded"  # Triton's reason for a model unloaded through the extension
        return None

    def repository_index(self, *, server_ready: bool, ready_only: bool) -> list[IndexEntry]:
        """The repository index both protocols answer: the operators, the graph models, and
        the repository folder's models that failed to load; ``ready_only``: READY ones alone."""
        listed = [(op.name, MODEL_VERSION) for op in OPERATORS]
        listed += [(model.name, model.version) for model in self.graphs.models()]
        listed += [(name, "") for name in sorted(self.graphs.failed())]
        entries = []
        for name, version in listed:
            reason = self.unavailable_because(name, server_ready=server_ready)
            if reason is None or not ready_only:
                entries.append(IndexEntry(name, version, reason))
        return entries

    def call(self, models: Sequence[str] = ()) -> Call:
        """One request's lifecycle, as a context manager: ``with plane.call(...) as call`` (or
        ``async with``). ``models``: what its statistics count it for, when already known (a v2
        inference: its model; a batch learns its dispatches' once planned)."""
        return Call(self, models)

    # The cache of planned inferences, the one discipline of both front ends: a request of
    # ``size`` bytes without its tensors' bytes is looked up under its front end's ``key``
    # (``template``) only when a template of it could be kept (``keeps``); one planned anew is
    # kept (``remember``) when its inputs are all raw bytes or in shared memory (its regions
    # located again at each use). Every entry is a ``PlanTemplate``.

    def keeps(self, size: int) -> bool:
        """Whether the template of a request of ``size`` bytes would be kept (and so is worth
        making and looking up): a cache, and a request short enough for it."""
        plans = self.plans
        return plans is not None and size <= plans.max_header_bytes

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

    def __enter__(self) -> Call:
        self.started = self.received = perf_counter_ns()
        return self

    def __exit__(
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

    # The block is ``with`` or ``async with`` alike: neither end awaits anything, and ``with``
    # spares a small request's every call two coroutines.
    async def __aenter__(self) -> Call:
        return self.__enter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.__exit__(kind, exc, traceback)

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

    def hold(self, needed: int, what: str, parts: str, field: str) -> None:
        """Grow the grant to the ``needed`` bytes the planned work holds (``Grant.hold``)."""
        assert self.grant is not None, "a call holds memory only once admitted"
        self.grant.hold(needed, what, parts, field)
        self.planned = perf_counter_ns()

    async def serve(
        self,
        decode: Decoder[PlanT],
        decoded_bytes: int,
        needs: Reckoner[PlanT],
        words: HoldWords,
        encode: Encoder[PlanT, AnswerT],
        *,
        on_held: Callable[[], object] | None = None,
    ) -> AnswerT:
        """The admitted request (``admit``, ``admitted``) planned, held and run into the front
        end's answer, which it sends: ``decode()``, on a worker thread when the
        ``decoded_bytes`` it reads are many (JSON parses at about 20 ms per MiB); the grant
        grown to what ``needs`` reckons of the plan (refused in ``words``), then ``on_held``
        told (a stream reads its next message once this one is held); ``encode(plan)``, on a
        worker thread when the run touches ``COMPUTE_INLINE_MAX_BYTES`` or more, else inline,
        its device work awaited by a stream callback, not blocked on (device_wait.py)."""
        # Its halves (``held``, ``run``) written out: a small request's every call, and each
        # coroutine more costs it.
        if decoded_bytes < JSON_INLINE_MAX_BYTES:  # inline without offload's coroutine
            planned = decode()
        else:
            planned = await offload(decoded_bytes, JSON_INLINE_MAX_BYTES, decode)
        reckoned = self._held(planned, needs, words)
        if on_held is not None:
            on_held()
        # On the NumPy backend alone nothing is launched to wait for (a placement backend
        # presents host memory but may place work on a device): run_woken's waits would stay
        # empty, and its context variable and coroutine cost a small request's every call.
        if reckoned.work < COMPUTE_INLINE_MAX_BYTES and type(self.plane.backend) is NumpyBackend:
            answer = encode(planned)
        else:
            answer = await run_woken(reckoned.work, COMPUTE_INLINE_MAX_BYTES, encode, planned)
        self.executed = perf_counter_ns()
        return answer

    async def held(
        self, decode: Decoder[PlanT], decoded_bytes: int, needs: Reckoner[PlanT], words: HoldWords
    ) -> tuple[PlanT, Needs]:
        """``serve``'s first half: the plan, and what it needs, held (a front end with the rest
        of its request still arriving runs the second, ``run``, once it is here)."""
        planned = await offload(decoded_bytes, JSON_INLINE_MAX_BYTES, decode)
        return planned, self._held(planned, needs, words)

    async def run(
        self, planned: PlanT, reckoned: Needs, encode: Encoder[PlanT, AnswerT]
    ) -> AnswerT:
        """``serve``'s second half: ``encode(planned)``, its needs held already (``held``)."""
        answer = await run_woken(reckoned.work, COMPUTE_INLINE_MAX_BYTES, encode, planned)
        self.executed = perf_counter_ns()
        return answer

    def _held(self, planned: PlanT, needs: Reckoner[PlanT], words: HoldWords) -> Needs:
        reckoned = needs(planned)
        if reckoned.models is not None:
            self.models = reckoned.models
        self.hold(reckoned.held, *words)
        return reckoned


__all__ = [
    "SERVER_NOT_READY",
    "Call",
    "DataPlane",
    "Decoder",
    "Encoder",
    "HoldWords",
    "IndexEntry",
    "Needs",
    "Reckoner",
]
