"""A checked inference, ready to run: ``plan`` turns a decoded ``InferRequest`` into a ``Plan``.

Whatever front end decoded the request (HTTP's REST form, gRPC's ``ModelInferRequest``), it is
checked here, by the operator's rules and the limits, before any output memory exists; binary
inputs stay where they arrived (``np.frombuffer`` views of the request's bytes). A
``PlanTemplate`` is what a request whose inputs are all raw bytes decides, so that a repeated
request is planned from it without being decoded or checked again: one kind for both front ends,
kept in the data plane's one cache (each front end keys its own wire form: ``api/rest_infer.py``,
``grpc/messages.py``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Self

import numpy as np

from tensorbits.core.backends.base import Backend, BoundRun
from tensorbits.core.engine import rows
from tensorbits.core.models import MODEL_VERSION
from tensorbits.core.shared_memory import Location, SharedMemoryRegions, switched_on
from tensorbits_protocol.dtypes import DataType, itemsize, wire_dtype
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.infer import (
    UNSUPPORTED_OUTPUT_PARAMETERS,
    HostArray,
    InferRequest,
    InferResponse,
    RequestedOutput,
    RequestLimits,
    SharedMemoryRef,
    Tensor,
)
from tensorbits_protocol.jsondata import require_json_form
from tensorbits_protocol.operators import OperatorSpec
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

# JSON output costs far more per element than its binary bytes; this weighs it for offloading.
JSON_BYTES_PER_ELEMENT = 8
# A run from system regions to a system region streams pieces of this many bytes (of its widest
# tensor) through buffers that stay in the cache: read, compute, write. 256 KiB to 4 MiB measured
# alike, all twice as fast as whole tensors (docs/benchmarks.md).
STREAM_PIECE_BYTES = 1 << 20


class Plan(NamedTuple):
    """A checked inference, ready to run: nothing about it can be the caller's fault any more.
    (A NamedTuple: one is built per request, in a third of a frozen dataclass's time.)"""

    op: OperatorSpec
    call: ResolvedCall
    request_id: str | None
    inputs: list[HostArray]  # in the operator's input order
    binary_output: bool
    output_nbytes: int
    # The front end's answer up to the output's bytes, when already known (a template's plan:
    # HTTP's JSON header, gRPC's serialized response head; gRPC's whole answer for an output in
    # shared memory): it depends on nothing that running the plan decides.
    response_head: bytes | None = None
    # Inputs in shared memory (their place in ``inputs`` holds an empty array until
    # ``shared_loaded`` reads them) and the region the output goes to (shared_memory.py), a CUDA
    # region when ``output_on_device``.
    shared_inputs: tuple[SharedInput, ...] = ()
    shared_output: SharedMemoryRef | None = None
    output_on_device: bool = False
    # Its run decided once, when a template on a host backend made it (``Backend.bound``):
    # ``run.run_to_host`` calls it with the plan's inputs.
    run: BoundRun | None = None

    @property
    def shared_input_bytes(self) -> int:
        """Bytes of host memory the inputs read from system regions take (one in a CUDA region
        is computed on where it is)."""
        return sum(shared.nbytes for shared in self.shared_inputs if not shared.on_device)

    @property
    def work_bytes(self) -> int:
        """Host memory the run touches: inputs read, output written (and JSON text for JSON
        output); a tensor in a CUDA region touches none (a run all on the device: 0, so it is
        launched inline, not on a worker thread)."""
        out = 0 if self.output_on_device else self.output_nbytes  # a CUDA region's: no host byte
        if not self.binary_output and self.shared_output is None:
            out += math.prod(self.call.output_shape) * JSON_BYTES_PER_ELEMENT
        return sum(x.nbytes for x in self.inputs) + self.shared_input_bytes + out

    def memory_needed(self, body_bytes: int, backend: Backend | None = None) -> int:
        """Bytes of host memory this inference holds while it runs on ``backend``: the
        request's body, the inputs read from system shared memory, and the output (none when a
        CUDA region gets it; a streamed run holds one piece of each shared tensor)."""
        inputs = self.shared_input_bytes
        output = 0 if self.output_on_device else self.output_nbytes
        if backend is not None and streams(self, backend):
            # A piece of each input read in pieces; a broadcast one is read whole.
            pieced = [each.nbytes for each in self.read_in_pieces()]
            inputs = min(sum(pieced), len(pieced) * STREAM_PIECE_BYTES) + inputs - sum(pieced)
            if self.shared_output is not None:
                output = min(output, STREAM_PIECE_BYTES)
        return body_bytes + inputs + output

    def read_in_pieces(self) -> list[SharedInput]:
        """The shared inputs a streamed run reads a piece at a time: those of the output's size
        (a broadcast input, of fewer elements, is read whole), as ``memory_needed`` counts them."""
        total = math.prod(self.call.output_shape)
        return [each for each in self.shared_inputs if math.prod(each.shape) == total]

    def response(self, data: list[Any] | None = None) -> InferResponse:
        """The response to this plan: the output as binary data, with its JSON ``data``, or as
        written into its shared-memory region."""
        call = self.call
        output = Tensor(
            self.op.output, call.output_datatype, call.output_shape, data=data,
            shared_memory=self.shared_output,
        )  # fmt: skip
        return InferResponse(self.op.name, (output,), MODEL_VERSION, self.request_id)


class SharedInput(NamedTuple):
    """An input whose bytes are in shared memory: its place in the operator's inputs, where
    (``on_device``: in a CUDA region)."""

    position: int
    name: str
    ref: SharedMemoryRef
    dtype: np.dtype[Any]
    shape: tuple[int, ...]
    on_device: bool = False
    datatype: DataType | None = None  # its wire type, when planned by an operator's plan()

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def streams(plan: Plan, backend: Backend) -> bool:
    """Whether ``plan`` runs streamed, in pieces (``run.run_streamed``): host memory throughout
    (a host backend, no CUDA region) and a piece of at least one whole row (``rows_per_piece``:
    any element-wise call, and a broadcast whose rows are not too long)."""
    return (
        (bool(plan.shared_inputs) or plan.shared_output is not None)  # else nothing to stream
        and backend.host_memory
        and not plan.output_on_device
        and not any(shared.on_device for shared in plan.shared_inputs)
        and rows_per_piece(plan) > 0
    )


def rows_per_piece(plan: Plan) -> int:
    """How many rows of ``engine.rows(plan.call)`` a streamed run's piece holds: as many as fit
    in ``STREAM_PIECE_BYTES`` of its widest tensor (0: not one row does, a broadcast of long rows,
    which is not streamed). An element-wise call without broadcasting has rows of one element."""
    shared = {each.position: each.dtype.itemsize for each in plan.shared_inputs}
    widest: int = max(
        wire_dtype(plan.call.output_datatype).itemsize,
        *(shared.get(i, x.dtype.itemsize) for i, x in enumerate(plan.inputs)),
    )
    # An empty output's rows may have no elements: nothing to read, streamed as any piece.
    return STREAM_PIECE_BYTES // max(1, math.prod(rows(plan.call)[1:]) * widest)


# --- planning -----------------------------------------------------------------------------------


def requested_outputs(
    model: str, names: Sequence[str], request: InferRequest
) -> tuple[RequestedOutput, ...]:
    """The outputs ``request`` asks of ``model`` (whose outputs are ``names``), in its order;
    every one, with the request's defaults, when it names none. Whatever the model (an
    operator's one output, a graph's several), an output is refused in these words: one the
    model does not have (``unknown_output``), one asked for twice (``duplicate_output``), one
    with a parameter of a feature not supported (``unsupported_parameter``)."""
    if request.outputs is None:
        return tuple(RequestedOutput(name) for name in names)
    seen: set[str] = set()
    for output in request.outputs:
        if output.name not in names:
            raise InvalidRequest(
                f"output '{output.name[:100]}': {model} has no output of that name "
                f"(outputs: {', '.join(names)})",
                field=output.name[:100],
                rule="unknown_output",
            )
        if output.name in seen:
            raise InvalidRequest(
                f"output '{output.name}' is requested more than once",
                field=output.name,
                rule="duplicate_output",
            )
        seen.add(output.name)
        for key, what in UNSUPPORTED_OUTPUT_PARAMETERS.items():
            if key in output.parameters:
                raise InvalidRequest(
                    f"output '{output.name}': parameters.{key}: {what} is not supported",
                    field=output.name,
                    rule="unsupported_parameter",
                )
    return request.outputs


def answered_binary(request: InferRequest, output: RequestedOutput) -> bool:
    """Whether ``output`` goes back as binary data: the request-wide default
    ``binary_data_output``, overridden by the output's own ``binary_data``."""
    return request.binary_output if output.binary is None else output.binary


def _binary_output(op: OperatorSpec, request: InferRequest) -> bool:
    """Whether the operator's one output goes back as binary data (``answered_binary``)."""
    if request.outputs is None:  # most requests: nothing to check, no output to make
        return request.binary_output
    outputs = requested_outputs(op.name, (op.output,), request)
    return answered_binary(request, outputs[0]) if outputs else request.binary_output


def check_output(
    name: str, datatype: DataType, shape: Sequence[int], binary: bool, limits: RequestLimits
) -> None:
    """An output's bounds, whatever model computes it (an operator's, a graph's): its elements
    within TENSORBITS_MAX_TENSOR_ELEMENTS, and, as JSON ``data``, a type with a JSON form and
    within TENSORBITS_MAX_JSON_ELEMENTS."""
    name, count = name[:100], math.prod(shape)
    if count > limits.max_tensor_elements:
        raise PayloadTooLarge(
            f"output '{name}': shape {list(shape)} has {count} elements, more than "
            f"the limit of {limits.max_tensor_elements} (TENSORBITS_MAX_TENSOR_ELEMENTS)",
            field=name,
            rule="max_tensor_elements",
        )
    if binary:
        return
    require_json_form(name, datatype, "output")
    if count > limits.max_json_elements:
        raise PayloadTooLarge(
            f"output '{name}': {count} elements are too many for JSON data (limit "
            f"{limits.max_json_elements}, TENSORBITS_MAX_JSON_ELEMENTS); request binary data",
            field=name,
            rule="max_json_elements",
        )


_NOT_READ = np.empty(0, np.uint8)  # an input in shared memory, until shared_loaded reads it


def plan(
    op: OperatorSpec,
    request: InferRequest,
    limits: RequestLimits,
    regions: SharedMemoryRegions | None = None,
) -> Plan:
    """Check a decoded request against ``op``'s rules and the limits; raise on anything wrong.

    Whatever front end decoded it (``InferRequest.from_rest``, ``grpc.decode``), the
    checks and their messages are these. Tensors in shared memory need ``regions`` (the server's,
    when the extension is on); they are located and checked here, read by ``shared_loaded`` once
    the request is admitted for them."""
    call = validate_call(
        op,
        {t.name: TensorSpec(t.datatype, t.shape) for t in request.inputs},
        request.parameters,
    )
    shared_output = next(
        (o.shared_memory for o in request.outputs or () if o.shared_memory is not None), None
    )
    binary = _binary_output(op, request)
    check_output(
        op.output, call.output_datatype, call.output_shape, binary or shared_output is not None,
        limits,
    )  # fmt: skip
    output_nbytes = math.prod(call.output_shape) * itemsize(call.output_datatype)
    arrays: dict[str, HostArray] = {}
    shared: list[SharedInput] = []
    places: dict[str, Location] = {}
    for tensor in request.inputs:
        if tensor.shared_memory is None:
            arrays[tensor.name] = tensor.array()
            continue
        arrays[tensor.name] = _NOT_READ
        placed = SharedInput(
            op.inputs.index(tensor.name), tensor.name, tensor.shared_memory,
            wire_dtype(tensor.datatype), tensor.shape, datatype=tensor.datatype,
        )  # fmt: skip
        shared.append(_located_input(regions, placed, places))
    output_on_device = _located_output(op, call, regions, shared_output, output_nbytes, places)
    return Plan(
        op=op,
        call=call,
        request_id=request.id,
        inputs=[arrays[name] for name in op.inputs],
        binary_output=binary and shared_output is None,
        output_nbytes=output_nbytes,
        shared_inputs=tuple(shared),
        shared_output=shared_output,
        output_on_device=output_on_device,
    )


def _located_input(
    regions: SharedMemoryRegions | None, shared: SharedInput, places: dict[str, Location]
) -> SharedInput:
    """``shared`` located in its region (``locate_shared``: registered, in bounds, aligned),
    its place added to ``places`` (by name), with where it lies (``on_device``) as it is now:
    what planning checks, and what a template's every use checks again."""
    assert shared.datatype is not None  # every input planned here names its type
    place = locate_shared(regions, shared.ref, shared.nbytes, shared.datatype, shared.name, "input")
    places[shared.name] = place
    return shared._replace(on_device=place.on_device)


def _located_output(
    op: OperatorSpec,
    call: ResolvedCall,
    regions: SharedMemoryRegions | None,
    ref: SharedMemoryRef | None,
    nbytes: int,
    places: Mapping[str, Location],
) -> bool:
    """The output's region (``ref``, None: none) located and checked against the inputs'
    ``places`` (``check_aliasing``), as planning and a template's every use check it; whether
    it is a CUDA region."""
    if ref is None:
        return False
    out = locate_shared(regions, ref, nbytes, call.output_datatype, op.output, "output")
    check_aliasing(op.name, op.output, out, places, op.in_place)
    return out.on_device


def locate_shared(
    regions: SharedMemoryRegions | None,
    ref: SharedMemoryRef,
    nbytes: int,
    datatype: DataType,
    tensor: str,
    direction: str,
) -> Location:
    """Where the ``nbytes`` bytes of a tensor in shared memory lie (``direction``: ``"input"``,
    exactly that many bytes, or ``"output"``, room for them), whatever model takes or gives it:
    the extensions switched on, ``ref`` inside its registered region
    (``SharedMemoryRegions.locate``), and, in a CUDA region, on a multiple of its element size."""
    place = switched_on(regions, tensor, direction).locate(ref, nbytes, tensor, direction)
    _check_device_alignment(place, itemsize(datatype), tensor, direction)
    return place


def _check_device_alignment(place: Location, item_bytes: int, tensor: str, direction: str) -> None:
    """A tensor in a CUDA region starts on a multiple of its element size: a kernel that reads
    a misaligned element faults the device context, and with it every later request (a host
    copy would not care; the device does)."""
    if place.on_device and place.start % item_bytes:
        raise InvalidRequest(
            f"{direction} '{tensor}': in a CUDA shared-memory region it must start on a multiple "
            f"of its element size ({item_bytes} bytes); its shared_memory_offset does not",
            field=tensor,
            rule="shared_memory_alignment",
        )


def check_aliasing(
    model: str,
    output: str,
    place: Location,
    inputs: Mapping[str, Location],
    in_place: Sequence[str] = (),
) -> None:
    """An output's region (``place``) may overlap an input's (``inputs``: by name) only as the
    model's in-place rule allows: the very same bytes, of an input the output may replace
    (``in_place``: an operator's ``op.in_place``; none for a graph)."""
    for name, where in inputs.items():
        if not where.overlaps(place):
            continue
        if where == place and name in in_place:
            continue
        allowed = ", ".join(in_place) or "none"
        raise InvalidRequest(
            f"output '{output}': its shared-memory bytes overlap input '{name}''s; "
            f"{model} may write its output over exactly the bytes of an input among: {allowed}",
            field=output,
            rule="output_aliasing",
        )


# Where an input's bytes lie in a request: the buffer that holds them (its index in the buffers
# a template is given), their span in it, and the wire dtype and shape they are read as.
InputPlace = tuple[int, slice, np.dtype[Any], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class PlanTemplate:
    """What one request whose inputs are all raw bytes or in shared memory decides: everything
    in its plan but those bytes, and where they lie (per operator input, an ``InputPlace``, or
    None for one in shared memory). Keyed by the request without those bytes, a repeated request
    is planned from it without being decoded or checked again: over HTTP the one buffer is the
    body's tail, over gRPC each input's raw contents is one (each front end makes its templates:
    ``api/rest_infer.py``, ``grpc/messages.py``). Its shared-memory tensors (the regions are in
    its key) are located again at every use (``plan``): a region unregistered, registered again
    smaller or as the other kind since is refused as planning refuses it.

    Its plans differ only in those bytes, of the sizes in its key, so what each holds and
    touches is decided once too (``held_bytes``, ``work_bytes``: 1.4 us a call when worked out
    again; a template with shared memory's hold only while its regions stay of their kind:
    ``Plan.memory_needed`` tells)."""

    op: OperatorSpec
    call: ResolvedCall
    request_id: str | None
    binary_output: bool
    output_nbytes: int
    inputs: tuple[InputPlace | None, ...]
    response_head: bytes | None  # the front end's answer up to the output's bytes
    held_bytes: int  # ``Plan.memory_needed`` but the request's own bytes
    work_bytes: int  # ``Plan.work_bytes``
    shared_inputs: tuple[SharedInput, ...] = ()  # located again at each use
    shared_output: SharedMemoryRef | None = None
    run: BoundRun | None = None  # ``Plan.run``, the same for each of its plans

    @property
    def in_shared_memory(self) -> bool:
        """Whether any of its tensors is in a shared-memory region."""
        return bool(self.shared_inputs) or self.shared_output is not None

    def plan(
        self, buffers: Sequence[memoryview], regions: SharedMemoryRegions | None = None
    ) -> Plan:
        """The plan of a request with this template's key whose raw bytes are ``buffers``; its
        shared-memory tensors located in ``regions`` again, refused as ``plan`` refuses them."""
        planned = Plan(
            op=self.op,
            call=self.call,
            request_id=self.request_id,
            inputs=[
                _NOT_READ
                if place is None
                else np.frombuffer(buffers[place[0]][place[1]], place[2]).reshape(place[3])
                for place in self.inputs
            ],
            binary_output=self.binary_output,
            output_nbytes=self.output_nbytes,
            response_head=self.response_head,
            run=self.run,
        )
        if not self.in_shared_memory:
            return planned
        return self._located(planned, regions)

    def _located(self, planned: Plan, regions: SharedMemoryRegions | None) -> Plan:
        """``planned`` with its shared-memory tensors located again (as ``plan`` locates them)."""
        places: dict[str, Location] = {}
        shared = tuple(_located_input(regions, each, places) for each in self.shared_inputs)
        on_device = _located_output(
            self.op, self.call, regions, self.shared_output, self.output_nbytes, places
        )
        return planned._replace(
            shared_inputs=shared, shared_output=self.shared_output, output_on_device=on_device
        )

    @classmethod
    def decided(
        cls,
        planned: Plan,
        where: Mapping[str, InputPlace],
        backend: Backend,
        *,
        response_head: bytes | None,
    ) -> Self:
        """The template of ``planned`` (its inputs raw bytes or in shared memory), whose raw
        inputs lie ``where`` (by name; kept in the operator's input order), run on ``backend``."""
        in_regions = {shared.name for shared in planned.shared_inputs}
        bind = getattr(backend, "bound", None)  # a host backend's (NumpyBackend.bound)
        in_request = not planned.shared_inputs and planned.shared_output is None
        return cls(
            op=planned.op,
            call=planned.call,
            request_id=planned.request_id,
            binary_output=planned.binary_output,
            output_nbytes=planned.output_nbytes,
            inputs=tuple(None if name in in_regions else where[name] for name in planned.op.inputs),
            response_head=response_head,
            held_bytes=planned.memory_needed(0, backend),  # the request's bytes added per call
            work_bytes=planned.work_bytes,
            shared_inputs=planned.shared_inputs,
            shared_output=planned.shared_output,
            run=bind(planned.call, planned.inputs) if bind is not None and in_request else None,
        )


__all__ = [
    "JSON_BYTES_PER_ELEMENT",
    "STREAM_PIECE_BYTES",
    "InputPlace",
    "Plan",
    "PlanTemplate",
    "SharedInput",
    "answered_binary",
    "check_aliasing",
    "check_output",
    "locate_shared",
    "plan",
    "requested_outputs",
    "streams",
]
