"""What the HTTP extensions cost, in process (no sockets), each against its baseline in the
same run, in interleaved rounds:

  statistics   one 16-element BIT_NOT in v2 binary through the whole ASGI app, counted
               (the data plane's statistics, as served) against the same app with a Statistics whose
               record does nothing; and the record call and the clock reads by themselves
  compression  the compressor alone at level 1 (what the server uses) and level 6 (zlib's
               default), on tensors of low and of full entropy; and a 1 MiB BIT_NOT through
               the app with Accept-Encoding: gzip against identity

Per-call figures are medians of the rounds. Usage:
.venv/bin/python bench/http_extensions.py [--rounds N]
"""

from __future__ import annotations

import statistics as stats
import sys
import time
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import best_per_call, in_process_rounds
from bench.http_service import NOT, v2_binary_request
from tensorbits.api.compression import WBITS, compress
from tensorbits.config.settings import Settings
from tensorbits.core.statistics import Statistics
from tensorbits.server.app import create_app

MiB = 1 << 20
Scope = dict[str, Any]


class NoStatistics(Statistics):
    """The baseline: the same calls, nothing counted."""

    def record(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record_failure(self, *args: Any, **kwargs: Any) -> None:
        pass


def _infer_scope(body: bytes, head: bytes, accept: bytes | None = None) -> Scope:
    headers = [
        (b"host", b"bench"),
        (b"content-length", str(len(body)).encode()),
        (b"inference-header-content-length", str(len(head)).encode()),
    ]
    if accept is not None:
        headers.append((b"accept-encoding", accept))
    path = f"/v2/models/{NOT}/infer"
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "scheme": "http", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 1234),
        "headers": headers,
    }  # fmt: skip


def _caller(app: Any, scope: Scope, body: bytes) -> Callable[[], Awaitable[None]]:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise RuntimeError(f"{scope['path']} answered {message['status']}")

    async def call() -> None:
        await app(dict(scope), receive, send)

    return call


async def _interleaved(
    cases: dict[str, Callable[[], Awaitable[None]]], rounds: int, calls: int
) -> dict[str, float]:
    """Median seconds per call of each case, the cases taking turns round by round."""
    for call in cases.values():
        for _ in range(min(calls, 200)):  # warm: caches, first-call imports
            await call()
    times: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(rounds):
        for label, call in cases.items():
            start = time.perf_counter()
            for _ in range(calls):
                await call()
            times[label].append((time.perf_counter() - start) / calls)
    return {label: stats.median(values) for label, values in times.items()}


async def statistics_cost(rounds: int) -> dict[str, float]:
    head, parts = v2_binary_request({"InputTensor": np.full(16, 65, np.uint8)}, "OutputTensor")
    body = b"".join(bytes(p) for p in parts)
    app = create_app(Settings(backend="numpy", log_level="warning", grpc_port=0))
    async with app.router.lifespan_context(app):
        runtime = app.state.runtime
        counted, uncounted = runtime.plane.statistics, NoStatistics()
        call = _caller(app, _infer_scope(body, head), body)

        async def with_counts() -> None:
            runtime.plane.statistics = counted
            await call()

        async def without() -> None:
            runtime.plane.statistics = uncounted
            await call()

        times = await _interleaved({"counted": with_counts, "not counted": without}, rounds, 2000)
    alone = Statistics()
    times["record() alone"] = best_per_call(lambda: alone.record(NOT, 0, 1, 2, 3, 6), 5, 200_000)
    clock = time.perf_counter_ns
    times["5 clock reads"] = best_per_call(
        lambda: (clock(), clock(), clock(), clock(), clock()), 5, 200_000
    )
    return times


def compressor_cost(rounds: int) -> list[tuple[str, int, float, float, float, float]]:
    """(data, size, level-1 seconds, level-1 size ratio, level-6 seconds, level-6 size ratio):
    the server's ``compress`` (level 1) against zlib's default level."""
    rng = np.random.default_rng(12)
    rows = []
    for label, high in (("low entropy (values 0-3)", 4), ("full entropy", 256)):
        size = 16 * MiB
        data = rng.integers(0, high, size, dtype=np.uint8).tobytes()

        def level_1(data: bytes = data) -> int:
            return sum(map(len, compress([data], "gzip")))

        def level_6(data: bytes = data) -> int:
            c = zlib.compressobj(6, zlib.DEFLATED, WBITS["gzip"])
            return len(c.compress(data) + c.flush())

        rows.append((
            label, size, best_per_call(level_1, rounds, 1), level_1() / size,
            best_per_call(level_6, rounds, 1), level_6() / size,
        ))  # fmt: skip
    return rows


async def compressed_request(rounds: int) -> dict[str, float]:
    array = np.random.default_rng(1).integers(0, 4, MiB, dtype=np.uint8)
    head, parts = v2_binary_request({"InputTensor": array}, "OutputTensor")
    body = b"".join(bytes(p) for p in parts)
    app = create_app(Settings(backend="numpy", log_level="warning", grpc_port=0))
    async with app.router.lifespan_context(app):
        cases = {
            "identity": _caller(app, _infer_scope(body, head), body),
            "gzip": _caller(app, _infer_scope(body, head, b"gzip"), body),
            "deflate": _caller(app, _infer_scope(body, head, b"deflate"), body),
        }
        return await _interleaved(cases, rounds, 20)


def main() -> None:
    rounds = in_process_rounds(__doc__, default=9)

    cost = uvloop.run(statistics_cost(rounds))
    base = cost["not counted"]
    print(f"statistics: one 16-element BIT_NOT through the ASGI app, median of {rounds}")
    print(f"  not counted                 {base * 1e6:8.2f} µs")
    print(f"  counted                     {cost['counted'] * 1e6:8.2f} µs  "
          f"({cost['counted'] / base:.3f}x)")  # fmt: skip
    for label in ("record() alone", "5 clock reads"):
        print(f"  {label:<27} {cost[label] * 1e9:8.0f} ns  ({cost[label] / base:.2%} of a call)")

    print(f"\ncompression: the compressor alone, best of {rounds}")
    for label, size, t1, r1, t6, r6 in compressor_cost(rounds):
        print(f"  {label:<26} {size // MiB} MiB  level 1: {t1 * 1e3:7.1f} ms "
              f"({size / t1 / MiB:6.0f} MiB/s, size {r1:.3f}x)  level 6: {t6 * 1e3:7.1f} ms "
              f"({size / t6 / MiB:6.0f} MiB/s, size {r6:.3f}x)")  # fmt: skip

    request = uvloop.run(compressed_request(rounds))
    plain = request["identity"]
    print(f"\n1 MiB BIT_NOT (values 0-3) through the ASGI app, median of {rounds}")
    for label, seconds in request.items():
        print(f"  {label:<10} {seconds * 1e3:7.2f} ms  ({seconds / plain:.2f}x identity)")


if __name__ == "__main__":
    main()
