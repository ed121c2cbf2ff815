"""The protobuf wire format, read on the received bytes: the one reader of varints, field tags,
the bounds of each field's value and the counts of packed runs, for every walk of hostile
protobuf bytes before protobuf (or ``onnx``) builds anything from them. The gRPC requests
(``grpc/wire.py``, ``grpc/load_wire.py``) and the ONNX files of graph models
(``core/graphs/wire.py``) are walked with it.

The reader knows the encoding only: what a message holds, which counts are bounded and the
words of a refusal are each walk's. A fault in the encoding is a ``WireFault`` (what went wrong
and at which byte), which each walk turns into its own refusal, naming its own message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from enum import Enum

# Wire types (protobuf encoding): what follows a field's tag.
VARINT, I64, LEN, START_GROUP, END_GROUP, I32 = 0, 1, 2, 3, 4, 5
FIXED_SIZES = {I64: 8, I32: 4}
MAX_VARINT_BYTES = 10
# Bytes with the high bit set: every byte of a varint but its last. The bytes a packed run of
# varints holds, less these, is how many varints end in it (counted in C, not byte by byte).
_CONTINUATION = bytes(range(0x80, 0x100))

Bytes = bytes | bytearray | memoryview


class Fault(Enum):
    """What is wrong with the bytes (``WireFault``)."""

    CUT = "cut"  # the bytes end inside a varint or a value
    OVERLONG = "overlong"  # a varint goes on past 10 bytes
    FIELD_ZERO = "field zero"  # a tag of field number 0
    WIRE_TYPE = "wire type"  # a wire type the walk does not take there (groups, 6, 7)


class WireFault(Exception):
    """Bytes that are not a protobuf encoding: ``fault`` at byte ``at`` (where the varint, the
    tag or the value starts); ``wire_type``: the tag's, for ``Fault.WIRE_TYPE``."""

    def __init__(self, fault: Fault, at: int, wire_type: int = 0) -> None:
        super().__init__(f"{fault.value} at byte {at}")
        self.fault = fault
        self.at = at
        self.wire_type = wire_type


def read_varint(data: Bytes, at: int, end: int) -> tuple[int, int]:
    """The varint at ``at`` and where what follows it starts. A 64-bit value takes 10 bytes at
    most: one that goes on past them is ``OVERLONG``, one that ``end`` cuts is ``CUT``."""
    if at < end:
        byte = data[at]
        if byte < 0x80:  # most varints: a tag, a short length
            return byte, at + 1
    value = 0
    for offset in range(min(MAX_VARINT_BYTES, end - at)):
        byte = data[at + offset]
        value |= (byte & 0x7F) << (7 * offset)
        if byte < 0x80:
            return value, at + offset + 1
    raise WireFault(Fault.OVERLONG if end - at >= MAX_VARINT_BYTES else Fault.CUT, at)


def read_tag(data: Bytes, at: int, end: int) -> tuple[int, int, int]:
    """The field number and wire type of the tag at ``at``, and where its value starts; field
    number 0, which no message has, is a ``FIELD_ZERO`` fault."""
    tag, after = read_varint(data, at, end)
    if tag < 8:
        raise WireFault(Fault.FIELD_ZERO, at)
    return tag >> 3, tag & 7, after


def read_value(data: Bytes, wire_type: int, at: int, end: int) -> tuple[int, int]:
    """The value of wire type ``wire_type`` at ``at``: a varint's value and where it ends, or
    the bounds of a length-delimited or fixed-size value (``CUT`` past ``end``). Groups and
    wire types 6 and 7 are a ``WIRE_TYPE`` fault: a walk that takes groups skips them itself."""
    if wire_type == VARINT:
        return read_varint(data, at, end)
    if wire_type == LEN:
        length, start = read_varint(data, at, end)
    elif wire_type in FIXED_SIZES:
        length, start = FIXED_SIZES[wire_type], at
    else:
        raise WireFault(Fault.WIRE_TYPE, at, wire_type)
    if length > end - start:
        raise WireFault(Fault.CUT, start)
    return start, start + length


def fields(
    data: Bytes, start: int, end: int, spend: Callable[[], None]
) -> Iterator[tuple[int, int, int, int]]:
    """``(number, wire type, a, b)`` for each field of the message in ``[start, end)``: a
    varint's value and its end, or the bounds of a length-delimited or fixed-size value (as
    ``read_value``). ``spend`` is called before each field is read: the walk's count of fields,
    which refuses past its bound."""
    at = start
    while at < end:
        spend()
        number, wire_type, at = read_tag(data, at, end)
        a, b = read_value(data, wire_type, at, end)
        yield number, wire_type, a, b
        at = b


def count_varints(run: bytes) -> int:
    """How many varints end in ``run`` (a packed run's bytes): a run whose last byte has the
    continuation bit set holds one more, cut short, which this does not count."""
    return len(run.translate(None, _CONTINUATION))


def ends_inside_varint(run: Bytes) -> bool:
    """Whether the packed run ``run`` ends inside a varint (its last byte continues)."""
    return len(run) > 0 and run[-1] >= 0x80


def encode_varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf varint."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


__all__ = [
    "END_GROUP",
    "FIXED_SIZES",
    "I32",
    "I64",
    "LEN",
    "MAX_VARINT_BYTES",
    "START_GROUP",
    "VARINT",
    "Fault",
    "WireFault",
    "count_varints",
    "encode_varint",
    "ends_inside_varint",
    "fields",
    "read_tag",
    "read_value",
    "read_varint",
]
