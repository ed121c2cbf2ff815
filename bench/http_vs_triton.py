"""Small requests under wrk, in one run: tensorbits with 1 and 2 workers, a bare FastAPI
``GET /ping`` and a real Triton Inference Server, as ratios, with p50 and p99 latency.

Every contestant is started once, then measured in ``--rounds`` interleaved rounds (the order
rotates each round, so drift in this shared machine hits all of them alike): ``wrk -t1 -c32
--latency`` for ``--seconds`` each, the 16-element BIT_NOT in v2 binary (the same request bytes
to tensorbits and to Triton, whose Python-backend model does the same NumPy call;
``bench/peers.py``), an empty ``GET /ping`` to the FastAPI app (``bench/harness/baselines.py``,
uvicorn with uvloop and httptools, one worker). Reported: each contestant's median req/s, p50
and p99 over the rounds, and the median over rounds of its ratio to Triton and to the ping,
each ratio taken within one round; and the CPU time its processes (every worker, Triton's
backend stubs) used per request (``/proc``: utime + stime over the run, over wrk's count), a
figure that other work on a shared machine disturbs much less than the rate. Every wrk run
must answer 200 only.

Targets: tensorbits with 1 worker >= 0.9x Triton; the best configuration >= 1.2x.

    .venv/bin/python bench/http_vs_triton.py                    # 5 rounds of 4 s: about 2 min
    .venv/bin/python bench/http_vs_triton.py --rounds 7 --seconds 5 --no-triton
    B=$(mktemp -d) && git worktree add "$B" <commit> && .venv/bin/python bench/http_vs_triton.py --before "$B"
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import baseline_server, note, tensorbits_server
from bench.http_service import wrk_latency_ms

MODEL = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
TARGETS = {"tensorbits, 1 worker": 0.9, "best": 1.2}


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()


def small_infer(elements: int = 16) -> Request:
    """The v2 binary BIT_NOT of ``elements`` UINT8s, its output asked for in binary."""
    head = json.dumps(
        {
            "inputs": [
                {"name": "InputTensor", "shape": [elements], "datatype": "UINT8",
                 "parameters": {"binary_data_size": elements}},
            ],
            "outputs": [{"name": "OutputTensor", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    return Request(
        "POST",
        f"/v2/models/{MODEL}/infer",
        head + bytes(range(65, 65 + elements)),
        (("Inference-Header-Content-Length", str(len(head))),),
    )


PING = Request("GET", "/ping")


@dataclass(frozen=True)
class WrkTarget:
    url: str
    request: Request

    @classmethod
    def for_port(cls, port: int, request: Request) -> WrkTarget:
        return cls(f"http://127.0.0.1:{port}{request.path}", request)

    def script(self) -> str:
        body = (
            '"' + "".join(f"\\{b}" for b in self.request.body) + '"' if self.request.body else "nil"
        )
        lines = [f'wrk.method = "{self.request.method}"', f"wrk.body = {body}"]
        lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in self.request.headers]
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class WrkResult:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int = 0
    cpu_s: float = 0.0  # CPU time the server's processes used meanwhile (all their threads)

    @property
    def cpu_us_per_request(self) -> float:
        return self.cpu_s / self.requests * 1e6 if self.requests else float("nan")


# --- the server's CPU time (Linux /proc): less sensitive than req/s to other work on the machine


def listening_pids(port: int) -> set[int]:
    """The processes with a socket listening on ``port`` (each worker of ``--workers N``)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(f"socket:[{fields[9]}]")
    found = set()
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in fd_dir.iterdir()):
                found.add(int(fd_dir.parent.name))
    return found


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()  # fields from the state on (the name may hold spaces)


def with_descendants(pids: set[int]) -> frozenset[int]:
    """``pids`` and every process below them (Triton's Python-backend stubs)."""
    parents = {}
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(int(entry.name))
        if fields is not None:
            parents[int(entry.name)] = int(fields[1])
    found = set(pids)
    grew = True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return frozenset(found)


def cpu_seconds(pids: frozenset[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])  # utime, stime (all threads)
    return total / ticks


def wrk(
    target: WrkTarget, seconds: float, connections: int = 32, server: frozenset[int] = frozenset()
) -> WrkResult:
    """One ``wrk -t1`` run; raises unless every answer was a 2xx. ``server``: the server's
    processes, whose CPU time over the run is measured."""
    cpu_before = cpu_seconds(server)
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        script.write(target.script())
        script.flush()
        out = subprocess.run(
            ["wrk", "-t1", f"-c{connections}", f"-d{round(seconds)}s", "--latency", "-s", script.name,
             target.url],
            capture_output=True, text=True, check=True, timeout=seconds + 60,
        ).stdout  # fmt: skip
    for problem in (r"Non-2xx or 3xx responses: (\d+)", r"Socket errors: (.*)"):
        if (found := re.search(problem, out)) is not None:
            raise RuntimeError(f"{target.url}: {found.group(0)}\n{out}")
    cpu = cpu_seconds(server) - cpu_before
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    done = re.search(r"(\d+) requests in", out)
    if rate is None or done is None:
        raise RuntimeError(f"could not read wrk's output:\n{out}")
    return WrkResult(
        float(rate.group(1)),
        wrk_latency_ms(out, 50),
        wrk_latency_ms(out, 99),
        int(done.group(1)),
        cpu,
    )


# --- the contestants --------------------------------------------------------------------------

Contestant = Callable[[], contextlib.AbstractContextManager[WrkTarget]]


