"""Tensors in shared-memory regions as stock tritonclient (HTTP or gRPC) names them, for any
region kind a test makes (system or CUDA): inputs and requested outputs at offsets."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from tritonclient.utils import np_to_triton_dtype

Arr = np.ndarray[Any, Any]


class Region(Protocol):
    @property
    def name(self) -> str: ...

    def put(self, array: Arr, offset: int = 0) -> None: ...


def region_input(module: Any, name: str, array: Arr, region: Region, offset: int = 0) -> Any:
    """``module``'s InferInput for ``array``, its bytes at ``offset`` of ``region``."""
    tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_shared_memory(region.name, array.nbytes, offset=offset)
    return tensor


def region_output(module: Any, name: str, region: Region, nbytes: int, offset: int = 0) -> Any:
    """``module``'s InferRequestedOutput for output ``name``, written to ``region`` at ``offset``."""
    output = module.InferRequestedOutput(name)
    output.set_shared_memory(region.name, nbytes, offset=offset)
    return output


def region_inputs(module: Any, arrays: dict[str, Arr], region: Region) -> list[Any]:
    """Every array of ``arrays`` put in ``region``, 64 bytes apart from the start, and the
    inputs naming them there."""
    tensors = []
    for index, (name, array) in enumerate(arrays.items()):
        region.put(array, offset=index * 64)
        tensors.append(region_input(module, name, array, region, offset=index * 64))
    return tensors
