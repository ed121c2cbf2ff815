"""From host arrays to a result: validate against the rule tables, allocate, run.

The HTTP layers build their inputs from request bodies and call ``compute``; tests and the CLI
call it directly. Validation happens before any allocation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensorbits.backends.base import Backend
from tensorbits.kernels import Array
from tensorbits_protocol.dtypes import from_numpy, numpy_dtype
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call


def spec_of(array: np.ndarray[Any, Any]) -> TensorSpec:
    return TensorSpec(datatype=from_numpy(array.dtype), shape=tuple(array.shape))


def validate_arrays(
    model: str, arrays: Mapping[str, np.ndarray[Any, Any]], parameters: Mapping[str, object] | None
) -> ResolvedCall:
    op = get_operator(model)
    return validate_call(op, {name: spec_of(a) for name, a in arrays.items()}, parameters)


def run_call(
    backend: Backend, call: ResolvedCall, inputs: Sequence[Array], out: Array | None = None
) -> Array:
    """Run a validated call on backend arrays (ordered as the operator's inputs)."""
    if out is None:
        out = backend.empty(call.output_shape, numpy_dtype(call.output_datatype))
    backend.run(call, inputs, out)
    return out


def run_into_host(
    backend: Backend,
    call: ResolvedCall,
    inputs: Sequence[np.ndarray[Any, Any]],
    out: np.ndarray[Any, Any],
) -> None:
    """Run ``call`` on host arrays with the result landing in the host array ``out``: written
    there directly by a host backend, copied back from the device otherwise."""
    if backend.host_memory:
        run_call(backend, call, inputs, out)
        return
    device_inputs = [backend.asarray(np.ascontiguousarray(x)) for x in inputs]
    backend.to_host(run_call(backend, call, device_inputs), out)


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
    run_into_host(backend, call, [np.ascontiguousarray(arrays[n]) for n in call.op.inputs], out)
    return out
