"""The v2 inference endpoint, ``POST /v2/models/{model}[/versions/{version}]/infer``: the hot
path, written as a plain ASGI app.

A small inference is mostly per-request overhead, so this route skips what a Starlette or
FastAPI endpoint costs on every call: dependency and parameter solving, a ``Request`` and its
``Headers``, a ``Response`` and its header encoding, an exit stack for the admission. It reads
the three headers it needs in one pass, the body into one buffer (``receive_body``: bounded,
timed, decompressed), hands it to the data plane with the REST codec (``rest_infer.plan``,
``rest_infer.encode``), and sends the one response buffer they return. Every failure is a
``TensorbitsError`` raised before the first byte is sent, so the app's exception handlers
(``api/errors.py``) shape it like any other.

The app registers ``ROUTES`` once (``api/fastpath.py``): served ahead of the framework, listed
in its route table, documented by ``v2_openapi.infer_operation``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TypeVar

from starlette.types import Receive, Scope, Send

from tensorbits.api import rest_graph, rest_infer, v2_openapi
from tensorbits.api.admitted import AdmittedRequest
from tensorbits.api.deps import runtime_of_app
from tensorbits.api.fastpath import FastRoute
from tensorbits.core.arrival import Arrival
from tensorbits.core.dataplane import Call, Decoder, Encoder, HoldWords, Needs, Reckoner
from tensorbits.core.graphs.request import GraphRequest
from tensorbits.core.models import resolve_model, resolve_served, version_of
from tensorbits.core.offload import JSON_INLINE_MAX_BYTES
from tensorbits.core.plan import Plan
from tensorbits.logs import note_version
from tensorbits.runtime import Runtime
from tensorbits_protocol import codec, texts

# What a refusal to hold an inference's memory names: the body is what the caller can shrink.
OPERATOR_WORDS = HoldWords("inference", "body, output", "body")
GRAPH_WORDS = HoldWords("inference", "body, outputs, work", "body")

# A front end's part of a call once its body is here: ``Call.serve`` with its codec, the body
# and its JSON header's length (None: the whole body is JSON) bound.
Serving = Callable[[Call, bytearray, int | None], Awaitable[codec.Framed]]
# Its part of a call whose body is planned from its JSON header while the rest arrives
# (``AdmittedRequest.header_first``): the call, the exchange and the header's length.
ArrivingServing = Callable[[Call, AdmittedRequest, int], Awaitable[codec.Framed]]

PlanT = TypeVar("PlanT")
# How a model's body is planned: the decoder, the JSON bytes it reads, what a plan of it needs.
Planning = Callable[[bytearray, int | None], tuple[Decoder[PlanT], int, Reckoner[PlanT]]]
# How a plan made while its body arrives is computed: as the body arrives (``Arrival``; None:
# once it is in), and the encoder of its answer.
Computing = Callable[[PlanT, bytearray], tuple[Arrival | None, Encoder[PlanT, codec.Framed]]]


async def through_the_plane(
    runtime: Runtime,
    scope: Scope,
    receive: Receive,
    send: Send,
    models: Sequence[str],
    serving: Serving,
    arriving: ArrivingServing | None = None,
) -> None:
    """One request on a plain ASGI endpoint (v2 inference, the /v1 batch), from its body to the
    response's last byte, through the data plane's lifecycle (core/dataplane.py): admitted for
    its declared body before a byte is read, received, ``serving``'s (``Call.serve``: planned,
    held, run), sent. ``models``: what its statistics count it for, when known before the plan.
    ``arriving``: how a large binary body is served instead, planned from its JSON header while
    the rest arrives. Every failure is raised before the first byte is sent, so the app's
    exception handlers answer it."""
    async with runtime.plane.call(models) as call:
        exchange = AdmittedRequest(runtime, scope)
        call.admitted(exchange.grant)
        header_length = None if arriving is None else exchange.header_first()
        if header_length is not None:
            assert arriving is not None
            framed = await arriving(call, exchange, header_length)
        else:
            body, header_length = await exchange.receive(receive)
            call.mark_received()
            framed = await serving(call, body, header_length)
        await exchange.send(send, framed)


async def serve_arriving(
    call: Call,
    exchange: AdmittedRequest,
    header_length: int,
    *,
    planning: Planning[PlanT],
    words: HoldWords,
    computing: Computing[PlanT],
) -> codec.Framed:
    """``ArrivingServing`` of a model: its body allocated and read (``receive_planned``); once
    its JSON header is in, planned and held (``Call.held``) and computed as the rest arrives, as
    ``computing`` says; then the rest of the run (``Call.run``)."""
    body = exchange.allocate()
    # The plan, what it needs (held) and its encoder, once the header is in.
    ready: tuple[PlanT, Needs, Encoder[PlanT, codec.Framed]] | None = None

    async def planned() -> Arrival | None:
        nonlocal ready
        call.mark_received()
        plan, needs = await call.held(*planning(body, header_length), words)
        arrival, encode = computing(plan, body)
        ready = (plan, needs, encode)
        return arrival

    await exchange.receive_planned(body, header_length, planned)
    assert ready is not None
    return await call.run(*ready)


def _json_bytes(body: bytearray, header_length: int | None) -> int:
    """The bytes of a v2 body that are JSON: its header's, or the whole body's."""
    return len(body) if header_length is None else header_length


class InferEndpoint:
    """The ASGI app of the infer routes: the model (and version) from the path, refused while
    the repository extension has it unloaded, then its inference through the data plane (a
    graph model's with its own codec, any number of outputs)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path_params"]
        version = path.get("version")
        texts.check_model(path["model"], version)  # as gRPC's wire bounds its fields
        runtime = runtime_of_app(scope["app"])
        plane = runtime.plane
        graph = plane.graphs.get(path["model"])
        if graph is not None:  # a graph model: its own codec, any number of outputs
            resolve_served(plane.graphs, graph.name, version)
            note_version(graph.version)

            def graph_planning(
                body: bytearray, header_length: int | None
            ) -> tuple[Decoder[GraphRequest], int, Reckoner[GraphRequest]]:
                def needs(request: GraphRequest) -> Needs:  # GraphPlan.needed_bytes beside it
                    return Needs(len(body) + request.needed_bytes, request.work_bytes)

                decode = partial(
                    rest_graph.plan, graph, plane.limits, body, header_length, version,
                    regions=plane.regions,
                )  # fmt: skip
                return decode, _json_bytes(body, header_length), needs

            async def serve_graph(
                call: Call, body: bytearray, header_length: int | None
            ) -> codec.Framed:
                return await call.serve(
                    *graph_planning(body, header_length),
                    GRAPH_WORDS,
                    partial(rest_graph.encode, backend=plane.backend),
                )

            def graph_computing(
                request: GraphRequest, body: bytearray
            ) -> tuple[Arrival | None, Encoder[GraphRequest, codec.Framed]]:
                arriving = rest_graph.arriving(request, plane.backend, body)
                encode = partial(rest_graph.encode, backend=plane.backend, arrival=arriving)
                return (None if arriving is None else arriving.arrival), encode

            arriving = partial(
                serve_arriving, planning=graph_planning, words=GRAPH_WORDS,
                computing=graph_computing,
            )  # fmt: skip
            await through_the_plane(
                runtime, scope, receive, send, (graph.name,), serve_graph, arriving
            )
            return
        op = resolve_model(path["model"], version, plane.graphs)
        note_version(version_of(op))
        # Before the body is read or admitted: an unloaded model costs the server nothing. Here
        # and not in the planner, whose cached plans would skip the check.
        plane.models.check_loaded(op.name)

        def planning(
            body: bytearray, header_length: int | None
        ) -> tuple[Decoder[Plan], int, Reckoner[Plan]]:
            """How a body is planned: the decoder, the JSON bytes it reads, what a plan needs."""
            decoded = _json_bytes(body, header_length)
            # A header small enough to be planned inline is looked up here: what a plan of a
            # template (without shared memory) holds and touches is the template's, decided once.
            found = (
                rest_infer.look_up(plane, op, body, header_length, version)
                if decoded < JSON_INLINE_MAX_BYTES
                else None
            )
            decode = partial(
                rest_infer.plan, plane, op, body, header_length, version=version, found=found
            )
            template = found.template if found is not None else None
            if template is not None and not template.in_shared_memory:
                decided = Needs(len(body) + template.held_bytes, template.work_bytes)

                def needs(plan: Plan) -> Needs:
                    return decided

            else:

                def needs(plan: Plan) -> Needs:
                    return Needs(plan.memory_needed(len(body), plane.backend), plan.work_bytes)

            return decode, decoded, needs

        async def serve_operator(
            call: Call, body: bytearray, header_length: int | None
        ) -> codec.Framed:
            decode, decoded, needs = planning(body, header_length)
            return await call.serve(
                decode,
                decoded,
                needs,
                OPERATOR_WORDS,
                partial(rest_infer.encode, backend=plane.backend, regions=plane.regions),
            )

        def computing(
            plan: Plan, body: bytearray
        ) -> tuple[Arrival | None, Encoder[Plan, codec.Framed]]:
            arrival = rest_infer.arriving(plan, plane.backend, body)
            encode = partial(
                rest_infer.encode, backend=plane.backend, regions=plane.regions, arrival=arrival
            )
            return arrival, encode

        arriving = partial(
            serve_arriving, planning=planning, words=OPERATOR_WORDS, computing=computing
        )
        await through_the_plane(runtime, scope, receive, send, (op.name,), serve_operator, arriving)


_ENDPOINT = InferEndpoint()
# Registered once: the app serves these ahead of the framework and lists them in its route table
# (api/fastpath.py); the OpenAPI document has their operations from v2_openapi.
ROUTES = [
    FastRoute(
        "/v2/models/{model}/infer",
        _ENDPOINT,
        methods=["POST"],
        operation=v2_openapi.infer_operation("model_infer", "Run the operator"),
    ),
    FastRoute(
        "/v2/models/{model}/versions/{version}/infer",
        _ENDPOINT,
        methods=["POST"],
        operation=v2_openapi.infer_operation(
            "model_version_infer", "Run the operator (one version)"
        ),
    ),
]
