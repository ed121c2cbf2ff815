"""A run from system regions to a system region is streamed in pieces (``core.run.run_streamed``);
it must write exactly what the whole-tensor path (``shared_loaded`` + the kernel on whole arrays)
writes, and what the reference says, for every operator and every data type it takes, with
pieces that end mid-tensor, inputs from the body beside inputs from regions, the output over an
input's own bytes (in place), and a region that shrinks between two pieces; a broadcast in
pieces of whole rows, in every form, the broadcast input read whole, from the body or a region,
on either side. Pieces are made tiny here (64 bytes) so every tensor spans many of them."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
from core.bitref import OP_TYPES, assert_bits_equal, np_dtype, reference

from tensorbits.api import rest_infer
from tensorbits.config.settings import Settings
from tensorbits.core import plan as core_plan
from tensorbits.core import run as core_run
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.limits import request_limits
from tensorbits.core.plan import Plan, plan, streams
from tensorbits.core.shared_memory import SHM_DIR, SharedMemoryRegions, SystemBytes
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.infer import InferRequest, RequestedOutput, SharedMemoryRef, Tensor
from tensorbits_protocol.operators import Function, get_operator

RNG = np.random.default_rng(29)
PREFIX = f"/tensorbits_stream_{os.getpid()}"
KEY = f"{PREFIX}_object"
OBJECT_BYTES = 1 << 16
SHAPE = (5, 37)  # 185 elements: no piece size divides it
LIMITS = request_limits(Settings().core_limits)
Arr = np.ndarray[Any, Any]


@pytest.fixture
def backend() -> Iterator[NumpyBackend]:
    made = NumpyBackend(2)
    yield made
    made.close()


@pytest.fixture
def regions(monkeypatch: pytest.MonkeyPatch) -> Iterator[SharedMemoryRegions]:
    # What a plan holds and a run reads (``rows_per_piece``).
    monkeypatch.setattr(core_plan, "STREAM_PIECE_BYTES", 64)
    path = SHM_DIR / KEY[1:]
    path.write_bytes(bytes(OBJECT_BYTES))
    made = SharedMemoryRegions(PREFIX, 8, 1 << 30)
    made.register_system("r", KEY, 0, OBJECT_BYTES)
    yield made
    made.close()
    path.unlink()


def _object() -> Path:
    return SHM_DIR / KEY[1:]


def _put(array: Arr, offset: int) -> None:
    with _object().open("r+b") as f:
        f.seek(offset)
        f.write(array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes())


def _get(like: Arr, offset: int) -> Arr:
    raw = _object().read_bytes()[offset : offset + like.nbytes]
    little = np.frombuffer(raw, like.dtype.newbyteorder("<"))
    return little.astype(like.dtype).reshape(like.shape)


def _request(
    model: str,
    arrays: dict[str, Arr],
    places: dict[str, int | None],
    out_offset: int | None,
    dt: DataType,
    out_bytes: int | None = None,
) -> InferRequest:
    """Inputs at ``places`` (None: in the body), the output at ``out_offset`` of region r, in
    ``out_bytes`` (default: the rest of the region); ``out_offset`` None: in the response's body,
    as binary data."""
    op = get_operator(model)
    inputs = []
    for name, array in arrays.items():
        offset = places[name]
        if offset is None:
            little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<")))
            raw = little.reshape(-1).view(np.uint8).data  # an empty one too
            inputs.append(Tensor(name, dt, array.shape, raw=raw))
        else:
            _put(array, offset)
            ref = SharedMemoryRef("r", array.nbytes, offset)
            inputs.append(Tensor(name, dt, array.shape, shared_memory=ref))
    params = {"direction": "LEFT"} if op.function is Function.SHIFT else {}
    if out_offset is None:
        return InferRequest(tuple(inputs), params, (RequestedOutput(op.output, binary=True),))
    want_bytes = OBJECT_BYTES - out_offset if out_bytes is None else out_bytes
    output = RequestedOutput(op.output, shared_memory=SharedMemoryRef("r", want_bytes, out_offset))
    return InferRequest(tuple(inputs), params, (output,))


def _random(dt: DataType, shape: tuple[int, ...]) -> Arr:
    dtype = np_dtype(dt)
    if dtype == np.bool_:
        return RNG.integers(0, 2, size=shape).astype(np.bool_)
    raw = RNG.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    return raw.view(dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _run(
    regions: SharedMemoryRegions, backend: NumpyBackend, request: InferRequest, model: str
) -> Plan:
    planned = plan(get_operator(model), request, LIMITS, regions)
    rest_infer.encode(planned, backend, regions)
    return planned


def _body_output(
    regions: SharedMemoryRegions, backend: NumpyBackend, request: InferRequest, model: str
) -> bytes:
    """The output's bytes of the response ``execute`` makes (binary data after the header)."""
    planned = plan(get_operator(model), request, LIMITS, regions)
    framed = rest_infer.encode(planned, backend, regions)
    assert framed.header_length is not None
    return b"".join(bytes(part) for part in framed.parts)[framed.header_length :]


