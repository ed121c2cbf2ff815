"""Coverage-guided fuzz target: DirectML buffer tensor descriptions and the /v1 batch planner.

Input layout (bytes missing at the end read as zero); byte [0] & 1 picks the part:

0 — ``dml.layout_of`` and ``dml.check_placement`` (a binding, as the planner checks one) on a
``TensorDesc`` built from the bytes::

    [1] datatype (b % 12)   [2] rank 1 + b % 9   [3] flags:
        0x01 strides given   0x02 total_size given   0x04 alignment given
        0x10 offset in units of 16   0x20 buffer_size counted from offset + total_size
    then integers, each a control byte c and (1, 2, 4, 8)[c & 3] little-endian bytes v;
    c & 4 negates; c >> 4 picks the family (the 64-bit edges the schema's bounds sit on):
        15: 2**32 - 1 + (v % 5 - 2)     14: 2**64 - 1 + (v % 5 - 2)
        13: 2**63 - 1 + (v % 5 - 2)     12: 2**64 + v      11: 2**63 + v (negated: -(2**63) - v)
        10: 10**(19 + v % 20)           otherwise v
    sizes[rank], strides[rank]?, total_size?, alignment?, offset, buffer_size

    The property: the checks raise ``InvalidRequest`` or pass a layout whose every element's
    byte range (the extreme indices: offset + Σ (size_i - 1) · byte_stride_i + itemsize) lies in
    [offset, offset + total_size) ⊆ [0, buffer_size).

1 — the /v1 batch planner, ``batch.plan_rest`` (which calls ``batch.plan_batch``)::

    [1] b & 2: a structured batch (below); else b & 1: an Inference-Header-Content-Length, the
        decimal of [2:4] (little-endian), and the rest is the body (a JSON BatchRequest, then the
        data buffers)

    Structured: one dispatch of STRUCTURED_OPS[b % 4] on STRUCTURED_TYPES[b % 5] vectors of
    1 + b % 16 elements, its header written as JSON text with every integer field (each buffer's
    byte_size, each binding's offset and size, each desc's sizes, strides, total_size and
    alignment, a parameter's value) either its sane value or, when a byte is odd, a hostile one:
    an integer as above written in decimal, or (family 10 here) a long one of LONG_DIGITS[v % 7]
    digits, past what Python will even format (json.dumps refuses them; the text is written).
    Presence flags per binding: 0x01 size, 0x02 strides, 0x04 total_size, 0x08 alignment,
    rank 1 + (b >> 4) % 3; then b & 1: a parameter. The data follow from the input (zero-padded).

    The property: it raises a ``TensorbitsError`` or returns a plan whose data buffers lie in the
    body after the header and whose every bound tensor lies inside its buffer; the plan then runs
    on the NumPy backend without any exception.

    Long integers only ever come as JSON text: the schema bounds every integer field to 64 bits
    before the planner sees it, so the binding checks (part 0) are driven with values up to 10**38,
    past those bounds but within what its messages can print.

By hand::

    .venv/bin/python tests/fuzz/target_descriptors.py -max_total_time=600 tests/fuzz/corpus_descriptors
"""

from __future__ import annotations

from harness import SMALL_LIMITS, Reader, fuzz, instrumented

with instrumented(__name__, "tensorbits", "tensorbits_protocol"):
    from tensorbits.config.settings import Settings
    from tensorbits.core import batch
    from tensorbits.core.backends.numpy_backend import NumpyBackend
    from tensorbits_protocol import codec, dml
    from tensorbits_protocol.dtypes import DataType, itemsize
    from tensorbits_protocol.errors import InvalidRequest, TensorbitsError
    from tensorbits_protocol.integers import INT64_MAX

DATATYPES = tuple(DataType)
STRUCTURED_OPS = (
    ("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", ("InputTensor",)),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_XOR", ("ATensor", "BTensor")),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", ("InputTensor",)),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT", ("ATensor", "BTensor")),
)
STRUCTURED_TYPES = (
    DataType.UINT8,
    DataType.UINT32,
    DataType.UINT64,
    DataType.INT16,
    DataType.INT64,
)
# Digits of the long integers: 2**64 and 2**128 sized, float64's range, and around the 4,300
# digits past which Python refuses to convert an integer to or from text.
LONG_DIGITS = (20, 39, 309, 4299, 4300, 4301, 20000)
SETTINGS = Settings(**SMALL_LIMITS, max_buffers=16, max_dispatches=16)
LIMITS = batch.BatchLimits.of(SETTINGS.core_limits)
BACKEND = NumpyBackend(1)
_WIDTHS = (1, 2, 4, 8)


