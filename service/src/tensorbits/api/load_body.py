"""A load's JSON body read under the load's bounds, its large strings never parsed as JSON.

Triton's load body is ``{"parameters": {"config": "<JSON text>", "file:1/model.onnx": "<the
file in base64>"}}``: small in structure, with one string of up to 86 MiB. Parsed whole, that
string costs seconds of a JSON parser holding the interpreter's lock (every other request
waits, whichever thread parses) and copies of the body. So the body is read in steps, each
bounded and each short while it holds the lock, run on a worker thread (``read_load_body``):

1. its keys are counted on the bytes (``jsondata.scan_blocks``): past ``1 + MAX_PARAMETERS``,
   refused as gRPC refuses the entries of its map; then its depth and values (``LOAD_JSON``);
2. its strings are found on the bytes (every quote left once escaped quotes are blanked, as the
   scan finds them); each of more than ``INLINE_STRING_BYTES`` is cut out and replaced by a
   placeholder, and what is left, small, is parsed as JSON;
3. each parameter is judged by ``load_bounds`` before its value is decoded (its key's size, its
   name, its configuration's size or its file's decoded size, from the base64's length);
4. a file's base64 is decoded from the body's bytes a block at a time.

A file's base64 is base64 text: JSON escapes in it (but ``\\/``, which some JSON writers use) are
refused as base64 is when it is not.
"""

from __future__ import annotations

import binascii
import secrets
from typing import NamedTuple

from tensorbits import load_bounds
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES
from tensorbits.model_lifecycle import CONFIG
from tensorbits.runtime import Runtime
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.jsondata import (
    JsonLimits,
    blanked_blocks,
    check_structure,
    parse_json,
    scan_blocks,
)
from tensorbits_protocol.parameters import MAX_PARAMETERS, too_many
from tensorbits_protocol.schema_errors import validate_document
from tensorbits_protocol.v2 import LoadRequest

WHAT = "request body"
LOAD_JSON = JsonLimits(max_depth=3, max_values=2 * MAX_PARAMETERS)
"""A load body's shape: ``{"parameters": {...}}``, its values strings."""
INLINE_STRING_BYTES = 64 << 10
"""Strings of more JSON text than this are cut out before parsing: what is parsed is then at
most about ``2 * MAX_PARAMETERS`` times this (8 MiB, tens of milliseconds)."""
BASE64_BLOCK = 1 << 20
"""Base64 decoded per call (a multiple of 4): a few milliseconds holding the lock."""
_MAX_QUOTES = 4 * LOAD_JSON.max_values + 8  # every string of a document the scan passed, twice


def _strings(body: bytearray) -> list[tuple[int, int]]:
    """The spans of the strings of ``body`` (between their quotes): the quotes left once escapes
    are blanked, found a block at a time as the JSON scan finds them (``blanked_blocks``)."""
    quotes: list[int] = []
    # The scan reads its document through methods a bytearray has too: no copy of the body.
    for offset, piece in blanked_blocks(body):  # type: ignore[arg-type]
        at = piece.find(b'"')
        while at != -1:
            quotes.append(offset + at)
            if len(quotes) > _MAX_QUOTES:
                raise InvalidRequest(
                    f"{WHAT}: invalid JSON: more strings than a load has", field=WHAT, rule="json"
                )
            at = piece.find(b'"', at + 1)
    if len(quotes) % 2:
        raise InvalidRequest(
            f"{WHAT}: invalid JSON: a string is not closed", field=WHAT, rule="json"
        )
    return [(quotes[i] + 1, quotes[i + 1]) for i in range(0, len(quotes), 2)]


def _check_counts(body: bytearray) -> None:
    """The keys first (a flood of parameters is refused as one, as over gRPC), on the bytes,
    stopping at the block past the bound; then the depth and values."""
    # The scan reads its document through methods a bytearray has too: no copy of the body.
    for found in scan_blocks(body):  # type: ignore[arg-type]
        if found.keys > 1 + MAX_PARAMETERS:
            raise too_many("parameters")
    check_structure(body, LOAD_JSON, WHAT)  # type: ignore[arg-type]


