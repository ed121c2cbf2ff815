"""A device backend on the host that counts every byte crossing between "host" and "device", so
the paths that must keep data on the device (a graph on CUDA regions, placement) are proved to
on every machine, not only on a GPU.

- ``StandInArray`` is a device array as CuPy's ``ndarray`` is used: not a NumPy array (the test
  ``engine.run_into`` and ``graphs.run.on_device`` make), no implicit conversion to one
  (``np.asarray`` of it raises ``TypeError``, as CuPy's does), no ``writeable`` flag; its bytes
  come to the host only through ``get`` (counted ``to_host``), host bytes go into it only
  through ``__setitem__`` of a NumPy array (counted ``to_device``), and a copy from another
  device array is counted ``on_device``.
- ``StandInDevice`` is the backend (``host_memory`` False): ``asarray`` and ``to_host`` are the
  counted transfers; kernels run as NumPy's on the arrays' memory. Its fused graph kernels are
  the CuPy backend's own (``cupy_graphs.GraphKernels``), the generated CUDA C++ compiled for the
  host with the shim of support/wide_kernel_cases.py and called with the arrays' addresses,
  each launch's pointers recorded: a graph on CUDA regions shows the kernel given the client's
  memory itself. Without a C++ compiler it offers no fused kernel (node by node, still on the
  "device").
- ``StandInDeviceMemory`` is support/device_stand_in.py's CUDA IPC with views that are
  ``StandInArray``s sharing the backend's counts: a CUDA region's bytes are device memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from support.device_stand_in import HostDeviceMemory
from support.wide_kernel_cases import HOST_SHIM, compile_host_library, host_runner
from tensorbits.core.backends.cupy_backend import POPCOUNT_BODY, SHIFT_BODY
from tensorbits.core.backends.cupy_graphs import FusedChain, GraphKernels
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.shared_memory import DeviceMemory
from tensorbits_protocol.validation import ResolvedCall

Arr = np.ndarray[Any, Any]


@dataclass
class Transfers:
    """What crossed, in calls and bytes: host to device, device to host, device to device."""

    to_device: int = 0
    to_host: int = 0
    on_device: int = 0
    bytes_to_device: int = 0
    bytes_to_host: int = 0
    launches: list[tuple[int, ...]] = field(default_factory=list)  # fused kernels' pointers

    @property
    def host_crossings(self) -> int:
        return self.to_device + self.to_host

    def reset(self) -> None:
        self.to_device = self.to_host = self.on_device = 0
        self.bytes_to_device = self.bytes_to_host = 0
        self.launches.clear()


class StandInArray:
    """A device array over host memory (``memory``), used as a CuPy array is."""

    __slots__ = ("counts", "memory")

    def __init__(self, memory: Arr, counts: Transfers) -> None:
        self.memory = memory
        self.counts = counts

    def _wrap(self, memory: Arr) -> StandInArray:
        return StandInArray(memory, self.counts)

    @property
    def dtype(self) -> np.dtype[Any]:
        dtype: np.dtype[Any] = self.memory.dtype
        return dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.memory.shape)

    @property
    def size(self) -> int:
        return int(self.memory.size)

    @property
    def nbytes(self) -> int:
        return int(self.memory.nbytes)

    @property
    def ndim(self) -> int:
        return int(self.memory.ndim)

    @property
    def flags(self) -> SimpleNamespace:
        # CuPy's flags: no ``writeable``, so code asking it of a device array fails here too.
        flags = self.memory.flags
        return SimpleNamespace(
            c_contiguous=flags.c_contiguous, f_contiguous=flags.f_contiguous, owndata=False
        )

    @property
    def data(self) -> SimpleNamespace:
        return SimpleNamespace(ptr=int(self.memory.ctypes.data))

    @property
    def device(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def view(self, dtype: Any) -> StandInArray:
        return self._wrap(self.memory.view(dtype))

    def reshape(self, *shape: Any) -> StandInArray:
        return self._wrap(self.memory.reshape(*shape))

    def __getitem__(self, key: Any) -> StandInArray:
        return self._wrap(self.memory[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, StandInArray):
            self.counts.on_device += 1
            self.memory[key] = value.memory
        elif isinstance(value, np.ndarray):
            self.counts.to_device += 1
            self.counts.bytes_to_device += value.nbytes
            self.memory[key] = value
        else:  # a scalar: a fill on the device
            self.memory[key] = value

    def fill(self, value: Any) -> None:
        self.memory.fill(value)

    def get(self, out: Arr | None = None) -> Arr:
        self.counts.to_host += 1
        self.counts.bytes_to_host += self.nbytes
        if out is None:
            return self.memory.copy()
        np.copyto(out, self.memory)
        return out

    def __array__(self, *args: Any, **kwargs: Any) -> Arr:
        raise TypeError("Implicit conversion to a NumPy array is not allowed (device array)")


def memory_of(array: Any) -> Any:
    """The memory under a stand-in device array; anything else as it is (a host array given
    where a device one belongs stays one, and the kernels below refuse it)."""
    return array.memory if isinstance(array, StandInArray) else array


class _HostRawKernel:
    """``cupy.RawKernel`` for a fused graph kernel: its source compiled for the host (once per
    kernel name, in ``folder``), launched thread by thread over the grid asked for."""

    def __init__(self, source: str, name: str, folder: Path, counts: Transfers) -> None:
        compiler = shutil.which("g++") or shutil.which("clang++")
        assert compiler is not None  # offered only where a compiler is found
        parameters = source.count("void* p")  # the sources' and the outputs' pointers
        arguments = ", ".join(f"p[{i}]" for i in range(parameters))
        runner = host_runner(
            "void* const* p, unsigned long long n", f"{name}({arguments}, n)"
        ).replace("NAME", name)
        self._library = compile_host_library(compiler, folder, name, [HOST_SHIM, source, runner])
        self._function = getattr(self._library, f"run_{name}")
        self._function.restype = None
        self._counts = counts

    def __call__(self, grid: tuple[int], block: tuple[int], arguments: Sequence[Any]) -> None:
        *arrays, elements = arguments
        for array in arrays:
            # A kernel reads and writes device memory only: a host array here is a bug.
            assert isinstance(array, StandInArray), f"a host array given to a kernel: {array!r}"
        pointers = tuple(array.data.ptr for array in arrays)
        self._counts.launches.append(pointers)
        self._function(
            (ctypes.c_void_p * len(pointers))(*pointers),
            ctypes.c_ulonglong(int(elements)),
            ctypes.c_uint(grid[0]),
            ctypes.c_uint(block[0]),
        )


class StandInDevice:
    """A device backend (``host_memory`` False) whose "device" is host memory and whose every
    host<->device transfer is counted (``counts``); see the module's docstring."""

    name = "device-stand-in"
    host_memory = False
    device = "stand-in device"

    def __init__(self, fused: bool = True) -> None:
        self.counts = Transfers()
        self.numpy = NumpyBackend(1)
        self.device_memory: DeviceMemory | None = StandInDeviceMemory(self.counts)
        self.xp = SimpleNamespace(
            lib=SimpleNamespace(stride_tricks=SimpleNamespace(as_strided=self._as_strided))
        )
        self._folder = Path(tempfile.mkdtemp(prefix="standin_kernels_"))
        has_compiler = shutil.which("g++") or shutil.which("clang++")
        cupy = SimpleNamespace(RawKernel=self._raw_kernel)
        self.graphs = (
            GraphKernels(cupy, SHIFT_BODY, POPCOUNT_BODY) if fused and has_compiler else None
        )

    def _raw_kernel(self, source: str, name: str) -> _HostRawKernel:
        return _HostRawKernel(source, name, self._folder, self.counts)

    def _as_strided(self, base: StandInArray, shape: Any, strides: Any) -> StandInArray:
        return StandInArray(
            np.lib.stride_tricks.as_strided(base.memory, shape=shape, strides=strides),
            self.counts,
        )

    def asarray(self, host: Arr) -> StandInArray:
        self.counts.to_device += 1
        self.counts.bytes_to_device += host.nbytes
        return StandInArray(np.array(host, copy=True), self.counts)

    def to_host(self, array: Any, out: Arr | None = None) -> Arr:
        assert isinstance(array, StandInArray), "to_host of an array not on the device"
        return array.get(out)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> StandInArray:
        return StandInArray(np.empty(shape, dtype), self.counts)

    def run(self, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        for array in (*inputs, out):
            assert isinstance(array, StandInArray), "a host array given to a device kernel"
        self.numpy.run(call, [memory_of(x) for x in inputs], memory_of(out))

    def run_fused(self, plan: FusedChain, values: dict[int, Any], into: Any = None) -> bool:
        return self.graphs is not None and self.graphs.run(plan, values, self.empty, into)

    def synchronize(self) -> None:
        """Nothing to wait for: every "kernel" ran on the calling thread."""

    def memory_in_use(self) -> int | None:
        return None

    def close(self) -> None:
        self.numpy.close()
        shutil.rmtree(self._folder, ignore_errors=True)


class StandInDeviceMemory(HostDeviceMemory):
    """support/device_stand_in.py's CUDA IPC, its views device arrays counted with ``counts``."""

    def __init__(self, counts: Transfers, device_id: int = 0) -> None:
        super().__init__(device_id)
        self.counts = counts

    def view(self, pointer: int, nbytes: int) -> Any:
        return StandInArray(super().view(pointer, nbytes), self.counts)


__all__ = ["StandInArray", "StandInDevice", "StandInDeviceMemory", "Transfers", "memory_of"]
