"""The v2 inference endpoint, ``POST /v2/models/{model}[/versions/{version}]/infer``: the hot
path, written as a plain ASGI app.

A small inference is mostly per-request overhead, so this route skips what a Starlette or
FastAPI endpoint costs on every call: dependency and parameter solving, a ``Request`` and its
``Headers``, a ``Response`` and its header encoding, an exit stack for the admission. It reads
the three headers it needs in one pass, the body into one buffer (``receive_body``: bounded,
timed, decompressed), hands it to the data plane with the REST codec (``rest_infer.plan``,
``rest_infer.encode``), and sends the one response buffer they return. Every failure is a
``TensorbitsError`` raised before the first byte is sent, so the app's exception handlers (``api/errors.py``) shape it like any other.

The app registers ``ROUTES`` once (``api/fastpath.py``): served ahead of the framework, listed
in its route table, documented by ``v2_openapi.infer_operation``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol, TypeVar

from starlette.types import Receive, Scope, Send

from tensorbits.api import rest_graph, rest_infer, v2_openapi
from tensorbits.api.admitted import AdmittedRequest
from tensorbits.api.deps import runtime_of_app
from tensorbits.api.fastpath import FastRoute
from tensorbits.core.models import resolve_model, resolve_served, version_of
from tensorbits.logs import note_version
from tensorbits.runtime import Runtime
from tensorbits_protocol import codec, texts


class _Planned(Protocol):
    @property
    def work_bytes(self) -> int: ...


P = TypeVar("P", bound=_Planned)


async def _through_the_plane(
    runtime: Runtime,
    scope: Scope,
    receive: Receive,
    send: Send,
    model: str,
    decode: Callable[[bytearray, int | None], P],
    needed: Callable[[P, int], int],
    parts: str,
    encode: Callable[[P], codec.Framed],
) -> None:
    """One inference of ``model``, from the request's body to the response's last byte, through
    the data plane's lifecycle (core/dataplane.py): admitted for its declared body, ``decode``d
    and planned, admitted for what the plan ``needed`` beside the body (``parts``, in the
    refusal's words), ``encode``d into the response."""
    async with runtime.plane.call((model,)) as call:
        exchange = AdmittedRequest(runtime, scope)
        call.admitted(exchange.grant)
        body, header_length = await exchange.receive(receive)
        call.mark_received()
        json_bytes = len(body) if header_length is None else header_length
        planned = await call.plan(json_bytes, decode, body, header_length)
        call.hold(needed(planned, len(body)), "inference", parts, "body")
        framed = await call.run(planned.work_bytes, encode, planned)
        await exchange.send(send, framed)


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
            await _through_the_plane(
                runtime, scope, receive, send, graph.name,
                partial(
                    rest_graph.plan, graph, plane.limits, version=version, regions=plane.regions
                ),
                # what its plan holds beside the body (GraphPlan.needed_bytes)
                lambda request, body_bytes: body_bytes + request.needed_bytes,
                "body, outputs, work",
                partial(rest_graph.encode, backend=plane.backend),
            )  # fmt: skip
            return
        op = resolve_model(path["model"], version, plane.graphs)
        note_version(version_of(op))
        # Before the body is read or admitted: an unloaded model costs the server nothing. Here
        # and not in the planner, whose cached plans would skip the check.
        plane.models.check_loaded(op.name)
        await _through_the_plane(
            runtime, scope, receive, send, op.name,
            partial(rest_infer.plan, plane, op, version=version),
            lambda plan, body_bytes: plan.memory_needed(body_bytes, plane.backend),
            "body, output",
            partial(rest_infer.encode, backend=plane.backend, regions=plane.regions),
        )  # fmt: skip


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
