"""Bounded load test of ``tensorbits serve`` on loopback, with abusive clients beside it.

``--clients`` asyncio clients (httpx) send a mix of valid large, valid small and invalid /v2
infer requests for ``--duration`` seconds, every 200 checked byte for byte (each valid request
carries its own seeded data), while ``--abusers`` abusive clients (bench/harness/abuse.py, a
process of their own) send requests the server must refuse cheaply in every other
``--abuse-window`` (calm first): latency with and without abuse comes from the same run. The
server's RSS is sampled every ``--sample-every`` seconds. Each check prints ok or FAIL (exit
status 1 on a FAIL); the memory bound is TENSORBITS_MAX_INFLIGHT_BYTES + ``--overhead-mib``
(responses a slow client has not read yet are no longer counted by admission).

    .venv/bin/python bench/load.py                      # 20 s, 16 clients, 4 abusers
    .venv/bin/python bench/load.py --clients 32 --duration 600

``soak-refusals [--seconds 40] [--clients 32]`` and ``rolling-restart [--replicas 3] [--runs 3]
[--drain-delay 2]`` run the harnesses of tests/support/refusal_soak.py and
tests/support/rolling.py (bench/README.md), printing JSON lines.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import signal
import sys
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# The soak and the rolling restart are the tests' harnesses (tests/support/).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))

from bench.harness import BIN, free_port, server
from bench.harness.abuse import KINDS, AbuseProcess, failed
from bench.harness.memory import MiB, RssSampler, vm
from tensorbits.server.memory import tune_allocator

HEADER = "Inference-Header-Content-Length"
MODEL = "onnx.BitwiseXor-18"
GC_EVERY = 1.0


# --- requests ---------------------------------------------------------------------------------
def binary_input(name: str, elements: int, nbytes: int) -> dict[str, object]:
    """A UINT8 input's entry in a v2 binary header (``nbytes`` may disagree with its shape)."""
    parameters = {"binary_data_size": nbytes}
    return {"name": name, "shape": [elements], "datatype": "UINT8", "parameters": parameters}


