"""/v1 batches on the CuPy backend: byte for byte what the NumPy backend computes, for a batch
of every binding kind (packed and strided views, in place, chains through a buffer, BOOL, FP16),
with the packed fast path and with every view strided, in process and over HTTP. Skipped, with
the reason, where CuPy or a working CUDA device is missing (in GPU mode, failed: gpu/devices.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gpu.devices import cupy_backend_or_skip, module_backend
from support.v1 import outputs, post, rich_batch, run_planned, v1_client

from tensorbits.core import batch
from tensorbits.core.backends import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend

pytestmark = pytest.mark.gpu

BACKEND = cupy_backend_or_skip()
cupy_backend = module_backend(BACKEND)


@pytest.mark.parametrize("seed", range(4))
def test_rich_batch_on_cupy_equals_numpy(cupy_backend: Backend, seed: int) -> None:
    header, payload = rich_batch(np.random.default_rng(seed))
    expected = run_planned(header, payload, NumpyBackend(1))
    assert run_planned(header, payload, cupy_backend) == expected


def test_strided_views_on_cupy_equal_numpy(
    cupy_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    header, payload = rich_batch(np.random.default_rng(99))
    expected = run_planned(header, payload, NumpyBackend(1))
    monkeypatch.setattr(batch._Views, "of", batch._Views.strided)
    assert run_planned(header, payload, cupy_backend) == expected


def test_rich_batch_over_http_on_cupy(cupy_backend: Backend) -> None:
    header, payload = rich_batch(np.random.default_rng(5))
    answers: list[dict[str, Any]] = []
    for backend in ("numpy", "cupy"):
        with v1_client(backend=backend) as client:
            answers.append(outputs(post(client, header, payload))[1])
    assert answers[0] == answers[1]