class Integers(Reader):
    """The fuzz input, read as integers of the families above as well."""

    def integer(self) -> int:
        control = self.byte()
        value = self._family(control, int.from_bytes(self.raw(_WIDTHS[control & 3]), "little"))
        return -value if control & 4 else value

    def json_integer(self) -> str:
        """An integer as JSON text: those of ``integer``, or (family 10) a long one."""
        control = self.byte()
        value = int.from_bytes(self.raw(_WIDTHS[control & 3]), "little")
        sign = "-" if control & 4 else ""
        if control >> 4 == 10:
            digits = LONG_DIGITS[value % len(LONG_DIGITS)]
            return sign + ("9" * digits if control & 8 else "1" + "0" * (digits - 1))
        return sign + str(self._family(control, value))

    @staticmethod
    def _family(control: int, value: int) -> int:
        family = control >> 4
        if family == 15:
            return dml.UINT32_MAX + value % 5 - 2
        if family == 14:
            return dml.UINT64_MAX + value % 5 - 2
        if family == 13:
            return INT64_MAX + value % 5 - 2
        if family == 12:
            return 2**64 + value
        if family == 11:
            return 2**63 + value
        if family == 10:
            return int(10 ** (19 + value % 20))
        return value


def _extent(offset: int, shape: tuple[int, ...], byte_strides: tuple[int, ...]) -> tuple[int, int]:
    """[first byte, end) over every element of a strided view (strides of any sign)."""
    low = high = offset
    for size, stride in zip(shape, byte_strides, strict=True):
        step = (size - 1) * stride
        if step < 0:
            low += step
        else:
            high += step
    return low, high


def check_layout(
    layout: dml.ViewLayout, datatype: DataType, offset: int, buffer_size: int, total: int
) -> None:
    element = itemsize(datatype)
    assert layout.offset == offset
    assert layout.total_size == total
    assert all(size >= 1 for size in layout.shape)
    low, last = _extent(layout.offset, layout.shape, layout.byte_strides)
    high = last + element
    assert 0 <= layout.offset <= low, (layout, low)
    assert high <= layout.offset + layout.total_size, (layout, high)
    assert layout.offset + layout.total_size <= buffer_size, (layout, buffer_size)


def fuzz_desc(reader: Integers) -> None:
    datatype = DATATYPES[reader.byte() % len(DATATYPES)]
    rank = 1 + reader.byte() % 9
    flags = reader.byte()
    sizes = tuple(reader.integer() for _ in range(rank))
    strides = tuple(reader.integer() for _ in range(rank)) if flags & 0x01 else None
    total_size = reader.integer() if flags & 0x02 else None
    alignment = reader.integer() if flags & 0x04 else 0
    offset = reader.integer()
    if flags & 0x10:
        offset *= 16
    buffer_size = reader.integer()
    if flags & 0x20:
        buffer_size += offset + (total_size or 0)
    desc = dml.TensorDesc(datatype, sizes, strides, total_size, alignment)
    try:
        described = dml.layout_of("fuzz", desc)
        dml.check_placement("fuzz", described, offset, buffer_size)
    except InvalidRequest:
        return
    layout = dml.ViewLayout(offset, described.shape, described.byte_strides, described.total_size)
    expected_total = dml.check_desc("fuzz", desc)
    assert layout.shape == sizes
    assert layout.byte_strides == tuple(s * itemsize(datatype) for s in desc.effective_strides())
    check_layout(layout, datatype, offset, buffer_size, expected_total)


def _check_tensor(plan: batch.BatchPlan, tensor: batch.BoundTensor) -> None:
    buffer = plan.buffers[tensor.buffer]
    layout = tensor.layout
    check_layout(layout, tensor.datatype, layout.offset, buffer.byte_size, layout.total_size)
    assert layout.total_size <= tensor.size, tensor
    assert tensor.end <= buffer.byte_size, (tensor, buffer)


