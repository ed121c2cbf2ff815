"""The one-pass split of a message written in field order (``wire._split_in_order``) against the
rule walk it stands in for (``wire._split_by_rules``): whatever it passes the walk passes, split
alike; whatever it leaves (None) the walk splits or refuses alone. So the short way never lets
through what the walk refuses, nor splits a message otherwise."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorbits.grpc import inference_pb2 as pb
from tensorbits.grpc import wire
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge
from tensorbits_protocol.parameters import MAX_PARAMETERS

MAX_TENSORS = 4
LIMITS = wire.WireLimits.of(MAX_TENSORS, 4096)


def _same_as_the_walk(data: bytes) -> bool:
    """Whether the one pass split ``data`` (True) or left it to the walk (False); either way,
    checked against the walk."""
    fast = wire._split_in_order(data, LIMITS)
    try:
        walked = wire._split_by_rules(data, LIMITS)
    except (InvalidRequest, PayloadTooLarge):
        assert fast is None, "the one pass passed what the walk refuses"
        return False
    if fast is None:
        return False
    assert fast.message == walked.message
    assert [bytes(raw) for raw in fast.raw_contents] == [bytes(raw) for raw in walked.raw_contents]
    assert all(raw.obj is data for raw in fast.raw_contents)  # views of the received bytes
    return True


def _field(number: int, payload: bytes) -> bytes:
    return wire.len_field(number, payload)


def test_a_small_infer_request_takes_the_one_pass() -> None:
    request = pb.ModelInferRequest(model_name="DML_OPERATOR_ELEMENT_WISE_BIT_NOT", id="7")
    request.inputs.add(name="InputTensor", datatype="UINT8", shape=[16])
    request.outputs.add(name="OutputTensor")
    request.parameters["p"].bool_param = True
    request.raw_input_contents.append(bytes(range(16)))
    request.raw_input_contents.append(b"")
    assert _same_as_the_walk(request.SerializeToString())
    assert _same_as_the_walk(b"")  # an empty message
    assert _same_as_the_walk(_field(7, b"x" * 300))  # raw contents alone, a 2-byte length


def test_what_the_one_pass_leaves_to_the_walk() -> None:
    name = _field(1, b"m")
    raw = _field(7, b"abc")
    cases = [
        raw + name,  # a field after the raw contents: split by the walk
        name + name,  # a singular field twice: refused by the walk
        _field(3, b"i" * (wire.MAX_TEXT_BYTES + 1)),  # an id too long
        _field(2, b"v" * wire.MAX_TEXT_BYTES),  # the longest version: passed (one pass)
        b"".join(_field(5, b"") for _ in range(MAX_TENSORS + 1)),  # too many inputs
        b"".join(_field(6, b"") for _ in range(MAX_TENSORS)),  # as many outputs as allowed
        b"".join(_field(4, b"") for _ in range(MAX_PARAMETERS + 1)),  # too many parameters
        wire.varint_field(1, 5),  # a varint where a string goes
        b"\x3a\x05ab",  # raw contents cut short
        b"\x3a" + b"\xff" * 11,  # a length longer than 10 bytes
        b"\x3a" + b"\x80" * 9 + b"\x00",  # a 10-byte length of 0: legal
        b"\x80\x01\x00",  # field 16 (a two-byte tag): not a field of the request
        b"\x00",  # field 0
    ]
    taken = [_same_as_the_walk(case) for case in cases]
    assert taken == [
        False, False, False, True, False, True, False, False, False, False, True, False, False,
    ]  # fmt: skip


class _Counted(bytes):
    """Bytes that count how many of them are read one at a time."""

    reads = 0

    def __getitem__(self, index: Any) -> Any:
        type(self).reads += 1
        return super().__getitem__(index)


def test_a_flood_is_read_no_further_than_the_bounds() -> None:
    """A million empty raw contents: left to the walk (which refuses it at the bound) after a
    few fields, as the walk reads it, not read to its end on the event loop."""
    flood = _Counted(_field(7, b"") * 1_000_000)
    assert wire._split_in_order(flood, LIMITS) is None
    assert _Counted.reads < 4 * (3 + MAX_PARAMETERS + 3 * MAX_TENSORS)
    with pytest.raises(PayloadTooLarge):
        wire.split_infer_request(bytes(flood), LIMITS)


# Pieces that make a message: well-formed fields of every number (some out of bounds), broken
# ones, stray bytes; in any order, so that every branch of both readers is reached.
pieces = st.one_of(
    st.builds(_field, st.integers(1, 8), st.binary(max_size=20)),
    st.builds(_field, st.sampled_from([1, 2, 3]), st.binary(min_size=4090, max_size=4100)),
    st.builds(wire.varint_field, st.integers(0, 9), st.integers(0, 2**64 - 1)),
    st.binary(max_size=4),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(pieces, max_size=12))
def test_the_one_pass_agrees_with_the_walk(parts: list[bytes]) -> None:
    _same_as_the_walk(b"".join(parts))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(1, 6), max_size=MAX_TENSORS + 2),
    st.lists(st.binary(max_size=200), max_size=MAX_TENSORS + 1),
)
def test_messages_in_field_order_take_the_one_pass(numbers: list[int], raws: list[bytes]) -> None:
    """Fields in number order, the raw contents last, within the bounds: what every protobuf
    library writes, so what the server's every repeated call reads."""
    data = b"".join(_field(n, b"s") for n in sorted(numbers)) + b"".join(
        _field(7, raw) for raw in raws
    )
    within = (
        all(numbers.count(n) <= 1 for n in (1, 2, 3))
        and numbers.count(5) + numbers.count(6) <= MAX_TENSORS  # inputs and outputs together
        and len(raws) <= MAX_TENSORS
    )
    assert _same_as_the_walk(data) == within
