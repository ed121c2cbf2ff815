"""ModelStreamInfer, the bidirectional stream: how one runs, from its slot to its last answer.

It answers each of its messages as ModelInfer would, in the order they came, inside a
``ModelStreamInferResponse``; a refusal is an answer in the stream (``error_message``, as Triton
sends it), and the stream goes on. It holds one stream slot for its life (open streams never
take ModelInfer's slots: each of their messages is admitted for its work, as any request is),
and at most ``STREAM_MAX_IN_FLIGHT`` messages in flight.

Its own module because a stream is a small machine of its own (a reader task, the answers' tasks
in order, the idle deadline) that no unary RPC shares. What it needs of the servicer
(``service.InferenceService``), the read deadline, the API key check, the accounting and the
inference, is ``Servicer``: this module never imports the service, which builds each stream's
behaviour here (``stream_behaviour``) with the slots and route it gives it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import NoReturn, Protocol

from tensorbits import refusals
from tensorbits.deadlines import read_deadline_passed
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.pools import Slots
from tensorbits.grpc.status import Context, error_metadata, status_code
from tensorbits_protocol.errors import (
    Overloaded,
    RequestTimeout,
    TensorbitsError,
    Unauthorized,
)

logger = logging.getLogger("tensorbits.grpc")

# Messages of one ModelStreamInfer stream read and not yet answered. Past it the stream reads
# nothing more until its oldest answer is sent: HTTP/2 flow control then holds the client back.
STREAM_MAX_IN_FLIGHT = 8

StreamBehaviour = Callable[[AsyncIterator[bytes], Context], AsyncIterator[bytes]]


class Message:
    """One message of a stream, in flight: its request's id once read (an error's answer
    carries it) and whether it is admitted yet (the stream reads no further until then)."""

    __slots__ = ("admitted", "id")

    def __init__(self) -> None:
        self.id = ""
        self.admitted = asyncio.Event()


class Servicer(Protocol):
    """What a stream reads of the servicer: each is looked up at its use, on the servicer, as
    the servicer's own methods do."""

    receive_timeout: float

    def _authenticate(self, context: Context, route: str) -> None: ...

    def _account(
        self, route: str, status: int, seconds: float, size_in: int, size_out: int
    ) -> None: ...

    async def _infer(
        self, data: bytes, message_state: Message | None = None, *, streamed: bool = False
    ) -> bytes: ...


async def _next(requests: AsyncIterator[bytes]) -> bytes | None:
    return await anext(requests, None)


class _Flight:
    """A stream's messages in flight: their answers' tasks, queued in the order the messages
    came (None: no more), bounded by ``room``; ``idle_since``: when the last answer went out."""

    __slots__ = ("answers", "count", "idle_since", "room", "tasks")

    def __init__(self, most: int) -> None:
        self.answers: asyncio.Queue[asyncio.Task[bytes] | None] = asyncio.Queue()
        self.room = asyncio.Semaphore(most)
        self.tasks: set[asyncio.Task[bytes]] = set()
        self.count = 0
        self.idle_since = time.monotonic()

    def started(self, task: asyncio.Task[bytes]) -> None:
        self.count += 1
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        self.answers.put_nowait(task)

    def answered(self) -> None:
        self.count -= 1
        self.room.release()
        if not self.count:
            self.idle_since = time.monotonic()


