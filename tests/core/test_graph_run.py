"""Graph models run: read, planned and run (fused, and node by node), byte for byte the same as
ONNX Runtime on the same file and as the nodes run one at a time through ``engine.run_into``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from core.graph_models import (
    INTEGER_DTYPES,
    ONNX_OF,
    UNSIGNED_DTYPES,
    broadcast_inputs,
    broadcast_model,
    chain_model,
    model_bytes,
    random_array,
    several_outputs_model,
    tensor,
)
from onnx import helper

from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.engine import run_into
from tensorbits.core.graphs import GraphPlan, PlanCache, plan_graph, read_onnx, run_graph
from tensorbits.core.graphs import run as graph_run
from tensorbits.core.graphs.plan import PIECE_BYTES
from tensorbits_protocol.dtypes import numpy_dtype
from tensorbits_protocol.errors import InvalidRequest

ort = pytest.importorskip("onnxruntime")

Arrays = Mapping[str, np.ndarray[Any, Any]]
BACKEND = NumpyBackend(2)


def run_plan(plan: GraphPlan, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    outputs = {o.name: np.empty(o.shape, numpy_dtype(o.datatype)) for o in plan.outputs}
    run_graph(plan, BACKEND, inputs, outputs)
    return outputs


def one_by_one(plan: GraphPlan, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    """The plan's nodes, each run on whole arrays by ``engine.run_into``: the reference."""
    values: dict[int, Any] = {
        s: inputs[v.name] for s, v in enumerate(plan.slots) if v.kind == "input"
    }
    values.update(plan.constants)
    for step in plan.steps:
        out = np.empty(step.call.output_shape, numpy_dtype(step.call.output_datatype))
        run_into(BACKEND, step.call, [values[s] for s in step.reads], out)
        values[step.writes] = out
    return {o.name: values[o.slot] for o in plan.outputs}


def onnx_runtime(data: bytes, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, dict(inputs)), strict=True))


def assert_identical(got: Arrays, expected: Arrays) -> None:
    assert set(got) == set(expected)
    for name, array in expected.items():
        array = np.asarray(array)
        assert got[name].dtype == array.dtype, name
        assert got[name].shape == array.shape, name
        assert got[name].tobytes() == array.tobytes(), name


def check_everywhere(data: bytes, inputs: Arrays, piece_bytes: int | None = None) -> GraphPlan:
    """Run ``data`` fused (when it fuses), node by node, one by one and in ONNX Runtime: all
    four byte-identical."""
    spec = read_onnx(data)
    shapes = {name: a.shape for name, a in inputs.items()}
    plan = (
        plan_graph(spec, shapes) if piece_bytes is None else plan_graph(spec, shapes, piece_bytes)
    )
    got = run_plan(plan, inputs)
    assert_identical(got, onnx_runtime(data, inputs))
    assert_identical(got, one_by_one(plan, inputs))
    assert_identical(got, run_plan(dataclasses.replace(plan, fused=False), inputs))
    return plan


BINARY = ("BitwiseAnd", "BitwiseOr", "BitwiseXor")


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=str)
@pytest.mark.parametrize("op_type", BINARY)
def test_binary_operators_on_every_integer_type(op_type: str, dtype: Any) -> None:
    rng = np.random.default_rng(1)
    elem = ONNX_OF[np.dtype(dtype)]
    data = model_bytes(
        [helper.make_node(op_type, ["a", "b"], ["c"])],
        [tensor("a", elem, [5, 7]), tensor("b", elem, [5, 7])],
        [tensor("c", elem, [5, 7])],
    )
    plan = check_everywhere(
        data, {"a": random_array(rng, dtype, (5, 7)), "b": random_array(rng, dtype, (5, 7))}
    )
    assert plan.fused


