"""Where the time of a small request goes, in process (no sockets): what bench/http_service.py's
(b) and (c) are made of, measured the same way before and after a change.

  v2     one 16-element BIT_NOT in v2 binary through the whole ASGI app (middleware, routing,
         body, plan, run, response), header cache on and off, and with one API key configured
         and sent, against a bare FastAPI GET /ping
  batch  one /v1 batch of 100 16-element UINT32 XORs (bench/http_service.py's (c)): the SDK
         building and encoding it, the server decoding and planning it (cache off and on), and
         running the plan on the NumPy backend

Best of several rounds of many calls; every figure is per call. Usage:
.venv/bin/python bench/small_request_in_process.py [--rounds N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import uvloop
from pydantic import SecretStr
from starlette.types import Receive, Scope, Send

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import best_per_call, in_process_rounds
from bench.harness.baselines import app as bare_app
from bench.http_service import NOT, row_xor_batch, row_xors, v2_binary_request
from tensorbits.auth import ApiKeyMiddleware
from tensorbits.config.settings import Settings
from tensorbits.core import batch as planner
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.header_cache import HeaderCache
from tensorbits.server.app import create_app
from tensorbits_client import Client

MiB = 1 << 20


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
    headers = [
        (b"content-length", str(len(body)).encode()),
        (b"inference-header-content-length", str(len(head)).encode()),
    ]
    infer = _scope("POST", f"/v2/models/{NOT}/infer", headers)
    times = {"bare FastAPI GET /ping": await _per_call(bare_app, _scope("GET", "/ping", []), b"",
                                                        rounds, 4000)}  # fmt: skip
    key = "bench-key-0123456789abcdefghijklmnopqrstu"
    keyed = {**infer, "headers": [*infer["headers"], (b"authorization", f"Bearer {key}".encode())]}
    for label, scope, settings in (
        ("v2 infer, header cache on", infer, {}),
        ("v2 infer, cache off", infer, {"header_cache_bytes": 0}),
        ("v2 infer, cache on, one API key", keyed, {"api_keys": key}),  # auth.py checks it
    ):
        # grpc_port=0: no gRPC listener (the default port may be taken by a server running here)
        app = create_app(Settings(backend="numpy", log_level="warning", grpc_port=0, **settings))
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


def batch_small(rounds: int, dispatches: int = 100) -> dict[str, float]:
    a, b = row_xors(dispatches)
    client = Client("http://127.0.0.1:1", local_validation=False)  # never connects

    def build() -> Any:
        return row_xor_batch(client, a, b).plan()

    encoded = build().body
    body = bytearray(b"".join(bytes(part) for part in encoded.parts))
    header_length = int(encoded.headers["Inference-Header-Content-Length"])
    settings = Settings(backend="numpy")
    cache: HeaderCache[planner.BatchPlan] = HeaderCache(4 * MiB, 256 << 10)
    limits = planner.BatchLimits.of(settings.core_limits)
    plan = planner.plan_rest(body, header_length, limits)
    sinks = [memoryview(bytearray(plan.buffers[i].byte_size)) for i in plan.outputs]
    backend = NumpyBackend(1)
    times = {
        "SDK: build and encode the batch": best_per_call(build, rounds, 50),
        "server: decode and plan, cache off": best_per_call(
            lambda: planner.plan_rest(body, header_length, limits), rounds, 50
        ),
        "server: decode and plan, cache on": best_per_call(
            lambda: planner.plan_rest(body, header_length, limits, cache), rounds, 50
        ),
        "server: run the plan (NumPy)": best_per_call(
            lambda: planner.run_batch(plan, body, backend, sinks), rounds, 50
        ),
    }
    client.close()
    backend.close()
    return times


def main() -> None:
    rounds = in_process_rounds(__doc__, default=7)
    small = uvloop.run(v2_small(rounds))  # the event loop the server runs on
    ping = small["bare FastAPI GET /ping"]
    print(f"v2, one 16-element BIT_NOT through the ASGI app, best of {rounds}")
    for label, seconds in small.items():
        print(f"  {label:<34} {seconds * 1e6:7.1f} µs  ({seconds / ping:.2f}x the ping)")
    print(f"\n/v1, one batch of 100 16-element XORs, best of {rounds}")
    for label, seconds in batch_small(rounds).items():
        print(f"  {label:<34} {seconds * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
