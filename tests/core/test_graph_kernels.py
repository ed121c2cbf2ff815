"""The CuPy backend's fused graph kernels, checked without a GPU.

The CUDA C++ a fused plan runs as (``cupy_graphs.fused_kernel``) is compiled for the host with
the shim of tests/core/test_wide_kernels.py and run over a simulated grid, against the NumPy
run of the same plan (``run_graph``), byte for byte: every operator on every type it takes, the
XOR->shift->NOT chain over sizes that are multiples of nothing, several outputs (one also read
further on), a scalar operand first or second, BOOL's logical rules, signed shifts past the
width, and DirectML's bit views and population counts into another type. The device run of the
same cases is tests/gpu/test_device_graphs.py. Skipped where no C++ compiler is found.
"""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import pytest
from core.graph_models import (
    INTEGER_DTYPES,
    ONNX_OF,
    UNSIGNED_DTYPES,
    chain_model,
    constant,
    model_bytes,
    random_array,
    several_outputs_model,
    tensor,
)
from onnx import TensorProto, helper
from support.wide_kernel_cases import HOST_SHIM, aligned, compile_host_library, host_runner

from tensorbits.core.backends.cupy_backend import POPCOUNT_BODY, SHIFT_BODY
from tensorbits.core.backends.cupy_graphs import FusedKernel, fused_kernel, graph_kernel_source
from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.graphs import GraphPlan, plan_graph, read_onnx, run_graph
from tensorbits.core.graphs.spec import GraphNode, GraphSpec, ValueDecl
from tensorbits_protocol.dtypes import DataType, from_numpy, numpy_dtype
from tensorbits_protocol.operators import get_operator

Array = np.ndarray[Any, Any]
BACKEND = NumpyBackend(1)
RUNNER = host_runner("void* const* p, unsigned long long n", "SPACE::NAME(ARGUMENTS, n)")
# A small grid, so that the grid-stride loop goes round more than once; 32 threads cover any
# tail (at most 15 elements), as the device's 256 a block do.
BLOCKS, THREADS = 2, 16
# The test models' types as dtypes (graph_models keys its table by them).
INTEGERS: tuple[np.dtype[Any], ...] = tuple(np.dtype(str(t)) for t in INTEGER_DTYPES)
UNSIGNED: tuple[np.dtype[Any], ...] = tuple(np.dtype(str(t)) for t in UNSIGNED_DTYPES)
SIZES = (1, 3, 15, 16, 17, 37, 255, 257, 3 * 256 + 7, 100_003)


class GraphCase(NamedTuple):
    name: str
    plan: GraphPlan
    inputs: Mapping[str, Array]


def shift_counts(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]) -> Array:
    """Counts inside the width, at it, past it, and negative where the type is signed: the
    family's rule gives 0 (or -1) past the width, which the kernels must enforce."""
    dtype = np.dtype(dtype)
    width = 8 * dtype.itemsize
    low = -width - 2 if dtype.kind == "i" else 0
    high = min(2 * width + 2, int(np.iinfo(dtype).max))
    return rng.integers(low, high + 1, shape).astype(dtype)


def _onnx_case(name: str, data: bytes, inputs: Mapping[str, Array]) -> GraphCase:
    plan = plan_graph(read_onnx(data), {n: a.shape for n, a in inputs.items()})
    return GraphCase(name, plan, inputs)


def _node(
    index: int, operator: str, inputs: tuple[str, ...], output: str, **parameters: str
) -> GraphNode:
    return GraphNode(
        index, f"n{index}", operator, get_operator(operator), parameters, inputs, output
    )


