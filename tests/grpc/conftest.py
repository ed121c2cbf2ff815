"""The ``grpc_server`` fixture: the real server with its gRPC endpoint, once per session; and
``grpc_client``, the stock ``tritonclient.grpc`` client of it, one per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as triton_grpc
from support.grpc_live import GrpcServer, serve_grpc


@pytest.fixture(scope="session")
def grpc_server() -> Iterator[GrpcServer]:
    with serve_grpc() as server:
        yield server


@pytest.fixture(scope="module")
def grpc_client(grpc_server: GrpcServer) -> Iterator[triton_grpc.InferenceServerClient]:
    client = triton_grpc.InferenceServerClient(grpc_server.grpc_url)
    yield client
    client.close()
