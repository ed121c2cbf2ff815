"""Running checked work on a backend: one validated call on host or device arrays (``run_into``,
what v2 inference runs), the pieces of whole rows a call can be split into (``rows``: flat
elements when nothing is broadcast), and when its output may be computed over one of its inputs
(``writes_over``). A /v1 batch is run where it is planned (``batch.run_batch``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.device_wait import finish
from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.dtypes import numpy_dtype, wire_dtype
from tensorbits_protocol.validation import ResolvedCall


def run_call(
    backend: Backend,
    call: ResolvedCall,
    inputs: Sequence[DeviceArray],
    out: DeviceArray | None = None,
) -> DeviceArray:
    """Run a validated call on backend arrays (ordered as the operator's inputs)."""
    if out is None:
        out = backend.empty(call.output_shape, numpy_dtype(call.output_datatype))
    backend.run(call, inputs, out)
    return out


def run_into(
    backend: Backend,
    call: ResolvedCall,
    inputs: Sequence[np.ndarray[Any, Any] | DeviceArray],
    out: np.ndarray[Any, Any] | DeviceArray,
) -> None:
    """Run ``call`` with the result landing in ``out``. Inputs and ``out`` are host arrays, or
    (on a device backend) arrays already on its device, such as a CUDA shared-memory region:
    host inputs are copied to the device, a host ``out`` is written from it, a device ``out``
    directly, and finished before this returns (or, run inline on the event loop, before its
    answer goes: ``device_wait.finish``); a large element-wise call on host
    data in overlapped pieces where the backend offers them (``run_pieces``). A host backend
    writes straight into ``out``."""
    if backend.host_memory:
        run_call(backend, call, inputs, out)
        return
    # A large element-wise call on host data, in pieces whose copies overlap its kernels where
    # the backend offers that (CuPy's: backends/pieces.py); False where it does not qualify.
    pieces = getattr(backend, "run_pieces", None)
    if pieces is not None and isinstance(out, np.ndarray) and pieces(call, inputs, out):
        return
    on_device = [
        backend.asarray(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in inputs
    ]
    if isinstance(out, np.ndarray):
        backend.to_host(run_call(backend, call, on_device), out)
        return
    run_call(backend, call, on_device, out)
    finish(backend)  # on the event loop: awaited by a stream callback (device_wait.py)


def piece_call(call: ResolvedCall, shape: tuple[int, ...]) -> ResolvedCall:
    """``call`` on a piece of ``shape`` of every operand, each given as a view of that shape (a
    broadcast input broadcast to it first), run by the same kernel."""
    return dataclasses.replace(
        call, output_shape=shape, kernel_input_shapes=(shape,) * len(call.kernel_input_shapes)
    )


def flat_call(call: ResolvedCall, count: int) -> ResolvedCall:
    """``call`` on ``count`` elements of flat operands: a piece of an element-wise call whose
    inputs all have the output's shape (``is_flat_elementwise``), run on the same positions of
    every operand, by the same kernel."""
    return piece_call(call, (count,))


def rows(call: ResolvedCall) -> tuple[int, ...]:
    """The shape ``call``'s output is split in pieces by: its leading axes taken as one axis of
    rows, as many as every broadcast input (fewer elements than the output) has one element
    along, and at least the first; its other axes as they are. Every operand, broadcast to the
    output's shape, is then a view of that shape (the merged axes repeat a broadcast input:
    stride 0), and a range of rows is a range of bytes of each input of the output's size. A
    broadcast of one element splits into single elements: ``(total,)``."""
    shape = call.output_shape
    total = math.prod(shape)
    lead = len(shape)
    for kernel_shape in call.kernel_input_shapes:
        if math.prod(kernel_shape) != total:  # broadcast: padded on the left to the output's
            padded = (1,) * (len(shape) - len(kernel_shape)) + kernel_shape
            lead = min(lead, next((i for i, n in enumerate(padded) if n != 1), lead))
    lead = max(lead, min(1, len(shape)))
    return (math.prod(shape[:lead]), *shape[lead:])


def in_rows(
    x: np.ndarray[Any, Any],
    kernel_shape: tuple[int, ...],
    shape: tuple[int, ...],
    split: tuple[int, ...],
) -> np.ndarray[Any, Any]:
    """Operand ``x`` (taken by the kernel in ``kernel_shape``) as a view of ``split``, a shape
    ``rows`` gave for an output of ``shape``: an input of the output's size reshaped, a
    broadcast one broadcast to the output's shape first (stride 0 where it repeats). A view,
    never a copy: ``rows`` merges only axes every operand can merge in place, and a reshape
    that would copy raises (``copy=False``) rather than have pieces computed into a copy."""
    if x.size == math.prod(shape):
        return x.reshape(split, copy=False)
    return np.broadcast_to(x.reshape(kernel_shape, copy=False), shape).reshape(split, copy=False)


def is_flat_elementwise(call: ResolvedCall) -> bool:
    """Whether each output element depends only on the input elements at its own position:
    every input has the output's shape (no broadcasting, no pdpd reshape), so the call can run
    in pieces of flat operands (``flat_call``). True of every operator here but broadcasts."""
    return all(shape == call.output_shape for shape in call.kernel_input_shapes)


def writes_over(
    call: ResolvedCall,
    backend: Backend,
    position: int,
    dtype: np.dtype[Any],
    shape: tuple[int, ...],
) -> bool:
    """Whether ``call`` may run on ``backend`` with its output in the memory of its input at
    ``position`` (of ``dtype`` and ``shape``, on the host) and give the bytes a separate output
    gets: the one rule of every place that computes an output over an input it owns (a
    response over the request's body, ``api/rest_infer.written_over``; an output bound for a
    system region over an input read from one, ``run.run_to_region``). Each caller adds what
    makes the input's memory its own to write.

    - the backend's kernel for the operator's function is proven to give the same bytes over
      an input (``alias_safe``: the NumPy backend's single-pass ufuncs); a backend without
      that list (one that may place the call on a device) computes into a buffer of its own;
    - the input has the output's type and shape, and the kernel takes it in that shape
      (``kernel_input_shapes``: no pdpd reshape), so each output element is written over the
      input element at its own position, which nothing reads after. Any other input may be
      broadcast: it is never written over."""
    return (
        call.op.function in getattr(backend, "alias_safe", ())
        and backend.host_memory
        and dtype == wire_dtype(call.output_datatype)
        and shape == call.kernel_input_shapes[position] == call.output_shape
    )
