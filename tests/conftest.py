"""Shared fixtures. tests/ is on sys.path (pytest's rootdir-relative conftest import), so test
modules import the operator reference as ``core.bitref``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorbits.backends import Backend, select_backend


@pytest.fixture(scope="session")
def numpy_backend() -> Iterator[Backend]:
    """The NumPy backend as ``select_backend('numpy')`` builds it (one thread per core)."""
    backend = select_backend("numpy").backend
    yield backend
    backend.close()
