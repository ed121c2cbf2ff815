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
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import NoReturn, Protocol

from grpc._cython import cygrpc  # type: ignore[attr-defined]

from tensorbits import refusals
from tensorbits.core.admission import Admission, Grant
from tensorbits.deadlines import read_deadline_passed
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc.pools import Slots
from tensorbits.grpc.status import (
    Context,
    call_request_id,
    error_metadata,
    request_id_metadata,
    status_code,
)
from tensorbits.logs import begin_call, begin_part, note_refusal
from tensorbits.runtime import Runtime
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

StreamBehaviour = Callable[[AsyncIterator[bytes], Context], Awaitable[None]]

# grpcio's error for a write the call can no longer take: the client cancelled the stream, or
# its deadline passed, with answers unread. Not in grpcio's stubs, nor exported elsewhere.
_WRITE_FAILED: type[Exception] = cygrpc.ExecuteBatchError


# The copies of an answer while grpc sends it: the bytes the handler returned, which grpcio
# holds until its send completes, and the copy grpc's core made of them to send (a unary
# answer's; a stream's, ``Message.hold``).
SENT_COPIES = 2


class Message:
    """One message of a stream, in flight: its request's id once read (an error's answer
    carries it), whether it is admitted yet (the stream reads no further until then), its
    answer's task, and the admission grant its answer holds until it is sent (``hold``)."""

    __slots__ = ("admitted", "answer", "carried", "ended", "id")

    def __init__(self) -> None:
        self.id = ""
        self.admitted = asyncio.Event()
        self.answer: asyncio.Task[bytes] | None = None
        self.carried: Grant | None = None
        self.ended = False

    def hold(self, admission: Admission, nbytes: int) -> None:
        """Count the answer's ``nbytes`` in admission until ``end``; not once ended (the
        stream is gone: the answer is dropped). Once, not ``SENT_COPIES`` times: a stream's
        answers wait unsent by the dozen (8 a stream), and counting each twice would carry the
        count past the bound that admitted them."""
        if not self.ended:
            self.carried = admission.carry(nbytes)

    def end(self) -> None:
        """Sent, or never to be: its answer's bytes leave admission."""
        self.ended = True
        if self.carried is not None:
            self.carried.release()
            self.carried = None


class Servicer(Protocol):
    """What a stream reads of the servicer: each is looked up at its use, on the servicer, as
    the servicer's own methods do."""

    receive_timeout: float
    runtime: Runtime

    def _authenticate(self, context: Context, route: str) -> None: ...

    def _account(
        self, route: str, status: int, seconds: float, size_in: int, size_out: int
    ) -> None: ...

    async def _infer(
        self, data: bytes, message_state: Message | None = None, *, streamed: bool = False
    ) -> bytes: ...


async def _next(requests: AsyncIterator[bytes]) -> bytes | None:
    return await anext(requests, None)


async def close_requests(requests: AsyncIterator[bytes]) -> None:
    """Close a call's stream of requests once the call reads no more of it. grpcio's is an
    async generator that, suspended after a message, holds that message in a reference cycle
    (the generator and its receiver): left so, it outlives its call until the cycle collector
    runs. One still reading (a read being cancelled) ends with that read."""
    generator = aiter(requests)  # grpcio's is Cython's async generator: not a native one
    # Known by its ``aclose``, not by ``isinstance`` against the ABC (its check costs a small
    # call 1% of its time).
    aclose = getattr(generator, "aclose", None)
    if aclose is not None and not getattr(generator, "ag_running", False):
        await aclose()


class _Flight:
    """A stream's messages in flight, queued in the order they came (None: no more), bounded
    by ``room``; ``unsent``: those whose answers are not sent yet; ``idle_since``: when the
    last answer went out."""

    __slots__ = ("answers", "count", "idle_since", "room", "unsent")

    def __init__(self, most: int) -> None:
        self.answers: asyncio.Queue[Message | None] = asyncio.Queue()
        self.room = asyncio.Semaphore(most)
        self.unsent: set[Message] = set()
        self.count = 0
        self.idle_since = time.monotonic()

    def started(self, message: Message) -> None:
        self.count += 1
        self.unsent.add(message)
        self.answers.put_nowait(message)

    def answered(self, message: Message) -> None:
        message.end()
        self.unsent.discard(message)
        self.count -= 1
        self.room.release()
        if not self.count:
            self.idle_since = time.monotonic()

    def end(self) -> None:
        """The stream is over: every answer not sent is cancelled or dropped, its bytes out of
        admission."""
        for message in self.unsent:
            if message.answer is not None:
                message.answer.cancel()  # the client went away: answered to no one
            message.end()
        self.unsent.clear()


