"""A host-borne element-wise call on a device, in pieces whose copies overlap its kernels.

One-shot, a call on host data copies every input to the device, runs the kernel, then copies
the output back: the link and the device take turns, each idle while the other works. In
pieces (``run_pieces``), piece i+1's upload runs while piece i's kernel and download do, so a
large call takes about as long as its copies alone. The call qualifies (``piece_plan``) when
it is element-wise without broadcasting (``engine.is_flat_elementwise``: a piece of the output
needs the same piece of each input and nothing else), every operand is a contiguous host array
of native byte order (a piece is then a range of bytes), and its largest operand holds at least
``PIPELINE_MIN_BYTES``. Anything else runs one-shot, as before.

The schedule, for piece i in slot ``i % SLOTS`` (each slot: pinned staging for each input and
the output, and device buffers for each):

    host:     wait for the upload of piece i-SLOTS (its staging is read), then copy piece i of
              each input into the slot's staging
    upload:   wait for the kernel of piece i-SLOTS (the slot's device inputs are read), copy
              the staging to the device, record ``uploaded[i]``
    compute:  wait for ``uploaded[i]`` and for the download of piece i-SLOTS (the slot's device
              output is copied out), run the kernel, record ``computed[i]``
    download: wait for ``computed[i]``, copy the device output into the slot's staging, record
              ``downloaded[i]``
    host:     wait for ``downloaded[i-1]``, copy piece i-1 out of staging into the answer

so the host copies piece i in while piece i-1 is on the device, and piece i's upload is issued
before the host waits for piece i-1's download. Upload, compute and download are three streams
that do not block with respect to the legacy stream; each first waits for an event recorded on
the calling thread's stream (its device buffers come from that stream's pool, whose blocks may
be freed by work still queued there).

The staging comes from the backend's bounded pinned pool (pinned_pool.py), counted as every
staged copy is. When the pool cannot lend all of it, nothing is taken and the call runs
one-shot (whose copies then fall back to pageable memory as the pool says): right, slower.

``PieceDevice`` is what the schedule asks of a device; the CuPy backend gives it with CuPy's
streams, events and asynchronous copies, tests/support/piece_stand_in.py on the host.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from tensorbits.core.engine import flat_call, is_flat_elementwise
from tensorbits_protocol.dtypes import numpy_dtype
from tensorbits_protocol.validation import ResolvedCall

Arr = np.ndarray[Any, Any]
MiB = 1 << 20
# A call runs in pieces from this many bytes of its largest operand. Below it the one-shot
# copies take well under a millisecond each over PCIe or NVLink-C2C, so overlapping them saves
# less than the events, waits and host copies of a pipeline cost (tens of microseconds each).
PIPELINE_MIN_BYTES = 8 * MiB
# Each piece moves at most this many bytes of its largest operand: large enough that each copy
# runs near the link's bandwidth (reached from about 1 MiB) and a kernel's launch is a small
# part of it, small enough that the first upload and the last download, which nothing
# overlaps, are a small part of a large call (a sixteenth of 64 MiB).
PIECE_BYTES = 4 * MiB
# Pieces in flight at once: two (double buffering) let piece i+1's upload overlap piece i's
# kernel and download; the device has one copy engine each way, so more would pin more memory
# (each slot holds a piece of every operand) for no more overlap.
SLOTS = 2


class PieceDevice(Protocol):
    """What the schedule asks of a device. Every copy and kernel is asynchronous: issued on a
    stream, ordered after what was issued there before and after the events it was told to
    wait for; ``host_wait`` alone blocks."""

    def streams(self) -> tuple[Any, Any, Any]:
        """The upload, compute and download streams of the calling thread."""
        ...

    def record(self, stream: Any) -> Any:
        """An event recorded on ``stream`` (``None``: the calling thread's own stream)."""
        ...

    def wait(self, stream: Any, event: Any) -> None:
        """Order what is issued on ``stream`` from now on after ``event``."""
        ...

    def host_wait(self, event: Any) -> None: ...

    def staging(self, nbytes: int) -> Arr | None:
        """``nbytes`` of pinned host memory (uint8), or None where the pool cannot lend them."""
        ...

    def release(self, staging: Arr) -> None:
        """Give back what ``staging`` lent (its copies have passed)."""
        ...

    def empty(self, nbytes: int) -> Any:
        """``nbytes`` of device memory (a uint8 device array)."""
        ...

    def upload(self, stream: Any, device: Any, host: Arr) -> None: ...

    def download(self, stream: Any, host: Arr, device: Any) -> None: ...

    def launch(self, stream: Any, call: ResolvedCall, inputs: Sequence[Any], out: Any) -> None:
        """The call's kernel on ``stream``, on device arrays of its flat piece."""
        ...


class PiecePlan(NamedTuple):
    """How a call is cut: ``step`` elements a piece, ``total`` in all, and each operand's
    element size (the inputs', then the output's)."""

    step: int
    total: int
    itemsizes: tuple[int, ...]

    def pieces(self) -> list[tuple[int, int]]:
        """(first element, count) of each piece, the last one shorter where it falls so."""
        return [
            (start, min(self.step, self.total - start)) for start in range(0, self.total, self.step)
        ]


def _plain(array: object) -> bool:
    return isinstance(array, np.ndarray) and array.flags.c_contiguous and array.dtype.isnative


def piece_plan(
    call: ResolvedCall, inputs: Sequence[Any], out: Any, piece_bytes: int = PIECE_BYTES
) -> PiecePlan | None:
    """The pieces ``call`` runs in, or None where it runs one-shot: not element-wise without
    broadcasting, an operand not a contiguous native-order host array (a device array, a
    strided view, a big-endian type), an ``out`` not of the call's output type, or fewer than
    ``PIPELINE_MIN_BYTES`` in its largest operand."""
    if not (is_flat_elementwise(call) and _plain(out) and all(_plain(x) for x in inputs)):
        return None
    if out.dtype != numpy_dtype(call.output_datatype):
        return None
    total = math.prod(call.output_shape)
    if out.size != total or any(x.size != total for x in inputs):
        return None
    operands = [*inputs, out]
    if max(x.nbytes for x in operands) < PIPELINE_MIN_BYTES:
        return None
    itemsizes = tuple(int(x.dtype.itemsize) for x in operands)
    step = max(1, piece_bytes // max(itemsizes))
    return PiecePlan(min(step, total), total, itemsizes)


def run_pieces(
    device: PieceDevice,
    call: ResolvedCall,
    inputs: Sequence[Any],
    out: Any,
    piece_bytes: int = PIECE_BYTES,
) -> bool:
    """Run ``call`` in overlapped pieces (the module's schedule) into the host array ``out``,
    finished before this returns; False, with nothing run, where it does not qualify
    (``piece_plan``) or the pinned pool cannot lend the staging."""
    plan = piece_plan(call, inputs, out, piece_bytes)
    if plan is None:
        return False
    sizes = [plan.step * itemsize for itemsize in plan.itemsizes]
    staging: list[list[Arr]] = []
    try:
        for _ in range(SLOTS):
            slot: list[Arr] = []
            staging.append(slot)
            for nbytes in sizes:
                buffer = device.staging(nbytes)
                if buffer is None:
                    return False  # the pool is short: one-shot, the staging given back
                slot.append(buffer)
        _pipeline(device, call, plan, [*inputs, out], staging)
        return True
    finally:
        for slot in staging:
            for buffer in slot:
                device.release(buffer)


def _pipeline(
    device: PieceDevice,
    call: ResolvedCall,
    plan: PiecePlan,
    operands: Sequence[Arr],
    staging: Sequence[Sequence[Arr]],
) -> None:
    """The schedule (the module's docstring): ``operands`` the inputs and then the output."""
    upload, compute, download = device.streams()
    flat = [x.reshape(-1).view(np.uint8) for x in operands]  # contiguous: views, no copies
    *flat_inputs, flat_out = flat
    dtypes = [x.dtype for x in operands]
    on_device = [[device.empty(plan.step * size) for size in plan.itemsizes] for _ in range(SLOTS)]
    before = device.record(None)
    for stream in (upload, compute, download):
        device.wait(stream, before)
    pieces = plan.pieces()
    uploaded: list[Any] = []
    computed: list[Any] = []
    downloaded: list[Any] = []

    def finish(i: int) -> None:
        """Piece i's answer bytes, out of its staging once its download has passed."""
        start, count = pieces[i]
        size = plan.itemsizes[-1]
        device.host_wait(downloaded[i])
        flat_out[start * size : (start + count) * size] = staging[i % SLOTS][-1][: count * size]

    try:
        for i, (start, count) in enumerate(pieces):
            staged, buffers = staging[i % SLOTS], on_device[i % SLOTS]
            ranges = [(start * size, count * size) for size in plan.itemsizes]
            if i >= SLOTS:
                device.host_wait(uploaded[i - SLOTS])
                device.wait(upload, computed[i - SLOTS])
            for k, source in enumerate(flat_inputs):
                first, nbytes = ranges[k]
                staged[k][:nbytes] = source[first : first + nbytes]
                device.upload(upload, buffers[k][:nbytes], staged[k][:nbytes])
            uploaded.append(device.record(upload))
            device.wait(compute, uploaded[i])
            if i >= SLOTS:
                device.wait(compute, downloaded[i - SLOTS])
            views = [buffers[k][: ranges[k][1]].view(dtypes[k]) for k in range(len(operands))]
            device.launch(compute, flat_call(call, count), views[:-1], views[-1])
            computed.append(device.record(compute))
            device.wait(download, computed[i])
            nbytes = ranges[-1][1]
            device.download(download, staged[-1][:nbytes], buffers[-1][:nbytes])
            downloaded.append(device.record(download))
            if i >= 1:
                finish(i - 1)
        finish(len(pieces) - 1)
    finally:
        # Whatever happened, nothing may still read or write the staging or the device buffers
        # once they are given back: wait for every stream's last work.
        for stream in (upload, compute, download):
            device.host_wait(device.record(stream))


__all__ = [
    "PIECE_BYTES",
    "PIPELINE_MIN_BYTES",
    "SLOTS",
    "PieceDevice",
    "PiecePlan",
    "piece_plan",
    "run_pieces",
]
