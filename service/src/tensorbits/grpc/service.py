"""The Open Inference Protocol's ``GRPCInferenceService``: each RPC answered as its HTTP twin is.

Every RPC reads the same runtime as the HTTP routes (backend, admission, limits, model states,
statistics, drain) and answers from the same definitions: metadata, model configuration and
statistics are the HTTP documents turned into messages (``json_format.ParseDict``), inference
goes through the data plane (core/dataplane.py) like every front end. A refusal is the same
``TensorbitsError`` with the same words, sent as the gRPC status its class carries with trailing
metadata naming the field and the rule (``status.py``), as the HTTP JSON error does. An exception
that is not a
refusal is answered by ``refusals.refusal_of`` as HTTP answers it (out of memory: UNAVAILABLE,
as HTTP's 503), or as INTERNAL with no internals named (a bug).

This module owns the servicer: the call around every unary RPC (its slot of the pool
``RPC_RULES`` names, in ``pools.py``; its API key; its one message, which must arrive within
TENSORBITS_TIMEOUT_BODY_READ; its count and access log) and the RPCs' bodies. ModelStreamInfer's
stream runs in ``streams.py``, on the same slots, key check, accounting and inference: the
servicer is what both kinds of call share, so it stays the one place each RPC is answered.

Each RPC's handler takes the request's bytes and returns the response's (``server.py``
registers them without (de)serializers): a malformed message is then an INVALID_ARGUMENT with
protobuf's words, not the INTERNAL that grpcio answers when its own deserializer fails.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from starlette.concurrency import run_in_threadpool

from tensorbits import auth, load_bounds, model_info, model_lifecycle, refusals
from tensorbits.core.admission import Admission
from tensorbits.core.backends.base import Backend
from tensorbits.core.dataplane import Decoder, Encoder, HoldWords, Needs, Reckoner
from tensorbits.core.graphs.model_config_pb2 import ModelConfig
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.request import GraphRequest
from tensorbits.core.models import Model, resolve_model, resolve_served, version_of
from tensorbits.core.offload import JSON_INLINE_MAX_BYTES, offload
from tensorbits.core.plan import Plan, PlanTemplate
from tensorbits.core.shared_memory import Kind, SharedMemoryRegions, switched_on
from tensorbits.deadlines import within_read_deadline
from tensorbits.grpc import graph_messages, load_wire, messages, streams, wire
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.pools import RPC_RULES, Pool, Slots, worker_pools
from tensorbits.grpc.status import (
    Context,
    call_request_id,
    error_metadata,
    request_id_metadata,
    status_code,
)
from tensorbits.grpc.streams import StreamBehaviour
from tensorbits.logs import begin_call, call_var, note_model, note_request_id, note_version
from tensorbits.observability import Metrics, record_call
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import (
    InvalidRequest,
    OperatorNotFound,
    PayloadTooLarge,
    TensorbitsError,
)
from tensorbits_protocol.operators import OPERATORS

logger = logging.getLogger("tensorbits.grpc")

# The front end's tag in the data plane's cache keys: HTTP keys its own form there too.
CACHE_TAG = "grpc"

# What a refusal to hold an inference's memory names: the inputs are what the caller can shrink.
OPERATOR_WORDS = HoldWords("inference", "message, output", "inputs")
GRAPH_WORDS = HoldWords("inference", "message, outputs, work", "inputs")

# The published service name: clients call /inference.GRPCInferenceService/<Method>.
SERVICE_NAME = "inference.GRPCInferenceService"

# The RPCs a client may call without an API key when the HTTP route they mirror is open
# (TENSORBITS_AUTH_OPEN_PATHS); the gRPC health service is always open, like a probe must be.
OPEN_WHEN: Mapping[str, str] = {
    "ServerLive": "/v2/health/live",
    "ServerReady": "/v2/health/ready",
}

# The RPCs of inference.proto's service and the method of InferenceService that serves each.
RPCS = tuple(
    (method.name, re.sub(r"(?<!^)(?=[A-Z])", "_", method.name).lower())
    for method in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods
)

# The unary RPCs whose answers are made under an admission grant (an inference's output): each
# stays counted in admission until grpc has sent it (``_carry_until_sent``), as a stream's does.
CARRIED = frozenset({"ModelInfer"})

# The layouts of ModelInfer messages planned from a template (``_keep_layout``): how many, and
# the longest message part one holds (the plan cache's key holds it too).
MAX_LAYOUTS = 64
LAYOUT_MAX_MESSAGE_BYTES = 4096

# A ModelInfer message's key in the plan cache: its front end, its message part, its raw
# contents' sizes.
CacheKey = tuple[str, bytes, tuple[int, ...]]

M = TypeVar("M", bound=Message)
PlanT = TypeVar("PlanT")
Handler = Callable[[bytes], Awaitable[bytes]]
Behaviour = Callable[[AsyncIterator[bytes], Context], Awaitable[bytes]]


def _parse(message_type: type[M], data: bytes) -> M:
    try:
        return message_type.FromString(data)
    except DecodeError as exc:
        name = message_type.DESCRIPTOR.name
        raise InvalidRequest(f"malformed {name}: {exc}", field=name, rule="protobuf") from None


def _no_message(name: str) -> InvalidRequest:
    """The refusal of a unary call that ended without its message."""
    return InvalidRequest(
        f"the call ended without a {name} request message", field="message", rule="protobuf"
    )


def _version(version: str) -> str | None:
    return version or None  # the protocol's "no version": the server's choice


class InferenceService:
    """The RPCs, on one runtime. ``handlers`` maps each RPC name to its bytes-in, bytes-out
    coroutine, for every RPC of the service in ``inference.proto``."""

    def __init__(self, runtime: Runtime, metrics: Metrics | None = None) -> None:
        self.runtime = runtime
        self.metrics = metrics
        settings = runtime.settings
        # The API keys and open paths HTTP checks too (None: no keys, every call is open).
        self.keys = auth.KeyRing.of(settings)
        self.receive_timeout = settings.timeout_body_read
        # Every RPC of the service in inference.proto, by the method of its snake-case name.
        self.handlers: dict[str, Handler] = {rpc: getattr(self, method) for rpc, method in RPCS}
        self.handlers["ModelInfer"] = self._infer  # ``model_infer``'s body: a coroutine less
        missing = set(self.handlers) ^ set(RPC_RULES)
        assert not missing, f"RPC_RULES does not match inference.proto: {sorted(missing)}"
        self.pools: dict[Pool, Slots] = worker_pools(settings)
        self.max_load_bytes = load_bounds.max_load_bytes(settings.max_model_bytes)
        self.wire_limits = wire.WireLimits.of(
            runtime.plane.limits.max_tensors, runtime.plane.limits.max_json_elements
        )
        # The layouts of messages planned from a template, by length, each with its cache key.
        self.layouts: dict[int, tuple[wire.Layout, CacheKey]] = {}

    # --- the call around every RPC ------------------------------------------------------------

    def rpc(self, name: str) -> Behaviour:
        """The stream-unary behaviour registered for RPC ``name``: a unary call on the wire, read
        as a stream of one message so that the read has a deadline (``timeout_body_read``): a
        client that never finishes its message holds a slot no longer than an HTTP body would.

        The call is answered in ``answer``, whose frame holds the message and whatever raised:
        by the time a refusal is aborted through the context, that frame is gone. grpcio keeps
        the abort's exception on the call, its traceback the frames it passed, in a cycle with
        the context; a message such a frame held would live until the cycle collector ran."""
        handler = self.handlers[name]
        needs_key = self.keys is not None and self.keys.needs_key(OPEN_WHEN.get(name))
        route = f"/{SERVICE_NAME}/{name}"
        rule = RPC_RULES[name]
        slots = self.pools.get(rule.pool)
        carried = name in CARRIED
        awaited = f"the {name} request message"  # what the read deadline's refusal names

        async def answer(context: Context, peer: str, sizes: list[int]) -> bytes | TensorbitsError:
            """The call's response, or its refusal; ``peer``: the client's address, read once a
            call; ``sizes``: its message's and response's."""
            holding = False
            try:
                if slots is not None:
                    slots.take(peer)
                    holding = True
                if needs_key:
                    self._authenticate(context, route)
                # The call's one message, within the read deadline (an HTTP body's:
                # ``deadlines.py``), read from the context, not from ``requests``: grpcio's
                # request stream is a generator that, left suspended, holds the message it gave
                # until the cycle collector finds it, and closing it costs every call more than
                # the read. Read here, not in a coroutine of its own: every call.
                data = await within_read_deadline(context.read(), self.receive_timeout, awaited)
                if not isinstance(data, bytes):  # grpc.aio.EOF: the call ended without one
                    raise _no_message(name)
                sizes[0] = len(data)
                if rule.max_message_bytes is not None and len(data) > rule.max_message_bytes:
                    raise PayloadTooLarge(
                        f"the {name} message is {len(data)} bytes, more than the "
                        f"{rule.max_message_bytes} this RPC takes",
                        field="message",
                        rule="max_message_bytes",
                    )
                response = await handler(data)
                sizes[1] = len(response)
                return response
            except Exception as exc:  # every exception is answered (a cancelled call is not one)
                return refusals.answer_for(exc, logger, route)  # its frames let go
            finally:
                if holding:
                    assert slots is not None
                    slots.give(peer)

        async def behaviour(_requests: AsyncIterator[bytes], context: Context) -> bytes:
            # ``_requests``: grpcio's stream of the call's messages, unused (``answer`` reads)
            started = time.perf_counter()
            sizes = [0, 0]
            status = 499  # cancelled by the client or the server's stop, unless answered
            peer = context.peer()
            end_call = begin_call(call_request_id(context), peer)
            try:
                outcome = await answer(context, peer, sizes)
                if carried and isinstance(outcome, bytes):  # as its grant let go of them
                    _carry_until_sent(self.runtime.plane.admission, len(outcome))
                status = 200 if isinstance(outcome, bytes) else outcome.status_code
                id_metadata = _request_id_metadata()  # the id the call's line names
            finally:
                self._account(route, status, time.perf_counter() - started, *sizes)
                end_call()
            if isinstance(outcome, bytes):
                context.set_trailing_metadata(id_metadata)
                return outcome
            await context.abort(
                status_code(outcome),
                outcome.message,
                trailing_metadata=error_metadata(outcome) + id_metadata,
            )
            raise AssertionError("context.abort returned")  # it raises

        return behaviour

    def stream(self, name: str) -> StreamBehaviour:
        """The stream-stream behaviour registered for a streaming RPC (ModelStreamInfer), as
        ``streams.stream_behaviour`` runs it: with a slot of its pool, its route and whether its
        API key is checked, read as ``rpc`` reads them for a unary call."""
        needs_key = self.keys is not None and self.keys.needs_key(OPEN_WHEN.get(name))
        route = f"/{SERVICE_NAME}/{name}"
        slots = self.pools[RPC_RULES[name].pool]
        return streams.stream_behaviour(self, name, route, slots, needs_key)

    def _account(
        self, route: str, status: int, seconds: float, size_in: int, size_out: int
    ) -> None:
        """Count and log a call as an HTTP request is (``observability.record_call``): under its
        method's path, with the HTTP status of its answer (a refusal's is its error's)."""
        record_call(
            self.metrics, "grpc", "gRPC", route, route, "", status, seconds, size_in, size_out
        )

    def _authenticate(self, context: Context, route: str) -> None:
        """The call's API key, checked as an HTTP request's is (``auth.KeyRing.check``: its
        metadata read as the headers, the refusal raised for the call to send)."""
        assert self.keys is not None
        headers = [
            (key.encode("latin-1"), value if isinstance(value, bytes) else value.encode())
            for key, value in context.invocation_metadata() or ()
        ]
        self.keys.check(headers, "gRPC", route, context.peer)

    def _resolve(self, name: str, version: str) -> Model:
        note_model(name, version)
        served = resolve_served(self.runtime.plane.graphs, name, _version(version))
        note_version(version_of(served))
        return served

    # --- health and metadata ------------------------------------------------------------------

    async def server_live(self, data: bytes) -> bytes:
        _parse(pb.ServerLiveRequest, data)
        return pb.ServerLiveResponse(live=True).SerializeToString()

    async def server_ready(self, data: bytes) -> bytes:
        _parse(pb.ServerReadyRequest, data)
        return pb.ServerReadyResponse(ready=self.runtime.ready).SerializeToString()

    async def model_ready(self, data: bytes) -> bytes:
        request = _parse(pb.ModelReadyRequest, data)
        op = self._resolve(request.name, request.version)
        ready = self.runtime.unavailable_because(op.name) is None
        return pb.ModelReadyResponse(ready=ready).SerializeToString()

    async def server_metadata(self, data: bytes) -> bytes:
        _parse(pb.ServerMetadataRequest, data)
        metadata = model_info.server_metadata(self.runtime.plane.regions)
        document = metadata.model_dump(exclude_none=True)
        return _message(pb.ServerMetadataResponse, document).SerializeToString()

    async def model_metadata(self, data: bytes) -> bytes:
        request = _parse(pb.ModelMetadataRequest, data)
        op = self._resolve(request.name, request.version)
        document = model_info.model_metadata(op).model_dump(exclude_none=True)
        # The HTTP metadata's extra words (allowed types, ranks, parameters) have no field in
        # TensorMetadata; ModelConfig carries them (openapi/README.md).
        return _message(pb.ModelMetadataResponse, document, partial=True).SerializeToString()

    async def model_config(self, data: bytes) -> bytes:
        request = _parse(pb.ModelConfigRequest, data)
        op = self._resolve(request.name, request.version)
        config = _message(ModelConfig, model_info.model_config(op))
        return pb.ModelConfigResponse(config=config).SerializeToString()

    async def model_statistics(self, data: bytes) -> bytes:
        request = _parse(pb.ModelStatisticsRequest, data)
        models: list[Model] = [*OPERATORS, *self.runtime.plane.graphs.models()]
        if request.name:
            models = [self._resolve(request.name, request.version)]
        elif request.version:
            raise InvalidRequest(
                "a version without a model name: give the model's name too",
                field="version",
                rule="unknown_version",
            )
        # With several workers, each counts its own: the others' published counts are added in.
        others = self.metrics.other_workers_statistics() if self.metrics is not None else []
        document = self.runtime.plane.statistics.response(models, others)
        return _message(pb.ModelStatisticsResponse, document).SerializeToString()

    # --- model repository ---------------------------------------------------------------------

    async def repository_index(self, data: bytes) -> bytes:
        request = _parse(pb.RepositoryIndexRequest, data)
        _check_repository(request.repository_name)
        listed = self.runtime.plane.repository_index(
            server_ready=self.runtime.ready, ready_only=request.ready
        )
        models = [
            pb.RepositoryIndexResponse.ModelIndex(
                name=entry.name, version=entry.version, state=entry.state,
                reason=entry.reason or "",
            )
            for entry in listed
        ]  # fmt: skip
        return pb.RepositoryIndexResponse(models=models).SerializeToString()

    async def repository_model_load(self, data: bytes) -> bytes:
        # The load's bound first (HTTP's, api/v2.py), then admitted as HTTP's load is: the
        # message and the copies its decoding makes, held until the answer is sent.
        model_lifecycle.check_explicit(self.runtime)  # before the message is read
        load_bounds.check_load_size(len(data), self.max_load_bytes)
        async with self.runtime.plane.call() as call:
            call.admit(len(data))
            call.hold(model_lifecycle.LOAD_COPIES * len(data), "model load", "message, copies",
                      "message")  # fmt: skip
            return await self._load(data)

    async def _load(self, data: bytes) -> bytes:
        """Walked on its wire bytes (every count and size bounded, ``load_wire``), then its
        values taken from the message: on a worker thread when it is large."""
        name, config, files = await offload(
            len(data), JSON_INLINE_MAX_BYTES, _load_parts, data, self.runtime
        )
        note_model(name)
        await model_lifecycle.load_model(self.runtime, name, config, files)
        return pb.RepositoryModelLoadResponse().SerializeToString()

    async def repository_model_unload(self, data: bytes) -> bytes:
        request = _parse(pb.RepositoryModelUnloadRequest, data)
        _check_repository(request.repository_name)
        # Triton's one unload parameter: no model here has dependents, so either value holds.
        note_model(request.model_name)
        _no_repository_parameters(request.parameters, ("unload_dependents",))
        model_lifecycle.unload_model(self.runtime, request.model_name)
        return pb.RepositoryModelUnloadResponse().SerializeToString()

    # --- system shared memory -----------------------------------------------------------------

    def _regions(self) -> SharedMemoryRegions:
        return switched_on(self.runtime.plane.regions)

    async def system_shared_memory_status(self, data: bytes) -> bytes:
        request = _parse(pb.SystemSharedMemoryStatusRequest, data)
        response = pb.SystemSharedMemoryStatusResponse()
        for entry in self._regions().status(request.name or None):
            response.regions[entry["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**entry)
            )
        return response.SerializeToString()

    async def system_shared_memory_register(self, data: bytes) -> bytes:
        request = _parse(pb.SystemSharedMemoryRegisterRequest, data)
        self._regions().register_system(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse().SerializeToString()

    async def system_shared_memory_unregister(self, data: bytes) -> bytes:
        request = _parse(pb.SystemSharedMemoryUnregisterRequest, data)
        self._regions().unregister(request.name or None)
        return pb.SystemSharedMemoryUnregisterResponse().SerializeToString()

    async def cuda_shared_memory_status(self, data: bytes) -> bytes:
        request = _parse(pb.CudaSharedMemoryStatusRequest, data)
        response = pb.CudaSharedMemoryStatusResponse()
        for entry in self._regions().status(request.name or None, Kind.CUDA):
            response.regions[entry["name"]].CopyFrom(
                pb.CudaSharedMemoryStatusResponse.RegionStatus(**entry)
            )
        return response.SerializeToString()

    async def cuda_shared_memory_register(self, data: bytes) -> bytes:
        request = _parse(pb.CudaSharedMemoryRegisterRequest, data)
        # On a worker thread: opening an IPC handle maps device memory, which takes a while.
        await run_in_threadpool(
            self._regions().register_cuda, request.name, request.raw_handle, request.device_id,
            request.byte_size,
        )  # fmt: skip
        return pb.CudaSharedMemoryRegisterResponse().SerializeToString()

    async def cuda_shared_memory_unregister(self, data: bytes) -> bytes:
        request = _parse(pb.CudaSharedMemoryUnregisterRequest, data)
        self._regions().unregister(request.name or None, Kind.CUDA)
        return pb.CudaSharedMemoryUnregisterResponse().SerializeToString()

    # --- inference ----------------------------------------------------------------------------

    async def model_infer(self, data: bytes) -> bytes:
        return await self._infer(data)

    async def model_stream_infer(self, data: bytes) -> bytes:
        """One message of a ModelStreamInfer stream, answered as the stream answers it: the
        ModelInfer response, marked final, in a ``ModelStreamInferResponse``, or the refusal's
        words in its ``error_message``."""
        return await streams.answer_message(
            self, f"/{SERVICE_NAME}/ModelStreamInfer", data, streams.Message()
        )

    async def _infer(
        self, data: bytes, message_state: streams.Message | None = None, *, streamed: bool = False
    ) -> bytes:
        """One inference through the data plane's lifecycle (core/dataplane.py), admitted for
        its message before it is planned. A message planned before (the same bytes but the raw
        contents', of the same sizes) is planned from its template in the plane's cache, not
        parsed and checked again, and the next one of its layout is split by comparing it
        (``_keep_layout``). A stream's message (``message_state``) learns its request's id and
        when it is admitted."""
        plane = self.runtime.plane
        known = self.layouts.get(len(data))
        split = None if known is None else known[0].split(data)
        if split is not None:
            assert known is not None
            key = known[1]
        else:
            split = wire.split_infer_request(data, self.wire_limits)
            key = (CACHE_TAG, split.message, tuple(map(len, split.raw_contents)))  # flat bytes
        size = len(split.message)
        template = plane.template(key, size)
        if template is not None:
            if known is None or known[1] is not key:
                self._keep_layout(data, split, key)
            op = template.op
            note_model(op.name)
            _note_request_id(template.request_id or "", message_state)
            # Its regions located again, as planning locates them.
            decode: Decoder[Plan] = partial(template.plan, split.raw_contents, plane.regions)
            needs: Reckoner[Plan] = (
                partial(_operator_needs, size=len(data), backend=plane.backend)
                if template.in_shared_memory  # its regions' kinds decide, as they are now
                else partial(_templated_needs, template=template, size=len(data))
            )
        else:
            # Walked by its rules before protobuf builds anything of it (a cached message was,
            # when it was cached); on a thread when large, as the HTTP side's JSON is read.
            message = await offload(
                size, JSON_INLINE_MAX_BYTES, _checked_request, split.message, self.wire_limits
            )
            note_model(message.model_name, message.model_version)
            _note_request_id(message.id, message_state)
            graph = plane.graphs.get(message.model_name)
            if graph is not None:
                return await self._infer_graph(
                    graph, message, split, len(data), message_state, streamed=streamed
                )
            op = resolve_model(message.model_name, _version(message.model_version), plane.graphs)
            # Typed contents are read value by value: off the event loop when many.
            decode = partial(
                messages.plan_and_keep, plane, op, message, split.raw_contents, key, size
            )
            needs = partial(_operator_needs, size=len(data), backend=plane.backend)
        note_version(version_of(op))
        plane.models.check_loaded(op.name)  # every call: a template skips no state
        encode = partial(
            messages.encode, backend=plane.backend, regions=plane.regions, streamed=streamed
        )
        return await self._served(
            op.name, len(data), size, message_state, decode, needs, OPERATOR_WORDS, encode
        )

    def _keep_layout(self, data: bytes, split: wire.SplitRequest, key: CacheKey) -> None:
        """Keep the layout of a message planned from a template, under its length: the next
        message of that length and layout is split by comparing it (``wire.Layout``). Only a
        short message part is kept, and only ``MAX_LAYOUTS`` of them (all let go at once past
        it: a client's requests come in few sizes)."""
        if len(split.message) > LAYOUT_MAX_MESSAGE_BYTES:
            return
        layout = wire.layout_of(data, split)
        if layout is None:
            return
        if len(self.layouts) >= MAX_LAYOUTS:
            self.layouts.clear()
        self.layouts[len(data)] = (layout, key)

    async def _infer_graph(
        self,
        model: GraphModel,
        message: pb.ModelInferRequest,
        split: wire.SplitRequest,
        size: int,
        message_state: streams.Message | None,
        *,
        streamed: bool,
    ) -> bytes:
        """One inference of a graph model: admitted for its message, then for what its plan
        holds (``GraphPlan.needed_bytes``)."""
        plane = self.runtime.plane
        resolve_served(plane.graphs, model.name, _version(message.model_version))
        note_version(model.version)

        def needs(request: GraphRequest) -> Needs:
            return Needs(size + request.needed_bytes, request.work_bytes)

        decode = partial(graph_messages.plan, plane, model, message, split.raw_contents)
        encode = partial(graph_messages.encode, backend=plane.backend, streamed=streamed)
        return await self._served(
            model.name, size, len(split.message), message_state, decode, needs, GRAPH_WORDS, encode
        )

    async def _served(
        self,
        model: str,
        size: int,
        decoded_bytes: int,
        message_state: streams.Message | None,
        decode: Decoder[PlanT],
        needs: Reckoner[PlanT],
        words: HoldWords,
        encode: Encoder[PlanT, bytes],
    ) -> bytes:
        """An inference of ``model`` admitted for its message's ``size`` bytes, then served by
        the data plane (``Call.serve``) with the codec of its kind; a stream's message is told
        once it is held, so that the stream reads its next."""
        with self.runtime.plane.call((model,)) as call:  # nothing to await at either end
            call.admit(size)
            held = None if message_state is None else message_state.admitted.set
            return await call.serve(decode, decoded_bytes, needs, words, encode, on_held=held)


def _note_request_id(request_id: str, message_state: streams.Message | None) -> None:
    """The request's id, in the call's log line and on its stream message (an error's answer
    carries it)."""
    note_request_id(request_id)
    if message_state is not None:
        message_state.id = request_id


def _templated_needs(plan: Plan, template: PlanTemplate, size: int) -> Needs:
    """What a plan made from ``template`` holds beside its message of ``size`` bytes, and
    touches: as the template decided, the same for each of its plans."""
    return Needs(size + template.held_bytes, template.work_bytes)


def _operator_needs(plan: Plan, size: int, backend: Backend) -> Needs:
    """What an operator's plan holds beside its message of ``size`` bytes, and touches."""
    return Needs(plan.memory_needed(size, backend), plan.work_bytes)


def _carry_until_sent(admission: Admission, nbytes: int) -> None:
    """Count a unary call's answer of ``nbytes`` in admission until grpc has sent it, twice
    (``streams.SENT_COPIES``). The handler returns the answer and grpcio sends it, with the call's
    status, in one batch that its call's task awaits: the task this handler runs in, whose end
    (the answer sent, or the call cancelled) runs the callback added here, letting go of the
    bytes. The task's own callback, not the context's: grpcio keeps a context's callbacks on the
    call's state, which the context holds, a cycle that keeps every finished call's state (its
    core call with it) until the cycle collector runs. Called in the step of the event loop in
    which the inference's grant was released (``Admission.carry``)."""
    grant = admission.carry(streams.SENT_COPIES * nbytes)
    task = asyncio.current_task()
    assert task is not None, "a gRPC handler runs in its call's task"
    task.add_done_callback(lambda _: grant.release())


def _request_id_metadata() -> tuple[tuple[str, str], ...]:
    """The trailing metadata that tells the client the id its call was logged under."""
    note = call_var.get()
    return () if note is None else request_id_metadata(note.request_id)


def _load_parts(data: bytes, runtime: Runtime) -> tuple[str, str | None, dict[str, bytes]]:
    """A load's model name, configuration and files, from its walked message."""
    walked = load_wire.walk_load_request(data, runtime)
    _check_repository(walked.repository_name)
    config: str | None = None
    files: dict[str, bytes] = {}
    for name, span in walked.parameters.items():
        value = load_wire.value_of(data, span)
        if name == model_lifecycle.CONFIG and isinstance(value, str):
            config = value
        elif name != model_lifecycle.CONFIG and isinstance(value, bytes):
            files[name] = value
        else:
            raise InvalidRequest(
                f"parameters.{name[:100]}: 'config' is a string_param, a file a bytes_param",
                field=f"parameters.{name[:100]}",
                rule="parameter_type",
            )
    return walked.model_name, config, files


def _checked_request(data: bytes, limits: wire.WireLimits) -> pb.ModelInferRequest:
    """The request part of ``data`` (a ``wire.SplitRequest.message``), walked by the wire rules
    first, then parsed."""
    wire.check_nested(data, limits)
    return _parse(pb.ModelInferRequest, data)


def _message(message_type: type[M], document: dict[str, Any], *, partial: bool = False) -> M:
    """The message of an HTTP document: the one definition of metadata, configuration and
    statistics is the HTTP side's; ``partial`` drops the fields the message has no room for."""
    return json_format.ParseDict(document, message_type(), ignore_unknown_fields=partial)


def _check_repository(name: str) -> None:
    if name:
        raise OperatorNotFound(
            f"no model repository '{name[:100]}': this server has one, unnamed",
            field="repository_name",
            rule="unknown_repository",
        )


def _no_repository_parameters(
    parameters: Mapping[str, pb.ModelRepositoryParameter], accepted: tuple[str, ...]
) -> None:
    for name in parameters:
        if name in accepted:
            continue
        raise InvalidRequest(
            f"parameters.{name[:100]}: this server's models take no load or unload parameters "
            "(their configuration is the operator's, fixed)",
            field=f"parameters.{name[:100]}",
            rule="unsupported_parameter",
        )


__all__ = ["OPEN_WHEN", "SERVICE_NAME", "InferenceService"]