def stream_behaviour(
    service: Servicer, name: str, route: str, slots: Slots, needs_key: bool
) -> StreamBehaviour:
    """The stream-stream behaviour of streaming RPC ``name`` (ModelStreamInfer): each message
    answered, in the order the messages came, as ``answer_message`` answers it (a refusal is an
    answer in the stream, as Triton sends one; the stream goes on).

    The stream holds one of ``slots`` from its start to its end (past the pool or its
    connection's share of it, UNAVAILABLE at once, as a unary call) and its API key is checked
    once, at its start (``needs_key``); a refusal there ends the call with its status. Each
    message is admitted, counted in the statistics and in /metrics under the stream's
    ``route``, and logged, as a unary call is. At most ``STREAM_MAX_IN_FLIGHT`` messages are in
    flight at once, and the next is read only once the last one read is admitted or answered:
    like a unary call's slot, the stream's holds at most one message not yet admitted. Each
    answer stays counted in admission (``Admission.carry``) from its inference's end until grpc
    has sent it: a client that never reads its answers holds admission's bytes, and its next
    messages are refused by admission, in the stream. A stream with no message in flight must
    send its next one within TENSORBITS_TIMEOUT_BODY_READ, or it ends with DEADLINE_EXCEEDED:
    an idle stream holds its slot no longer than a stalled unary call. Answers are written
    with the context's ``write`` (grpcio's reader-writer form): a write the client cancelled
    ends the call as cancelled, logged at debug, as a client going away is."""

    async def behaviour(requests: AsyncIterator[bytes], context: Context) -> None:
        started = time.perf_counter()
        peer = context.peer()
        # The stream's id and client, for its lines; each message notes its own (answer_message).
        # Not reset: the call's task, whose context this is, ends with the stream. The id is
        # the call's trailing metadata, however it ends (a refusal's beside its own).
        call_id = call_request_id(context)
        begin_call(call_id, peer)
        id_metadata = request_id_metadata(call_id)
        context.set_trailing_metadata(id_metadata)
        try:
            slots.take(peer)
        except Overloaded as exc:
            await _refuse_call(service, context, route, exc, started, id_metadata)
        flight = _Flight(STREAM_MAX_IN_FLIGHT)
        reader: asyncio.Task[None] | None = None
        try:
            if needs_key:
                try:
                    service._authenticate(context, route)
                except Unauthorized as exc:
                    await _refuse_call(service, context, route, exc, started, id_metadata)
            reader = asyncio.create_task(_read_stream(service, name, route, requests, flight))
            while (message := await flight.answers.get()) is not None:
                assert message.answer is not None
                await _send(context, await message.answer)
                flight.answered(message)
            try:
                await reader  # its end: the client's, or the read deadline's
            except RequestTimeout as exc:
                await _refuse_call(service, context, route, exc, started, id_metadata)
        finally:
            flight.end()
            if reader is not None:
                reader.cancel()
                await asyncio.wait((reader,))
            await close_requests(requests)
            slots.give(peer)

    return behaviour


async def _send(context: Context, answer: bytes) -> None:
    """Write one answer; returns once grpc has taken it (the write done)."""
    try:
        await context.write(answer)
    except _WRITE_FAILED:
        logger.debug("a ModelStreamInfer stream ended by its client with answers unsent")
        raise asyncio.CancelledError from None


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
            last.answer = asyncio.create_task(_held_answer(service, route, data, last))
            flight.started(last)
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
        await asyncio.wait((read,))  # its end lets the request stream be closed


async def _held_answer(service: Servicer, route: str, data: bytes, message: Message) -> bytes:
    """``answer_message``, its answer held in admission until it is sent. The inference's own
    grant was released as it returned, in this same step of the event loop: the answer's bytes
    pass from one to the other with no other request admitted between."""
    answer = await answer_message(service, route, data, message)
    message.hold(service.runtime.plane.admission, len(answer))
    return answer


async def answer_message(service: Servicer, route: str, data: bytes, message: Message) -> bytes:
    """One message of a stream answered (``model_stream_infer``), counted and logged as a
    unary call is, under the stream's route."""
    started = time.perf_counter()
    status, answer = 200, b""
    end_message = begin_part()  # its own model, id and refusal, in its own line
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
        end_message()
    return answer


async def _refuse_call(
    service: Servicer,
    context: Context,
    route: str,
    refusal: TensorbitsError,
    started: float,
    id_metadata: tuple[tuple[str, str], ...],
) -> NoReturn:
    """End a whole call with ``refusal``'s status, counted and logged as a call, its trailing
    metadata naming the refusal and the call's id."""
    note_refusal(refusal.code, refusal.grpc_code, refusal.rule, refusal.field)
    service._account(route, refusal.status_code, time.perf_counter() - started, 0, 0)
    await context.abort(
        status_code(refusal),
        refusal.message,
        trailing_metadata=error_metadata(refusal) + id_metadata,
    )
    raise AssertionError("context.abort returned")  # it raises


__all__ = [
    "STREAM_MAX_IN_FLIGHT",
    "Message",
    "Servicer",
    "StreamBehaviour",
    "answer_message",
    "close_requests",
    "stream_behaviour",
]
