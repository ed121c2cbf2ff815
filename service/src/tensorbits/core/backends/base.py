"""The backend interface: where arrays live and how a validated call runs on them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from tensorbits.core.kernels import DeviceArray
from tensorbits.core.shared_memory import DeviceMemory
from tensorbits_protocol.validation import ResolvedCall

# A call's run on host arrays of fixed types and shapes, everything about it decided once (its
# kernel, its operands' views): what a backend's ``bound`` gives a plan template, whose plans
# differ only in their bytes.
BoundRun = Callable[[Sequence[np.ndarray[Any, Any]], np.ndarray[Any, Any]], None]


class Backend(Protocol):
    """A compute backend. ``run`` writes the call's result into the preallocated ``out``."""

    name: str  # "numpy" or "cupy"
    # True when the backend's arrays are host NumPy arrays: inputs need no transfer, and a kernel
    # can write straight into a host buffer such as a response body.
    host_memory: bool
    device: str  # e.g. "cpu (2 threads)" or "cuda:0 NVIDIA H100"
    xp: Any

    @property
    def device_memory(self) -> DeviceMemory | None:
        """How device memory another process exported is opened (CUDA shared memory); None on
        a backend without a device."""
        ...

    def asarray(self, host: np.ndarray[Any, Any]) -> DeviceArray:
        """The host array on this backend's device (NumPy: the same array, no copy)."""
        ...

    def to_host(
        self, array: DeviceArray, out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        """The array in host memory, written into ``out`` when given."""
        ...

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> DeviceArray: ...

    def run(self, call: ResolvedCall, inputs: Sequence[DeviceArray], out: DeviceArray) -> None: ...

    def synchronize(self) -> None:
        """Wait until every kernel this thread launched has finished (a no-op on the host):
        before memory a kernel wrote that is not the backend's own is handed back."""
        ...

    def memory_in_use(self) -> int | None:
        """Device bytes held by the backend's pool, or None where that means nothing (CPU)."""
        ...

    def close(self) -> None:
        """Release threads and device memory."""
        ...


def run_fused(
    backend: Backend,
    plan: Any,
    values: dict[int, DeviceArray],
    into: Mapping[int, DeviceArray] | None = None,
) -> bool:
    """Run a fused graph plan (``core.graphs.plan.GraphPlan``) in one pass on ``backend``, where
    it offers that: ``backend.run_fused(plan, values, into)`` takes the sources by slot (its
    device arrays) and adds a device array for each value a graph output holds: the one
    ``into`` gives for that slot where it gives one the kernel can write (a CUDA region's: the
    kernel writes the client's memory itself), else a new one. False (nothing run) where the
    backend has no such method or it cannot run this plan; the caller then runs the plan node
    by node. Optional, so that a backend without it (NumPy, whose fused runs go piece by piece
    through ``run``) need not say so."""
    method = getattr(backend, "run_fused", None)
    return method is not None and bool(method(plan, values, into or {}))


def share(backend: Backend, tasks: Sequence[Callable[[], None]]) -> None:
    """Run every task once, on the backend's threads where it offers them
    (``backend.share``, NumPy's), else one after the other on the calling thread."""
    method = getattr(backend, "share", None)
    if method is not None:
        method(tasks)
        return
    for task in tasks:
        task()


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here; the message says why."""