@contextlib.contextmanager
def _tensorbits(workers: int, sources: Path | None = None) -> Iterator[WrkTarget]:
    env = {"TENSORBITS_WORKERS": str(workers), "TENSORBITS_GRPC_PORT": "0"}
    if sources is not None:  # another checkout's server code (--before), this one's .venv
        env["PYTHONPATH"] = ":".join(
            str(sources / member / "src") for member in ("service", "client", "protocol")
        )
    with tensorbits_server(**env) as port:
        yield WrkTarget.for_port(port, small_infer())


@contextlib.contextmanager
def _ping() -> Iterator[WrkTarget]:
    with baseline_server() as port:
        yield WrkTarget.for_port(port, PING)


@contextlib.contextmanager
def _triton() -> Iterator[WrkTarget]:
    from bench.peers import triton_peer

    with triton_peer() as peer:
        yield WrkTarget(f"{peer.http_url}{small_infer().path}", small_infer())


def contestants(workers: list[int], triton: bool, before: Path | None) -> dict[str, Contestant]:
    found: dict[str, Contestant] = {}
    for n in workers:
        found[f"tensorbits, {n} worker{'s' if n > 1 else ''}"] = functools.partial(_tensorbits, n)
    if before is not None:
        found["before, 1 worker"] = lambda: _tensorbits(1, before)
    found["FastAPI GET /ping"] = _ping
    if triton:
        found["Triton"] = _triton
    return found


def measure(
    started: dict[str, WrkTarget], rounds: int, seconds: float, connections: int
) -> dict[str, list[WrkResult]]:
    names = list(started)
    for name in names:
        wrk(started[name], 1, connections)  # warm: connections, caches, allocator
    # Every worker is up and listening by now: their processes, for the CPU time.
    processes = {
        name: with_descendants(listening_pids(urlsplit(target.url).port or 80))
        for name, target in started.items()
    }
    results: dict[str, list[WrkResult]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            note(f"round {r + 1}/{rounds}: {name}")
            results[name].append(wrk(started[name], seconds, connections, processes[name]))
    return results


def report(results: dict[str, list[WrkResult]], seconds: float, connections: int) -> None:
    rounds = len(next(iter(results.values())))
    reference = "Triton" if "Triton" in results else None
    print(
        f"16-element BIT_NOT, v2 binary (ping: empty GET), wrk -t1 -c{connections} "
        f"-d{seconds:g}s --latency, {rounds} interleaved rounds; medians over rounds"
    )
    print(
        f"{'server':<24} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'/ping':>7} "
        f"{'/Triton':>8} {'CPU µs/req':>11} {'/Triton':>8}  req/s by round"
    )
    ping = results["FastAPI GET /ping"]
    ratios: dict[str, float] = {}
    for name, runs in results.items():
        to_ping = statistics.median(a.rps / b.rps for a, b in zip(runs, ping, strict=True))
        to_triton = cpu_to_triton = ""
        cpu = statistics.median(r.cpu_us_per_request for r in runs)
        if reference is not None:
            ratio = statistics.median(
                a.rps / b.rps for a, b in zip(runs, results[reference], strict=True)
            )
            ratios[name] = ratio
            to_triton = f"{ratio:7.2f}x"
            theirs = statistics.median(r.cpu_us_per_request for r in results[reference])
            cpu_to_triton = f"{cpu / theirs:7.2f}x"
        print(
            f"{name:<24} {statistics.median(r.rps for r in runs):9,.0f} "
            f"{statistics.median(r.p50_ms for r in runs):8.2f} "
            f"{statistics.median(r.p99_ms for r in runs):8.2f} {to_ping:6.2f}x {to_triton:>8} "
            f"{cpu:11.1f} {cpu_to_triton:>8}  " + " ".join(f"{r.rps:,.0f}" for r in runs)
        )
    if reference is None:
        print("no Triton in this run: the targets are ratios to Triton, not judged")
        return
    ours = {k: v for k, v in ratios.items() if k.startswith("tensorbits")}
    one = ratios.get("tensorbits, 1 worker")
    if one is not None:
        verdict = "met" if one >= TARGETS["tensorbits, 1 worker"] else "NOT met"
        print(
            f"target 1 worker >= {TARGETS['tensorbits, 1 worker']}x Triton: {one:.2f}x, {verdict}"
        )
    best_name = max(ours, key=ours.__getitem__)
    best = ours[best_name]
    verdict = "met" if best >= TARGETS["best"] else "NOT met"
    print(f"target best >= {TARGETS['best']}x Triton: {best:.2f}x ({best_name}), {verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=4, help="each wrk run (default 4)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument(
        "--workers", default="1,2", help="tensorbits worker counts, comma-separated (default 1,2)"
    )
    parser.add_argument("--no-triton", action="store_true", help="leave the Triton peer out")
    parser.add_argument(
        "--before",
        type=Path,
        metavar="CHECKOUT",
        help="also tensorbits (1 worker) from another checkout's sources, e.g. a git worktree "
        "of an earlier commit: its service/src, client/src and protocol/src first on PYTHONPATH",
    )
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is needed: apt-get install wrk")
    if not 1 <= args.rounds <= 50 or not 0 < args.seconds <= 60:
        parser.error("bounded: 1 <= --rounds <= 50, 0 < --seconds <= 60")
    workers = [int(n) for n in args.workers.split(",") if n.strip()]
    wanted = contestants(workers, triton=not args.no_triton, before=args.before)
    with contextlib.ExitStack() as stack:
        started: dict[str, WrkTarget] = {}
        for name, start in wanted.items():
            note(f"starting {name} ...")
            try:
                started[name] = stack.enter_context(start())
            except Exception as exc:  # the Triton peer: unavailable here, say why and go on
                if name != "Triton":
                    raise
                print(f"Triton peer unavailable: {exc}")
        results = measure(started, args.rounds, args.seconds, args.connections)
    report(results, args.seconds, args.connections)
    return 0


if __name__ == "__main__":
    sys.exit(main())