@pytest.mark.parametrize("dtype", INTEGER_DTYPES, ids=str)
def test_not_on_every_integer_type(dtype: Any) -> None:
    elem = ONNX_OF[np.dtype(dtype)]
    data = model_bytes(
        [helper.make_node("BitwiseNot", ["x"], ["y"])],
        [tensor("x", elem, [9])],
        [tensor("y", elem, [9])],
    )
    check_everywhere(data, {"x": random_array(np.random.default_rng(2), dtype, (9,))})


@pytest.mark.parametrize("dtype", UNSIGNED_DTYPES, ids=str)
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_on_every_unsigned_type(direction: str, dtype: Any) -> None:
    # Counts below the width only: past it the family gives 0 and ONNX leaves it to C++.
    rng = np.random.default_rng(3)
    elem = ONNX_OF[np.dtype(dtype)]
    width = np.dtype(dtype).itemsize * 8
    data = model_bytes(
        [helper.make_node("BitShift", ["x", "n"], ["y"], direction=direction)],
        [tensor("x", elem, [4, 6]), tensor("n", elem, [4, 6])],
        [tensor("y", elem, [4, 6])],
    )
    inputs = {
        "x": random_array(rng, dtype, (4, 6)),
        "n": rng.integers(0, width, (4, 6)).astype(dtype),
    }
    check_everywhere(data, inputs)


def test_broadcasting_runs_node_by_node() -> None:
    rng = np.random.default_rng(4)
    data, inputs = broadcast_model(), broadcast_inputs(rng)
    plan = check_everywhere(data, inputs)
    assert not plan.fused
    assert plan.work_bytes == 3 * 4 * 5 * 2  # c, alive while e is made


def test_outputs_initializer_constant_and_identity() -> None:
    """Several outputs: one a node's written in place, one an Identity of it (copied), one an
    intermediate also read further on; an initializer and a Constant node as operands."""
    rng = np.random.default_rng(5)
    mask = random_array(rng, np.uint32, (6,))
    value = random_array(rng, np.uint32, (6,))
    data = several_outputs_model(mask, value)
    plan = check_everywhere(data, {"x": random_array(rng, np.uint32, (6,))})
    assert plan.fused
    assert [o.written_in_place for o in plan.outputs] == [True, False, True, True, False]


@pytest.mark.parametrize("dtype", [np.uint8, np.uint64], ids=str)
@pytest.mark.parametrize("size", [0, 1, 255, 256, 257, 3 * 256 + 7, 100_003])
def test_chain_over_sizes_not_multiples_of_the_piece(size: int, dtype: Any) -> None:
    rng = np.random.default_rng(size)
    inputs = {"x": random_array(rng, dtype, (size,)), "y": random_array(rng, dtype, (size,))}
    piece_bytes = 256 * np.dtype(dtype).itemsize  # pieces of 256 elements
    plan = check_everywhere(chain_model(np.dtype(dtype)), inputs, piece_bytes)
    assert plan.fused
    assert plan.piece_elements == 256
    # a and b: both alive while the shift reads one and writes the other; z is the output's
    assert plan.scratch_buffers == 2
    assert plan.work_bytes == 2 * piece_bytes


def test_chain_at_the_default_piece_size() -> None:
    rng = np.random.default_rng(6)
    size = (1 << 20) + 13
    inputs = {
        "x": random_array(rng, np.uint16, (size,)),
        "y": random_array(rng, np.uint16, (size,)),
    }
    plan = check_everywhere(chain_model(np.dtype(np.uint16)), inputs)
    assert plan.fused
    assert plan.piece_elements == PIECE_BYTES // 2  # several pieces, the last a partial one
    assert size % plan.piece_elements


