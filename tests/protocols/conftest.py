"""One real server for the whole suite, HTTP and gRPC on free loopback ports, and ``wires``: both
protocols' clients to it."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import httpx
import pytest
from protocols.wires import TIMEOUT_S, Wires
from support.grpc_live import GrpcServer, serve_grpc


@pytest.fixture(scope="session")
def protocols_server() -> Iterator[GrpcServer]:
    with serve_grpc() as server:
        yield server


@pytest.fixture(scope="session")
def wires(protocols_server: GrpcServer) -> Iterator[Wires]:
    # No message size limit on the client's side: the server's are the ones under test.
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with (
        httpx.Client(base_url=protocols_server.http.base_url, timeout=TIMEOUT_S) as http,
        grpc.insecure_channel(protocols_server.grpc_url, options=options) as channel,
    ):
        yield Wires(http, channel)
