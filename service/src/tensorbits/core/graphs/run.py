"""``run_graph``: a ``GraphPlan`` run on a backend, its outputs written into the caller's arrays.

Fused (a ``fused`` plan on a host backend, every output C-contiguous): the whole chain runs one
piece at a time, each step on the same ``piece_elements`` positions of flat operands
(``engine.flat_call``), every intermediate in a small reused scratch buffer: each input byte is
read from memory once and each output byte written once, while the intermediates never leave
the cache. A fused plan on a device backend that offers it (``backends.base.run_fused``: CuPy)
runs as one generated kernel reading the inputs and writing every output's value in one pass,
each step by the per-element source of its single-call kernel. Otherwise, node by node over
whole arrays (broadcasting; device backends, whose intermediates stay on the device), each
intermediate freed after its last reader. The host paths run every call through
``engine.run_into``, the kernels a single call runs, so every path's results are byte-identical
to running the nodes one by one.

On a device backend an input or output may already be a device array (not a NumPy array: a
CUDA shared-memory region's bytes, the client's memory itself): an input is read where it is,
never copied, and an output is written where it is, by the fused kernel itself or by the step
computing it, so a graph on CUDA regions moves no byte between the host and the device. Host
arrays are copied in once and their outputs copied back once, as before.

Inputs and outputs are checked against the plan (``InvalidRequest`` naming the tensor). The
output arrays must not overlap the inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from tensorbits.core.backends.base import Backend, run_fused, share
from tensorbits.core.engine import flat_call, run_into
from tensorbits.core.graphs.plan import GraphPlan, SlotKind
from tensorbits.core.graphs.refusals import invalid
from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.dtypes import numpy_dtype
from tensorbits_protocol.validation import ResolvedCall, Shape

# A fused run of at least this many bytes (of its widest type) is shared among the backend's
# threads. XOR -> shift -> NOT over 64 MiB of UINT32 on 2 cores, in process: see
# docs/benchmarks.md "Graph models" (the same bound as a single call's, numpy_backend.py).
SHARED_MIN_BYTES = 4 << 20

HostArray = np.ndarray[Any, Any]
HostArrays = Mapping[str, HostArray]  # by tensor name
# By tensor name: host arrays, or on a device backend arrays already on its device.
Arrays = Mapping[str, HostArray | DeviceArray]


def on_device(array: HostArray | DeviceArray) -> bool:
    """Whether ``array`` is a device array (a device backend's, as CuPy's are), not a host
    one: the test ``engine.run_into`` makes too."""
    return not isinstance(array, np.ndarray)


def _check_names(what: str, given: Arrays, expected: list[str]) -> None:
    if set(given) != set(expected):
        missing = [n for n in expected if n not in given]
        unknown = [n for n in given if n not in expected]
        name = (missing or unknown)[0]
        raise invalid(
            name[:100],
            "missing_input" if missing else "unknown_input",
            f"{'missing' if missing else 'unknown'} {what} (the model's: {', '.join(expected)})",
        )


def _check_array(name: str, array: HostArray | DeviceArray, datatype: Any, shape: Shape) -> None:
    if array.dtype != numpy_dtype(datatype) or tuple(array.shape) != shape:
        raise invalid(
            name[:100],
            "shape" if array.dtype == numpy_dtype(datatype) else "datatype",
            f"{array.dtype} {list(array.shape)}; the plan takes {datatype} {list(shape)}",
        )


def run_graph(plan: GraphPlan, backend: Backend, inputs: Arrays, outputs: Arrays) -> None:
    """Run ``plan`` on ``inputs`` (arrays by input name), writing each graph output into
    ``outputs[name]`` (arrays of the plan's type and shape): host arrays, or on a device backend
    device arrays too (see the module's docstring)."""
    _checked(plan, inputs, outputs)
    values = _sources(plan, backend, inputs)
    if _fused_on_host(plan, backend, outputs):
        _run_fused(plan, backend, values, outputs)
    elif (
        plan.fused
        and not backend.host_memory
        and run_fused(backend, plan, values, _device_targets(plan, outputs))
    ):
        pass  # one kernel wrote each output's value on the device, into a device output's own
    else:
        _run_node_by_node(plan, backend, values, outputs)
    for output in plan.outputs:
        # An output whose value was computed in its own array (in place) is done; any other
        # (a device value for a host array, an input or constant answered as an output, two
        # outputs of one value) is copied here.
        value, out = values[output.slot], outputs[output.name]
        if value is not out:
            _copy_into(backend, value, out)


def _checked(plan: GraphPlan, inputs: Arrays, outputs: Arrays) -> None:
    """The arrays are the plan's: its names, types and shapes, every output writable."""
    _check_names("input", inputs, list(plan.input_specs))
    _check_names("output", outputs, [o.name for o in plan.outputs])
    for name, tensor in plan.input_specs.items():
        _check_array(name, inputs[name], tensor.datatype, tensor.shape)
    for output in plan.outputs:
        array = outputs[output.name]
        _check_array(output.name, array, output.datatype, output.shape)
        # A device array has no such flag (CuPy's): the caller's device memory is writable.
        if isinstance(array, np.ndarray) and not array.flags.writeable:
            raise invalid(output.name[:100], "read_only", "the output array is read-only")


def _fused_on_host(plan: GraphPlan, backend: Backend, outputs: Arrays) -> bool:
    """Whether ``run_graph`` runs ``plan`` as one chain on the host (``_run_fused``): a fused
    plan, a host backend, every output contiguous."""
    return (
        plan.fused
        and backend.host_memory
        and all(outputs[o.name].flags.c_contiguous for o in plan.outputs)
    )


def _device_targets(plan: GraphPlan, outputs: Arrays) -> dict[int, DeviceArray]:
    """The device output arrays a fused kernel may write straight into, by the value slot
    each holds (one output per slot: another output of the same value is copied from it)."""
    targets: dict[int, DeviceArray] = {}
    for output in plan.outputs:
        out = outputs[output.name]
        if on_device(out) and plan.slots[output.slot].kind is SlotKind.VALUE:
            targets.setdefault(output.slot, out)
    return targets


def _sources(plan: GraphPlan, backend: Backend, inputs: Arrays) -> dict[int, DeviceArray]:
    """The inputs' and constants' arrays by slot, on the backend's device: a host array copied
    there once, a device array (a CUDA region's) used where it is."""
    values: dict[int, DeviceArray] = {}
    for slot, value in enumerate(plan.slots):
        if value.kind is SlotKind.INPUT:
            array = inputs[value.name]
        elif value.kind is SlotKind.CONSTANT:
            array = plan.constants[slot]
        else:
            continue
        values[slot] = (
            array
            if backend.host_memory or on_device(array)
            else backend.asarray(np.ascontiguousarray(array))
        )
    return values


def _run_node_by_node(
    plan: GraphPlan, backend: Backend, values: dict[int, DeviceArray], outputs: Arrays
) -> None:
    """Each step over whole arrays, its result added to ``values`` (the sources at first) and
    each value dropped from it after its last reader. A step writing a graph output writes the
    caller's array for it where that is the backend's memory (any array on the host, a device
    array on a device)."""
    for step in plan.steps:
        call = step.call
        own = outputs[plan.in_place[step.writes]] if step.writes in plan.in_place else None
        if own is not None and (backend.host_memory or on_device(own)):
            target = own
        else:
            target = backend.empty(call.output_shape, numpy_dtype(call.output_datatype))
        run_into(backend, call, [values[s] for s in step.reads], target)
        values[step.writes] = target
        for slot in step.frees:
            del values[slot]


def fused_runner(
    plan: GraphPlan, backend: Backend, inputs: HostArrays, outputs: HostArrays
) -> Callable[[int, int], None] | None:
    """``run_graph`` of ``plan`` a range of elements at a time, on the calling thread:
    ``run(begin, end)`` computes elements ``begin`` to ``end`` of every output, in its own array
    (a body arriving: ``core/arrival.py``); checked as ``run_graph`` checks. None where
    ``run_graph`` would not run it fused on the host, or would copy an output after (an input
    or constant answered, two outputs of one value)."""
    _checked(plan, inputs, outputs)
    written = {name: slot for slot, name in plan.in_place.items()}
    if not (
        _fused_on_host(plan, backend, outputs)
        and all(written.get(o.name) == o.slot for o in plan.outputs)
        and all(x.flags.c_contiguous for x in inputs.values())  # views, never copies
    ):
        return None
    return _ranges(plan, backend, _sources(plan, backend, inputs), outputs)


def _run_fused(
    plan: GraphPlan, backend: Backend, values: dict[int, DeviceArray], outputs: Arrays
) -> None:
    """The whole chain a piece at a time over flat views of ``values`` (the sources); the
    outputs written in place are added to it."""
    run_range = _ranges(plan, backend, values, outputs)
    total = plan.elements
    widest = max((plan.slots[s].nbytes // max(plan.elements, 1) for s in plan.scratch), default=1)
    piece = plan.piece_elements
    # A large graph runs on every thread of the backend, each a range of whole pieces (NumPy
    # releases the GIL in its kernels): a piece's steps stay on one core, its cache warm.
    threads = getattr(backend, "threads", 1) if total * widest >= SHARED_MIN_BYTES else 1
    span = -(-total // (threads * piece)) * piece if threads > 1 else max(total, 1)
    ranges = [
        partial(run_range, begin, min(begin + span, total)) for begin in range(0, total, span)
    ]
    share(backend, ranges)
    for slot, name in plan.in_place.items():
        values[slot] = outputs[name]


def _ranges(
    plan: GraphPlan, backend: Backend, values: dict[int, DeviceArray], outputs: Arrays
) -> Callable[[int, int], None]:
    """The fused chain's runner of a range of elements over flat views of ``values`` (the
    sources) and of the outputs written in place."""
    # Flat views of whole arrays (inputs, constants, outputs written in place), and of each
    # intermediate's scratch buffer as its type.
    flat: dict[int, HostArray] = {
        slot: np.ascontiguousarray(array).reshape(-1) for slot, array in values.items()
    }
    for slot, name in plan.in_place.items():
        flat[slot] = outputs[name].reshape(-1)
    piece = plan.piece_elements
    widest = max((plan.slots[s].nbytes // max(plan.elements, 1) for s in plan.scratch), default=1)
    # Operands of one element where the step has more (``plan.fusable``): the same element for
    # every position, a stride-0 view, made once per piece size.
    single_slots = {
        s for step in plan.steps for s in step.reads if s in flat and flat[s].size < plan.elements
    }

    def run_range(begin: int, end: int) -> None:
        """Elements ``begin`` to ``end`` of every output, a piece at a time, through scratch
        buffers of this range's own (ranges run on different threads)."""
        buffers = [np.empty(piece * widest, np.uint8) for _ in range(plan.scratch_buffers)]
        scratch: dict[int, HostArray] = {
            slot: buffers[buffer].view(numpy_dtype(plan.slots[slot].datatype))[:piece]
            for slot, buffer in plan.scratch.items()
        }
        single: dict[int, HostArray] = {}
        calls: dict[int, list[ResolvedCall]] = {}
        for start in range(begin, end, piece):
            count = min(piece, end - start)
            if count not in calls:
                calls[count] = [flat_call(step.call, count) for step in plan.steps]
            if single_slots and len(single[min(single_slots)] if single else ()) != count:
                single = {s: np.broadcast_to(flat[s], (count,)) for s in single_slots}
            for step, call in zip(plan.steps, calls[count], strict=True):
                operands = [
                    scratch[s][:count]
                    if s in scratch
                    else single[s]
                    if s in single
                    else flat[s][start : start + count]
                    for s in step.reads
                ]
                target = (
                    scratch[step.writes][:count]
                    if step.writes in scratch
                    else flat[step.writes][start : start + count]
                )
                run_into(backend, call, operands, target)

    return run_range


def _copy_into(backend: Backend, value: DeviceArray, out: HostArray | DeviceArray) -> None:
    """``value`` into ``out``: host to host, device to host, or (``out`` a device array)
    device to device, never through the host."""
    if on_device(out):
        out[...] = value
    elif isinstance(value, np.ndarray):
        np.copyto(out, value)
    else:
        backend.to_host(value, out)
