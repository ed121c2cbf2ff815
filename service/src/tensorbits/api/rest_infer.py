"""The REST form of a v2 inference: a request body in, a framed response out (the HTTP front
end's codec around the core).

``plan`` decodes a body (``InferRequest.from_rest``: the JSON, the framing, the tensor counts),
checks the model the body names against the URL's, and plans it (``core.plan``). It remembers
the plans of repeated headers whose inputs are binary or in shared memory in the data plane's
cache (``template_of``: the header's bytes and the tail's length are the key), so a repeated
request is not decoded again (its regions are located again: ``PlanTemplate.plan``). ``encode``
runs a plan into the response: it knows the output's shape and type, so it writes the JSON
header first, allocates ONE buffer for header plus output, and has the kernel write the output
straight into that buffer's tail, which is sent as it is (no copy from output to response). A
large output of an input's type and shape is written over that input's bytes in the request's
body instead (``written_over``): no buffer at all, the answer sent as its header and those bytes;
when the request was planned from its header while the body arrived, in pieces as the inputs'
bytes came (``arriving``, ``core/arrival.py``), the last of them computed here.
Plain functions, CPU-bound: the data plane decides whether they run on a worker thread.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, NamedTuple

import numpy as np

from tensorbits.core.arrival import Arrival
from tensorbits.core.backends.base import Backend
from tensorbits.core.dataplane import DataPlane
from tensorbits.core.engine import writes_over
from tensorbits.core.models import MODEL_VERSION
from tensorbits.core.plan import Plan, PlanTemplate
from tensorbits.core.plan import plan as plan_request
from tensorbits.core.run import run_to_host, run_to_region
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import wire_dtype
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import InferRequest
from tensorbits_protocol.jsondata import encode_data
from tensorbits_protocol.operators import OperatorSpec

# A binary output at least this large is written over an input in the request's body
# (``written_over``); below it a new buffer is cheap (its pages are reused, not faulted in), and
# the answer stays one part.
IN_PLACE_MIN_BYTES = 1 << 20
# The front end's tag in the data plane's cache keys: gRPC keys its own form there too.
CACHE_TAG = "rest"
# A body without Inference-Header-Content-Length is keyed apart: the same bytes sent with the
# header may plan otherwise (an empty binary input is refused without it).
JSON_BODY_TAG = "rest-json"


class Found(NamedTuple):
    """A body's JSON header and tail, split, and what the plane's cache holds for them: the
    ``key`` they are kept under (None: too long to be kept) and the template planned before."""

    header: bytes
    tail: memoryview
    key: Hashable | None
    template: PlanTemplate | None


def look_up(
    plane: DataPlane,
    op: OperatorSpec,
    body: bytearray,
    header_length: int | None,
    version: str | None = None,
) -> Found:
    """Split a REST body and look its header up in the plane's cache (``plan`` does, when not
    given the outcome): a front end that knows the template reads what a plan of it holds and
    touches from the template, as the gRPC side does, not from the plan at every call."""
    head, tail = codec.split_body(memoryview(body), header_length)
    header = bytes(head)
    # A JSON body without binary data is a header too (what tritonclient sends when every
    # tensor is in shared memory): kept when its inputs all are (``template_of``).
    if not plane.keeps(len(header)):
        return Found(header, tail, None, None)
    tag = CACHE_TAG if header_length is not None else JSON_BODY_TAG
    key = (tag, op.name, version, header, len(tail))
    return Found(header, tail, key, plane.template(key, len(header)))


def plan(
    plane: DataPlane,
    op: OperatorSpec,
    body: bytearray,
    header_length: int | None,
    version: str | None = None,
    found: Found | None = None,
) -> Plan:
    """Decode and plan one REST inference request for ``op`` (at the URL's ``version``, if it
    names one); raise on anything wrong with it. ``found``: ``look_up``'s outcome for this body,
    when the caller has it.

    A header whose inputs are all binary or in shared memory, planned before, is not decoded
    again (the plane's cache): the plan is rebuilt from what it decided, with views of this
    body's bytes, its regions located again."""
    if found is None:
        found = look_up(plane, op, body, header_length, version)
    header, tail, key, template = found
    if template is not None:  # its regions located again, as planning locates them
        return template.plan((tail,), plane.regions)
    limits = plane.limits
    request = InferRequest.from_rest(
        header, tail, model=op.name, header_given=header_length is not None, limits=limits
    )
    check_named_model(request, op, version)
    planned = plan_request(op, request, limits, plane.regions)
    if key is not None and all(
        t.raw is not None or t.shared_memory is not None for t in request.inputs
    ):
        plane.remember(key, template_of(planned, request, plane.backend), len(header))
    return planned


def template_of(planned: Plan, request: InferRequest, backend: Backend) -> PlanTemplate:
    """The template of a plan made from a request whose inputs are binary or in shared memory,
    run on ``backend``: where each binary input's bytes lie in the tail (``codec.spans``, in the
    order sent; one in shared memory has none there)."""
    places = codec.spans(
        None if tensor.raw is None else tensor.raw.nbytes for tensor in request.inputs
    )
    where = {
        tensor.name: (0, slice(*place), wire_dtype(tensor.datatype), tensor.shape)
        for tensor, place in zip(request.inputs, places, strict=True)
        if place is not None
    }
    header = planned.response().to_rest().header if planned.binary_output else None
    return PlanTemplate.decided(planned, where, backend, response_head=header)


def encode(
    plan: Plan,
    backend: Backend,
    regions: SharedMemoryRegions | None = None,
    arrival: Arrival | None = None,
) -> codec.Framed:
    """Run a plan and encode the response (binary: one buffer, written in place; shared
    memory: the inputs read first, the output written into its region, the response its JSON
    header alone). Called once the request is admitted for ``plan.memory_needed``.

    A large binary output that ``written_over`` allows is written over its input's bytes in
    the request's body, and sent as two parts, the JSON header and a view of those bytes: no
    buffer allocated, its pages not faulted in. Its hold stays ``plan.memory_needed``, which
    counts the output's bytes too: an upper bound, never short. ``arrival``: that output
    computed in part already, as the body arrived (``arriving``): the rest computed here."""
    if plan.shared_output is not None:
        assert regions is not None  # plan() refused shared memory without regions
        run_to_region(plan, backend, regions)
        return codec.Framed.json(plan.response().to_rest().header)
    call = plan.call
    dtype = wire_dtype(call.output_datatype)
    if plan.binary_output:
        over = written_over(plan, backend) if arrival is None else arrival.over
        if over is not None:  # no buffer: the output over the input's bytes in the body
            head = plan.response_head
            if head is None:
                head = plan.response().to_rest().header
            out = plan.inputs[over]
            if arrival is None:
                run_to_host(plan, backend, regions, out)
            else:
                arrival.finish()
            return codec.Framed((head, out.reshape(-1).view(np.uint8).data), len(head))
        if plan.response_head is not None:
            layout = codec.BodyLayout(plan.response_head, (plan.output_nbytes,))
        else:
            layout = plan.response().to_rest()
        body, (tail,) = layout.allocate()
        run_to_host(plan, backend, regions, np.frombuffer(tail, dtype).reshape(call.output_shape))
        return codec.Framed((body,), layout.header_length)
    out = np.empty(call.output_shape, dtype)
    run_to_host(plan, backend, regions, out)
    return codec.Framed.json(plan.response(encode_data(plan.op.output, out)).to_rest().header)


def arriving(plan: Plan, backend: Backend, body: bytearray) -> Arrival | None:
    """How ``plan``, made from ``body``'s JSON header while its tensors' bytes still arrive, is
    computed as they do (``core/arrival.py``): when its output is written over an input in the
    body (``written_over``), in ranges of whole rows when an input is broadcast; None: once the
    body is all in, as any plan."""
    over = written_over(plan, backend)
    return None if over is None else Arrival.of_call(plan, backend, memoryview(body), over)


def written_over(plan: Plan, backend: Backend) -> int | None:
    """The position of the input whose bytes in the request's body the output of ``plan`` is
    written over (the answer then its JSON header and a view of those bytes, no new buffer), or
    None: a new buffer, as for any other answer. Every condition, and why:

    - a binary output (JSON is text made apart) of at least ``IN_PLACE_MIN_BYTES``: tested
      first, so a small answer pays one comparison; below it the new buffer costs little;
    - no tensor in shared memory (the output is sent, not written into a region; an input read
      from a region runs streamed through the regions' buffers, ``run.run_streamed``);
    - the kernel may write over the input (``engine.writes_over``: proven alias-safe on this
      backend, the input of the output's type and shape and the kernel's); any other input may
      be broadcast: computed as the body arrives, it is awaited whole and the pieces are whole
      rows (``engine.rows``), each operand a view;
    - no other input sharing its memory (the body's tensors lie side by side, never
      overlapping): a broadcast input over the output's bytes would be read once written;
    - the input a view of the request's body, a bytearray (not data decoded from JSON, not
      read-only bytes): the body is the request's own, admitted already, and nothing reads
      the input after the kernel, so writing over it changes nothing but the answer;
    - writable, C-contiguous (the answer is its bytes in order) and in native byte order (a
      swapped view's bits are the output's only after a conversion the kernel does not do)."""
    if plan.output_nbytes < IN_PLACE_MIN_BYTES or not plan.binary_output:
        return None
    if plan.shared_inputs or plan.shared_output is not None:
        return None
    inputs = plan.inputs
    for position, x in enumerate(inputs):
        if (
            writes_over(plan.call, backend, position, x.dtype, x.shape)
            and x.flags.writeable
            and x.flags.c_contiguous
            and x.dtype.isnative
            and _in_body(x)
            and not any(np.may_share_memory(x, y) for y in inputs if y is not x)
        ):
            return position
    return None


def _in_body(x: np.ndarray[Any, Any]) -> bool:
    """Whether ``x`` views a bytearray through a memoryview: a binary input in the request's
    body (``np.frombuffer`` of a slice of it), as no other input of a plan without shared
    memory is (one decoded from JSON owns its array)."""
    base: object = x.base  # NumPy's stubs say an array or None; frombuffer's is the buffer
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, bytearray)