def test_symbolic_dimensions_are_resolved_per_request_and_cached() -> None:
    spec = read_onnx(chain_model(np.dtype(np.uint8), dims=("n", None)))
    cache = PlanCache(spec, max_plans=2)
    first = cache.plan({"x": (2, 3), "y": (2, 3)})
    assert cache.plan({"x": (2, 3), "y": (2, 3)}) is first
    assert cache.plan({"x": (4, 3), "y": (4, 3)}).slots[0].shape == (4, 3)
    with pytest.raises(InvalidRequest) as refused:
        cache.plan({"x": (2, 3), "y": (3, 3)})  # n is 2, then 3
    assert refused.value.rule == "shape"
    assert refused.value.field == "y"
    with pytest.raises(InvalidRequest) as refused:
        cache.plan({"x": (2, 3), "y": (2, 4)})  # the unknown dims differ: XOR refuses
    assert refused.value.rule == "broadcast"
    assert refused.value.field == "nodes[0]"
    with pytest.raises(InvalidRequest) as refused:
        cache.plan({"x": (2, 3)})
    assert refused.value.rule == "missing_input"


def test_run_graph_checks_the_arrays_it_is_given() -> None:
    spec = read_onnx(chain_model(np.dtype(np.uint8), dims=[4]))
    plan = plan_graph(spec, {"x": (4,), "y": (4,)})
    x = np.zeros(4, np.uint8)
    with pytest.raises(InvalidRequest) as refused:
        run_graph(plan, BACKEND, {"x": x, "y": x}, {"z": np.empty(4, np.uint16)})
    assert (refused.value.field, refused.value.rule) == ("z", "datatype")
    with pytest.raises(InvalidRequest) as refused:
        run_graph(plan, BACKEND, {"x": x, "y": np.zeros(5, np.uint8)}, {"z": np.empty(4, np.uint8)})
    assert (refused.value.field, refused.value.rule) == ("y", "shape")
    with pytest.raises(InvalidRequest) as refused:
        run_graph(plan, BACKEND, {"x": x}, {"z": np.empty(4, np.uint8)})
    assert refused.value.rule == "missing_input"


def test_a_strided_output_runs_node_by_node_with_the_same_bytes() -> None:
    rng = np.random.default_rng(7)
    spec = read_onnx(chain_model(np.dtype(np.uint32), dims=[50]))
    inputs = {"x": random_array(rng, np.uint32, (50,)), "y": random_array(rng, np.uint32, (50,))}
    plan = plan_graph(spec, {"x": (50,), "y": (50,)})
    strided = np.zeros(100, np.uint32)[::2]
    run_graph(plan, BACKEND, inputs, {"z": strided})
    assert strided.tobytes() == run_plan(plan, inputs)["z"].tobytes()


@pytest.mark.parametrize("threads", [2, 3])
def test_a_large_chain_is_shared_among_the_backends_threads(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """Past SHARED_MIN_BYTES a fused run goes in ranges of whole pieces, one a thread (here with
    the bound at 0, so that a small chain shows it): the same bytes as ONNX Runtime's, the ranges
    covering every element once, a piece cut short only at the very end."""
    monkeypatch.setattr(graph_run, "SHARED_MIN_BYTES", 0)
    backend = NumpyBackend(threads)
    shared: list[int] = []
    real = backend.share

    def counted(tasks: Sequence[Callable[[], None]]) -> None:
        shared.append(len(tasks))
        real(tasks)

    monkeypatch.setattr(backend, "share", counted)
    rng = np.random.default_rng(9)
    size = 100_003
    inputs = {
        "x": random_array(rng, np.uint32, (size,)),
        "y": random_array(rng, np.uint32, (size,)),
    }
    data = chain_model(np.dtype(np.uint32))
    plan = plan_graph(read_onnx(data), {"x": (size,), "y": (size,)}, piece_bytes=256 * 4)
    assert plan.fused
    outputs = {o.name: np.empty(o.shape, numpy_dtype(o.datatype)) for o in plan.outputs}
    try:
        run_graph(plan, backend, inputs, outputs)
    finally:
        backend.close()
    assert shared == [threads]
    assert_identical(outputs, onnx_runtime(data, inputs))
