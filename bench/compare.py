"""tensorbits against a real Triton, an earlier revision and the bare floors, over HTTP and gRPC,
small and large tensors, in one run, with the ratios its targets are about (PASS or MISS).

Parts, every server on a free 127.0.0.1 port, every contestant once per round, the order rotated:

  rates   requests/s of a 16-element UINT8 BIT_NOT at each ``--concurrency``: wrk (HTTP) and
          bench/harness/grpc_load.py (gRPC), with each server's CPU time per request; medians
  perf    Triton's perf_analyzer, the same flags on every server, ``--pa-concurrency`` in flight
  sizes   one BIT_NOT round trip of each ``--sizes`` MiB at a time; best and median (p50)

Writes bench/results/compare.json and two charts (``--out`` elsewhere); bench/README.md says more.

  .venv/bin/python bench/compare.py --quick         # about 3 minutes
  .venv/bin/python bench/compare.py                 # about 15 minutes
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# perf_analyzer's runner is the live test's (tests/support/perf_analyzer.py).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))

from support.perf_analyzer import SCRIPT as PERF_ANALYZER
from support.perf_analyzer import run_perf_analyzer

from bench.harness import (
    NOT,
    ROOT,
    MiB,
    PlainClient,
    free_port,
    interleaved_times,
    note,
    server,
    v2_binary_request,
    wall,
)
from bench.harness.baselines import RawEcho
from bench.harness.charts import line_chart
from bench.harness.grpc_load import CHANNEL_OPTIONS, model_infer_request, raw_model_infer
from bench.peers import PeerUnavailable, stop_on_signals, triton_peer

PATH = f"/v2/models/{NOT}/infer"
SMALL = np.arange(16, dtype=np.uint8)
TICK = 1 / os.sysconf("SC_CLK_TCK")
RESULTS = ROOT / "bench" / "results"
TRITON = "Triton"
# gRPC load's connections: workers share a port by SO_REUSEPORT, which spreads connections, not
# calls (2 channels put every call on one of 2 workers half the time).
CHANNELS = 8
# tensorbits and the floors run with malloc's mappings on huge pages, as `make serve` and the
# images run the server (a 64 MiB gRPC call faults in 8k pages instead of 66k); Triton as shipped.
DEPLOYED = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
FLOORS = {"http": "bare FastAPI", "grpc": "bare grpc.aio"}  # a floor's label: its workers after
PROTOCOLS, PARTS = ("http", "grpc"), ("rates", "perf", "sizes")


@dataclass(frozen=True)
class Server:
    """One server's front ends; ``None`` where it has no such front end (the floors)."""

    label: str
    kind: str  # tensorbits, Triton, revision or floor
    pid: int  # its CPU time is read with its children's (tree_cpu)
    http_port: int | None = None
    grpc_target: str | None = None
    path: str = PATH  # where the small request is posted over HTTP


@dataclass(frozen=True)
class Rate:
    rps: float
    p50_ms: float
    p99_ms: float
    server_us: float  # the server's CPU time per request (all its processes)


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants: Triton's Python backend runs each model
    in a stub process, tensorbits' workers are children of the command."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        with contextlib.suppress(OSError):  # a process may end while it is read
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * TICK  # utime, stime
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(c) for c in (task / "children").read_text().split()]
    return total


# --- the servers ------------------------------------------------------------------------------
@contextlib.contextmanager
def tensorbits(label: str, kind: str, workers: int, source: Path | None = None) -> Iterator[Server]:
    """``tensorbits serve`` from this checkout, or from ``source`` (an extracted revision)."""
    http_port, grpc_port = free_port(), free_port()
    env = {**DEPLOYED, "TENSORBITS_BACKEND": "numpy", "TENSORBITS_LOG_LEVEL": "warning",
           "TENSORBITS_GRPC_PORT": str(grpc_port), "TENSORBITS_WORKERS": str(workers)}  # fmt: skip
    module = "tensorbits.server.cli"
    if source is not None:
        paths = [source / p / "src" for p in ("service", "client", "protocol")]
        env["PYTHONPATH"] = ":".join(str(p) for p in paths if p.exists())
        if not (source / "service/src/tensorbits/server/cli.py").exists():
            module = "tensorbits.cli"  # the layout before server/ held the command
    argv = [sys.executable, "-m", module, "serve", "--port", str(http_port)]
    with server(argv, f"http://127.0.0.1:{http_port}/v2/health/ready", env, 120.0) as proc:
        yield Server(label, kind, proc.pid, http_port, f"127.0.0.1:{grpc_port}")


