"""Ways to serve gRPC from Python, measured on minimal servers (not the product).

Each configuration is a standalone server in a process of its own, on a free 127.0.0.1 port,
answering ``/inference.GRPCInferenceService/ModelInfer`` with a BIT_NOT of its raw UINT8
contents (a hand parse of the request, no copy of the tensor; one ``ModelInferResponse`` with
``raw_output_contents`` built in place and handed to grpcio as ``bytes``), an empty
``ServerLive`` (the probe), ``/bench.Options/Discard`` (takes a message, answers ``b""``: the
cost of receiving it) and ``/bench.Options/Whoami`` (the serving pid and the last handler's
time, as JSON):

* ``aio-unary``: grpc.aio server, generic unary-unary handler on raw bytes;
* ``aio-stream``: grpc.aio server, stream-unary handler (the product's way: the one message is
  read under ``asyncio.timeout``, the read deadline);
* ``sync``: grpcio's synchronous server, ``grpc.server`` with a ThreadPoolExecutor
  (``--threads``), generic unary-unary handler on raw bytes;
* ``sync-x2``: ``sync`` in 2 processes on one port (``grpc.so_reuseport=1``): the kernel spreads
  connections over them.

The aio servers run the handler of a message over 1 MiB in a thread (``asyncio.to_thread``), off
the event loop; small ones on it.

Measured in one run, every comparison interleaved (rounds in rotated order), all servers up
together, one measured at a time:

1. small calls (16 elements): ``bench.harness.grpc_load``'s aio driver (``--streams`` over
   ``--channels``, ``--seconds`` a round, after a 0.5 s warm-up), requests/s and the server's
   CPU seconds per call (``/proc/<pid>/stat`` utime + stime of its processes, before and after);
   medians over ``--rounds``;
2. 64 MiB calls: the median of ``--big-calls`` round trips on a warm channel;
3. the serving stall while a 250 MiB message arrives (to ModelInfer, then to Discard): another
   process calls ServerLive every 5 ms on a connection of its own (for sync-x2, once to the
   process serving the big call and once to the other); the latencies of the probes that
   overlap the 250 MiB call, median and each call's max (and the probes' median before it).

    .venv/bin/python bench/grpc_server_options.py               # about 2-3 minutes
    .venv/bin/python bench/grpc_server_options.py --rounds 1 --seconds 2 --configs aio-stream,sync
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.grpc_load import (
    CHANNEL_OPTIONS,
    MAX_MESSAGE_BYTES,
    Load,
    _aio,
    model_infer_request,
)

SERVICE = "inference.GRPCInferenceService"
INFER = f"/{SERVICE}/ModelInfer"
LIVE = f"/{SERVICE}/ServerLive"
WHOAMI = "/bench.Options/Whoami"
DISCARD = "/bench.Options/Discard"
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
CONFIGS = ("aio-unary", "aio-stream", "sync", "sync-x2")
REFERENCE = "aio-stream"  # the product's configuration
OFF_LOOP_BYTES = 1 << 20  # aio: a handler for a message over this runs in a thread
READ_TIMEOUT_S = 30.0
PROBE_INTERVAL_S = 0.005
TICK = 1 / os.sysconf("SC_CLK_TCK")


# --- the servers --------------------------------------------------------------------------------


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class Handler:
    """BIT_NOT on a ``ModelInferRequest``'s first raw input: the tensor is a view of the
    message, and the NOT is written straight into the answer's buffer (one copy, ``tobytes``)."""

    def __init__(self) -> None:
        self.last_s = 0.0

    def __call__(self, data: bytes) -> bytes:
        began = time.perf_counter()
        buf = memoryview(data)
        model, request_id, inputs, raw = b"", b"", [], None
        pos = 0
        while pos < len(buf):
            key, pos = _varint(buf, pos)
            number, wire = key >> 3, key & 7
            if wire == 0:
                _, pos = _varint(buf, pos)
                continue
            if wire == 1 or wire == 5:
                pos += 8 if wire == 1 else 4
                continue
            if wire != 2:
                raise ValueError(f"wire type {wire}")
            size, pos = _varint(buf, pos)
            value = buf[pos : pos + size]
            pos += size
            if number == 1:
                model = bytes(value)
            elif number == 3:
                request_id = bytes(value)
            elif number == 5:
                inputs.append(bytes(value))
            elif number == 7 and raw is None:
                raw = value
        if raw is None or not inputs:
            raise ValueError("no raw input")
        tensor = service_pb2.ModelInferRequest.InferInputTensor.FromString(inputs[0])
        answer = service_pb2.ModelInferResponse(model_name=model.decode(), id=request_id.decode())
        answer.outputs.add(name="OutputTensor", datatype="UINT8", shape=tensor.shape)
        head = answer.SerializeToString() + b"\x32" + _encode_varint(len(raw))
        out = np.empty(len(head) + len(raw), np.uint8)
        out[: len(head)] = np.frombuffer(head, np.uint8)
        np.bitwise_not(np.frombuffer(raw, np.uint8), out=out[len(head) :])
        result = out.tobytes()
        self.last_s = time.perf_counter() - began
        return result


