"""Triton's binary tensor data extension: pure functions shared by the server and the client.

A body is a JSON header, whose byte length travels in the ``Inference-Header-Content-Length``
HTTP header, followed by the raw tensors back to back, in the order the JSON lists them: for a
request the inputs with ``parameters.binary_data_size``, for a response the outputs with it.
Each tensor is little-endian, row-major, unpadded: exactly ``prod(shape) * element size`` bytes.

Decoding checks what Triton checks (``src/http_server.cc``), with its messages: the header
length is a number within the body, an input sets exactly one of ``data`` and
``binary_data_size``, no input runs past the body, no bytes are left over. It also checks what
Triton leaves to its core, up front: every size equals ``prod(shape) * itemsize``, computed with
Python integers, so no product can overflow. The slices are ``memoryview``s of the body: no copy.

Encoding lays a body out before any tensor exists (``BodyLayout``): the server writes the JSON
header into one buffer sized for the whole response and lets the kernel write the output straight
into the tail. The header is padded with spaces (valid JSON whitespace, counted in the header
length) so that the first tensor starts at a multiple of ``ALIGNMENT`` bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from tensorbits_protocol.dtypes import DataType, itemsize
from tensorbits_protocol.errors import InvalidRequest

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_CONTENT_TYPE = "application/json"
BINARY_CONTENT_TYPE = "application/octet-stream"
# The largest element is 8 bytes; a tensor at a multiple of 8 is aligned for NumPy and for SIMD
# loads (misaligned inputs work, but the kernels run about 20% slower on them).
ALIGNMENT = 8
_MAX_DIGITS = 20  # a length needs no more; longer is refused before int() sees it


def _invalid(message: str, field: str, rule: str) -> InvalidRequest:
    return InvalidRequest(message, field=field, rule=rule)


# --- decoding -----------------------------------------------------------------------------------


def parse_header_length(value: str | None, body_length: int) -> int | None:
    """The ``Inference-Header-Content-Length`` header as a checked int; None when absent (then the
    whole body is JSON)."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > _MAX_DIGITS:
        raise _invalid(
            f"Unable to parse {HEADER_LENGTH}, got: {value[:40]!r}", HEADER_LENGTH, "header"
        )
    length = int(text)
    if length > body_length:
        raise _invalid(
            f"inference header size should be in range (0, {body_length}), got: {length}",
            HEADER_LENGTH,
            "header_range",
        )
    return length


def split_body(body: memoryview, header_length: int | None) -> tuple[memoryview, memoryview]:
    """The JSON header and the binary tail of a body (views, no copy)."""
    if header_length is None:
        return body, body[len(body) :]
    return body[:header_length], body[header_length:]


class TensorFrame(NamedTuple):
    """What the framing needs to know of one tensor of the JSON header, in header order. (A
    NamedTuple, as the other per-tensor records of the hot path: built in a third of the time of
    a frozen dataclass.)"""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    binary_size: int | None  # parameters.binary_data_size; None: not given
    has_data: bool = False  # "data" present (inputs only)
    shared_memory: bool = False  # parameters.shared_memory_region present

    @property
    def nbytes(self) -> int:
        """prod(shape) * itemsize, as a Python int: no overflow whatever the shape."""
        return math.prod(self.shape) * itemsize(self.datatype)


def check_content(frame: TensorFrame) -> None:
    """An input carries its elements exactly one way, as Triton's ValidateInputContentType says:
    ``data``, ``binary_data_size`` or the shared-memory parameters (which a server takes only
    with the extension on: that is its check, not the framing's)."""
    if frame.has_data is not (frame.binary_size is not None) and not frame.shared_memory:
        return  # the usual case, decided without building the message's words
    chosen = [
        key
        for key, present in (
            ("'data'", frame.has_data),
            ("'binary_data_size'", frame.binary_size is not None),
            ("'shared_memory_region'", frame.shared_memory),
        )
        if present
    ]
    if len(chosen) != 1:
        but = f"set {' '.join(chosen)}" if chosen else "no field is set"
        raise _invalid(
            f"input '{frame.name}': Input must set only one of the following fields: 'data', "
            f"'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But {but}",
            frame.name,
            "content",
        )


def spans(sizes: Iterable[int | None], start: int = 0) -> list[tuple[int, int] | None]:
    """Where each part lies when the parts of ``sizes`` follow each other from ``start``; None
    for a part that is not in the binary data (a size of None).

    The one walk over a framed body's offsets: the decoders of both APIs (server and client),
    the layout of a body being encoded, and a cached plan's input places all use it."""
    places: list[tuple[int, int] | None] = []
    offset = start
    for size in sizes:
        if size is None:
            places.append(None)
            continue
        places.append((offset, offset + size))
        offset += size
    return places


