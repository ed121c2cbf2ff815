"""Backend selection: ``auto`` (CuPy when a probe kernel runs, else NumPy), ``numpy`` or
``cupy``; on CuPy, where each request computes (``placement``: backends/placement.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tensorbits.core.backends.base import Backend, BackendUnavailable
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.backends.pinned_pool import DEFAULT_POOL_BYTES

if TYPE_CHECKING:
    from tensorbits.core.backends.placement import PlacementSetting

BackendChoice = Literal["auto", "numpy", "cupy"]

logger = logging.getLogger("tensorbits.backend")


@dataclass(frozen=True, slots=True)
class Selection:
    backend: Backend
    reason: str  # why this backend, in words, for the start-up log and /v2 metadata


def _cupy_hint(exc: BackendUnavailable) -> str:
    """``exc`` with what to do next: the words a user reads when ``cupy`` was asked for."""
    if isinstance(exc.__cause__, ImportError):
        fix = (
            "install the gpu extra (pip install './service[gpu]' from the repository) "
            "or run the GPU image"
        )
    else:
        fix = "check the NVIDIA driver and TENSORBITS_DEVICE_ID"
    return f"TENSORBITS_BACKEND=cupy: {exc}; {fix}, or set TENSORBITS_BACKEND=auto or numpy"


def select_backend(
    choice: BackendChoice,
    *,
    device_id: int = 0,
    cpu_threads: int | None = None,
    pinned_pool_bytes: int = DEFAULT_POOL_BYTES,
    placement: PlacementSetting = "device",
) -> Selection:
    """Build the backend ``choice`` asks for. ``cupy`` fails loudly (BackendUnavailable) when
    CuPy cannot run; ``auto`` falls back to NumPy and says why. ``pinned_pool_bytes``: CuPy's
    host staging (backends/pinned_pool.py). ``placement`` (the server's
    ``TENSORBITS_PLACEMENT``): on CuPy, ``auto`` or ``host`` places each request on the host or
    the device (``placement.PlacedBackend``, which owns a NumPy backend too), ``device`` (the
    default here) is the CuPy backend itself; NumPy has nowhere else to place work."""
    if choice == "numpy":
        selection = Selection(NumpyBackend(cpu_threads), "numpy backend requested")
    else:
        from tensorbits.core.backends.cupy_backend import CupyBackend

        try:
            selection = Selection(
                CupyBackend(device_id, pinned_pool_bytes), f"{choice}: CUDA device works"
            )
        except BackendUnavailable as exc:
            if choice == "cupy":
                raise BackendUnavailable(_cupy_hint(exc)) from exc
            selection = Selection(NumpyBackend(cpu_threads), f"auto: fell back to numpy ({exc})")
        else:
            selection = _placed(selection, placement, cpu_threads)
    logger.info(
        "backend selected: %s on %s (%s)",
        selection.backend.name,
        selection.backend.device,
        selection.reason,
    )
    return selection


def _placed(
    selection: Selection, placement: PlacementSetting, cpu_threads: int | None
) -> Selection:
    """``selection`` (CuPy's) under ``placement``: the CuPy backend itself for ``device``, else
    one that places each request (backends/placement.py)."""
    if placement == "device":
        return Selection(selection.backend, f"{selection.reason}; placement device")
    from tensorbits.core.backends.placement import PlacedBackend

    backend = PlacedBackend(NumpyBackend(cpu_threads), selection.backend, placement)
    return Selection(backend, f"{selection.reason}; placement {placement}")


__all__ = ["Backend", "BackendChoice", "BackendUnavailable", "Selection", "select_backend"]
