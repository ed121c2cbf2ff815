"""Device memory that another process exported with CUDA IPC, opened with CuPy: what a CUDA
shared-memory region is on the CuPy backend (``shared_memory.DeviceMemory``).

A client allocates device memory (``cudaMalloc``), takes its ``cudaIpcMemHandle_t`` (64 opaque
bytes) and registers it; ``cudaIpcOpenMemHandle`` maps that allocation into this process, and
kernels then read and write it in place (``view``: a CuPy array over the client's memory, no
copy). What the client says is not trusted:

* The handle is opened by CUDA, which refuses bytes that name no exported allocation; its error
  becomes a 400 naming ``raw_handle``.
* The region's ``byte_size`` is checked against the size of the mapping as the *driver* reports
  it, so a region can never reach past the memory the client exported; every use is bounded by
  the region (shared_memory.py). A kernel reading outside it would fault the device context and
  with it every later request of this server.
* CUDA opens one handle once per context and counts further opens (the same device address
  comes back), so each registration opens it and each release closes it, once.

How the size is read (``SIZE_QUERIES``, tried in this order, the first answer that contains the
pointer wins; ``CupyDeviceMemory.size_query`` names the one that answered). The driver documents
its range queries for its own allocations; whether each answers for a mapping opened through IPC
shows only on a device (tests/gpu/test_cuda_shared_memory.py), so every one of them is here,
chosen by what the driver answers rather than by a setting:

1. ``cuMemGetAddressRange`` (CuPy does not wrap it: ctypes).
2. ``cuPointerGetAttribute`` with ``CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`` and
   ``CU_POINTER_ATTRIBUTE_RANGE_SIZE``.
3. The extent of the pointer's ``CU_POINTER_ATTRIBUTE_BUFFER_ID`` (an id unique to each
   allocation): the first byte past the pointer whose id differs, or that no allocation holds,
   found by a doubling search then a bisection (about 60 queries for 256 MiB).

The size found is that of the driver's mapping, which can exceed what the client asked
``cudaMalloc`` for (allocations are placed in pages of up to 2 MiB): a region may then reach
into the rest of that mapping, memory the client exported with it, never another process's nor
this one's.

CUDA says that a client that frees the memory while the server has it open (registered) makes
the behaviour undefined; the client must unregister first, as Triton's clients do.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Mapping
from typing import Any

from tensorbits.core.kernels import DeviceArray
from tensorbits.core.shared_memory import DeviceAllocation
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.v2 import CUDA_IPC_HANDLE_BYTES

logger = logging.getLogger("tensorbits.backend")

_DRIVER_LIBRARY = "libcuda.so.1"
_ERROR_CHARS = 200

# CUpointer_attribute (cuda.h).
BUFFER_ID = 7
RANGE_START_ADDR = 11
RANGE_SIZE = 12
_ATTRIBUTE_NAMES = {
    BUFFER_ID: "BUFFER_ID",
    RANGE_START_ADDR: "RANGE_START_ADDR",
    RANGE_SIZE: "RANGE_SIZE",
}

# The driver functions used, with their C signatures: set on the library's functions, so that a
# pointer is passed as 64 bits (ctypes' default for a Python int is a 32-bit C int).
SIGNATURES: dict[str, tuple[Any, ...]] = {
    # CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
    "cuMemGetAddressRange_v2": (
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_uint64,
    ),
    # CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr)
    "cuPointerGetAttribute": (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64),
}

# Where the search for the end of an allocation gives up: past any GPU's virtual address space
# (49 bits on the GPUs CUDA 13 supports), so reaching it means the driver answers nonsense.
SEARCH_LIMIT = 1 << 48


class DriverError(RuntimeError):
    """A driver call failed, or answered something that cannot be true."""


SizeQuery = Callable[[Any, int], tuple[int, int]]


def load_driver(library: str = _DRIVER_LIBRARY) -> ctypes.CDLL:
    """The CUDA driver library, its functions in ``SIGNATURES`` typed (a missing one is left
    out: the query that needs it fails, the others still answer)."""
    driver = ctypes.CDLL(library)
    bind(driver)
    return driver


def bind(driver: Any) -> None:
    """Set ``SIGNATURES`` on the functions ``driver`` has (a ``ctypes.CDLL`` or a stand-in)."""
    for name, argtypes in SIGNATURES.items():
        function = getattr(driver, name, None)
        if function is not None:
            function.argtypes = argtypes
            function.restype = ctypes.c_int  # CUresult


def _check(status: int, call: str) -> None:
    if status != 0:
        raise DriverError(f"{call} failed with CUresult {status}")


def address_range(driver: Any, pointer: int) -> tuple[int, int]:
    """Base and size of the allocation holding ``pointer``: ``cuMemGetAddressRange``."""
    base = ctypes.c_uint64()
    size = ctypes.c_size_t()
    status = driver.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), pointer)
    _check(status, "cuMemGetAddressRange")
    return base.value, size.value


def _attribute(driver: Any, attribute: int, pointer: int) -> int:
    value = ctypes.c_uint64()  # CUdeviceptr, size_t and unsigned long long alike on 64 bits
    status = driver.cuPointerGetAttribute(ctypes.byref(value), attribute, pointer)
    _check(status, f"cuPointerGetAttribute({_ATTRIBUTE_NAMES.get(attribute, attribute)})")
    return value.value


def range_attributes(driver: Any, pointer: int) -> tuple[int, int]:
    """Base and size of the allocation holding ``pointer``: its range attributes."""
    return _attribute(driver, RANGE_START_ADDR, pointer), _attribute(driver, RANGE_SIZE, pointer)


def buffer_extent(driver: Any, pointer: int) -> tuple[int, int]:
    """``pointer`` and the bytes from it that share its buffer id: an allocation is one range of
    addresses and its id is unique, so the bytes with the id form a run that a bisection finds."""
    first = _attribute(driver, BUFFER_ID, pointer)

    def inside(offset: int) -> bool:
        try:
            return _attribute(driver, BUFFER_ID, pointer + offset) == first
        except DriverError:  # no allocation there
            return False

    known_in, probe = 0, 1  # offset known to be inside; offset tried next
    while inside(probe):
        known_in, probe = probe, probe * 2
        if probe >= SEARCH_LIMIT:
            raise DriverError(f"buffer id {first} reaches past {SEARCH_LIMIT:#x} bytes")
    known_out = probe
    while known_out - known_in > 1:
        middle = (known_in + known_out) // 2
        if inside(middle):
            known_in = middle
        else:
            known_out = middle
    return pointer, known_out


SIZE_QUERIES: dict[str, SizeQuery] = {
    "cuMemGetAddressRange": address_range,
    "cuPointerGetAttribute range": range_attributes,
    "buffer id extent": buffer_extent,
}


def bytes_from(pointer: int, base: int, size: int) -> int:
    """Bytes from ``pointer`` to the end of the range [base, base + size), which must hold it."""
    if not base <= pointer < base + size:
        raise DriverError(f"the range {base:#x} + {size} does not hold {pointer:#x}")
    return base + size - pointer


class CupyDeviceMemory:
    """``shared_memory.DeviceMemory`` for the CuPy backend on ``device_id``. ``driver``: the
    CUDA driver library (``load_driver()`` unless given); ``size_queries``: how the size of an
    opened allocation is read, in order (``SIZE_QUERIES`` unless given)."""

    def __init__(
        self,
        cupy: Any,
        device_id: int,
        *,
        driver: Any = None,
        size_queries: Mapping[str, SizeQuery] | None = None,
    ) -> None:
        self._cupy = cupy
        self.device_id = device_id
        if driver is None:
            driver = load_driver()
        else:
            bind(driver)  # typed as the library's would be
        self.driver = driver  # public: the queries one by one
        self._size_queries = dict(SIZE_QUERIES if size_queries is None else size_queries)
        self._uint8 = cupy.dtype("uint8")
        self.size_query: str | None = None  # the query that answered the last open
        self._said_fallback = False

    def allocation_bytes(self, pointer: int) -> int:
        """Bytes from ``pointer`` to the end of the allocation holding it, by the first size
        query that answers; ``DriverError`` naming each failure when none does."""
        failures = []
        for name, query in self._size_queries.items():
            try:
                nbytes = bytes_from(pointer, *query(self.driver, pointer))
            except Exception as exc:  # DriverError, or a function this driver lacks
                failures.append(f"{name}: {exc}")
                continue
            if failures and not self._said_fallback:
                self._said_fallback = True
                logger.warning(
                    "CUDA shared memory: sizes are read with %s (%s)", name, "; ".join(failures)
                )
            self.size_query = name
            return nbytes
        raise DriverError("; ".join(failures))

    def sizes(self, pointer: int) -> dict[str, int | str]:
        """Every size query's answer for ``pointer`` (bytes from it to the end of its
        allocation) or why it failed: to see on a device which of them answers."""
        answers: dict[str, int | str] = {}
        with self._cupy.cuda.Device(self.device_id):
            for name, query in self._size_queries.items():
                try:
                    answers[name] = bytes_from(pointer, *query(self.driver, pointer))
                except Exception as exc:
                    answers[name] = f"{type(exc).__name__}: {exc}"
        return answers

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
                nbytes = self.allocation_bytes(pointer)
            except Exception as exc:
                runtime.ipcCloseMemHandle(pointer)
                raise InvalidRequest(
                    "raw_handle: the size of the device allocation it names cannot be found "
                    f"({str(exc)[: 2 * _ERROR_CHARS]}); it is not registered",
                    field="raw_handle",
                    rule="cuda_ipc_handle",
                ) from None
        return DeviceAllocation(pointer, nbytes)

    def view(self, pointer: int, nbytes: int) -> DeviceArray:
        cuda = self._cupy.cuda
        memory = cuda.UnownedMemory(pointer, nbytes, self, self.device_id)
        return self._cupy.ndarray((nbytes,), self._uint8, cuda.MemoryPointer(memory, 0))

    def close(self, allocation: DeviceAllocation) -> None:
        with self._cupy.cuda.Device(self.device_id):
            self._cupy.cuda.runtime.ipcCloseMemHandle(allocation.pointer)


__all__ = [
    "SIZE_QUERIES",
    "CupyDeviceMemory",
    "DriverError",
    "address_range",
    "buffer_extent",
    "bytes_from",
    "load_driver",
    "range_attributes",
]
