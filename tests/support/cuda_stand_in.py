"""What ``tensorbits.core.cuda_ipc.CupyDeviceMemory`` calls, on the host: the parts of CuPy it uses
(``cuda.runtime.ipcOpenMemHandle``/``ipcCloseMemHandle``, ``cuda.Device``, ``UnownedMemory``,
``MemoryPointer``, ``ndarray``, ``dtype``) over the POSIX shared-memory "device memory" of
support/device_stand_in.py, and the CUDA driver's two size functions as C function pointers.

So the server's CUDA IPC code itself (the size queries through ctypes with their C signatures,
their order and fallbacks, open/view/close) runs on every machine; only CUDA is stood in for.
The driver answers from the mappings open now, each one allocation with its own buffer id, and
``refuse`` makes chosen queries fail as a driver that does not answer them for IPC mappings
would (``CUDA_ERROR_INVALID_VALUE``), so each fallback can be taken on purpose."""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from support.device_stand_in import HostDeviceMemory
from tensorbits.core.cuda_ipc import BUFFER_ID, RANGE_SIZE, RANGE_START_ADDR, SIGNATURES
from tensorbits.core.shared_memory import DeviceAllocation

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
# The names CupyDeviceMemory gives its queries (cuda_ipc.SIZE_QUERIES), each refusable.
ADDRESS_RANGE = "cuMemGetAddressRange"
RANGE_ATTRIBUTES = "cuPointerGetAttribute range"
BUFFER_EXTENT = "buffer id extent"
_numbers = itertools.count(1)
# cuPointerGetAttribute's attributes answered: the query that uses each, the Mapping field.
_ATTRIBUTES = {
    RANGE_START_ADDR: (RANGE_ATTRIBUTES, "base"),
    RANGE_SIZE: (RANGE_ATTRIBUTES, "size"),
    BUFFER_ID: (BUFFER_EXTENT, "buffer_id"),
}


@dataclass(frozen=True)
class Mapping:
    base: int
    size: int
    buffer_id: int


class CudaStandIn:
    """One process's "CUDA": the mappings it opened, CuPy's API over them (``cupy``) and the
    driver's (``driver``)."""

    def __init__(self, device_id: int = 0, refuse: Collection[str] = ()) -> None:
        self.device_id = device_id
        self.refuse = frozenset(refuse)
        self.host = HostDeviceMemory(device_id)
        self.mappings: dict[int, Mapping] = {}
        self._lock = threading.Lock()  # the server opens and closes from many threads
        self._threads = threading.local()  # CUDA's current device is per thread
        self.size_calls = 0  # driver calls answered or refused
        self.cupy = self._cupy()
        self.driver = self._driver()

    @property
    def device_stack(self) -> list[int]:
        """The devices this thread entered, innermost last."""
        stack: list[int] | None = getattr(self._threads, "stack", None)
        if stack is None:
            stack = self._threads.stack = []
        return stack

    # --- CuPy ----------------------------------------------------------------------------------

    def _cupy(self) -> Any:
        stand_in = self

        @contextlib.contextmanager
        def device(device_id: int) -> Iterator[None]:
            stand_in.device_stack.append(device_id)
            try:
                yield
            finally:
                stand_in.device_stack.pop()

        def open_handle(raw_handle: bytes) -> int:
            if not isinstance(raw_handle, bytes) or len(raw_handle) != 64:
                raise TypeError("a cudaIpcMemHandle_t is 64 bytes")  # CuPy's own check
            stand_in._require_device()
            allocation = stand_in.host.open(raw_handle)
            with stand_in._lock:
                stand_in.mappings[allocation.pointer] = Mapping(
                    allocation.pointer, allocation.nbytes, next(_numbers)
                )
            return allocation.pointer

        def close_handle(pointer: int) -> None:
            stand_in._require_device()
            with stand_in._lock:
                mapping = stand_in.mappings.pop(pointer)
            stand_in.host.close(DeviceAllocation(pointer, mapping.size))

        def ndarray(shape: tuple[int, ...], dtype: Any, memptr: Any) -> Any:
            (nbytes,) = shape
            return stand_in.host.view(memptr.mem.ptr + memptr.offset, nbytes).view(dtype)

        runtime = SimpleNamespace(ipcOpenMemHandle=open_handle, ipcCloseMemHandle=close_handle)
        cuda = SimpleNamespace(
            runtime=runtime,
            Device=device,
            UnownedMemory=lambda ptr, size, owner, device_id: SimpleNamespace(
                ptr=ptr, size=size, owner=owner, device_id=device_id
            ),
            MemoryPointer=lambda mem, offset: SimpleNamespace(mem=mem, offset=offset),
        )
        return SimpleNamespace(cuda=cuda, ndarray=ndarray, dtype=np.dtype)

    def _require_device(self) -> None:
        # CUDA's runtime works on the thread's current device: CupyDeviceMemory must enter its
        # own before each call, or on a server of device 1 it would open on device 0.
        if not self.device_stack or self.device_stack[-1] != self.device_id:
            raise AssertionError(f"called outside device {self.device_id}'s context")

    # --- the driver ----------------------------------------------------------------------------

    def holding(self, address: int) -> Mapping | None:
        with self._lock:
            mappings = list(self.mappings.values())
        for mapping in mappings:
            if mapping.base <= address < mapping.base + mapping.size:
                return mapping
        return None

    def _driver(self) -> Any:
        stand_in = self

        def address_range(base: Any, size: Any, pointer: int) -> int:
            stand_in.size_calls += 1
            mapping = stand_in.holding(pointer)
            if ADDRESS_RANGE in stand_in.refuse or mapping is None:
                return CUDA_ERROR_INVALID_VALUE
            base[0], size[0] = mapping.base, mapping.size
            return CUDA_SUCCESS

        def attribute(data: int, which: int, pointer: int) -> int:
            stand_in.size_calls += 1
            mapping = stand_in.holding(pointer)
            if mapping is None or which not in _ATTRIBUTES:
                return CUDA_ERROR_INVALID_VALUE
            query, field = _ATTRIBUTES[which]
            if query in stand_in.refuse:
                return CUDA_ERROR_INVALID_VALUE
            ctypes.c_uint64.from_address(data).value = getattr(mapping, field)
            return CUDA_SUCCESS

        implementations = {
            "cuMemGetAddressRange_v2": address_range,
            "cuPointerGetAttribute": attribute,
        }
        functions = {
            name: ctypes.CFUNCTYPE(ctypes.c_int, *SIGNATURES[name])(implementation)
            for name, implementation in implementations.items()
        }
        return SimpleNamespace(**functions)


__all__ = ["ADDRESS_RANGE", "BUFFER_EXTENT", "RANGE_ATTRIBUTES", "CudaStandIn", "Mapping"]