def _spec_case(
    name: str,
    nodes: list[GraphNode],
    inputs: Mapping[str, Array],
    outputs: Mapping[str, tuple[str, DataType]],  # output: (the value it holds, its type)
    constants: Mapping[str, Array] | None = None,
) -> GraphCase:
    """A graph of any of the family's operators (OpenVINO's BOOL, DirectML's bit views), which
    an ONNX file cannot name: the spec the reader would make, built directly."""
    spec = GraphSpec(
        opset=18,
        inputs=tuple(ValueDecl(n, from_numpy(a.dtype), tuple(a.shape)) for n, a in inputs.items()),
        outputs=tuple(ValueDecl(n, datatype, None) for n, (_, datatype) in outputs.items()),
        output_sources=tuple(source for source, _ in outputs.values()),
        nodes=tuple(nodes),
        constants=dict(constants or {}),
        depth=len(nodes),
    )
    plan = plan_graph(spec, {n: a.shape for n, a in inputs.items()})
    return GraphCase(name, plan, inputs)


def graph_cases() -> Iterator[GraphCase]:
    """Every fused chain of tests/core/test_graph_run.py's kinds, and those only a spec names."""
    rng = np.random.default_rng(11)
    for dtype in INTEGERS:
        elem = ONNX_OF[dtype]
        for op_type in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
            data = model_bytes(
                [helper.make_node(op_type, ["a", "b"], ["c"])],
                [tensor("a", elem, [5, 7]), tensor("b", elem, [5, 7])],
                [tensor("c", elem, [5, 7])],
            )
            inputs = {"a": random_array(rng, dtype, (5, 7)), "b": random_array(rng, dtype, (5, 7))}
            yield _onnx_case(f"{op_type}-{dtype}", data, inputs)
        data = model_bytes(
            [helper.make_node("BitwiseNot", ["x"], ["y"])],
            [tensor("x", elem, [9])],
            [tensor("y", elem, [9])],
        )
        yield _onnx_case(f"BitwiseNot-{dtype}", data, {"x": random_array(rng, dtype, (9,))})
    for dtype in UNSIGNED:
        elem = ONNX_OF[dtype]
        for direction in ("LEFT", "RIGHT"):
            data = model_bytes(
                [helper.make_node("BitShift", ["x", "n"], ["y"], direction=direction)],
                [tensor("x", elem, [4, 6]), tensor("n", elem, [4, 6])],
                [tensor("y", elem, [4, 6])],
            )
            inputs = {"x": random_array(rng, dtype, (4, 6)), "n": shift_counts(rng, dtype, (4, 6))}
            yield _onnx_case(f"BitShift-{direction}-{dtype}", data, inputs)
            # The one-element operand first: a constant shifted by counts per position.
            data = model_bytes(
                [helper.make_node("BitShift", ["k", "n"], ["y"], direction=direction)],
                [tensor("n", elem, [29])],
                [tensor("y", elem, [29])],
                [constant("k", random_array(rng, dtype, (1,)))],
            )
            inputs = {"n": shift_counts(rng, dtype, (29,))}
            yield _onnx_case(f"BitShift-{direction}-{dtype}-scalar-first", data, inputs)
        for size in SIZES:
            inputs = {
                "x": random_array(rng, dtype, (size,)),
                "y": random_array(rng, dtype, (size,)),
            }
            yield _onnx_case(f"chain-{dtype}-{size}", chain_model(dtype), inputs)
    yield _several_outputs(rng)
    yield from _spec_cases(rng)


def _several_outputs(rng: np.random.Generator) -> GraphCase:
    """test_graph_run's model of several outputs: one a node's, one an Identity of it, one an
    intermediate also read further on, one an Identity of the input; an initializer and a
    Constant node as operands."""
    data = several_outputs_model(
        mask=random_array(rng, np.uint32, (6,)), value=random_array(rng, np.uint32, (6,))
    )
    return _onnx_case("several-outputs", data, {"x": random_array(rng, np.uint32, (6,))})


