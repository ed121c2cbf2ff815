"""An element-wise plan computed as its request's bytes arrive.

A large request's body is read into the one buffer admitted for it, its JSON header first. A
front end that plans the request from that header while the tensors' bytes are still arriving
(HTTP: ``api/v2_infer.py``) hands each new fill of the buffer to an ``Arrival``: once every
input's bytes for the next piece of the output are in, that piece is computed on a worker thread
while the rest keeps arriving, so that when the last byte arrives only the last piece is left.

Only a plan whose answer is written over one of its inputs in the body qualifies (the front
end's rule, ``api/rest_infer.written_over``: an element-wise call without broadcasting, each
output element depending on the input elements at its own position only, on a backend whose
kernels give the same bytes over an input). Its pieces are flat ranges of elements
(``engine.flat_call``), the same kernel on each, so the answer is byte for byte the one computed
whole. Inputs not in the body (decoded from JSON) are all there from the start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorbits.core.backends.base import Backend
from tensorbits.core.engine import flat_call, run_into
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
    """``plan``'s output written over its input at ``over`` in pieces, as the ``body`` its
    binary inputs view arrives: ``arrived(filled)`` after each new fill of the body, then
    ``finish()`` once it is all in (the pieces not computed yet)."""

    __slots__ = ("_at", "_backend", "_call", "_flat", "_piece", "done", "over", "total")

    def __init__(self, plan: Plan, backend: Backend, body: memoryview, over: int) -> None:
        self.over = over
        self._backend = backend
        self._call = plan.call
        inputs: Sequence[np.ndarray[Any, Any]] = plan.inputs
        self._flat = [x.reshape(-1) for x in inputs]
        self.total = math.prod(plan.call.output_shape)
        self.done = 0  # the output's elements computed so far, from the first
        start = _address(np.frombuffer(body, np.uint8)) if len(body) else 0
        # Where each input in the body begins in it, and its element's size; an input elsewhere
        # (decoded from JSON) is all there already.
        self._at = [
            (_address(x) - start, x.dtype.itemsize)
            for x in inputs
            if x.size and start <= _address(x) < start + len(body)
        ]
        itemsize = inputs[over].dtype.itemsize
        self._piece = max(1, PIECE_BYTES // itemsize)

    def ready(self, filled: int) -> int:
        """How many of the output's elements have every input's bytes among the first
        ``filled`` bytes of the body."""
        count = self.total
        for at, size in self._at:
            count = min(count, max(0, (filled - at) // size))
        return count

    async def arrived(self, filled: int) -> None:
        """The body's first ``filled`` bytes are in: the elements they complete computed, on a
        worker thread, when they make at least a piece (the caller reads on meanwhile)."""
        ready = self.ready(filled)
        if ready - self.done >= self._piece:
            await offload(PIECE_BYTES, COMPUTE_INLINE_MAX_BYTES, self._run, ready)

    def finish(self) -> None:
        """The elements not computed yet, computed (the body is all in)."""
        self._run(self.total)

    def _run(self, end: int) -> None:
        begin = self.done
        if end <= begin:
            return
        flat = self._flat
        run_into(
            self._backend,
            flat_call(self._call, end - begin),
            [x[begin:end] for x in flat],
            flat[self.over][begin:end],
        )
        self.done = end


__all__ = ["LOOK_BYTES", "PIECE_BYTES", "Arrival"]
