"""Where a small request's time goes under load, layer by layer: a sampling profile
of a live ``tensorbits serve`` while wrk drives it with the 16-element v2 binary BIT_NOT.

Starts the server (NumPy backend, log level warning, one worker) on a free loopback port, runs
``wrk -t1 -c32`` against it for ``--seconds`` and, meanwhile, py-spy on the server (100 samples
a second, native frames: a syscall is counted by name; ``--idle``: the epoll wait too) and keeps
its event loop thread. Every sample is put in one layer by the first rule
of ``LAYERS`` that matches its stack (a rule table: the layers are data), and each layer's share
of the thread's time becomes microseconds per request with the request rate wrk measured over
the same seconds. py-spy slows the server while it samples (the rate is printed beside the rate
of an unprofiled run), so read the budget as shares (at 100 samples a second it ran at about 0.8x).

py-spy is not a project dependency: install it apart and name it, e.g.::

    PROF=$(mktemp -d) && .tools/bin/uv venv "$PROF" && .tools/bin/uv pip install --python "$PROF/bin/python" py-spy
    .venv/bin/python bench/small_request_profile.py --py-spy "$PROF/bin/py-spy" [--seconds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import BIN, free_port, wait_until_up
from bench.http_vs_triton import WrkResult, WrkTarget, small_infer, wrk

# A stack is its frames, root first: "function (file:line)" for Python, "symbol (lib)" native.
Stack = list[str]
Rule = Callable[[Stack], bool]


def _leaf(*names: str) -> Rule:
    return lambda frames: frames[-1].split(" (")[0] in names


def _anywhere(*needles: str) -> Rule:
    return lambda frames: any(n in f for f in frames for n in needles)


def _innermost(*files: str) -> Rule:
    """The innermost frame of a Python file is in one of ``files``."""

    def rule(frames: Stack) -> bool:
        for frame in reversed(frames):
            if ".py:" in frame:
                return any(f in frame for f in files)
        return False

    return rule


# First match wins: the order says which layer a frame shared by two belongs to.
LAYERS: tuple[tuple[str, Rule], ...] = (
    ("event loop: idle in epoll", _leaf("epoll_wait", "epoll_pwait")),
    (
        "response write (uvicorn send + write syscall)",
        _anywhere("RequestResponseCycle.send", "OneWriteCycle.send"),
    ),
    ("logs", _anywhere("logging/__init__", "tensorbits/logs.py")),
    (
        "request read (read syscall)",
        lambda f: f[-1].startswith(("read ", "recv")) and _anywhere("uv__read")(f),
    ),
    ("body deadline (asyncio.timeout)", _innermost("asyncio/timeouts.py")),
    ("compute (encode, kernels, NumPy)", _anywhere("encode (tensorbits/api/rest_infer.py")),
    (
        "plan (header cache, codec)",
        _anywhere("plan (tensorbits/api/rest_infer.py", "tensorbits_protocol/"),
    ),
    (
        "endpoint (admission, body, response framing)",
        _innermost(
            "tensorbits/api/v2_infer.py",
            "tensorbits/api/admitted.py",
            "tensorbits/api/body.py",
            "tensorbits/offload.py",
            "tensorbits/api/deps.py",
            "tensorbits/core/dataplane.py",
            "tensorbits/core/admission.py",
        ),
    ),
    ("metrics + request id + access log (observability.py)", _innermost("observability.py")),
    (
        "ASGI hops (proxy headers, FastAPI/Starlette middleware, HEAD, fast path)",
        _innermost(
            "starlette/",
            "fastapi/",
            "proxy_headers.py",
            "tensorbits/api/head.py",
            "tensorbits/api/fastpath.py",
            "tensorbits/auth.py",
            "run_asgi",
        ),
    ),
    (
        "HTTP protocol (httptools parser, uvicorn/guarded callbacks)",
        _innermost("httptools_impl.py", "guarded_protocol.py", "flow_control.py"),
    ),
    ("asyncio (tasks, events)", _innermost("asyncio/")),
    ("event loop (uvloop, task steps, other native)", lambda frames: True),
)


def classify(lines: Iterator[str]) -> Counter[str]:
    """Samples per layer from py-spy's raw output (``stack count`` a line) of one thread."""
    samples: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        if not any(
            "serve (tensorbits/cli.py" in f or "_serve (tensorbits/cli.py" in f for f in frames
        ):
            continue  # another thread: NumPy's, the offload pool's
        layer = next(name for name, rule in LAYERS if rule(frames))
        samples[layer] += int(count)
    return samples


@contextlib.contextmanager
def server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "TENSORBITS_BACKEND": "numpy", "TENSORBITS_LOG_LEVEL": "warning"}
    env.setdefault("TENSORBITS_GRPC_PORT", "0")
    proc = subprocess.Popen(
        [str(BIN / "tensorbits"), "serve", "--port", str(port)], env=env, stdout=subprocess.DEVNULL
    )
    try:
        wait_until_up(f"http://127.0.0.1:{port}/v2/health/ready")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--py-spy", required=True, help="the py-spy executable")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument(
        "--rate", type=int, default=100, help="py-spy samples per second (default 100)"
    )
    parser.add_argument(
        "--python-only",
        action="store_true",
        help="Python frames only (syscalls counted in the Python frame that made them)",
    )
    parser.add_argument(
        "--idle", action="store_true", help="sample idle threads too (the epoll wait; slower)"
    )
    args = parser.parse_args()
    port = free_port()
    target = WrkTarget.for_port(port, small_infer())
    with server(port) as proc, tempfile.TemporaryDirectory() as tmp:
        wrk(target, 2, connections=32)  # warm: connections, header cache, allocator
        plain = wrk(target, args.seconds, connections=32)
        raw = Path(tmp) / "raw.txt"
        spy = [
            args.py_spy, "record", "-p", str(proc.pid), "-d", str(args.seconds), "-r",
            str(args.rate), *([] if args.python_only else ["--native"]),
            *(["--idle"] if args.idle else []), "-f", "raw", "-o", str(raw),
        ]  # fmt: skip
        results: dict[str, WrkResult] = {}
        loader = threading.Thread(
            target=lambda: results.update(run=wrk(target, args.seconds, connections=32))
        )
        loader.start()
        subprocess.run(spy, check=True, capture_output=True, timeout=args.seconds + 60)
        loader.join()
        samples = classify(iter(raw.read_text().splitlines()))
    profiled = results["run"]
    total = sum(samples.values())
    seconds_sampled = total / args.rate
    print(
        f"wrk -t1 -c32 on a 16-element v2 binary BIT_NOT: {plain.rps:,.0f} req/s unprofiled, "
        f"{profiled.rps:,.0f} req/s while py-spy sampled ({args.rate}/s"
        f"{'' if args.python_only else ', native'}"
        f"{', idle' if args.idle else ''})"
    )
    print(f"event loop thread: {total} samples ({seconds_sampled:.1f} s)")
    print(f"{'layer':<76} {'share':>6} {'µs/request':>11}")
    for name, _ in LAYERS:
        share = samples[name] / total if total else 0.0
        per_request = share * seconds_sampled / (profiled.rps * args.seconds) * 1e6
        print(f"{name:<76} {share:6.1%} {per_request:11.1f}")
    print(f"{'all (one core: 1e6 / req/s while profiled)':<76} {'':>6} {1e6 / profiled.rps:11.1f}")


if __name__ == "__main__":
    main()