def valid_request(seq: int, nbytes: int) -> tuple[bytes, dict[str, str], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(seq)
    a = np.frombuffer(rng.bytes(nbytes), np.uint8)
    b = np.frombuffer(rng.bytes(nbytes), np.uint8)
    header = {
        "id": str(seq),
        "inputs": [binary_input(n, nbytes, nbytes) for n in ("A", "B")],
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
        json.dumps({"inputs": [binary_input("A", 4, 5), binary_input("B", 4, 4)]}).encode()
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
    # (kind, phase) -> seconds: phase is the window ("calm", "abuse") the request started in
    latencies: dict[tuple[str, str], list[float]] = field(default_factory=lambda: defaultdict(list))
    shed: Counter[str] = field(default_factory=Counter)  # 503s by phase
    wrong: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)
    transport_errors: Counter[str] = field(default_factory=Counter)
    served: int = 0


class Phase:
    """Which window the run is in: calm or abuse. Read by the normal clients, set by ``windows``."""

    def __init__(self, abuse: threading.Event | Any | None) -> None:
        self.abuse = abuse

    @property
    def name(self) -> str:
        return "abuse" if self.abuse is not None and self.abuse.is_set() else "calm"


async def client_loop(
    client: httpx.AsyncClient,
    args: argparse.Namespace,
    deadline: float,
    counter: list[int],
    stats: Stats,
    phase: Phase,
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
        window = phase.name
        start = time.monotonic()
        try:
            response = await client.post(f"/v2/models/{MODEL}/infer", content=body, headers=headers)
        except httpx.HTTPError as exc:
            stats.transport_errors[type(exc).__name__] += 1
            continue
        elapsed = time.monotonic() - start
        group = kind.split(":")[0]
        stats.statuses[(group, response.status_code)] += 1
        stats.latencies[(group, window)].append(elapsed)
        status = response.status_code
        if status == 200 and expected is not None:
            stats.served += 1
            offset = int(response.headers[HEADER])
            document = json.loads(response.content[:offset])
            got = np.frombuffer(response.content, np.uint8, offset=offset)
            if document.get("id") != str(seq) or not np.array_equal(got, expected):
                stats.wrong.append(f"request {seq} ({kind}): wrong answer")
        elif status == 503 and expected is not None and "retry-after" in response.headers:
            stats.shed[window] += 1  # shed by admission: the client would retry
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


async def windows(phase: Phase, every: float, deadline: float) -> None:
    """Abuse on in every other window of ``every`` seconds, calm first, until ``deadline``."""
    if phase.abuse is None:
        return
    on = False
    while time.monotonic() < deadline:
        await asyncio.sleep(min(every, max(0.0, deadline - time.monotonic())))
        on = not on and time.monotonic() < deadline
        if on:
            phase.abuse.set()
        else:
            phase.abuse.clear()
    phase.abuse.clear()


async def collect_cycles(deadline: float) -> None:
    """Free what httpx leaves in reference cycles, every ``GC_EVERY`` seconds.

    Each httpx response sits in a cycle with its request and streams, so a large request's
    16 MiB body and 8 MiB answer lived on until a full collection of the garbage collector,
    which runs rarely once many objects are long-lived: the load generator passed 7 GiB in
    3 minutes (mallinfo2: the memory in its own large mappings, and a collection freed 700 MiB
    at once). With the start-up objects frozen (``gc.freeze``) a collection takes about a
    millisecond."""
    while time.monotonic() < deadline:
        await asyncio.sleep(GC_EVERY)
        gc.collect()


async def run_load(port: int, args: argparse.Namespace, stats: Stats, phase: Phase) -> float:
    limits = httpx.Limits(max_connections=args.clients, max_keepalive_connections=args.clients)
    timeout = httpx.Timeout(60.0)
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=timeout
    ) as client:
        start = time.monotonic()
        deadline = start + args.duration
        counter = [0]
        await asyncio.gather(
            windows(phase, args.abuse_window, deadline),
            collect_cycles(deadline),
            *(
                client_loop(client, args, deadline, counter, stats, phase)
                for _ in range(args.clients)
            ),
        )
        return time.monotonic() - start


# The run's knobs: (option, type, default, help).
OPTIONS: tuple[tuple[str, type, float, str | None], ...] = (
    ("--duration", float, 20.0, "seconds (default 20)"),
    ("--max-requests", int, 100_000, "stop after this many"),
    ("--clients", int, 16, "concurrent clients (default 16)"),
    ("--large-mib", int, 8, "MiB of each input of a large request"),
    ("--small-bytes", int, 4096, None),
    ("--large-share", float, 0.2, None),
    ("--invalid-share", float, 0.2, None),
    ("--max-inflight-mib", int, 128, "TENSORBITS_MAX_INFLIGHT_BYTES"),
    ("--max-body-mib", int, 32, "TENSORBITS_MAX_BODY_BYTES"),
    ("--overhead-mib", int, 256, "allowed RSS above the in-flight bound"),
    ("--abusers", int, 4, "abusive clients, in abuse windows (0: none)"),
    ("--abuse-window", float, 10.0, "seconds per calm or abuse window"),
    ("--max-abuse-ratio", float, 2.0, "allowed p99 under abuse / calm p99"),
    ("--sample-every", float, 5.0, "seconds between RSS samples"),
    ("--max-growth", float, 1.10, "allowed peak RSS / first minute's peak"),
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    for option, kind, default, text in OPTIONS:
        parser.add_argument(option, type=kind, default=default, help=text)
    parser.add_argument(
        "--server-env", action="append", default=[], metavar="NAME=VALUE",
        help="more server environment, repeatable (TENSORBITS_MALLOC_TUNING=0: malloc untuned)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.duration > 600 or args.clients > 256 or args.abusers > 64:
        parser.error("bounded: --duration <= 600, --clients <= 256, --abusers <= 64")
    if any("=" not in item for item in args.server_env):
        parser.error("--server-env takes NAME=VALUE")
    return args


def server_env(args: argparse.Namespace) -> dict[str, str]:
    env = {
        "TENSORBITS_BACKEND": "numpy",
        "TENSORBITS_LOG_LEVEL": "warning",
        "TENSORBITS_MAX_INFLIGHT_BYTES": str(args.max_inflight_mib * MiB),
        "TENSORBITS_MAX_BODY_BYTES": str(args.max_body_mib * MiB),
        "TENSORBITS_MAX_INFLIGHT_REQUESTS": "64",
        "TENSORBITS_GRPC_PORT": str(free_port()),  # the default port may be taken here
    }
    env.update(item.split("=", 1) for item in args.server_env)
    return env


@dataclass
class Run:
    stats: Stats
    elapsed: float
    baseline: int
    peak: int
    alive: bool
    code: int
    sampler: RssSampler
    own: RssSampler  # the load generator's own RSS: it must not be what fills the machine
    abuse: Counter[tuple[str, str]]


def run(args: argparse.Namespace) -> Run:
    port = free_port()
    argv = [str(BIN / "tensorbits"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    ready = f"http://127.0.0.1:{port}/v2/health/ready"
    stats = Stats()
    abuse: Counter[tuple[str, str]] = Counter()
    with server(argv, ready, server_env(args), 60.0) as proc:  # stopped by SIGTERM
        warm = argparse.Namespace(
            **{**vars(args), "duration": 0.5, "clients": 1, "max_requests": 5}
        )
        asyncio.run(run_load(port, warm, Stats(), Phase(None)))
        baseline = vm(proc.pid, "VmRSS")
        with (
            RssSampler(proc.pid, args.sample_every) as sampler,
            RssSampler(os.getpid(), args.sample_every) as own,
        ):
            if args.abusers:
                with AbuseProcess(port, args.abusers) as abusers:
                    elapsed = asyncio.run(run_load(port, args, stats, Phase(abusers.active)))
                    abuse = abusers.outcomes()
            else:
                elapsed = asyncio.run(run_load(port, args, stats, Phase(None)))
        peak = vm(proc.pid, "VmHWM")
        alive = proc.poll() is None
    return Run(stats, elapsed, baseline, peak, alive, proc.returncode, sampler, own, abuse)


def report_latency(args: argparse.Namespace, stats: Stats) -> dict[str, bool]:
    """p50/p99 per kind and window; the check of p99 under abuse against calm p99."""
    checks: dict[str, bool] = {}
    groups = sorted({group for group, _ in stats.latencies})
    print("latency (ms)        calm: p50     p99      n |  abuse: p50     p99      n | p99 ratio")
    for group in groups:
        calm, abused = stats.latencies[(group, "calm")], stats.latencies[(group, "abuse")]
        ratio = pct(abused, 99) / pct(calm, 99) if calm and abused else float("nan")
        print(
            f"  {group:<10} {pct(calm, 50):12.1f} {pct(calm, 99):7.1f} {len(calm):6d} | "
            f"{pct(abused, 50):11.1f} {pct(abused, 99):7.1f} {len(abused):6d} | {ratio:6.2f}x"
        )
        if args.abusers and group in ("large", "small"):
            checks[f"{group}: p99 under abuse <= {args.max_abuse_ratio}x calm p99"] = (
                ratio <= args.max_abuse_ratio
            )
    if stats.shed:
        print(f"  503 (shed) by window: {dict(stats.shed)}")
    return checks


def report_abuse(outcomes: Counter[tuple[str, str]]) -> dict[str, bool]:
    print(f"abusive requests: {sum(outcomes.values())}")
    for kind in KINDS:
        found = {o: n for (k, o), n in sorted(outcomes.items()) if k == kind}
        print(f"  {kind:<15} {', '.join(f'{o}: {n}' for o, n in found.items()) or '-'}")
    bad = {f"{k} {o}": n for (k, o), n in outcomes.items() if failed(o)}
    if bad:
        print(f"  failed: {bad}")
    return {"abusive requests refused (4xx JSON or closed), none unanswered": not bad}


def report_memory(args: argparse.Namespace, result: Run, bound: int) -> dict[str, bool]:
    sampler = result.sampler
    print(f"server RSS every {args.sample_every:g} s (t, MiB):")
    print("\n".join(sampler.series()))
    print("minute  highest sampled RSS  peak so far (VmHWM)  load generator's peak so far")
    own = {minute: hwm for minute, _, hwm in result.own.per_minute()}
    for minute, top, hwm in sampler.per_minute():
        print(
            f"  {minute:4d}  {top / MiB:13.0f} MiB  {hwm / MiB:12.0f} MiB"
            f"  {own.get(minute, 0) / MiB:20.0f} MiB"
        )
    print(
        f"server RSS: baseline {result.baseline / MiB:.0f} MiB, peak (VmHWM) "
        f"{result.peak / MiB:.0f} MiB, bound {bound / MiB:.0f} MiB (in-flight "
        f"{args.max_inflight_mib} + overhead {args.overhead_mib})"
    )
    checks = {"peak RSS within bound": result.peak <= bound}
    if result.elapsed >= 120:
        first = sampler.peak_at(60)
        growth = result.peak / first
        print(
            f"peak after the first minute {first / MiB:.0f} MiB, after {result.elapsed:.0f} s "
            f"{result.peak / MiB:.0f} MiB: {growth:.3f}x"
        )
        checks[f"peak RSS <= {args.max_growth}x the first minute's"] = growth <= args.max_growth
    return checks


def soak_refusals(argv: list[str]) -> int:
    """The ``soak-refusals`` load (the module's help)."""
    from support.live import serve
    from support.refusal_soak import SERVER_ENV, run_mix

    parser = argparse.ArgumentParser(prog="load.py soak-refusals")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args(argv)
    # No gRPC nor metrics listener: this measures HTTP, on whatever ports are free.
    os.environ.setdefault("TENSORBITS_GRPC_PORT", "0")
    os.environ.setdefault("TENSORBITS_METRICS_PORT", "0")
    with serve(dict(SERVER_ENV)) as server:
        start = server.reset_peak_rss()
        figures = run_mix(server, clients=args.clients, seconds=args.seconds)
        rss = {"start": start, "peak": server.peak_rss(), "end": server.rss()}
    line = {
        "seconds": args.seconds,
        "clients": args.clients,
        **figures.summary(),
        "rss_mib": {name: round(value / MiB) for name, value in rss.items()},
    }
    print(json.dumps(line), flush=True)
    return 1 if figures.transport_errors else 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["soak-refusals"]:
        return soak_refusals(argv[1:])
    if argv[:1] == ["rolling-restart"]:
        from support.rolling import main as rolling_restart

        return rolling_restart(argv[1:])
    args = parse_args(argv)
    # The load generator allocates large buffers as the server does (bodies, expected answers,
    # responses) and, without the same malloc setting, its RSS grew to several GiB in a few
    # minutes on this shared machine; the server's own setting is what the run measures.
    tune_allocator(os.environ.copy())
    gc.freeze()  # the start-up objects: collect_cycles never needs to walk them
    result = run(args)
    stats = result.stats
    elapsed = result.elapsed
    total = sum(stats.statuses.values())
    print(
        f"tensorbits load test: {args.clients} clients, {elapsed:.1f} s, model {MODEL}, "
        f"large {args.large_mib} MiB x2 inputs ({args.large_share:.0%}), small "
        f"{args.small_bytes} B, invalid {args.invalid_share:.0%}; {args.abusers} abusers in "
        f"every other {args.abuse_window:g} s window"
    )
    print(
        f"limits: max_inflight_bytes {args.max_inflight_mib} MiB, max_body_bytes "
        f"{args.max_body_mib} MiB; server env {args.server_env or '-'}"
    )
    print(
        f"answers: {total} ({total / elapsed:.0f}/s); served (200 or expected 4xx): {stats.served}"
    )
    for (group, status), count in sorted(stats.statuses.items()):
        print(f"  {group:<8} {status}: {count}")
    if stats.transport_errors:
        print(f"  transport errors: {dict(stats.transport_errors)}")
    checks: dict[str, bool] = {}
    checks.update(report_latency(args, stats))
    if args.abusers:
        checks.update(report_abuse(result.abuse))
    bound = (args.max_inflight_mib + args.overhead_mib) * MiB
    checks.update(report_memory(args, result, bound))
    print(f"server exit code after SIGTERM: {result.code}")
    checks = {
        "every 200 correct": not stats.wrong,
        "no 5xx but 503+Retry-After; invalid got 4xx JSON": not stats.bad_errors,
        "no transport errors": not stats.transport_errors,
        "server alive through the run": result.alive,
        "clean exit": result.code in (0, -signal.SIGTERM),
        **checks,
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'FAIL'}] {name}")
    for line in (stats.wrong + stats.bad_errors)[:10]:
        print("   ", line)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
