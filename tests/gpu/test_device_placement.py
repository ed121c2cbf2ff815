"""Placement on a real device (backends/placement.py): the rule's numbers measured where they
apply, and the placed backend's choices on CuPy. Printed figures go to bench/results/gpu.md.

- One memory-bound operator on host-borne data, 64 MiB: the NumPy backend against the CuPy
  backend (copies in and out): the host must win, as ``OPERATOR_DEVICE_MIN_BYTES`` (None)
  says; if it does not on some device, the constant is what to revisit.
- A graph of three steps on host-borne data, 64 MiB a tensor: the device (two copies in, two
  out, one fused kernel) against the host's fused run, which ``DEVICE_MIN_STEPS`` bets on.
- ``auto`` places the operator on the host and the graph on the device, and ``host`` places a
  graph on CUDA regions on the device with no copy to or from the host.
Skipped without CuPy and a device (in GPU mode, failed: gpu/devices.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from gpu.devices import cupy_backend_or_skip, module_backend
from gpu.test_device_graph_regions import (
    LARGE,
    LIMITS,
    Counted,
    Placed,
    body_request,
    counted,
    pair_inputs,
    pair_model,
    read_back,
    region,
    region_request,
)
from support.host_calls import validate_arrays

from tensorbits.core.backends import Backend
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.backends.placement import Place, PlacedBackend, WorkKind
from tensorbits.core.engine import run_into
from tensorbits.core.graphs.request import plan_request, run_request

pytestmark = pytest.mark.gpu

BACKEND = cupy_backend_or_skip()
cupy_backend = module_backend(BACKEND)
Arr = np.ndarray[Any, Any]
XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"
__all__ = ["counted", "region"]  # fixtures of the graph-region tests, used here too


def best_of(runs: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        BACKEND.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def test_one_operator_on_host_data_is_faster_on_the_host(cupy_backend: Backend) -> None:
    rng = np.random.default_rng(2)
    a, b = (rng.integers(0, 1 << 32, LARGE, dtype=np.uint32) for _ in range(2))
    call = validate_arrays(XOR, {"ATensor": a, "BTensor": b}, None)
    host, out = NumpyBackend(), np.empty_like(a)
    run_into(cupy_backend, call, [a, b], out)  # compiled before the clock starts
    device_s = best_of(7, lambda: run_into(cupy_backend, call, [a, b], out))
    host_s = best_of(7, lambda: run_into(host, call, [a, b], out))
    assert out.tobytes() == (a ^ b).tobytes()
    print(
        f"XOR, 64 MiB a tensor, host-borne: host {host_s * 1e3:.2f} ms, device {device_s * 1e3:.2f} ms"
    )
    assert host_s <= device_s, "OPERATOR_DEVICE_MIN_BYTES (None: never) is not borne out here"
    placed = PlacedBackend(host, cupy_backend, "auto")
    run_into(placed, call, [a, b], out)
    assert dict(placed.placements) == {(WorkKind.OPERATOR, Place.HOST): 1}


def test_a_graph_on_host_data_under_auto_runs_on_the_device(cupy_backend: Backend) -> None:
    model, inputs = pair_model(), pair_inputs(LARGE)
    host = NumpyBackend()
    placed = PlacedBackend(host, cupy_backend, "auto")
    planned = plan_request(model, body_request(inputs), LIMITS)
    want = run_request(planned, host)
    got = run_request(planned, placed)
    for name, array in want.items():
        assert got[name].tobytes() == array.tobytes(), name
    assert dict(placed.placements) == {(WorkKind.GRAPH, Place.DEVICE): 1}
    device_s = best_of(7, lambda: run_request(planned, placed))
    host_s = best_of(7, lambda: run_request(planned, host))
    print(
        f"pair graph, 64 MiB a tensor, host-borne: host {host_s * 1e3:.2f} ms, "
        f"device {device_s * 1e3:.2f} ms"
    )
    assert device_s <= host_s, "DEVICE_MIN_STEPS (graphs on the device) is not borne out here"


def test_host_placement_keeps_a_graph_on_regions_on_the_device(
    cupy_backend: Backend, counted: Counted, region: Callable[[int], Placed]
) -> None:
    model, inputs = pair_model(), pair_inputs(1 << 20)
    host = NumpyBackend()
    want = run_request(plan_request(model, body_request(inputs), LIMITS), host)
    placed_region = region(4 * (1 << 20) * 4 + 1024)
    request, refs = region_request(placed_region, inputs, want)
    placed = PlacedBackend(host, cupy_backend, "host")
    run_request(plan_request(model, request, LIMITS, placed_region.regions), placed)
    assert (counted.to_device, counted.to_host) == ([], [])
    assert dict(placed.placements) == {(WorkKind.GRAPH, Place.DEVICE): 1}
    for name, ref in refs.items():
        assert read_back(placed_region, want[name], ref).tobytes() == want[name].tobytes()
