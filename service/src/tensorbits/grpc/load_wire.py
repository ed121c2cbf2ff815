"""A ``RepositoryModelLoadRequest`` read on its wire bytes, never handed to protobuf whole.

Parsed by protobuf as it comes, 16 MiB of distinct parameter keys (1.5 million entries) cost
seconds on the event loop and hundreds of MiB; a file of 64 MiB is copied into the message and
again on each read of its field. The message is small in structure (two names and a map of at
most ``MAX_PARAMETERS`` entries, each a key and one value), so it is walked here field by field:
each count and size is checked as it is met (``load_bounds``: the entries, each key, each
value), the walk stops at the first past its bound, and the strings and the file are taken from
the received bytes only once every bound has passed. A refusal costs in proportion to the
bounds, not to what was sent.

A field the load's messages do not have (a newer inference.proto's) is skipped, as proto3 says
and as the inference walk skips one, with the same primitives (``wire.Walk``): skipped by its
wire type, counted against ``wire.MAX_FIELDS`` with every other field, groups bounded by
``wire.MAX_GROUP_DEPTH``. The walk refuses what a load never needs and protobuf would take
silently: a singular field given twice (protobuf keeps the last), an entry with two values. The
tests check it against protobuf's own parser (tests/grpc/test_load_wire.py).
"""

from __future__ import annotations

from typing import NamedTuple

from tensorbits import load_bounds
from tensorbits.core.wire import LEN, VARINT
from tensorbits.grpc.wire import (
    MAX_TEXT_BYTES,
    Count,
    Form,
    Message,
    Rule,
    Walk,
    WireLimits,
)
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.parameters import MAX_PARAMETERS, too_many

MESSAGE = "RepositoryModelLoadRequest"
# The fields of RepositoryModelLoadRequest, of its map's entries and of ModelRepositoryParameter
# (inference.proto), in the inference walk's terms: each is written in one wire type, a varint
# for VARINTS (a load's are singular, never packed), length-delimited for the others.
_TOP = Message(
    MESSAGE,
    {
        1: Rule("repository_name", Form.TEXT),
        2: Rule("model_name", Form.TEXT),
        3: Rule("parameters", Form.MESSAGE, Count.PARAMETERS),
    },
)
_ENTRY = Message("parameters", {1: Rule("key", Form.TEXT), 2: Rule("value", Form.MESSAGE)})
_VALUE = Message(
    "ModelRepositoryParameter",
    {
        1: Rule("bool_param", Form.VARINTS),
        2: Rule("int64_param", Form.VARINTS),
        3: Rule("string_param", Form.TEXT),
        4: Rule("bytes_param", Form.BYTES),
    },
    oneof=True,
)
# The walk's budget of fields and groups; no count of the inference walk's applies to a load.
_NO_LIMITS = WireLimits.of(0, 0)
_PARAMETERS, _KEY = 3, 1
_STRING_PARAM, _BYTES_PARAM = 3, 4
assert MAX_TEXT_BYTES == load_bounds.MAX_KEY_BYTES, "a key is a string of the wire's bound"


class Span(NamedTuple):
    """Where a value lies in the message: its field (``_VALUE``'s number) and its bytes."""

    kind: int
    start: int
    end: int


class LoadWire(NamedTuple):
    """What the walk found: the two names and each parameter's value, by key (the last entry of
    a key wins, as protobuf's map keeps it)."""

    repository_name: str
    model_name: str
    parameters: dict[str, Span]


def _malformed(detail: str) -> InvalidRequest:
    return InvalidRequest(f"malformed {MESSAGE}: {detail}", field=MESSAGE, rule="protobuf")


