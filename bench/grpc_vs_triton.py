"""gRPC against HTTP, and tensorbits against a real Triton Inference Server, in one run.

Starts ``tensorbits serve`` (NumPy backend, HTTP and gRPC on free 127.0.0.1 ports) and the Triton
peer (``bench/peers.py``: Triton 2.51's own C++ front ends, Python-backend models doing the
same NumPy call, installed on demand outside the project's lock), then:

  (small) requests/s of a 16-element UINT8 BIT_NOT, the same request on both servers:
          HTTP with wrk (v2 binary body from a Lua script, keep-alive, ``--connections``, one
          thread); gRPC with bench/harness/grpc_load.py (one pre-serialized ModelInfer, ``--streams``
          calls in flight on ``--channels`` connections), driven by h2load (C) when installed
          and by grpc.aio (Python). ``--rounds`` rounds, each running every contestant once in
          an order rotated every round; the table shows each one's median rate, p50/p99 and
          the server's and the client's CPU time per request, and each ratio is the median of
          its per-round ratios. CPU per request is the figure least moved by the other work on
          a shared machine. Beside them, gRPC only, two bare grpc.aio servers
          (bench/harness/baselines.py, unary-unary and stream-unary): grpcio's own floor.
  (large) a 64 MiB BIT_NOT round trip (64 MiB in, 64 MiB out), best of ``--repeat`` interleaved
          rounds: HTTP v2 binary through a plain-socket client (bench.harness.PlainClient),
          gRPC as one pre-serialized ModelInfer with raw contents (the answer's tail checked,
          not parsed), on both servers; with the least server CPU time of the rounds.

When the Triton peer cannot be installed or started, says why and measures tensorbits alone.
Loopback only, bounded (about 3 minutes with the defaults). Usage:

  .venv/bin/python bench/grpc_vs_triton.py [--rounds N] [--seconds S] [--repeat N] [--parts small,large]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BIN, PlainClient, free_port, interleaved_best, note, wait_until_up
from bench.harness.grpc_load import (
    CHANNEL_OPTIONS,
    add_load_options,
    model_infer_request,
    raw_model_infer,
)
from bench.http_service import (
    WRK_SCRIPT,
    _service_call,
    lua_string,
    v2_binary_request,
    wrk_latency_ms,
)
from bench.peers import PeerUnavailable, TritonPeer, stop_on_signals, triton_peer

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
PATH = f"/v2/models/{NOT}/infer"
SMALL = np.arange(16, dtype=np.uint8)
LARGE_MIB = 64


@dataclass(frozen=True)
class Endpoints:
    """One server's two front ends: an HTTP port and a gRPC ``host:port``."""

    server: str
    http_port: int | None  # None: gRPC only (the bare grpc.aio servers)
    grpc_target: str
    pid: int  # the server's process; its CPU time is read with its children's (tree_cpu)


@dataclass(frozen=True)
class Rate:
    rps: float
    p50_ms: float
    p99_ms: float
    server_us: float  # the server's CPU time per request answered (all its processes)
    client_us: float  # the load generator's CPU time per request


TICK = 1 / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants: tritonserver's Python
    backend runs each model in a stub process of its own, whose work is the server's too."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):  # a process may end while we read
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK  # utime, stime
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
    return total


