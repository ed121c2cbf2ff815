"""A bounded gRPC load generator for small unary calls (Debian has no ``ghz`` package).

``--streams`` coroutines, spread over ``--channels`` channels (each its own HTTP/2 connection),
each making one unary ``ModelInfer`` call after another for ``--duration`` seconds (at most
``--max-requests`` calls in all), after a ``--warmup`` that is not counted. The request is
serialized ONCE (``model_infer_request``) and sent as bytes through a method with no serializer;
the answers stay bytes too (no deserializer), and the first answer of each run is parsed and
checked against NumPy. So the client spends its time in grpcio's C core and the event loop, as
little as a Python client can, on every server alike: the figures are comparable between
servers, not absolute (the client shares the machine's cores with the server).

Reports requests/s, p50 and p99 latency (ms), and the calls that did not end OK (any is a
failed run: exit status 1). The messages are the Open Inference Protocol's, from the stock
``tritonclient.grpc`` package (its ``service_pb2``), so one request serves Triton and tensorbits.

    .venv/bin/python bench/_grpc_load.py 127.0.0.1:8001                  # 16-element BIT_NOT
    .venv/bin/python bench/_grpc_load.py 127.0.0.1:8001 --elements 4096 --streams 64 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

METHOD = "/inference.GRPCInferenceService/ModelInfer"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
# A 64 MiB tensor and its message framing; both servers raise their own limits to match.
MAX_MESSAGE_BYTES = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# The run's bounds (and the CLI's): what one benchmark may ask of the machine.
MAX_STREAMS = 512
MAX_CHANNELS = 64
MAX_DURATION = 600.0


def model_infer_request(model: str, inputs: dict[str, np.ndarray]) -> bytes:
    """A serialized ``ModelInferRequest``: UINT8 inputs as ``raw_input_contents``."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in inputs.items():
        tensor = request.inputs.add(name=name, datatype="UINT8")
        tensor.shape.extend(array.shape)
        request.raw_input_contents.append(array.tobytes())
    data: bytes = request.SerializeToString()
    return data


def first_output(answer: bytes) -> np.ndarray:
    """The first output of a serialized ``ModelInferResponse``, as UINT8."""
    response = service_pb2.ModelInferResponse.FromString(answer)
    if not response.raw_output_contents:
        raise RuntimeError(f"answer without raw_output_contents: {response.outputs!r}")
    return np.frombuffer(response.raw_output_contents[0], np.uint8)


def raw_infer(channel: grpc.aio.Channel) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    """``ModelInfer`` taking and giving bytes: no protobuf work per call on the client."""
    return channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)


@dataclass(frozen=True)
class LoadResult:
    target: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    failures: dict[str, int]
    client_cpu_s: float  # this process's CPU time over the counted round: is the client the bound?
    calls_made: int  # every call the server answered, the check and the warm-up included

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def client_us_per_call(self) -> float:
        return self.client_cpu_s / self.requests * 1e6 if self.requests else float("nan")


async def _stream(
    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes],
    body: bytes,
    deadline: float,
    budget: list[int],
    latencies: list[float],
    failures: Counter[str],
) -> None:
    while budget[0] > 0 and time.monotonic() < deadline:
        budget[0] -= 1
        start = time.perf_counter()
        try:
            await call(body, timeout=30)
        except grpc.aio.AioRpcError as exc:
            failures[exc.code().name] += 1
            continue
        latencies.append(time.perf_counter() - start)


async def _check(call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes], body: bytes) -> None:
    """One call answered with NOT of the request's input: the peer runs what we think it runs."""
    request = service_pb2.ModelInferRequest.FromString(body)
    sent = np.frombuffer(request.raw_input_contents[0], np.uint8)
    got = first_output(await call(body, timeout=30, wait_for_ready=True))
    if request.model_name == NOT and not np.array_equal(got, np.bitwise_not(sent)):
        raise RuntimeError(f"{request.model_name}: wrong answer {got[:8]} for {sent[:8]}")


async def run_load(
    target: str,
    body: bytes,
    *,
    streams: int = 32,
    channels: int = 2,
    duration: float = 4.0,
    warmup: float = 0.5,
    max_requests: int = 10_000_000,
) -> LoadResult:
    """``streams`` concurrent callers over ``channels`` channels to ``target`` (host:port)."""
    if not (1 <= streams <= MAX_STREAMS and 1 <= channels <= MAX_CHANNELS):
        raise ValueError(f"streams 1..{MAX_STREAMS}, channels 1..{MAX_CHANNELS}")
    if not 0 < duration <= MAX_DURATION:
        raise ValueError(f"duration in (0, {MAX_DURATION:g}] s")
    opened = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(channels)]
    try:
        calls = [raw_infer(channel) for channel in opened]
        await _check(calls[0], body)
        spread = [calls[i % channels] for i in range(streams)]
        warm, warm_failures, _ = await _round(spread, body, warmup, max_requests)  # not timed
        cpu = time.process_time()
        latencies, failures, elapsed = await _round(spread, body, duration, max_requests)
        cpu = time.process_time() - cpu
        failures += warm_failures
    finally:
        await asyncio.gather(*(channel.close() for channel in opened))
    p50, p99 = np.percentile(latencies, [50, 99]) * 1e3 if latencies else (np.nan, np.nan)
    made = 1 + len(warm) + len(latencies)
    return LoadResult(
        target, len(latencies), elapsed, float(p50), float(p99), dict(failures), cpu, made
    )


async def _round(
    spread: list[grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]],
    body: bytes,
    seconds: float,
    max_requests: int,
) -> tuple[list[float], Counter[str], float]:
    """Every stream calling until ``seconds`` have passed or ``max_requests`` were made."""
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    budget = [max_requests]
    start = time.monotonic()
    await asyncio.gather(
        *(_stream(call, body, start + seconds, budget, latencies, failures) for call in spread)
    )
    return latencies, failures, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("target", help="host:port of a GRPCInferenceService")
    parser.add_argument("--model", default=NOT)
    parser.add_argument("--input", default="InputTensor", help="the model's input name")
    parser.add_argument("--elements", type=int, default=16, help="UINT8 elements (default 16)")
    parser.add_argument("--streams", type=int, default=32, help="concurrent calls (default 32)")
    parser.add_argument("--channels", type=int, default=2, help="connections (default 2)")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds (default 4)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds not counted")
    parser.add_argument("--max-requests", type=int, default=10_000_000)
    parser.add_argument("--json", action="store_true", help="one JSON line (for bench scripts)")
    args = parser.parse_args(argv)
    if not 1 <= args.elements <= 1 << 26:
        parser.error("--elements: 1 to 64 Mi")
    data = np.arange(args.elements, dtype=np.uint64).astype(np.uint8)
    body = model_infer_request(args.model, {args.input: data})
    try:
        result = asyncio.run(
            run_load(
                args.target,
                body,
                streams=args.streams,
                channels=args.channels,
                duration=args.duration,
                warmup=args.warmup,
                max_requests=args.max_requests,
            )
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"{result.target} {args.model} x{args.elements}: {result.rate:,.0f} req/s, "
            f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, {result.requests} calls "
            f"in {result.seconds:.1f} s, {args.streams} streams on {args.channels} channels, "
            f"client CPU {result.client_us_per_call:.0f} us/call"
            + (f"; FAILED: {result.failures}" if result.failures else "")
        )
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
