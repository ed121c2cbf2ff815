"""A graph model written in the batch API's binding model (``model.json``: the protocol's
``v1.BindingGraph``): the buffers and dispatches of a /v1 batch, with named model inputs and
outputs, each a whole buffer read as one packed tensor.

Read once, at load: the file under the batch header's JSON bounds (``file_limits``) and its
schema; then the inputs and outputs against their buffers (each buffer's ``byte_size`` is its
tensor's bytes, or them rounded up to a multiple of 4 as DirectML sizes buffers, an input's
padding zeros; a buffer without ``init`` is an input's, every other one zero-filled), and the
dispatches by the batch planner itself (``batch.plan_batch``: every binding inside its buffer,
every operator's tables at the dispatch's feature level, strides, aliasing and in-place rules),
so a refusal names the same field paths and rules a /v1 batch's would. The model's shapes are
fixed: the one plan serves every request.

An inference places each buffer (an input's bytes, or zeros), runs the dispatches in order
(``batch.run_dispatches``: a later dispatch reads what an earlier wrote) and copies out each
output buffer. On the host an output buffer is the caller's output array itself (the response's
bytes), zero-filled only where the dispatches might not write every byte before one is read. On
a device an input or output that is already a device array (a CUDA region's) stays there: an
output buffer is the region's memory itself where it can be, an input's bytes are read where
they are (copied on the device where a dispatch writes that buffer: a client's input is never
written), and nothing crosses to the host.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from math import prod
from types import MappingProxyType
from typing import Any

import numpy as np
from pydantic import ValidationError

from tensorbits.core.backends.base import Backend
from tensorbits.core.batch import (
    BatchLimits,
    BatchPlan,
    listed,
    plan_batch,
    run_dispatches,
    zeroed,
)
from tensorbits.core.graphs.plan import resolve_inputs
from tensorbits.core.graphs.program import ModelPlan
from tensorbits.core.graphs.refusals import invalid, shown
from tensorbits.core.graphs.spec import ValueDecl
from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.dtypes import DataType, itemsize, parse_datatype
from tensorbits_protocol.errors import PayloadTooLarge
from tensorbits_protocol.jsondata import JsonLimits, MemberLimit, parse_json
from tensorbits_protocol.operators import OPERATORS
from tensorbits_protocol.schema_errors import at_field
from tensorbits_protocol.v1 import BindingGraph as BindingGraphFile
from tensorbits_protocol.v1 import GraphTensor
from tensorbits_protocol.validation import Shape, TensorSpec

HostArray = np.ndarray[Any, Any]
FILE_FIELD = "model.json"
MAX_RANK = max(row.max_rank for op in OPERATORS for row in op.support)  # any operator takes
# JSON values an input or output entry holds: its members and its shape's dimensions.
_VALUES_PER_TENSOR = 8 + MAX_RANK
_UINT8 = np.dtype(np.uint8)


def padded_size(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 4: the size DirectML gives a buffer."""
    return -(-nbytes // 4) * 4


def file_limits(limits: BatchLimits) -> JsonLimits:
    """A graph file's JSON bounds: a batch header's, with room for as many inputs and outputs
    as there may be buffers (each names one)."""
    header = limits.header
    buffers = next(m for m in header.members if m.names == ("buffers",))
    inputs = MemberLimit(("inputs",), buffers.limit, buffers.setting, buffers.rule, "inputs")
    return replace(
        header,
        max_values=header.max_values + 2 * buffers.limit * _VALUES_PER_TENSOR,
        members=(*header.members, inputs),
    )


@dataclass(frozen=True, slots=True)
class BindingOutput:
    """A model output: its tensor, and the buffer (index) holding it."""

    name: str
    datatype: DataType
    shape: Shape
    buffer: int


@dataclass(frozen=True, slots=True)
class BindingPlan:
    """The one plan of a binding graph (its shapes are fixed)."""

    input_specs: Mapping[str, TensorSpec]
    outputs: tuple[BindingOutput, ...]
    batch: BatchPlan
    input_buffers: Mapping[int, str]  # buffer index: the input whose bytes it holds
    written: frozenset[int]  # buffers a dispatch writes
    zero_filled: tuple[bool, ...]  # per buffer: placed as zeros (else the dispatches cover it)
    needed_bytes: int

    @property
    def step_count(self) -> int:
        return len(self.batch.dispatches)


class BindingGraph:
    """A binding graph model's program (``program.GraphProgram``)."""

    __slots__ = ("_plan", "inputs", "outputs")

    def __init__(
        self, inputs: tuple[ValueDecl, ...], outputs: tuple[ValueDecl, ...], plan: BindingPlan
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self._plan = plan

    def plan(
        self, shapes: Mapping[str, Sequence[int]], outputs: Collection[str] | None = None
    ) -> BindingPlan:
        """The one plan, whatever ``outputs``: the dispatches write every buffer, each output's
        among them (its elements bounded when the file was read, ``_tensor``)."""
        resolve_inputs(self.inputs, shapes)  # the shapes are fixed: the names and sizes checked
        return self._plan

    def run(
        self,
        plan: ModelPlan,
        backend: Backend,
        inputs: Mapping[str, HostArray | DeviceArray],
        outputs: Mapping[str, HostArray | DeviceArray],
    ) -> None:
        assert isinstance(plan, BindingPlan)  # plans come from this program's plan()
        run_binding(plan, backend, inputs, outputs)


def _flat_bytes(array: HostArray | DeviceArray) -> HostArray | DeviceArray | None:
    """A C-contiguous array's bytes as a flat uint8 view (the same memory); None otherwise."""
    if not array.flags.c_contiguous:
        return None
    return array.reshape(-1).view(_UINT8)


def _writable(array: HostArray | DeviceArray) -> bool:
    # A device array has no such flag (CuPy's): the caller's device memory is writable.
    return not isinstance(array, np.ndarray) or bool(array.flags.writeable)


def _output_target(
    out: HostArray | DeviceArray | None, backend: Backend, byte_size: int
) -> HostArray | DeviceArray | None:
    """The caller's output array as the buffer itself (its flat bytes), where it is in the
    backend's memory (any on the host, a device array on a device), writable, and exactly the
    buffer's size (not one padded past its tensor to DirectML's 4 bytes); else None."""
    if out is None or not (backend.host_memory or not isinstance(out, np.ndarray)):
        return None
    target = _flat_bytes(out)
    if target is None or not _writable(target) or target.size != byte_size:
        return None
    return target


def _device_input(
    source: DeviceArray, backend: Backend, byte_size: int, written: bool
) -> DeviceArray:
    """An input already on the device (a CUDA region's flat bytes) as its buffer: read where it
    is, or copied on the device where it must be padded or a dispatch writes it."""
    padded = source.shape[0] != byte_size  # DirectML's 4 bytes: zeros after
    if not padded and not written:
        return source
    buffer = zeroed(backend, byte_size) if padded else backend.empty((byte_size,), _UINT8)
    buffer[: source.shape[0]] = source
    return buffer


def run_binding(
    plan: BindingPlan,
    backend: Backend,
    inputs: Mapping[str, HostArray | DeviceArray],
    outputs: Mapping[str, HostArray | DeviceArray],
) -> None:
    """Place the buffers, run the dispatches, fill ``outputs`` (see the module's docstring)."""
    batch = plan.batch
    output_of = {o.buffer: outputs[o.name] for o in plan.outputs}
    buffers: list[DeviceArray] = []
    direct: set[int] = set()  # buffers that are the caller's output arrays
    for index, buffer in enumerate(batch.buffers):
        target = _output_target(output_of.get(index), backend, buffer.byte_size)
        name = plan.input_buffers.get(index)
        given = None if name is None else inputs[name]
        if given is not None and not isinstance(given, np.ndarray) and not backend.host_memory:
            source = given.reshape(-1).view(_UINT8)
            if target is not None:
                target[: source.shape[0]] = source  # device to device
                if source.shape[0] != buffer.byte_size:
                    target[source.shape[0] :] = 0
                buffers.append(target)
                direct.add(index)
            else:
                written = index in plan.written
                buffers.append(_device_input(source, backend, buffer.byte_size, written))
        elif name is not None:
            source = np.ascontiguousarray(inputs[name]).reshape(-1).view(_UINT8)
            if source.size != buffer.byte_size:  # padded to DirectML's 4 bytes: zeros after
                padded = np.zeros(buffer.byte_size, _UINT8)
                padded[: source.size] = source
                source = padded
            if target is not None:
                target[...] = source  # on a device, host to device
                buffers.append(target)
                direct.add(index)
            elif index in plan.written and backend.host_memory and not source.flags.writeable:
                buffers.append(source.copy())  # read-only input bytes (a gRPC message's)
            else:
                buffers.append(backend.asarray(source))  # host: the request's own bytes
        elif target is not None:
            if plan.zero_filled[index]:
                target.fill(0)
            buffers.append(target)
            direct.add(index)
        elif plan.zero_filled[index]:
            buffers.append(zeroed(backend, buffer.byte_size))
        else:
            buffers.append(backend.empty((buffer.byte_size,), _UINT8))
    run_dispatches(backend, buffers, batch.dispatches)
    for output in plan.outputs:
        if output.buffer in direct:
            continue
        out = outputs[output.name]
        whole = buffers[output.buffer]
        if not isinstance(out, np.ndarray) and not backend.host_memory:
            # A device output (a CUDA region's) that is not the buffer itself: copied on the
            # device, the buffer's padding left out.
            out[...] = whole[: out.nbytes].view(out.dtype).reshape(out.shape)
            continue
        flat = _flat_bytes(out)
        if flat is not None and _writable(flat) and flat.size == whole.shape[0]:
            backend.to_host(whole, flat)
        else:  # strided or read-only, or a buffer padded past its tensor
            host = backend.to_host(whole)[: out.nbytes]
            out[...] = host.view(out.dtype).reshape(out.shape)


# --- reading the file ---------------------------------------------------------------------------
def read_binding_graph(data: bytes, limits: BatchLimits) -> BindingGraph:
    """The file's program, every rule checked (see the module's docstring); a refusal names
    the field path in the file and the rule."""
    document = parse_json(data, file_limits(limits), FILE_FIELD)
    try:
        graph = BindingGraphFile.model_validate(document)
    except ValidationError as exc:
        raise at_field(exc.errors(include_url=False), BindingGraphFile, FILE_FIELD) from None
    return _program(graph, limits)


def _tensor(field: str, tensor: GraphTensor, limits: BatchLimits) -> tuple[ValueDecl, int]:
    """The entry as a declaration, and its bytes; its rank, dimensions and elements bounded."""
    datatype = parse_datatype(tensor.datatype)
    assert datatype is not None  # the schema's Literal admits only names it reads
    shape = tensor.shape
    if len(shape) > MAX_RANK:
        raise invalid(
            f"{field}.shape", "rank", f"rank {len(shape)}; the operators take at most {MAX_RANK}"
        )
    if any(size < 0 for size in shape):
        raise invalid(f"{field}.shape", "shape", f"{shape}: a dimension is negative")
    elements = prod(shape)
    if elements > limits.max_tensor_elements:
        raise PayloadTooLarge(
            f"{field}.shape: {elements} elements, more than the limit of "
            f"{limits.max_tensor_elements} per tensor (TENSORBITS_MAX_TENSOR_ELEMENTS)",
            field=f"{field}.shape",
            rule="max_tensor_elements",
        )
    return ValueDecl(tensor.name, datatype, tuple(shape)), elements * itemsize(datatype)


def _bind(
    kind: str, entries: Sequence[GraphTensor], sizes: Mapping[str, int], limits: BatchLimits
) -> tuple[tuple[ValueDecl, ...], list[int]]:
    """Inputs or outputs: names once each, one buffer each (no two on one buffer), each buffer
    declared and of its tensor's bytes."""
    declared: list[ValueDecl] = []
    bytes_: list[int] = []
    names: dict[str, int] = {}
    buffers: dict[str, int] = {}
    for index, entry in enumerate(entries):
        field = f"{kind}s[{index}]"
        decl, nbytes = _tensor(field, entry, limits)
        if entry.name in names:
            raise invalid(
                f"{field}.name",
                f"duplicate_{kind}",
                f"{shown(entry.name)} is {kind}s[{names[entry.name]}]'s name too",
            )
        names[entry.name] = index
        if entry.buffer not in sizes:
            raise invalid(
                f"{field}.buffer",
                "unknown_buffer",
                f"no buffer named {shown(entry.buffer)} (declared: {listed(list(sizes))})",
            )
        if entry.buffer in buffers:
            raise invalid(
                f"{field}.buffer",
                "duplicate_buffer",
                f"buffer {shown(entry.buffer)} is {kind}s[{buffers[entry.buffer]}]'s already",
            )
        buffers[entry.buffer] = index
        if sizes[entry.buffer] not in (nbytes, padded_size(nbytes)):
            raise invalid(
                f"{field}.buffer",
                "buffer_size",
                f"buffer {shown(entry.buffer)} has {sizes[entry.buffer]} bytes; "
                f"{entry.datatype} {list(entry.shape)} is {nbytes} (a model's {kind} is a whole "
                "buffer: its bytes, or them rounded up to a multiple of 4 as DirectML sizes "
                "buffers)",
            )
        declared.append(decl)
        bytes_.append(nbytes)
    return tuple(declared), bytes_


def _program(graph: BindingGraphFile, limits: BatchLimits) -> BindingGraph:
    sizes = {b.name: b.byte_size for b in graph.buffers}
    inputs, _ = _bind("input", graph.inputs, sizes, limits)
    outputs, output_bytes = _bind("output", graph.outputs, sizes, limits)
    input_of = {entry.buffer: entry.name for entry in graph.inputs}
    for index, buffer in enumerate(graph.buffers):
        fed = buffer.name in input_of
        if buffer.init is None and not fed:
            raise invalid(
                f"buffers[{index}].init",
                "unbound_buffer",
                f"buffer {shown(buffer.name)} has no init and no input fills it: name it an "
                'input\'s buffer, or give it "init": "zeros"',
            )
        if buffer.init is not None and fed:
            raise invalid(
                f"buffers[{index}].init",
                "input_buffer",
                f"buffer {shown(buffer.name)} holds input {shown(input_of[buffer.name])}: it "
                "cannot be zero-filled too",
            )
    total = sum(sizes[entry.buffer] for entry in graph.inputs)  # the input buffers' bytes
    if total > limits.max_temporary_bytes:
        raise PayloadTooLarge(
            f"inputs: {total} bytes, more than a request may carry ({limits.max_temporary_bytes},"
            " TENSORBITS_MAX_BODY_BYTES)",
            field="inputs",
            rule="max_body_bytes",
        )
    request = {
        "id": None,
        "buffers": [b.model_dump() for b in graph.buffers],
        "dispatches": [d.model_dump() for d in graph.dispatches],
        "outputs": [entry.buffer for entry in graph.outputs],
    }
    batch = plan_batch(request, data_start=0, body_length=total, limits=limits)
    index_of = {b.name: i for i, b in enumerate(batch.buffers)}
    written = frozenset(d.output.buffer for d in batch.dispatches)
    plan = BindingPlan(
        input_specs=MappingProxyType(
            {
                d.name: TensorSpec(d.datatype, tuple(e.shape))
                for d, e in zip(inputs, graph.inputs, strict=True)
            }
        ),
        outputs=tuple(
            BindingOutput(d.name, d.datatype, tuple(e.shape), index_of[e.buffer])
            for d, e in zip(outputs, graph.outputs, strict=True)
        ),
        batch=batch,
        input_buffers=MappingProxyType({index_of[b]: name for b, name in input_of.items()}),
        written=written,
        zero_filled=_zero_filled(batch),
        needed_bytes=(
            total * (2 if written & {index_of[b] for b in input_of} else 1)
            + sum(output_bytes)
            + batch.temporary_bytes
        ),
    )
    return BindingGraph(inputs, outputs, plan)


def _zero_filled(batch: BatchPlan) -> tuple[bool, ...]:
    """Per buffer, whether it must be placed as zeros: a zero-filled buffer stays so unless the
    first dispatch that touches it writes every one of its bytes (packed, from offset 0) without
    reading it; bytes no dispatch writes go back to the client as zeros."""
    needs = [b.body_offset is None for b in batch.buffers]
    touched: set[int] = set()
    for dispatch in batch.dispatches:
        touched.update(t.buffer for t in dispatch.inputs)
        out = dispatch.output
        if out.buffer in touched:
            continue
        touched.add(out.buffer)
        desc = out.desc
        whole = desc.elements * desc.itemsize == batch.buffers[out.buffer].byte_size
        if out.offset == 0 and desc.packed and whole:
            needs[out.buffer] = False
    return tuple(needs)


__all__ = ["BindingGraph", "BindingPlan", "file_limits", "read_binding_graph"]