def check_named_model(request: InferRequest, op: OperatorSpec, version: str | None) -> None:
    """The model (and version) a REST body names beside its URL, as KServe's REST client
    writes them: accepted when they are the URL's ``op`` and ``version`` (a URL without one
    asks for the server's choice, ``MODEL_VERSION``), refused naming both when not: never
    answered for another model than the one the caller meant."""
    check_named(request, op.name, MODEL_VERSION, version)


def check_named(request: InferRequest, name: str, served: str, version: str | None) -> None:
    """``check_named_model`` for a model called ``name`` whose version is ``served``."""
    named = request.model_name
    if named is not None and named != name:
        raise InvalidRequest(
            f"model_name '{named[:100]}' in the request body is not the model the URL names, "
            f"'{name[:100]}'",
            field="model_name",
            rule="model_mismatch",
        )
    named = request.model_version
    meant = served if version is None else version
    if named is not None and named != meant:
        where = "the URL names" if version is not None else "a URL without one asks for"
        raise InvalidRequest(
            f"model_version '{named[:40]}' in the request body is not the version {where}, "
            f"'{meant[:40]}'",
            field="model_version",
            rule="model_mismatch",
        )


__all__ = [
    "IN_PLACE_MIN_BYTES",
    "Found",
    "arriving",
    "check_named",
    "check_named_model",
    "encode",
    "look_up",
    "plan",
    "template_of",
    "written_over",
]