class Mixed(NamedTuple):
    """Random inputs of ``model`` in ``dt`` and where they go (``places``), and the reference's
    output."""

    model: str
    dt: DataType
    arrays: dict[str, Arr]
    places: dict[str, int | None]
    want: Arr

    def request(self, out_offset: int | None) -> InferRequest:
        return _request(self.model, self.arrays, self.places, out_offset, self.dt)


@pytest.fixture(params=OP_TYPES, ids=[f"{m}-{d.value}" for m, d in OP_TYPES])
def mixed(request: pytest.FixtureRequest) -> Mixed:
    """Every operator with every data type it takes: the first input from the body when there
    are two (mixed), the rest from the region."""
    model, dt = request.param
    op = get_operator(model)
    arrays = {name: _random(dt, SHAPE) for name in op.inputs}
    params = {"direction": "LEFT"} if op.function is Function.SHIFT else {}
    places: dict[str, int | None] = {
        name: (None if index == 0 and len(arrays) > 1 else 4096 * (index + 1))
        for index, name in enumerate(arrays)
    }
    return Mixed(model, dt, arrays, places, reference(model, arrays, params))


def test_streamed_equals_whole_and_reference(
    regions: SharedMemoryRegions,
    backend: NumpyBackend,
    monkeypatch: pytest.MonkeyPatch,
    mixed: Mixed,
) -> None:
    model, want = mixed.model, mixed.want
    request = mixed.request(32768 + 8)
    planned = _run(regions, backend, request, model)
    assert streams(planned, backend)
    streamed = _get(want, 32768 + 8)
    assert_bits_equal(streamed, want)
    # The whole-tensor path writes the very same bytes.
    _put(np.zeros(want.nbytes, np.uint8), 32768 + 8)
    for module in (core_plan, core_run):
        monkeypatch.setattr(module, "streams", lambda plan, backend: False)
    _run(regions, backend, request, model)
    assert_bits_equal(_get(want, 32768 + 8), streamed)


def test_streamed_into_the_body_equals_whole_and_reference(
    regions: SharedMemoryRegions,
    backend: NumpyBackend,
    monkeypatch: pytest.MonkeyPatch,
    mixed: Mixed,
) -> None:
    """Inputs in the region (one from the body when there are two), the output in the response:
    streamed straight into the response's buffer, the same bytes as the whole-tensor path."""
    model, want = mixed.model, mixed.want
    request = mixed.request(None)
    planned = plan(get_operator(model), request, LIMITS, regions)
    assert streams(planned, backend)
    streamed = _body_output(regions, backend, request, model)
    little = want.astype(want.dtype.newbyteorder("<"), copy=False)
    assert streamed == np.ascontiguousarray(little).tobytes()
    for module in (core_plan, core_run):
        monkeypatch.setattr(module, "streams", lambda plan, backend: False)
    assert _body_output(regions, backend, request, model) == streamed


def test_in_place_over_many_pieces(regions: SharedMemoryRegions, backend: NumpyBackend) -> None:
    """The output over exactly an input's bytes (DML's in-place rule), the other input beside."""
    model = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
    a, b = _random(DataType.UINT32, (1000,)), _random(DataType.UINT32, (1000,))
    request = _request(model, {"ATensor": a, "BTensor": b}, {"ATensor": 0, "BTensor": 8192}, 0,
                       DataType.UINT32, out_bytes=a.nbytes)  # fmt: skip
    _run(regions, backend, request, model)
    assert_bits_equal(_get(a, 0), a ^ b)
    assert_bits_equal(_get(b, 8192), b)  # the other input is untouched