def _server_options(reuseport: bool) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.so_reuseport", int(reuseport)),
    ]


def _whoami(handler: Handler) -> bytes:
    return json.dumps({"pid": os.getpid(), "handler_s": handler.last_s}).encode()


def _announce(port: int) -> None:
    print(f"PORT {port}", flush=True)


async def _serve_aio(port: int, stream: bool) -> None:
    handler = Handler()

    async def answer(data: bytes) -> bytes:
        if len(data) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(handler, data)
        return handler(data)

    async def infer_unary(data: bytes, context: object) -> bytes:
        return await answer(data)

    async def infer_stream(requests: AsyncIterator[bytes], context: object) -> bytes:
        async with asyncio.timeout(READ_TIMEOUT_S):
            data = await anext(requests)
        return await answer(data)

    async def live(data: bytes, context: object) -> bytes:
        return b""

    async def whoami(data: bytes, context: object) -> bytes:
        return _whoami(handler)

    async def discard_unary(data: bytes, context: object) -> bytes:
        return b""

    async def discard_stream(requests: AsyncIterator[bytes], context: object) -> bytes:
        async with asyncio.timeout(READ_TIMEOUT_S):
            await anext(requests)
        return b""

    infer: grpc.RpcMethodHandler[bytes, bytes] = (
        grpc.stream_unary_rpc_method_handler(infer_stream)
        if stream
        else grpc.unary_unary_rpc_method_handler(infer_unary)
    )
    server = grpc.aio.server(options=_server_options(False))
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {"ModelInfer": infer, "ServerLive": grpc.unary_unary_rpc_method_handler(live)},
            ),
            grpc.method_handlers_generic_handler(
                "bench.Options",
                {
                    "Whoami": grpc.unary_unary_rpc_method_handler(whoami),
                    "Discard": grpc.stream_unary_rpc_method_handler(discard_stream)
                    if stream
                    else grpc.unary_unary_rpc_method_handler(discard_unary),
                },
            ),
        )
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    _announce(bound)
    await server.wait_for_termination()


def _serve_sync(port: int, threads: int, reuseport: bool) -> None:
    handler = Handler()
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads), options=_server_options(reuseport)
    )
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                SERVICE,
                {
                    "ModelInfer": grpc.unary_unary_rpc_method_handler(lambda d, c: handler(d)),
                    "ServerLive": grpc.unary_unary_rpc_method_handler(lambda d, c: b""),
                },
            ),
            grpc.method_handlers_generic_handler(
                "bench.Options",
                {
                    "Whoami": grpc.unary_unary_rpc_method_handler(lambda d, c: _whoami(handler)),
                    "Discard": grpc.unary_unary_rpc_method_handler(lambda d, c: b""),
                },
            ),
        )
    )
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    _announce(bound)
    server.wait_for_termination()


@dataclass
class Server:
    config: str
    procs: list[subprocess.Popen[str]] = field(default_factory=list)
    port: int = 0

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu(self) -> float:
        total = 0.0
        for proc in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK
        return total

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


