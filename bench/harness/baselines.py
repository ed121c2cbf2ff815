"""The floors the service is measured against, each doing no work of its own: ``app``, a bare
FastAPI app (``POST /echo``, ``/ping``; for perf_analyzer the model's metadata and an answer
without outputs); ``RawEcho``, a loopback TCP echo; and a bare ``grpc.aio`` server whose
``ModelInfer`` answers a request it has seen with a cached serialized response (computed once,
so the load generator's check passes) and whose ``ModelStatistics`` counts every worker's
successes. Its handlers take and give bytes, ``ModelInfer`` stream-unary, its message read from
the context, as ``tensorbits.grpc.server`` does (to bound the wait for the message; unary-unary
was 8% cheaper a call): what any grpcio servicer in Python pays at least.

The command serves both in the form of ``tensorbits serve --workers N``: N spawned processes,
each with uvicorn and the grpc.aio server on one uvloop loop, each port a socket of its own in
every worker, shared with ``SO_REUSEPORT``; ``/v2/health/ready`` once every worker serves. From
the repository root, until SIGTERM:

    .venv/bin/python -m bench.harness.baselines HTTP_PORT GRPC_PORT --workers N
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Callable, MutableSequence
from typing import Any

import grpc
import numpy as np
import uvicorn
import uvloop  # tensorbits serve needs it
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from google.protobuf import json_format
from tritonclient.grpc import service_pb2

from bench.harness.grpc_load import CHANNEL_OPTIONS  # the message size limits: 2 GiB

app = FastAPI()
STARTED: MutableSequence[int] = [1]  # in a floor's worker: 1 for each worker serving (``worker``)


@app.post("/echo")
async def echo(request: Request) -> Response:
    return Response(await request.body(), media_type="application/octet-stream")


@app.api_route("/ping", methods=["GET", "POST"])
async def ping(request: Request) -> Response:
    await request.body()
    return Response(b"", media_type="text/plain")


# What perf_analyzer asks first (HTTP: GET /v2/..., gRPC: ServerMetadata, ModelMetadata,
# ModelConfig): a model of one UINT8 input and output of any length.
MODEL, SERVER = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT", {"name": "floor", "version": "1"}
TENSORS = (("input", "InputTensor"), ("output", "OutputTensor"))
METADATA = {"name": MODEL, "versions": ["1"], "platform": "floor"} | {
    f"{k}s": [{"name": n, "datatype": "UINT8", "shape": [-1]}] for k, n in TENSORS}  # fmt: skip
CONFIG = {"name": MODEL, "max_batch_size": 0} | {
    k: [{"name": n, "data_type": "TYPE_UINT8", "dims": [-1]}] for k, n in TENSORS}  # fmt: skip
FIXED = {"": SERVER, f"/models/{MODEL}": METADATA, f"/models/{MODEL}/config": CONFIG}  # fmt: skip


@app.get("/v2{path:path}")
async def fixed(path: str) -> Response:
    if path == "/health/ready":  # once every worker serves
        return Response(b"", status_code=200 if all(STARTED) else 503)
    return JSONResponse(FIXED[path]) if path in FIXED else Response(status_code=404)


@app.post(f"/v2/models/{MODEL}/infer")
async def infer(request: Request) -> Response:
    """The body read, an answer without outputs: all perf_analyzer reads."""
    await request.body()
    return JSONResponse({"model_name": MODEL, "outputs": []})


class RawEcho:
    """A loopback TCP server that sends back exactly the bytes it got: the floor for a round trip."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            conn, _ = self.listener.accept()
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            view = memoryview(bytearray(1 << 27))
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
        payload, view = bytearray(size), memoryview(bytearray(size))

        def once() -> None:
            sock.sendall(size.to_bytes(8, "little"))
            sock.sendall(payload)
            filled = 0
            while filled < size:
                filled += sock.recv_into(view[filled:], size - filled)

        return once


# --- the bare grpc.aio server and the workers ----------------------------------------------
SERVICE = "inference.GRPCInferenceService"
CACHED = 16  # distinct requests remembered: a benchmark sends one or two