def _spec_cases(rng: np.random.Generator) -> Iterator[GraphCase]:
    for size in (1, 17, 1001):
        flags = {name: random_array(rng, np.bool_, (size,)) for name in ("p", "q", "r")}
        yield _spec_case(
            f"bool-logic-{size}",
            [
                _node(0, "openvino.BitwiseAnd-13", ("p", "q"), "a"),
                _node(1, "openvino.BitwiseXor-13", ("a", "r"), "b"),
                _node(2, "openvino.BitwiseOr-13", ("b", "p"), "c"),
                _node(3, "openvino.BitwiseNot-13", ("c",), "d"),
            ],
            flags,
            {"and": ("a", DataType.BOOL), "not": ("d", DataType.BOOL)},
        )
    for dtype in INTEGERS:
        x = random_array(rng, dtype, (3, 41))
        yield _spec_case(
            f"openvino-shifts-{dtype}",
            [
                _node(0, "openvino.BitwiseRightShift-15", ("x", "n"), "a"),
                _node(1, "openvino.BitwiseLeftShift-15", ("a", "k"), "b"),
                _node(2, "openvino.BitwiseAnd-13", ("b", "x"), "c"),
            ],
            {"x": x, "n": shift_counts(rng, dtype, (3, 41))},
            {"c": ("c", from_numpy(x.dtype))},
            {"k": shift_counts(rng, dtype, (1,))},
        )
    for name, count in (("f4", "UINT8"), ("f2", "UINT32"), ("i8", "UINT8"), ("u2", "UINT32")):
        dtype = np.dtype(name)
        a = random_array(rng, dtype, (131,))
        yield _spec_case(
            f"dml-count-{dtype}-{count}",
            [
                _node(0, "DML_OPERATOR_ELEMENT_WISE_BIT_XOR", ("a", "b"), "x"),
                _node(1, "DML_OPERATOR_ELEMENT_WISE_BIT_NOT", ("x",), "y"),
                _node(2, "DML_OPERATOR_ELEMENT_WISE_BIT_COUNT", ("y",), "z", output_datatype=count),
            ],
            {"a": a, "b": random_array(rng, dtype, (131,))},
            {"bits": ("y", from_numpy(a.dtype)), "count": ("z", DataType[count])},
        )


CASES = list(graph_cases())


def numpy_outputs(case: GraphCase) -> dict[str, Array]:
    """The plan run on the NumPy backend (``run_graph``, fused piece by piece): the reference."""
    outputs = {o.name: np.empty(o.shape, numpy_dtype(o.datatype)) for o in case.plan.outputs}
    run_graph(case.plan, BACKEND, case.inputs, outputs)
    return outputs


def kernel_of(plan: GraphPlan) -> FusedKernel:
    kernel = fused_kernel(plan, SHIFT_BODY, POPCOUNT_BODY)
    assert kernel is not None
    return kernel


Runner = Callable[[FusedKernel, list[Array], int], None]


