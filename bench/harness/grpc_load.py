"""A bounded gRPC load generator for small unary ``ModelInfer`` calls: h2load (nghttp2's, C;
``apt-get install -y nghttp2-client``) posting one serialized request in gRPC's framing on
``--channels`` connections of ``--streams``/``--channels`` streams each (grpc.aio in Python spent
about as much CPU a call as the server it measured). h2load reads HTTP statuses, not gRPC's: the
model's statistics (the ModelStatistics RPC, served by Triton and tensorbits alike) are read
before and after, and a failed inference or fewer successes than answers fails the run (exit
status 1); one answer is checked against NumPy first. ``calls_made``, warm-up included, is what a
server's CPU time is divided by.

    .venv/bin/python -m bench.harness.grpc_load 127.0.0.1:8001                 # 16-element BIT_NOT
    .venv/bin/python -m bench.harness.grpc_load 127.0.0.1:8001 --streams 8 --json
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

SERVICE = "/inference.GRPCInferenceService"
METHOD = f"{SERVICE}/ModelInfer"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
# A 64 MiB tensor and its message framing; both servers raise their own limits to match.
MAX_MESSAGE_BYTES = 2**31 - 1
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]  # fmt: skip
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


def raw_model_infer(channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable[bytes, bytes]:
    """``ModelInfer`` taking and giving bytes: no protobuf work per call on the client."""
    return channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)


@dataclass(frozen=True)
class LoadResult:
    target: str
    driver: str
    requests: int  # answered OK in the timed part
    seconds: float
    p50_ms: float
    p99_ms: float
    failures: dict[str, int]  # by HTTP outcome (h2load) or "server stats"
    client_cpu_s: float  # the client's CPU time over the timed part: is the client the bound?
    calls_made: int  # inferences the server counted as successes, warm-up and check included

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def client_us_per_call(self) -> float:
        return self.client_cpu_s / self.requests * 1e6 if self.requests else float("nan")


@dataclass(frozen=True)
class Load:
    """One run's parameters; ``body`` is a serialized ModelInferRequest."""

    target: str
    body: bytes
    streams: int = 32
    channels: int = 2
    duration: float = 4.0
    warmup: float = 0.5

    def __post_init__(self) -> None:
        if not (1 <= self.streams <= MAX_STREAMS and 1 <= self.channels <= MAX_CHANNELS):
            raise ValueError(f"streams 1..{MAX_STREAMS}, channels 1..{MAX_CHANNELS}")
        if not (0 < self.duration <= MAX_DURATION and 0 <= self.warmup <= MAX_DURATION):
            raise ValueError(
                f"duration in (0, {MAX_DURATION:g}] s, warm-up in [0, {MAX_DURATION:g}]"
            )

    @property
    def model(self) -> str:
        return str(service_pb2.ModelInferRequest.FromString(self.body).model_name)


# --- the check on the server ------------------------------------------------------------------
def check_answer(target: str, body: bytes) -> None:
    """One call answered with NOT of the request's input: the peer runs what we think it runs."""
    request = service_pb2.ModelInferRequest.FromString(body)
    sent = np.frombuffer(request.raw_input_contents[0], np.uint8)
    with grpc.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        got = first_output(raw_model_infer(channel)(body, timeout=30, wait_for_ready=True))
    if request.model_name == NOT and not np.array_equal(got, np.bitwise_not(sent)):
        raise RuntimeError(f"{request.model_name}: wrong answer {got[:8]} for {sent[:8]}")


def inference_counts(target: str, model: str) -> tuple[int, int]:
    """(successes, failures) the server has counted for ``model`` (the ModelStatistics RPC)."""
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(
            f"{SERVICE}/ModelStatistics",
            request_serializer=service_pb2.ModelStatisticsRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStatisticsResponse.FromString,
        )
        stats = call(service_pb2.ModelStatisticsRequest(name=model), timeout=30)
    ok = sum(m.inference_stats.success.count for m in stats.model_stats)
    failed = sum(m.inference_stats.fail.count for m in stats.model_stats)
    return int(ok), int(failed)


def run(load: Load) -> LoadResult:
    """``load`` through h2load, its outcome checked against the server's own counts."""
    model = load.model
    ok_before, failed_before = inference_counts(load.target, model)
    check_answer(load.target, load.body)
    result = _h2load(load)
    ok_after, failed_after = inference_counts(load.target, model)
    # A server of several worker processes adds the others' counts as they publish them
    # (tensorbits: every second): read again until they have caught up, for at most 3 s.
    deadline = time.monotonic() + 3.0
    while ok_after - ok_before < result.requests + 1 and time.monotonic() < deadline:
        time.sleep(0.25)
        ok_after, failed_after = inference_counts(load.target, model)
    made, server_failed = ok_after - ok_before, failed_after - failed_before
    failures = dict(result.failures)
    if server_failed or made < result.requests + 1:
        failures["server stats"] = server_failed or result.requests + 1 - made
    return LoadResult(**{**asdict(result), "failures": failures, "calls_made": made})


