"""Fused graph kernels for the CuPy backend: a whole chain of element-wise nodes in one kernel.

Run node by node, a graph of k element-wise nodes launches k kernels, and every intermediate
makes a round trip through device memory: the chain moves several times the bytes of its inputs
and outputs, and on a streaming kernel bytes are the time. A fused plan (``GraphPlan.fused``:
every step flat element-wise over one element count, any other operand of one element) runs
here as one kernel instead: each thread loads a vector of every graph input, computes every
step for each element in registers, each value typed as its step makes it, and stores every
graph output, so each input byte is read once and each output byte written once.

Each step is the per-element function the wide kernels use for one call (``cupy_wide.lane_body``:
the bitwise, BOOL, shift and population-count rules, the very same source text), declared once
per step kind with that step's element types; the chain calls them in the plan's order. Loads
and stores are vectors of 16 bytes of the widest array, as in cupy_wide.py, with a tail of one
element per thread.

This module reads a plan through the small protocols below (the backends sit beneath the core
and do not import it). The source is a plain function of the plan (``graph_kernel_source``) so
that it is also compiled for the host with a shim and checked against the NumPy run of the same
plan, on machines without a GPU (tests/core/test_graph_kernels.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from math import prod
from typing import Any, Protocol

import numpy as np

from tensorbits.core.backends.cupy_wide import _WORDS, C_TYPES, MAX_BLOCKS, THREADS, lane_body
from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.dtypes import DTYPES, DataType
from tensorbits_protocol.operators import Encoding, Function
from tensorbits_protocol.validation import ResolvedCall

VECTOR_BYTES = 16  # what a thread loads of the widest array at once (one uint4)
# Pointers a kernel takes at most: CUDA's parameter space is 4 KiB on every device CuPy runs
# on, and a graph this wide gains little from fusion anyway; past it the plan runs node by node.
MAX_ARRAYS = 256
KERNELS_CACHED = 64  # compiled chains kept per backend (each holds a module on the device)


class ChainSlot(Protocol):
    """A value of the plan (``plan.ValueSlot``)."""

    @property
    def kind(self) -> str: ...  # "input", "constant" or "value" (written by a step)

    @property
    def datatype(self) -> DataType: ...

    @property
    def shape(self) -> tuple[int, ...]: ...


class ChainStep(Protocol):
    """A node's call and the slots it reads (in the operator's input order) and writes."""

    @property
    def call(self) -> ResolvedCall: ...

    @property
    def reads(self) -> tuple[int, ...]: ...

    @property
    def writes(self) -> int: ...


class ChainOutput(Protocol):
    @property
    def slot(self) -> int: ...


class FusedChain(Protocol):
    """What a fused kernel needs of a ``GraphPlan``."""

    @property
    def slots(self) -> Sequence[ChainSlot]: ...

    @property
    def steps(self) -> Sequence[ChainStep]: ...

    @property
    def outputs(self) -> Sequence[ChainOutput]: ...

    @property
    def fused(self) -> bool: ...

    @property
    def elements(self) -> int: ...


def _storage(datatype: DataType) -> np.dtype[Any]:
    """The type a source value is held as: its own, but a float's bits (the operators that
    take floats act on the stored bits, and a C float cast would change them)."""
    info = DTYPES[datatype]
    return info.bits if info.numpy.kind == "f" else info.numpy


def _step_types(call: ResolvedCall) -> tuple[np.dtype[Any], np.dtype[Any]]:
    """The element types a step computes in and out, as ``kernels.as_kernel_operands`` sees
    them: DirectML's operators on the same-width unsigned bits, the others on the typed values."""
    if call.op.encoding is Encoding.NATIVE_BITS:
        return DTYPES[call.input_datatype].bits, DTYPES[call.output_datatype].bits
    return DTYPES[call.input_datatype].numpy, DTYPES[call.output_datatype].numpy


@dataclass(frozen=True, slots=True)
class FusedKernel:
    """One chain's kernel: its name and CUDA C++, and the slots its pointer parameters take in
    order, the sources (graph inputs and constants the steps read) then the outputs (values a
    graph output holds), before the element count. ``scalars``: the sources of one element,
    read once for every position."""

    name: str
    source: str
    sources: tuple[int, ...]
    outputs: tuple[int, ...]
    scalars: frozenset[int]
    lanes: int  # elements a thread computes per vector

    @property
    def parameters(self) -> int:
        return len(self.sources) + len(self.outputs)


# The step kinds a chain calls: function, shift left, element type in, out (``lane_body``'s).
StepKind = tuple[Function, bool, str, str]


