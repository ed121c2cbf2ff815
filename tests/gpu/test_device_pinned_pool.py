"""The bounded pinned pool (backends/pinned_pool.py) under real CuPy: the backend installs it as
CuPy's pinned memory allocator, ``cupy.asarray`` stages through it within its limit, a copy past
the limit falls back to pageable memory (CuPy's own fallback, on the pool's out-of-memory error)
with the right values, and the buffers come back once their copies have passed. The limit is
lowered within each test and restored: the pool is the process's, shared with the other GPU
modules' backends. Skipped without CuPy and a device (in GPU mode, failed: gpu/devices.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from gpu.devices import cupy_backend_or_skip, module_backend

from tensorbits.core.backends.pinned_pool import CUPY_FALLBACK_WARNING, PinnedPool

pytestmark = pytest.mark.gpu

KiB = 1024
cupy_backend = module_backend(cupy_backend_or_skip())


@pytest.fixture
def pool(cupy_backend: Any) -> Iterator[PinnedPool]:
    pinned: PinnedPool = cupy_backend.pinned
    limit = pinned.limit
    yield pinned
    pinned.resize(limit)


def _released(cupy_backend: Any) -> None:
    """Let every copy pass and CuPy release their buffers (it checks at a pinned allocation)."""
    cupy_backend.synchronize()
    cupy_backend.xp.cuda.alloc_pinned_memory(0)


def test_the_backend_installs_the_pool_as_cupys_allocator(
    cupy_backend: Any, pool: PinnedPool
) -> None:
    _released(cupy_backend)
    lent = pool.lent
    pointer = cupy_backend.xp.cuda.alloc_pinned_memory(5000)
    # Two pages, new or a kept buffer of up to twice that, from this pool.
    assert 8192 <= pool.lent - lent <= 16384
    del pointer
    assert pool.lent == lent


def test_copies_within_the_limit_stage_in_the_pool_and_come_back(
    cupy_backend: Any, pool: PinnedPool
) -> None:
    _released(cupy_backend)
    pool.resize(1024 * KiB)
    hosts = [np.random.default_rng(i).integers(0, 256, 200 * KiB, np.uint8) for i in range(12)]
    devices = []
    for host in hosts:
        devices.append(cupy_backend.asarray(host))
        assert pool.held <= 1024 * KiB
    for host, device in zip(hosts, devices, strict=True):
        np.testing.assert_array_equal(cupy_backend.to_host(device), host)
    _released(cupy_backend)
    assert pool.lent == 0
    assert 0 < pool.held <= 1024 * KiB


def test_a_copy_past_the_limit_falls_back_to_pageable_memory(
    cupy_backend: Any, pool: PinnedPool
) -> None:
    _released(cupy_backend)
    pool.resize(64 * KiB)
    fallbacks = pool.fallbacks
    host = np.arange(1 << 20, dtype=np.uint32)  # 4 MiB, past the 64 KiB limit
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The server's own filter (pinned_pool.install), which pytest's "error" would override.
        warnings.filterwarnings("ignore", message=CUPY_FALLBACK_WARNING)
        device = cupy_backend.asarray(host)
    assert pool.fallbacks == fallbacks + 1
    assert pool.held <= 64 * KiB
    np.testing.assert_array_equal(cupy_backend.to_host(device), host)
