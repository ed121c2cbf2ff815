"""A message's layout (``wire.Layout``), which splits the next message of that layout by
comparing it: it splits only a message of the same bytes but the raw contents', and splits it
as ``split_infer_request`` does; any other message, of the same length or not, it leaves to the
split (None), so it never passes what the split refuses, nor splits a message otherwise. And the
servicer, which keeps the layouts of the messages it planned from a template, answers each
message as its own; its answer stays counted in admission until grpcio has sent it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import cast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorbits.config.settings import Settings
from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire
from tensorbits.grpc.service import MAX_LAYOUTS, InferenceService
from tensorbits.grpc.status import Context
from tensorbits.grpc.streams import SENT_COPIES
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

LIMITS = wire.WireLimits.of(4, 4096)
NOT = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"


def _split(data: bytes) -> wire.SplitRequest | None:
    try:
        return wire.split_infer_request(data, LIMITS)
    except (InvalidRequest, PayloadTooLarge):
        return None


def _same(one: wire.SplitRequest, other: wire.SplitRequest) -> bool:
    return one.message == other.message and [bytes(raw) for raw in one.raw_contents] == [
        bytes(raw) for raw in other.raw_contents
    ]


def _request(raws: list[bytes], request_id: str = "") -> bytes:
    request = pb.ModelInferRequest(model_name=NOT, id=request_id)
    for index, raw in enumerate(raws):
        request.inputs.add(name=f"input{index}", datatype="UINT8", shape=[len(raw)])
        request.raw_input_contents.append(raw)
    data: bytes = request.SerializeToString()
    return data


def test_a_layout_splits_a_message_of_new_raw_contents() -> None:
    first = _request([b"\x01" * 16, b"\x02" * 300])
    split = wire.split_infer_request(first, LIMITS)
    layout = wire.layout_of(first, split)
    assert layout is not None
    second = _request([b"\x03" * 16, b"\x04" * 300])
    found = layout.split(second)
    assert found is not None
    assert _same(found, wire.split_infer_request(second, LIMITS))
    assert all(raw.obj is second for raw in found.raw_contents)  # views of the received bytes


def test_a_layout_leaves_every_other_message_to_the_split() -> None:
    first = _request([b"\x01" * 16], "a")
    layout = wire.layout_of(first, wire.split_infer_request(first, LIMITS))
    assert layout is not None
    other_id = _request([b"\x01" * 16], "b")
    other_shape = bytearray(first)
    other_shape[first.index(b"\x1a\x01\x10") + 2] = 17  # shape [17], the same 16 bytes
    moved = _request([b"\x01" * 15], "ab")  # the raw contents start a byte later
    assert len(other_id) == len(other_shape) == len(moved) == len(first)
    for other in (other_id, bytes(other_shape), moved, first[:-1], first + b"\x00"):
        assert layout.split(other) is None, other


def test_no_layout_for_a_message_not_in_field_order() -> None:
    raw = wire.len_field(7, b"abc")
    name = wire.len_field(1, b"m")
    unknown = wire.len_field(15, b"x")
    for data in (raw + name, name + unknown + raw, name + raw + unknown):
        split = _split(data)
        assert split is not None
        assert wire.layout_of(data, split) is None


# Pieces of a message: well-formed fields of every number (some out of bounds), broken ones,
# stray bytes, as the split's own tests make them.
pieces = st.one_of(
    st.builds(wire.len_field, st.integers(1, 8), st.binary(max_size=20)),
    st.builds(wire.varint_field, st.integers(0, 9), st.integers(0, 2**64 - 1)),
    st.binary(max_size=4),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(pieces, max_size=12), st.binary(min_size=1, max_size=64), st.integers(0, 10**6))
def test_a_layout_splits_as_the_split_or_not_at_all(
    parts: list[bytes], noise: bytes, where: int
) -> None:
    """A layout taken of any message the split passed; then messages of its length made from
    that one: its raw contents' bytes replaced (split alike), and a byte anywhere changed
    (split as the split splits it, or left to it)."""
    data = b"".join(parts)
    split = _split(data)
    if split is None:
        return
    layout = wire.layout_of(data, split)
    if layout is None:
        return
    found = layout.split(data)
    assert found is not None
    assert _same(found, split)
    renewed = bytearray(data)
    for start, end, _ in layout.contents:
        renewed[start:end] = (noise * (end - start))[: end - start]
    again = layout.split(bytes(renewed))
    assert again is not None
    assert _same(again, wire.split_infer_request(bytes(renewed), LIMITS))
    if data:
        changed = bytearray(data)
        changed[where % len(data)] ^= noise[0]
        mine = layout.split(bytes(changed))
        if mine is not None:
            theirs = _split(bytes(changed))
            assert theirs is not None, "the layout split what the split refuses"
            assert _same(mine, theirs)


# --- the servicer's layouts -------------------------------------------------------------------


@pytest.fixture(scope="module")
def service() -> Iterator[InferenceService]:
    runtime = Runtime.start(Settings(backend="numpy", cpu_threads=1))
    yield InferenceService(runtime)
    runtime.close()


def _answer(service: InferenceService, data: bytes) -> pb.ModelInferResponse:
    return pb.ModelInferResponse.FromString(asyncio.run(service.model_infer(data)))


def test_messages_of_one_length_are_each_answered_as_their_own(
    service: InferenceService,
) -> None:
    """Requests of the same length whose ids differ (two templates, two layouts of one
    length), in turn: each answer carries its own request's id and its own input's NOT."""
    rng = np.random.default_rng(5)
    for turn in range(8):
        request_id = "xy"[turn % 2]
        values = rng.integers(0, 256, 16, dtype=np.uint8)
        request = pb.ModelInferRequest(model_name=NOT, id=request_id)
        request.inputs.add(name="InputTensor", datatype="UINT8", shape=[16])
        request.raw_input_contents.append(values.tobytes())
        response = _answer(service, request.SerializeToString())
        assert response.id == request_id
        got = np.frombuffer(response.raw_output_contents[0], np.uint8)
        assert got.tolist() == (~values).tolist()
    assert len(service.layouts) >= 1


def test_the_layouts_kept_are_bounded(service: InferenceService) -> None:
    for size in range(1, 2 * MAX_LAYOUTS + 2):
        request = pb.ModelInferRequest(model_name=NOT)
        request.inputs.add(name="InputTensor", datatype="UINT8", shape=[size])
        request.raw_input_contents.append(bytes(size))
        data = request.SerializeToString()
        for _ in range(2):  # planned, then planned from its template: its layout kept
            response = _answer(service, data)
            assert response.raw_output_contents[0] == b"\xff" * size
        assert len(service.layouts) <= MAX_LAYOUTS
        assert len(data) in service.layouts


# --- a unary answer stays admitted until grpcio has sent it ----------------------------------


class _Sending:
    """A unary call's context as the servicer uses it when it refuses nothing: its message, its
    peer, its metadata (none) and its trailing metadata."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self) -> bytes:
        return self.data

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata


