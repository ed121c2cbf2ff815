"""Would Triton's dynamic batcher pay here? The most it could save a small request, against what
that request costs the server, measured in one run.

Triton's ``dynamic_batching`` holds requests to one model for up to
``max_queue_delay_microseconds`` and runs them as one launch. What that can save is the compute
of the separate launches less the one merged launch (with its gathering and scattering); the
parsing, routing, planning of the body and the HTTP exchange stay per request. Two parts:

  http       16-element requests under concurrency against ``tensorbits serve`` as it is (NumPy
             backend, one process): ``DML_OPERATOR_ELEMENT_WISE_BIT_NOT`` (UINT8 [16]) and the
             graph model ``examples/models/masked`` (UINT8 [4, 4]), v2 binary over HTTP/1.1
             keep-alive, ``--clients`` connections each sending its next request when its answer
             has come (an asyncio load generator in this process). Figures: requests/s, latency
             p50 and p99, the server process's CPU time per request (``/proc``: every thread),
             and its ``compute_infer`` per request from the model's statistics.
  compute    in process, on the NumPy backend: N requests' compute run as N launches (validate
             and run one BIT_NOT; plan, from the plan cache, and run the graph), against one launch over the N inputs
             concatenated (the gathering into one input, the launch, the scattering of each
             answer into its own buffer): the saving per request is (N launches - one) / N.

The verdict: that saving per request, as a share of the server's CPU time per request under load.

Usage (from the repository's root):
.venv/bin/python bench/dynamic_batching.py [--seconds 5] [--clients 16 64] [--rounds 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import ROOT, best_per_call, free_port, wait_until_up
from bench.http_service import NOT, v2_binary_request
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.engine import run_call, validate_arrays
from tensorbits.core.graphs import read_onnx
from tensorbits.core.graphs.program import OnnxGraph

MASKED = "masked"
MASKED_FILE = ROOT / "examples" / "models" / "masked" / "1" / "model.onnx"
MASK = np.array([1, 3, 7, 15], np.uint8)
TICKS = os.sysconf("SC_CLK_TCK")
Arr = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Load:
    model: str
    clients: int
    rps: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # the server process's CPU time per request
    compute_us: float  # the model's compute_infer per request, from its statistics


@contextmanager
def server() -> Iterator[tuple[int, int]]:
    """``tensorbits serve`` (NumPy backend, no gRPC) serving ``examples/models``: (port, pid)."""
    port = free_port()
    env = {
        **os.environ,
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_GRPC_PORT": "0",
        "TENSORBITS_MODEL_REPOSITORY": str(ROOT / "examples" / "models"),
    }
    argv = [sys.executable, "-m", "tensorbits.server.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{port}/v2/models/{MASKED}/ready", 60, proc)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far, every thread's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def compute_ns(port: int, model: str) -> tuple[int, int]:
    """The model's (inference count, compute_infer ns) so far, from its statistics."""
    url = f"http://127.0.0.1:{port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)["model_stats"][0]["inference_stats"]
    return int(stats["compute_infer"]["count"]), int(stats["compute_infer"]["ns"])


