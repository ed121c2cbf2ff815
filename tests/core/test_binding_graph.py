"""Graph models in the batch API's binding model (``model.json``): read under the batch header's
bounds and rules, run byte for byte as the same buffers and dispatches run as a /v1 batch, each
refusal naming the field path and the rule."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from core.graph_models import binding_example

from tensorbits.core.backends.numpy_backend import NumpyBackend
from tensorbits.core.batch import BatchLimits, plan_rest, run_batch
from tensorbits.core.graphs.binding_graph import BindingGraph, BindingPlan, read_binding_graph
from tensorbits.core.limits import CoreLimits
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError

Document = dict[str, Any]
Arrays = Mapping[str, np.ndarray[Any, Any]]
BACKEND = NumpyBackend(2)
CORE_LIMITS = CoreLimits(
    max_tensors=16,
    max_tensor_elements=1 << 20,
    max_json_elements=1 << 16,
    max_json_depth=32,
    max_buffers=8,
    max_dispatches=16,
    max_batch_header_bytes=64 << 10,
    max_body_bytes=1 << 24,
)
LIMITS = BatchLimits.of(CORE_LIMITS)
RNG = np.random.default_rng(7)


example = binding_example


def binding(buffer: str, datatype: str, sizes: list[int], **more: Any) -> Document:
    desc: Document = {"datatype": datatype, "sizes": sizes}
    desc.update(more.pop("desc", {}))
    return {"buffer": buffer, "desc": desc, **more}


def read(document: Document) -> BindingGraph:
    return read_binding_graph(json.dumps(document).encode(), LIMITS)


def run(document: Document, inputs: Arrays, fill: int = 0) -> dict[str, np.ndarray[Any, Any]]:
    """The model run with output arrays pre-filled with ``fill`` (a response's old bytes)."""
    graph = read(document)
    plan = graph.plan({name: array.shape for name, array in inputs.items()})
    outputs = {
        o.name: np.full(o.shape, fill, np.dtype(o.datatype.value.lower())) for o in plan.outputs
    }
    graph.run(plan, BACKEND, {k: v.copy() for k, v in inputs.items()}, outputs)
    return outputs


def as_batch(document: Document, inputs: Arrays) -> dict[str, np.ndarray[Any, Any]]:
    """The same buffers and dispatches as a /v1 batch request, run by the batch executor."""
    header = json.dumps(
        {
            "buffers": document["buffers"],
            "dispatches": document["dispatches"],
            "outputs": [o["buffer"] for o in document["outputs"]],
        }
    ).encode()
    by_buffer = {t["buffer"]: inputs[t["name"]] for t in document["inputs"]}
    data = [  # each buffer's bytes: the input's, padded with zeros to the buffer's size
        np.ascontiguousarray(by_buffer[b["name"]]).tobytes().ljust(b["byte_size"], b"\0")
        for b in document["buffers"]
        if b.get("init") is None
    ]
    body = bytearray(header + b"".join(data))
    plan = plan_rest(body, len(header), LIMITS)
    sinks = [bytearray(plan.buffers[i].byte_size) for i in plan.outputs]
    run_batch(plan, body, BACKEND, [memoryview(s) for s in sinks])
    return {
        o["name"]: np.frombuffer(sink, o["datatype"].lower(), math.prod(o["shape"])).reshape(
            o["shape"]
        )
        for o, sink in zip(document["outputs"], sinks, strict=True)
    }


def refusal(document: Document) -> TensorbitsError:
    with pytest.raises(TensorbitsError) as caught:
        read(document)
    return caught.value


def example_inputs() -> dict[str, np.ndarray[Any, Any]]:
    return {
        "codes": RNG.integers(0, 1 << 32, (4, 8), dtype=np.uint32),
        "query": RNG.integers(0, 1 << 32, (8,), dtype=np.uint32),
    }


def test_the_example_runs_as_its_batch_does_and_as_numpy_says() -> None:
    inputs = example_inputs()
    got = run(example(), inputs, fill=0xAA)
    expected = np.bitwise_count(inputs["codes"] ^ inputs["query"]).astype(np.uint8)
    assert got["distance"].tobytes() == expected.tobytes()
    assert got["distance"].tobytes() == as_batch(example(), inputs)["distance"].tobytes()


def test_the_model_declares_its_tensors_with_fixed_shapes() -> None:
    graph = read(example())
    assert [(d.name, d.datatype.value, d.dims) for d in graph.inputs] == [
        ("codes", "UINT32", (4, 8)),
        ("query", "UINT32", (8,)),
    ]
    assert [(d.name, d.datatype.value, d.dims) for d in graph.outputs] == [
        ("distance", "UINT8", (4, 8))
    ]


@pytest.mark.parametrize(
    ("shapes", "field", "rule"),
    [
        ({"codes": [4, 8]}, "query", "missing_input"),
        ({"codes": [4, 8], "query": [8], "extra": [1]}, "extra", "unknown_input"),
        ({"codes": [8, 4], "query": [8]}, "codes", "shape"),
        ({"codes": [4, 8], "query": [1, 8]}, "query", "shape"),
    ],
)
def test_a_request_gets_the_fixed_shapes_or_a_refusal_naming_the_input(
    shapes: dict[str, list[int]], field: str, rule: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read(example()).plan(shapes)
    assert (caught.value.field, caught.value.rule) == (field, rule)


def bit_not(source: str, target: str) -> Document:
    """A BIT_NOT dispatch over 8 UINT16 from the start of one buffer to the start of another."""
    return {
        "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_NOT",
        "bindings": {
            "InputTensor": binding(source, "UINT16", [8]),
            "OutputTensor": binding(target, "UINT16", [8]),
        },
    }


def half_written() -> Document:
    """x (8 UINT16) NOT'ed into the first half of y, a zero-filled output of 16."""
    return {
        "inputs": [{"name": "x", "datatype": "UINT16", "shape": [8], "buffer": "x"}],
        "outputs": [{"name": "y", "datatype": "UINT16", "shape": [16], "buffer": "y"}],
        "buffers": [
            {"name": "x", "byte_size": 16},
            {"name": "y", "byte_size": 32, "init": "zeros"},
        ],
        "dispatches": [bit_not("x", "y")],
    }


def test_bytes_no_dispatch_writes_go_back_as_zeros_whatever_the_output_held() -> None:
    """BIT_NOT over the first half of a zero-filled output buffer: the second half is zeros,
    not the bytes the caller's array held (the response's memory)."""
    document = half_written()
    x = np.arange(8, dtype=np.uint16)
    got = run(document, {"x": x}, fill=0xAAAA)["y"]
    assert got[:8].tolist() == (~x).tolist()
    assert got[8:].tolist() == [0] * 8
    assert got.tobytes() == as_batch(document, {"x": x})["y"].tobytes()
    plan = read(document).plan({"x": [8]})
    assert isinstance(plan, BindingPlan)
    assert plan.zero_filled == (False, True)


def test_a_buffer_written_whole_by_its_first_dispatch_is_not_zero_filled_first() -> None:
    document = example()
    plan = read(document).plan({"codes": [4, 8], "query": [8]})
    assert plan.zero_filled == (False, False, False)


def test_an_output_in_an_inputs_buffer_strided_and_in_place_leaves_the_callers_input_alone() -> (
    None
):
    """The output is the input's own buffer, NOT'ed in place through a transposing view: the
    request's array is not written (it may be read-only: a gRPC message's bytes)."""
    document: Document = {
        "inputs": [{"name": "x", "datatype": "UINT32", "shape": [2, 3], "buffer": "x"}],
        "outputs": [{"name": "x_out", "datatype": "UINT32", "shape": [2, 3], "buffer": "x"}],
        "buffers": [{"name": "x", "byte_size": 24}],
        "dispatches": [
            {
                "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_NOT",
                "bindings": {
                    "InputTensor": binding("x", "UINT32", [3, 2], desc={"strides": [1, 3]}),
                    "OutputTensor": binding("x", "UINT32", [3, 2], desc={"strides": [1, 3]}),
                },
            }
        ],
    }
    x = np.arange(6, dtype=np.uint32).reshape(2, 3)
    x.flags.writeable = False
    graph = read(document)
    plan = graph.plan({"x": [2, 3]})
    out = {"x_out": np.empty((2, 3), np.uint32)}
    graph.run(plan, BACKEND, {"x": x}, out)
    assert out["x_out"].tolist() == (~x).tolist()
    assert x.tolist() == np.arange(6).reshape(2, 3).tolist()
    assert out["x_out"].tobytes() == as_batch(document, {"x": x})["x_out"].tobytes()


def test_a_written_read_only_input_is_copied_not_written() -> None:
    inputs = example_inputs()
    codes = inputs["codes"].copy()
    inputs["codes"].flags.writeable = False
    graph = read(example())
    plan = graph.plan({"codes": [4, 8], "query": [8]})
    out = {"distance": np.empty((4, 8), np.uint8)}
    graph.run(plan, BACKEND, inputs, out)
    assert inputs["codes"].tobytes() == codes.tobytes()
    assert out["distance"].tolist() == np.bitwise_count(codes ^ inputs["query"]).tolist()


def test_strided_non_contiguous_output_arrays_get_the_same_bytes() -> None:
    inputs = example_inputs()
    graph = read(example())
    plan = graph.plan({"codes": [4, 8], "query": [8]})
    backing = np.zeros((8, 4), np.uint8)
    out = {"distance": backing.T}  # (4, 8), not C-contiguous
    graph.run(plan, BACKEND, {k: v.copy() for k, v in inputs.items()}, out)
    assert out["distance"].tolist() == np.bitwise_count(inputs["codes"] ^ inputs["query"]).tolist()


def _set(document: Document, path: str, value: Any) -> Document:
    target: Any = document
    parts = path.split(".")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if value is DELETE:
        del target[last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return document


DELETE = object()

REFUSALS: list[tuple[str, Any, str, str]] = [
    # The batch planner's own rules, at the batch's field paths.
    (
        "dispatches.0.bindings.BTensor.desc.strides",
        [0, 2],
        "dispatches[0].bindings.BTensor",
        "buffer_bounds",
    ),
    ("dispatches.0.operator", "DML_OPERATOR_NOPE", "dispatches[0].operator", "unknown_operator"),
    (
        "dispatches.1.parameters",
        {"feature_level": "1_0"},
        "dispatches[1].parameters.feature_level",
        "feature_level",
    ),
    (
        "dispatches.1.bindings.OutputTensor.buffer",
        "nowhere",
        "dispatches[1].bindings.OutputTensor.buffer",
        "unknown_buffer",
    ),
    # The model's inputs and outputs against their buffers.
    ("inputs.0.buffer", "counts", "inputs[0].buffer", "buffer_size"),
    ("inputs.1.buffer", "codes", "inputs[1].buffer", "duplicate_buffer"),
    ("inputs.1.name", "codes", "inputs[1].name", "duplicate_input"),
    ("outputs.0.buffer", "elsewhere", "outputs[0].buffer", "unknown_buffer"),
    ("outputs.0.shape", [4, 4], "outputs[0].buffer", "buffer_size"),
    ("outputs.0.shape", [1] * 9, "outputs[0].shape", "rank"),
    ("outputs.0.shape", [-4, -8], "outputs[0].shape", "shape"),
    ("buffers.2.init", None, "buffers[2].init", "unbound_buffer"),
    ("buffers.0.init", "zeros", "buffers[0].init", "input_buffer"),
    # The schema: strict fields, named.
    ("inputs.0.nope", 1, "inputs[0].nope", "extra_forbidden"),
    (
        "dispatches.0.bindings.ATensor.offset",
        "0",
        "dispatches[0].bindings.ATensor.offset",
        "int_type",
    ),
    ("inputs.0.datatype", "COMPLEX64", "inputs[0].datatype", "literal_error"),
    ("outputs", DELETE, "outputs", "missing"),
]


@pytest.mark.parametrize(("path", "value", "field", "rule"), REFUSALS)
def test_a_file_breaking_a_rule_is_refused_naming_where_and_which(
    path: str, value: Any, field: str, rule: str
) -> None:
    error = refusal(_set(example(), path, value))
    assert isinstance(error, InvalidRequest)
    assert error.field is not None
    assert error.field.startswith(field), error.message
    assert error.rule == rule, error.message
    assert error.message.startswith(f"{error.field}: ")


def test_past_the_bounds_a_file_is_refused_before_it_is_parsed_or_planned() -> None:
    too_many = example()
    too_many["dispatches"] = too_many["dispatches"] * 9  # 18 > 16
    error = refusal(too_many)
    assert isinstance(error, PayloadTooLarge)
    assert error.rule == "max_dispatches"
    huge = example()
    huge["outputs"][0]["shape"] = [1 << 11, 1 << 10]
    huge["buffers"][2]["byte_size"] = 1 << 21
    error = refusal(huge)
    assert isinstance(error, PayloadTooLarge)
    assert error.rule == "max_tensor_elements"
    assert error.field == "outputs[0].shape"
    wide = b'{"inputs": [' + b"[" * 100 + b"]" * 100 + b"]}"
    with pytest.raises(TensorbitsError):
        read_binding_graph(wide, LIMITS)
    with pytest.raises(TensorbitsError) as caught:
        read_binding_graph(b"{not json", LIMITS)
    assert caught.value.field == "model.json"


def test_inputs_a_request_could_not_carry_are_refused() -> None:
    """A model whose inputs together pass the request body's bound could never be run."""
    document = example()
    document["inputs"][0]["shape"] = [1 << 9, 1 << 10]  # 2 MiB of UINT32
    document["buffers"][0]["byte_size"] = 1 << 21
    document["dispatches"] = []
    small = BatchLimits.of(dataclasses.replace(CORE_LIMITS, max_body_bytes=1 << 21))
    with pytest.raises(PayloadTooLarge) as caught:
        read_binding_graph(json.dumps(document).encode(), small)
    assert (caught.value.field, caught.value.rule) == ("inputs", "max_body_bytes")
    read_binding_graph(json.dumps(document).encode(), LIMITS)  # 2 MiB + 32 bytes: carried


def test_the_documented_example_is_the_schemas_and_runs() -> None:
    """docs/graph-models.md shows the protocol's example: the same document, which loads."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "graph-models.md"
    section = docs.read_text().split("## Binding graphs", 1)[1]
    shown = section.split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(shown) == example()
    read(json.loads(shown))


class OnDevice(np.ndarray[Any, Any]):
    """A NumPy array as a CuPy array is used: its ``device`` a context to run under."""

    @property
    def device(self) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return contextlib.nullcontext()


class DeviceLike(NumpyBackend):
    """NumPy with a device's memory model (as CuPy's): arrays are copies of the host's, and
    only ``to_host`` brings a result back."""

    host_memory = False

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
        return np.empty(shape, dtype).view(OnDevice)

    def asarray(self, host: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return host.copy()

    def to_host(
        self, array: np.ndarray[Any, Any], out: np.ndarray[Any, Any] | None = None
    ) -> np.ndarray[Any, Any]:
        if out is None:
            return array.copy()
        np.copyto(out, array)
        return out


@pytest.mark.parametrize("fill", [0, 0xAA])
def test_on_a_device_the_buffers_are_placed_there_and_the_outputs_copied_back(fill: int) -> None:
    """The device path (every buffer on the device, each output copied back, zeros made there):
    the host's bytes; the caller's input untouched, the output written only through to_host."""
    inputs = example_inputs()
    graph = read(example())
    plan = graph.plan({"codes": [4, 8], "query": [8]})
    given = {k: v.copy() for k, v in inputs.items()}
    out = {"distance": np.full((4, 8), fill, np.uint8)}
    graph.run(plan, DeviceLike(1), given, out)
    assert given["codes"].tobytes() == inputs["codes"].tobytes()  # in place on the device only
    assert out["distance"].tobytes() == run(example(), inputs)["distance"].tobytes()
    document = half_written()  # and x NOT'ed in place, answered as a second output
    document["outputs"].append({"name": "x_out", "datatype": "UINT16", "shape": [8], "buffer": "x"})
    document["dispatches"].append(bit_not("x", "x"))
    x = np.arange(8, dtype=np.uint16)
    device = read(document)
    device_plan = device.plan({"x": [8]})
    outputs = {"y": np.full(16, fill, np.uint16), "x_out": np.full(8, fill, np.uint16)}
    device.run(device_plan, DeviceLike(1), {"x": x}, outputs)
    assert outputs["y"].tolist() == (~x).tolist() + [0] * 8
    assert outputs["x_out"].tolist() == (~x).tolist()
    assert x.tolist() == list(range(8))
    host = run(document, {"x": x}, fill)
    assert host["y"].tobytes() == outputs["y"].tobytes()
    assert host["x_out"].tobytes() == outputs["x_out"].tobytes()


def test_buffers_padded_to_four_bytes_as_directml_sizes_them() -> None:
    """Three UINT8 in a buffer of 4 (DirectML's size), NOT'ed as 4 elements into an output
    buffer of 4: the input's padding is zeros, the output's fourth byte is not answered."""
    document: Document = {
        "inputs": [{"name": "x", "datatype": "UINT8", "shape": [3], "buffer": "x"}],
        "outputs": [{"name": "y", "datatype": "UINT8", "shape": [3], "buffer": "y"}],
        "buffers": [{"name": "x", "byte_size": 4}, {"name": "y", "byte_size": 4, "init": "zeros"}],
        "dispatches": [
            {
                "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_NOT",
                "bindings": {
                    "InputTensor": binding("x", "UINT8", [4]),
                    "OutputTensor": binding("y", "UINT8", [4]),
                },
            }
        ],
    }
    x = np.array([1, 2, 3], np.uint8)
    for backend in (BACKEND, DeviceLike(1)):
        graph = read(document)
        plan = graph.plan({"x": [3]})
        out = {"y": np.zeros(3, np.uint8)}
        graph.run(plan, backend, {"x": x}, out)
        assert out["y"].tolist() == [254, 253, 252]
    assert as_batch(document, {"x": x})["y"].tolist() == [254, 253, 252]
    document["buffers"][0]["byte_size"] = 8  # past the padding: refused
    error = refusal(document)
    assert (error.field, error.rule) == ("inputs[0].buffer", "buffer_size")
