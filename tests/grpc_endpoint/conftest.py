"""The ``grpc_server`` fixture: the real server with its gRPC endpoint, once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.grpc_live import GrpcServer, serve_grpc


@pytest.fixture(scope="session")
def grpc_server() -> Iterator[GrpcServer]:
    with serve_grpc() as server:
        yield server