def _fields(walk: Walk, at: int, end: int, message: Message, where: str) -> list[Span]:
    """The fields of ``message`` from ``at`` to ``end``, as spans of their values, each counted
    against ``wire.MAX_FIELDS``; unknown ones skipped (``Walk.skip``). Refused at the first that
    breaks a rule: another wire type than its field's, a field given twice (but the parameters:
    at most ``MAX_PARAMETERS`` entries), two values of one parameter."""
    found: list[Span] = []
    seen: set[int] = set()
    entries = 0
    while at < end:
        walk.spend_field(message, where)
        field_start = at
        tag, at = walk.varint(at, end)
        number, wire_type = tag >> 3, tag & 7
        rule = message.fields.get(number)
        if rule is None:
            if number == 0:
                raise _malformed(f"field number 0 at byte {field_start}")
            at = walk.skip(message, where, number, wire_type, at, end)
            continue
        if wire_type != (VARINT if rule.form is Form.VARINTS else LEN):
            raise _malformed(
                f"field {number} ({rule.name}) at byte {field_start}: wire type {wire_type}"
            )
        start = at
        if wire_type == LEN:
            length, start = walk.varint(at, end)
            at = start + length
            if at > end:
                raise _malformed(
                    f"field {number} ({rule.name}) at byte {field_start} declares {length} "
                    f"bytes, {end - start} remain"
                )
        else:
            _, at = walk.varint(at, end)
        if rule.count is Count.PARAMETERS:
            entries += 1
            if entries > MAX_PARAMETERS:
                raise too_many("parameters")
        elif number in seen:
            field = f"{where}.{rule.name}" if message is not _TOP else rule.name
            raise InvalidRequest(
                f"{field} is given twice: it is a single field (protobuf would keep the last)",
                field=field,
                rule="single_field",
            )
        elif message.oneof and seen:
            raise InvalidRequest(
                f"{where}: more than one of {', '.join(r.name for r in message.fields.values())}"
                " is given (one value per parameter)",
                field=where,
                rule="parameter_value",
            )
        seen.add(number)
        found.append(Span(number, start, at))
    return found


def _text(data: bytes, span: Span, field: str) -> str:
    if span.end - span.start > MAX_TEXT_BYTES:
        raise InvalidRequest(
            f"{field} is {span.end - span.start} bytes long, more than {MAX_TEXT_BYTES}",
            field=field,
            rule="max_text_bytes",
        )
    try:
        return data[span.start : span.end].decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"{field} is not UTF-8") from None


def walk_load_request(data: bytes, runtime: Runtime) -> LoadWire:
    """Walk a serialized ``RepositoryModelLoadRequest``: 400 (InvalidRequest) for a malformed
    message, an unknown field, a field given twice, a key too long or a parameter the load does
    not take; 413 (PayloadTooLarge) past a count or a value's size (``load_bounds``). Only
    the names and keys are decoded (each at most ``MAX_TEXT_BYTES``); the values stay spans."""
    walk = Walk(memoryview(data), _NO_LIMITS, MESSAGE)
    names = {"repository_name": "", "model_name": ""}
    entries: list[Span] = []
    for span in _fields(walk, 0, len(data), _TOP, MESSAGE):
        if span.kind == _PARAMETERS:
            entries.append(span)
        else:
            name = _TOP.fields[span.kind].name
            names[name] = _text(data, span, name)
    parameters: dict[str, Span] = {}
    for index, entry in enumerate(entries):
        where = f"parameters[{index}]"
        key, value = "", Span(0, 0, 0)
        for span in _fields(walk, entry.start, entry.end, _ENTRY, where):
            if span.kind == _KEY:
                if span.end - span.start > load_bounds.MAX_KEY_BYTES:
                    raise load_bounds.key_too_long(span.end - span.start)
                key = _text(data, span, f"{where}.key")
            else:
                found = _fields(walk, span.start, span.end, _VALUE, f"{where}.value")
                value = found[0] if found else value
        load_bounds.check_parameter(runtime, key, len(key.encode()), value.end - value.start)
        parameters[key] = value
    return LoadWire(names["repository_name"], names["model_name"], parameters)


def value_of(data: bytes, span: Span) -> str | bytes | None:
    """A parameter's value: a ``string_param``'s text, a ``bytes_param``'s bytes (a copy of
    just those), None for any other kind (or none)."""
    if span.kind == _STRING_PARAM:
        try:
            return data[span.start : span.end].decode("utf-8")
        except UnicodeDecodeError:
            raise _malformed("a string_param is not UTF-8") from None
    if span.kind == _BYTES_PARAM:
        return _copied(data, span.start, span.end)
    return None


COPY_BLOCK = 1 << 20
"""A file is copied out of its message this many bytes at a time (``_copied``)."""


def _copied(data: bytes, start: int, end: int) -> bytes:
    """``data[start:end]``, copied a block of ``COPY_BLOCK`` bytes at a time (a millisecond of
    the interpreter's lock each), the blocks then joined with the lock released (CPython's
    ``bytes.join`` of bytes): one slice of a 64 MiB file holds it for the whole copy, tens of
    milliseconds every other thread waits. The blocks are one more copy while joined, within
    the load's admission (``model_lifecycle.LOAD_COPIES``)."""
    if end - start <= COPY_BLOCK:
        return data[start:end]
    return b"".join([data[at : min(at + COPY_BLOCK, end)] for at in range(start, end, COPY_BLOCK)])


__all__ = ["LoadWire", "Span", "value_of", "walk_load_request"]
