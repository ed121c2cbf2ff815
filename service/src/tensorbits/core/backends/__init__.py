"""Backend selection: ``auto`` (CuPy when a probe kernel runs, else NumPy), ``numpy`` or ``cupy``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from tensorbits.core.backends.base import Backend, BackendUnavailable
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.backends.pinned_pool import DEFAULT_POOL_BYTES

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
) -> Selection:
    """Build the backend ``choice`` asks for. ``cupy`` fails loudly (BackendUnavailable) when
    CuPy cannot run; ``auto`` falls back to NumPy and says why. ``pinned_pool_bytes``: CuPy's
    host staging (backends/pinned_pool.py)."""
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
    logger.info(
        "backend selected: %s on %s (%s)",
        selection.backend.name,
        selection.backend.device,
        selection.reason,
    )
    return selection


__all__ = ["Backend", "BackendChoice", "BackendUnavailable", "Selection", "select_backend"]
