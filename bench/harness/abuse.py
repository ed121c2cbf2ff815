"""Abusive clients for ``bench/load.py``: requests a server must refuse cheaply while it serves
everyone else, sent from a process of their own (``AbuseProcess``), so that building megabytes
of junk does not slow the normal clients' event loop. Each abuser opens a raw socket (no HTTP
library would send most of these), sends one request of the next kind, reads the answer and
starts over while ``active`` is set. The kinds:

* ``huge_header`` (a 1 MiB header value: 431), ``many_headers`` (20,000 headers: 431),
  ``huge_url`` (a 1 MiB request target: 414), ``malformed_line`` (a malformed request line: 400);
* ``slow_body``: 256 KiB declared, trickled 64 bytes every 0.2 s and abandoned when the abuse
  window ends (the body deadline, TENSORBITS_TIMEOUT_BODY_READ, is longer than a window);
* ``refused_batch``: a /v1 batch of 300,000 dispatches (413 by TENSORBITS_MAX_DISPATCHES).

An outcome is the answer's status (`` not JSON`` when its body is no JSON ``error``) or how the
connection ended: ``closed`` (closed or reset by the server), ``abandoned`` (at the window's
end), ``timeout`` (no answer within ``ANSWER_TIMEOUT``: a failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from multiprocessing.synchronize import Event
from typing import Any

KINDS = ("huge_header", "many_headers", "huge_url", "slow_body", "refused_batch", "malformed_line")
MiB = 1 << 20
ANSWER_TIMEOUT = 30.0
MODEL = "onnx.BitwiseXor-18"
DISPATCHES = 300_000
MALFORMED = (
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\nHost: x\r\n\r\n",
    b"G\x00T /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v2/models/x/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
)


def _refused_batch() -> bytes:
    # Each dispatch is as short as the header's shape allows: the count limit, not the byte
    # limit, is what refuses it.
    dispatches = ",".join(['{"operator":"X","bindings":{}}'] * DISPATCHES)
    header = f'{{"buffers":[],"outputs":[],"dispatches":[{dispatches}]}}'.encode()
    head = (
        "POST /v1/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(header)}\r\n\r\n"
    )
    return head.encode() + header


def _requests() -> dict[str, bytes]:
    junk = b"a" * MiB
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(20_000))
    infer = f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n".encode()
    return {
        "huge_header": infer + b"X-Junk: " + junk + b"\r\nContent-Length: 0\r\n\r\n",
        "many_headers": infer + many + b"Content-Length: 0\r\n\r\n",
        "huge_url": b"GET /v2/models/" + junk + b"/ready HTTP/1.1\r\nHost: x\r\n\r\n",
        "refused_batch": _refused_batch(),
    }


async def _answer(reader: asyncio.StreamReader) -> str:
    """The outcome of one request: its status (and whether it came with a JSON error), or how
    the connection ended."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return "closed"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    try:
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        error = json.loads(body).get("error")
    except (asyncio.IncompleteReadError, ConnectionError, ValueError, AttributeError):
        error = None
    if status == 503 and "retry-after" in headers:
        return "503+Retry-After"
    return str(status) if isinstance(error, str) else f"{status} not JSON"


@contextlib.asynccontextmanager
async def _connection(
    port: int,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A connection to the server, closed (and waited for) on the way out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        yield reader, writer
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def _send_and_read(port: int, data: bytes) -> str:
    async with _connection(port) as (reader, writer):
        try:
            writer.write(data)
            await writer.drain()
        except ConnectionError:
            pass  # refused mid-send: the answer may still be there to read
        try:
            return await asyncio.wait_for(_answer(reader), ANSWER_TIMEOUT)
        except TimeoutError:
            return "timeout"


async def _slow_body(port: int, active: Callable[[], bool]) -> str:
    declared = 256 << 10
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: x\r\n"
        f"Inference-Header-Content-Length: 16\r\nContent-Length: {declared}\r\n\r\n"
    )
    async with _connection(port) as (reader, writer):
        try:
            writer.write(head.encode())
            sent = 0
            while active() and sent < declared:
                writer.write(b"x" * 64)
                await writer.drain()
                sent += 64
                try:
                    # An early answer (a 408 or 503) ends the trickle.
                    return await asyncio.wait_for(_answer(reader), 0.2)
                except TimeoutError:
                    pass
            return "abandoned"
        except ConnectionError:
            return "closed"


async def _abuser(
    index: int,
    port: int,
    requests: dict[str, bytes],
    active: Callable[[], bool],
    stopped: Callable[[], bool],
    outcomes: Counter[tuple[str, str]],
) -> None:
    turn = index
    malformed = index
    while not stopped():
        if not active():
            await asyncio.sleep(0.05)
            continue
        kind = KINDS[turn % len(KINDS)]
        turn += 1
        run: Awaitable[str]
        if kind == "slow_body":
            run = _slow_body(port, active)
        elif kind == "malformed_line":
            run = _send_and_read(port, MALFORMED[malformed % len(MALFORMED)])
            malformed += 1
        else:
            run = _send_and_read(port, requests[kind])
        try:
            outcome = await run
        except OSError as exc:
            outcome = f"connect failed: {type(exc).__name__}"
        outcomes[(kind, outcome)] += 1


async def _abuse(port: int, abusers: int, active: Event, stop: Event) -> Counter[tuple[str, str]]:
    requests = _requests()
    outcomes: Counter[tuple[str, str]] = Counter()
    await asyncio.gather(
        *(_abuser(i, port, requests, active.is_set, stop.is_set, outcomes) for i in range(abusers))
    )
    return outcomes


def _main(port: int, abusers: int, active: Event, stop: Event, results: Any) -> None:
    results.put(asyncio.run(_abuse(port, abusers, active, stop)))


class AbuseProcess:
    """``abusers`` abusive clients in a child process, abusing while ``active`` is set."""

    def __init__(self, port: int, abusers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.active = context.Event()
        self._stop = context.Event()
        self._results: Any = context.Queue()
        self._process = context.Process(
            target=_main, args=(port, abusers, self.active, self._stop, self._results), daemon=True
        )

    def __enter__(self) -> AbuseProcess:
        self._process.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.active.clear()
        self._stop.set()
        if exc[0] is not None:
            self._process.kill()

    def outcomes(self, timeout: float = ANSWER_TIMEOUT + 10) -> Counter[tuple[str, str]]:
        """Every (kind, outcome) and its count, once the child has stopped."""
        self.active.clear()
        self._stop.set()
        deadline = time.monotonic() + timeout
        found: Counter[tuple[str, str]] = self._results.get(timeout=timeout)
        self._process.join(max(0.0, deadline - time.monotonic()))
        return found


def failed(outcome: str) -> bool:
    """An outcome that breaks the load test's checks: a 5xx (other than a 503 with
    Retry-After), a 4xx without a JSON error, no answer in time, or no connection at all."""
    if outcome in ("closed", "abandoned", "503+Retry-After"):
        return False
    if outcome == "timeout" or outcome.startswith("connect failed") or "not JSON" in outcome:
        return True
    return not outcome.isdigit() or not 400 <= int(outcome) < 500
