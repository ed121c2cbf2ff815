"""Running checked work on a backend: one call on host or device arrays (``run_into``, what v2
inference runs), a whole batch over its buffers (``run_batch``, what /v1 runs), and
``compute``, validation and run in one step on host arrays (for tests, benchmarks and programs
that use the operators in process).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorbits.backends.base import Backend
from tensorbits.kernels import DeviceArray
from tensorbits_protocol.dtypes import DataType, from_numpy, numpy_dtype
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

if TYPE_CHECKING:
    from tensorbits.batch import BatchPlan, BoundTensor, BufferPlan

_UINT8 = np.dtype(np.uint8)


def spec_of(array: np.ndarray[Any, Any]) -> TensorSpec:
    return TensorSpec(datatype=from_numpy(array.dtype), shape=tuple(array.shape))


def validate_arrays(
    model: str, arrays: Mapping[str, np.ndarray[Any, Any]], parameters: Mapping[str, object] | None
) -> ResolvedCall:
    op = get_operator(model)
    return validate_call(op, {name: spec_of(a) for name, a in arrays.items()}, parameters)


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
    directly, and finished (synchronized) before this returns. A host backend writes straight
    into ``out``."""
    if backend.host_memory:
        run_call(backend, call, inputs, out)
        return
    on_device = [
        backend.asarray(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else x for x in inputs
    ]
    if isinstance(out, np.ndarray):
        backend.to_host(run_call(backend, call, on_device), out)
        return
    run_call(backend, call, on_device, out)
    backend.synchronize()


def flat_call(call: ResolvedCall, count: int) -> ResolvedCall:
    """``call`` on ``count`` elements of flat operands: a piece of an element-wise call whose
    inputs all have the output's shape (``is_flat_elementwise``), run on the same positions of
    every operand, by the same kernel."""
    return dataclasses.replace(
        call,
        output_shape=(count,),
        kernel_input_shapes=((count,),) * len(call.kernel_input_shapes),
    )


def is_flat_elementwise(call: ResolvedCall) -> bool:
    """Whether each output element depends only on the input elements at its own position:
    every input has the output's shape (no broadcasting, no pdpd reshape), so the call can run
    in pieces of flat operands (``flat_call``). True of every operator here but broadcasts."""
    return all(shape == call.output_shape for shape in call.kernel_input_shapes)


def compute(
    backend: Backend,
    model: str,
    arrays: Mapping[str, np.ndarray[Any, Any]],
    parameters: Mapping[str, object] | None = None,
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """Validate and run one operator on host arrays; the result comes back in host memory."""
    call = validate_arrays(model, arrays, parameters)
    if out is None:
        out = np.empty(call.output_shape, numpy_dtype(call.output_datatype))
    run_into(backend, call, [np.ascontiguousarray(arrays[n]) for n in call.op.inputs], out)
    return out


# --- a batch ----------------------------------------------------------------------------------
def _place(backend: Backend, body: bytearray, buffer: BufferPlan) -> DeviceArray:
    """The buffer as a flat uint8 array on the device. On NumPy a data buffer is the body's own
    memory (the body is a writable bytearray, so outputs may be written into it in place)."""
    if buffer.body_offset is None:
        return _zeros(backend, buffer.byte_size)
    host = np.frombuffer(body, dtype=_UINT8, count=buffer.byte_size, offset=buffer.body_offset)
    return backend.asarray(host)


def _zeros(backend: Backend, nbytes: int) -> DeviceArray:
    """``nbytes`` zero bytes on the backend's device (zeros: the bytes no output covers go back
    to the client too). ``xp.zeros`` would allocate on the calling thread's current device,
    device 0 on a worker thread whatever the backend's; ``empty`` allocates on the backend's,
    and the fill runs under the array's own device (a CuPy array's ``device`` is its context)."""
    if backend.host_memory:
        return np.zeros(nbytes, dtype=_UINT8)
    array = backend.empty((nbytes,), _UINT8)
    with array.device:
        array.fill(0)  # CuPy: a memset on that device's current stream
    return array


class _Views:
    """The arrays a batch's dispatches work on, as views of the placed buffers.

    A packed tensor (``DescLayout.packed``, the common case) is a slice of its buffer viewed as
    its data type, reshaped: a few hundred nanoseconds, and the typed view of each buffer is made
    once per data type. Any other layout goes through ``as_strided``, ten times slower. Both stay
    within the bytes [offset, offset + total size) that the planner proved hold every element
    (``dml.layout_of`` and ``dml.check_placement``), so neither
    reads or writes outside the bound range: the unchecked ``as_strided`` included."""

    def __init__(self, xp: Any, buffers: Sequence[DeviceArray]) -> None:
        self.xp = xp
        self.buffers = buffers
        self.typed: dict[tuple[int, DataType], DeviceArray] = {}

    def of(self, tensor: BoundTensor) -> DeviceArray:
        desc = tensor.desc
        if not desc.packed:
            return self.strided(tensor)
        typed = self.typed.get((tensor.buffer, desc.datatype))
        if typed is None:
            typed = self.typed_buffer(tensor.buffer, desc.datatype)
        start = tensor.offset // desc.itemsize  # offsets are multiples of 16: whole elements
        flat = typed[start : start + desc.elements]
        return flat if len(desc.shape) == 1 else flat.reshape(desc.shape)

    def typed_buffer(self, index: int, datatype: DataType) -> DeviceArray:
        dtype = numpy_dtype(datatype)
        buffer = self.buffers[index]
        whole = buffer.shape[0] // dtype.itemsize * dtype.itemsize
        typed = buffer[:whole].view(dtype)
        self.typed[(index, datatype)] = typed
        return typed

    def strided(self, tensor: BoundTensor) -> DeviceArray:
        desc = tensor.desc
        dtype = numpy_dtype(desc.datatype)
        whole = desc.total_size // dtype.itemsize * dtype.itemsize
        base = self.buffers[tensor.buffer][tensor.offset : tensor.offset + whole].view(dtype)
        return self.xp.lib.stride_tricks.as_strided(
            base, shape=desc.shape, strides=desc.byte_strides
        )


def run_batch(
    plan: BatchPlan, body: bytearray, backend: Backend, sinks: Sequence[memoryview]
) -> None:
    """Run a planned batch (``batch.plan_batch``) over the request ``body``; copy each output
    buffer into its sink (in ``plan.outputs`` order). Blocking (it waits for the device)."""
    arrays = [_place(backend, body, b) for b in plan.buffers]
    views = _Views(backend.xp, arrays)
    for dispatch in plan.dispatches:
        inputs = [views.of(t) for t in dispatch.inputs]
        backend.run(dispatch.call, inputs, views.of(dispatch.output))
    for i, sink in zip(plan.outputs, sinks, strict=True):
        backend.to_host(arrays[i], np.frombuffer(sink, dtype=_UINT8))
