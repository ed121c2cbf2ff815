"""Coverage-guided fuzz target: the request head at the HTTP layer (``GuardedHttpProtocol``).

The protocol ``tensorbits serve`` runs is driven in process: a uvicorn ``Config`` made from the
server's own keyword arguments (``serving.uvicorn_kwargs``, so a change there reaches this target)
with the application swapped for a recording one, a ``ServerState``, a transport that keeps what
is written and when it is closed, and one event loop that runs the requests' tasks between the
chunks (asyncio's own: the protocol uses only the loop's public API, and uvloop, which serves,
costs three times as much to enter for each input). The head limit is the smallest ``Settings``
allows (1 KiB), so small inputs reach it.

The application is a recording stub, not ``create_app``, on purpose: the property is about what
this layer forwards and what it answers by itself. A stub that reads the body, answers 200 and
records every request it is given makes "never forwarded" exact, keeps the fuzzer at over a
thousand inputs a second (each request through the real app would add its middleware, routing
and logging, several times what the protocol costs), and leaves the application's own answers (404, 405, 413, ...)
to ``tests/live/test_fuzz_head.py``, which drives the real server over a socket.
WebSocket upgrades are off here (``ws="none"``): a handshake leaves this layer for uvicorn's
WebSocket protocol, which is not under test.

Input layout (bytes missing at the end read as zero)::

    [0]       flags: 0x01 structured (else raw), 0x02 run the loop between chunks
    [1]       n = b % 8 split points
    [2:2+2n]  the split points, little-endian u16 each, modulo len(stream) + 1
    rest      raw: the bytes the client sends, cut at the split points into data_received calls
              structured: a recipe for well-formed requests of known head size:

        p = b % 3 small GETs first (pipelined), then the sized request:
        method b % 7; target length (u16 % 3000, at least 4) and style b % 4;
        h = b % 6 headers, each a name length 1 + b % 32 and a value length u16 % 2500;
        body b % 3: none, Content-Length or chunked, of b % 64 bytes;
        then b & 1: one more small GET

Properties, of every input:

- nothing raises out of the protocol and nothing reaches the loop's exception handler; an
  exception a parser callback raised (httptools reports it, the protocol answers it with a 400)
  comes from uvicorn or httptools (their own refusals, noted: ``ParserProbe``) or is the
  protocol's own stop at the head limit, never from tensorbits' code otherwise;
- what is written is a sequence of well-formed HTTP/1.1 responses; the stub's come in request
  order; a response the protocol writes itself is a 400, 414 or 431 with a JSON body of string
  ``error``, ``code``, ``field`` and ``rule``, ``Connection: close``, the last response, and the
  connection is closed after it;
- no request whose target and headers together are past the limit reaches the application;
- every task is done once the connection is lost.

And of a structured input, the exact outcome: its head's counted size C (target, and each header
as name + value + 4) and true size T (request line to blank line) decide it. C past the limit:
refused, 414 when the target alone is (or 431 when a chunk ended within a method's length below
the limit inside the target: the chunk count, not the target's, passed it first), 431 otherwise,
and the stub never sees it; T within the limit: forwarded exactly as sent (method, target,
headers, body length) and the request after it answered too; in between, either.

By hand::

    .venv/bin/python tests/fuzz/target_http_head.py -max_total_time=600 tests/fuzz/corpus_http_head
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import io
import itertools
import json
import logging
import os
import re
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from harness import Reader, fuzz, instrumented

with instrumented(__name__, "tensorbits", "uvicorn"):
    import httptools
    import uvicorn
    from uvicorn.server import ServerState

    from tensorbits.api import guarded_protocol
    from tensorbits.api.guarded_protocol import GuardedHttpProtocol
    from tensorbits.config.settings import Settings
    from tensorbits.logs import JsonFormatter
    from tensorbits.server import serving

LIMIT = 1024  # the smallest TENSORBITS_MAX_HEAD_BYTES allows
SETTINGS = Settings(backend="numpy", cpu_threads=1, max_head_bytes=LIMIT)
DEFAULT_HEADERS = [(b"date", b"Thu, 01 Jan 2026 00:00:00 GMT"), (b"server", b"uvicorn")]
METHODS = (b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PATCH")
# Loop rounds without progress before a connection counts as idle: a wake-up (an event set, a
# future resolved) takes one round to run its task, so one quiet round can still be followed
# by progress; two cannot.
SETTLE_QUIET_ROUNDS = 3
SETTLE_MAX_ROUNDS = 50_000

# What the protocol's own refusals say, by status: (code, field or None for any, rule).
REFUSALS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request", None, "http_syntax"),
    414: ("uri_too_long", "url", "max_head_bytes"),
    431: ("request_header_fields_too_large", "headers", "max_head_bytes"),
}
PARSER_FIELDS = {f for _, f in guarded_protocol.PARSER_ERROR_FIELDS} | {"request"}
# The protocol's own stop at the head limit, raised in a parser callback on purpose.
MEANT_IN_CALLBACKS = (guarded_protocol._Refused,)
UPSTREAM_SOURCES = (os.path.dirname(uvicorn.__file__), os.path.dirname(httptools.__file__))

_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([1-5][0-9][0-9]) [\x20-\x7e]*\r\n")
_HEADER_LINE = re.compile(rb"([!#$%&'*+\-.^_`|~0-9A-Za-z]+): ([\t\x20-\x7e\x80-\xff]*)\r\n")


# --- the connection -----------------------------------------------------------------------------


@dataclass
class Seen:
    """A request as the application got it."""

    method: str
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: int = 0

    @property
    def counted(self) -> int:
        """Its target and headers as the protocol counts a head: a lower bound on the bytes of
        the head it came in (an absolute-form target loses its scheme and host)."""
        return len(self.target) + sum(len(n) + len(v) + 4 for n, v in self.headers)


@dataclass
class Record:
    """What one connection's application saw, and a counter of its steps (for settling)."""

    seen: list[Seen] = field(default_factory=list)
    steps: int = 0