def stream_behaviour(
    service: Servicer, name: str, route: str, slots: Slots, needs_key: bool
) -> StreamBehaviour:
    """The stream-stream behaviour of streaming RPC ``name`` (ModelStreamInfer): each message
    answered, in the order the messages came, as ``answer_message`` answers it (a refusal is an
    answer in the stream, as Triton sends one; the stream goes on).

    The stream holds one of ``slots`` from its start to its end (past the pool, UNAVAILABLE at
    once, as a unary call) and its API key is checked once, at its start (``needs_key``); a
    refusal there ends the call with its status. Each message is admitted, counted in the
    statistics and in /metrics under the stream's ``route``, and logged, as a unary call is.
    At most ``STREAM_MAX_IN_FLIGHT`` messages are in flight at once, and the next is read
    only once the last one read is admitted or answered: like a unary call's slot, the
    stream's holds at most one message not yet admitted. A stream with no message in flight
    must send its next one within TENSORBITS_TIMEOUT_BODY_READ, or it ends with
    DEADLINE_EXCEEDED: an idle stream holds its slot no longer than a stalled unary call."""

    async def behaviour(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
        started = time.perf_counter()
        try:
            slots.take()
        except Overloaded as exc:
            await _refuse_call(service, context, route, exc, started)
        flight = _Flight(STREAM_MAX_IN_FLIGHT)
        reader: asyncio.Task[None] | None = None
        try:
            if needs_key:
                try:
                    service._authenticate(context, route)
                except Unauthorized as exc:
                    await _refuse_call(service, context, route, exc, started)
            reader = asyncio.create_task(_read_stream(service, name, route, requests, flight))
            while (answer := await flight.answers.get()) is not None:
                yield await answer
                flight.answered()
            try:
                await reader  # its end: the client's, or the read deadline's
            except RequestTimeout as exc:
                await _refuse_call(service, context, route, exc, started)
        finally:
            if reader is not None:
                reader.cancel()
            for task in list(flight.tasks):
                task.cancel()  # the client went away: what it sent is answered to no one
            slots.give()

    return behaviour


async def _read_stream(
    service: Servicer, name: str, route: str, requests: AsyncIterator[bytes], flight: _Flight
) -> None:
    """Read a stream's messages, each answered by a task of its own, queued in order on
    ``flight.answers``; None queued at the end, whatever ends it."""
    last: Message | None = None
    try:
        while True:
            await flight.room.acquire()
            if last is not None:
                await last.admitted.wait()  # at most one message read and not admitted
            data = await _next_message(service, name, requests, flight)
            if data is None:
                return  # the client half-closed: answer what is in flight, then end
            last = Message()
            flight.started(asyncio.create_task(answer_message(service, route, data, last)))
    finally:
        flight.answers.put_nowait(None)


async def _next_message(
    service: Servicer, name: str, requests: AsyncIterator[bytes], flight: _Flight
) -> bytes | None:
    """A stream's next message (None at its end). The read deadline (``deadlines.py``, a
    unary call's and an HTTP body's) runs only while the stream has nothing in flight: a
    client may wait for its answers before it sends more. Not ``within_read_deadline``: the
    deadline starts when the last answer goes out, which may be after the read began."""
    read: asyncio.Task[bytes | None] = asyncio.create_task(_next(requests))
    try:
        while True:
            if flight.count:
                remaining = service.receive_timeout
            else:
                remaining = service.receive_timeout - (time.monotonic() - flight.idle_since)
            done, _ = await asyncio.wait((read,), timeout=max(remaining, 0))
            if done:
                return read.result()
            if not flight.count and time.monotonic() - flight.idle_since >= service.receive_timeout:
                raise read_deadline_passed(
                    f"the next {name} request message of an idle stream (nothing in flight)",
                    service.receive_timeout,
                )
    finally:
        read.cancel()


async def answer_message(service: Servicer, route: str, data: bytes, message: Message) -> bytes:
    """One message of a stream answered (``model_stream_infer``), counted and logged as a
    unary call is, under the stream's route."""
    started = time.perf_counter()
    status, answer = 200, b""
    try:
        answer = await service._infer(data, message, streamed=True)
    except Exception as exc:  # every exception is answered (a cancelled one is not one)
        refusal = refusals.answer_for(exc, logger, route)
        status, words = refusal.status_code, refusal.message
        # Triton's form: the words, and a response holding only the request's id, so that
        # a client can tell which of its requests failed.
        answer = pb.ModelStreamInferResponse(
            error_message=words, infer_response=pb.ModelInferResponse(id=message.id)
        ).SerializeToString()
    except BaseException:
        status = 499  # cancelled by the client or the server's stop
        raise
    finally:
        message.admitted.set()  # refused or done: either way, no longer waiting to be
        service._account(route, status, time.perf_counter() - started, len(data), len(answer))
    return answer


async def _refuse_call(
    service: Servicer, context: Context, route: str, refusal: TensorbitsError, started: float
) -> NoReturn:
    """End a whole call with ``refusal``'s status, counted and logged as a call."""
    service._account(route, refusal.status_code, time.perf_counter() - started, 0, 0)
    await context.abort(
        status_code(refusal), refusal.message, trailing_metadata=error_metadata(refusal)
    )
    raise AssertionError("context.abort returned")  # it raises


__all__ = [
    "STREAM_MAX_IN_FLIGHT",
    "Message",
    "Servicer",
    "StreamBehaviour",
    "answer_message",
    "stream_behaviour",
]
