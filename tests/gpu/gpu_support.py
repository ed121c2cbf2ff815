"""The CuPy backend for the GPU tests, or a module-level skip saying why there is none."""

from __future__ import annotations

import pytest

from tensorbits.backends import Backend, BackendUnavailable, select_backend


def cupy_backend_or_skip() -> Backend:
    try:
        return select_backend("cupy").backend
    except BackendUnavailable as exc:
        pytest.skip(f"CuPy backend unavailable: {exc}", allow_module_level=True)