@pytest.fixture(scope="module")
def run_on_host(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler (g++ or clang++) to build the kernels for the host")
    parts = [HOST_SHIM]
    built: set[str] = set()
    for case in CASES:
        kernel = kernel_of(case.plan)
        if kernel.name in built:
            continue
        built.add(kernel.name)
        space = f"space_{len(built)}"
        # Each kernel defines LANES, its vectors, steps and chain: a namespace of its own.
        parts.append(f"namespace {space} {{\n{kernel.source}\n}}\n#undef LANES")
        arguments = ", ".join(f"p[{i}]" for i in range(kernel.parameters))
        parts.append(
            RUNNER.replace("SPACE", space)
            .replace("NAME", kernel.name)
            .replace("ARGUMENTS", arguments)
        )
    host = compile_host_library(compiler, tmp_path_factory.mktemp("graphs"), "graphs", parts)

    def run(kernel: FusedKernel, arrays: list[Array], elements: int) -> None:
        function = getattr(host, f"run_{kernel.name}")
        function.restype = None
        pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
        function(
            pointers,
            ctypes.c_ulonglong(elements),
            ctypes.c_uint(BLOCKS),
            ctypes.c_uint(THREADS),
        )

    return run


def _aligned_copy(array: Array) -> Array:
    """``array``'s elements, flat, starting on a 16-byte boundary (as device allocations do)."""
    out = aligned(array.size, array.dtype)
    out[...] = array.reshape(-1)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fused_kernel_matches_numpy(run_on_host: Runner, case: GraphCase) -> None:
    plan = case.plan
    assert plan.fused
    kernel = kernel_of(plan)
    slots = plan.slots
    arrays = []
    for slot in kernel.sources:
        value = slots[slot]
        source = case.inputs[value.name] if value.kind == "input" else plan.constants[slot]
        arrays.append(_aligned_copy(np.ascontiguousarray(source)))
    written = {}
    for slot in kernel.outputs:
        out = aligned(plan.elements, numpy_dtype(slots[slot].datatype))
        out.view(np.uint8)[...] = 0xA5  # not a result any case expects everywhere
        written[slot] = out
    run_on_host(kernel, [*arrays, *written.values()], plan.elements)
    want = numpy_outputs(case)
    for output in plan.outputs:
        if output.slot in written:  # else a graph input or constant, copied by run_graph
            assert written[output.slot].tobytes() == want[output.name].tobytes(), output.name


def test_every_output_value_is_written_once_and_every_source_read() -> None:
    """The several-outputs model: ``a`` (also read by the XOR), ``b`` (and its Identity) and
    ``not_b`` come out of the kernel; ``x_again`` is the input, copied by run_graph."""
    case = next(c for c in CASES if c.name == "several-outputs")
    kernel = kernel_of(case.plan)
    names = {case.plan.slots[s].name for s in kernel.outputs}
    assert names == {"a", "b", "not_b"}
    assert {case.plan.slots[s].name for s in kernel.sources} == {"x", "mask", "c"}
    assert not kernel.scalars


def test_the_source_is_the_single_call_kernels_own_text() -> None:
    """Each step's body is the wide kernels' (the shift rule and population count verbatim),
    and a one-element operand is read once, outside the loop."""
    case = next(c for c in CASES if c.name == "chain-uint32-257")
    source = graph_kernel_source(case.plan, SHIFT_BODY, POPCOUNT_BODY)
    assert source is not None
    assert SHIFT_BODY.replace("LEFT", "true") in source
    assert "return (O)(x ^ y);" in source
    assert "return (O)(~x);" in source
    kernel = kernel_of(case.plan)
    (k,) = kernel.scalars
    assert case.plan.slots[k].name == "k"
    assert f"const unsigned int c{k} = s{k}[0];" in source
    assert kernel.lanes == 4
    count = next(c for c in CASES if c.name == "dml-count-int64-UINT8")
    assert "__popcll" in kernel_of(count.plan).source
    assert kernel_of(count.plan).lanes == 2  # 16 bytes of the widest array, INT64


def test_the_same_chain_gets_the_same_kernel_another_gets_another() -> None:
    u8 = [c for c in CASES if c.name.startswith("chain-uint8-") and c.plan.elements > 1]
    assert len({kernel_of(c.plan).name for c in u8}) == 1  # sizes do not change the source
    # One element: every operand is read once, as a scalar; a kernel of its own.
    one = next(c for c in CASES if c.name == "chain-uint8-1")
    assert len(kernel_of(one.plan).scalars) == 3
    assert kernel_of(one.plan).name != kernel_of(u8[0].plan).name
    u16 = next(c for c in CASES if c.name.startswith("chain-uint16-"))
    assert kernel_of(u16.plan).name != kernel_of(u8[0].plan).name


def test_no_fused_kernel_where_the_plan_does_not_fuse() -> None:
    elem = TensorProto.INT16
    data = model_bytes(
        [helper.make_node("BitwiseAnd", ["a", "b"], ["c"])],
        [tensor("a", elem, [3, 1, 5]), tensor("b", elem, [4, 1])],
        [tensor("c", elem, [3, 4, 5])],
    )
    broadcast = plan_graph(read_onnx(data), {"a": (3, 1, 5), "b": (4, 1)})
    assert not broadcast.fused
    assert graph_kernel_source(broadcast, SHIFT_BODY, POPCOUNT_BODY) is None
    empty = plan_graph(read_onnx(chain_model(np.dtype(np.uint8))), {"x": (0,), "y": (0,)})
    assert empty.fused
    assert graph_kernel_source(empty, SHIFT_BODY, POPCOUNT_BODY) is None
