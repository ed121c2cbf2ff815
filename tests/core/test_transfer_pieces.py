"""A large element-wise call on host data runs on a device in pieces whose copies overlap its
kernels (backends/pieces.py), on a host device that runs each queued copy and kernel only when
something waits for it (support/piece_stand_in.py): the answer is NumPy's byte for byte for
every kind of operator that qualifies, the streams wait for the events the schedule names, the
staging stays within the pinned pool's bound and the call runs one-shot when the pool is short,
and a call that does not qualify runs one-shot as before. tests/gpu/test_device_pipeline.py
runs the same schedule on a device."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from support.device_backend import StandInDevice
from support.host_calls import on_numpy
from support.piece_stand_in import PieceStandIn, Unordered

from tensorbits.core.backends import pieces
from tensorbits.core.backends.pieces import PIECE_BYTES, PIPELINE_MIN_BYTES, SLOTS, run_pieces
from tensorbits.core.engine import run_into
from tensorbits.core.kernels import DeviceArray
from tensorbits_protocol.dtypes import DataType, numpy_dtype
from tensorbits_protocol.operators import get_operator
from tensorbits_protocol.validation import ResolvedCall, TensorSpec, validate_call

Arr = np.ndarray[Any, Any]
PIECE = 4096  # bytes of the largest operand a piece, in the tests that cut small calls
RNG = np.random.default_rng(7)

# (operator, input type, parameters): every kernel kind, 1-byte and 8-byte types, a count whose
# output is narrower than its input, shifts in both directions by counts past the width.
CASES = [
    ("DML_OPERATOR_ELEMENT_WISE_BIT_AND", DataType.UINT8, {}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_OR", DataType.INT64, {}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_XOR", DataType.FP32, {}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", DataType.INT8, {}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", DataType.UINT64, {}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", DataType.INT16, {"output_datatype": "UINT32"}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT", DataType.UINT8, {}),
    ("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_RIGHT", DataType.UINT64, {}),
    ("openvino.BitwiseLeftShift-15", DataType.INT8, {}),
    ("openvino.BitwiseNot-13", DataType.BOOL, {}),
    ("openvino.BitwiseRightShift-15", DataType.INT64, {}),
    ("onnx.BitShift-11", DataType.UINT64, {"direction": "LEFT"}),
    ("onnx.BitShift-11", DataType.UINT8, {"direction": "RIGHT"}),
]
SIZES = [PIECE - 1, 5 * PIECE + 3, 8 * PIECE]  # one short piece; a tail; whole pieces only


def _call(name: str, datatype: DataType, params: dict[str, Any], shape: tuple[int, ...]) -> Any:
    op = get_operator(name)
    specs = {input_name: TensorSpec(datatype, shape) for input_name in op.inputs}
    return validate_call(op, specs, params)


def _inputs(call: ResolvedCall, count: int) -> list[Arr]:
    dtype = numpy_dtype(call.input_datatype)
    arrays = []
    for shape in call.kernel_input_shapes:
        raw = RNG.integers(0, 256, count * dtype.itemsize, np.uint8).view(dtype)
        if dtype == np.bool_:
            raw = raw.view(np.uint8) & 1 == 1
        arrays.append(raw.reshape(shape))
    return arrays


@pytest.fixture
def device() -> Iterator[PieceStandIn]:
    stand_in = PieceStandIn()
    yield stand_in
    stand_in.close()


@pytest.fixture
def small_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls from half a piece of ``PIECE`` bytes qualify (the rule's bytes, scaled down)."""
    monkeypatch.setattr(pieces, "PIPELINE_MIN_BYTES", PIECE // 2)


@pytest.mark.usefixtures("small_calls")
@pytest.mark.parametrize(("name", "datatype", "params"), CASES)
@pytest.mark.parametrize("count", SIZES)
def test_pieces_answer_as_numpy_does(
    device: PieceStandIn, name: str, datatype: DataType, params: dict[str, Any], count: int
) -> None:
    call = _call(name, datatype, params, (count,))
    inputs = _inputs(call, count)
    out = np.empty(call.output_shape, numpy_dtype(call.output_datatype))
    assert run_pieces(device, call, inputs, out, PIECE)
    want = on_numpy(call, inputs)
    assert out.tobytes() == want.tobytes()
    assert device.idle()  # nothing left queued: every copy and kernel ran before the return
    assert device.pool.lent == 0  # the staging is back in the pool


def test_a_call_of_the_rules_size_runs_in_pieces_of_its_size(device: PieceStandIn) -> None:
    count = PIPELINE_MIN_BYTES // 8 + 3  # past the threshold by a tail of three elements
    call = _call("onnx.BitwiseXor-18", DataType.UINT64, {}, (count,))
    inputs = _inputs(call, count)
    out = np.empty(count, np.uint64)
    assert run_pieces(device, call, inputs, out)
    assert out.tobytes() == on_numpy(call, inputs).tobytes()
    launched = [step for step in device.ran if step[0] == "kernel"]
    assert len(launched) == -(-count * 8 // PIECE_BYTES) == 3
    # Each slot stages a piece of both inputs and of the output.
    assert device.staging_peak == SLOTS * 3 * PIECE_BYTES


@pytest.mark.usefixtures("small_calls")
def test_the_streams_wait_for_the_schedules_events(device: PieceStandIn) -> None:
    count = 6 * PIECE + 5
    call = _call("DML_OPERATOR_ELEMENT_WISE_BIT_AND", DataType.UINT8, {}, (count,))
    inputs = _inputs(call, count)
    out = np.empty(count, np.uint8)
    assert run_pieces(device, call, inputs, out, PIECE)
    issued, ran = device.issued, device.ran
    count_pieces = 7
    # Each stream first waits for the calling thread's stream (its device buffers' pool).
    for name in ("upload", "compute", "download"):
        assert next(step for step in issued if step[1] == name) == ("wait thread", name, 0)
    for i in range(count_pieces):
        # A piece's kernel runs after its upload's event passed, its download after its kernel.
        assert ran.index(("kernel", "compute", i)) > ran.index(("record", "upload", i))
        assert ran.index(("download", "download", i)) > ran.index(("record", "compute", i))
        # Its answer bytes are copied out once the host waited for its download's event.
        assert ("host_wait", "download", i) in issued
    for i in range(count_pieces - 1):
        # Piece i+1's upload is issued before the host waits for piece i's download.
        assert issued.index(("upload", "upload", i + 1)) < issued.index(
            ("host_wait", "download", i)
        )
    for i in range(SLOTS, count_pieces):
        # A slot's buffers are reused only after the piece before in it is done with them.
        upload = issued.index(("upload", "upload", i))
        assert issued.index(("host_wait", "upload", i - SLOTS)) < upload
        assert ran.index(("kernel", "compute", i - SLOTS)) < ran.index(("upload", "upload", i))
        assert ran.index(("download", "download", i - SLOTS)) < ran.index(("kernel", "compute", i))


@pytest.mark.usefixtures("small_calls")
def test_the_stand_in_catches_a_schedule_without_its_events() -> None:
    device = Unordered()
    count = 3 * PIECE
    call = _call("DML_OPERATOR_ELEMENT_WISE_BIT_NOT", DataType.UINT8, {}, (count,))
    inputs = _inputs(call, count)
    out = np.empty(count, np.uint8)
    try:
        assert run_pieces(device, call, inputs, out, PIECE)
        assert out.tobytes() != on_numpy(call, inputs).tobytes()
    finally:
        device.close()


@pytest.mark.usefixtures("small_calls")
def test_the_staging_stays_within_the_pool_and_falls_back_when_short() -> None:
    count = 4 * PIECE + 1
    call = _call("DML_OPERATOR_ELEMENT_WISE_BIT_OR", DataType.UINT8, {}, (count,))
    inputs = _inputs(call, count)
    want = on_numpy(call, inputs).tobytes()
    staging = SLOTS * 3 * PIECE  # three operands of one piece a slot
    fits = PieceStandIn(pool_bytes=staging)
    short = PieceStandIn(pool_bytes=staging - PIECE)
    try:
        out = np.empty(count, np.uint8)
        assert run_pieces(fits, call, inputs, out, PIECE)
        assert out.tobytes() == want
        assert fits.staging_peak == staging == fits.pool.held  # all of it, none past it
        assert fits.pool.fallbacks == 0
        assert fits.pool.lent == 0
        out = np.zeros(count, np.uint8)
        assert not run_pieces(short, call, inputs, out, PIECE)  # one-shot instead
        assert short.refused == short.pool.fallbacks == 1
        assert short.pool.held <= short.pool.limit
        assert short.pool.lent == 0  # what it had lent came back
        assert not short.issued  # nothing was queued
        assert not out.any()
    finally:
        fits.close()
        short.close()


class PiecedDevice(StandInDevice):
    """A device backend counting its host<->device copies, with calls in pieces on a
    ``PieceStandIn``, as ``CupyBackend.run_pieces`` offers them to ``engine.run_into``."""

    def __init__(self, pool_bytes: int = 64 << 20) -> None:
        super().__init__(fused=False)
        self.pieces = PieceStandIn(pool_bytes)

    def run_pieces(self, call: ResolvedCall, inputs: Sequence[DeviceArray], out: Arr) -> bool:
        return run_pieces(self.pieces, call, inputs, out, PIECE)

    def close(self) -> None:
        self.pieces.close()
        super().close()


def _run(backend: PiecedDevice, call: ResolvedCall, inputs: Sequence[Any], out: Arr) -> str:
    """How ``engine.run_into`` ran the call: "pieces" or "one-shot", its answer checked."""
    run_into(backend, call, inputs, out)
    assert np.array_equal(out, on_numpy(call, inputs))  # values: one ``out`` is big-endian
    ran_pieces = backend.pieces.counts.bytes_to_device > 0
    one_shot = backend.counts.to_device > 0
    assert ran_pieces != one_shot
    return "pieces" if ran_pieces else "one-shot"


@pytest.mark.usefixtures("small_calls")
def test_only_calls_that_qualify_run_in_pieces() -> None:
    count = 4 * PIECE
    xor = _call("onnx.BitwiseXor-18", DataType.UINT8, {}, (count,))
    x, y = _inputs(xor, count)
    backends = []
    try:

        def run(call: ResolvedCall, inputs: Sequence[Any], out: Arr, pool: int = 1 << 20) -> str:
            backends.append(backend := PiecedDevice(pool))
            return _run(backend, call, inputs, out)

        assert run(xor, [x, y], np.empty(count, np.uint8)) == "pieces"
        # Broadcast: the second input is one row.
        wide = _call("onnx.BitwiseXor-18", DataType.UINT8, {}, (4, count // 4))
        row_call = validate_call(
            get_operator("onnx.BitwiseXor-18"),
            {
                "A": TensorSpec(DataType.UINT8, (4, count // 4)),
                "B": TensorSpec(DataType.UINT8, (count // 4,)),
            },
            {},
        )
        a = x.reshape(4, count // 4)
        assert (
            run(row_call, [a, y[: count // 4]], np.empty((4, count // 4), np.uint8)) == "one-shot"
        )
        assert run(wide, [a, y.reshape(4, -1)], np.empty((4, count // 4), np.uint8)) == "pieces"
        # Strided: an input that is every other element of a longer array.
        double = np.repeat(x, 2)[::2]
        assert run(xor, [double, y], np.empty(count, np.uint8)) == "one-shot"
        # A strided output, and one of another byte order.
        out = np.empty(2 * count, np.uint8)[::2]
        assert run(xor, [x, y], out) == "one-shot"
        wide16 = _call("onnx.BitwiseXor-18", DataType.UINT16, {}, (count,))
        u, v = _inputs(wide16, count)
        assert run(wide16, [u, v], np.empty(count, ">u2")) == "one-shot"
        # Small: under the threshold.
        less = PIECE // 2 - 1
        small = _call("onnx.BitwiseXor-18", DataType.UINT8, {}, (less,))
        assert run(small, [x[:less], y[:less]], np.empty(less, np.uint8)) == "one-shot"
        # A pool too small for the staging: one-shot, still right.
        assert run(xor, [x, y], np.empty(count, np.uint8), pool=PIECE) == "one-shot"
    finally:
        for backend in backends:
            backend.close()
