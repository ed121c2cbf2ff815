"""The NumPy backend: always available; large element-wise work is split over a thread pool.

NumPy releases the GIL inside its ufunc loops, so chunks of one call run on all cores at once.
Each chunk writes its slice of the caller's preallocated output: no temporaries, no copies.

How a large call runs (``NumpyBackend.run``): the operands are cut into equal, aligned pieces
(flat views when everything is C-contiguous, slices along axis 0 otherwise). The calling thread
and ``threads - 1`` pool workers then take pieces from one shared queue until none is left, so a
core that the machine steals for a moment does not hold the whole call up, and no thread sits
idle waiting for the others. Work still queued behind another call is withdrawn, never waited on.

One NumPy loop is slow enough to be worth replacing: ``bitwise_count`` of 16-bit elements
(NumPy 2.x has no vector loop for it; about 4x slower per byte than the 8-bit one). For
contiguous operands it counts the two bytes of each element with the fast 8-bit loop into a
small per-thread scratch block that stays in cache, adds the two counts and narrows into
``out``: bit-exact with the plain call. The scratch is a fixed 512 KiB per thread, reused; never
a copy of a tensor.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

import numpy as np

from tensorbits.core.backends.base import BoundRun
from tensorbits.core.kernels import KERNELS, BitOps, DeviceArray, as_kernel_operands, run_kernel
from tensorbits.core.shared_memory import DeviceMemory
from tensorbits_protocol.dtypes import wire_dtype
from tensorbits_protocol.operators import Function
from tensorbits_protocol.validation import ResolvedCall

# Below this much work one plain call beats the cost of handing chunks to threads. Work is the
# bytes a call reads and writes, weighted up for loops that are compute-bound (``_work_bytes``;
# measured on 2 cores: memory-bound ops break even between 3 and 6 MiB moved, 8-bit shifts near
# 1.5 MiB).
# A call whose output alone is this large always runs in parallel.
PARALLEL_THRESHOLD_BYTES = 4 << 20
# Chunks per thread: a few, so a slow thread does not hold the others up at the end.
CHUNKS_PER_THREAD = 2
# No chunk smaller than this much work: below it the per-chunk overhead shows.
MIN_CHUNK_BYTES = 1 << 20
# Chunk boundaries fall on multiples of this many bytes (cache lines, whole vectors).
CHUNK_ALIGN_BYTES = 4096
# Elements per block of the 16-bit popcount: its scratch (2 bytes per element, 512 KiB) stays in
# the core's L2 cache; smaller blocks cost more Python per byte and scale worse over threads.
POPCOUNT_BLOCK = 1 << 18

_scratch_local = threading.local()


def _scratch(nbytes: int) -> np.ndarray[Any, Any]:
    """A per-thread byte buffer of at least ``nbytes``, reused across calls."""
    buf: np.ndarray[Any, Any] | None = getattr(_scratch_local, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(nbytes, np.uint8)
        _scratch_local.buf = buf
    return buf[:nbytes]


def _popcount16(x: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    # Flat, contiguous uint16 ``x``: count each byte (fast 8-bit loop), then add the two counts
    # of each element: (lo + 256*hi) * 0x0101 has lo + hi in its high byte, which the shift
    # brings down while narrowing (or widening) into ``out``.
    for start in range(0, x.shape[0], POPCOUNT_BLOCK):
        block = x[start : start + POPCOUNT_BLOCK]
        counts = _scratch(2 * block.shape[0])
        np.bitwise_count(block.view(np.uint8), out=counts)
        pairs = counts.view(np.uint16)
        np.multiply(pairs, 0x0101, out=pairs)
        np.right_shift(pairs, 8, out=out[start : start + POPCOUNT_BLOCK])


def _popcount(x: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    # x is already the unsigned view: NumPy's bitwise_count counts |x| for signed types.
    if x.dtype.itemsize == 2 and x.size > 0 and x.flags.c_contiguous and out.flags.c_contiguous:
        _popcount16(x.reshape(-1), out.reshape(-1))
        return
    np.bitwise_count(x, out=out)


def _shift(
    x: np.ndarray[Any, Any], count: np.ndarray[Any, Any], out: np.ndarray[Any, Any], left: bool
) -> None:
    # NumPy's shifts already follow our rule (0 past the width, sign fill for negative values).
    (np.left_shift if left else np.right_shift)(x, count, out=out)


NUMPY_BIT_OPS = BitOps(popcount=_popcount, shift=_shift)


def _split_points(length: int, parts: int, align: int = 1) -> list[tuple[int, int]]:
    """``[start, stop)`` ranges covering ``range(length)`` in at most ``parts`` pieces; every
    boundary but the last is a multiple of ``align``."""
    step = -(-length // max(parts, 1))
    step = max(align, -(-step // align) * align)
    return [(start, min(start + step, length)) for start in range(0, length, step)]


def chunked(
    operands: Sequence[np.ndarray[Any, Any]], out: np.ndarray[Any, Any], parts: int
) -> list[tuple[list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]]:
    """Split one element-wise call into at most ``parts`` independent calls on views.

    Inputs are broadcast to the output's shape first (views, stride 0), so every piece sees the
    same slice of every operand. Contiguous operands are split flat; others along axis 0."""
    shaped = [x if x.shape == out.shape else np.broadcast_to(x, out.shape) for x in operands]
    if out.flags.c_contiguous and all(x.flags.c_contiguous for x in shaped):
        flat_out = out.reshape(-1)
        flat_in = [x.reshape(-1) for x in shaped]
        align = max(1, CHUNK_ALIGN_BYTES // max(out.itemsize, 1))
        return [
            ([x[a:b] for x in flat_in], flat_out[a:b])
            for a, b in _split_points(flat_out.shape[0], parts, align)
        ]
    if out.ndim == 0 or out.shape[0] < 2:
        return [(list(shaped), out)]
    return [([x[a:b] for x in shaped], out[a:b]) for a, b in _split_points(out.shape[0], parts)]


def _work_bytes(
    call: ResolvedCall, operands: Sequence[np.ndarray[Any, Any]], out: np.ndarray[Any, Any]
) -> int:
    moved = out.nbytes + sum(x.nbytes for x in operands)
    function = call.op.function
    if function is Function.COUNT and operands[0].itemsize in (2, 4):
        return 2 * moved  # 16/32-bit popcount: about half of copy speed on one core
    if function in _SHIFTS and operands[0].itemsize == 1:
        return 4 * moved  # NumPy's 8-bit variable shifts are scalar loops: ~4 Gelem/s per core
    return moved


_SHIFTS = (Function.SHIFT, Function.SHIFT_LEFT, Function.SHIFT_RIGHT)


class _Tasks:
    """Tasks handed out one at a time to whichever thread asks first."""

    def __init__(self, tasks: Sequence[Callable[[], None]]) -> None:
        self.tasks = tasks
        self.next = 0
        self.lock = threading.Lock()

    def drain(self) -> None:
        while True:
            with self.lock:
                index = self.next
                if index >= len(self.tasks):
                    return
                self.next = index + 1
            self.tasks[index]()

    def cancel(self) -> None:
        with self.lock:
            self.next = len(self.tasks)


class NumpyBackend:
    name = "numpy"
    host_memory = True
    # The functions whose kernels here give the same bytes when ``out`` is one of the inputs
    # (the same memory, type and shape): each is one NumPy ufunc pass, element by element (a
    # ufunc reads the inputs at a position before it writes ``out`` there, and NumPy takes an
    # operand identical to ``out`` as safe), and the parallel chunks (``chunked``) cover the
    # same disjoint positions of every operand. The shifts' rule (a count past the width or
    # negative) is decided per element inside that pass, not by a second one; the 16-bit
    # popcount's blocks (``_popcount16``) each read their whole input block before writing
    # it, and its output is never 16-bit anyway. A front end may have a call's output written
    # over an input it owns only for these (``api/rest_infer.written_over``);
    # tests/core/test_alias_safe_kernels.py checks each against a separate ``out``.
    alias_safe = frozenset(
        (
            Function.AND, Function.OR, Function.XOR, Function.NOT, Function.COUNT,
            Function.SHIFT_LEFT, Function.SHIFT_RIGHT, Function.SHIFT,
        )
    )  # fmt: skip
    device_memory: DeviceMemory | None = None  # no device: CUDA shared memory is refused
    xp: Any = np

    def __init__(self, threads: int | None = None) -> None:
        self.threads = max(1, threads or os.cpu_count() or 1)
        self.device = f"cpu ({self.threads} threads)"
        # The calling thread works too: the pool holds the other threads - 1.
        self._pool = (
            ThreadPoolExecutor(self.threads - 1, thread_name_prefix="tensorbits-cpu")
            if self.threads > 1
            else None
        )

    def asarray(self, host: np.ndarray[Any, Any]) -> DeviceArray:
        return host

    def to_host(
        self, array: DeviceArray, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        if out is None:
            return np.asarray(array)
        np.copyto(out, array)
        return out

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> DeviceArray:
        return np.empty(shape, dtype)

    def run(self, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray) -> None:
        operands, target = as_kernel_operands(call, inputs, out)
        work = _work_bytes(call, operands, target)
        if self._pool is None or work < PARALLEL_THRESHOLD_BYTES:
            run_kernel(np, NUMPY_BIT_OPS, call, operands, target)
            return
        parts = min(self.threads * CHUNKS_PER_THREAD, max(1, work // MIN_CHUNK_BYTES))
        self.share(
            [
                partial(run_kernel, np, NUMPY_BIT_OPS, call, piece_in, piece_out)
                for piece_in, piece_out in chunked(operands, target, parts)
            ]
        )

    def bound(self, call: ResolvedCall, inputs: Sequence[np.ndarray[Any, Any]]) -> BoundRun | None:
        """``run`` of ``call`` on host arrays typed and shaped as ``inputs`` are (and an output
        of its wire type), decided once: the kernel, and whether its operands need views (none,
        most often: the arrays go to the kernel as they are). What ``run`` works out again at
        each call costs a small request 2-3 us. None where the work is shared among threads."""
        # A stand-in output: views of it are made, never its memory (zero strides: no bytes).
        out = np.broadcast_to(np.empty((), wire_dtype(call.output_datatype)), call.output_shape)
        operands, target = as_kernel_operands(call, inputs, out)
        if (
            self._pool is not None
            and _work_bytes(call, operands, target) >= PARALLEL_THRESHOLD_BYTES
        ):
            return None
        kernel = KERNELS[call.op.function]
        if target is out and all(x is y for x, y in zip(operands, inputs, strict=True)):
            return partial(kernel, np, NUMPY_BIT_OPS, call)

        def run_viewed(inputs: Sequence[np.ndarray[Any, Any]], out: np.ndarray[Any, Any]) -> None:
            kernel(np, NUMPY_BIT_OPS, call, *as_kernel_operands(call, inputs, out))

        return run_viewed

    def share(self, tasks: Sequence[Callable[[], None]]) -> None:
        """Run every task once on this backend's threads, the calling thread among them, and
        return when all have run (a fused graph's ranges, a large call's pieces); the first
        exception is raised once the others stopped taking tasks."""
        if self._pool is None or len(tasks) < 2:
            for task in tasks:
                task()
            return
        queue = _Tasks(tasks)
        helpers = min(self.threads, len(tasks)) - 1
        futures: list[Future[None]] = [self._pool.submit(queue.drain) for _ in range(helpers)]
        try:
            queue.drain()
        except BaseException:
            queue.cancel()
            raise
        finally:
            # Helpers that never started (the pool busy with another call) are withdrawn; the
            # others finish the task they hold before the caller goes on.
            for future in futures:
                if not future.cancel():
                    future.result()

    def synchronize(self) -> None:
        """Nothing to wait for: every kernel ran to its end on the calling thread."""

    def memory_in_use(self) -> int | None:
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
