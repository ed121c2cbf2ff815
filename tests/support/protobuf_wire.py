"""Protobuf wire pieces the server's wire readers are tested with: tags, and the unknown groups
(proto2's wire types 3 and 4) a newer or hostile client may send."""

from __future__ import annotations

from tensorbits.grpc import wire


def tag(number: int, wire_type: int) -> bytes:
    return wire.encode_varint(number << 3 | wire_type)


def group(number: int, fields: bytes) -> bytes:
    """An unknown group of field ``number`` holding ``fields``."""
    return tag(number, wire.START_GROUP) + fields + tag(number, wire.END_GROUP)


def nested_groups(depth: int) -> bytes:
    """Groups of field 99, ``depth`` of them each inside the one before, the innermost empty."""
    return tag(99, wire.START_GROUP) * depth + tag(99, wire.END_GROUP) * depth
