"""In process, no sockets: where the time of a small request goes, and how quickly the command
line and the client start. Each part against its floor measured in the same run.

  v2       one 16-element BIT_NOT in v2 binary through the whole ASGI app (middleware, routing,
           body, plan, run, response): header cache on and off, one API key configured and
           sent, its access line written (the shipped log level, ``info``; the other rows at
           ``warning``); against a bare FastAPI GET /ping; best of ``--rounds`` rounds
  startup  ``tensorbits --help`` and ``import tensorbits_client`` (target 0.3 s) and their
           neighbours, each ``--runs`` times in a fresh process, interleaved (the file cache
           warmed by ``--warmup`` runs first); ``python -c pass`` is the floor

    .venv/bin/python bench/in_process.py                         # both parts: about a minute
    .venv/bin/python bench/in_process.py --parts startup --runs 20
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import NOT, v2_binary_request
from bench.harness.baselines import app as bare_app
from tensorbits.auth import ApiKeyMiddleware
from tensorbits.config.settings import Settings
from tensorbits.logs import configure_logging
from tensorbits.server.app import create_app

_NULL = open(os.devnull, "w")  # noqa: SIM115 (the server's log lines, as JSON: a log driver's)


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> Scope:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1234),
        "headers": [(b"host", b"bench"), *headers],
    }  # fmt: skip


async def _per_call(app: Any, scope: Scope, body: bytes, rounds: int, calls: int) -> float:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    for _ in range(200):  # warm: caches, first-call imports
        await app(dict(scope), receive, send)
    if set(statuses) != {200}:
        raise RuntimeError(f"{scope['path']} answered {sorted(set(statuses))}")
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            await app(dict(scope), receive, send)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


async def v2_small(rounds: int) -> dict[str, float]:
    head, parts = v2_binary_request({"InputTensor": np.full(16, 65, np.uint8)}, "OutputTensor")
    body = b"".join(bytes(p) for p in parts)
    headers = [(b"content-length", str(len(body)).encode()),
               (b"inference-header-content-length", str(len(head)).encode())]  # fmt: skip
    infer = _scope("POST", f"/v2/models/{NOT}/infer", headers)
    times = {"bare FastAPI GET /ping": await _per_call(bare_app, _scope("GET", "/ping", []), b"",
                                                        rounds, 4000)}  # fmt: skip
    key = "bench-key-0123456789abcdefghijklmnopqrstu"
    keyed = {**infer, "headers": [*infer["headers"], (b"authorization", f"Bearer {key}".encode())]}
    for label, scope, settings in (
        ("v2 infer, header cache on", infer, {}),
        ("v2 infer, cache off", infer, {"header_cache_bytes": 0}),
        ("v2 infer, cache on, one API key", keyed, {"api_keys": key}),  # auth.py checks it
        ("v2 infer, cache on, access line", infer, {"log_level": "info"}),  # the shipped level
    ):
        given: dict[str, Any] = {"backend": "numpy", "log_level": "warning", **settings}
        app = create_app(chosen := Settings(grpc_port=0, **given))  # no gRPC: 8001 may be taken
        with contextlib.redirect_stderr(_NULL):  # what writing a line costs, not a terminal's
            configure_logging(chosen.log_level, json_lines=True)
        async with app.router.lifespan_context(app):
            times[label] = await _per_call(app, scope, body, rounds, 4000)
    # The check by itself: the middleware in front of an app that only answers, minus that app.
    checked = ApiKeyMiddleware(_answer, keys=[SecretStr(key)], open_paths=())
    alone = await _per_call(_answer, keyed, b"", rounds, 20000)
    added = await _per_call(checked, keyed, b"", rounds, 20000) - alone
    times["API key check alone (added)"] = added
    return times


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b""})


TARGET_S = 0.3  # the target for `tensorbits --help` and `import tensorbits_client`


def commands() -> dict[str, tuple[list[str], bool]]:
    """Label -> (argv, whether the 0.3 s target applies)."""
    python = sys.executable
    # The console script next to this interpreter: what a user of the venv runs.
    tensorbits = str(Path(python).with_name("tensorbits"))
    return {
        "python -c pass": ([python, "-c", "pass"], False),
        "tensorbits --help": ([tensorbits, "--help"], True),
        "tensorbits --version": ([tensorbits, "--version"], False),
        "tensorbits serve --help": ([tensorbits, "serve", "--help"], False),
        "tensorbits operators": ([tensorbits, "operators"], False),
        "import tensorbits_client": ([python, "-c", "import tensorbits_client"], True),
        "from tensorbits_client import Client": (
            [python, "-c", "from tensorbits_client import Client"],
            False,
        ),
    }


def run_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def startup(runs: int, warmup: int) -> None:
    table = commands()
    for argv, _ in table.values():
        for _ in range(warmup):
            run_once(argv)
    times: dict[str, list[float]] = {label: [] for label in table}
    for _ in range(runs):
        for label, (argv, _) in table.items():
            times[label].append(run_once(argv))
    print(f"\nstart-up: {runs} fresh processes per command, interleaved")
    print(f"| {'command':<38} | median s | min s | median / {TARGET_S} s target |")
    print(f"|{'-' * 40}|---------:|------:|----------------------:|")
    for label, (_, targeted) in table.items():
        median = statistics.median(times[label])
        ratio = f"{median / TARGET_S:.2f}" if targeted else "-"
        print(f"| {label:<38} | {median:8.3f} | {min(times[label]):5.3f} | {ratio:>21} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="v2,startup", help="v2, startup")
    parser.add_argument("--rounds", type=int, default=7, help="(v2) rounds")
    parser.add_argument("--runs", type=int, default=20, help="(startup) fresh processes")
    parser.add_argument("--warmup", type=int, default=2, help="(startup) untimed runs first")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if "v2" in parts:
        small = uvloop.run(v2_small(args.rounds))  # the event loop the server runs on
        ping = small["bare FastAPI GET /ping"]
        print(f"v2, one 16-element BIT_NOT through the ASGI app, best of {args.rounds}")
        for label, seconds in small.items():
            print(f"  {label:<34} {seconds * 1e6:7.1f} µs  ({seconds / ping:.2f}x the ping)")
    if "startup" in parts:
        startup(args.runs, args.warmup)


if __name__ == "__main__":
    main()