def _base64(name: str, text: bytes | bytearray, start: int, end: int) -> bytes:
    """The file's bytes from its base64 text ``text[start:end]``, decoded a block at a time
    (each block holds the interpreter's lock for a few milliseconds: other threads run between
    them). Padding only at the end, as one strict decoding of the whole would have it."""
    if text.find(b"\\", start, end) != -1:
        # A JSON writer may escape "/" as "\/"; any other escape is no base64. Unescaped a
        # block at a time (never a block ending between a backslash and what it escapes), the
        # blocks joined with the lock released.
        pieces = []
        at = start
        while at < end:
            stop = min(at + BASE64_BLOCK, end)
            if stop < end and text[stop - 1] == ord("\\"):
                stop += 1
            pieces.append(bytes(text[at:stop]).replace(b"\\/", b"/"))
            at = stop
        text = b"".join(pieces)
        start, end = 0, len(text)
    if (end - start) % 4 or text.find(b"=", start, max(start, end - 2)) != -1:
        raise _not_base64(name)
    with memoryview(text) as view:
        try:
            blocks = [
                binascii.a2b_base64(view[at : min(at + BASE64_BLOCK, end)], strict_mode=True)
                for at in range(start, end, BASE64_BLOCK)
            ]
        except (binascii.Error, ValueError):
            raise _not_base64(name) from None
    return b"".join(blocks)


def _not_base64(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"parameters.{name[:100]}: a file's content is base64 text",
        field=f"parameters.{name[:100]}",
        rule="base64",
    )


class LoadBody(NamedTuple):
    """A load's configuration (None: none given) and files, decoded."""

    config: str | None
    files: dict[str, bytes]


def read_load_body(body: bytearray, runtime: Runtime) -> LoadBody:
    """A load's body, bounded and decoded (the module's steps): 400 or 413 naming the field and
    the rule, as gRPC's walk of the same load (``grpc/load_wire.py``)."""
    if not body or body.isspace():
        return LoadBody(None, {})
    _check_counts(body)
    # Long strings out, a placeholder (no document can guess it) in each's place.
    token = secrets.token_hex(16)
    cut: dict[str, tuple[int, int]] = {}
    pieces: list[bytes | bytearray] = []
    last = 0
    for start, end in _strings(body):
        if end - start > INLINE_STRING_BYTES:
            placeholder = f"{token}{len(cut)}"
            cut[placeholder] = (start, end)
            pieces += (body[last:start], placeholder.encode())
            last = end
    pieces.append(body[last:])
    document = parse_json(b"".join(pieces), LOAD_JSON, WHAT)
    parameters = validate_document(LoadRequest, document, WHAT).parameters or {}
    for name, value in parameters.items():
        if name in cut:
            start, end = cut[name]
            raise load_bounds.key_too_long(end - start)  # its text is more than a key may be
        load_bounds.check_parameter(
            runtime,
            name,
            len(name.encode("utf-8", "surrogatepass")),
            _value_bytes(name, value, body, cut),
        )
    config: str | None = None
    files: dict[str, bytes] = {}
    for name, value in parameters.items():
        span = cut.get(value)
        if name == CONFIG:
            # A configuration cut out is at most JSON_ESCAPE_GROWTH times its bound: read alone.
            config = value if span is None else _json_string(body, span)
            load_bounds.check_parameter(
                runtime, name, 0, len(config.encode("utf-8", "surrogatepass"))
            )
        elif span is None:
            encoded = value.encode("ascii", "replace")
            files[name] = _base64(name, encoded, 0, len(encoded))
        else:
            files[name] = _base64(name, body, *span)
    return LoadBody(config, files)


def _value_bytes(name: str, value: str, body: bytearray, cut: dict[str, tuple[int, int]]) -> int:
    """What ``load_bounds.check_parameter`` judges of a value before it is decoded: the
    configuration's bytes (its JSON text's, for one cut out: more than its bound if that is
    more than ``JSON_ESCAPE_GROWTH`` times it, checked exactly once read), a file's decoded size
    (from its base64's length and padding)."""
    span = cut.get(value)
    if name == CONFIG:
        if span is None:
            return len(value.encode("utf-8", "surrogatepass"))
        length = span[1] - span[0]
        return length if length > load_bounds.JSON_ESCAPE_GROWTH * MAX_CONFIG_BYTES else 0
    if span is None:
        return len(value) * 3 // 4 - (len(value) - len(value.rstrip("=")))
    start, end = span
    padding = (body[end - 1 : end] == b"=") + (body[end - 2 : end] == b"==")
    return (end - start) * 3 // 4 - padding


def _json_string(body: bytearray, span: tuple[int, int]) -> str:
    start, end = span
    value = parse_json(body[start - 1 : end + 1], JsonLimits(max_depth=0, max_values=1), WHAT)
    assert isinstance(value, str), "a span between two quotes is one string"
    return value


__all__ = ["LoadBody", "read_load_body"]
