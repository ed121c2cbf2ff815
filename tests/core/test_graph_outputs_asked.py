"""A graph model computes the outputs a request asks for and nothing else: the plan holds only
those outputs and the nodes they read, and every output it computes is held to the element
bound (TENSORBITS_MAX_TENSOR_ELEMENTS) when planned, before anything is allocated, refused in
the operators' words (field: the output, rule ``max_tensor_elements``)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from core.graph_models import model_bytes, tensor
from onnx import TensorProto, helper

from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.graphs import PlanCache, plan_graph, read_onnx
from tensorbits.core.graphs.models import GraphModel
from tensorbits.core.graphs.program import OnnxGraph
from tensorbits.core.graphs.request import GraphRequest, plan_request, run_request
from tensorbits_protocol.errors import PayloadTooLarge
from tensorbits_protocol.infer import InferRequest, RequestLimits
from tensorbits_protocol.jsondata import JsonLimits

BACKEND = NumpyBackend(1)
ROWS = 100  # ``wide`` is ROWS * ROWS elements, ``narrow`` ROWS
BOUND = 1000  # elements: ``narrow`` within it, ``wide`` past it
LIMITS = RequestLimits(8, BOUND, BOUND, JsonLimits(64, 1 << 16))


def wide_and_narrow_model() -> bytes:
    """UINT8 ``a`` [n, 1] and ``b`` [1, n] in; ``wide`` = a XOR b, broadcast to [n, n], and
    ``narrow`` = NOT a, [n, 1], out."""
    elem = TensorProto.UINT8
    return model_bytes(
        [
            helper.make_node("BitwiseXor", ["a", "b"], ["wide"]),
            helper.make_node("BitwiseNot", ["a"], ["narrow"]),
        ],
        [tensor("a", elem, ["n", 1]), tensor("b", elem, [1, "n"])],
        [tensor("wide", elem, ["n", "n"]), tensor("narrow", elem, ["n", 1])],
    )


MODEL = GraphModel("wide_narrow", OnnxGraph(read_onnx(wide_and_narrow_model())), {})
A = (np.arange(ROWS, dtype=np.uint8) * 7).reshape(ROWS, 1)
B = (np.arange(ROWS, dtype=np.uint8) * 13).reshape(1, ROWS)


def _request(outputs: list[str] | None) -> InferRequest:
    document: dict[str, Any] = {
        "inputs": [
            {"name": "a", "datatype": "UINT8", "shape": [ROWS, 1], "data": A.ravel().tolist()},
            {"name": "b", "datatype": "UINT8", "shape": [1, ROWS], "data": B.ravel().tolist()},
        ]
    }
    if outputs is not None:
        document["outputs"] = [
            {"name": name, "parameters": {"binary_data": True}} for name in outputs
        ]
    return InferRequest.from_rest(
        json.dumps(document).encode(),
        memoryview(b""),
        model=MODEL.name,
        header_given=False,
        limits=LIMITS,
    )


def _planned(outputs: list[str] | None) -> GraphRequest:
    return plan_request(MODEL, _request(outputs), LIMITS)


def test_an_output_not_asked_for_is_not_planned_nor_computed() -> None:
    request = _planned(["narrow"])
    assert [o.name for o in request.plan.outputs] == ["narrow"]
    assert all(np.prod(o.shape) <= BOUND for o in request.plan.outputs)
    assert request.plan.needed_bytes == 2 * ROWS + ROWS  # its inputs and its one output
    arrays = run_request(request, BACKEND)
    assert set(arrays) == {"narrow"}
    assert arrays["narrow"].tobytes() == (~A).tobytes()


def test_only_the_nodes_an_output_asked_for_reads_are_planned() -> None:
    spec = read_onnx(wide_and_narrow_model())
    shapes = {"a": A.shape, "b": B.shape}
    plan = plan_graph(spec, shapes, outputs=["narrow"])
    assert [step.node.op_type for step in plan.steps] == ["BitwiseNot"]
    assert [o.name for o in plan.outputs] == ["narrow"]
    every = plan_graph(spec, shapes)
    assert [step.node.op_type for step in every.steps] == ["BitwiseXor", "BitwiseNot"]
    assert [o.name for o in every.outputs] == ["wide", "narrow"]


def test_plans_are_cached_per_outputs_asked_for() -> None:
    cache = PlanCache(read_onnx(wide_and_narrow_model()))
    shapes = {"a": A.shape, "b": B.shape}
    narrow = cache.plan(shapes, ["narrow"])
    assert cache.plan(shapes, ("narrow",)) is narrow
    assert [o.name for o in cache.plan(shapes).outputs] == ["wide", "narrow"]
    assert [o.name for o in cache.plan(shapes, ["wide"]).outputs] == ["wide"]


@pytest.mark.parametrize("outputs", [None, ["wide"], ["narrow", "wide"]])
def test_an_output_past_the_element_bound_is_refused_when_planned(
    outputs: list[str] | None,
) -> None:
    with pytest.raises(PayloadTooLarge) as refused:
        _planned(outputs)
    error = refused.value
    assert (error.field, error.rule) == ("wide", "max_tensor_elements")
    assert error.message == (
        f"output 'wide': shape [{ROWS}, {ROWS}] has {ROWS * ROWS} elements, more than the "
        f"limit of {BOUND} (TENSORBITS_MAX_TENSOR_ELEMENTS)"
    )


def test_every_output_answers_byte_for_byte_within_the_bound() -> None:
    wide_limits = RequestLimits(8, ROWS * ROWS, ROWS * ROWS, JsonLimits(64, 1 << 16))
    for outputs in (None, ["wide", "narrow"], ["narrow", "wide"], ["wide"]):
        request = plan_request(MODEL, _request(outputs), wide_limits)
        arrays = run_request(request, BACKEND)
        asked = ["wide", "narrow"] if outputs is None else outputs
        assert [a.planned.name for a in request.answered] == asked
        assert set(arrays) == set(asked)
        want = {"wide": A ^ B, "narrow": ~A}
        for name in asked:
            assert arrays[name].tobytes() == want[name].tobytes()
