"""The REST form of a graph model's inference: a request body in, a framed response out, with
any number of outputs (the operators' codec, ``rest_infer.py``, answers their one output).

``plan`` decodes the body (``InferRequest.from_rest``: the JSON, the framing, the counts) and
checks it against the graph model (``core.graphs.request.plan_request``), its tensors in shared
memory located in ``regions``. ``encode`` runs it: when no output asked for goes back as JSON
data, the response's buffer is laid out first and the graph writes each binary output straight
into its place in it; otherwise the outputs are computed first and the JSON ones written into
the header as data. An output written into shared memory is in the header alone, its name, type
and shape, as an operator's is (``Tensor.document``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from tensorbits.api.rest_infer import check_named
from tensorbits.core.arrival import Arrival
from tensorbits.core.backends.base import Backend
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.request import (
    AnsweredOutput,
    GraphRequest,
    arrives,
    plan_request,
    run_request,
)
from tensorbits.core.graphs.request import arriving as arriving_request
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits_protocol import codec
from tensorbits_protocol.dtypes import wire_dtype
from tensorbits_protocol.infer import InferRequest, InferResponse, RequestLimits, Tensor
from tensorbits_protocol.jsondata import encode_data

HostArray = np.ndarray[Any, Any]


def plan(
    model: GraphModel,
    limits: RequestLimits,
    body: bytearray,
    header_length: int | None,
    version: str | None,
    regions: SharedMemoryRegions | None = None,
) -> GraphRequest:
    head, tail = codec.split_body(memoryview(body), header_length)
    request = InferRequest.from_rest(
        bytes(head), tail, model=model.name, header_given=header_length is not None, limits=limits
    )
    check_named(request, model.name, model.version, version)
    return plan_request(model, request, limits, regions)


def _response(request: GraphRequest, data: dict[str, list[object]]) -> InferResponse:
    outputs = tuple(
        Tensor(
            a.planned.name, a.planned.datatype, a.planned.shape,
            data=None if a.binary else data[a.planned.name], shared_memory=a.shared,
        )
        for a in request.answered
    )  # fmt: skip
    return InferResponse(request.model.name, outputs, request.model.version, request.request_id)


class Arriving(NamedTuple):
    """A graph computed as its body arrives (``arriving``), and its answer once it is done."""

    arrival: Arrival
    framed: codec.Framed


def arriving(request: GraphRequest, backend: Backend, body: bytearray) -> Arriving | None:
    """How ``request``, planned from ``body``'s JSON header while its tensors still arrive, is
    computed as they do (``core.graphs.request.arriving``): every output binary, written into
    the response laid out now; None: once the body is in, as any request (``encode``)."""
    if not (request.answered and arrives(request) and all(a.binary for a in request.answered)):
        return None
    layout = _response(request, {}).to_rest()
    answer, tails = layout.allocate()
    arrival = arriving_request(request, backend, _into(request.answered, tails), memoryview(body))
    if arrival is None:
        return None
    return Arriving(arrival, codec.Framed((answer,), layout.header_length))


def _into(answered: Sequence[AnsweredOutput], tails: Sequence[memoryview]) -> dict[str, HostArray]:
    """Each answered output's array over its place in the response's buffer."""
    return {
        a.planned.name: np.frombuffer(tail, wire_dtype(a.planned.datatype)).reshape(a.planned.shape)
        for a, tail in zip(answered, tails, strict=True)
    }


def encode(
    request: GraphRequest, backend: Backend, arrival: Arriving | None = None
) -> codec.Framed:
    """Run the graph and encode the response (see the module's docstring). ``arrival``: the
    graph computed in part already, as the body arrived: the rest computed here."""
    if arrival is not None:
        arrival.arrival.finish()
        return arrival.framed
    in_body = [a for a in request.answered if a.shared is None]
    if all(a.binary for a in in_body):
        layout = _response(request, {}).to_rest()
        if not layout.sizes:  # every output in shared memory: the header alone
            run_request(request, backend)
            return codec.Framed.json(layout.header)
        body, tails = layout.allocate()
        run_request(request, backend, _into(in_body, tails))
        return codec.Framed((body,), layout.header_length)
    # JSON text's length decides where the binary outputs go, so the graph runs into arrays of
    # its own first: each binary output is copied once into the body (requests mixing JSON and
    # binary outputs are small: JSON outputs are bounded by TENSORBITS_MAX_JSON_ELEMENTS).
    arrays = run_request(request, backend)
    data = {
        a.planned.name: encode_data(a.planned.name, arrays[a.planned.name])
        for a in in_body
        if not a.binary
    }
    layout = _response(request, data).to_rest()
    if not layout.sizes:
        return codec.Framed.json(layout.header)
    body, tails = layout.allocate()
    binary = [a for a in in_body if a.binary]
    for answered, tail in zip(binary, tails, strict=True):
        array = arrays[answered.planned.name]
        np.frombuffer(tail, np.uint8)[:] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return codec.Framed((body,), layout.header_length)


__all__ = ["Arriving", "arriving", "encode", "plan"]