@contextlib.contextmanager
def revision_source(revision: str) -> Iterator[Path]:
    """The sources of ``revision`` in a temporary folder (``git archive``: the working tree and
    the repository stay as they are)."""
    with tempfile.TemporaryDirectory(prefix="tensorbits-revision-") as tmp:
        wanted = [f"{part}/src" for part in ("service", "client", "protocol")]
        listed = subprocess.run(["git", "ls-tree", "--name-only", revision, *wanted], cwd=ROOT,
                                capture_output=True, text=True, check=True)  # fmt: skip
        archive = subprocess.Popen(["git", "archive", revision, *listed.stdout.split()],
                                   cwd=ROOT, stdout=subprocess.PIPE)  # fmt: skip
        subprocess.run(["tar", "-x", "-C", tmp], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {revision} failed")
        yield Path(tmp)


@contextlib.contextmanager
def floors(workers: int) -> Iterator[list[Server]]:
    """The bare FastAPI app and the bare grpc.aio server (harness/baselines.py) in the form of
    tensorbits' ``--workers``: both in each of ``workers`` processes, their ports shared."""
    http, grpc_port = free_port(), free_port()
    w, target = f" ({workers_label(workers)})", f"127.0.0.1:{grpc_port}"
    argv = [sys.executable, "-m", "bench.harness.baselines", str(http), str(grpc_port),
            "--workers", str(workers)]  # fmt: skip
    with server(argv, f"http://127.0.0.1:{http}/v2/health/ready", DEPLOYED, 120.0) as proc:
        yield [Server(FLOORS["http"] + w, "floor", proc.pid, http_port=http, path="/ping"),
               Server(FLOORS["grpc"] + w, "floor", proc.pid, grpc_target=target)]  # fmt: skip


def workers_label(workers: int) -> str:
    return f"{workers} worker" + ("s" if workers > 1 else "")


def fronts(server: Server, args: argparse.Namespace) -> list[str]:
    """The protocols of ``--protocol`` that ``server`` speaks."""
    return [p for p in args.protocol if (server.grpc_target if p == "grpc" else server.http_port)]


@contextlib.contextmanager
def servers(args: argparse.Namespace) -> Iterator[list[Server]]:
    with contextlib.ExitStack() as stack:
        found = [
            stack.enter_context(tensorbits(f"tensorbits ({workers_label(w)})", "tensorbits", w))
            for w in args.workers
        ]
        if args.revision:
            source = stack.enter_context(revision_source(args.revision))
            found.append(stack.enter_context(tensorbits(args.revision, "revision", 1, source)))
        if args.peer == "triton":
            try:
                peer = stack.enter_context(triton_peer())
            except PeerUnavailable as exc:
                print(f"Triton peer unavailable, measured without it: {exc}")
            else:
                print(f"Triton peer: Triton Inference Server {peer.version} (nvidia-pytriton)")
                http_port = urlsplit(peer.http_url).port
                found.append(Server(TRITON, TRITON, peer.pid, http_port, peer.grpc_url))
        for w in args.workers:
            found += stack.enter_context(floors(w))
        yield found


# --- small requests: rates ----------------------------------------------------------------------

WRK_SCRIPT = 'wrk.method = "POST"\nwrk.body = "{body}"\nwrk.headers["{name}"] = "{value}"\n'
WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk_latency_ms(out: str, percentile: int) -> float:
    match = re.search(rf"^\s+{percentile}%\s+([\d.]+)(us|ms|s)\s*$", out, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no {percentile}% latency in wrk's output:\n{out}")
    return float(match.group(1)) * WRK_UNITS[match.group(2)]


def wrk_rate(server: Server, seconds: float, connections: int) -> Rate:
    """wrk (one thread) posting the 16-element v2 binary BIT_NOT (the floor reads the same body)."""
    head, parts = v2_binary_request({"InputTensor": SMALL}, "OutputTensor")
    body = "".join(f"\\{b}" for b in b"".join(bytes(p) for p in parts))
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(
            WRK_SCRIPT.format(body=body, name="Inference-Header-Content-Length", value=len(head))
        )
        lua.flush()
        cpu = tree_cpu(server.pid)
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "30s",
             "-s", lua.name,
             f"http://127.0.0.1:{server.http_port}{server.path}"],
            capture_output=True, text=True, check=True, timeout=seconds + 60,
        ).stdout  # fmt: skip
        cpu = tree_cpu(server.pid) - cpu
    # A slow answer is a latency (the p99 shows it), not an error: wrk's timeout is 30 s here.
    failed = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: connect [1-9]|"
                       r"Socket errors: .*(?:read|write) [1-9]", out)  # fmt: skip
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if failed or rate is None or count is None:
        raise RuntimeError(f"wrk against {server.label}:\n{out}")
    return Rate(float(rate.group(1)), wrk_latency_ms(out, 50), wrk_latency_ms(out, 99),
                cpu / int(count.group(1)) * 1e6)  # fmt: skip


