"""The CuPy backend for the GPU tests, or what happens without one: a skip saying why, or, in GPU
mode, a failure.

GPU mode (``TENSORBITS_GPU_REQUIRED=1``, which `make gpu-check` sets on the GPU host):
there, a missing device, CuPy backend or CUDA helper is the finding, not a reason to skip, and a
run of skips that exits 0 would read as a pass. Everywhere else the GPU tests skip cleanly."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import NoReturn

import pytest

from tensorbits.core.backends import Backend, BackendUnavailable, select_backend

GPU_REQUIRED_VARIABLE = "TENSORBITS_GPU_REQUIRED"


def gpu_required() -> bool:
    return os.environ.get(GPU_REQUIRED_VARIABLE, "") not in ("", "0")


def unavailable(reason: str) -> NoReturn:
    """Skip (the whole module, when called at import) for ``reason``; fail in GPU mode."""
    if gpu_required():
        pytest.fail(f"{GPU_REQUIRED_VARIABLE} is set: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def module_backend(backend: Backend) -> Callable[[], Iterator[Backend]]:
    """A module-scoped fixture named ``cupy_backend`` that hands out ``backend`` (made at import,
    so that a module without one skips as a whole) and closes it with the module."""

    @pytest.fixture(scope="module", name="cupy_backend")
    def fixture() -> Iterator[Backend]:
        yield backend
        backend.close()

    return fixture


def cupy_backend_or_skip() -> Backend:
    try:
        return select_backend("cupy").backend
    except BackendUnavailable as exc:
        unavailable(f"CuPy backend unavailable: {exc}")