async def _app(scope: Any, receive: Any, send: Any) -> None:
    """Read the body, answer 200 with an empty body and the request's number on the connection."""
    record: Record = scope["state"]["record"]
    query = scope["query_string"]
    seen = Seen(
        scope["method"],
        scope["raw_path"] + (b"?" + query if query else b""),
        [(bytes(n), bytes(v)) for n, v in scope["headers"]],
    )
    record.seen.append(seen)
    number = len(record.seen)
    while True:
        message = await receive()
        record.steps += 1
        if message["type"] == "http.disconnect":
            return
        seen.body += len(message.get("body", b""))
        if not message.get("more_body", False):
            break
    headers = [(b"content-length", b"0"), (b"x-fuzz-app", b"%d" % number)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
    record.steps += 1


def _config() -> uvicorn.Config:
    kwargs = serving.uvicorn_kwargs(SETTINGS)
    # log_level None: uvicorn leaves the loggers' levels alone (this may run inside pytest).
    kwargs.update(app=_app, factory=False, ws="none", lifespan="off", log_level=None)
    config = uvicorn.Config(**kwargs)
    config.load()
    return config


CONFIG = _config()


class FakeTransport(asyncio.Transport):
    """A socket transport as the protocol sees one: writes kept, close() reported on the next
    loop round as a real transport does, writes after close() dropped as asyncio drops them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__({"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)})
        self._loop = loop
        self.protocol: asyncio.BaseProtocol | None = None
        self.written = bytearray()
        self.closed = False
        self.reading = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self.closed:
            self.written += data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            assert self.protocol is not None
            self._loop.call_soon(self.protocol.connection_lost, None)

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading and not self.closed

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self.protocol is not None
        return self.protocol

    def get_write_buffer_size(self) -> int:
        return 0


# Exceptions uvicorn's or httptools' code raised in a callback (the protocol answers them with a
# JSON 400, as it should): where they were raised, and a chunk that raised them. Printed when first seen in a
# run by hand (libFuzzer ends the process without running Python's exit handlers).
UPSTREAM_CALLBACK_ERRORS: dict[str, bytes] = {}
_print_upstream = False


def _upstream(filename: str) -> bool:
    # httptools' compiled modules name their frames by a relative path.
    return filename.startswith(UPSTREAM_SOURCES) or filename.startswith("httptools/")


class ParserProbe:
    """The protocol's parser, passed through, looking at every exception a parser callback
    raised: httptools reports it as a callback error, which the protocol answers as a malformed
    request, so without this a bug in the protocol's callbacks would look like a fine 400.

    Raised in uvicorn's code (which the protocol extends) or httptools' (its URL parser), it is
    their refusal of the request, and only noted in ``UPSTREAM_CALLBACK_ERRORS``; raised anywhere
    else it is a finding (``unmeant``), unless it is the protocol's own stop at the head limit."""

    def __init__(self, parser: Any) -> None:
        self._parser = parser
        self.unmeant: list[BaseException] = []

    def feed_data(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if cause is not None and not isinstance(cause, MEANT_IN_CALLBACKS):
                frames = traceback.extract_tb(cause.__traceback__)
                where = frames[-1] if frames else None
                if where is None or not _upstream(where.filename):
                    self.unmeant.append(cause)
                else:
                    key = f"{type(cause).__name__} at {where.filename}:{where.lineno}"
                    if key not in UPSTREAM_CALLBACK_ERRORS:
                        UPSTREAM_CALLBACK_ERRORS[key] = bytes(data[:200])
                        if _print_upstream:
                            print(
                                f"\nupstream callback raised {key}: {cause!r}, answered 400, on "
                                f"{data[:200]!r}",
                                file=sys.stderr,
                            )
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self._parser, name)


@dataclass
class Outcome:
    written: bytes  # before the client went away
    closed_by_server: bool
    record: Record
    delivered: int  # bytes handed to data_received


_LOOP: asyncio.AbstractEventLoop | None = None
_ERRORS: list[dict[str, Any]] = []


def _loop() -> asyncio.AbstractEventLoop:
    """One loop for every input, made on first use (importing this module starts nothing)."""
    global _LOOP
    if _LOOP is None:
        _LOOP = asyncio.new_event_loop()
        _LOOP.set_exception_handler(lambda _loop, context: _ERRORS.append(context))
        atexit.register(_LOOP.close)
    return _LOOP


class _Discard(io.TextIOBase):
    def write(self, text: str) -> int:
        return len(text)


def _log_sink(name: str) -> logging.Logger:
    """A logger at info level, as served, formatting through the server's JSON formatter into
    nothing (a field of ``extra`` that clashed with the record's own would raise there). Made
    outside the logging tree, so swapping it in costs nothing and nothing else sees it."""
    handler = logging.StreamHandler(_Discard())
    handler.setFormatter(JsonFormatter())
    logger = logging.Logger(name, logging.INFO)
    logger.addHandler(handler)
    logger.propagate = False
    return logger


HTTP_LOG = _log_sink("tensorbits.http")
UVICORN_LOG = _log_sink("uvicorn.error")


@contextlib.contextmanager
def _http_log() -> Iterator[None]:
    """During one input the protocol module logs to ``HTTP_LOG``; the process's own logger is
    put back after."""
    namespace = vars(guarded_protocol)  # the names the module reads at call time
    saved = namespace["logger"]
    namespace["logger"] = HTTP_LOG
    try:
        yield
    finally:
        namespace["logger"] = saved


async def _settle(record: Record, transport: FakeTransport, state: ServerState) -> None:
    """Run the loop until nothing moves: the tasks have answered or wait for bytes."""

    def progress() -> tuple[int | bool, ...]:
        seen, written, tasks = len(record.seen), len(transport.written), len(state.tasks)
        return record.steps, seen, written, transport.closed, tasks, len(state.connections)

    quiet = 0
    for _ in range(SETTLE_MAX_ROUNDS):
        before = progress()
        await asyncio.sleep(0)
        quiet = quiet + 1 if progress() == before else 0
        if quiet >= SETTLE_QUIET_ROUNDS:
            return
    raise AssertionError(f"the connection never went idle in {SETTLE_MAX_ROUNDS} loop rounds")


async def _drive(
    protocol: GuardedHttpProtocol,
    transport: FakeTransport,
    state: ServerState,
    record: Record,
    chunks: list[bytes],
    settle_between: bool,
) -> Outcome:
    protocol.connection_made(transport)
    delivered = 0
    for chunk in chunks:
        if not transport.is_reading():
            await _settle(record, transport, state)  # paused: the app has to answer first
        if not transport.is_reading():
            break  # closed, or still paused: the rest stays with the client
        protocol.data_received(chunk)
        delivered += len(chunk)
        if settle_between:
            await _settle(record, transport, state)
    await _settle(record, transport, state)
    outcome = Outcome(bytes(transport.written), transport.closed, record, delivered)
    transport.close()  # the client goes away (a no-op when the server closed first)
    await _settle(record, transport, state)
    return outcome


def run_connection(chunks: list[bytes], settle_between: bool) -> Outcome:
    """One connection fed ``chunks``; the checks that need its end state are made here."""
    loop = _loop()
    record = Record()
    state = ServerState()
    state.default_headers = list(DEFAULT_HEADERS)
    transport = FakeTransport(loop)
    with _http_log():
        # Made as uvicorn makes it, so the head limit and deadline are the ones serve passes.
        protocol = CONFIG.http_protocol_class(  # type: ignore[call-arg]
            config=CONFIG, server_state=state, app_state={"record": record}, _loop=loop
        )
        assert isinstance(protocol, GuardedHttpProtocol)
        protocol.logger = UVICORN_LOG
        probe = ParserProbe(protocol.parser)
        protocol.parser = probe  # type: ignore[assignment]
        transport.set_protocol(protocol)
        outcome = loop.run_until_complete(
            _drive(protocol, transport, state, record, [c for c in chunks if c], settle_between)
        )
    assert not _ERRORS, f"an exception reached the event loop: {_ERRORS.pop()!r}"
    assert not probe.unmeant, f"a parser callback raised {probe.unmeant[0]!r}"
    assert not state.tasks, f"{len(state.tasks)} request tasks still run after connection_lost"
    assert not state.connections, "the connection was never lost"
    return outcome


# --- the responses ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Response:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> list[bytes]:
        return [v for n, v in self.headers if n == name]


def parse_responses(stream: bytes) -> list[Response]:
    """Every response in ``stream``, which must hold whole, well-formed HTTP/1.1 responses and
    nothing else. Every response here has one Content-Length (the stub's and the protocol's)."""
    responses = []
    pos = 0
    while pos < len(stream):
        status_line = _STATUS_LINE.match(stream, pos)
        assert status_line, f"no status line at byte {pos}: {stream[pos : pos + 80]!r}"
        pos = status_line.end()
        headers = []
        while not stream.startswith(b"\r\n", pos):
            line = _HEADER_LINE.match(stream, pos)
            assert line, f"malformed header line at byte {pos}: {stream[pos : pos + 80]!r}"
            headers.append((line[1].lower(), line[2]))
            pos = line.end()
        pos += 2
        status = int(status_line[1])
        if status < 200:
            assert status == 100, stream[status_line.start() : pos]
            assert not headers, stream[status_line.start() : pos]
            responses.append(Response(status, headers, b""))
            continue
        lengths = [v for n, v in headers if n == b"content-length"]
        assert len(lengths) == 1, headers
        assert lengths[0].isdigit(), headers
        assert not any(n == b"transfer-encoding" for n, _ in headers), headers
        end = pos + int(lengths[0])
        if pos == len(stream) and status in (414, 431):
            end = pos  # a refused HEAD request: its length, no content (checked by the caller)
        assert end <= len(stream), f"a body cut short: {stream[pos:]!r}"
        responses.append(Response(status, headers, stream[pos:end]))
        pos = end
    return responses


def check_refusal(response: Response) -> dict[str, Any]:
    """A response the protocol wrote itself: a JSON 4xx naming its field and rule."""
    assert response.status in REFUSALS, response
    if not response.body and response.status in (414, 431):
        return {}  # the refusal of a HEAD request: no content (RFC 9110 §9.3.2)
    assert response.header(b"content-type") == [b"application/json"], response
    assert response.header(b"connection") == [b"close"], response
    document = json.loads(response.body)
    assert isinstance(document, dict), document
    for key in ("error", "code", "field", "rule"):
        assert isinstance(document.get(key), str), document
        assert document[key], document
    code, field_name, rule = REFUSALS[response.status]
    assert (document["code"], document["rule"]) == (code, rule), document
    if field_name is not None:
        assert document["field"] == field_name, document
    else:
        assert document["field"] in PARSER_FIELDS, document
    return document


@dataclass(frozen=True)
class Verdict:
    answered: int  # the stub's responses
    refusal: int | None  # the status of the protocol's refusal, if any


def check_outcome(outcome: Outcome) -> Verdict:
    """The properties every input has."""
    responses = [r for r in parse_responses(outcome.written) if r.status != 100]
    numbers = []
    refusal = None
    for index, response in enumerate(responses):
        number = response.header(b"x-fuzz-app")
        if number:
            assert response.status == 200, response
            numbers.append(int(number[0]))
        else:
            check_refusal(response)
            assert index == len(responses) - 1, "a response after the refusal"
            assert outcome.closed_by_server, "the connection stayed open after a refusal"
            refusal = response.status
    assert numbers == list(range(1, len(numbers) + 1)), f"responses out of order: {numbers}"
    for seen in outcome.record.seen:
        assert seen.counted <= LIMIT, f"a head past the limit was forwarded: {seen}"
    return Verdict(len(numbers), refusal)


# --- the inputs ---------------------------------------------------------------------------------


def split(stream: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(stream) + 1) for p in points} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(cuts)]


