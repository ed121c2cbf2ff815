"""The ``live_server`` fixture: the real ``tensorbits serve`` (uvicorn, uvloop, httptools) as a
subprocess on a free loopback port, NumPy backend, up once per session (see ``support.live``).
The parity tests' ``wires`` (one server with HTTP and gRPC) are tests/conftest.py's."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.live import LiveServer, serve


@pytest.fixture(scope="session")
def live_server() -> Iterator[LiveServer]:
    """NumPy backend, log level warning, two CPU threads (``support.live.serve``'s defaults)."""
    with serve() as server:
        yield server