def end_of(places: Sequence[tuple[int, int] | None], start: int = 0) -> int:
    """Where the last of ``spans``'s parts ends (``start`` when there is none)."""
    return max((place[1] for place in places if place is not None), default=start)


def slice_tensors(
    frames: Sequence[TensorFrame], tail: memoryview, model: str, *, header_given: bool
) -> list[memoryview | None]:
    """Each tensor's bytes in ``tail`` (None for a tensor without ``binary_data_size``).

    The slices follow each other in header order; every byte of ``tail`` belongs to one."""
    places = spans(frame.binary_size for frame in frames)
    slices: list[memoryview | None] = []
    for frame, place in zip(frames, places, strict=True):
        if place is None:
            slices.append(None)
            continue
        if not header_given:
            raise _invalid(
                f"input '{frame.name}': must specify valid '{HEADER_LENGTH}' in request header "
                "and 'binary_data_size' when passing inputs in binary data format",
                HEADER_LENGTH,
                "header_missing",
            )
        start, end = place
        if end - start != frame.nbytes:
            raise _invalid(
                f"input byte size mismatch for input '{frame.name}' for model '{model}'. "
                f"Expected {frame.nbytes}, got {end - start} ({frame.datatype} {list(frame.shape)})",
                frame.name,
                "binary_data_size",
            )
        if end > len(tail):
            raise _invalid(
                f"unexpected size for input '{frame.name}', expecting {end - len(tail)} "
                f"additional bytes for model '{model}'",
                frame.name,
                "truncated",
            )
        slices.append(tail[start:end])
    used = end_of(places)
    if used != len(tail):
        raise _invalid(
            f"unexpected additional input data for model '{model}' "
            f"({len(tail) - used} bytes after the last binary input)",
            "body",
            "leftover",
        )
    return slices


# --- encoding -----------------------------------------------------------------------------------


# Built once: json.dumps() with options builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def dump_header(document: Any, *, align: bool = True) -> bytes:
    """Compact RFC 8259 JSON (NaN refused), padded with spaces to a multiple of ``ALIGNMENT``."""
    header = _ENCODER.encode(document).encode()
    if align:
        header += b" " * (-len(header) % ALIGNMENT)
    return header


class BodyLayout(NamedTuple):
    """A framed body planned before its tensors exist: the header, then buffers of ``sizes``."""

    header: bytes
    sizes: tuple[int, ...]

    @property
    def header_length(self) -> int:
        return len(self.header)

    @property
    def total(self) -> int:
        return len(self.header) + sum(self.sizes)

    def allocate(self) -> tuple[memoryview, list[memoryview]]:
        """ONE buffer for the whole body with the header written in, and a writable view of each
        tensor's bytes: the caller fills those in place and sends the buffer as it is.

        The buffer is ``np.empty``, not ``bytearray(n)``: a bytearray is zero-filled first, a
        wasted pass over memory that the kernel is about to overwrite anyway."""
        body = np.empty(self.total, dtype=np.uint8).data
        body[: len(self.header)] = self.header
        places = spans(self.sizes, len(self.header))
        return body, [body[place[0] : place[1]] for place in places if place is not None]


class Framed(NamedTuple):
    """A body as it is sent, request or response: its parts in order (the JSON header, then each
    tensor's bytes; or one buffer that holds them all) and the JSON header's byte length when
    binary data follows it (None: the body is all JSON)."""

    parts: tuple[bytes | memoryview, ...]
    header_length: int | None

    @property
    def content_length(self) -> int:
        return sum(map(len, self.parts))

    @classmethod
    def json(cls, document: bytes) -> Framed:
        """A body that is one JSON document."""
        return cls((document,), None)

    @classmethod
    def framed(cls, header: bytes, buffers: Sequence[bytes | memoryview]) -> Framed:
        """A JSON header, then ``buffers``: the header's length travels with it."""
        return cls((header, *buffers), len(header))

    @property
    def media_type(self) -> str:
        return JSON_CONTENT_TYPE if self.header_length is None else BINARY_CONTENT_TYPE

    @property
    def headers(self) -> dict[str, str]:
        """The HTTP headers that describe the body (but its length)."""
        headers = {"Content-Type": self.media_type}
        if self.header_length is not None:
            headers[HEADER_LENGTH] = str(self.header_length)
        return headers
