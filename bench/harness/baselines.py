"""The floors the service is measured against, each doing no work of its own: ``app``, a bare
FastAPI app (``POST /echo``, ``GET``/``POST /ping``); ``RawEcho``, a loopback TCP echo; and a bare
``grpc.aio`` server on uvloop whose ``ModelInfer`` answers a request it has seen with a cached
serialized response (computed once, so the load generator's check passes) and whose
``ModelStatistics`` counts the successes. Its handlers take and give bytes, and ``ModelInfer`` is
stream-unary, as ``tensorbits.grpc.server`` registers it (to bound the wait for the message;
unary-unary was 8% cheaper a call): what any grpcio servicer in Python pays at least. Run from
the repository root:

    .venv/bin/python -m bench.harness.baselines PORT
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import numpy as np
from fastapi import FastAPI, Request, Response
from tritonclient.grpc import service_pb2

app = FastAPI()


@app.post("/echo")
async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


@app.get("/ping")
async def ping() -> Response:
    return Response(b"", media_type="text/plain")


@app.post("/ping")
async def ping_post(request: Request) -> Response:
    await request.body()
    return Response(b"", media_type="text/plain")


class RawEcho:
    """A loopback TCP server that sends back exactly the bytes it got: the floor for a round trip."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            buf = bytearray(1 << 27)
            view = memoryview(buf)
            while True:
                header = conn.recv(8)
                if len(header) < 8:
                    return
                size = int.from_bytes(header, "little")
                filled = 0
                while filled < size:
                    filled += conn.recv_into(view[filled:size])
                conn.sendall(view[:size])

    def round_trip_fn(self, size: int) -> Callable[[], None]:
        sock = socket.create_connection(("127.0.0.1", self.port))
        payload = bytearray(size)
        back = bytearray(size)
        view = memoryview(back)

        def once() -> None:
            sock.sendall(size.to_bytes(8, "little"))
            sock.sendall(payload)
            filled = 0
            while filled < size:
                filled += sock.recv_into(view[filled:], size - filled)

        return once


# --- the bare grpc.aio server ----------------------------------------------------------------
SERVICE = "inference.GRPCInferenceService"
CACHED = 16  # distinct requests remembered: a benchmark sends one or two


class Canned:
    """Answers by request (a large one by its length and ends), and the count of calls answered."""

    def __init__(self) -> None:
        self.answers: dict[object, bytes] = {}
        self.served = 0

    def answer(self, data: bytes) -> bytes:
        self.served += 1
        key = data if len(data) <= 1 << 16 else (len(data), data[:4096], data[-4096:])
        found = self.answers.get(key)
        if found is None:
            found = self._compute(data)
            if len(self.answers) < CACHED:
                self.answers[key] = found
        return found

    @staticmethod
    def _compute(data: bytes) -> bytes:
        request = service_pb2.ModelInferRequest.FromString(data)
        response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=False):
            out = response.outputs.add(name="OutputTensor", datatype=tensor.datatype)
            out.shape.extend(tensor.shape)
            response.raw_output_contents.append(
                np.bitwise_not(np.frombuffer(raw, np.uint8)).tobytes()
            )
        data_out: bytes = response.SerializeToString()
        return data_out


def handlers(canned: Canned) -> grpc.GenericRpcHandler:
    async def infer_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
        return canned.answer(await anext(requests))

    async def statistics(request: service_pb2.ModelStatisticsRequest, context: Any) -> Any:
        stats = service_pb2.ModelStatisticsResponse()
        model = stats.model_stats.add(name=request.name, version="1")
        model.inference_stats.success.count = canned.served
        return stats

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "ModelInfer": grpc.stream_unary_rpc_method_handler(infer_stream),
            "ModelStatistics": grpc.unary_unary_rpc_method_handler(
                statistics,
                request_deserializer=service_pb2.ModelStatisticsRequest.FromString,
                response_serializer=service_pb2.ModelStatisticsResponse.SerializeToString,
            ),
        },
    )


async def serve(port: int) -> None:
    limit = 2**31 - 1
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
        ]
    )
    server.add_generic_rpc_handlers((handlers(Canned()),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def main() -> None:  # runs until killed (SIGTERM)
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("port", type=int)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:  # the asyncio loop then; tensorbits serve needs uvloop, so it is there
        asyncio.run(serve(args.port))
    else:
        uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
