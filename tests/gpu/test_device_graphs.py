"""Graph models on the CuPy backend: each fused plan runs as one generated kernel and gives the
NumPy run's bytes, on the cases the host build of the same source passes
(tests/core/test_graph_kernels.py), at a size of many blocks, and a plan that does not fuse
still runs node by node. Skipped, with the reason, where CuPy or a working CUDA device is
missing (in GPU mode, failed: gpu/devices.py)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import numpy as np
import pytest
from core.graph_models import (
    BATCH_LIMITS,
    binding_example,
    broadcast_inputs,
    broadcast_model,
    chain_model,
    random_array,
)
from core.test_graph_kernels import CASES, GraphCase, numpy_outputs
from gpu.devices import cupy_backend_or_skip, module_backend

from tensorbits.core.backends import Backend
from tensorbits.core.backends.base import run_fused
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.graphs import GraphPlan, plan_graph, read_onnx, run_graph
from tensorbits.core.graphs.binding_graph import read_binding_graph
from tensorbits_protocol.dtypes import numpy_dtype

pytestmark = pytest.mark.gpu

BACKEND = cupy_backend_or_skip()
cupy_backend = module_backend(BACKEND)


def run_on(backend: Backend, plan: GraphPlan, inputs: Any) -> dict[str, np.ndarray[Any, Any]]:
    outputs = {o.name: np.empty(o.shape, numpy_dtype(o.datatype)) for o in plan.outputs}
    run_graph(plan, backend, inputs, outputs)
    return outputs


def assert_same_bytes(got: Any, want: Any) -> None:
    assert set(got) == set(want)
    for name, array in want.items():
        assert got[name].dtype == array.dtype, name
        assert got[name].tobytes() == array.tobytes(), name


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fused_graph_runs_as_one_kernel_with_numpys_bytes(
    cupy_backend: Backend, case: GraphCase
) -> None:
    want = numpy_outputs(case)
    # The kernel itself: it must take the plan (not fall back) and write every output's value.
    values = {
        slot: cupy_backend.asarray(
            np.ascontiguousarray(
                case.inputs[v.name] if v.kind == "input" else case.plan.constants[slot]
            )
        )
        for slot, v in enumerate(case.plan.slots)
        if v.kind != "value"
    }
    assert run_fused(cupy_backend, case.plan, values), "not run as one fused kernel"
    for output in case.plan.outputs:
        got = cupy_backend.to_host(values[output.slot])
        assert got.tobytes() == want[output.name].tobytes(), output.name
    # And through run_graph, as a request runs it.
    assert_same_bytes(run_on(cupy_backend, case.plan, case.inputs), want)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.uint32, np.uint64], ids=str)
def test_chain_over_many_blocks(cupy_backend: Backend, dtype: Any) -> None:
    """Past a million elements and a tail: the grid of many blocks, each lane of a vector."""
    rng = np.random.default_rng(1)
    size = (1 << 22) + 13
    inputs = {"x": random_array(rng, dtype, (size,)), "y": random_array(rng, dtype, (size,))}
    plan = plan_graph(read_onnx(chain_model(np.dtype(dtype))), {"x": (size,), "y": (size,)})
    assert plan.fused
    case = GraphCase("large", plan, inputs)
    want = numpy_outputs(case)
    assert_same_bytes(run_on(cupy_backend, plan, inputs), want)
    # Node by node on the device (the fused flag off): the same bytes.
    unfused = dataclasses.replace(plan, fused=False)
    assert_same_bytes(run_on(cupy_backend, unfused, inputs), want)


def test_broadcasting_still_runs_node_by_node(cupy_backend: Backend) -> None:
    rng = np.random.default_rng(4)
    data, inputs = broadcast_model(), broadcast_inputs(rng)
    plan = plan_graph(read_onnx(data), {n: a.shape for n, a in inputs.items()})
    assert not plan.fused
    assert not run_fused(cupy_backend, plan, {})
    want = numpy_outputs(GraphCase("broadcast", plan, inputs))
    assert_same_bytes(run_on(cupy_backend, plan, inputs), want)


def test_a_binding_graph_on_the_device_gives_the_hosts_bytes(cupy_backend: Backend) -> None:
    """The binding example (XOR in place through a stride-0 view, then BIT_COUNT into a
    zero-filled buffer) on the device: its buffers placed there, its output copied back, the
    caller's read-only input left alone; the NumPy backend's bytes."""
    graph = read_binding_graph(json.dumps(binding_example()).encode(), BATCH_LIMITS)
    plan = graph.plan({"codes": [4, 8], "query": [8]})
    rng = np.random.default_rng(5)
    codes = rng.integers(0, 1 << 32, (4, 8), dtype=np.uint32)
    codes.flags.writeable = False
    inputs = {"codes": codes, "query": rng.integers(0, 1 << 32, (8,), dtype=np.uint32)}
    got = {"distance": np.full((4, 8), 0xAA, np.uint8)}
    graph.run(plan, cupy_backend, inputs, got)
    want = {"distance": np.empty((4, 8), np.uint8)}
    graph.run(plan, NumpyBackend(), inputs, want)
    assert got["distance"].tobytes() == want["distance"].tobytes()
    assert got["distance"].tolist() == np.bitwise_count(codes ^ inputs["query"]).tolist()