def structured_batch(reader: Integers) -> tuple[bytearray, int]:
    """A one-dispatch batch whose integer fields are sane or hostile, and its header's length."""
    operator, inputs = STRUCTURED_OPS[reader.byte() % len(STRUCTURED_OPS)]
    datatype = STRUCTURED_TYPES[reader.byte() % len(STRUCTURED_TYPES)]
    out_type = DataType.UINT8 if operator.endswith("COUNT") else datatype
    n = 1 + reader.byte() % 16

    def field(sane: int) -> str:
        return reader.json_integer() if reader.byte() & 1 else str(sane)

    def binding(buffer: str, dtype: DataType) -> str:
        nbytes = n * itemsize(dtype)
        flags = reader.byte()
        rank = 1 + (flags >> 4) % 3
        sizes = [field(1) for _ in range(rank - 1)] + [field(n)]
        desc = [f'"datatype": "{dtype}"', f'"sizes": [{", ".join(sizes)}]']
        if flags & 0x02:
            strides = [field(n) for _ in range(rank - 1)] + [field(1)]
            desc.append(f'"strides": [{", ".join(strides)}]')
        if flags & 0x04:
            desc.append(f'"total_size": {field(nbytes)}')
        if flags & 0x08:
            desc.append(f'"alignment": {field(16)}')
        parts = [f'"buffer": "{buffer}"', f'"offset": {field(0)}']
        if flags & 0x01:
            parts.append(f'"size": {field(nbytes)}')
        return "{" + ", ".join([*parts, '"desc": {' + ", ".join(desc) + "}"]) + "}"

    in_bytes = n * itemsize(datatype)
    buffers = [f'{{"name": "in{i}", "byte_size": {field(in_bytes)}}}' for i in range(len(inputs))]
    buffers.append(
        f'{{"name": "out", "byte_size": {field(n * itemsize(out_type))}, "init": "zeros"}}'
    )
    bindings = [f'"{name}": {binding(f"in{i}", datatype)}' for i, name in enumerate(inputs)]
    bindings.append(f'"OutputTensor": {binding("out", out_type)}')
    parameters = f'{{"feature_level": {field(0)}}}' if reader.byte() & 1 else "{}"
    header = (
        f'{{"buffers": [{", ".join(buffers)}], "dispatches": [{{"operator": "{operator}", '
        f'"parameters": {parameters}, "bindings": {{{", ".join(bindings)}}}}}], '
        '"outputs": ["out"]}'
    ).encode()
    data = reader.raw(in_bytes * len(inputs))
    return bytearray(header + data + bytes(in_bytes * len(inputs) - len(data))), len(header)


def fuzz_batch(reader: Integers) -> None:
    mode = reader.byte()
    value: str | None
    if mode & 2:
        body, length = structured_batch(reader)
        value = str(length)
    else:
        value = str(int.from_bytes(reader.raw(2), "little")) if mode & 1 else None
        body = bytearray(reader.rest())
    if len(body) > SETTINGS.max_body_bytes:  # read_body refuses it before any parsing
        return
    try:
        header_length = codec.parse_header_length(value, len(body))
        plan = batch.plan_rest(body, header_length, LIMITS)
    except TensorbitsError:
        return
    data_start = len(body) if header_length is None else header_length
    for buffer in plan.buffers:
        assert buffer.byte_size >= 0
        if buffer.body_offset is not None:
            assert data_start <= buffer.body_offset, buffer
            assert buffer.body_offset + buffer.byte_size <= len(body), buffer
    for dispatch in plan.dispatches:
        for tensor in (*dispatch.inputs, dispatch.output):
            _check_tensor(plan, tensor)
    sinks = [memoryview(bytearray(plan.buffers[i].byte_size)) for i in plan.outputs]
    batch.run_batch(plan, body, BACKEND, sinks)


def TestOneInput(data: bytes) -> None:  # noqa: N802 (the name atheris and libFuzzer use)
    reader = Integers(data)
    if reader.byte() & 1:
        fuzz_batch(reader)
    else:
        fuzz_desc(reader)


if __name__ == "__main__":
    fuzz(TestOneInput)
