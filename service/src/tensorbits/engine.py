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


def compute(
    backend: Backend,
    model: str,
    arrays: Mapping[str, np.ndarray[Any, Any]],
    parameters: Mapping[str, object] | None = None,
    out: np.ndarray[Any, Any] | None = None,
) -> np.ndarray[Any, Any]:
    """Validate and run one operator on host arrays; the result comes back in host memory."""
    call = validate_arrays(model, arrays, parameters)
    device_inputs = [backend.asarray(np.ascontiguousarray(arrays[n])) for n in call.op.inputs]
    result = run_call(backend, call, device_inputs, None if backend.name != "numpy" else out)
    host = backend.to_host(result, out if backend.name != "numpy" else None)
    return host
