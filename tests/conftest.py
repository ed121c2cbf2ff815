"""Shared fixtures. tests/ is on sys.path (pytest's rootdir-relative conftest import), so test
modules import the operator reference as ``core.bitref``."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tensorbits.backends import Backend, select_backend

# No gRPC endpoint and no metrics listener unless a test asks for one (on a free port): in-process
# apps and the live servers the tests start inherit this. Set, not defaulted: a shell that
# exports these for a server of its own (`make serve`, on 8001 and 8002) would otherwise have
# every server the tests start try the ports that server holds.
os.environ["TENSORBITS_GRPC_PORT"] = "0"
os.environ["TENSORBITS_METRICS_PORT"] = "0"


@pytest.fixture(scope="session")
def numpy_backend() -> Iterator[Backend]:
    """The NumPy backend as ``select_backend('numpy')`` builds it (one thread per core)."""
    backend = select_backend("numpy").backend
    yield backend
    backend.close()