def http_request(port: int, model: str, inputs: dict[str, Arr], output: str) -> bytes:
    head, parts = v2_binary_request(inputs, output)
    body = b"".join(bytes(p) for p in parts)
    return (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(head)}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def one_client(
    port: int, request: bytes, answer: bytes, deadline: float, latencies: list[float]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter() < deadline:
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise RuntimeError(head.decode(errors="replace"))
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            body = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if not body.endswith(answer):
                raise RuntimeError("a wrong answer")
    finally:
        writer.close()


def load(
    port: int, pid: int, model: str, request: bytes, answer: bytes, clients: int, seconds: float
) -> Load:
    async def drive(span: float) -> list[float]:
        latencies: list[float] = []
        deadline = time.perf_counter() + span
        await asyncio.gather(
            *(one_client(port, request, answer, deadline, latencies) for _ in range(clients))
        )
        return latencies

    uvloop.run(drive(1.0))  # warm: connections, caches
    count0, ns0 = compute_ns(port, model)
    cpu0, wall0 = cpu_seconds(pid), time.perf_counter()
    latencies = uvloop.run(drive(seconds))
    wall, cpu = time.perf_counter() - wall0, cpu_seconds(pid) - cpu0
    count1, ns1 = compute_ns(port, model)
    done = len(latencies)
    ordered = np.sort(np.array(latencies))
    return Load(
        model,
        clients,
        done / wall,
        float(ordered[done // 2]) * 1e3,
        float(ordered[min(done - 1, done * 99 // 100)]) * 1e3,
        cpu / done * 1e6,
        (ns1 - ns0) / max(1, count1 - count0) / 1e3,
    )


def not_launches(
    backend: NumpyBackend, n: int
) -> tuple[Callable[[], object], Callable[[], object]]:
    """N BIT_NOTs of 16 UINT8 as N launches, and as one over the N inputs concatenated."""
    xs = [np.full(16, i, np.uint8) for i in range(n)]
    outs = [np.empty(16, np.uint8) for _ in range(n)]

    def separate() -> None:
        for x, out in zip(xs, outs, strict=True):
            call = validate_arrays(NOT, {"InputTensor": x}, None)
            run_call(backend, call, [x], out)

    def merged() -> None:
        x = np.concatenate(xs)
        call = validate_arrays(NOT, {"InputTensor": x}, None)
        z = run_call(backend, call, [x])
        for i, out in enumerate(outs):
            np.copyto(out, z[i * 16 : (i + 1) * 16])

    merged()
    if not all(np.array_equal(out, ~x) for x, out in zip(xs, outs, strict=True)):
        raise RuntimeError("merged BIT_NOT answered wrong")
    return separate, merged


def graph_launches(
    backend: NumpyBackend, n: int
) -> tuple[Callable[[], object], Callable[[], object]]:
    """N runs of the masked graph on [4, 4] UINT8 (planned, from the server's plan cache, and
    run, as a request is), and one over the N inputs concatenated along the rows (its plan
    cached too: the best case, a batch of the same size every time)."""
    graph = OnnxGraph(read_onnx(MASKED_FILE.read_bytes()))
    xs = [np.full((4, 4), i, np.uint8) for i in range(n)]
    outs = [np.empty((4, 4), np.uint8) for _ in range(n)]

    def separate() -> None:
        for x, out in zip(xs, outs, strict=True):
            graph.run(graph.plan({"x": x.shape}), backend, {"x": x}, {"z": out})

    def merged() -> None:
        x = np.concatenate(xs)
        z = np.empty(x.shape, np.uint8)
        graph.run(graph.plan({"x": x.shape}), backend, {"x": x}, {"z": z})
        for i, out in enumerate(outs):
            np.copyto(out, z[i * 4 : (i + 1) * 4])

    merged()
    if not all(np.array_equal(out, x & MASK) for x, out in zip(xs, outs, strict=True)):
        raise RuntimeError("merged graph answered wrong")
    return separate, merged


def saving_us(
    launches: tuple[Callable[[], object], Callable[[], object]], n: int, rounds: int
) -> tuple[float, float, float]:
    """(N launches, one merged launch, the saving per request), microseconds."""
    separate, merged = launches
    calls = max(20, 4000 // n)
    many, one = float("inf"), float("inf")
    for _ in range(rounds):  # interleaved: drift hits both alike
        many = min(many, best_per_call(separate, 1, calls))
        one = min(one, best_per_call(merged, 1, calls))
    return many * 1e6, one * 1e6, (many - one) / n * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="each load run's length")
    parser.add_argument("--clients", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--rounds", type=int, default=7, help="in-process rounds, best kept")
    args = parser.parse_args(argv)

    x16 = np.arange(16, dtype=np.uint8)
    x44 = np.arange(16, dtype=np.uint8).reshape(4, 4)
    loads: list[Load] = []
    with server() as (port, pid):
        requests = {
            NOT: (http_request(port, NOT, {"InputTensor": x16}, "OutputTensor"), ~x16),
            MASKED: (http_request(port, MASKED, {"x": x44}, "z"), x44 & MASK),
        }
        for clients in args.clients:
            for model, (request, answer) in requests.items():
                loads.append(
                    load(port, pid, model, request, answer.tobytes(), clients, args.seconds)
                )

    backend = NumpyBackend(1)
    savings: dict[tuple[str, int], tuple[float, float, float]] = {}
    for n in args.clients:
        savings[NOT, n] = saving_us(not_launches(backend, n), n, args.rounds)
        savings[MASKED, n] = saving_us(graph_launches(backend, n), n, args.rounds)
    backend.close()

    print("HTTP, v2 binary, 16 elements, one server process (NumPy backend):")
    print(
        "| model | clients | req/s | p50 ms | p99 ms | server CPU µs/request | compute_infer µs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in loads:
        print(
            f"| {short(r.model)} | {r.clients} | {r.rps:,.0f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} "
            f"| {r.cpu_us:.0f} | {r.compute_us:.1f} |"
        )
    print()
    print("In process: N requests' compute as N launches against one merged launch:")
    print("| model | N | N launches µs | one launch µs | saved µs/request | / server CPU |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in loads:
        many, one, saved = savings[r.model, r.clients]
        print(
            f"| {short(r.model)} | {r.clients} | {many:.1f} | {one:.1f} | {saved:.2f} "
            f"| {saved / r.cpu_us:.1%} |"
        )
    return 0


def short(model: str) -> str:
    return "BIT_NOT" if model == NOT else model


if __name__ == "__main__":
    sys.exit(main())
