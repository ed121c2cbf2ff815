"""A unary gRPC answer stays counted in admission until grpc has sent it: clients that read
slowly hold the server's memory only within ``TENSORBITS_MAX_INFLIGHT_BYTES``.

Each client asks, through a proxy that reads nothing from the server until told to, for a
broadcast answer of 16 MiB from 8 KiB sent (``onnx.BitwiseXor-18``, 4096 x 1 against 1 x 4096),
retrying while refused for want of room. While the proxy holds the answers back, the server's
resident memory stays within the bound of its baseline and /metrics' in-flight gauge counts the
unsent answers; once the proxy reads, every client has its whole, right answer."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import numpy as np
import pytest
from support.grpc_live import GrpcServer, serve_grpc
from support.live import free_port

from tensorbits.grpc import inference_pb2 as pb

pytestmark = pytest.mark.integration

MiB = 1 << 20
BOUND = 64 * MiB
SIDE = 4096  # A is SIDE x 1, B is 1 x SIDE: 8 KiB in, 16 MiB out
CLIENTS = 16
INFER = "/inference.GRPCInferenceService/ModelInfer"
XOR = "onnx.BitwiseXor-18"
A = (np.arange(SIDE, dtype=np.uint32) % 251).astype(np.uint8).reshape(SIDE, 1)
B = (np.arange(SIDE, dtype=np.uint32) % 241).astype(np.uint8).reshape(1, SIDE)


def _request() -> bytes:
    message = pb.ModelInferRequest(model_name=XOR)
    for name, array in (("A", A), ("B", B)):
        message.inputs.add(name=name, datatype="UINT8", shape=array.shape)
        message.raw_input_contents.append(array.tobytes())
    return message.SerializeToString()


PASSED = 16 << 10


class StallingProxy:
    """A TCP proxy to ``port`` that passes what clients send at once and, of what the server
    answers on each connection, its first ``PASSED`` bytes, then nothing until ``release``."""

    def __init__(self, port: int) -> None:
        self.port = free_port()
        self.target = port
        self.release = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, stall: bool
    ) -> None:
        passed = 0  # the connection's first bytes pass: its settings, the answer's head
        try:
            while data := await reader.read(PASSED if stall and passed < PASSED else 1 << 16):
                passed += len(data)
                while stall and passed > PASSED and not self.release.is_set():
                    await asyncio.sleep(0.02)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        # Small kernel buffers: the answers wait in the server, not in the sockets between.
        sock = up_writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
        await asyncio.gather(
            self._pipe(reader, up_writer, stall=False), self._pipe(up_reader, writer, stall=True)
        )

    @contextmanager
    def running(self) -> Iterator[StallingProxy]:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._client, "127.0.0.1", self.port), self.loop
        ).result(10)
        try:
            yield self
        finally:
            self.release.set()
            asyncio.run_coroutine_threadsafe(self._stop(server), self.loop).result(10)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    @staticmethod
    async def _stop(server: asyncio.Server) -> None:
        server.close()
        pipes = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)


def _call_until_answered(target: str, request: bytes, answers: list[bytes]) -> None:
    options = [("grpc.max_receive_message_length", -1)]
    with grpc.insecure_channel(target, options=options) as channel:
        infer: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(INFER)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                answers.append(infer(request, timeout=60))
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:  # else no room now: again
                    raise
                time.sleep(0.05)


def _gauge(server: GrpcServer) -> float:
    with urllib.request.urlopen(f"{server.http.base_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("tensorbits_inflight_bytes "):
            return float(line.split()[1])
    raise AssertionError("no tensorbits_inflight_bytes in /metrics")


@pytest.fixture(scope="module")
def bounded() -> Iterator[GrpcServer]:
    env = {"TENSORBITS_MAX_INFLIGHT_BYTES": str(BOUND), "TENSORBITS_MAX_BODY_BYTES": str(MiB)}
    with serve_grpc(env) as server:
        yield server


def test_unsent_answers_stay_within_the_bytes_in_flight(bounded: GrpcServer) -> None:
    request = _request()
    warm: list[bytes] = []
    _call_until_answered(bounded.grpc_url, request, warm)  # the allocator's first growth
    baseline = bounded.http.reset_peak_rss()
    answers: list[bytes] = []
    with StallingProxy(bounded.grpc_port).running() as proxy:
        target = f"127.0.0.1:{proxy.port}"
        clients = [
            threading.Thread(target=_call_until_answered, args=(target, request, answers))
            for _ in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        gauges = []
        until = time.monotonic() + 8
        while time.monotonic() < until:  # the answers held back by their readers
            gauges.append(_gauge(bounded))
            time.sleep(0.2)
        held_peak = bounded.http.peak_rss() - baseline
        proxy.release.set()
        for client in clients:
            client.join(90)
    print(f"baseline {baseline / MiB:.0f} MiB, peak growth while unsent {held_peak / MiB:.0f} "
          f"MiB, gauge max {max(gauges) / MiB:.0f} MiB")  # fmt: skip
    assert len(answers) == CLIENTS
    want = np.bitwise_xor(A, B).tobytes()
    for answer in answers:
        assert pb.ModelInferResponse.FromString(answer).raw_output_contents[0] == want
    # The unsent answers are counted while the readers hold them back (the last samples: by
    # then every inference ran, and only unsent answers are counted), and the server's memory
    # grows no further than the bytes in flight allow: the bound, passed by at most the answers
    # of the calls that ended while it was full (each counted twice: grpcio's copy too), and
    # slack for the allocator (a freed answer may stay in its heap) and grpc's buffers.
    assert min(gauges[-5:]) >= SIDE * SIDE, gauges
    assert held_peak < BOUND + 48 * MiB, held_peak / MiB  # 353 MiB when answers were not held
