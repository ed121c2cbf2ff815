"""The gRPC endpoint: ``GRPCInferenceService`` and the standard health service on
``TENSORBITS_GRPC_PORT``, in the HTTP server's process and event loop.

Started beside the HTTP server on the runtime its process started (``server/assembly.py``:
``grpc_beside``, under ``side_by_side``) and stopped before that runtime closes, so the two
protocols share one backend, one admission bound, one set of statistics and one drain, whichever
process (or worker) serves. Its bounds are the HTTP side's:

* a message is at most ``TENSORBITS_MAX_BODY_BYTES`` (grpcio refuses a longer one with
  RESOURCE_EXHAUSTED before the handler runs);
* every call's capacity is bounded before its message is read, probes apart (``pools.py``,
  ``RPC_RULES``): grpcio's own bound on concurrent calls is not used, as it counts the probes
  with the rest (80 calls that never send their message would make ServerLive and the health
  service answer RESOURCE_EXHAUSTED), and one connection holds at most half of the inference
  and stream pools (``pools.connection_share``). One connection carries at most
  ``MAX_STREAMS`` calls at once, and its metadata at most ``TENSORBITS_MAX_HEAD_BYTES`` (HTTP's
  head limit);
* a message must arrive within ``TENSORBITS_TIMEOUT_BODY_READ`` (service.py; on a stream,
  streams.py, once it has nothing in flight).

TLS when the HTTP side has it (the same certificate and key). The health service
(``grpc.health.v1.Health``, what Kubernetes' gRPC probes call) answers SERVING while the runtime
is ready, for the whole server ("") and for ``inference.GRPCInferenceService``, and NOT_SERVING
once the drain has begun, like ``GET /v2/health/ready``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tensorbits.config.settings import Settings
from tensorbits.grpc.pools import RPC_RULES
from tensorbits.grpc.service import SERVICE_NAME, InferenceService
from tensorbits.observability import Metrics
from tensorbits.runtime import Runtime

logger = logging.getLogger("tensorbits.grpc")

# Calls one HTTP/2 connection may have open at once: what one client multiplexes. More wait in
# the client; the pools of pools.py bound what every connection together may hold.
MAX_STREAMS = 128
# grpcio's channel arguments are C ints, and protobuf messages are under 2 GiB anyway.
MAX_MESSAGE_BYTES = 2**31 - 1
# How often Watch looks at the readiness it reports.
WATCH_PERIOD_S = 1.0


class Health(health_pb2_grpc.HealthServicer):
    """``grpc.health.v1.Health``, its answer read from the runtime at each call."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def _status(self, service: str) -> int:
        if service not in ("", SERVICE_NAME):
            return health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
        if self.runtime.ready:
            return health_pb2.HealthCheckResponse.SERVING
        return health_pb2.HealthCheckResponse.NOT_SERVING

    async def Check(  # noqa: N802 (the protocol's name)
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> health_pb2.HealthCheckResponse:
        status = self._status(request.service)
        if status == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service[:100]}'"
            )
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(  # noqa: N802 (the protocol's name)
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            status = self._status(request.service)
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            await asyncio.sleep(WATCH_PERIOD_S)


def _address(settings: Settings) -> str:
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    return f"{host}:{settings.grpc_port}"


def _credentials(settings: Settings) -> grpc.ServerCredentials | None:
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    if settings.tls_key_password is not None:
        # grpcio takes a key as PEM bytes, unencrypted; the settings check ran before this.
        raise RuntimeError(
            "gRPC cannot serve TLS with an encrypted key (TENSORBITS_TLS_KEY_PASSWORD): give an "
            "unencrypted key, or set TENSORBITS_GRPC_PORT=0"
        )
    return grpc.ssl_server_credentials(
        [(settings.tls_key_file.read_bytes(), settings.tls_cert_file.read_bytes())]
    )


def build(runtime: Runtime, metrics: Metrics | None = None) -> grpc.aio.Server:
    """The gRPC server for ``runtime``, its services added, its port bound, not started; its
    calls counted in ``metrics`` (the app's: /metrics shows both protocols)."""
    settings = runtime.settings
    service = InferenceService(runtime, metrics)
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", min(settings.max_body_bytes, MAX_MESSAGE_BYTES)),
            ("grpc.max_send_message_length", min(settings.max_inflight_bytes, MAX_MESSAGE_BYTES)),
            # A port already taken is an error, as it is for HTTP; several workers of one
            # server share theirs (the kernel spreads the connections).
            ("grpc.so_reuseport", 1 if settings.workers > 1 else 0),
            ("grpc.max_concurrent_streams", MAX_STREAMS),
            # Metadata is the call's head: bounded as HTTP's is. grpcio refuses past the soft
            # limit only at random up to its hard one (1.25x by default): both are the bound.
            ("grpc.max_metadata_size", settings.max_head_bytes),
            ("grpc.absolute_max_metadata_size", settings.max_head_bytes),
        ],
    )
    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        name: grpc.stream_stream_rpc_method_handler(service.stream(name))
        if RPC_RULES[name].streaming
        else grpc.stream_unary_rpc_method_handler(service.rpc(name))
        for name in service.handlers
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    health_pb2_grpc.add_HealthServicer_to_server(Health(runtime), server)
    address = _address(settings)
    credentials = _credentials(settings)
    if credentials is None:
        server.add_insecure_port(address)
    else:
        server.add_secure_port(address, credentials)
    return server


async def start(runtime: Runtime, metrics: Metrics | None = None) -> grpc.aio.Server:
    """Build and start the gRPC server of ``runtime`` (in the running event loop)."""
    server = build(runtime, metrics)
    await server.start()
    logger.info(
        "gRPC on %s", _address(runtime.settings), extra={"grpc_port": runtime.settings.grpc_port}
    )
    return server


async def stop(server: grpc.aio.Server, grace_s: float) -> None:
    """Refuse new calls, let those in flight finish for up to ``grace_s``, then cancel them."""
    await server.stop(grace_s)


__all__ = ["MAX_STREAMS", "Health", "build", "start", "stop"]
