"""Backend selection: ``auto`` (CuPy when a probe kernel runs, else NumPy), ``numpy`` or ``cupy``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

from tensorbits.backends.base import Backend, BackendUnavailable
from tensorbits.backends.numpy_backend import NumpyBackend

BackendChoice = Literal["auto", "numpy", "cupy"]

logger = logging.getLogger("tensorbits.backend")


@dataclass(frozen=True, slots=True)
class Selection:
    backend: Backend
    reason: str  # why this backend, in words, for the start-up log and /v2 metadata


def select_backend(
    choice: BackendChoice, *, device_id: int = 0, cpu_threads: int | None = None
) -> Selection:
    """Build the backend ``choice`` asks for. ``cupy`` fails loudly (BackendUnavailable) when
    CuPy cannot run; ``auto`` falls back to NumPy and says why."""
    if choice == "numpy":
        selection = Selection(NumpyBackend(cpu_threads), "numpy backend requested")
    else:
        from tensorbits.backends.cupy_backend import CupyBackend

        try:
            selection = Selection(CupyBackend(device_id), f"{choice}: CUDA device works")
        except BackendUnavailable as exc:
            if choice == "cupy":
                raise
            selection = Selection(NumpyBackend(cpu_threads), f"auto: fell back to numpy ({exc})")
    logger.info(
        "backend selected: %s on %s (%s)",
        selection.backend.name,
        selection.backend.device,
        selection.reason,
    )
    return selection


__all__ = ["Backend", "BackendChoice", "BackendUnavailable", "Selection", "select_backend"]
