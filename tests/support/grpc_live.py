"""A real ``tensorbits serve`` with its gRPC endpoint on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from support.live import LiveServer, free_port, serve


@dataclass(frozen=True)
class GrpcServer:
    http: LiveServer
    grpc_port: int

    @property
    def grpc_url(self) -> str:
        """``host:port``, the form tritonclient.grpc takes."""
        return f"{self.http.host}:{self.grpc_port}"


@contextmanager
def serve_grpc(env: Mapping[str, str] | None = None) -> Iterator[GrpcServer]:
    """``support.live.serve`` with gRPC on a free port (and ``env`` over the defaults)."""
    port = free_port()
    with serve({"TENSORBITS_GRPC_PORT": str(port), **(env or {})}) as server:
        yield GrpcServer(server, port)


def health_check(
    channel: grpc.Channel,
) -> grpc.UnaryUnaryMultiCallable[health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse]:
    """The stock ``HealthStub``'s ``Check`` on ``channel``: the gRPC health checking protocol as
    any client calls it."""
    stub = health_pb2_grpc.HealthStub(channel)
    # The stubs of grpcio-health-checking declare HealthStub's constructor but not its methods.
    check: grpc.UnaryUnaryMultiCallable[
        health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    ] = stub.Check  # type: ignore[attr-defined]
    return check