def test_a_unary_answer_is_admitted_until_sent(service: InferenceService) -> None:
    """The answer stays counted (twice: ``SENT_COPIES``) while grpcio sends it, in the call's
    task after the handler returns, and is let go when that task ends: sent, or cancelled
    while sending (a client gone)."""
    admission = service.runtime.plane.admission
    behaviour = service.rpc("ModelInfer")
    request = pb.ModelInferRequest(model_name=NOT)
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[16])
    request.raw_input_contents.append(bytes(range(16)))
    data = request.SerializeToString()

    async def requests() -> AsyncIterator[bytes]:  # grpcio's, unread: the context reads
        for _ in ():
            yield b""
        raise AssertionError("the message is read from the context")

    async def one_call(cancelled: bool) -> None:
        returned: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        sent = asyncio.Event()

        async def call_task() -> None:  # grpcio's task of the call: the handler, then the send
            returned.set_result(await behaviour(requests(), cast(Context, _Sending(data))))
            await sent.wait()

        task = asyncio.ensure_future(call_task())
        answer = await returned
        assert pb.ModelInferResponse.FromString(answer).raw_output_contents[0] == bytes(
            255 - i for i in range(16)
        )
        for _ in range(3):  # the loop turns; the answer is still being sent
            await asyncio.sleep(0)
            assert admission.bytes_in_flight == SENT_COPIES * len(answer)
        if cancelled:
            task.cancel()
        else:
            sent.set()
        await asyncio.wait([task])
        await asyncio.sleep(0)  # the task's done callbacks run in the next step
        assert admission.bytes_in_flight == 0
        assert admission.requests_in_flight == 0

    for turn in range(4):  # planned, then from its template, then by its layout
        asyncio.run(one_call(cancelled=turn % 2 == 1))