def start(config: str, threads: int) -> Server:
    server = Server(config)
    mode = "sync" if config.startswith("sync") else config
    for _ in range(2 if config == "sync-x2" else 1):
        argv = [sys.executable, __file__, "--serve", mode, "--port", str(server.port)]
        argv += ["--threads", str(threads)] + (["--reuseport"] if config == "sync-x2" else [])
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        server.procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            server.stop()
            raise RuntimeError(f"{config}: the server did not start ({line!r})")
        server.port = int(line.split()[1])
    return server


# --- the probe process --------------------------------------------------------------------------


def _connect(target: str, want: str, big_pid: int) -> tuple[grpc.Channel, int]:
    """A connection of its own (no shared subchannel) to the process ``want`` asks for: "same"
    (the one serving the big call), "other" (not that one) or "any"."""
    for _ in range(64):
        channel = grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        who: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            WHOAMI, request_serializer=None, response_deserializer=None
        )
        pid = int(json.loads(who(b"", timeout=30, wait_for_ready=True))["pid"])
        if want == "any" or (pid == big_pid) == (want == "same"):
            return channel, pid
        channel.close()
    raise RuntimeError(f"no connection to the {want} process in 64 tries")


def probe(target: str, want: str, big_pid: int) -> None:
    """ServerLive every 5 ms until stdin closes; prints the probed pid, then (at the end) one JSON
    list of [start, latency] (CLOCK_MONOTONIC seconds, comparable between processes)."""
    channel, pid = _connect(target, want, big_pid)
    live: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
        LIVE, request_serializer=None, response_deserializer=None
    )
    samples: list[tuple[float, float]] = []
    done = threading.Event()

    def loop() -> None:
        while not done.is_set():
            began = time.monotonic()
            live(b"", timeout=30)
            samples.append((began, time.monotonic() - began))
            time.sleep(max(0.0, began + PROBE_INTERVAL_S - time.monotonic()))

    thread = threading.Thread(target=loop)
    thread.start()
    print(f"READY {pid}", flush=True)
    sys.stdin.read()
    done.set()
    thread.join()
    channel.close()
    print(json.dumps(samples), flush=True)


# --- the measurements ---------------------------------------------------------------------------


@dataclass
class Stall:
    call_s: list[float] = field(default_factory=list)
    handler_s: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)  # probe latencies before the big call
    during: list[float] = field(default_factory=list)  # those overlapping it
    maxima: list[float] = field(default_factory=list)  # the largest of each call


@dataclass
class Row:
    config: str
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)
    big_s: list[float] = field(default_factory=list)
    stalls: dict[str, Stall] = field(default_factory=dict)  # by "method, probed process"

    def stall(self, key: str) -> Stall:
        return self.stalls.setdefault(key, Stall())


def small_round(
    server: Server, body: bytes, streams: int, channels: int, seconds: float
) -> tuple[float, float, float]:
    asyncio.run(_aio(Load(server.target, body, streams, channels, 0.5, 0.0)))  # warm-up
    before = server.cpu()
    result = asyncio.run(_aio(Load(server.target, body, streams, channels, seconds, 0.0)))
    spent = server.cpu() - before
    if result.failures:
        raise RuntimeError(f"{server.config}: failed calls {result.failures}")
    return result.rate, spent / result.requests * 1e6, result.p50_ms


def raw_call(channel: grpc.Channel, method: str) -> Callable[..., bytes]:
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def check(answer: bytes, sent: np.ndarray) -> None:
    got = service_pb2.ModelInferResponse.FromString(answer).raw_output_contents[0]
    if not np.array_equal(np.frombuffer(got, np.uint8), np.bitwise_not(sent)):
        raise RuntimeError("wrong answer")


