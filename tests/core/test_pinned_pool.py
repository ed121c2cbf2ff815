"""The CuPy backend's bounded pinned pool (backends/pinned_pool.py) on the host: CuPy's pinned
allocation and its staging in ``cupy.asarray`` stood in for (support/pinned_stand_in.py), the
pool itself real. The bound holds for what is lent and kept together, a copy that does not fit
falls back to pageable memory and still lands, and every byte lent comes back."""

from __future__ import annotations

import contextlib
import gc
import logging
import warnings
from collections.abc import Iterator

import numpy as np
import pytest
from support.pinned_stand_in import HOST_ALLOC_PORTABLE, PerformanceWarning, PinnedStandIn
from support.stream_stand_in import stand_in_streams

from tensorbits.core.backends import pinned_pool
from tensorbits.core.backends.pinned_pool import PAGE, PinnedPool, install

KiB = 1024


@pytest.fixture
def cuda() -> Iterator[PinnedStandIn]:
    stand_in = PinnedStandIn()
    yield stand_in
    gc.collect()


def _pool(cuda: PinnedStandIn, limit: int) -> PinnedPool:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # install's filter must be what hides CuPy's warning
        pool = install(cuda.cupy, limit)
    assert cuda.allocator == pool.malloc
    return pool


def _array(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def test_copies_go_through_pinned_buffers_and_land(cuda: PinnedStandIn) -> None:
    pool = _pool(cuda, 1024 * KiB)
    hosts = [_array(100 * KiB, seed) for seed in range(3)]
    devices = [cuda.asarray(host) for host in hosts]
    # Three copies pending at once: three buffers lent, none shared before its copy ran.
    assert cuda.pinned_copies == 3
    assert cuda.pageable_copies == 0
    assert pool.lent == 3 * _pages(100 * KiB) == pool.held == cuda.pinned
    assert cuda.flags == {HOST_ALLOC_PORTABLE}
    cuda.synchronize()
    for host, device in zip(hosts, devices, strict=True):
        np.testing.assert_array_equal(device, host)


def _pages(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


def test_the_bound_holds_and_a_copy_past_it_falls_back_to_pageable(cuda: PinnedStandIn) -> None:
    limit = 256 * KiB
    pool = _pool(cuda, limit)
    hosts = [_array(100 * KiB, seed) for seed in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        warnings.filterwarnings("ignore", message=pinned_pool.CUPY_FALLBACK_WARNING)
        devices = [cuda.asarray(host) for host in hosts]
    # Two fit (2 x 100 KiB in pages); the third and fourth would pass 256 KiB: pageable.
    assert (cuda.pinned_copies, cuda.pageable_copies) == (2, 2)
    assert pool.fallbacks == 2
    assert pool.held <= limit
    assert cuda.pinned <= limit
    cuda.synchronize()
    for host, device in zip(hosts, devices, strict=True):
        np.testing.assert_array_equal(device, host)


def test_a_copy_larger_than_the_pool_falls_back_at_once(cuda: PinnedStandIn) -> None:
    pool = _pool(cuda, 64 * KiB)
    host = _array(1024 * KiB, 7)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=pinned_pool.CUPY_FALLBACK_WARNING)
        device = cuda.asarray(host)
    np.testing.assert_array_equal(device, host)
    assert cuda.allocations == 0
    assert pool.held == 0
    assert pool.fallbacks == 1


def test_a_pool_of_zero_pins_nothing(cuda: PinnedStandIn) -> None:
    pool = _pool(cuda, 0)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=pinned_pool.CUPY_FALLBACK_WARNING)
        devices = [cuda.asarray(_array(n, n)) for n in (1, 4096, 100_000)]
    assert [d.nbytes for d in devices] == [1, 4096, 100_000]
    assert cuda.allocations == 0
    assert cuda.pinned == 0
    assert pool.fallbacks == 3


def test_the_bytes_come_back_and_are_reused(cuda: PinnedStandIn) -> None:
    pool = _pool(cuda, 512 * KiB)
    cuda.asarray(_array(200 * KiB, 1))
    cuda.asarray(_array(200 * KiB, 2))
    assert pool.lent == 2 * _pages(200 * KiB)
    cuda.synchronize()
    # The events passed; CuPy releases the buffers at its next allocation, which reuses one.
    device = cuda.asarray(host := _array(150 * KiB, 3))
    assert cuda.buffers_held == 1
    assert pool.lent == _pages(200 * KiB), "a 200 KiB buffer serves a 150 KiB copy"
    assert pool.held == 2 * _pages(200 * KiB) == cuda.pinned
    assert cuda.allocations == 2, "nothing new was pinned"
    cuda.synchronize()
    np.testing.assert_array_equal(device, host)
    cuda.asarray(_array(1, 4))  # releases the 150 KiB copy's buffer
    cuda.synchronize()
    cuda._release_passed()
    gc.collect()
    assert pool.lent == 0
    assert cuda.buffers_held == 0
    assert pool.kept == pool.held == cuda.pinned > 0
    pool.trim()
    assert pool.held == 0
    assert cuda.pinned == 0, "every pinned byte freed"


def test_a_buffer_twice_the_size_or_more_is_not_lent_for_a_small_copy(cuda: PinnedStandIn) -> None:
    pool = _pool(cuda, 1024 * KiB)
    cuda.asarray(_array(400 * KiB, 1))
    cuda.synchronize()
    cuda.asarray(_array(100 * KiB, 2))  # releases the 400 KiB buffer, keeps it
    assert pool.lent == _pages(100 * KiB)
    assert pool.held == _pages(400 * KiB) + _pages(100 * KiB)


def test_kept_buffers_are_freed_to_make_room(cuda: PinnedStandIn) -> None:
    limit = 300 * KiB
    pool = _pool(cuda, limit)
    cuda.asarray(_array(200 * KiB, 1))
    cuda.synchronize()
    # The idle 200 KiB buffer is over twice 64 KiB: kept, and a 64 KiB buffer made beside it.
    cuda.asarray(_array(64 * KiB, 2))
    assert pool.held == _pages(200 * KiB) + _pages(64 * KiB) <= limit
    cuda.synchronize()
    cuda.asarray(_array(250 * KiB, 3))  # needs room: the kept buffers go, largest first
    assert pool.fallbacks == 0
    assert pool.lent == _pages(250 * KiB)
    assert pool.held <= limit
    assert cuda.pinned <= limit


def test_a_host_out_of_pinned_memory_frees_kept_buffers_then_falls_back() -> None:
    cuda = PinnedStandIn(host_limit=300 * KiB)
    pool = _pool(cuda, 1024 * KiB)
    cuda.asarray(_array(200 * KiB, 1))
    cuda.synchronize()
    # The host pins no more than 300 KiB: the idle 200 KiB buffer is freed so 250 KiB fit.
    device = cuda.asarray(host := _array(250 * KiB, 2))
    assert pool.fallbacks == 0
    assert pool.held == _pages(250 * KiB) == cuda.pinned
    # While that one is lent, another 250 KiB cannot be pinned at all: pageable, still served.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=pinned_pool.CUPY_FALLBACK_WARNING)
        other = cuda.asarray(host2 := _array(250 * KiB, 3))
    assert pool.fallbacks == 1
    assert cuda.pageable_copies == 1
    cuda.synchronize()
    np.testing.assert_array_equal(device, host)
    np.testing.assert_array_equal(other, host2)


def test_the_first_fallback_is_logged_once_and_cupys_warning_is_hidden(
    cuda: PinnedStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pool = install(cuda.cupy, 0)
        with caplog.at_level(logging.WARNING, logger="tensorbits.backend"):
            for seed in range(3):
                cuda.asarray(_array(KiB, seed))  # a warning here would raise
    assert pool.fallbacks == 3
    logged = [r.getMessage() for r in caplog.records if "pinned pool full" in r.getMessage()]
    assert len(logged) == 1, logged
    assert "TENSORBITS_PINNED_POOL_BYTES" in logged[0]


def test_without_installs_filter_cupy_would_warn_at_every_fallback(cuda: PinnedStandIn) -> None:
    """The stand-in warns as CuPy does: what install's filter is there for."""
    pool = PinnedPool(cuda.cupy, 0)
    cuda.cupy.cuda.set_pinned_memory_allocator(pool.malloc)
    with pytest.warns(PerformanceWarning, match=pinned_pool.CUPY_FALLBACK_WARNING):
        cuda.asarray(_array(KiB, 0))


def test_a_second_install_resizes_the_one_pool(cuda: PinnedStandIn) -> None:
    pool = _pool(cuda, 512 * KiB)
    cuda.asarray(_array(200 * KiB, 1))
    cuda.synchronize()
    cuda.asarray(_array(1, 2))  # the 200 KiB buffer is kept now
    assert pool.kept == _pages(200 * KiB)
    again = _pool(cuda, 100 * KiB)
    assert again is pool
    assert pool.limit == 100 * KiB
    assert pool.held <= 100 * KiB, "kept buffers past the new limit are freed"


def test_a_buffer_lent_when_the_limit_was_lowered_is_freed_when_given_back(
    cuda: PinnedStandIn,
) -> None:
    pool = _pool(cuda, 512 * KiB)
    cuda.asarray(_array(200 * KiB, 1))
    pool.resize(64 * KiB)
    assert pool.held == _pages(200 * KiB), "lent: not freed under CuPy's copy"
    cuda.synchronize()
    cuda.asarray(_array(1, 2))
    gc.collect()
    assert pool.held == _pages(1) <= 64 * KiB


def test_a_driver_error_other_than_out_of_memory_is_not_hidden(cuda: PinnedStandIn) -> None:
    pool = PinnedPool(cuda.cupy, 1024 * KiB)

    def broken(size: int, flags: int = 0) -> None:
        raise cuda.cupy.cuda.runtime.CUDARuntimeError(999)

    cuda.cupy.cuda.PinnedMemory = broken
    with pytest.raises(RuntimeError, match="999"):
        pool.malloc(KiB)


def test_a_negative_limit_is_refused(cuda: PinnedStandIn) -> None:
    with pytest.raises(ValueError, match="at least 0"):
        PinnedPool(cuda.cupy, -1)


def test_the_cupy_backend_stages_through_the_pool_and_frees_it_on_close(
    cuda: PinnedStandIn,
) -> None:
    """CupyBackend's host-to-device path (``asarray``) and ``close`` over the pool; building it
    needs a device (tests/gpu/test_device_pinned_pool.py checks the constructor installs it)."""
    from tensorbits.core.backends.cupy_backend import CupyBackend

    backend = object.__new__(CupyBackend)
    backend._cupy = cuda.cupy
    backend._device = contextlib.nullcontext()
    backend.streams = stand_in_streams()  # each thread's stream, stood in for
    backend.pinned = pool = _pool(cuda, 256 * KiB)
    small, large = _array(100 * KiB, 1), _array(1024 * KiB, 2).view(">u4")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=pinned_pool.CUPY_FALLBACK_WARNING)
        devices = [backend.asarray(small), backend.asarray(large)]
    assert (cuda.pinned_copies, cuda.pageable_copies) == (1, 1)
    cuda.synchronize()
    np.testing.assert_array_equal(devices[0], small)
    np.testing.assert_array_equal(devices[1], large)
    assert devices[1].dtype.isnative
    cuda.asarray(_array(1, 3))  # CuPy releases the passed copy's buffer: kept
    assert pool.kept > 0
    backend.close()
    assert pool.kept == 0
    assert cuda.pinned == pool.lent


def test_the_setting_defaults_to_tritons_size_and_is_shared_by_the_workers() -> None:
    from tensorbits.config.settings import Settings

    assert Settings().pinned_pool_bytes == pinned_pool.DEFAULT_POOL_BYTES == 256 << 20
    settings = Settings(workers=4, pinned_pool_bytes=64 << 20, max_body_bytes=1 << 20)
    assert settings.worker_pinned_pool_bytes == 16 << 20
    assert Settings(pinned_pool_bytes=0).worker_pinned_pool_bytes == 0
    # Never more than the bytes in flight, which is all it could ever stage.
    small = Settings(max_inflight_bytes=128 << 20, max_body_bytes=1 << 20)
    assert small.worker_pinned_pool_bytes == 128 << 20


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"pinned_pool_bytes": -1}, "greater than or equal to 0"),
    ],
)
def test_the_setting_is_validated(options: dict[str, int], words: str) -> None:
    from pydantic import ValidationError

    from tensorbits.config.settings import Settings

    with pytest.raises(ValidationError, match=words):
        Settings(**options)  # type: ignore[arg-type]
