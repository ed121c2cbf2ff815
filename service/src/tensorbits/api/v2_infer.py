"""The v2 inference endpoint, ``POST /v2/models/{model}[/versions/{version}]/infer``: the hot
path, written as a plain ASGI app.

A small inference is mostly per-request overhead, so this route skips what a Starlette or
FastAPI endpoint costs on every call: dependency and parameter solving, a ``Request`` and its
``Headers``, a ``Response`` and its header encoding, an exit stack for the admission. It reads
the three headers it needs in one pass, the body into one buffer (``receive_body``: bounded,
timed, decompressed), hands it to ``inference.plan`` and ``inference.execute``, and sends the
one response buffer they return. Every failure is a ``TensorbitsError`` raised before the first
byte is sent, so the app's exception handlers (``api/errors.py``) shape it like any other.

The app serves ``ROUTES`` ahead of the framework (``api/fastpath.py``); ``v2.py`` keeps FastAPI
twins of the same paths for the OpenAPI schema and the docs, which run this same code if ever
reached.
"""

from __future__ import annotations

from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from tensorbits import inference
from tensorbits.api.body import declared_length, header_values, receive_body
from tensorbits.api.deps import runtime_of_app
from tensorbits.api.offload import offload
from tensorbits.runtime import Runtime
from tensorbits_protocol import codec
from tensorbits_protocol.operators import OperatorSpec

# Work below these sizes runs on the event loop: a hop to a worker thread costs more than it.
# JSON is slow to parse per byte (about 20 ms per MiB), binary tensors fast (about 0.1 ms per MiB).
JSON_INLINE_MAX_BYTES = 64 << 10
COMPUTE_INLINE_MAX_BYTES = 1 << 20

_HEADER_LENGTH = codec.HEADER_LENGTH.lower().encode()


def _response_start(encoded: inference.Encoded) -> Message:
    headers = [
        (b"content-type", encoded.media_type.encode()),
        (b"content-length", str(len(encoded.body)).encode()),
    ]
    headers += [(k.lower().encode(), v.encode()) for k, v in encoded.headers.items()]
    return {"type": "http.response.start", "status": 200, "headers": headers}


async def run_inference(
    op: OperatorSpec, runtime: Runtime, scope: Scope, receive: Receive, send: Send
) -> None:
    """One inference of ``op``, from the request's body to the response's last byte."""
    settings = runtime.settings
    length_value, encoding, header_length_value = header_values(
        scope, b"content-length", b"content-encoding", _HEADER_LENGTH
    )
    # Admitted for the declared body before a byte is read: many clients declaring large bodies
    # at once get 503s instead of each making the server allocate its body.
    declared = declared_length(length_value, settings.max_body_bytes)
    grant = runtime.admission.acquire(declared or 0)
    try:
        body = await receive_body(
            receive, declared, encoding, settings.max_body_bytes, settings.timeout_body_read
        )
        header_length = codec.parse_header_length(header_length_value, len(body))
        json_bytes = len(body) if header_length is None else header_length
        plan = await offload(
            json_bytes, JSON_INLINE_MAX_BYTES, inference.plan, op, body, header_length,
            runtime.limits, runtime.v2_plans,
        )  # fmt: skip
        grant.grow(len(body) - (declared or 0) + plan.output_nbytes)
        encoded = await offload(
            plan.work_bytes, COMPUTE_INLINE_MAX_BYTES, inference.execute, plan,
            runtime.selection.backend,
        )  # fmt: skip
        await send(_response_start(encoded))
        await send({"type": "http.response.body", "body": encoded.body})
    finally:
        # Held until the last byte is handed to the server: the response buffer is part of
        # what admission bounds.
        grant.release()


class InferEndpoint:
    """The ASGI app of the infer routes: the model (and version) from the path, then
    ``run_inference``."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path_params"]
        op = inference.resolve_model(path["model"], path.get("version"))
        await run_inference(op, runtime_of_app(scope["app"]), scope, receive, send)


class _Route(Route):
    """A Starlette route that records itself in the scope as FastAPI's routes do, so metrics and
    logs label its requests by the route template."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self
        return match, child_scope


_ENDPOINT = InferEndpoint()
ROUTES = [
    _Route("/v2/models/{model}/infer", _ENDPOINT, methods=["POST"]),
    _Route("/v2/models/{model}/versions/{version}/infer", _ENDPOINT, methods=["POST"]),
]