# (model, parameters, the full-size input's shape, the broadcast one's, whether the broadcast
# input comes first): rows of the output that a 64-byte piece holds one or more of.
BROADCASTS: tuple[tuple[str, dict[str, str | int], tuple[int, ...], tuple[int, ...], bool], ...] = (
    ("onnx.BitwiseAnd-18", {}, (5, 37), (1,), False),  # one element: flat pieces
    ("onnx.BitwiseXor-18", {}, (5, 37), (1, 1), True),
    ("onnx.BitwiseOr-18", {}, (9, 12), (12,), False),  # a row
    ("onnx.BitwiseXor-18", {}, (9, 12), (1, 12), True),
    ("onnx.BitwiseAnd-18", {}, (37, 5), (37, 1), False),  # a column
    ("onnx.BitwiseOr-18", {}, (6, 4, 5), (4, 5), True),  # rows of 4 x 5
    ("onnx.BitwiseAnd-18", {}, (6, 4, 5), (5,), False),  # leading axes merged into rows of 5
    ("onnx.BitwiseXor-18", {}, (8, 1, 4), (3, 1), False),  # both broadcast: rows of 3 x 4
    ("openvino.BitwiseAnd-13", {"auto_broadcast": "pdpd", "axis": 0}, (37, 5), (37,), False),
)


def _broadcast_case(
    index: int, places: tuple[int | None, int | None]
) -> tuple[str, dict[str, Arr], dict[str, int | None], dict[str, str | int], Arr]:
    model, params, full, broadcast, first = BROADCASTS[index]
    op = get_operator(model)
    shapes = (broadcast, full) if first else (full, broadcast)
    arrays = {
        name: _random(DataType.UINT16, shape) for name, shape in zip(op.inputs, shapes, strict=True)
    }
    where = dict(zip(op.inputs, places, strict=True))
    return model, arrays, where, params, reference(model, arrays, params)


def _params_request(
    model: str,
    arrays: dict[str, Arr],
    places: dict[str, int | None],
    params: dict[str, str | int],
    out_offset: int | None,
) -> InferRequest:
    request = _request(model, arrays, places, out_offset, DataType.UINT16)
    return InferRequest(request.inputs, {**request.parameters, **params}, request.outputs)


@pytest.mark.parametrize("out_offset", [32768, None], ids=["to-region", "to-body"])
@pytest.mark.parametrize(
    "places", [(0, 8192), (None, 8192), (0, None)], ids=["both-shared", "a-body", "b-body"]
)
@pytest.mark.parametrize("index", range(len(BROADCASTS)))
def test_broadcasts_stream_in_whole_rows(
    regions: SharedMemoryRegions,
    backend: NumpyBackend,
    monkeypatch: pytest.MonkeyPatch,
    index: int,
    places: tuple[int | None, int | None],
    out_offset: int | None,
) -> None:
    """A broadcast streamed in pieces of whole rows gives the reference's answer and the very
    bytes the whole-tensor path gives, its broadcast input from the body or a region, first or
    second, into a region or the response's body."""
    model, arrays, where, params, want = _broadcast_case(index, places)
    request = _params_request(model, arrays, where, params, out_offset)
    planned = plan(get_operator(model), request, LIMITS, regions)
    assert streams(planned, backend)
    assert want.nbytes > 2 * core_plan.STREAM_PIECE_BYTES  # many pieces

    def answer() -> bytes:
        if out_offset is None:
            return _body_output(regions, backend, request, model)
        _put(np.zeros(want.nbytes, np.uint8), out_offset)
        _run(regions, backend, request, model)
        return _object().read_bytes()[out_offset : out_offset + want.nbytes]

    streamed = answer()
    assert streamed == np.ascontiguousarray(want.astype("<u2")).tobytes()
    for module in (core_plan, core_run):
        monkeypatch.setattr(module, "streams", lambda plan, backend: False)
    assert answer() == streamed
    for name, offset in where.items():  # the inputs in the region are as they were sent
        if offset is not None:
            assert_bits_equal(_get(arrays[name], offset), arrays[name])


