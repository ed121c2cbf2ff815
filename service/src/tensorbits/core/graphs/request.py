"""A v2 inference of a graph model, protocol-neutral: a decoded ``InferRequest`` checked against
the model and planned (``plan_request``), then run into host arrays the front end provides
(``run_request``). Inputs are matched to the graph's by name; the outputs asked for (every one
when the request names none) come back in the order asked, each as binary data or JSON data by
the request's and the output's ``binary_data`` parameters, or written into the shared-memory
region the output names.

Shared memory (Triton's system and CUDA extensions, shared_memory.py) is taken as an operator
takes it, through the same helpers and in the same words (core/plan.py, core/run.py): each
tensor located and bounded in its region when planned (``plan.locate_shared``), an output's
region overlapping no input's (``plan.check_aliasing``: a graph writes no output over an input);
the inputs read when the request runs (``run.shared_read``), the outputs written into their
regions once the graph has run. A tensor in a CUDA region stays on the device: the program reads
an input where it is (a device array over the client's memory) and writes an output into its
region's memory itself, so a graph whose tensors all lie in CUDA regions moves no byte between
the host and the device (the fused kernel reads and writes the client's memory directly); each
region is held, and its bounds checked again, for the whole run."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, NamedTuple

import numpy as np

from tensorbits.core.arrival import Arrival
from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.placement import Residence, Work, WorkKind, placed
from tensorbits.core.device_wait import finish, hold
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.plan import GraphPlan
from tensorbits.core.graphs.program import ModelPlan, PlannedTensor
from tensorbits.core.graphs.refusals import invalid
from tensorbits.core.graphs.run import fused_runner
from tensorbits.core.kernels import DeviceArray
from tensorbits.core.plan import (
    SharedInput,
    answered_binary,
    check_aliasing,
    check_output,
    locate_shared,
    requested_outputs,
)
from tensorbits.core.run import shared_read
from tensorbits.core.shared_memory import Location, SharedMemoryRegions
from tensorbits_protocol.dtypes import itemsize, wire_dtype
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import (
    InferRequest,
    RequestedOutput,
    RequestLimits,
    SharedMemoryRef,
)

HostArray = np.ndarray[Any, Any]
JSON_BYTES_PER_ELEMENT = 8


class AnsweredOutput(NamedTuple):
    """An output the response carries: the plan's, whether as binary data (always, for one in
    shared memory), and the region it is written into (``on_device``: a CUDA region)."""

    planned: PlannedTensor
    binary: bool
    shared: SharedMemoryRef | None = None
    on_device: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.planned.shape) * itemsize(self.planned.datatype)


class GraphRequest(NamedTuple):
    """A checked inference of a graph model, ready to run: its inputs in the request
    (``inputs``) and in shared memory (``shared_inputs``, read from ``regions`` when it runs)."""

    model: GraphModel
    plan: ModelPlan
    inputs: Mapping[str, HostArray]
    answered: tuple[AnsweredOutput, ...]
    request_id: str | None
    shared_inputs: tuple[SharedInput, ...] = ()
    regions: SharedMemoryRegions | None = None

    @property
    def needed_bytes(self) -> int:
        """Memory the run holds beyond the request's own bytes: the graph's inputs, outputs and
        work (``ModelPlan.needed_bytes``), and JSON text for outputs sent as JSON. The plan's
        inputs are all of them, those read from shared memory among them (a system region's
        bytes are read into host memory), and its outputs all of them, those written into a
        region among them (one for a system region computed in host memory first). A tensor in
        a CUDA region is counted too though it takes no host memory: the bound stays one rule
        for every placement."""
        return self.plan.needed_bytes + sum(
            math.prod(a.planned.shape) * JSON_BYTES_PER_ELEMENT
            for a in self.answered
            if not a.binary
        )

    @property
    def work_bytes(self) -> int:
        return self.needed_bytes


def _answered(
    plan: ModelPlan,
    requested: Sequence[RequestedOutput],
    request: InferRequest,
    limits: RequestLimits,
) -> tuple[AnsweredOutput, ...]:
    """The outputs the response carries, in the order asked. Every output the plan computes is
    held to the element bound first, in the operators' words (``check_output``), before
    anything is allocated: those asked for, and any the program computes beside them (a
    binding graph's, bounded when its file was read as well)."""
    by_name = {o.name: o for o in plan.outputs}
    answered = []
    for output in requested:
        planned, shared = by_name.pop(output.name), output.shared_memory
        binary = answered_binary(request, output) or shared is not None
        check_output(planned.name, planned.datatype, planned.shape, binary, limits)
        answered.append(AnsweredOutput(planned, binary, shared))
    for planned in by_name.values():  # computed though not asked for
        check_output(planned.name, planned.datatype, planned.shape, True, limits)
    return tuple(answered)


def _located(
    model: GraphModel,
    answered: AnsweredOutput,
    inputs: Mapping[str, Location],
    outputs: dict[str, Location],
    regions: SharedMemoryRegions | None,
) -> AnsweredOutput:
    """``answered`` with its region located and checked, when it goes to one: overlapping no
    input's bytes, nor those of an output located before it (``outputs``, which it joins): two
    outputs written over each other would leave whichever came last."""
    planned = answered.planned
    if answered.shared is None:
        return answered
    place = locate_shared(
        regions, answered.shared, answered.nbytes, planned.datatype, planned.name, "output"
    )
    check_aliasing(model.name, planned.name, place, inputs)
    for other, where in outputs.items():
        if where.overlaps(place):
            raise InvalidRequest(
                f"output '{planned.name}': its shared-memory bytes overlap output '{other}''s; "
                f"each output of {model.name} needs bytes of its own",
                field=planned.name,
                rule="output_overlap",
            )
    outputs[planned.name] = place
    return answered._replace(on_device=place.on_device)


def check_batch(model: GraphModel, request: InferRequest) -> None:
    """Triton's batch rule, for a model whose ``max_batch_size`` is above 0: each input's first
    dimension is the request's batch, one size for every input, at most ``max_batch_size``."""
    batch: tuple[str, int] | None = None
    for tensor in request.inputs:
        if not tensor.shape:
            raise invalid(
                tensor.name[:100],
                "max_batch_size",
                f"shape []: the model's max_batch_size is {model.max_batch_size}, so an input's "
                "first dimension is its batch",
            )
        size = tensor.shape[0]
        if size > model.max_batch_size:
            raise invalid(
                tensor.name[:100],
                "max_batch_size",
                f"a batch of {size} (its first dimension); the model's max_batch_size is "
                f"{model.max_batch_size}",
            )
        if batch is not None and size != batch[1]:
            raise invalid(
                tensor.name[:100],
                "batch_size",
                f"a batch of {size} (its first dimension); input {batch[0][:100]!r} has a batch "
                f"of {batch[1]}: one batch per request",
            )
        batch = batch or (tensor.name, size)


def plan_request(
    model: GraphModel,
    request: InferRequest,
    limits: RequestLimits,
    regions: SharedMemoryRegions | None = None,
) -> GraphRequest:
    """``request`` checked against ``model`` and planned (a refusal names the tensor, or the
    node whose rule the shapes break, and the rule). Tensors in shared memory need ``regions``
    (the server's, when the extensions are on): they are located and checked here."""
    declared = {decl.name: decl for decl in model.inputs}
    for tensor in request.inputs:
        decl = declared.get(tensor.name)
        if decl is not None and tensor.datatype != decl.datatype:
            raise invalid(
                tensor.name[:100],
                "datatype",
                f"{tensor.datatype.value}; the model takes {decl.datatype.value}",
            )
    if model.max_batch_size > 0:
        check_batch(model, request)
    requested = requested_outputs(model.name, [o.name for o in model.outputs], request)
    # Only the outputs asked for are planned, so only they (and what they read) are computed.
    plan = model.program.plan(
        {t.name: t.shape for t in request.inputs}, [o.name for o in requested]
    )
    answered = _answered(plan, requested, request, limits)
    arrays: dict[str, HostArray] = {}
    shared: list[SharedInput] = []
    places: dict[str, Location] = {}
    for index, tensor in enumerate(request.inputs):
        ref = tensor.shared_memory
        if ref is None:
            arrays[tensor.name] = tensor.array()
            continue
        place = locate_shared(regions, ref, tensor.nbytes, tensor.datatype, tensor.name, "input")
        places[tensor.name] = place
        shared.append(
            SharedInput(
                index, tensor.name, ref, wire_dtype(tensor.datatype), tensor.shape,
                place.on_device,
            )
        )  # fmt: skip
    outputs: dict[str, Location] = {}
    answered = tuple(_located(model, a, places, outputs, regions) for a in answered)
    return GraphRequest(model, plan, arrays, answered, request.id, tuple(shared), regions)


def output_arrays(request: GraphRequest) -> dict[str, HostArray]:
    """A fresh host array for every output of the plan (those it computes)."""
    return {o.name: np.empty(o.shape, wire_dtype(o.datatype)) for o in request.plan.outputs}


@contextmanager
def _all_inputs(request: GraphRequest) -> Iterator[Mapping[str, HostArray | DeviceArray]]:
    """Every input of ``request``, for the block: those in shared memory read
    (``run.shared_read``: one in a system region into a host buffer, one in a CUDA region as a
    device array over the client's memory, read where it is, its region held)."""
    if not request.shared_inputs:
        yield request.inputs
        return
    assert request.regions is not None  # plan_request refused shared memory without regions
    inputs: dict[str, HostArray | DeviceArray] = dict(request.inputs)
    with shared_read(request.shared_inputs, request.regions) as arrays:
        for shared, array in zip(request.shared_inputs, arrays, strict=True):
            inputs[shared.name] = array
        yield inputs


@contextmanager
def _device_outputs(request: GraphRequest) -> Iterator[dict[str, DeviceArray]]:
    """The outputs asked for in CUDA regions, for the block: each its region's bytes as a
    device array of the output's type and shape (the client's memory, which the graph writes
    in place), its bounds checked again and its region held until the block ends."""
    device = [a for a in request.answered if a.shared is not None and a.on_device]
    if not device:
        yield {}
        return
    assert request.regions is not None  # plan_request refused shared memory without regions
    views: dict[str, DeviceArray] = {}
    with ExitStack() as held:
        for answered in device:
            assert answered.shared is not None
            planned = answered.planned
            raw = held.enter_context(
                request.regions.device_bytes(
                    answered.shared, answered.nbytes, planned.name, "output"
                )
            )
            views[planned.name] = raw.view(wire_dtype(planned.datatype)).reshape(planned.shape)
        yield views


def _write_system(request: GraphRequest, arrays: Mapping[str, HostArray]) -> None:
    """Each output asked for in a system region written into it (one in a CUDA region was
    written in place)."""
    for answered in request.answered:
        if answered.shared is None or answered.on_device:
            continue
        assert request.regions is not None  # plan_request refused shared memory without regions
        name = answered.planned.name
        data = np.ascontiguousarray(arrays[name]).reshape(-1).view(np.uint8)
        request.regions.write(answered.shared, data.data, name)


def graph_work(request: GraphRequest) -> Work:
    """What ``request`` computes, as placement reads it: where its tensors live (the farthest
    from the host: a CUDA region, a system region, the body), its bytes, its steps."""
    on_device = any(s.on_device for s in request.shared_inputs) or any(
        a.on_device for a in request.answered
    )
    in_system = bool(request.shared_inputs) or any(a.shared for a in request.answered)
    residence = Residence.CUDA if on_device else Residence.SYSTEM if in_system else Residence.BODY
    return Work(WorkKind.GRAPH, residence, request.plan.needed_bytes, request.plan.step_count)


def arrives(request: GraphRequest) -> bool:
    """Whether ``request`` may be computed as its body arrives (``arriving``): a fused plan (a
    binding graph's runs whole), no tensor in shared memory."""
    plan = request.plan
    return (
        isinstance(plan, GraphPlan)
        and plan.fused
        and not request.shared_inputs
        and not any(a.shared for a in request.answered)
    )


def arriving(
    request: GraphRequest, backend: Backend, outputs: Mapping[str, HostArray], body: memoryview
) -> Arrival | None:
    """How ``request`` (one that ``arrives``), planned while the ``body`` its inputs lie in
    arrives, is computed as it does (``core/arrival.py``): run on the host (``fused_runner``),
    its answered outputs written into ``outputs`` (the front end's response buffers; any other
    output the plan computes into an array of its own). None: it runs once the body is in
    (``run_request``): placed on a device, or an output copied after."""
    plan = request.plan
    assert isinstance(plan, GraphPlan)
    assert arrives(request)
    backend = placed(backend, graph_work(request))
    arrays = dict(outputs)
    for output in plan.outputs:
        if output.name not in arrays:
            arrays[output.name] = np.empty(output.shape, wire_dtype(output.datatype))
    runner = fused_runner(plan, backend, request.inputs, arrays)
    if runner is None:
        return None
    widest = max((x.dtype.itemsize for x in arrays.values()), default=1)
    return Arrival(body, list(request.inputs.values()), plan.elements, runner, widest)


def run_request(
    request: GraphRequest, backend: Backend, outputs: Mapping[str, HostArray] | None = None
) -> dict[str, HostArray]:
    """Run the plan: every output of the graph into ``outputs`` where given (host arrays of the
    output's type and shape: the front end's response buffers), one asked for in a CUDA region
    into the region itself, the others into fresh arrays; its inputs in shared memory read
    first (in a CUDA region: where they are) and its outputs for system regions written into
    them after. Returns every output's host array by name (one written into a CUDA region is
    the client's memory, not the caller's, and is left out). On a server that places work
    (backends/placement.py) the whole run is on the backend its placement chooses."""
    backend = placed(backend, graph_work(request))
    arrays = dict(outputs or {})
    with ExitStack() as held:
        # The regions held until the kernels on them are done (``device_wait.hold``).
        on_device = hold(_device_outputs(request), held)
        inputs = hold(_all_inputs(request), held)
        for name in on_device:
            arrays.pop(name, None)
        for output in request.plan.outputs:
            if output.name not in arrays and output.name not in on_device:
                arrays[output.name] = np.empty(output.shape, wire_dtype(output.datatype))
        request.model.program.run(request.plan, backend, inputs, {**arrays, **on_device})
        if on_device or request.shared_inputs:
            # Kernels reading or writing a client's device memory finish before its region is
            # let go (a no-op on the host; awaited, not blocked on, inline on the event loop).
            finish(backend)
    _write_system(request, arrays)
    return arrays


__all__ = [
    "AnsweredOutput",
    "GraphRequest",
    "arrives",
    "arriving",
    "output_arrays",
    "plan_request",
    "run_request",
]
