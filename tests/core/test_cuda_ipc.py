"""The CuPy backend's CUDA IPC code (tensorbits.core.cuda_ipc) on every machine: CuPy and the driver
stood in for (support/cuda_stand_in.py), the code itself real, ctypes signatures included.

Each way of reading an allocation's size finds it exactly; a driver that refuses one (as it may
for memory opened through IPC, which it documents its range queries only for its own
allocations) makes the next one answer, said once in the log; a driver that refuses all of them,
or answers a range that cannot be the pointer's, gets the registration refused and the handle
closed; every runtime call runs under the backend's device."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator

import numpy as np
import pytest
from support.cuda_stand_in import ADDRESS_RANGE, BUFFER_EXTENT, RANGE_ATTRIBUTES, CudaStandIn

from tensorbits.core.cuda_ipc import (
    SIGNATURES,
    SIZE_QUERIES,
    CupyDeviceMemory,
    DriverError,
    address_range,
    buffer_extent,
    bytes_from,
    load_driver,
    range_attributes,
)
from tensorbits_protocol.errors import InvalidRequest

SIZES = [1, 63, 64, 4096, 65_537, 2 << 20]


@pytest.fixture
def cuda() -> Iterator[CudaStandIn]:
    made = CudaStandIn()
    yield made
    assert not made.mappings  # every handle opened was closed
    made.host.close_exports()


def opened(cuda: CudaStandIn, nbytes: int) -> int:
    """A new allocation of ``nbytes``, opened in this "process": its pointer."""
    handle, _ = cuda.host.export(nbytes)
    with cuda.cupy.cuda.Device(cuda.device_id):
        pointer: int = cuda.cupy.cuda.runtime.ipcOpenMemHandle(handle)
    return pointer


def close(cuda: CudaStandIn, pointer: int) -> None:
    with cuda.cupy.cuda.Device(cuda.device_id):
        cuda.cupy.cuda.runtime.ipcCloseMemHandle(pointer)


@pytest.mark.parametrize("nbytes", SIZES)
def test_every_query_finds_the_allocation(cuda: CudaStandIn, nbytes: int) -> None:
    pointer = opened(cuda, nbytes)
    try:
        assert pointer > 1 << 32  # a 64-bit address survives the calls whole
        assert address_range(cuda.driver, pointer) == (pointer, nbytes)
        assert range_attributes(cuda.driver, pointer) == (pointer, nbytes)
        assert buffer_extent(cuda.driver, pointer) == (pointer, nbytes)
        # From a pointer inside it: the same allocation, fewer bytes to its end.
        inner = pointer + nbytes // 2
        assert bytes_from(inner, *address_range(cuda.driver, inner)) == nbytes - nbytes // 2
        assert bytes_from(inner, *buffer_extent(cuda.driver, inner)) == nbytes - nbytes // 2
    finally:
        close(cuda, pointer)


def test_the_extent_search_takes_few_driver_calls(cuda: CudaStandIn) -> None:
    pointer = opened(cuda, 256 << 20)
    try:
        before = cuda.size_calls
        assert buffer_extent(cuda.driver, pointer) == (pointer, 256 << 20)
        assert cuda.size_calls - before <= 2 * 29 + 2  # doubling, then bisection
    finally:
        close(cuda, pointer)


def test_the_extent_stops_at_a_neighbouring_allocation(cuda: CudaStandIn) -> None:
    """The byte past the allocation may belong to another one (another buffer id)."""
    pointer = opened(cuda, 4096)
    other = opened(cuda, 4096)
    try:
        assert buffer_extent(cuda.driver, pointer) == (pointer, 4096)
        assert buffer_extent(cuda.driver, other) == (other, 4096)
    finally:
        close(cuda, pointer)
        close(cuda, other)


def test_queries_fail_loudly_outside_any_allocation(cuda: CudaStandIn) -> None:
    for query in SIZE_QUERIES.values():
        with pytest.raises(DriverError, match="CUresult 1"):
            query(cuda.driver, 4096)


def test_a_range_that_does_not_hold_the_pointer_is_no_answer() -> None:
    assert bytes_from(100, 100, 1) == 1
    for base, size in ((101, 10), (0, 100), (100, 0)):
        with pytest.raises(DriverError):
            bytes_from(100, base, size)


def test_the_driver_functions_get_their_c_signatures() -> None:
    """Without argtypes ctypes passes a Python int as a 32-bit C int: a device pointer would be
    cut. ``bind`` (what ``load_driver`` and ``CupyDeviceMemory`` do) sets each signature."""
    cuda = CudaStandIn()
    driver = cuda.driver
    for name in SIGNATURES:
        getattr(driver, name).argtypes = None
    CupyDeviceMemory(cuda.cupy, 0, driver=driver)
    for name, argtypes in SIGNATURES.items():
        assert tuple(getattr(driver, name).argtypes) == argtypes
        assert getattr(driver, name).restype is ctypes.c_int


def test_no_driver_library_is_an_os_error() -> None:
    """The CuPy backend turns CUDA shared memory off (with a warning) on OSError only."""
    with pytest.raises(OSError, match="libcuda-that-is-not-there"):
        load_driver("libcuda-that-is-not-there.so.1")


@pytest.mark.parametrize(
    ("refused", "answers"),
    [
        pytest.param((), ADDRESS_RANGE, id="none-refused"),
        pytest.param((ADDRESS_RANGE,), RANGE_ATTRIBUTES, id="address-range-refused"),
        pytest.param((ADDRESS_RANGE, RANGE_ATTRIBUTES), BUFFER_EXTENT, id="only-buffer-id"),
        pytest.param((RANGE_ATTRIBUTES, BUFFER_EXTENT), ADDRESS_RANGE, id="only-address-range"),
    ],
)
def test_open_reads_the_size_with_the_first_query_that_answers(
    refused: tuple[str, ...], answers: str, caplog: pytest.LogCaptureFixture
) -> None:
    cuda = CudaStandIn(refuse=refused)
    memory = CupyDeviceMemory(cuda.cupy, 0, driver=cuda.driver)
    handles = [cuda.host.export(nbytes) for nbytes in (64, 4096)]
    try:
        with caplog.at_level(logging.WARNING, logger="tensorbits.backend"):
            for (handle, client), nbytes in zip(handles, (64, 4096), strict=True):
                allocation = memory.open(handle)
                assert allocation.nbytes == nbytes
                assert memory.size_query == answers
                sizes = memory.sizes(allocation.pointer)
                assert sizes[answers] == nbytes
                assert all(isinstance(sizes[name], str) for name in refused)
                # The view is the client's memory: a write through it is what the client sees.
                view = memory.view(allocation.pointer, nbytes)
                client[:] = np.arange(nbytes, dtype=np.uint8)
                np.invert(view, out=view)
                assert np.array_equal(client, ~np.arange(nbytes, dtype=np.uint8))
                del view
                memory.close(allocation)
        fallbacks = [r for r in caplog.records if "sizes are read with" in r.getMessage()]
        assert len(fallbacks) == (1 if refused and answers != ADDRESS_RANGE else 0)
        if fallbacks:
            assert answers in fallbacks[0].getMessage()
    finally:
        cuda.host.close_exports()
    assert not cuda.mappings


def test_no_size_at_all_refuses_the_registration_and_closes_the_handle() -> None:
    cuda = CudaStandIn(refuse=(ADDRESS_RANGE, RANGE_ATTRIBUTES, BUFFER_EXTENT))
    memory = CupyDeviceMemory(cuda.cupy, 0, driver=cuda.driver)
    handle, _ = cuda.host.export(64)
    try:
        with pytest.raises(InvalidRequest) as refused:
            memory.open(handle)
        assert (refused.value.field, refused.value.rule) == ("raw_handle", "cuda_ipc_handle")
        for name in SIZE_QUERIES:
            assert name in str(refused.value)
        assert not cuda.mappings
        assert cuda.host.open_now == 0
    finally:
        cuda.host.close_exports()


def test_a_handle_cuda_cannot_open_is_refused() -> None:
    cuda = CudaStandIn()
    memory = CupyDeviceMemory(cuda.cupy, 0, driver=cuda.driver)
    for raw in (b"\0" * 64, b"/standin_cuda_nothing".ljust(64, b"\0")):
        with pytest.raises(InvalidRequest, match="cannot open this IPC handle"):
            memory.open(raw)
    with pytest.raises(InvalidRequest, match="63 bytes"):
        memory.open(b"x" * 63)


def test_every_runtime_call_runs_under_the_backends_device() -> None:
    """On device 1 the stand-in refuses any runtime call made outside device 1's context (a
    server thread's current device is 0 unless told)."""
    cuda = CudaStandIn(device_id=1)
    memory = CupyDeviceMemory(cuda.cupy, 1, driver=cuda.driver)
    handle, _ = cuda.host.export(4096)
    try:
        allocation = memory.open(handle)
        assert memory.sizes(allocation.pointer)[ADDRESS_RANGE] == 4096
        memory.close(allocation)
        with pytest.raises(AssertionError, match="outside device 1"):
            cuda.cupy.cuda.runtime.ipcOpenMemHandle(handle)
    finally:
        cuda.host.close_exports()
