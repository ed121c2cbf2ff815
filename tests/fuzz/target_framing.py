"""Coverage-guided fuzz target: the v2 binary framing and request planning (POST /v2/.../infer).

Input layout (bytes missing at the end read as zero)::

    [0]     model: OPERATORS[b % len(OPERATORS)]
    [1]     how the Inference-Header-Content-Length value is made, by b % 4:
              0  absent (the whole body is JSON)
              1  the decimal of the next 2 bytes (little-endian)
              2  raw: the next byte n, then n % 32 bytes decoded as latin-1 (as HTTP headers are)
              3  " <len(body) - next byte>\t" (lengths near the end, negative ones included)
    rest    the request body

The target runs what the server runs on a request: ``codec.parse_header_length``,
``codec.split_body`` and ``rest_infer.plan`` (small limits, NumPy backend); when a plan comes back
it also runs ``rest_infer.encode`` and checks the framing of the response. The property: every
call returns or raises a ``TensorbitsError``; any other exception is a finding and propagates.

By hand::

    .venv/bin/python tests/fuzz/target_framing.py -max_total_time=600 tests/fuzz/corpus_framing
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness import SMALL_LIMITS, Reader, fuzz, instrumented

# The in-process data plane lives with the other test helpers (a target run by hand has only
# tests/fuzz on sys.path); imported inside the block, so what it imports is instrumented too.
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

with instrumented(__name__, "tensorbits", "tensorbits_protocol"):
    from support.planes import data_plane

    from tensorbits.api import rest_infer
    from tensorbits.config.settings import Settings
    from tensorbits.core.backends.numpy_backend import NumpyBackend
    from tensorbits_protocol import codec
    from tensorbits_protocol.errors import TensorbitsError
    from tensorbits_protocol.operators import OPERATORS

SETTINGS = Settings(**SMALL_LIMITS)
BACKEND = NumpyBackend(1)
PLANE = data_plane(SETTINGS, backend=BACKEND)


def decode(data: bytes) -> tuple[int, str | None, bytes]:
    """The fuzz input as (operator index, header value, body)."""
    reader = Reader(data)
    op_index = reader.byte() % len(OPERATORS)
    mode = reader.byte() % 4
    value: str | None = None
    if mode == 1:
        value = str(reader.u16())
    elif mode == 2:
        value = reader.raw(reader.byte() % 32).decode("latin-1")
    elif mode == 3:
        back = reader.byte()
        value = f" {len(reader.rest()) - back}\t"
    return op_index, value, reader.rest()


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    op_index, value, raw = decode(data)
    op = OPERATORS[op_index]
    body = bytearray(raw)
    if len(body) > SETTINGS.max_body_bytes:  # read_body refuses it before any parsing
        return
    try:
        header_length = codec.parse_header_length(value, len(body))
        head, tail = codec.split_body(memoryview(body), header_length)
        assert len(head) + len(tail) == len(body)
        plan = rest_infer.plan(PLANE, op, body, header_length)
    except TensorbitsError:
        return
    assert len(plan.inputs) == len(op.inputs)
    assert plan.output_nbytes >= 0
    try:
        encoded = rest_infer.encode(plan, BACKEND)
    except TensorbitsError:
        return
    if plan.binary_output:
        length = encoded.header_length
        assert length is not None
        assert length % codec.ALIGNMENT == 0
        assert encoded.content_length == length + plan.output_nbytes


if __name__ == "__main__":
    fuzz(TestOneInput)
