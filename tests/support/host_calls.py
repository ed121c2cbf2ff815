"""One operator validated and run on host arrays in one step, as tests and benchmarks call the
core in process: the service itself validates descriptors (the request's datatypes and shapes,
never arrays) and runs through ``core.engine.run_into``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.engine import run_call, run_into
from tensorbits_protocol.dtypes import from_numpy, numpy_dtype
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

__all__ = ["compute", "on_numpy", "spec_of", "validate_arrays"]


def spec_of(array: np.ndarray[Any, Any]) -> TensorSpec:
    """The descriptor a request would send for ``array``: its datatype and shape."""
    return TensorSpec(datatype=from_numpy(array.dtype), shape=tuple(array.shape))


def validate_arrays(
    model: str, arrays: Mapping[str, np.ndarray[Any, Any]], parameters: Mapping[str, object] | None
) -> ResolvedCall:
    """The call ``model`` resolves to for the inputs ``arrays`` (named as the operator's)."""
    op = get_operator(model)
    return validate_call(op, {name: spec_of(a) for name, a in arrays.items()}, parameters)


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


def on_numpy(call: ResolvedCall, inputs: Sequence[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    """``call``'s answer on the NumPy backend: the reference a device's answer is held to."""
    backend = NumpyBackend(1)
    try:
        out: np.ndarray[Any, Any] = run_call(backend, call, inputs)
        return out
    finally:
        backend.close()
