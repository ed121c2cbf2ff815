"""The NumPy backend: always available; large element-wise work is split over a thread pool.

NumPy releases the GIL inside its ufunc loops, so chunks of one call run on all cores at once.
Each chunk writes its slice of the caller's preallocated output: no temporaries, no copies.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from tensorbits_protocol.validation import ResolvedCall

from tensorbits.kernels import Array, BitOps, as_kernel_operands, run_kernel

# Below this many output bytes one plain call beats the cost of handing chunks to threads.
PARALLEL_THRESHOLD_BYTES = 1 << 20
# Chunks per thread: a few, so a slow thread does not hold the others up at the end.
CHUNKS_PER_THREAD = 4


def _popcount(x: np.ndarray[Any, Any], out: np.ndarray[Any, Any]) -> None:
    # x is already the unsigned view: NumPy's bitwise_count counts |x| for signed types.
    np.bitwise_count(x, out=out)


def _shift(
    x: np.ndarray[Any, Any], count: np.ndarray[Any, Any], out: np.ndarray[Any, Any], left: bool
) -> None:
    # NumPy's shifts already follow our rule (0 past the width, sign fill for negative values).
    (np.left_shift if left else np.right_shift)(x, count, out=out)


NUMPY_BIT_OPS = BitOps(popcount=_popcount, shift=_shift)


def _split_points(length: int, parts: int) -> list[tuple[int, int]]:
    step = -(-length // parts)
    return [(start, min(start + step, length)) for start in range(0, length, step)]


def chunked(
    operands: Sequence[np.ndarray[Any, Any]], out: np.ndarray[Any, Any], parts: int
) -> list[tuple[list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]]:
    """Split one element-wise call into ``parts`` independent calls on views.

    Inputs are broadcast to the output's shape first (views, stride 0), so every piece sees the
    same slice of every operand. Contiguous operands are split flat; others along axis 0."""
    shaped = [np.broadcast_to(x, out.shape) for x in operands]
    if out.flags.c_contiguous and all(x.flags.c_contiguous for x in shaped):
        flat_out = out.reshape(-1)
        flat_in = [x.reshape(-1) for x in shaped]
        return [
            ([x[a:b] for x in flat_in], flat_out[a:b])
            for a, b in _split_points(flat_out.shape[0], parts)
        ]
    if out.ndim == 0 or out.shape[0] < 2:
        return [(list(shaped), out)]
    return [([x[a:b] for x in shaped], out[a:b]) for a, b in _split_points(out.shape[0], parts)]


class NumpyBackend:
    name = "numpy"
    xp: Any = np

    def __init__(self, threads: int | None = None) -> None:
        self.threads = max(1, threads or os.cpu_count() or 1)
        self.device = f"cpu ({self.threads} threads)"
        self._pool = (
            ThreadPoolExecutor(self.threads, thread_name_prefix="tensorbits-cpu")
            if self.threads > 1
            else None
        )

    def asarray(self, host: np.ndarray[Any, Any]) -> Array:
        return host

    def to_host(
        self, array: Array, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        if out is None:
            return np.asarray(array)
        np.copyto(out, array)
        return out

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Array:
        return np.empty(shape, dtype)

    def run(self, call: ResolvedCall, inputs: Sequence[Array], out: Array) -> None:
        operands, target = as_kernel_operands(call, inputs, out)
        if self._pool is None or target.nbytes < PARALLEL_THRESHOLD_BYTES:
            run_kernel(np, NUMPY_BIT_OPS, call, operands, target)
            return
        pieces = chunked(operands, target, self.threads * CHUNKS_PER_THREAD)
        futures = [
            self._pool.submit(run_kernel, np, NUMPY_BIT_OPS, call, piece_in, piece_out)
            for piece_in, piece_out in pieces
        ]
        for future in futures:
            future.result()

    def synchronize(self) -> None:
        return None

    def memory_in_use(self) -> int | None:
        return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
