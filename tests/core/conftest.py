"""Fixtures of the core's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.device_stand_in import HostDeviceMemory


@pytest.fixture
def device() -> Iterator[HostDeviceMemory]:
    """Device memory stood in for by host shared memory (CUDA IPC handles included), its
    exports closed after the test."""
    made = HostDeviceMemory()
    yield made
    made.close_exports()
