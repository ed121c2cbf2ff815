"""The v2 inference endpoint, ``POST /v2/models/{model}[/versions/{version}]/infer``: the hot
path, written as a plain ASGI app.

A small inference is mostly per-request overhead, so this route skips what a Starlette or
FastAPI endpoint costs on every call: dependency and parameter solving, a ``Request`` and its
``Headers``, a ``Response`` and its header encoding, an exit stack for the admission. It reads
the three headers it needs in one pass, the body into one buffer (``receive_body``: bounded,
timed, decompressed), hands it to ``inference.plan_rest`` and ``inference.execute``, and sends the
one response buffer they return. Every failure is a ``TensorbitsError`` raised before the first
byte is sent, so the app's exception handlers (``api/errors.py``) shape it like any other.

The app registers ``ROUTES`` once (``api/fastpath.py``): served ahead of the framework, listed
in its route table, documented by ``v2_openapi.infer_operation``.
"""

from __future__ import annotations

from time import perf_counter_ns

from starlette.types import Receive, Scope, Send

from tensorbits import inference
from tensorbits.api import v2_openapi
from tensorbits.api.admitted import AdmittedRequest
from tensorbits.api.deps import runtime_of_app
from tensorbits.api.fastpath import FastRoute
from tensorbits.offload import COMPUTE_INLINE_MAX_BYTES, JSON_INLINE_MAX_BYTES, offload
from tensorbits.runtime import Runtime
from tensorbits_protocol.operators import OperatorSpec


async def run_inference(
    op: OperatorSpec,
    runtime: Runtime,
    scope: Scope,
    receive: Receive,
    send: Send,
    version: str | None = None,
) -> None:
    """One inference of ``op`` (at the URL's ``version``, if it names one), from the request's
    body to the response's last byte, counted in ``runtime.statistics`` (statistics.py says
    what each phase's time is)."""
    started = perf_counter_ns()
    try:
        exchange = AdmittedRequest(runtime, scope)
        try:
            body, header_length = await exchange.receive(receive)
            received = perf_counter_ns()
            json_bytes = len(body) if header_length is None else header_length
            plan = await offload(
                json_bytes, JSON_INLINE_MAX_BYTES, inference.plan_rest, op, body, header_length,
                runtime.limits, runtime.v2_plans, runtime.shared_memory, version,
            )  # fmt: skip
            exchange.grow(
                plan.memory_needed(len(body), runtime.selection.backend),
                "inference",
                "body, output",
                "body",
            )
            planned = perf_counter_ns()
            framed = await offload(
                plan.work_bytes, COMPUTE_INLINE_MAX_BYTES, inference.execute, plan,
                runtime.selection.backend, runtime.shared_memory,
            )  # fmt: skip
            executed = perf_counter_ns()
            await exchange.send(send, framed)
        finally:
            exchange.release()
    except BaseException:
        runtime.statistics.record_failure(op.name, perf_counter_ns() - started)
        raise
    sent = perf_counter_ns()
    runtime.statistics.record(
        op.name, 0, planned - received, executed - planned, sent - executed, sent - started
    )


class InferEndpoint:
    """The ASGI app of the infer routes: the model (and version) from the path, refused while
    the repository extension has it unloaded, then ``run_inference``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path_params"]
        version = path.get("version")
        op = inference.resolve_model(path["model"], version)
        runtime = runtime_of_app(scope["app"])
        # Before the body is read or admitted: an unloaded model costs the server nothing. Here
        # and not in the planner, whose cached plans (runtime.v2_plans) would skip the check.
        runtime.models.check_loaded(op.name)
        await run_inference(op, runtime, scope, receive, send, version)


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
