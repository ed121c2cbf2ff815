"""The client half of the binary framing, for v2 inference and for /v1 batches.

Both bodies are a JSON header whose byte length travels in ``Inference-Header-Content-Length``,
then raw little-endian row-major buffers, concatenated in the order the header lists them.

Requests are built as a list of parts (the header, then a ``memoryview`` of each array) that the
transport sends one after the other: the tensors are never joined into one ``bytes``. Responses
are parsed from the one buffer the transport filled; each output is an ``np.frombuffer`` view
into it (zero-copy, writable).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from tensorbits_client._types import Array
from tensorbits_protocol import codec, v1_codec
from tensorbits_protocol.dtypes import from_numpy
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import InferRequest, InferResponse, Tensor
from tensorbits_protocol.jsondata import encode_data

HEADER_LENGTH = codec.HEADER_LENGTH
# A request body as it is sent (``parts``, ``headers``): the shared codec's, as the server's.
Framed = codec.Framed


class FramingError(ValueError):
    """A response body that does not follow the framing (the caller wraps it with the response)."""


def wire_array(array: Array) -> Array:
    """``array`` as the wire carries it: C-contiguous and little-endian (copied only if not)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return array if array.flags.c_contiguous else array.copy(order="C")


def raw_bytes(array: Array) -> memoryview:
    """The bytes of a wire-ready array, without copying (a 0-d array is reshaped to 1-d first)."""
    return array.reshape(-1).view(np.uint8).data


# --- v2 inference -------------------------------------------------------------------------------
def encode_infer(
    inputs: Sequence[tuple[str, Array]],
    parameters: Mapping[str, object],
    *,
    binary: bool,
    request_id: str | None = None,
) -> Framed:
    """The body of ``POST /v2/models/{name}/infer``; ``inputs`` are wire-ready arrays, in order.

    Binary: every input as raw bytes after the header, every output asked back as binary data
    (``binary_data_output``). JSON: ``data`` lists both ways. The encoder is the protocol's
    (``InferRequest.to_rest``), the one the server's decoder is tested against."""
    params: dict[str, object] = dict(parameters)
    if binary:
        params["binary_data_output"] = True
    tensors = tuple(
        Tensor(
            name,
            from_numpy(array.dtype),
            array.shape,
            raw=raw_bytes(array) if binary else None,
            data=None if binary else encode_data(name, array),
        )
        for name, array in inputs
    )
    header, buffers = InferRequest(tensors, params, id=request_id).to_rest()
    return Framed.framed(header, buffers) if binary else Framed.json(header)


def plain_parameters(parameters: Mapping[str, object] | None) -> dict[str, object]:
    """Parameters as JSON scalars: a NumPy scalar (``np.int64(1)`` for an axis) becomes the
    Python number it holds, as the server will read it (and as local checks must see it)."""
    return {
        key: value.item() if isinstance(value, np.generic) else value
        for key, value in (parameters or {}).items()
    }


@dataclass(frozen=True, slots=True)
class InferResult:
    """A v2 inference response: every output as a NumPy array with the declared dtype and shape.

    Binary outputs are zero-copy views into the response buffer (writable). ``output`` is the
    single output of a bitwise operator.
    """

    model_name: str
    outputs: dict[str, Array]
    id: str | None = None
    model_version: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    @property
    def output(self) -> Array:
        """The only output; ValueError when there are several (index ``outputs`` by name)."""
        if len(self.outputs) != 1:
            raise ValueError(f"{len(self.outputs)} outputs: index .outputs by name")
        return next(iter(self.outputs.values()))


@dataclass(frozen=True, slots=True)
class Body:
    """A received body: ``buffer[start:end]``, with ``buffer`` the uint8 array outputs view."""

    buffer: npt.NDArray[np.uint8]
    start: int
    end: int

    def split(self, header_length: str | None) -> tuple[bytes, memoryview]:
        """The JSON header's bytes and a view of the binary data after it, split where the
        ``Inference-Header-Content-Length`` value says: parsed and checked against the body by
        the shared codec (``parse_header_length``, ``split_body``), as the server's are."""
        view = self.buffer[self.start : self.end].data
        try:
            length = codec.parse_header_length(header_length, len(view))
        except InvalidRequest as exc:
            raise FramingError(exc.message) from None
        head, tail = codec.split_body(view, length)
        return bytes(head), tail  # the header is small: a copy is fine

    def view(self, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Array:
        """A zero-copy array of ``shape`` over the bytes at ``offset``."""
        nbytes = math.prod(shape) * dtype.itemsize
        return self.buffer[offset : offset + nbytes].view(dtype).reshape(shape)


def header_length_hint(value: str | None) -> int:
    """Where a response's binary data will start, before its body is read (to align the buffer
    it is read into): its ``Inference-Header-Content-Length`` if that parses, else 0 (the value
    is judged when the body is decoded)."""
    try:
        return codec.parse_header_length(value, sys.maxsize) or 0
    except InvalidRequest:
        return 0


def _output_array(tensor: Tensor) -> Array:
    return tensor.array("output")


def decode_infer(
    body: Body,
    header_length: str | None,
    array: Callable[[Tensor], Array] = _output_array,
) -> InferResult:
    """Parse a v2 response; ``header_length`` is its ``Inference-Header-Content-Length`` (None:
    the whole body is JSON).

    Binary outputs become zero-copy views of ``body``; the decoder is the protocol's
    (``InferResponse.from_rest``: sizes against shapes, nothing short, nothing left over).
    ``array`` makes each output's array: a shared-memory region's decoder passes its own, for
    the output it placed in the region."""
    head, tail = body.split(header_length)
    try:
        response = InferResponse.from_rest(head, tail, header_given=header_length is not None)
        outputs = {tensor.name: array(tensor) for tensor in response.outputs}
    except (ValidationError, InvalidRequest) as exc:
        raise FramingError(f"malformed inference response: {exc}") from None
    return InferResult(
        model_name=response.model_name,
        outputs=outputs,
        id=response.id,
        model_version=response.model_version,
        parameters=dict(response.parameters),
    )


# --- /v1 batch ----------------------------------------------------------------------------------
def decode_batch(body: Body, header_length: str | None) -> tuple[str | None, dict[str, int]]:
    """Parse a /v1 batch response: its id and where each output buffer starts in ``body``."""
    if header_length is None:
        raise FramingError(f"batch response has no {HEADER_LENGTH} header")
    head, tail = body.split(header_length)
    try:
        request_id, starts = v1_codec.decode_response(head, len(tail))
    except ValidationError as exc:
        raise FramingError(f"batch response header: {exc.errors()[0]['msg']}") from None
    except InvalidRequest as exc:
        raise FramingError(exc.message) from None
    data_start = body.end - len(tail)
    return request_id, {name: data_start + start for name, start in starts.items()}