def stall(
    server: Server, channel: grpc.Channel, body: bytes, method: str, want: str, row: Row
) -> None:
    """One 250 MiB call to ``method`` while another process probes the server."""
    call, who = raw_call(channel, method), raw_call(channel, WHOAMI)
    big_pid = json.loads(who(b"", timeout=30))["pid"]
    argv = [sys.executable, __file__, "--probe", server.target, "--want", want]
    argv += ["--big-pid", str(big_pid)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdout.readline()  # READY
    time.sleep(0.5)
    began = time.monotonic()
    answer = call(body, timeout=120)
    ended = time.monotonic()
    time.sleep(0.3)
    proc.stdin.close()
    samples = json.loads(proc.stdout.readline())
    proc.wait(timeout=30)
    if method == INFER and len(answer) < len(body) - 1024:
        raise RuntimeError(f"{server.config}: short answer")
    name = "ModelInfer" if method == INFER else "Discard"
    result = row.stall(f"{name}, probes on {'the serving' if want != 'other' else 'the other'}")
    result.call_s.append(ended - began)
    if method == INFER:
        result.handler_s.append(json.loads(who(b"", timeout=30))["handler_s"])
    during = [lat for start, lat in samples if start < ended and start + lat > began]
    result.during += during
    result.maxima.append(max(during, default=float("nan")))
    result.before += [lat for start, lat in samples if start + lat <= began]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated")
    parser.add_argument("--threads", type=int, default=8, help="sync servers' pool (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="small-call rounds (default 3)")
    parser.add_argument("--seconds", type=float, default=4.0, help="a small round (default 4)")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--channels", type=int, default=2)
    parser.add_argument("--big-calls", type=int, default=5, help="64 MiB calls (default 5)")
    parser.add_argument("--stall-calls", type=int, default=3, help="250 MiB calls (default 3)")
    parser.add_argument(
        "--hugetlb", action="store_true", help="servers under GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
    )
    hidden = argparse.SUPPRESS
    parser.add_argument("--serve", choices=("aio-unary", "aio-stream", "sync"), help=hidden)
    parser.add_argument("--port", type=int, default=0, help=hidden)
    parser.add_argument("--reuseport", action="store_true", help=hidden)
    parser.add_argument("--probe", metavar="TARGET", help=hidden)
    parser.add_argument("--want", default="any", help=hidden)
    parser.add_argument("--big-pid", type=int, default=0, help=hidden)
    args = parser.parse_args(argv)
    if args.serve in ("aio-unary", "aio-stream"):
        asyncio.run(_serve_aio(args.port, args.serve == "aio-stream"))
        return 0
    if args.serve == "sync":
        _serve_sync(args.port, args.threads, args.reuseport)
        return 0
    if args.probe:
        probe(args.probe, args.want, args.big_pid)
        return 0

    configs = args.configs.split(",")
    if unknown := set(configs) - set(CONFIGS):
        parser.error(f"--configs: unknown {sorted(unknown)}")
    if args.hugetlb:
        os.environ["GLIBC_TUNABLES"] = "glibc.malloc.hugetlb=1"  # the servers inherit it
    print(
        f"# nproc {os.cpu_count()}, loadavg before {loadavg()}, python "
        f"{platform.python_version()}, grpcio {grpc.__version__}, sync pool {args.threads} "
        f"threads, servers' GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r}",
        flush=True,
    )
    small = model_infer_request(NOT, {"InputTensor": np.arange(16, dtype=np.uint8)})
    handler, n = Handler(), 20000
    t = time.perf_counter()
    for _ in range(n):
        handler(small)
    print(f"# the handler alone, on a small call: {(time.perf_counter() - t) / n * 1e6:.1f} us")
    big_in = np.arange(64 << 20, dtype=np.uint64).astype(np.uint8)
    big = model_infer_request(NOT, {"InputTensor": big_in})
    huge = model_infer_request(NOT, {"InputTensor": np.zeros(250 << 20, np.uint8)})
    servers: dict[str, Server] = {}
    channels: dict[str, grpc.Channel] = {}
    rows = {config: Row(config) for config in configs}
    began = time.monotonic()
    try:
        for config in configs:
            servers[config] = start(config, args.threads)
            channels[config] = grpc.insecure_channel(
                servers[config].target, options=CHANNEL_OPTIONS
            )
            check(raw_call(channels[config], INFER)(big, timeout=120, wait_for_ready=True), big_in)
        for r in range(args.rounds):
            for config in configs[r % len(configs) :] + configs[: r % len(configs)]:
                rate, cpu_us, p50 = small_round(
                    servers[config], small, args.streams, args.channels, args.seconds
                )
                rows[config].rates.append(rate)
                rows[config].cpu_us.append(cpu_us)
                rows[config].p50_ms.append(p50)
                print(f"small {config}: {rate:,.0f} req/s, {cpu_us:.0f} us/call", flush=True)
        for i in range(args.big_calls):
            for config in configs[i % len(configs) :] + configs[: i % len(configs)]:
                t = time.perf_counter()
                raw_call(channels[config], INFER)(big, timeout=120)
                rows[config].big_s.append(time.perf_counter() - t)
        for i in range(args.stall_calls):
            for config in configs[i % len(configs) :] + configs[: i % len(configs)]:
                wants = ("same", "other") if config == "sync-x2" else ("any",)
                for method in (INFER, DISCARD):
                    for want in wants:
                        stall(servers[config], channels[config], huge, method, want, rows[config])
                print(f"250 MiB {config}: done", flush=True)
    finally:
        for channel in channels.values():
            channel.close()
        for server in servers.values():
            server.stop()
    print(f"# {time.monotonic() - began:.0f} s; loadavg after {loadavg()}\n")
    report(rows, args)
    return 0


def report(rows: dict[str, Row], args: argparse.Namespace) -> None:
    ref = rows.get(REFERENCE)

    def ratio(value: float, of: float) -> str:
        return f"{value / of:.2f}" if ref is not None else "-"

    print("| Configuration | small req/s | server CPU us/call | small p50 ms | 64 MiB median ms |")
    print("|---|---|---|---|---|")
    for row in rows.values():
        print(
            f"| {row.config} | {median(row.rates):,.0f} | {median(row.cpu_us):.0f} "
            f"| {median(row.p50_ms):.2f} | {median(row.big_s) * 1e3:.0f} |"
        )
    print(
        "\n| Configuration | 250 MiB call to | call s | handler s | probes before: median ms "
        "| probes during: median ms | max ms (each call) |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in rows.values():
        for key, s in row.stalls.items():
            print(
                f"| {row.config} | {key} | {median(s.call_s):.2f} "
                f"| {median(s.handler_s) if s.handler_s else float('nan'):.2f} "
                f"| {median(s.before) * 1e3:.1f} | {median(s.during) * 1e3:.1f} "
                f"| {' / '.join(f'{m * 1e3:.0f}' for m in s.maxima)} |"
            )
    if ref is None:
        return
    print(f"\nRatios against {REFERENCE} (same run):\n")
    print(
        "| Configuration | req/s | server CPU/call | 64 MiB time "
        "| probe max, ModelInfer | probe max, Discard |"
    )
    print("|---|---|---|---|---|---|")

    def worst(row: Row, name: str, where: str = "the serving") -> float:
        stalls = row.stalls.get(f"{name}, probes on {where}")
        return median(stalls.maxima) if stalls else float("nan")

    for row in rows.values():
        for where in ("the serving", "the other") if row.config == "sync-x2" else ("the serving",):
            label = row.config + (f" (probes on {where})" if row.config == "sync-x2" else "")
            print(
                f"| {label} | {ratio(median(row.rates), median(ref.rates))} "
                f"| {ratio(median(row.cpu_us), median(ref.cpu_us))} "
                f"| {ratio(median(row.big_s), median(ref.big_s))} "
                f"| {ratio(worst(row, 'ModelInfer', where), worst(ref, 'ModelInfer'))} "
                f"| {ratio(worst(row, 'Discard', where), worst(ref, 'Discard'))} |"
            )
    print(
        f"\n{args.rounds} small rounds of {args.seconds:g} s ({args.streams} streams over "
        f"{args.channels} connections, bench.harness.grpc_load's aio driver), medians; "
        f"{args.big_calls} 64 MiB calls, {args.stall_calls} 250 MiB calls per configuration "
        "and method; probe maxima: the median of the calls' maxima."
    )


if __name__ == "__main__":
    sys.exit(main())
