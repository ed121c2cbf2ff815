"""Device memory that another process exported with CUDA IPC, opened with CuPy: what a CUDA
shared-memory region is on the CuPy backend (``shared_memory.DeviceMemory``).

A client allocates device memory (``cudaMalloc``), takes its ``cudaIpcMemHandle_t`` (64 opaque
bytes) and registers it; ``cudaIpcOpenMemHandle`` maps that allocation into this process, and
kernels then read and write it in place (``view``: a CuPy array over the client's memory, no
copy). What the client says is not trusted:

* The handle is opened by CUDA, which refuses bytes that name no exported allocation; its error
  becomes a 400 naming ``raw_handle``.
* The region's ``byte_size`` is checked against the size of the allocation as the *driver*
  reports it (``cuMemGetAddressRange``, called through ctypes: CuPy does not wrap it), so a
  region can never reach past the memory the client exported; every use is bounded by the region
  (shared_memory.py). A kernel reading outside it would fault the device context and with it
  every later request of this server.
* CUDA opens one handle once per context and counts further opens (the same device address
  comes back), so each registration opens it and each release closes it, once.

CUDA says that a client that frees the memory while the server has it open (registered) makes
the behaviour undefined; the client must unregister first, as Triton's clients do.
"""

from __future__ import annotations

import ctypes
from typing import Any

from tensorbits.kernels import DeviceArray
from tensorbits.shared_memory import DeviceAllocation
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.v2 import CUDA_IPC_HANDLE_BYTES

_DRIVER_LIBRARY = "libcuda.so.1"
_ERROR_CHARS = 200


def _address_range(driver: ctypes.CDLL, pointer: int) -> tuple[int, int]:
    """The base address and size of the allocation that contains ``pointer`` (the current
    context's), as ``cuMemGetAddressRange`` reports them."""
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    status = driver.cuMemGetAddressRange_v2(
        ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer)
    )
    if status != 0:
        raise RuntimeError(f"cuMemGetAddressRange failed with CUresult {status}")
    return base.value, size.value


class CupyDeviceMemory:
    """``shared_memory.DeviceMemory`` for the CuPy backend on ``device_id``."""

    def __init__(self, cupy: Any, device_id: int) -> None:
        self._cupy = cupy
        self.device_id = device_id
        self._driver = ctypes.CDLL(_DRIVER_LIBRARY)
        self._uint8 = cupy.dtype("uint8")

    def open(self, raw_handle: bytes) -> DeviceAllocation:
        if len(raw_handle) != CUDA_IPC_HANDLE_BYTES:  # CuPy checks too; say it in our words
            raise InvalidRequest(
                f"raw_handle has {len(raw_handle)} bytes, not {CUDA_IPC_HANDLE_BYTES}",
                field="raw_handle",
                rule="cuda_ipc_handle",
            )
        runtime = self._cupy.cuda.runtime
        with self._cupy.cuda.Device(self.device_id):
            try:
                pointer = int(runtime.ipcOpenMemHandle(raw_handle))
            except Exception as exc:  # CUDARuntimeError: the bytes name no exported memory
                raise InvalidRequest(
                    f"raw_handle: CUDA cannot open this IPC handle on device {self.device_id}: "
                    f"{str(exc)[:_ERROR_CHARS]}",
                    field="raw_handle",
                    rule="cuda_ipc_handle",
                ) from None
            try:
                base, size = _address_range(self._driver, pointer)
            except Exception as exc:
                runtime.ipcCloseMemHandle(pointer)
                raise InvalidRequest(
                    "raw_handle: the size of the device allocation it names cannot be found "
                    f"({str(exc)[:_ERROR_CHARS]}); it is not registered",
                    field="raw_handle",
                    rule="cuda_ipc_handle",
                ) from None
        return DeviceAllocation(pointer, base + size - pointer)

    def view(self, pointer: int, nbytes: int) -> DeviceArray:
        cuda = self._cupy.cuda
        memory = cuda.UnownedMemory(pointer, nbytes, self, self.device_id)
        return self._cupy.ndarray((nbytes,), self._uint8, cuda.MemoryPointer(memory, 0))

    def close(self, allocation: DeviceAllocation) -> None:
        with self._cupy.cuda.Device(self.device_id):
            self._cupy.cuda.runtime.ipcCloseMemHandle(allocation.pointer)


__all__ = ["CupyDeviceMemory"]
