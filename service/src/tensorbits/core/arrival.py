"""An element-wise plan computed as its request's bytes arrive.

A large request's body is read into the one buffer admitted for it, its JSON header first. A
front end that plans the request from that header while the tensors' bytes are still arriving
(HTTP: ``api/v2_infer.py``) hands each new fill of the buffer to an ``Arrival``: once every
input's bytes for the next piece of the output are in, that piece is computed on a worker thread
while the rest keeps arriving, so that when the last byte arrives only the last piece is left.

Two kinds qualify, each output element depending on the input elements at its own position
only, or on a broadcast input's (one of fewer elements than the output, repeated along some of
its axes): an operator whose answer is written over its one input of the output's type and shape
in the body (the front end's rule, ``api/rest_infer.written_over``: element-wise, on a backend
whose kernels give the same bytes over an input; ``Arrival.of_call``), and a graph model's fused
chain on the host, written into the response's buffer (``core/graphs/request.arriving``; an
input of one element is read whole by every piece). An input of the output's size is read a
piece at a time, as its bytes arrive; a broadcast input is awaited whole before the first piece
(it is small beside the output, and every piece may read any of it). Pieces are ranges of whole
rows of the output (``engine.rows``: flat elements when every broadcast input is one element),
the same kernels on views of each operand, so every piece sees exactly the elements it would see
whole and the answer is byte for byte the one computed whole. Inputs not in the body (decoded
from JSON, a graph's constants) are all there from the start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.engine import in_rows, piece_call, rows, run_into
from tensorbits.core.offload import COMPUTE_INLINE_MAX_BYTES, offload
from tensorbits.core.plan import Plan

# A piece is computed once at least this many bytes of output are ready for it: large enough
# that a worker thread's hop (tens of microseconds) is a small part of it, small enough that the
# piece left when the last byte arrives costs a fraction of a millisecond.
PIECE_BYTES = 4 << 20
# The body's bytes between two looks at what arrived (``arrived``): a fraction of a piece, so a
# piece starts soon after its last byte (a wake of the app costs microseconds).
LOOK_BYTES = 1 << 20


def _address(x: np.ndarray[Any, Any]) -> int:
    address: int = x.__array_interface__["data"][0]
    return address


class Arrival:
    """An answer computed a range of elements at a time (``run(begin, end)``) as the ``body``
    its ``inputs`` lie in arrives: ``arrived(filled)`` after each new fill of the body, then
    ``finish()`` once it is all in (the elements not computed yet). ``of_call``: an operator's
    output written over its input at ``over``, in ranges of whole rows of ``row`` elements; a
    fused graph's runner (``core/graphs/run.fused_runner``) is one too."""

    __slots__ = ("_at", "_piece", "_row", "_run", "done", "over", "total")

    def __init__(
        self,
        body: memoryview,
        inputs: Sequence[np.ndarray[Any, Any]],
        total: int,
        run: Callable[[int, int], None],
        itemsize: int,
        over: int = 0,
        row: int = 1,
    ) -> None:
        self.over = over  # an operator's: the input its output is written over
        self.total = total  # the output's elements
        self.done = 0  # the output's elements computed so far, from the first
        self._run = run
        self._piece = max(1, PIECE_BYTES // itemsize)  # elements of a piece, of the widest
        self._row = max(1, row)  # a piece's elements are a multiple of it (``rows``)
        start = _address(np.frombuffer(body, np.uint8)) if len(body) else 0
        # Where each input in the body begins in it, its element's size, and whether it has
        # an element per output element (else it is read whole by every piece: one element
        # repeated); an input elsewhere (decoded from JSON) is all there already.
        self._at = [
            (_address(x) - start, x.dtype.itemsize, x.nbytes, x.size == total)
            for x in inputs
            if x.size and start <= _address(x) < start + len(body)
        ]

    @classmethod
    def of_call(cls, plan: Plan, backend: Backend, body: memoryview, over: int) -> Arrival:
        """``plan``'s output written over its input at ``over`` (of the output's size), a range
        of whole rows at a time (``rows``). Each operand is a view in rows, never a copy: an
        input of the output's size reshaped, a broadcast one broadcast to the output's shape
        (stride 0 where it repeats), so a piece reads the bytes the rule awaited and no other
        (``engine.in_rows``)."""
        call = plan.call
        split = rows(call)
        total = math.prod(call.output_shape)
        operands = [
            in_rows(x, kernel_shape, call.output_shape, split)
            for x, kernel_shape in zip(plan.inputs, call.kernel_input_shapes, strict=True)
        ]
        row = math.prod(split[1:])

        def run(begin: int, end: int) -> None:
            first, last = begin // row, end // row
            on = piece_call(call, (last - first, *split[1:]))
            run_into(backend, on, [x[first:last] for x in operands], operands[over][first:last])

        itemsize = plan.inputs[over].dtype.itemsize
        return cls(body, plan.inputs, total, run, itemsize, over, row)

    def ready(self, filled: int) -> int:
        """How many of the output's elements, whole rows, have every input's bytes they read
        among the first ``filled`` bytes of the body."""
        count = self.total
        for at, size, nbytes, each in self._at:
            if each:
                count = min(count, max(0, (filled - at) // size))
            elif filled < at + nbytes:
                return 0
        return count - count % self._row

    async def arrived(self, filled: int) -> None:
        """The body's first ``filled`` bytes are in: the elements they complete computed, on a
        worker thread, when they make at least a piece (the caller reads on meanwhile)."""
        ready = self.ready(filled)
        if ready - self.done >= self._piece:
            await offload(PIECE_BYTES, COMPUTE_INLINE_MAX_BYTES, self._to, ready)

    def finish(self) -> None:
        """The elements not computed yet, computed (the body is all in)."""
        self._to(self.total)

    def _to(self, end: int) -> None:
        if end > self.done:
            self._run(self.done, end)
            self.done = end


__all__ = ["LOOK_BYTES", "PIECE_BYTES", "Arrival", "rows"]
