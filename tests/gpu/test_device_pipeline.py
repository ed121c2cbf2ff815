"""A large element-wise call on host data in pieces on a real device (backends/pieces.py, the
CuPy backend's ``run_pieces``; tests/core/test_transfer_pieces.py runs the same schedule on a
host stand-in): the answer equals NumPy's for 64 MiB and for odd sizes with a tail piece, and
CUDA events timing each piece's upload, kernel and download show them overlapping (their times
add up to more than the whole run's). And a run launched inline on the event loop is awaited by
its stream's callback (core/device_wait.py): the loop runs on until it fires, then the answer is
right (tests/core/test_device_wait.py on a stand-in). Skipped without CuPy and a device (in GPU mode, failed:
gpu/devices.py)."""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest
from gpu.devices import cupy_backend_or_skip, module_backend
from support.host_calls import on_numpy

from tensorbits.core.backends.cupy_backend import CupyBackend, CupyPieces
from tensorbits.core.backends.pieces import PIECE_BYTES, PIPELINE_MIN_BYTES
from tensorbits.core.device_wait import run_woken
from tensorbits.core.engine import run_into
from tensorbits_protocol.dtypes import DataType, numpy_dtype
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

pytestmark = pytest.mark.gpu

BACKEND = cast("CupyBackend", cupy_backend_or_skip())
cupy_backend = module_backend(BACKEND)
Arr = np.ndarray[Any, Any]
MiB = 1 << 20
RNG = np.random.default_rng(11)

# (operator, input type, parameters, elements): 64 MiB of one byte; odd sizes whose last piece
# is short, an 8-byte type among them, and a count whose output is narrower than its input.
CASES = [
    ("onnx.BitwiseXor-18", DataType.UINT8, {}, 64 * MiB),
    ("onnx.BitShift-11", DataType.UINT64, {"direction": "RIGHT"}, PIPELINE_MIN_BYTES // 8 + 3),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", DataType.INT32, {}, 3 * PIECE_BYTES // 4 + 12345),
    ("openvino.BitwiseNot-13", DataType.INT8, {}, 9 * MiB + 1),
]


def _call(name: str, datatype: DataType, params: dict[str, Any], count: int) -> ResolvedCall:
    op = get_operator(name)
    return validate_call(op, {x: TensorSpec(datatype, (count,)) for x in op.inputs}, params)


def _inputs(call: ResolvedCall) -> list[Arr]:
    dtype = numpy_dtype(call.input_datatype)
    count = call.output_shape[0]
    return [
        RNG.integers(0, 256, count * dtype.itemsize, np.uint8).view(dtype)
        for _ in call.kernel_input_shapes
    ]


@pytest.mark.parametrize(("name", "datatype", "params", "count"), CASES)
def test_pieces_answer_as_numpy_does(
    cupy_backend: CupyBackend, name: str, datatype: DataType, params: dict[str, Any], count: int
) -> None:
    call = _call(name, datatype, params, count)
    inputs = _inputs(call)
    want = on_numpy(call, inputs).tobytes()
    out = np.empty(count, numpy_dtype(call.output_datatype))
    assert cupy_backend.run_pieces(call, inputs, out)  # in pieces, not one-shot
    assert out.tobytes() == want
    out[...] = 0
    run_into(cupy_backend, call, inputs, out)  # the way every request runs it
    assert out.tobytes() == want
    assert cupy_backend.pinned.held <= cupy_backend.pinned.limit


class Timed(CupyPieces):
    """The backend's pieces with a timed CUDA event before and after each copy and kernel."""

    def __init__(self, backend: CupyBackend) -> None:
        super().__init__(backend)
        self.spans: list[tuple[Any, Any]] = []

    def _timed(self, stream: Any, work: Any) -> None:
        cuda = importlib.import_module("cupy").cuda
        start, end = cuda.Event(), cuda.Event()
        start.record(stream)
        work()
        end.record(stream)
        self.spans.append((start, end))

    def upload(self, stream: Any, device: Any, host: Arr) -> None:
        self._timed(stream, lambda: super(Timed, self).upload(stream, device, host))

    def launch(self, stream: Any, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        self._timed(stream, lambda: super(Timed, self).launch(stream, call, inputs, out))

    def download(self, stream: Any, host: Arr, device: Any) -> None:
        self._timed(stream, lambda: super(Timed, self).download(stream, host, device))


def test_the_pieces_copies_and_kernels_overlap(
    cupy_backend: CupyBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    cuda = importlib.import_module("cupy").cuda
    call = _call("onnx.BitwiseXor-18", DataType.UINT8, {}, 64 * MiB)
    inputs = _inputs(call)
    out = np.empty(64 * MiB, np.uint8)
    assert cupy_backend.run_pieces(call, inputs, out)  # warm: kernels compiled, pool filled
    timed = Timed(cupy_backend)
    monkeypatch.setattr(cupy_backend, "pieces", timed)
    assert cupy_backend.run_pieces(call, inputs, out)
    assert out.tobytes() == on_numpy(call, inputs).tobytes()
    spans = timed.spans
    assert len(spans) == 3 * (64 * MiB // PIECE_BYTES)  # an upload, a kernel, a download each
    first = spans[0][0]  # the first upload's start, issued before anything else
    busy = sum(cuda.get_elapsed_time(start, end) for start, end in spans)
    wall = max(cuda.get_elapsed_time(first, end) for _, end in spans)
    print(f"pieces: {busy:.2f} ms of copies and kernels in {wall:.2f} ms")
    assert busy > wall, (busy, wall)


def test_an_inline_run_is_woken_by_its_stream_callback(cupy_backend: CupyBackend) -> None:
    call = _call("onnx.BitwiseNot-18", DataType.UINT8, {}, 256 * MiB)
    (x,) = _inputs(call)
    on_device = cupy_backend.asarray(x)
    out = cupy_backend.empty((256 * MiB,), np.dtype(np.uint8))

    def encode(_: None) -> None:
        run_into(cupy_backend, call, [on_device], out)  # a device ``out``: finished by callback

    async def scenario() -> int:
        serving = asyncio.ensure_future(run_woken(0, 1, encode, None))  # inline: 0 < 1
        ticks = 0
        await asyncio.sleep(0)  # the run launched, its callback asked for
        while not serving.done():
            ticks += 1  # the loop is free while the kernel runs
            await asyncio.sleep(0)
        await serving
        return ticks

    ticks = asyncio.run(scenario())
    assert ticks > 0
    assert cupy_backend.streams.current().done  # the callback came after the stream's work
    np.testing.assert_array_equal(cupy_backend.to_host(out), ~x)