SMALL_GET = b"GET /p HTTP/1.1\r\n\r\n"
_TARGET_FILL = (b"a", b"x", b"seg/", b"%41")


@dataclass(frozen=True)
class Sized:
    """The structured input's requests, and what its sized request must come to."""

    stream: bytes
    prefix: int
    suffix: bool
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: int
    counted: int  # target + each header as name + value + 4: what the protocol counts
    size: int  # the head's bytes, request line to blank line
    target_at: int  # where the target begins in the stream


def build_sized(reader: Reader) -> Sized:
    prefix = reader.byte() % 3
    method = METHODS[reader.byte() % len(METHODS)]
    length = max(4, reader.u16() % 3000)
    style = reader.byte() % len(_TARGET_FILL)
    if style == 1:  # a query: the stub sees it as raw_path + "?" + query_string
        target = (b"/q?" + _TARGET_FILL[1] * length)[:length]
    else:
        target = (b"/" + _TARGET_FILL[style] * length)[:length]
    headers = []
    for index in range(reader.byte() % 6):
        name = (b"x%d-" % index + b"h" * 32)[: 1 + reader.byte() % 32]
        headers.append((name, b"v" * (reader.u16() % 2500)))
    body_mode, body_length = reader.byte() % 3, reader.byte() % 64
    body = b""
    if body_mode == 1:
        headers.append((b"content-length", b"%d" % body_length))
        body = b"b" * body_length
    elif body_mode == 2:
        headers.append((b"transfer-encoding", b"chunked"))
        pieces = [b"b" * min(16, body_length - i) for i in range(0, body_length, 16)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    else:
        body_length = 0
    suffix = bool(reader.byte() & 1)
    line = method + b" " + target + b" HTTP/1.1\r\n"
    head = line + b"".join(n + b": " + v + b"\r\n" for n, v in headers) + b"\r\n"
    stream = SMALL_GET * prefix + head + body + (SMALL_GET if suffix else b"")
    return Sized(
        stream,
        prefix,
        suffix,
        method,
        target,
        headers,
        body_length,
        counted=len(target) + sum(len(n) + len(v) + 4 for n, v in headers),
        size=len(head),
        target_at=len(SMALL_GET) * prefix + len(method) + 1,
    )


def check_sized(sized: Sized, points: list[int], outcome: Outcome, verdict: Verdict) -> None:
    seen = outcome.record.seen
    p = sized.prefix
    assert verdict.refusal != 400, "a well-formed request was refused as malformed"
    assert verdict.answered >= p, "a request before the sized one went unanswered"
    forwarded = verdict.refusal is None
    if sized.counted > LIMIT:
        assert not forwarded, f"a head counted {sized.counted} bytes was not refused"
    elif sized.size <= LIMIT:
        assert forwarded, f"a head of {sized.size} bytes was refused with {verdict.refusal}"
    if forwarded:
        assert outcome.delivered == len(sized.stream), "bytes left undelivered"
        assert verdict.answered == len(seen) == p + 1 + sized.suffix, (verdict, len(seen))
        got = seen[p]
        assert got.method == sized.method.decode(), got
        assert got.target == sized.target, got
        assert got.headers == sized.headers, "the headers forwarded differ from those sent"
        assert got.body == sized.body, got
        return
    assert len(seen) == verdict.answered == p, "the refused request reached the application"
    if len(sized.target) > LIMIT:
        # A chunk that ended inside the target with the target's bytes so far within the limit
        # but the chunk's (the method and a space more) past it: the chunk count refuses first.
        window = range(LIMIT - len(sized.method), LIMIT + 1)
        early = any(point - sized.target_at in window for point in points)
        assert verdict.refusal == 414 or (early and verdict.refusal == 431), verdict
    else:
        assert verdict.refusal == 431, verdict


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    reader = Reader(data)
    flags = reader.byte()
    points = [reader.u16() for _ in range(reader.byte() % 8)]
    sized = build_sized(reader) if flags & 1 else None
    stream = sized.stream if sized is not None else reader.rest()
    cuts = sorted({p % (len(stream) + 1) for p in points})
    outcome = run_connection(split(stream, cuts), settle_between=bool(flags & 2))
    verdict = check_outcome(outcome)
    if sized is not None:
        check_sized(sized, cuts, outcome, verdict)


# The words of HTTP/1.1 heads, given to libFuzzer as a dictionary (unless one is given): it
# splices them into inputs, which byte mutations alone would take long to spell.
DICTIONARY = (
    *(m + b" " for m in METHODS),
    b"CONNECT ",
    b"PRI * HTTP/2.0",
    b" HTTP/1.1\r\n",
    b" HTTP/1.0\r\n",
    b"\r\n",
    b"\r\n\r\n",
    b": ",
    b"Host: ",
    b"Content-Length: ",
    b"Transfer-Encoding: chunked",
    b"Transfer-Encoding: gzip, chunked",
    b"Connection: close",
    b"Connection: keep-alive",
    b"Connection: upgrade",
    b"Upgrade: h2c",
    b"Expect: 100-continue",
    b"X-Forwarded-For: ",
    b"X-Forwarded-Proto: ",
    b"0\r\n\r\n",
    b";ext=",
    b"http://",
    b"%00",
    b"?",
)


def _dictionary_file() -> str:
    def quoted(token: bytes) -> str:
        printable = set(range(32, 127)) - {ord('"'), ord("\\")}
        return '"' + "".join(chr(b) if b in printable else f"\\x{b:02X}" for b in token) + '"'

    # One fixed path, rewritten each run: libFuzzer exits without Python's cleanup.
    path = os.path.join(tempfile.gettempdir(), f"tensorbits_fuzz_http_head.{os.getuid()}.dict")
    with open(path, "w") as file:
        file.write("".join(quoted(token) + "\n" for token in DICTIONARY))
    return path


def main() -> None:
    global _print_upstream
    _print_upstream = True
    argv = list(sys.argv)
    if not any(arg.startswith("-dict=") for arg in argv):
        argv.append(f"-dict={_dictionary_file()}")
    fuzz(TestOneInput, argv)


if __name__ == "__main__":
    main()