class Canned:
    """Answers by request (a large one by its length and ends); ``served[index]`` counts this
    worker's answers (``served`` is shared by the workers: ModelStatistics adds them up)."""

    def __init__(self, served: MutableSequence[int] | None = None, index: int = 0) -> None:
        self.answers: dict[object, bytes] = {}
        self.served, self.index = [0] if served is None else served, index

    def answer(self, data: bytes) -> bytes:
        self.served[self.index] += 1
        key = data if len(data) <= 1 << 16 else (len(data), data[:4096], data[-4096:])
        found = self.answers.get(key) or self._compute(data)
        if len(self.answers) < CACHED:
            self.answers[key] = found
        return found

    @staticmethod
    def _compute(data: bytes) -> bytes:
        request = service_pb2.ModelInferRequest.FromString(data)
        response = service_pb2.ModelInferResponse(model_name=request.model_name, model_version="1")
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=False):
            response.outputs.add(name="OutputTensor", datatype=tensor.datatype, shape=tensor.shape)
            flipped = np.bitwise_not(np.frombuffer(raw, np.uint8))
            response.raw_output_contents.append(flipped.tobytes())
        return bytes(response.SerializeToString())


def handlers(canned: Canned) -> grpc.GenericRpcHandler:
    async def infer_stream(requests: AsyncIterator[bytes], context: Any) -> bytes:
        return canned.answer(await context.read())

    async def statistics(request: service_pb2.ModelStatisticsRequest, context: Any) -> Any:
        stats = service_pb2.ModelStatisticsResponse()
        model = stats.model_stats.add(name=request.name, version="1")
        model.inference_stats.success.count = sum(canned.served)
        return stats

    def fixed(message: Any, kind: Any) -> grpc.RpcMethodHandler[bytes, bytes]:
        async def answer(request: bytes, context: Any) -> bytes:
            return data

        data: bytes = json_format.ParseDict(message, kind()).SerializeToString()
        return grpc.unary_unary_rpc_method_handler(answer)

    return grpc.method_handlers_generic_handler(SERVICE, {
        "ModelInfer": grpc.stream_unary_rpc_method_handler(infer_stream),
        "ServerMetadata": fixed(SERVER, service_pb2.ServerMetadataResponse),
        "ModelMetadata": fixed(METADATA, service_pb2.ModelMetadataResponse),
        "ModelConfig": fixed({"config": CONFIG}, service_pb2.ModelConfigResponse),
        "ModelStatistics": grpc.unary_unary_rpc_method_handler(
            statistics, request_deserializer=service_pb2.ModelStatisticsRequest.FromString,
            response_serializer=service_pb2.ModelStatisticsResponse.SerializeToString),
    })  # fmt: skip


async def serve(index: int, ports: tuple[int, int], served: MutableSequence[int]) -> None:
    """One worker: the gRPC server and uvicorn side by side, then ``STARTED[index]`` set."""
    server = grpc.aio.server(options=[*CHANNEL_OPTIONS, ("grpc.so_reuseport", 1)])
    server.add_generic_rpc_handlers((handlers(Canned(served, index)),))
    server.add_insecure_port(f"127.0.0.1:{ports[1]}")
    await server.start()
    sock = socket.create_server(("127.0.0.1", ports[0]), reuse_port=True)  # and SO_REUSEADDR
    # uvloop (the running loop), httptools, no access log; keep-alive as long as tensorbits'.
    http = uvicorn.Server(uvicorn.Config(app, http="httptools", access_log=False,
                                         log_level="warning", timeout_keep_alive=65))  # fmt: skip
    serving = asyncio.ensure_future(http.serve([sock]))
    while not (http.started or serving.done()):
        await asyncio.sleep(0.01)
    STARTED[index] = 1
    await serving


def worker(index: int, ports: tuple[int, int], started: Any, served: Any) -> None:
    global STARTED
    STARTED = started
    uvloop.run(serve(index, ports, served))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for name in ("http_port", "grpc_port", "--workers"):
        parser.add_argument(name, type=int, default=1)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the workers stopped, then the exit
    spawn = multiprocessing.get_context("spawn")  # new interpreters, as tensorbits' workers
    started, served = spawn.RawArray("b", args.workers), spawn.RawArray("q", args.workers)
    ports = (args.http_port, args.grpc_port)
    workers = [spawn.Process(target=worker, args=(i, ports, started, served))
               for i in range(args.workers)]  # fmt: skip
    try:
        for process in workers:
            process.start()
        multiprocessing.connection.wait([p.sentinel for p in workers])
        sys.exit(1)  # a worker ended (a port taken): so does the floor
    finally:
        for process in workers:
            process.terminate()
            process.join(10)
            process.kill()


if __name__ == "__main__":
    main()