def _chain_key(plan: FusedChain) -> tuple[Any, ...] | None:
    """The chain's structure and types (what its source depends on), or None where no fused
    kernel applies: the plan not fused, no elements, a type without a C name, too many arrays."""
    if not plan.fused or plan.elements <= 0 or not plan.steps:
        return None
    sources = sorted(
        {s for step in plan.steps for s in step.reads if plan.slots[s].kind != "value"}
    )
    outputs = sorted({o.slot for o in plan.outputs if plan.slots[o.slot].kind == "value"})
    if not outputs or len(sources) + len(outputs) > MAX_ARRAYS:
        return None
    source_types = []
    for slot in sources:
        count = prod(plan.slots[slot].shape)
        if count not in (1, plan.elements):
            return None
        source_types.append((slot, _storage(plan.slots[slot].datatype).str, count == 1))
    steps = []
    for step in plan.steps:
        t, o = _step_types(step.call)
        if t not in C_TYPES or o not in C_TYPES:
            return None
        kind: StepKind = (step.call.op.function, bool(step.call.shift_left), t.str, o.str)
        steps.append((kind, step.reads, step.writes))
    return (tuple(source_types), tuple(steps), tuple(outputs))


def _c(dtype: str) -> str:
    return C_TYPES[np.dtype(dtype)]


def _step_function(index: int, kind: StepKind, shift_body: str, popcount_body: str) -> str:
    """``step_<index>(x, y)``: one output element of a step kind, by the wide kernels' body."""
    function, left, t, o = kind
    body = lane_body(function, np.dtype(t) == np.bool_, shift_body, popcount_body)
    body = body.replace("LEFT_FLAG", "true" if left else "false")
    return (
        f"__device__ __forceinline__ {_c(o)} step_{index}({_c(t)} x, {_c(t)} y) {{\n"
        f"typedef {_c(t)} T;\ntypedef {_c(o)} O;\n(void)y;\n{body}\n}}\n"
    )


def fused_kernel(plan: FusedChain, shift_body: str, popcount_body: str) -> FusedKernel | None:
    """The fused kernel of ``plan``, or None where none applies (it runs node by node)."""
    key = _chain_key(plan)
    if key is None:
        return None
    source_types, steps, outputs = key
    name = "tensorbits_graph_" + hashlib.blake2s(repr(key).encode(), digest_size=8).hexdigest()
    kinds: dict[StepKind, int] = {}
    for kind, _, _ in steps:
        kinds.setdefault(kind, len(kinds))
    # Each value's C type: a source's storage type, a step's value its output type.
    types: dict[int, str] = {slot: dtype for slot, dtype, _ in source_types}
    for kind, _, writes in steps:
        types[writes] = kind[3]
    scalars = frozenset(slot for slot, _, scalar in source_types if scalar)
    vectored = [slot for slot, _, _ in source_types if slot not in scalars] + list(outputs)
    lanes = VECTOR_BYTES // max(np.dtype(types[s]).itemsize for s in vectored)

    # A vector of one type: the word it is loaded or stored as, and its elements.
    words = {
        dtype: _WORDS[lanes * np.dtype(dtype).itemsize] for dtype in {types[s] for s in vectored}
    }
    lines = [f"#define LANES {lanes}"]
    for dtype in sorted(words):
        lines.append(f"union Vector_{dtype[1:]} {{ {words[dtype]} w; {_c(dtype)} e[LANES]; }};")
    lines.extend(_step_function(i, kind, shift_body, popcount_body) for kind, i in kinds.items())
    # The chain on one position: the sources' elements in, a reference to each output's out.
    parameters = [f"const {_c(types[s])} v{s}" for s, _, _ in source_types]
    parameters += [f"{_c(types[s])}& z{s}" for s in outputs]
    lines.append(f"__device__ __forceinline__ void chain({', '.join(parameters)}) {{")
    for kind, reads, writes in steps:
        t = kind[2]
        # The operator's own input order; a unary step's second operand is unused.
        operands = [f"v{s}" if types[s] == t else f"({_c(t)})v{s}" for s in reads]
        operands += [f"({_c(t)})0"] * (2 - len(operands))
        lines.append(
            f"    const {_c(kind[3])} v{writes} = step_{kinds[kind]}({', '.join(operands)});"
        )
    lines.extend(f"    z{s} = v{s};" for s in outputs)
    lines.append("}")

    pointers = [f"const void* p{s}" for s, _, _ in source_types]
    pointers += [f"void* p{s}" for s in outputs]
    lines.append(
        f'extern "C" __global__ void {name}({", ".join(pointers)}, unsigned long long n) {{'
    )
    for s, _, _ in source_types:
        lines.append(f"    const {_c(types[s])}* __restrict__ s{s} = (const {_c(types[s])}*)p{s};")
    for s in outputs:
        lines.append(f"    {_c(types[s])}* __restrict__ o{s} = ({_c(types[s])}*)p{s};")
    lines += [
        "    const unsigned long long vectors = n / LANES;",
        "    const unsigned long long first = "
        "(unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;",
        "    const unsigned long long stride = (unsigned long long)blockDim.x * gridDim.x;",
    ]
    # An operand of one element: the same value at every position, read once.
    lines.extend(f"    const {_c(types[s])} c{s} = s{s}[0];" for s in sorted(scalars))
    lines.append("    for (unsigned long long v = first; v < vectors; v += stride) {")
    for s in vectored:
        vector = f"Vector_{types[s][1:]}"
        if s in outputs:
            lines.append(f"        {vector} r{s};")
        else:
            lines.append(f"        {vector} a{s};")
            lines.append(f"        a{s}.w = reinterpret_cast<const {words[types[s]]}*>(s{s})[v];")
    lane_arguments = [f"c{s}" if s in scalars else f"a{s}.e[l]" for s, _, _ in source_types]
    lane_arguments += [f"r{s}.e[l]" for s in outputs]
    lines += [
        "#pragma unroll",
        "        for (int l = 0; l < LANES; ++l) {",
        f"            chain({', '.join(lane_arguments)});",
        "        }",
    ]
    lines.extend(
        f"        reinterpret_cast<{words[types[s]]}*>(o{s})[v] = r{s}.w;" for s in outputs
    )
    lines.append("    }")
    # The tail: fewer than LANES elements past the last whole vector, one thread each.
    tail_arguments = [f"c{s}" if s in scalars else f"s{s}[tail]" for s, _, _ in source_types]
    tail_arguments += [f"o{s}[tail]" for s in outputs]
    lines += [
        "    const unsigned long long tail = vectors * LANES + first;",
        "    if (tail < n) {",
        f"        chain({', '.join(tail_arguments)});",
        "    }",
        "}",
    ]
    return FusedKernel(
        name=name,
        source="\n".join(lines) + "\n",
        sources=tuple(s for s, _, _ in source_types),
        outputs=tuple(outputs),
        scalars=scalars,
        lanes=lanes,
    )