def grpc_rate(server: Server, seconds: float, in_flight: int) -> Rate:
    """bench.harness.grpc_load in a process of its own; the requests the server counted."""
    argv = [
        sys.executable, "-m", "bench.harness.grpc_load", str(server.grpc_target), "--json",
        "--elements", str(SMALL.size), "--duration", f"{seconds:g}",
        "--streams", str(in_flight), "--channels", str(math.gcd(in_flight, CHANNELS)),
    ]  # fmt: skip
    cpu = tree_cpu(server.pid)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 90, cwd=ROOT)
    cpu = tree_cpu(server.pid) - cpu
    if done.returncode != 0:
        raise RuntimeError(f"gRPC load against {server.label}:\n{done.stdout}{done.stderr}")
    got = json.loads(done.stdout)
    return Rate(got["requests"] / got["seconds"], got["p50_ms"], got["p99_ms"],
                cpu / got["calls_made"] * 1e6)  # fmt: skip


RateKey = tuple[str, str, int]  # protocol, server label, concurrency


def measure_rates(running: list[Server], args: argparse.Namespace) -> dict[RateKey, list[Rate]]:
    load = {"http": wrk_rate, "grpc": grpc_rate}
    contestants: list[tuple[RateKey, Callable[[], Rate]]] = [
        ((p, s.label, c), functools.partial(load[p], s, args.seconds, c))
        for c in args.concurrency for s in running for p in fronts(s, args)
    ]  # fmt: skip
    rates: dict[RateKey, list[Rate]] = {key: [] for key, _ in contestants}
    for round_ in range(args.rounds):
        shift = (round_ * max(1, len(contestants) // args.rounds)) % max(1, len(contestants))
        for key, measure in contestants[shift:] + contestants[:shift]:
            note(f"  rates, round {round_ + 1}/{args.rounds}: {key[0]} {key[1]} x{key[2]}")
            try:
                rates[key].append(measure())
            except (RuntimeError, subprocess.SubprocessError) as exc:
                print(f"{key[0]} {key[1]} x{key[2]}, round {round_ + 1}: left out: {exc}")
    return {key: runs for key, runs in rates.items() if runs}


def median_rate(runs: list[Rate]) -> Rate:
    return Rate(
        *(statistics.median(getattr(r, f) for r in runs) for f in Rate.__dataclass_fields__)
    )


def rate_ratio(a: list[Rate], b: list[Rate]) -> float:
    """The median of the per-round ratios; where a round was left out, the ratio of medians."""
    if len(a) != len(b):
        return median_rate(a).rps / median_rate(b).rps
    return statistics.median(x.rps / y.rps for x, y in zip(a, b, strict=True))


# --- perf_analyzer ------------------------------------------------------------------------------
def perf_analyzer(server: Server, protocol: str, args: argparse.Namespace) -> Rate | str:
    """One perf_analyzer run: its throughput and p50/p99, or why it failed."""
    url = f"127.0.0.1:{server.http_port}" if protocol == "http" else str(server.grpc_target)
    flags = [
        "-m", NOT, "-i", protocol, "-u", url, "--shape", "InputTensor:16",
        "--concurrency-range", str(args.pa_concurrency),
        "--measurement-interval", str(args.pa_interval_ms),
        "--stability-percentage", "50", "--max-trials", "8",
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tensorbits-pa-") as tmp:
        try:
            done = run_perf_analyzer(flags, Path(tmp) / "report.csv", 300)
        except subprocess.TimeoutExpired:
            return "failed: timed out"
    if done.returncode != 0 or not done.rows:
        return f"failed (exit {done.returncode}): " + " | ".join(done.output.splitlines()[-2:])
    row = done.rows[0]
    return Rate(float(row["Inferences/Second"]), float(row["p50 latency"]) / 1e3,
                float(row["p99 latency"]) / 1e3, float("nan"))  # fmt: skip


PerfKey = tuple[str, str]  # protocol, server label


def measure_perf(running: list[Server], args: argparse.Namespace) -> dict[PerfKey, list[Rate]]:
    setup = subprocess.run(["bash", str(PERF_ANALYZER), "--setup-only"], capture_output=True,
                           text=True, check=False)  # fmt: skip
    if setup.returncode != 0:
        print(f"perf_analyzer skipped, it cannot be set up: {setup.stderr.strip()[-300:]}")
        return {}
    results: dict[PerfKey, list[Rate]] = {}
    for round_ in range(args.rounds):
        for protocol in args.protocol:
            order = [s for s in running if protocol in fronts(s, args)]
            for s in order if round_ % 2 == 0 else order[::-1]:
                note(f"  perf_analyzer, round {round_ + 1}/{args.rounds}: {protocol} {s.label}")
                outcome = perf_analyzer(s, protocol, args)
                if isinstance(outcome, str):
                    print(f"perf_analyzer {protocol} {s.label}: {outcome}")
                    continue
                results.setdefault((protocol, s.label), []).append(outcome)
    return results


# --- large tensors: round trips -----------------------------------------------------------------
def http_call(client: PlainClient, server: Server, parts: list[bytes | memoryview], head: bytes,
              tail: bytes, hold_s: float = 0.0) -> Callable[[], float]:  # fmt: skip
    """One v2 binary BIT_NOT, the answer's last bytes checked; a floor's /echo: the body back.
    Its seconds; ``hold_s``: from its last MiB, sent that long after the rest, to its head."""
    echo, size = server.kind == "floor", sum(len(p) for p in parts)
    headers = {} if echo else {"Inference-Header-Content-Length": str(len(head))}
    path = "/echo" if echo else PATH

    def once() -> float:
        start = time.perf_counter()
        status, _, body = client.request("POST", path, parts, headers, hold_s)
        if status != 200 or (len(body) != size if echo else bytes(body[-len(tail) :]) != tail):
            raise RuntimeError(f"{path} answered {status}: {bytes(body[:200])!r}")
        return client.after_last_s if hold_s else time.perf_counter() - start

    return once


def grpc_call(channel: grpc.Channel, body: bytes, tail: bytes) -> Callable[[], None]:
    """One pre-serialized ModelInfer; raw_output_contents is the response's last field, so its
    bytes end the message: checked there, not parsed (the client's share stays a receive)."""
    call = raw_model_infer(channel)

    def once() -> None:
        answer: bytes = call(body, timeout=300, wait_for_ready=True)
        if answer[-len(tail) :] != tail:
            raise RuntimeError(f"gRPC: wrong answer ({len(answer)} bytes)")

    return once


SizeKey = tuple[str, str, float]  # protocol (http, http-last, grpc or tcp), server label, MiB
# "http-last": the last MiB sent this long after the rest of the body, timed from then to the
# answer's head: what a server has left to do once the body is in before it answers.
HOLD_S = 0.1


def measure_sizes(running: list[Server], args: argparse.Namespace) -> dict[SizeKey, list[float]]:
    """Seconds of each round trip, every contestant once per round (after one call to warm)."""
    times: dict[SizeKey, list[float]] = {}
    raw = RawEcho()
    for mib in args.sizes:
        data = np.arange(max(1, round(mib * MiB)), dtype=np.uint64).astype(np.uint8)
        tail = np.bitwise_not(data[-4096:]).tobytes()
        head, parts = v2_binary_request({"InputTensor": data}, "OutputTensor")
        body = model_infer_request(NOT, {"InputTensor": data})
        calls: dict[SizeKey, Callable[[], float]] = {}
        with contextlib.ExitStack() as stack:
            for s in running:
                if "http" in args.protocol and s.http_port is not None:
                    client = stack.enter_context(contextlib.closing(PlainClient(s.http_port)))
                    calls[("http", s.label, mib)] = http_call(client, s, parts, head, tail)
                    if mib >= 1:  # what is left once the body is in: "http-last"
                        last = http_call(client, s, parts, head, tail, HOLD_S)
                        calls[("http-last", s.label, mib)] = last
                if "grpc" in args.protocol and (target := s.grpc_target):  # a floor: cached
                    channel = stack.enter_context(grpc.insecure_channel(target, CHANNEL_OPTIONS))
                    calls[("grpc", s.label, mib)] = wall(grpc_call(channel, body, tail))
            calls[("tcp", "raw TCP echo", mib)] = wall(raw.round_trip_fn(sum(map(len, parts))))
            note(f"  sizes, {mib:g} MiB, {args.repeat} rounds")
            times |= interleaved_times(calls, args.repeat)
    return times


# --- targets, the report, the files -------------------------------------------------------------
@dataclass(frozen=True)
class Target:
    what: str
    bound: str  # "<= 1.3" or ">= 1.0"
    ratio: float | None  # None: not measured in this run
    why_not: str = ""

    @property
    def verdict(self) -> str:
        if self.ratio is None:
            return f"n/a ({self.why_not})"
        limit = float(self.bound.split()[1])
        met = self.ratio <= limit if self.bound.startswith("<=") else self.ratio >= limit
        return "PASS" if met else "MISS"


@dataclass
class Results:
    rates: dict[RateKey, list[Rate]] = field(default_factory=dict)
    perf: dict[PerfKey, list[Rate]] = field(default_factory=dict)
    sizes: dict[SizeKey, list[float]] = field(default_factory=dict)


def targets(results: Results, args: argparse.Namespace) -> list[Target]:
    c = workers_label(max(args.workers))
    one, cores, big = f"tensorbits ({workers_label(1)})", f"tensorbits ({c})", 64.0

    def rate(table: dict[Any, list[Rate]], key: tuple[Any, ...], what: str, bound: str) -> Target:
        a, b = table.get(key), table.get((key[0], TRITON, *key[2:]))
        if not a or not b:
            why = "perf_analyzer" if table is results.perf else "that load"
            return Target(what, bound, None, f"not measured: needs Triton and {why}")
        return Target(what, bound, rate_ratio(a, b))

    def size(protocol: str, peer: str, stat: Callable[[list[float]], float], what: str,
             bound: str, peer_protocol: str | None = None) -> Target:  # fmt: skip
        a = results.sizes.get((protocol, one, big))
        b = results.sizes.get((peer_protocol or protocol, peer, big))
        if not a or not b:
            return Target(what, bound, None, "not measured: needs 64 MiB and the peer")
        return Target(what, bound, stat(a) / stat(b))

    return [
        size("http", "raw TCP echo", min, "64 MiB BIT_NOT over HTTP / raw TCP echo, best time",
             "<= 1.3", "tcp"),
        size("http", TRITON, min, "64 MiB BIT_NOT over HTTP / Triton, best time", "<= 0.35"),
        rate(results.rates, ("http", one, 32),
             "16-element rate over HTTP / Triton, 1 worker, wrk 32 connections", ">= 1.0"),
        rate(results.perf, ("http", cores), f"16-element rate over HTTP / Triton, {c}, "
             f"perf_analyzer {args.pa_concurrency} in flight", ">= 1.3"),
        rate(results.rates, ("grpc", cores, 32),
             f"16-element rate over gRPC / Triton, {c}, 32 in flight", ">= 1.0"),
        size("grpc", TRITON, statistics.median, "64 MiB BIT_NOT over gRPC / Triton, p50", "<= 0.6"),
        size("http-last", f"{FLOORS['http']} ({workers_label(1)})", min, "64 MiB BIT_NOT over "
             "HTTP, its last MiB to the answer's head / the bare FastAPI echo's, best", "<= 1.5"),
    ]  # fmt: skip


def against(results: Results, key: tuple[Any, ...]) -> str:
    """A tensorbits row of rates (or perf_analyzer's: ``key`` without a load), its requests/s
    over Triton's and over the floor's of as many workers (``rate_ratio``); blank for others."""
    table: dict[Any, list[Rate]] = results.rates if len(key) == 3 else results.perf
    protocol, label, *load = key
    if not label.startswith("tensorbits ("):
        return ""
    peers = (TRITON, FLOORS[protocol] + label.removeprefix("tensorbits"))
    found = [table.get((protocol, peer, *load)) for peer in peers]
    return "".join(f"{f'{rate_ratio(table[key], b):.2f}x' if b else '-':>8}" for b in found)


def report(results: Results, checked: list[Target], args: argparse.Namespace) -> None:
    ratios = f"{'/Triton':>8}{'/floor':>8}  (the floor: bare, as many workers)"
    if results.rates:
        print(f"\nrates: 16-element UINT8 BIT_NOT, medians of {args.rounds} round(s) of "
              f"{args.seconds:g} s; HTTP wrk -t1, gRPC h2load")  # fmt: skip
        print(f"{'protocol':<8} {'server':<26} {'load':>5} {'req/s':>9} {'p50 ms':>8} "
              f"{'p99 ms':>8} {'CPU/req':>9}{ratios}")  # fmt: skip
        for key, runs in sorted(results.rates.items()):
            m = median_rate(runs)
            print(f"{key[0]:<8} {key[1]:<26} {key[2]:>5} {m.rps:>9,.0f} {m.p50_ms:>8.2f} "
                  f"{m.p99_ms:>8.2f} {m.server_us:>6.0f} us{against(results, key)}")  # fmt: skip
    if results.perf:
        print(f"\nperf_analyzer: 16-element BIT_NOT, {args.pa_concurrency} in flight")
        print(f"{'protocol':<8} {'server':<26} {'infer/s':>9} {'p50 ms':>8} {'p99 ms':>8}{ratios}")
        for (protocol, label), runs in sorted(results.perf.items()):
            m = median_rate(runs)
            print(f"{protocol:<8} {label:<26} {m.rps:>9,.0f} {m.p50_ms:>8.3f} {m.p99_ms:>8.3f}"
                  f"{against(results, (protocol, label))}")  # fmt: skip
    if results.sizes:
        print(f"\nsizes: one BIT_NOT round trip, best and median of {args.repeat} rounds")
        for (protocol, label, mib), seconds in sorted(results.sizes.items(), key=size_order):
            print(f"{mib:>7g} MiB {protocol:<9} {label:<26} best {min(seconds) * 1e3:9.2f} ms  "
                  f"p50 {statistics.median(seconds) * 1e3:9.2f} ms")  # fmt: skip
    print("\ntargets (ratios within this run):")
    for t in checked:
        shown = f"{t.ratio:.2f}x" if t.ratio is not None else "-"
        print(f"  {t.what}: {shown} (target {t.bound}x) {t.verdict}")


def size_order(item: tuple[SizeKey, list[float]]) -> tuple[float, str, str]:
    return item[0][2], item[0][0], item[0][1]  # MiB, protocol, label


def machine() -> dict[str, object]:
    one, five, _ = os.getloadavg()
    return {"cores": os.cpu_count(), "load_1min": round(one, 2), "load_5min": round(five, 2),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version()}  # fmt: skip


Series = dict[str, list[tuple[float, float]]]


def document(results: Results, checked: list[Target], pa_concurrency: int,
             head: dict[str, object]) -> object:  # fmt: skip
    """compare.json's content: ``head`` (command, date, machines), then the figures, rows in key
    order, floats tidied; written with its keys sorted, the same figures give the same bytes."""
    return tidy({
        **head,
        "rates": [
            {"protocol": p, "server": s, "concurrency": c, **asdict(median_rate(runs)),
             "rps_each_round": [round(r.rps, 1) for r in runs]}
            for (p, s, c), runs in sorted(results.rates.items())
        ],
        "perf_analyzer": [
            {"protocol": p, "server": s, "in_flight": pa_concurrency, **asdict(median_rate(runs))}
            for (p, s), runs in sorted(results.perf.items())
        ],
        "round_trips": [
            {"protocol": p, "server": s, "mib": mib, "best_ms": min(t) * 1e3,
             "p50_ms": statistics.median(t) * 1e3}
            for (p, s, mib), t in sorted(results.sizes.items(), key=size_order)
        ],
        "targets": [{"what": t.what, "bound": t.bound, "ratio": t.ratio, "verdict": t.verdict}
                    for t in checked],
    })  # fmt: skip


def chart_series(results: Results) -> tuple[Series, Series]:
    """The charts' lines: median requests/s against the load (the bare floors left out), and the
    best round trip in ms against MiB (the bare FastAPI echoes left out)."""
    rates: Series = {}
    for (protocol, label, load), runs in sorted(results.rates.items()):
        if not label.startswith("bare"):
            name = f"{label} {PROTOCOL_NAMES[protocol]}"
            rates.setdefault(name, []).append((load, median_rate(runs).rps))
    sizes: Series = {}
    for (protocol, label, mib), seconds in sorted(results.sizes.items(), key=size_order):
        if not label.startswith(FLOORS["http"]) and protocol != "http-last":
            name = label if protocol == "tcp" else f"{label} {PROTOCOL_NAMES[protocol]}"
            sizes.setdefault(name, []).append((mib, min(seconds) * 1e3))
    return rates, sizes


def write(results: Results, checked: list[Target], args: argparse.Namespace,
          before: dict[str, object]) -> None:  # fmt: skip
    """compare.json (``document``) and the two charts (``chart_series``) in ``args.out``."""
    args.out.mkdir(parents=True, exist_ok=True)
    head: dict[str, object] = {
        "command": "bench/compare.py " + " ".join(sys.argv[1:]), "machine_before": before,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine_after": machine()}  # fmt: skip
    data = document(results, checked, args.pa_concurrency, head)
    path = args.out / "compare.json"
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    rate_series, size_series = chart_series(results)
    if rate_series:
        line_chart(args.out / "compare_rates.svg", title="16-element BIT_NOT, requests/s",
                   x_label="requests in flight (connections, gRPC calls)", y_label="requests/s",
                   series=rate_series, log_x=True)  # fmt: skip
    if size_series:
        line_chart(args.out / "compare_round_trips.svg", title="BIT_NOT round trip, best time",
                   x_label="tensor MiB (in, and out)", y_label="ms", series=size_series,
                   log_x=True, log_y=True)  # fmt: skip


PROTOCOL_NAMES = {"http": "HTTP", "grpc": "gRPC"}


def tidy(value: object) -> object:
    """Floats to 4 significant digits (what a shared machine tells apart), NaN to null."""
    if isinstance(value, float):
        return None if value != value else float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: tidy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [tidy(v) for v in value]
    return value


# --- the command --------------------------------------------------------------------------------
def numbers(kind: type[int] | type[float]) -> Callable[[str], list[float]]:
    def parse(text: str) -> list[float]:
        values = [kind(part) for part in text.split(",") if part]
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError("a comma-separated list of numbers above 0")
        return sorted(set(values))

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cores = os.cpu_count() or 1
    add = parser.add_argument
    add("--quick", action="store_true", help="1 round of 2 s, loads 8 and 32, 1 and 64 MiB")
    add("--protocol", type=lambda t: t.split(","), default=list(PROTOCOLS), help="http,grpc")
    add("--parts", type=lambda t: t.split(","), default=list(PARTS), help="rates,perf,sizes")
    add("--sizes", type=numbers(float), help="MiB per tensor (default 1,16,64)")
    add("--workers", type=numbers(int), default=sorted({1, cores}), help=f"default 1,{cores}")
    add("--concurrency", type=numbers(int), help="requests in flight (default 1,8,32,128)")
    add("--peer", choices=("triton", "none"), default="triton")
    add("--revision", help="also serve this git revision's sources, 1 worker")
    add("--rounds", type=int, help="rounds of rates and perf_analyzer (default 3)")
    add("--seconds", type=float, help="seconds per rate run (default 4)")
    add("--repeat", type=int, help="round trips per size (default 7)")
    add("--pa-concurrency", type=int, default=8, help="perf_analyzer's requests in flight")
    add("--pa-interval-ms", type=int, help="perf_analyzer's window (default 2000)")
    add("--out", type=Path, default=RESULTS, help="where compare.json and the charts go")
    args = parser.parse_args(argv)
    defaults = {"sizes": ([1.0, 64.0], [1.0, 16.0, 64.0]), "concurrency": ([8, 32], [1, 8, 32, 128]),
                "rounds": (1, 3), "seconds": (2.0, 4.0), "repeat": (3, 7),
                "pa_interval_ms": (1000, 2000)}  # fmt: skip
    for name, (short, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, short if args.quick else full)
    if not set(args.protocol) <= set(PROTOCOLS) or not set(args.parts) <= set(PARTS):
        parser.error("--protocol: http and/or grpc; --parts: rates, perf, sizes")
    if not (1 <= args.rounds <= 20 and 0 < args.seconds <= 60 and 1 <= args.repeat <= 50
            and max(args.concurrency) <= 512 and max(args.sizes) <= 256):  # fmt: skip
        parser.error("bounded: --rounds 1..20, --seconds (0, 60], --repeat 1..50, "
                     "--concurrency up to 512, --sizes up to 256 MiB")  # fmt: skip
    for protocol, tool, package in (("http", "wrk", "wrk"), ("grpc", "h2load", "nghttp2-client")):
        if protocol in args.protocol and "rates" in args.parts and shutil.which(tool) is None:
            parser.error(
                f"{PROTOCOL_NAMES[protocol]} rates need {tool}: apt-get install -y {package}"
            )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    stop_on_signals()  # a Ctrl-C or SIGTERM still stops every server
    before, start = machine(), time.monotonic()
    print(f"machine: {before}")
    results = Results()
    with servers(args) as running:
        print("servers: " + ", ".join(s.label for s in running))
        parts = {"rates": measure_rates, "perf": measure_perf, "sizes": measure_sizes}
        for name, measure in parts.items():
            if name in args.parts:
                try:
                    setattr(results, name, measure(running, args))
                except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                    # The other parts' figures are still worth writing; this one says why not.
                    print(f"{name} failed, left out: {type(exc).__name__}: {exc}")
    checked = targets(results, args)
    report(results, checked, args)
    write(results, checked, args, before)
    print(f"machine after: {machine()}; {time.monotonic() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
