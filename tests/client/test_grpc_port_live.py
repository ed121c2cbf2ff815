"""A client pointed at the gRPC port by mistake is told so: the server answers an HTTP/1.1
request with HTTP/2 frames, which no HTTP/1 parser reads, and the connection error asks whether
this is the gRPC port rather than saying only that the response line was illegal."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest
from support.grpc_live import GrpcServer, serve_grpc

from tensorbits_client import APIConnectionError, AsyncClient, Client

pytestmark = pytest.mark.integration

HINT = "is this the gRPC port?"


@pytest.fixture(scope="module")
def server() -> Iterator[GrpcServer]:
    with serve_grpc() as running:
        yield running


def test_the_sync_client_asks_whether_it_is_the_grpc_port(server: GrpcServer) -> None:
    with Client(f"http://{server.grpc_url}", max_retries=0) as client:
        with pytest.raises(APIConnectionError) as listing:
            client.repository_index()
        with pytest.raises(APIConnectionError) as inference:
            client.infer("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", [np.zeros(4, np.uint8)])
    for caught in (listing, inference):
        assert HINT in caught.value.reason, caught.value.message
        assert "illegal request line" not in caught.value.message
    # The same server's HTTP port answers the same calls.
    with Client(server.http.base_url) as client:
        assert client.repository_index()


def test_the_async_client_asks_the_same(server: GrpcServer) -> None:
    async def refused() -> APIConnectionError:
        async with AsyncClient(f"http://{server.grpc_url}", max_retries=0) as client:
            with pytest.raises(APIConnectionError) as caught:
                await client.repository_index()
            return caught.value

    assert HINT in asyncio.run(refused()).reason
