"""The few bytes of protobuf's wire format the inference RPC handles itself: the tensors' bytes.

A ``ModelInferRequest`` carries its inputs' bytes in ``raw_input_contents`` (field 7), and a
``ModelInferResponse`` its outputs' in ``raw_output_contents`` (field 6). Parsed by protobuf, a
64 MiB input would be copied into the message and copied again on each read of the field;
built by protobuf, an output would be copied into the message and again when it is serialized.
So ``split_infer_request`` walks the request's top-level fields once: the raw contents stay views
of the received bytes, the rest (names, shapes, parameters: small) is what protobuf parses. And
``raw_field`` frames an output as one entry of field 6, so the kernel writes the output straight
into the response's bytes after the protobuf-built part (fields may come in any order on the
wire, and a repeated field's entries may be split around others: the encoding says so).

Every count is bounded while walking, before anything is built: a message of a million empty
``raw_input_contents`` entries costs one walk, not a million views. The tests check both
functions against protobuf's own parser and serializer (tests/grpc/test_grpc_wire.py).
"""

from __future__ import annotations

from typing import NamedTuple

from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge

# Wire types (protobuf encoding): what follows a field's tag.
VARINT, I64, LEN, I32 = 0, 1, 2, 5
_FIXED_SIZES = {I64: 8, I32: 4}
# ModelInferRequest's repeated message fields and raw contents, each bounded by the tensor limit.
REQUEST_PARAMETERS, REQUEST_INPUTS, REQUEST_OUTPUTS, RAW_INPUT_CONTENTS = 4, 5, 6, 7
RAW_OUTPUT_CONTENTS = 6  # ModelInferResponse
# Request-level parameters (field 4) a request may carry: operator parameters and the protocol's
# own are a handful; this bounds what protobuf is asked to build.
MAX_REQUEST_PARAMETERS = 64
_MAX_VARINT_BYTES = 10


class SplitRequest(NamedTuple):
    """A ``ModelInferRequest`` taken apart: every field but the raw contents (to be parsed by
    protobuf) and the raw contents, in order, as views of the received bytes."""

    message: bytes
    raw_contents: list[memoryview]


def _malformed(detail: str) -> InvalidRequest:
    return InvalidRequest(
        f"malformed ModelInferRequest: {detail}", field="ModelInferRequest", rule="protobuf"
    )


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    """The varint at ``at`` and where the next field starts."""
    value = shift = 0
    for offset in range(_MAX_VARINT_BYTES):
        if at + offset >= len(data):
            raise _malformed(f"a varint runs past the end of the message at byte {at}")
        byte = data[at + offset]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at + offset + 1
        shift += 7
    raise _malformed(f"a varint at byte {at} is longer than {_MAX_VARINT_BYTES} bytes")


def split_infer_request(data: bytes, max_tensors: int) -> SplitRequest:
    """Split a serialized ``ModelInferRequest`` into the part protobuf parses and the raw
    contents. Raises InvalidRequest (400) on a malformed message and PayloadTooLarge (413) when
    it lists more inputs, outputs or raw contents than ``max_tensors`` (TENSORBITS_MAX_TENSORS),
    or more than ``MAX_REQUEST_PARAMETERS`` request parameters."""
    view = memoryview(data)
    counts = {REQUEST_PARAMETERS: 0, REQUEST_INPUTS: 0, REQUEST_OUTPUTS: 0, RAW_INPUT_CONTENTS: 0}
    bounds = {
        REQUEST_PARAMETERS: (MAX_REQUEST_PARAMETERS, "parameters", "max_parameters"),
        REQUEST_INPUTS: (max_tensors, "inputs", "max_tensors"),
        REQUEST_OUTPUTS: (max_tensors, "outputs", "max_tensors"),
        RAW_INPUT_CONTENTS: (max_tensors, "raw_input_contents", "max_tensors"),
    }
    kept: list[memoryview] = []
    raw: list[memoryview] = []
    at = 0
    while at < len(view):
        field_start = at
        tag, at = _varint(view, at)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise _malformed(f"field number 0 at byte {field_start}")
        if wire_type == VARINT:
            _, at = _varint(view, at)
        elif wire_type == LEN:
            length, at = _varint(view, at)
            if length > len(view) - at:
                raise _malformed(
                    f"field {number} at byte {field_start} declares {length} bytes, "
                    f"{len(view) - at} remain"
                )
            if number in counts:
                counts[number] += 1
                bound, name, rule = bounds[number]
                if counts[number] > bound:
                    raise PayloadTooLarge(
                        f"the request lists more than {bound} {name} (limit of "
                        f"{'TENSORBITS_MAX_TENSORS' if rule == 'max_tensors' else 'the server'})",
                        field=name,
                        rule=rule,
                    )
            if number == RAW_INPUT_CONTENTS:
                raw.append(view[at : at + length])
                at += length
                continue
            at += length
        elif wire_type in _FIXED_SIZES:
            at += _FIXED_SIZES[wire_type]
            if at > len(view):
                raise _malformed(f"field {number} at byte {field_start} runs past the end")
        else:  # groups (3, 4) are proto2's and no field of this message; 6 and 7 do not exist
            raise _malformed(f"field {number} at byte {field_start} has wire type {wire_type}")
        kept.append(view[field_start:at])
    message = data if not raw else b"".join(kept)
    return SplitRequest(message, raw)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def raw_field(number: int, length: int) -> bytes:
    """The tag and length that precede ``length`` bytes of a bytes field ``number``."""
    return _encode_varint(number << 3 | LEN) + _encode_varint(length)


__all__ = ["RAW_OUTPUT_CONTENTS", "SplitRequest", "raw_field", "split_infer_request"]