def _percentiles(seconds: list[float]) -> tuple[float, float]:
    if not seconds:
        return float("nan"), float("nan")
    p50, p99 = np.percentile(seconds, [50, 99]) * 1e3
    return float(p50), float(p99)


# --- h2load: nghttp2's load generator -----------------------------------------------------------
def grpc_frame(message: bytes) -> bytes:
    """gRPC's length-prefixed message: not compressed (0), then the length, big-endian."""
    return struct.pack(">BI", 0, len(message)) + message


def _h2load(load: Load) -> LoadResult:
    if shutil.which("h2load") is None:
        raise RuntimeError("the h2load driver needs h2load: apt-get install -y nghttp2-client")
    if load.streams % load.channels:
        raise ValueError("h2load: --streams must be a multiple of --channels")
    with tempfile.TemporaryDirectory(prefix="tensorbits-h2load-") as tmp:
        request, log = Path(tmp) / "request", Path(tmp) / "log"
        request.write_bytes(grpc_frame(load.body))
        argv = [
            "h2load", "-t1", f"-c{load.channels}", f"-m{load.streams // load.channels}",
            f"-D{round(load.duration * 1000)}ms", f"--warm-up-time={round(load.warmup * 1000)}ms",
            f"-d{request}", f"--log-file={log}",
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            f"http://{load.target}{METHOD}",
        ]  # fmt: skip
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=load.warmup + load.duration + 60
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise RuntimeError(f"h2load exited with {done.returncode}: {done.stderr[-2000:]}")
        rows = [line.split("\t") for line in log.read_text().splitlines() if line]
    out = done.stdout
    stats = re.search(
        r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout",
        out,
    )
    # "finished in" counts the warm-up too; the rate and the counts are the timed part's.
    rate = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
    if stats is None or rate is None:
        raise RuntimeError(f"could not read h2load's output:\n{out}")
    succeeded, failed, errored, timed_out = (int(n) for n in stats.groups())
    seconds = succeeded / float(rate.group(1)) if succeeded else load.duration
    failures = {
        k: n for k, n in (("failed", failed), ("errored", errored), ("timeout", timed_out)) if n
    }
    p50, p99 = _percentiles([int(row[2]) / 1e6 for row in rows if row[1] == "200"])
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    cpu *= load.duration / (load.duration + load.warmup)  # its share of the timed part
    return LoadResult(load.target, "h2load", succeeded, seconds, p50, p99, failures, cpu, 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("target", help="host:port of a GRPCInferenceService")
    parser.add_argument("--model", default=NOT)
    parser.add_argument("--input", default="InputTensor", help="the model's input name")
    parser.add_argument("--elements", type=int, default=16, help="UINT8 elements (default 16)")
    parser.add_argument(
        "--streams", type=int, default=Load.streams, help=f"calls in flight ({Load.streams})"
    )
    parser.add_argument(
        "--channels", type=int, default=Load.channels, help=f"connections ({Load.channels})"
    )
    parser.add_argument("--duration", type=float, default=4.0, help="seconds (default 4)")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds not timed")
    parser.add_argument("--json", action="store_true", help="one JSON line (for bench scripts)")
    args = parser.parse_args(argv)
    if not 1 <= args.elements <= 1 << 26:
        parser.error("--elements: 1 to 64 Mi")
    data = np.arange(args.elements, dtype=np.uint64).astype(np.uint8)
    body = model_infer_request(args.model, {args.input: data})
    try:
        load = Load(args.target, body, args.streams, args.channels, args.duration, args.warmup)
        result = run(load)
    except ValueError as exc:
        parser.error(str(exc))
    except grpc.RpcError as exc:  # the check or the statistics call: the server said no
        print(f"{args.target}: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(asdict(result)))
    else:
        print(
            f"{result.target} {args.model} x{args.elements} ({result.driver}): "
            f"{result.rate:,.0f} req/s, p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, "
            f"{result.requests} calls in {result.seconds:.1f} s, {args.streams} streams on "
            f"{args.channels} connections, client CPU {result.client_us_per_call:.0f} us/call"
            + (f"; FAILED: {result.failures}" if result.failures else "")
        )
    return 1 if result.failures else 0


if __name__ == "__main__":
    sys.exit(main())
