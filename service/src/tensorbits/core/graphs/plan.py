"""``plan_graph``: a ``GraphSpec`` and one request's input shapes, made into the steps that run.

Every value of the graph gets a slot: a graph input, a constant, or a value a step writes. A
step writing a graph output writes straight into the caller's array for it; the other values
are intermediates. A plan computes only the outputs a request asks for: steps none of them
needs are left out. When every step is flat element-wise
over one element count (no broadcasting but of single elements: ``fusable``), the plan is ``fused``:
``run.run_graph`` runs the whole
chain piece by piece, each intermediate in a small scratch buffer (``scratch``: which one, by
their lifetimes); otherwise it runs node by node over whole arrays, each intermediate freed
after its last reader. ``work_bytes`` is what that takes beyond the inputs and outputs, for
admission.

``PlanCache`` keeps the plans of a model's recent input shapes: planning costs a validation per
node, a request of shapes seen before costs a lookup.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from math import prod
from types import MappingProxyType
from typing import Any

import numpy as np

from tensorbits.core.engine import is_flat_elementwise
from tensorbits.core.graphs.refusals import invalid
from tensorbits.core.graphs.spec import GraphNode, GraphSpec, ValueDecl, node_call
from tensorbits_protocol.dtypes import DataType, from_numpy, itemsize
from tensorbits_protocol.validation import ResolvedCall, TensorSpec

Shape = tuple[int, ...]
# Bytes of the widest type per piece of a fused run: a piece of each operand and intermediate
# stays in the core's L2 cache between one step and the next, and a piece is large enough that
# the per-step call overhead (microseconds) is small beside the work. XOR -> shift -> NOT over
# 64 MiB of UINT32, best of 7 in process on the development VM: 64 KiB pieces 26.1 ms, 128 KiB
# 21.6, 256 KiB 18.7, 512 KiB 19.5, 1 MiB 22.6 (NumPy's three whole-array calls: about 15).
PIECE_BYTES = 256 << 10
PLANS_CACHED = 16
# A cached plan's key: the input shapes by name, and the outputs computed (None: every one).
PlanKey = tuple[tuple[tuple[str, Shape], ...], frozenset[str] | None]


class SlotKind(StrEnum):
    INPUT = "input"
    CONSTANT = "constant"
    VALUE = "value"  # written by a step


@dataclass(frozen=True, slots=True)
class ValueSlot:
    name: str
    kind: SlotKind
    datatype: DataType
    shape: Shape

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * itemsize(self.datatype)


@dataclass(frozen=True, slots=True)
class GraphStep:
    """One node's call: the slots it reads (in the operator's input order) and writes, and the
    intermediates whose last reader it is (free once it has run)."""

    node: GraphNode
    call: ResolvedCall
    reads: tuple[int, ...]
    writes: int
    frees: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlannedOutput:
    """A graph output: the slot holding it, and whether its step writes it in place (else it
    is copied from the slot once the steps have run)."""

    name: str
    slot: int
    datatype: DataType
    shape: Shape
    written_in_place: bool


@dataclass(frozen=True, slots=True)
class GraphPlan:
    input_specs: Mapping[str, TensorSpec]
    slots: tuple[ValueSlot, ...]
    constants: Mapping[int, np.ndarray[Any, Any]]  # slot: the read-only array
    steps: tuple[GraphStep, ...]
    outputs: tuple[PlannedOutput, ...]
    in_place: Mapping[int, str]  # value slot: the output its step writes into
    fused: bool
    elements: int  # fused: the element count of every step
    piece_elements: int
    scratch: Mapping[int, int]  # fused: intermediate slot: its scratch buffer
    scratch_buffers: int
    work_bytes: int  # fused: the scratch buffers; else the intermediates alive at the peak

    @property
    def input_bytes(self) -> int:
        return sum(prod(s.shape) * itemsize(s.datatype) for s in self.input_specs.values())

    @property
    def output_bytes(self) -> int:
        return sum(prod(o.shape) * itemsize(o.datatype) for o in self.outputs)

    @property
    def needed_bytes(self) -> int:
        """Inputs, outputs and work: the memory a run holds, for admission."""
        return self.input_bytes + self.output_bytes + self.work_bytes

    @property
    def step_count(self) -> int:
        return len(self.steps)


def fusable(call: ResolvedCall) -> bool:
    """Whether the call can run piece by piece on flat operands: element-wise
    (``engine.is_flat_elementwise``), or broadcasting only operands of a single element (a
    scalar shift count, a mask of one value), which every piece reads whole."""
    return is_flat_elementwise(call) or all(
        shape == call.output_shape or prod(shape) == 1 for shape in call.kernel_input_shapes
    )


def resolve_inputs(
    declared: Sequence[ValueDecl], shapes: Mapping[str, Sequence[int]]
) -> dict[str, TensorSpec]:
    """A request's input shapes (by name) checked against a model's ``declared`` inputs, every
    kind of graph alike: each name known and given, each rank and fixed dimension the declared
    one, each symbolic dimension one size; the inputs as tensors, in declaration order."""
    unknown = [name for name in shapes if name not in {d.name for d in declared}]
    if unknown:
        raise invalid(
            unknown[0][:100],
            "unknown_input",
            f"the model has no input of that name (inputs: {', '.join(d.name for d in declared)})",
        )
    bound: dict[str, tuple[int, str]] = {}
    resolved: dict[str, TensorSpec] = {}
    for decl in declared:
        if decl.name not in shapes:
            raise invalid(decl.name, "missing_input", "an input of the model is missing")
        shape = tuple(int(s) for s in shapes[decl.name])
        dims = decl.dims or ()
        if len(shape) != len(dims) or any(s < 0 for s in shape):
            raise invalid(
                decl.name, "shape", f"shape {list(shape)}; the model declares {list(dims)}"
            )
        for axis, (size, dim) in enumerate(zip(shape, dims, strict=True)):
            if isinstance(dim, int) and size != dim:
                raise invalid(
                    decl.name,
                    "shape",
                    f"dimension {axis} of size {size}; the model declares {dim}",
                )
            if isinstance(dim, str):
                first = bound.setdefault(dim, (size, decl.name))
                if first[0] != size:
                    raise invalid(
                        decl.name,
                        "shape",
                        f"dimension {axis} ({dim[:100]!r}) of size {size}; {first[1][:100]!r} "
                        f"gave it size {first[0]}",
                    )
        resolved[decl.name] = TensorSpec(decl.datatype, shape)
    return resolved


def plan_graph(
    spec: GraphSpec,
    shapes: Mapping[str, Sequence[int]],
    piece_bytes: int = PIECE_BYTES,
    outputs: Collection[str] | None = None,
) -> GraphPlan:
    """The plan of ``spec`` for inputs of ``shapes`` (by input name), or the refusal of a shape
    the model does not take (field: the input, or the node whose rule it breaks). ``outputs``:
    the graph outputs to compute (names of ``spec.outputs``; every one when None): the plan
    gives those alone and holds only the nodes they depend on, so an output nobody asked for
    costs neither time nor memory, nor is its shape checked."""
    input_specs = resolve_inputs(spec.inputs, shapes)
    wanted = [
        (index, decl, source)
        for index, (decl, source) in enumerate(zip(spec.outputs, spec.output_sources, strict=True))
        if outputs is None or decl.name in outputs
    ]
    slots: list[ValueSlot] = []
    slot_of: dict[str, int] = {}
    specs: dict[str, TensorSpec] = dict(input_specs)

    def add(name: str, kind: SlotKind, tensor: TensorSpec) -> int:
        slot_of[name] = len(slots)
        slots.append(ValueSlot(name, kind, tensor.datatype, tensor.shape))
        return slot_of[name]

    for name, tensor in input_specs.items():
        add(name, SlotKind.INPUT, tensor)
    constants: dict[int, np.ndarray[Any, Any]] = {}
    for name, array in spec.constants.items():
        specs[name] = TensorSpec(from_numpy(array.dtype), tuple(array.shape))
        constants[add(name, SlotKind.CONSTANT, specs[name])] = array
    needed = {source for _, _, source in wanted}
    kept = []
    for node in reversed(spec.nodes):
        if node.output in needed:
            kept.append(node)
            needed.update(node.inputs)
    calls: list[tuple[GraphNode, ResolvedCall]] = []
    for node in reversed(kept):
        inputs = {n: specs[v] for n, v in zip(node.operator.inputs, node.inputs, strict=True)}
        call = node_call(node, inputs)
        specs[node.output] = TensorSpec(call.output_datatype, call.output_shape)
        add(node.output, SlotKind.VALUE, specs[node.output])
        calls.append((node, call))
    planned, in_place = _outputs(wanted, slots, slot_of)
    last_read: dict[int, int] = {}
    for i, (node, _) in enumerate(calls):
        for value in node.inputs:
            last_read[slot_of[value]] = i
    steps = tuple(
        GraphStep(
            node,
            call,
            tuple(slot_of[v] for v in node.inputs),
            slot_of[node.output],
            tuple(
                s
                for s, last in last_read.items()
                if last == i and slots[s].kind is SlotKind.VALUE and s not in in_place
            ),
        )
        for i, (node, call) in enumerate(calls)
    )
    counts = {prod(call.output_shape) for _, call in calls}
    fused = bool(steps) and len(counts) == 1 and all(fusable(c) for _, c in calls)
    widest = max(
        (itemsize(slots[s].datatype) for st in steps for s in (*st.reads, st.writes)), default=1
    )
    piece_elements = max(1, piece_bytes // widest)
    scratch, buffers = _scratch(steps, in_place) if fused else ({}, 0)
    work = buffers * piece_elements * widest if fused else _peak(steps, slots, in_place)
    return GraphPlan(
        input_specs=MappingProxyType(input_specs),
        slots=tuple(slots),
        constants=MappingProxyType(constants),
        steps=steps,
        outputs=planned,
        in_place=MappingProxyType(in_place),
        fused=fused,
        elements=counts.pop() if fused else 0,
        piece_elements=piece_elements,
        scratch=MappingProxyType(scratch),
        scratch_buffers=buffers,
        work_bytes=work,
    )


def _outputs(
    wanted: Sequence[tuple[int, ValueDecl, str]],
    slots: Sequence[ValueSlot],
    slot_of: Mapping[str, int],
) -> tuple[tuple[PlannedOutput, ...], dict[int, str]]:
    """The outputs computed (``wanted``: each one's index among the graph's outputs, its
    declaration and the value it holds), each checked against its declared dimensions."""
    in_place: dict[int, str] = {}
    outputs = []
    for index, decl, source in wanted:
        slot = slot_of[source]
        shape = slots[slot].shape
        if decl.dims is not None:
            for axis, (size, dim) in enumerate(zip(shape, decl.dims, strict=True)):
                if isinstance(dim, int) and size != dim:
                    raise invalid(
                        f"outputs[{index}]",
                        "shape",
                        f"output {decl.name[:100]!r} would have size {size} in dimension {axis}; "
                        f"the model declares {dim}",
                    )
        direct = slots[slot].kind is SlotKind.VALUE and slot not in in_place
        if direct:
            in_place[slot] = decl.name
        outputs.append(PlannedOutput(decl.name, slot, decl.datatype, shape, direct))
    return tuple(outputs), in_place


def _scratch(steps: Sequence[GraphStep], in_place: Mapping[int, str]) -> tuple[dict[int, int], int]:
    """A scratch buffer for each intermediate, reused once its last reader has run."""
    assigned: dict[int, int] = {}
    free: list[int] = []
    count = 0
    for step in steps:
        if step.writes not in in_place:
            if free:
                assigned[step.writes] = free.pop()
            else:
                assigned[step.writes] = count
                count += 1
        free.extend(assigned[s] for s in step.frees)
    return assigned, count


def _peak(
    steps: Sequence[GraphStep], slots: Sequence[ValueSlot], in_place: Mapping[int, str]
) -> int:
    alive = peak = 0
    for step in steps:
        if step.writes not in in_place:
            alive += slots[step.writes].nbytes
        peak = max(peak, alive)
        alive -= sum(slots[s].nbytes for s in step.frees)
    return peak


class PlanCache:
    """The plans of one graph model for its most recent distinct input shapes (thread-safe)."""

    def __init__(self, spec: GraphSpec, max_plans: int = PLANS_CACHED) -> None:
        self.spec = spec
        self.max_plans = max_plans
        self._plans: OrderedDict[PlanKey, GraphPlan] = OrderedDict()
        self._lock = threading.Lock()

    def plan(
        self, shapes: Mapping[str, Sequence[int]], outputs: Collection[str] | None = None
    ) -> GraphPlan:
        """The plan of ``plan_graph`` for these input shapes and outputs (every one when
        None), made once per distinct pair."""
        key = (
            tuple(sorted((name, tuple(int(s) for s in shape)) for name, shape in shapes.items())),
            None if outputs is None else frozenset(outputs),
        )
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = plan_graph(
            self.spec, shapes, outputs=outputs
        )  # outside the lock: a refusal is not remembered
        with self._lock:
            self._plans[key] = plan
            if len(self._plans) > self.max_plans:
                self._plans.popitem(last=False)
        return plan
