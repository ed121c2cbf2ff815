"""How a plan runs: into a host array (a response's bytes) or into a shared-memory region, its
shared inputs read here, streamed in pieces where the call allows it.

The strategies: host memory throughout, an element-wise call (broadcasts too, where a piece
holds a whole row) and a system region on either side runs streamed (``run_streamed``: pieces
that stay in the cache); a CUDA region is computed on where it is (the kernel reads and writes
the client's device memory); anything else reads its shared inputs whole (``shared_loaded``)
and runs the kernel once (``engine.run_into``). Every front end runs its plans through
``run_to_host`` and ``run_to_region``; none writes a strategy of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.device_wait import hold
from tensorbits.core.engine import in_rows, piece_call, rows, run_into, writes_over
from tensorbits.core.kernels import DeviceArray
from tensorbits.core.plan import Plan, SharedInput, rows_per_piece, streams
from tensorbits.core.shared_memory import SharedMemoryRegions
from tensorbits_protocol.dtypes import wire_dtype


@contextmanager
def shared_loaded(plan: Plan, regions: SharedMemoryRegions | None) -> Iterator[Plan]:
    """``plan`` with its shared-memory inputs in place, for the block (``shared_read``); the
    plan itself when it has none."""
    if not plan.shared_inputs:
        yield plan
        return
    assert regions is not None  # plan() refused shared memory without regions
    inputs = list(plan.inputs)
    with shared_read(plan.shared_inputs, regions) as arrays:
        for shared, array in zip(plan.shared_inputs, arrays, strict=True):
            inputs[shared.position] = array
        yield plan._replace(inputs=inputs)


@contextmanager
def shared_read(
    inputs: Sequence[SharedInput], regions: SharedMemoryRegions
) -> Iterator[list[DeviceArray]]:
    """The arrays of ``inputs`` in shared memory (in their order), whatever model reads them,
    for the block: one in a system region read (a copy, never a mapping: see shared_memory.py;
    into a buffer the regions recycle once the block ends, so nothing may keep it past it), one
    in a CUDA region as a device array over the client's memory (the region held until the
    block ends)."""
    arrays: list[DeviceArray] = []
    buffers: list[bytearray] = []
    try:
        with ExitStack() as held:
            for shared in inputs:
                if shared.on_device:
                    # Held until the kernels reading it are done (``device_wait.hold``).
                    raw = hold(
                        regions.device_bytes(shared.ref, shared.nbytes, shared.name, "input"), held
                    )
                    arrays.append(raw.view(shared.dtype).reshape(shared.shape))
                    continue
                data = regions.read(shared.ref, shared.nbytes, shared.name)
                buffers.append(data)
                array = np.frombuffer(data, shared.dtype, math.prod(shared.shape))
                arrays.append(array.reshape(shared.shape))
            yield arrays
    finally:
        regions.recycle(buffers)


def run_to_host(
    plan: Plan, backend: Backend, regions: SharedMemoryRegions | None, out: np.ndarray[Any, Any]
) -> None:
    """Run a plan whose output goes to the host array ``out`` (a response's body), its shared
    inputs read here: streamed in pieces from their regions where the call allows it
    (``run_streamed``), else read whole (``shared_loaded``)."""
    if not plan.shared_inputs:  # every input in the request: no context to enter (1 us)
        if plan.run is not None:  # decided with its template (a host backend's)
            plan.run(plan.inputs, out)
        else:
            run_into(backend, plan.call, plan.inputs, out)
        return
    if out.flags.c_contiguous and streams(plan, backend):
        assert regions is not None  # plan() refused shared memory without regions
        run_streamed(plan, backend, regions, out.reshape(-1))  # a view: out is contiguous
        return
    with shared_loaded(plan, regions) as loaded:
        run_into(backend, plan.call, loaded.inputs, out)


def run_to_region(plan: Plan, backend: Backend, regions: SharedMemoryRegions) -> None:
    """Run a plan whose output goes into shared memory, its shared inputs read here. A CUDA
    region: the kernel writes the client's device memory directly. A system region: streamed
    in pieces where the call allows it (``run_streamed``); otherwise the inputs are read whole
    and the output is computed into the buffer of an input read from a system region when the
    kernel may write its output over that input (``engine.writes_over``: that buffer is the
    server's own copy), else into a new array, then written into the region."""
    call, op = plan.call, plan.op
    dtype = wire_dtype(call.output_datatype)
    assert plan.shared_output is not None
    if streams(plan, backend):
        run_streamed(plan, backend, regions)
        return
    with shared_loaded(plan, regions) as loaded:
        if plan.output_on_device:
            with ExitStack() as held:
                # Held until the kernel writing it is done (``device_wait.hold``).
                raw = hold(
                    regions.device_bytes(
                        plan.shared_output, plan.output_nbytes, op.output, "output"
                    ),
                    held,
                )
                run_into(backend, call, loaded.inputs, raw.view(dtype).reshape(call.output_shape))
            return
        over = _replaceable_input(plan, backend)
        out = np.empty(call.output_shape, dtype) if over is None else loaded.inputs[over]
        run_into(backend, call, loaded.inputs, out)
        regions.write(plan.shared_output, out.reshape(-1).view(np.uint8).data, op.output)


def _replaceable_input(plan: Plan, backend: Backend) -> int | None:
    """The position of an input read from a system region that the output may be computed
    over (``engine.writes_over``): the buffer it is read into is the server's own copy, read
    by nothing after the kernel, so no output buffer is needed."""
    return next(
        (
            shared.position
            for shared in plan.shared_inputs
            if not shared.on_device
            and writes_over(plan.call, backend, shared.position, shared.dtype, shared.shape)
        ),
        None,
    )


def run_streamed(
    plan: Plan,
    backend: Backend,
    regions: SharedMemoryRegions,
    host_out: np.ndarray[Any, Any] | None = None,
) -> None:
    """Run ``plan`` in pieces of whole rows (``engine.rows``; an element-wise call's rows are
    single elements), ``rows_per_piece`` at a time: for each, read the inputs' piece from their
    regions (body inputs: a slice of their view), run the kernel on the piece
    (``engine.piece_call``), and write the output's piece into its system region, or straight
    into ``host_out`` (flat: a response's body) when given. A broadcast input (fewer elements
    than the output) is read whole first, and each piece reads its view (stride 0 where it
    repeats). The pieces' buffers stay in the cache, so each byte crosses memory once in and
    once out instead of three times (``preadv`` into a whole buffer, the kernel, ``pwritev``
    out of it). Every region a piece is read from is held for the whole run (``system_bytes``).
    An output in exactly an input's buffer (``engine.writes_over``) is safe: each piece is
    read before it is written, and no later piece reads it."""
    call, op = plan.call, plan.op
    shape, out_dtype = call.output_shape, wire_dtype(call.output_datatype)
    total = math.prod(shape)
    if total == 0:
        return  # an empty output: nothing to read or write
    split = rows(call)
    row = math.prod(split[1:])
    step = min(rows_per_piece(plan), split[0])
    # Read a piece at a time: the shared inputs of the output's size; the others read whole.
    pieced = {each.position: each for each in plan.read_in_pieces()}
    whole = [each for each in plan.shared_inputs if each.position not in pieced]
    buffers = {i: regions.pool.take(step * row * each.dtype.itemsize) for i, each in pieced.items()}
    # The output's pieces go straight into host_out when given, else into the buffer of an
    # input the operator may replace, else into a buffer of their own.
    over = None if host_out is not None else _replaceable_input(plan, backend)
    out_buffer = (
        regions.pool.take(step * row * out_dtype.itemsize)
        if over is None and host_out is None
        else None
    )
    try:
        with ExitStack() as held:
            sources = {
                i: held.enter_context(
                    regions.system_bytes(each.ref, each.nbytes, each.name, "input")
                )
                for i, each in pieced.items()
            }
            sink = None
            if host_out is None:
                assert plan.shared_output is not None
                sink = held.enter_context(
                    regions.system_bytes(
                        plan.shared_output, plan.output_nbytes, op.output, "output"
                    )
                )
            # Every other operand as a view in rows, a piece a slice of it.
            arrays = held.enter_context(shared_read(whole, regions))  # read whole, recycled after
            read = {each.position: array for each, array in zip(whole, arrays, strict=True)}
            operands: list[np.ndarray[Any, Any] | None] = [
                None if i in pieced else in_rows(read.get(i, x), kernel_shape, shape, split)
                for i, (x, kernel_shape) in enumerate(
                    zip(plan.inputs, call.kernel_input_shapes, strict=True)
                )
            ]
            outs = None if host_out is None else host_out.reshape(split)
            for first in range(0, split[0], step):
                count = min(step, split[0] - first)
                piece = (count, *split[1:])
                pieces: list[np.ndarray[Any, Any]] = []
                for i, operand in enumerate(operands):
                    if operand is not None:
                        pieces.append(operand[first : first + count])
                        continue
                    dtype = pieced[i].dtype
                    into = memoryview(buffers[i])[: count * row * dtype.itemsize]
                    sources[i].read_into(first * row * dtype.itemsize, into)
                    pieces.append(np.frombuffer(into, dtype).reshape(piece))
                if outs is not None:
                    out = outs[first : first + count]
                elif over is None:
                    assert out_buffer is not None
                    raw = memoryview(out_buffer)[: count * row * out_dtype.itemsize]
                    out = np.frombuffer(raw, out_dtype).reshape(piece)
                else:
                    out = pieces[over]
                run_into(backend, piece_call(call, piece), pieces, out)
                if sink is not None:
                    sink.write(
                        first * row * out_dtype.itemsize, out.reshape(-1).view(np.uint8).data
                    )
    finally:
        regions.recycle([*buffers.values(), *([out_buffer] if out_buffer is not None else [])])


__all__ = ["run_streamed", "run_to_host", "run_to_region", "shared_loaded", "shared_read"]
