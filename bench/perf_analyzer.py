"""perf_analyzer, Triton's own Performance Analyzer, against tensorbits and a real Triton in one run.

The ecosystem's standard measurement: ``scripts/perf_analyzer.sh`` (perf_analyzer 2.60.0 from
its PyPI wheel, set up once in the user's cache) runs with the same flags against
``tensorbits serve`` (NumPy backend, HTTP and gRPC on free 127.0.0.1 ports) and against the Triton
peer (``bench/peers.py``: Triton Inference Server from ``nvidia-pytriton``, its
``tritonserver`` serving a Python-backend BIT_NOT under our model and tensor names), over HTTP and
gRPC, for:

  small     a 16-element UINT8 BIT_NOT, one request at a time (``--concurrency-range 1``), time
            windows of ``--interval-ms``;
  small-c8  the same with 8 requests in flight (``--concurrency-range 8``);
  large     a 64 MiB BIT_NOT (64 MiB in, 64 MiB out), one at a time, windows of at least 5
            requests (``--measurement-mode count_windows``).

perf_analyzer repeats windows until three in a row agree within ``--stability`` percent (default
50: a shared 2-core machine moves the figures by more than perf_analyzer's default 10) for at most
8 windows, and reports the last three: throughput, and the p50/p99 latency its client measured.
About 6 minutes with the defaults.
Each case runs on both servers back to back, the order swapped every case and every round;
``--rounds`` rounds, medians. A run that fails (or never stabilizes) is shown with its reason.
When the Triton peer cannot be installed or started, says why and measures tensorbits alone.
Usage:

  .venv/bin/python bench/perf_analyzer.py [--rounds N] [--interval-ms MS] [--cases small,large]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
# The script's runner is the live test's (tests/support/perf_analyzer.py).
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))

from support.perf_analyzer import SCRIPT, run_perf_analyzer

from bench import grpc_vs_triton
from bench.harness import note
from bench.peers import PeerUnavailable, stop_on_signals, triton_peer

NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
LARGE_ELEMENTS = 64 * 1024 * 1024
RUN_TIMEOUT_S = 300


@dataclass(frozen=True)
class Server:
    name: str
    http_url: str  # host:port, perf_analyzer's -u
    grpc_url: str


@dataclass(frozen=True)
class Case:
    name: str
    flags: tuple[str, ...]


def cases(interval_ms: int) -> dict[str, Case]:
    window = ("--measurement-interval", str(interval_ms))
    return {
        "small": Case("small", ("--shape", "InputTensor:16", "--concurrency-range", "1", *window)),
        "small-c8": Case(
            "small-c8", ("--shape", "InputTensor:16", "--concurrency-range", "8", *window)
        ),
        "large": Case(
            "large",
            (
                *("--shape", f"InputTensor:{LARGE_ELEMENTS}", "--concurrency-range", "1"),
                *("--measurement-mode", "count_windows", "--measurement-request-count", "5"),
            ),
        ),
    }


@dataclass(frozen=True)
class Result:
    throughput: float  # inferences/s
    p50_ms: float
    p99_ms: float


class RunFailed(RuntimeError):
    pass


def perf_analyzer(server: Server, protocol: str, case: Case, stability: int) -> Result:
    """One perf_analyzer run; its CSV report read for the figures."""
    url = server.http_url if protocol == "http" else server.grpc_url
    with tempfile.TemporaryDirectory(prefix="tensorbits-pa-") as tmp:
        args = [
            "-m", NOT, "-i", protocol, "-u", url, *case.flags,
            "--stability-percentage", str(stability), "--max-trials", "8",
        ]  # fmt: skip
        done = run_perf_analyzer(args, Path(tmp) / "report.csv", RUN_TIMEOUT_S)
        if done.returncode != 0 or not done.rows:
            tail = " | ".join(done.output.strip().splitlines()[-3:])
            raise RunFailed(f"exit {done.returncode}: {tail}")
        row = done.rows[0]
    return Result(
        float(row["Inferences/Second"]),
        float(row["p50 latency"]) / 1e3,
        float(row["p99 latency"]) / 1e3,
    )


@contextlib.contextmanager
def tensorbits() -> Iterator[Server]:
    """``tensorbits serve`` with gRPC too, started as bench/grpc_vs_triton.py starts it."""
    with grpc_vs_triton.tensorbits() as started:
        yield Server("tensorbits", f"127.0.0.1:{started.http_port}", started.grpc_target)


@contextlib.contextmanager
def servers() -> Iterator[list[Server]]:
    with contextlib.ExitStack() as stack:
        found = [stack.enter_context(tensorbits())]
        try:
            peer = stack.enter_context(triton_peer())
        except PeerUnavailable as exc:
            print(f"Triton peer unavailable, tensorbits measured alone: {exc}")
        else:
            found.append(Server("Triton", peer.http_url.removeprefix("http://"), peer.grpc_url))
            print(f"Triton peer: Triton Inference Server {peer.version} (nvidia-pytriton)")
        yield found


Key = tuple[str, str, str]  # case, protocol, server


def measure(
    running: list[Server], chosen: list[Case], rounds: int, stability: int
) -> dict[Key, list[Result | str]]:
    # Keyed in the table's order (case, protocol, tensorbits first), whatever order ran.
    results: dict[Key, list[Result | str]] = {
        (case.name, protocol, server.name): []
        for case in chosen
        for protocol in ("http", "grpc")
        for server in running
    }
    turn = 0
    for round_ in range(rounds):
        for case in chosen:
            for protocol in ("http", "grpc"):
                order = running if turn % 2 == 0 else running[::-1]
                turn += 1
                for server in order:
                    note(f"  round {round_ + 1}/{rounds}: {case.name} {protocol} {server.name}")
                    key = (case.name, protocol, server.name)
                    try:
                        outcome: Result | str = perf_analyzer(server, protocol, case, stability)
                    except (RunFailed, subprocess.TimeoutExpired) as exc:
                        outcome = f"failed: {exc}"
                    results[key].append(outcome)
    return results


def median(runs: list[Result | str]) -> Result | None:
    done = [r for r in runs if isinstance(r, Result)]
    if not done:
        return None
    return Result(
        statistics.median(r.throughput for r in done),
        statistics.median(r.p50_ms for r in done),
        statistics.median(r.p99_ms for r in done),
    )


def report(results: dict[Key, list[Result | str]], rounds: int) -> None:
    print(
        f"\n{'case':<9} {'protocol':<8} {'server':<11} {'infer/s':>9} {'p50 ms':>9} {'p99 ms':>9}"
    )
    for (case, protocol, server), runs in results.items():
        m = median(runs)
        if m is None:
            print(f"{case:<9} {protocol:<8} {server:<11} {runs[-1]}")
            continue
        print(
            f"{case:<9} {protocol:<8} {server:<11} {m.throughput:>9,.1f} {m.p50_ms:>9.3f} "
            f"{m.p99_ms:>9.3f}"
        )
        for run in runs:
            if isinstance(run, str):
                print(f"{'':<30} one round {run}")
    if rounds > 1:
        print(f"(medians of {rounds} rounds)")
    print("\ntensorbits / Triton (throughput: above 1 is faster; latency: below 1 is faster):")
    for case, protocol, server in results:
        if server != "tensorbits":
            continue
        ours = median(results[(case, protocol, "tensorbits")])
        theirs = median(results.get((case, protocol, "Triton"), []))
        if ours is None or theirs is None:
            continue
        print(
            f"  {case:<9} {protocol:<5} throughput {ours.throughput / theirs.throughput:.2f}x, "
            f"p50 {ours.p50_ms / theirs.p50_ms:.2f}x, p99 {ours.p99_ms / theirs.p99_ms:.2f}x"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument(
        "--interval-ms", type=int, default=2000, help="small cases' window (default 2000)"
    )
    parser.add_argument(
        "--stability", type=int, default=50, help="perf_analyzer's --stability-percentage"
    )
    parser.add_argument("--cases", default="small,small-c8,large", help="which, comma-separated")
    args = parser.parse_args(argv)
    table = cases(args.interval_ms)
    chosen = [table[name] for name in args.cases.split(",")]
    stop_on_signals()
    setup = subprocess.run(
        ["bash", str(SCRIPT), "--setup-only"], capture_output=True, text=True, check=False
    )
    if setup.returncode != 0:
        print(f"skipped: perf_analyzer cannot be set up: {setup.stderr.strip()}")
        return 1
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start")
    with servers() as running:
        results = measure(running, chosen, args.rounds, args.stability)
    report(results, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