def graph_kernel_source(plan: FusedChain, shift_body: str, popcount_body: str) -> str | None:
    """The CUDA C++ of ``plan``'s fused kernel, or None where none applies."""
    kernel = fused_kernel(plan, shift_body, popcount_body)
    return None if kernel is None else kernel.source


def _address(x: DeviceArray) -> int:
    data = x.data
    return int(data.ptr) if hasattr(data, "ptr") else int(x.ctypes.data)


def launch_blocks(kernel: FusedKernel, elements: int) -> int:
    """Blocks of ``THREADS`` for ``elements``: a thread a vector (at least one block, whose
    threads also run the tail), the grid's stride loop past CUDA's limit."""
    vectors = max(1, elements // kernel.lanes)
    return min(MAX_BLOCKS, -(-vectors // THREADS))


class GraphKernels:
    """The fused graph kernels of one CuPy backend, compiled (by NVRTC, cached by CuPy) on a
    chain's first run and kept by its structure and types."""

    def __init__(self, cupy: Any, shift_body: str, popcount_body: str) -> None:
        self._cupy = cupy
        self._shift_body = shift_body
        self._popcount_body = popcount_body
        self._kernels: OrderedDict[tuple[Any, ...], tuple[FusedKernel, Any]] = OrderedDict()

    def _kernel(self, plan: FusedChain) -> tuple[FusedKernel, Any] | None:
        key = _chain_key(plan)
        if key is None:
            return None
        cached = self._kernels.get(key)
        if cached is not None:
            self._kernels.move_to_end(key)
            return cached
        kernel = fused_kernel(plan, self._shift_body, self._popcount_body)
        assert kernel is not None  # the key said it applies
        cached = (kernel, self._cupy.RawKernel(kernel.source, kernel.name))
        self._kernels[key] = cached
        if len(self._kernels) > KERNELS_CACHED:
            self._kernels.popitem(last=False)
        return cached

    def run(
        self,
        plan: FusedChain,
        values: MutableMapping[int, DeviceArray],
        empty: Any,
        into: Mapping[int, DeviceArray] | None = None,
    ) -> bool:
        """Run ``plan`` in one kernel over ``values`` (the sources by slot, device arrays: a
        CUDA region's read where it is) and add to it a device array for each value a graph
        output holds: ``into``'s for that slot where it gives one the kernel can store to (the
        caller's memory, written in place), else a new one (from ``empty(shape, dtype)``);
        False, nothing run or added, where no fused kernel applies."""
        found = self._kernel(plan)
        if found is None:
            return False
        kernel, compiled = found
        sources = [values[s] for s in kernel.sources]
        if not all(
            _usable(x, s in kernel.scalars) for s, x in zip(kernel.sources, sources, strict=True)
        ):
            return False
        made: dict[int, DeviceArray] = {}
        for slot in kernel.outputs:
            value = plan.slots[slot]
            given = (into or {}).get(slot)
            if given is not None and _usable(given, False):
                made[slot] = given
            else:  # none given, or one the vector stores cannot take: copied from this after
                made[slot] = empty(value.shape, DTYPES[value.datatype].numpy)
        if not all(_usable(x, False) for x in made.values()):
            return False
        compiled(
            (launch_blocks(kernel, plan.elements),),
            (THREADS,),
            (*sources, *made.values(), np.uint64(plan.elements)),
        )
        values.update(made)
        return True


def _usable(x: DeviceArray, scalar: bool) -> bool:
    """Whether the kernel may read or write ``x`` through its pointer: contiguous, native byte
    order (a region's view is typed little-endian explicitly, ``<u4``: native here), and
    (loaded as vectors) 16-byte aligned; arrays the backend made always are."""
    if not (x.flags.c_contiguous and x.dtype.isnative):
        return False
    return scalar or _address(x) % VECTOR_BYTES == 0
