"""Bounded load test of ``tensorbits serve`` on loopback.

Starts the real server (NumPy backend) on a free 127.0.0.1 port, runs N concurrent asyncio
clients (httpx.AsyncClient) for a fixed time and at most a fixed count of requests, each sending a
mix of valid large, valid small and invalid /v2 infer requests. Every valid request carries its
own random data (seeded by its sequence number), so an answer sent to the wrong request, or
corrupted, is caught: each 200 is checked byte for byte against NumPy.

Reports: requests served, answers by status, p50/p99 latency by kind, the server's peak RSS
(VmHWM from /proc/<pid>/status) and its baseline after warm-up, and checks:

* every 200 was correct;
* no answer was a 5xx other than 503 with Retry-After (load shedding by admission);
* every invalid request got a 4xx with a JSON ``error``;
* peak RSS <= TENSORBITS_MAX_INFLIGHT_BYTES + the fixed overhead (``--overhead-mib``, default
  256 MiB: interpreter, NumPy, the baseline RSS, plus request bodies still being uploaded, which
  the server buffers before admission counts them).

    .venv/bin/python bench/load.py                      # 20 s, 16 clients
    .venv/bin/python bench/load.py --duration 5 --clients 4 --max-requests 500

Exit status 0 when every check holds, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
HEADER = "Inference-Header-Content-Length"
MODEL = "onnx.BitwiseXor-18"
MiB = 1 << 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def vm(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key}")


def start_server(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "tensorbits"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2):
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("server not ready in 60 s")


# --- requests ---------------------------------------------------------------------------------


def valid_request(seq: int, nbytes: int) -> tuple[bytes, dict[str, str], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seq)
    a = np.frombuffer(rng.bytes(nbytes), np.uint8)
    b = np.frombuffer(rng.bytes(nbytes), np.uint8)
    header = {
        "id": str(seq),
        "inputs": [
            {
                "name": n,
                "shape": [nbytes],
                "datatype": "UINT8",
                "parameters": {"binary_data_size": nbytes},
            }
            for n in ("A", "B")
        ],
        "parameters": {"binary_data_output": True},
    }
    head = json.dumps(header).encode()
    return head + a.tobytes() + b.tobytes(), {HEADER: str(len(head))}, a ^ b


INVALID: list[tuple[str, bytes, dict[str, str]]] = [
    ("bad_header_length", b'{"inputs": []}', {HEADER: "-5"}),
    ("header_past_body", b'{"inputs": []}', {HEADER: "999999"}),
    ("garbage_json", b"\x00\xff{not json", {"Content-Type": "application/json"}),
    (
        "size_mismatch",
        json.dumps(
            {
                "inputs": [
                    {
                        "name": "A",
                        "shape": [4],
                        "datatype": "UINT8",
                        "parameters": {"binary_data_size": 5},
                    },
                    {
                        "name": "B",
                        "shape": [4],
                        "datatype": "UINT8",
                        "parameters": {"binary_data_size": 4},
                    },
                ]
            }
        ).encode()
        + bytes(9),
        {},
    ),
    (
        "huge_shape",
        json.dumps(
            {"inputs": [{"name": "A", "shape": [2**40, 2**40], "datatype": "UINT8", "data": []}]}
        ).encode(),
        {},
    ),
    ("gzip_garbage", b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}),
]


@dataclass
class Stats:
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    wrong: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)
    transport_errors: Counter[str] = field(default_factory=Counter)
    served: int = 0


async def client_loop(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    deadline: float,
    counter: list[int],
    stats: Stats,
) -> None:
    rnd = random.Random()
    while time.monotonic() < deadline and counter[0] < args.max_requests:
        counter[0] += 1
        seq = counter[0]
        roll = rnd.random()
        expected: np.ndarray[Any, Any] | None = None
        if roll < args.large_share:
            kind = "large"
            body, headers, expected = valid_request(seq, args.large_mib * MiB)
        elif roll < args.large_share + args.invalid_share:
            kind, body, headers = rnd.choice(INVALID)
            kind = "invalid:" + kind
        else:
            kind = "small"
            body, headers, expected = valid_request(seq, args.small_bytes)
        start = time.monotonic()
        try:
            response = await client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
        except httpx.HTTPError as exc:
            stats.transport_errors[type(exc).__name__] += 1
            continue
        elapsed = time.monotonic() - start
        group = kind.split(":")[0]
        stats.statuses[(group, response.status_code)] += 1
        stats.latencies[group].append(elapsed)
        status = response.status_code
        if status == 200 and expected is not None:
            stats.served += 1
            offset = int(response.headers[HEADER])
            document = json.loads(response.content[:offset])
            got = np.frombuffer(response.content, np.uint8, offset=offset)
            if document.get("id") != str(seq) or not np.array_equal(got, expected):
                stats.wrong.append(f"request {seq} ({kind}): wrong answer")
        elif status == 503 and expected is not None and "retry-after" in response.headers:
            pass  # shed by admission: the client would retry
        elif group == "invalid" and 400 <= status < 500:
            stats.served += 1
            try:
                ok = isinstance(response.json().get("error"), str)
            except ValueError:
                ok = False
            if not ok:
                stats.bad_errors.append(f"{kind}: {status} without a JSON error")
        else:
            stats.bad_errors.append(f"{kind}: unexpected {status}: {response.text[:200]}")


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


async def run_load(port: int, args: argparse.Namespace, stats: Stats) -> float:
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    timeout = httpx.Timeout(60.0)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=timeout
    ) as client:
        start = time.monotonic()
        deadline = start + args.duration
        counter = [0]
        await asyncio.gather(
            *(client_loop(client, args, deadline, counter, stats) for _ in range(args.clients))
        )
        return time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=20.0, help="seconds (default 20)")
    parser.add_argument("--max-requests", type=int, default=100_000, help="stop after this many")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients (default 16)")
    parser.add_argument(
        "--large-mib", type=int, default=8, help="MiB of each input of a large request"
    )
    parser.add_argument("--small-bytes", type=int, default=4096)
    parser.add_argument("--large-share", type=float, default=0.2)
    parser.add_argument("--invalid-share", type=float, default=0.2)
    parser.add_argument(
        "--max-inflight-mib", type=int, default=128, help="TENSORBITS_MAX_INFLIGHT_BYTES"
    )
    parser.add_argument("--max-body-mib", type=int, default=32, help="TENSORBITS_MAX_BODY_BYTES")
    parser.add_argument(
        "--overhead-mib", type=int, default=256, help="allowed RSS above the in-flight bound"
    )
    args = parser.parse_args(argv)
    if args.duration > 600 or args.clients > 256:
        parser.error("bounded: --duration <= 600, --clients <= 256")

    inflight = args.max_inflight_mib * MiB
    env = {
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(inflight),
        "TENSORBITS_MAX_BODY_BYTES": str(args.max_body_mib * MiB),
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": "64",
    }
    port = free_port()
    proc = start_server(port, env)
    stats = Stats()
    try:
        warm = Stats()
        asyncio.run(
            run_load(
                port,
                argparse.Namespace(
                    **{**vars(args), "duration": 0.5, "clients": 1, "max_requests": 5}
                ),
                warm,
            )
        )
        baseline = vm(proc.pid, "VmRSS")
        elapsed = asyncio.run(run_load(port, args, stats))
        peak = vm(proc.pid, "VmHWM")
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()

    total = sum(stats.statuses.values())
    print(
        f"tensorbits load test: {args.clients} clients, {elapsed:.1f} s, model {MODEL}, "
        f"large {args.large_mib} MiB x2 inputs ({args.large_share:.0%}), small {args.small_bytes} B, "
        f"invalid {args.invalid_share:.0%}"
    )
    print(
        f"limits: max_inflight_bytes {args.max_inflight_mib} MiB, max_body_bytes {args.max_body_mib} MiB"
    )
    print(
        f"answers: {total} ({total / elapsed:.0f}/s); served (200 or expected 4xx): {stats.served}"
    )
    for (group, status), count in sorted(stats.statuses.items()):
        print(f"  {group:<8} {status}: {count}")
    if stats.transport_errors:
        print(f"  transport errors: {dict(stats.transport_errors)}")
    for group, values in sorted(stats.latencies.items()):
        print(
            f"latency {group:<8} p50 {pct(values, 50):8.1f} ms  p99 {pct(values, 99):8.1f} ms  (n={len(values)})"
        )
    bound = inflight + args.overhead_mib * MiB
    print(
        f"server RSS: baseline {baseline / MiB:.0f} MiB, peak (VmHWM) {peak / MiB:.0f} MiB, "
        f"bound {bound / MiB:.0f} MiB (in-flight {args.max_inflight_mib} + overhead {args.overhead_mib})"
    )
    print(f"server exit code after SIGTERM: {code}")
    checks = {
        "every 200 correct": not stats.wrong,
        "no 5xx but 503+Retry-After; invalid got 4xx JSON": not stats.bad_errors,
        "no transport errors": not stats.transport_errors,
        "server alive through the run": alive,
        "peak RSS within bound": peak <= bound,
        "clean exit": code in (0, -signal.SIGTERM),
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    for line in (stats.wrong + stats.bad_errors)[:10]:
        print("   ", line)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