def test_rows_longer_than_a_piece_take_the_whole_path(
    regions: SharedMemoryRegions, backend: NumpyBackend
) -> None:
    """A row of the output longer than a piece: not streamed (a piece holds whole rows), the
    same answer read whole."""
    model = "onnx.BitwiseAnd-18"
    a, b = _random(DataType.UINT8, (4, 100)), _random(DataType.UINT8, (100,))
    request = _request(model, {"A": a, "B": b}, {"A": 0, "B": 512}, 1024, DataType.UINT8)
    planned = _run(regions, backend, request, model)
    assert not streams(planned, backend)
    assert_bits_equal(_get(a, 1024), a & b)


def test_a_region_shrunk_between_pieces_is_a_400(
    regions: SharedMemoryRegions, backend: NumpyBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object truncated after the first piece: the next read comes back short, a 400 naming
    the region, never a fault; restored, the same request runs."""
    model = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
    x = _random(DataType.UINT8, (4096,))
    request = _request(
        model, {"InputTensor": x}, {"InputTensor": 8192}, 0, DataType.UINT8, out_bytes=x.nbytes
    )
    planned = plan(get_operator(model), request, LIMITS, regions)
    real_write = SystemBytes.write
    writes = 0

    def shrink_after_first(self: SystemBytes, start: int, data: memoryview) -> None:
        nonlocal writes
        real_write(self, start, data)
        writes += 1
        if writes == 1:
            os.truncate(_object(), 8192 + 100)

    monkeypatch.setattr(SystemBytes, "write", shrink_after_first)
    with pytest.raises(InvalidRequest) as caught:
        rest_infer.encode(planned, backend, regions)
    assert caught.value.rule == "region_shrunk"
    assert writes == 1
    os.truncate(_object(), OBJECT_BYTES)
    _put(x, 8192)
    monkeypatch.setattr(SystemBytes, "write", real_write)
    rest_infer.encode(planned, backend, regions)
    assert_bits_equal(_get(x, 0), ~x)


def test_a_run_keeps_the_regions_it_started_with(
    regions: SharedMemoryRegions, backend: NumpyBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The region unregistered between two pieces: the run finishes on the object it started
    with (held for the run), and the region is let go once it is done."""
    model = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
    x = _random(DataType.UINT8, (4096,))
    _put(x, 8192)
    request = _request(
        model, {"InputTensor": x}, {"InputTensor": 8192}, 0, DataType.UINT8, x.nbytes
    )
    planned = plan(get_operator(model), request, LIMITS, regions)
    real_write = SystemBytes.write

    def unregister_after_first(self: SystemBytes, start: int, data: memoryview) -> None:
        real_write(self, start, data)
        regions.unregister("r")

    monkeypatch.setattr(SystemBytes, "write", unregister_after_first)
    rest_infer.encode(planned, backend, regions)
    assert_bits_equal(_get(x, 0), ~x)
    assert regions.status() == []
    with pytest.raises(InvalidRequest) as caught:
        rest_infer.encode(planned, backend, regions)
    assert caught.value.rule == "unknown_region"


def test_a_streamed_run_is_admitted_for_its_pieces(
    regions: SharedMemoryRegions, backend: NumpyBackend
) -> None:
    """Admission counts what a run holds: a piece per shared input of the output's size and one
    of the output when streamed, a broadcast input whole; the whole tensors when not streamed
    (rows longer than a piece)."""
    model = "onnx.BitwiseAnd-18"
    a, b = _random(DataType.UINT8, (4, 256)), _random(DataType.UINT8, (4, 256))
    streamed = plan(
        get_operator(model),
        _request(model, {"A": a, "B": b}, {"A": 0, "B": 4096}, 8192, DataType.UINT8, a.nbytes),
        LIMITS,
        regions,
    )
    assert streamed.memory_needed(100, backend) == 100 + 3 * core_plan.STREAM_PIECE_BYTES
    assert streamed.memory_needed(100) == 100 + 3 * a.nbytes  # not knowing the backend
    whole = plan(
        get_operator(model),
        _request(model, {"A": a, "B": b[0]}, {"A": 0, "B": 4096}, 8192, DataType.UINT8, a.nbytes),
        LIMITS,
        regions,
    )
    assert whole.memory_needed(100, backend) == 100 + 2 * a.nbytes + b[0].nbytes  # long rows
    wide, narrow = _random(DataType.UINT8, (8, 4, 4)), _random(DataType.UINT8, (8, 4, 1))
    by_rows = plan(
        get_operator(model),
        _request(model, {"A": wide, "B": narrow}, {"A": 0, "B": 4096}, 8192, DataType.UINT8,
                 wide.nbytes),
        LIMITS,
        regions,
    )  # fmt: skip
    # Rows of 4 x 4: a piece of the input of the output's size, the broadcast input whole, a
    # piece of the output.
    assert streams(by_rows, backend)
    piece = core_plan.STREAM_PIECE_BYTES
    assert by_rows.memory_needed(100, backend) == 100 + piece + narrow.nbytes + piece
    into_body = plan(
        get_operator(model),
        _request(model, {"A": a, "B": b}, {"A": 0, "B": 4096}, None, DataType.UINT8),
        LIMITS,
        regions,
    )
    # a piece per shared input; the output is the response's, whole
    assert (
        into_body.memory_needed(100, backend) == 100 + 2 * core_plan.STREAM_PIECE_BYTES + a.nbytes
    )


@pytest.mark.parametrize(
    ("a_shape", "b_shape"), [((5, 0), (5, 1)), ((0, 5), (5,)), ((5, 0), (1,))],
    ids=["column", "row", "one"],
)  # fmt: skip
def test_empty_broadcasts(
    regions: SharedMemoryRegions,
    backend: NumpyBackend,
    a_shape: tuple[int, ...],
    b_shape: tuple[int, ...],
) -> None:
    """An empty output beside a broadcast input (rows of no elements, or none of them): admitted
    and answered, nothing written."""
    model = "onnx.BitwiseXor-18"
    a, b = _random(DataType.UINT16, a_shape), _random(DataType.UINT16, b_shape)
    request = _request(model, {"A": a, "B": b}, {"A": 0, "B": 64}, 128, DataType.UINT16, 0)
    before = _object().read_bytes()  # the inputs in
    planned = _run(regions, backend, request, model)
    assert planned.memory_needed(100, backend) >= 100
    assert _object().read_bytes() == before
    in_body = _request(model, {"A": a, "B": b}, {"A": None, "B": None}, None, DataType.UINT16)
    assert _body_output(regions, backend, in_body, model) == b""  # no region at all


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)])
def test_empty_tensors(
    regions: SharedMemoryRegions, backend: NumpyBackend, shape: tuple[int, ...]
) -> None:
    """No element, no piece: the run answers and writes nothing."""
    model = "onnx.BitwiseXor-18"
    a, b = _random(DataType.UINT16, shape), _random(DataType.UINT16, shape)
    before = _object().read_bytes()
    request = _request(model, {"A": a, "B": b}, {"A": 0, "B": 64}, 128, DataType.UINT16, 0)
    planned = _run(regions, backend, request, model)
    assert streams(planned, backend)
    assert _object().read_bytes() == before


def test_a_region_the_kernel_will_not_write_is_a_400(
    regions: SharedMemoryRegions, backend: NumpyBackend
) -> None:
    """A write the kernel refuses (here EFBIG: past this process's file-size limit; on a full
    /dev/shm, ENOSPC, as a sparse object's pages are taken when written) is a 400 naming the
    region and the OS's words, never a 500; with the limit lifted the same request runs."""
    model = "DML_OPERATOR_ELEMENT_WISE_BIT_NOT"
    x = _random(DataType.UINT8, (4096,))
    _put(x, 0)
    request = _request(
        model, {"InputTensor": x}, {"InputTensor": 0}, 8192, DataType.UINT8, out_bytes=x.nbytes
    )
    planned = plan(get_operator(model), request, LIMITS, regions)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error, not the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, limits[1]))
    try:
        with pytest.raises(InvalidRequest) as caught:
            rest_infer.encode(planned, backend, regions)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert (caught.value.field, caught.value.rule) == ("OutputTensor", "shared_memory_io")
    assert "could not be written: File too large" in caught.value.message
    rest_infer.encode(planned, backend, regions)
    assert_bits_equal(_get(x, 8192), ~x)
