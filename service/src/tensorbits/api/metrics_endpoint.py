"""The metrics port (``TENSORBITS_METRICS_PORT``): a listener of its own that serves
``GET /metrics`` and nothing else, without an API key.

Prometheus scrapes with no credentials by default, and a NetworkPolicy can admit the monitoring
namespace to this port alone: with API keys set, inference on the main port stays behind them
while the figures do not. The body is the main port's ``/metrics`` (``Metrics.exposition``: the
same registry, every worker's figures summed), so either can be scraped.

A plain asyncio server, not a second uvicorn: it answers one small request per connection and
closes it (``Connection: close``, which Prometheus follows), reads at most ``MAX_HEAD_BYTES`` of
request head within ``READ_TIMEOUT_S``, and refuses every other path (404) and method (405). It
reads the head as httptools does on the main port: lines ended by CRLF, a bare LF refused (400)
at once; a target in absolute form (``http://host:port/metrics``) is served as its path.
TLS when the main port has it, with the same certificate and key. With ``--workers N`` each
worker listens on it with ``SO_REUSEPORT``, as on the main port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from prometheus_client import CONTENT_TYPE_LATEST

from tensorbits.config.settings import Settings
from tensorbits.observability import Metrics
from tensorbits.runtime import Runtime

logger = logging.getLogger("tensorbits.metrics")

MAX_HEAD_BYTES = 8192  # a scrape's request line and headers are a few hundred bytes
READ_TIMEOUT_S = 10.0  # Prometheus' default scrape timeout


def _response(status: str, body: bytes, content_type: str, extra: str = "") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_BAD_REQUEST = _response("400 Bad Request", b"bad request\n", "text/plain")
_TOO_LARGE = _response("431 Request Header Fields Too Large", b"", "text/plain")
_ABSOLUTE = (b"http://", b"https://")


def _origin_form(target: bytes) -> bytes:
    """A target in absolute form (``http://host:port/metrics``, RFC 9112 3.2.2: what a client
    sends a proxy, and a server must accept) as its path and query; any other as it is."""
    if not target[:8].lower().startswith(_ABSOLUTE):
        return target
    parts = target.split(b"/", 3)  # scheme, "", authority, the rest
    return b"/" + parts[3] if len(parts) == 4 else b"/"


def answer(request_line: bytes, metrics: Metrics, runtime: Runtime | None) -> bytes:
    """The whole response to one request line (``GET /metrics HTTP/1.1``)."""
    parts = request_line.split()
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        return _response("400 Bad Request", b"bad request\n", "text/plain")
    method, target = parts[0], _origin_form(parts[1])
    path = target.split(b"?", 1)[0]  # Prometheus may add query parameters; none are read
    if path != b"/metrics":
        return _response("404 Not Found", b"only /metrics is served here\n", "text/plain")
    if method not in (b"GET", b"HEAD"):
        return _response(
            "405 Method Not Allowed", b"GET /metrics\n", "text/plain", "Allow: GET, HEAD\r\n"
        )
    body = metrics.exposition(runtime)
    response = _response("200 OK", body, CONTENT_TYPE_LATEST)
    return response[: len(response) - len(body)] if method == b"HEAD" else response


async def _respond(
    reader: asyncio.StreamReader, metrics: Metrics, runtime: Runtime | None
) -> bytes | None:
    """The response to the request ``reader`` brings, once its head is read to its blank line:
    None when the client went before the head's end. Each line must end in CRLF: a bare LF is
    refused (400) at the line it ends, as httptools refuses it on the main port, rather than
    read on until the read timeout. The head is held to ``MAX_HEAD_BYTES`` (431)."""
    request_line: bytes | None = None
    size = 0
    while True:
        try:
            line = await reader.readline()
        except ValueError:  # one line past the stream's limit, MAX_HEAD_BYTES
            return _TOO_LARGE
        size += len(line)
        if size > MAX_HEAD_BYTES:
            return _TOO_LARGE
        if not line.endswith(b"\n"):
            return None  # the connection closed inside the head
        if not line.endswith(b"\r\n"):
            return _BAD_REQUEST
        if request_line is None:
            request_line = line[:-2]
        elif line == b"\r\n":
            return answer(request_line, metrics, runtime)


async def _serve_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    metrics: Metrics,
    runtime: Runtime,
) -> None:
    try:
        try:
            response = await asyncio.wait_for(_respond(reader, metrics, runtime), READ_TIMEOUT_S)
        except TimeoutError:
            return  # a client that never finished its request: nothing to answer
        if response is None:
            return
        writer.write(response)
        await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass  # the scraper went away: nothing to tell it
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()


async def start(settings: Settings, metrics: Metrics, runtime: Runtime) -> asyncio.Server:
    """Listen on ``settings.metrics_port`` (on ``settings.host``) in the running event loop."""
    from tensorbits.config import tls

    context = None
    options = tls.uvicorn_options(settings)
    if options:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(
            options["ssl_certfile"], options["ssl_keyfile"], options.get("ssl_keyfile_password")
        )
    server = await asyncio.start_server(
        lambda r, w: _serve_one(r, w, metrics, runtime),
        settings.host,
        settings.metrics_port,
        limit=MAX_HEAD_BYTES,
        ssl=context,
        reuse_port=settings.workers > 1,  # every worker on the one port, as on the main one
    )
    logger.info(
        "metrics on port %d (GET /metrics, no API key)",
        settings.metrics_port,
        extra={"metrics_port": settings.metrics_port},
    )
    return server


async def stop(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()


__all__ = ["MAX_HEAD_BYTES", "answer", "start", "stop"]