def children_cpu() -> float:
    """CPU seconds of this process's waited-for children (wrk, the gRPC load generator)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- small requests ---------------------------------------------------------------------------


def wrk_small(server: Endpoints, seconds: float, connections: int) -> Rate:
    """wrk (one thread) posting the 16-element v2 binary BIT_NOT for ``seconds``."""
    assert server.http_port is not None
    head, parts = v2_binary_request({"InputTensor": SMALL}, "OutputTensor")
    script = WRK_SCRIPT.format(
        method="POST",
        body=lua_string(b"".join(bytes(p) for p in parts)),
        headers=f'wrk.headers["Inference-Header-Content-Length"] = "{len(head)}"',
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as f:
        f.write(script)
        f.flush()
        server_cpu, client_cpu = tree_cpu(server.pid), children_cpu()
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "-s", f.name,
             f"http://127.0.0.1:{server.http_port}{PATH}"],
            capture_output=True, text=True, check=True, timeout=seconds + 30,
        ).stdout  # fmt: skip
        server_cpu, client_cpu = tree_cpu(server.pid) - server_cpu, children_cpu() - client_cpu
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", out)
    if failed:
        raise RuntimeError(f"wrk against {server.server}: {failed.group(0)}\n{out}")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if rate is None or count is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    requests = int(count.group(1))
    return Rate(
        float(rate.group(1)), wrk_latency_ms(out, 50), wrk_latency_ms(out, 99),
        server_cpu / requests * 1e6, client_cpu / requests * 1e6,
    )  # fmt: skip


def grpc_small(server: Endpoints, driver: str, seconds: float, streams: int, channels: int) -> Rate:
    """bench.harness.grpc_load with ``driver``, in a process of its own, the same 16-element request.
    Its ``calls_made`` are the successes the server itself counted over the run."""
    argv = [
        sys.executable, "-m", "bench.harness.grpc_load", server.grpc_target, "--json",
        "--driver", driver, "--elements", str(SMALL.size), "--duration", f"{seconds:g}",
        "--streams", str(streams), "--channels", str(channels),
    ]  # fmt: skip
    server_cpu = tree_cpu(server.pid)
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=seconds + 60, check=False, cwd=ROOT
    )
    server_cpu = tree_cpu(server.pid) - server_cpu
    if done.returncode != 0:
        raise RuntimeError(f"gRPC load against {server.server} failed:\n{done.stdout}{done.stderr}")
    result = json.loads(done.stdout)
    return Rate(
        result["requests"] / result["seconds"], result["p50_ms"], result["p99_ms"],
        server_cpu / result["calls_made"] * 1e6, result["client_cpu_s"] / result["requests"] * 1e6,
    )  # fmt: skip


# The small-request contestants on each server: (label, how).
HTTP, H2LOAD, AIO = "HTTP wrk", "gRPC h2load", "gRPC aio"


def small_rounds(
    servers: list[Endpoints], args: argparse.Namespace
) -> dict[tuple[str, str], list[Rate]]:
    """(server, client) -> one Rate per round; the contestants' order rotates every round, so
    that none always runs first (or right after the same neighbour) on a shared machine."""
    contestants: list[tuple[tuple[str, str], Callable[[], Rate]]] = []
    grpc_run = (args.seconds, args.streams, args.channels)
    for s in servers:
        if s.http_port is not None:
            contestants.append(
                ((s.server, HTTP), functools.partial(wrk_small, s, args.seconds, args.connections))
            )
        if args.h2load:
            contestants.append(
                ((s.server, H2LOAD), functools.partial(grpc_small, s, "h2load", *grpc_run))
            )
        if s.http_port is not None or not args.h2load:  # the bare servers: one driver is enough
            contestants.append(
                ((s.server, AIO), functools.partial(grpc_small, s, "aio", *grpc_run))
            )
    rates: dict[tuple[str, str], list[Rate]] = {key: [] for key, _ in contestants}
    for round_ in range(args.rounds):
        shift = round_ % len(contestants)
        for key, measure in contestants[shift:] + contestants[:shift]:
            note(f"  round {round_ + 1}/{args.rounds}: {key[0]} {key[1]}")
            rates[key].append(measure())
    return rates


def median_ratio(a: list[Rate], b: list[Rate]) -> float:
    return statistics.median(x.rps / y.rps for x, y in zip(a, b, strict=True))


def print_small(rates: dict[tuple[str, str], list[Rate]], args: argparse.Namespace) -> None:
    print(
        f"\n(small) 16-element UINT8 BIT_NOT, {args.rounds} interleaved rounds of {args.seconds:g} s"
        f" each; {HTTP}: wrk -t1 -c{args.connections}; gRPC: bench.harness.grpc_load, "
        f"{args.streams} calls in flight on {args.channels} connections"
    )
    print(
        f"{'server':<11} {'client':<12} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'server CPU':>10} {'client CPU':>10}  req/s each round"
    )
    for (server, client), runs in rates.items():
        med = {
            field: statistics.median(getattr(r, field) for r in runs)
            for field in ("rps", "p50_ms", "p99_ms", "server_us", "client_us")
        }
        print(
            f"{server:<11} {client:<12} {med['rps']:>7,.0f} {med['p50_ms']:>7.2f} "
            f"{med['p99_ms']:>7.2f} {med['server_us']:>7.0f} us {med['client_us']:>7.0f} us  "
            + " ".join(f"{r.rps:,.0f}" for r in runs)
        )
    print("(medians over the rounds; CPU: CPU time, user + system, per request answered)")
    print("ratios (median of the per-round ratios):")
    tb_http = rates[("tensorbits", HTTP)]
    drivers = [H2LOAD, AIO] if args.h2load else [AIO]
    for driver in drivers:
        print(
            f"  tensorbits {driver} / tensorbits {HTTP}: "
            f"{median_ratio(rates[('tensorbits', driver)], tb_http):.2f}x (target >= 1.0x)"
        )
    if ("Triton", HTTP) in rates:
        for driver in drivers:
            ratio = median_ratio(rates[("tensorbits", driver)], rates[("Triton", driver)])
            print(f"  tensorbits / Triton, {driver}: {ratio:.2f}x (target >= 0.7x)")
        ratio = median_ratio(tb_http, rates[("Triton", HTTP)])
        print(f"  tensorbits / Triton, {HTTP}: {ratio:.2f}x")
    driver = drivers[0]
    for bare in (BARE_UU, BARE_SU):
        if (bare, driver) in rates:
            ratio = median_ratio(rates[("tensorbits", driver)], rates[(bare, driver)])
            print(f"  tensorbits / {bare}, {driver}: {ratio:.2f}x")
    if (BARE_UU, driver) in rates:
        print(
            f"  ({BARE_UU}: a grpc.aio server on uvloop answering a cached response, unary-unary;"
            f" {BARE_SU}: the same as a stream-unary handler, as tensorbits registers ModelInfer)"
        )


# --- 64 MiB round trip ------------------------------------------------------------------------


def grpc_round_trip(
    target: str, body: bytes, expected: np.ndarray
) -> tuple[Callable[[], None], grpc.Channel]:
    """One pre-serialized ModelInfer per call; the answer is checked where its raw output lies
    (raw_output_contents is the response's last field: its bytes end the message), not parsed,
    so the client's share of the time stays a receive."""
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    call = raw_model_infer(channel)
    tail = expected[-4096:].tobytes()

    def once() -> None:
        answer: bytes = call(body, timeout=120, wait_for_ready=True)
        if len(answer) < expected.nbytes or answer[-len(tail) :] != tail:
            raise RuntimeError(f"{target}: wrong answer ({len(answer)} bytes)")

    return once, channel


def with_server_cpu(fn: Callable[[], object], pid: int, spent: list[float]) -> Callable[[], None]:
    """``fn``, appending the server's CPU seconds over each call to ``spent``."""

    def once() -> None:
        before = tree_cpu(pid)
        fn()
        spent.append(tree_cpu(pid) - before)

    return once


def large_round_trips(servers: list[Endpoints], repeat: int) -> dict[str, tuple[float, float]]:
    """name -> (best time, least server CPU time) of the 64 MiB round trip, in seconds."""
    big = np.full(LARGE_MIB * MiB, 0x5A, np.uint8)
    big[-4096:] = np.arange(4096, dtype=np.uint64).astype(np.uint8)  # a tail worth checking
    expected = np.bitwise_not(big)
    head, parts = v2_binary_request({"InputTensor": big}, "OutputTensor")
    body = model_infer_request(NOT, {"InputTensor": big})
    fns: dict[str, Callable[[], object]] = {}
    cpu: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack:
        for s in servers:
            if s.http_port is None:
                continue  # a bare gRPC server: no 64 MiB answer to give
            http = PlainClient(s.http_port)
            stack.callback(http.close)
            once, channel = grpc_round_trip(s.grpc_target, body, expected)
            stack.callback(channel.close)
            calls = {"HTTP": _service_call(http, NOT, parts, head, expected), "gRPC": once}
            for protocol, call in calls.items():
                name = f"{s.server} {protocol}"
                fns[name] = with_server_cpu(call, s.pid, cpu.setdefault(name, []))
        best = interleaved_best(fns, repeat)
    return {name: (best[name], min(cpu[name])) for name in fns}


def print_large(best: dict[str, tuple[float, float]], repeat: int) -> None:
    print(f"\n(large) {LARGE_MIB} MiB BIT_NOT round trip, best of {repeat} interleaved rounds")
    print(f"{'server':<11} {'protocol':<8} {'time':>9} {'server CPU':>12}")
    for name, (seconds, cpu) in best.items():
        server, protocol = name.split()
        print(f"{server:<11} {protocol:<8} {seconds * 1e3:>6.1f} ms {cpu * 1e3:>9.0f} ms")
    time_of = {name: seconds for name, (seconds, _) in best.items()}
    print(
        "  tensorbits gRPC / tensorbits HTTP time: "
        f"{time_of['tensorbits gRPC'] / time_of['tensorbits HTTP']:.2f}x"
    )
    for protocol in ("HTTP", "gRPC"):
        if f"Triton {protocol}" in time_of:
            ratio = time_of[f"Triton {protocol}"] / time_of[f"tensorbits {protocol}"]
            print(f"  Triton time / tensorbits time, {protocol}: {ratio:.2f}x (target >= 1.5x)")


# --- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def tensorbits(label: str = "tensorbits", **extra: str) -> Iterator[Endpoints]:
    """``tensorbits serve`` as bench.harness.tensorbits_server starts it, with gRPC on a free
    port too, and its pid kept (the server's CPU time is read from /proc). ``extra`` adds to its
    environment."""
    http_port, grpc_port = free_port(), free_port()
    env = {
        **os.environ,
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_GRPC_PORT": str(grpc_port),
        **extra,
    }
    argv = [str(BIN / "tensorbits"), "serve", "--port", str(http_port)]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        wait_until_up(f"http://127.0.0.1:{http_port}/v2/health/ready", proc=proc)
        yield Endpoints(label, http_port, f"127.0.0.1:{grpc_port}", proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


BARE_UU, BARE_SU = "bare u-u", "bare s-u"


@contextlib.contextmanager
def bare_grpc(label: str, *flags: str) -> Iterator[Endpoints]:
    """bench.harness.baselines' bare grpc.aio server on a free port: grpcio's own cost per call,
    with no work."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.harness.baselines", str(port), *flags]
    proc = subprocess.Popen(argv, cwd=ROOT)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
        yield Endpoints(label, None, f"127.0.0.1:{port}", proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def peers(bare: bool) -> Iterator[list[Endpoints]]:
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(tensorbits())]
        if bare:
            servers.append(stack.enter_context(bare_grpc(BARE_UU)))
            servers.append(stack.enter_context(bare_grpc(BARE_SU, "--stream-unary")))
        try:
            peer: TritonPeer = stack.enter_context(triton_peer())
        except PeerUnavailable as exc:
            print(f"Triton peer unavailable, tensorbits measured alone: {exc}")
        else:
            servers.append(
                Endpoints("Triton", urlsplit(peer.http_url).port, peer.grpc_url, peer.pid)
            )
            print(f"Triton peer: Triton Inference Server {peer.version} (nvidia-pytriton)")
        yield servers


def conditions() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} cores, load average {one:.1f} (1 min) {five:.1f} (5 min)"


def parse_options(
    parser: argparse.ArgumentParser, argv: list[str] | None, rounds: int, repeat: int, least: int
) -> tuple[argparse.Namespace, set[str]]:
    """The options of a run of the small and large measurements, added to the caller's own in
    ``parser``, parsed and held to their bounds: ``rounds`` and ``repeat`` are their defaults,
    ``least`` the fewest either takes. The parts to run, and ``args.h2load``: whether h2load is
    installed."""
    parser.add_argument(
        "--rounds", type=int, default=rounds, help=f"(small) rounds (default {rounds})"
    )
    parser.add_argument("--seconds", type=float, default=4.0, help="(small) seconds per run")
    parser.add_argument("--connections", type=int, default=32, help="(small) wrk connections")
    add_load_options(parser, "(small) ")
    parser.add_argument(
        "--repeat", type=int, default=repeat, help=f"(large) rounds (default {repeat})"
    )
    parser.add_argument("--parts", default="small,large", help="small, large or both")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts <= {"small", "large"}:
        parser.error("--parts: small, large or small,large")
    if not (least <= args.rounds <= 50 and 0 < args.seconds <= 60 and least <= args.repeat <= 50):
        parser.error(f"bounded: --rounds {least}..50, --seconds (0, 60], --repeat {least}..50")
    if "small" in parts and shutil.which("wrk") is None:
        parser.error("(small) needs wrk: apt-get install -y wrk")
    args.h2load = shutil.which("h2load") is not None
    if "small" in parts and not args.h2load:
        print("h2load not found (apt-get install -y nghttp2-client): gRPC with grpc.aio only")
    return args, parts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    args, parts = parse_options(parser, argv, rounds=5, repeat=5, least=1)
    stop_on_signals()  # a Ctrl-C or SIGTERM still stops both servers
    start = time.monotonic()
    print(f"machine: {conditions()}")
    with peers(bare="small" in parts) as servers:
        if "small" in parts:
            note("(small) ...")
            print_small(small_rounds(servers, args), args)
        if "large" in parts:
            note("(large) ...")
            print_large(large_round_trips(servers, args.repeat), args.repeat)
    print(f"\nmachine after: {conditions()}; {time.monotonic() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
