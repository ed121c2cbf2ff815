"""Graph model files refused: each with the field and rule that name why, as a 4xx error, and
nothing else happening (a file over a bound never reaches the protobuf parser)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import onnx
import pytest
from core.graph_models import chain_model, constant, model_bytes, tensor
from onnx import TensorProto, helper

from tensorbits.core.graphs import GraphLimits, read_onnx
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError

U8, U16, U32 = TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32


@pytest.fixture
def parser_unused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails the test if the protobuf parser is reached."""

    def refuse(data: bytes) -> Any:
        raise AssertionError("the file reached the parser")

    monkeypatch.setattr(onnx.ModelProto, "FromString", refuse)


def refused(
    data: bytes, rule: str, field: str, limits: GraphLimits | None = None
) -> TensorbitsError:
    with pytest.raises(TensorbitsError) as caught:
        read_onnx(data, limits)
    error = caught.value
    assert (error.rule, error.field) == (rule, field), error.message
    assert 400 <= error.status_code < 500
    # The field is said once, however the message begins.
    assert not error.message.startswith(f"{field}: {field}"), error.message
    return error


def raw_tensor(name: str, dims: list[int], raw: bytes) -> TensorProto:
    """A UINT8 tensor as written, whatever its size (make_tensor checks the size)."""
    proto = TensorProto(name=name, data_type=U8, raw_data=raw)
    proto.dims.extend(dims)
    return proto


def not_chain(length: int) -> bytes:
    nodes = [
        helper.make_node("BitwiseNot", [f"v{i}"], [f"v{i + 1}"], name=f"not{i}")
        for i in range(length)
    ]
    return model_bytes(nodes, [tensor("v0", U8, [4])], [tensor(f"v{length}", U8, [4])])


def binary(
    op_type: str, a_type: int = U8, b_type: int = U8, opset: int = 18, **attrs: Any
) -> bytes:
    return model_bytes(
        [helper.make_node(op_type, ["a", "b"], ["c"], name="n0", **attrs)],
        [tensor("a", a_type, [4]), tensor("b", b_type, [4])],
        [tensor("c", a_type, [4])],
        opset=opset,
    )


def test_a_good_file_is_read() -> None:
    spec = read_onnx(chain_model(np.dtype(np.uint8)))
    assert [n.operator.name for n in spec.nodes] == [
        "onnx.BitwiseXor-18",
        "onnx.BitShift-11",
        "onnx.BitwiseNot-18",
    ]
    assert spec.nodes[1].parameters == {"direction": "LEFT"}
    assert spec.depth == 3
    assert [d.dims for d in spec.inputs] == [("n",), ("n",)]


@pytest.mark.parametrize("cut", [1, 10, 40, -30, -1])
def test_truncated_bytes(cut: int) -> None:
    data = chain_model(np.dtype(np.uint8))
    error = refused(data[:cut], "truncated_model", "model")
    assert isinstance(error, InvalidRequest)


@pytest.mark.parametrize("data", [b"\xff" * 64, b"\x07\x01", b"\x08" + b"\xff" * 11, b"not onnx"])
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_onnx(data)
    assert caught.value.rule in ("malformed_model", "truncated_model", "ir_version")


def test_empty_bytes_are_a_model_without_anything() -> None:
    refused(b"", "ir_version", "model")


@pytest.mark.usefixtures("parser_unused")
def test_oversized_file_is_refused_before_parsing() -> None:
    data = chain_model(np.dtype(np.uint8))
    error = refused(data, "max_model_bytes", "model", GraphLimits(max_model_bytes=len(data) - 1))
    assert isinstance(error, PayloadTooLarge)


def test_cycle() -> None:
    nodes = [
        helper.make_node("BitwiseXor", ["x", "b"], ["a"], name="xor"),
        helper.make_node("BitwiseNot", ["a"], ["b"], name="not"),
    ]
    data = model_bytes(nodes, [tensor("x", U8, [4])], [tensor("b", U8, [4])])
    error = refused(data, "graph_cycle", "nodes[0]")
    assert "'xor'" in error.message


def test_self_loop() -> None:
    data = model_bytes([helper.make_node("BitwiseNot", ["a"], ["a"])], [], [tensor("a", U8, [4])])
    refused(data, "graph_cycle", "nodes[0]")


def test_unknown_operator() -> None:
    error = refused(binary("Add"), "unknown_operator", "nodes[0]")
    assert "'Add'" in error.message
    assert "'n0'" in error.message


def test_a_node_outside_the_family_is_named_once() -> None:
    node = helper.make_node("Relu", ["a"], ["c"], name="act")
    data = model_bytes([node], [tensor("a", U8, [4])], [tensor("c", U8, [4])])
    error = refused(data, "unknown_operator", "nodes[0]")
    assert error.message.startswith("nodes[0] 'act' ('Relu'): op type 'Relu' is not taken")


def test_operator_of_another_domain() -> None:
    node = helper.make_node("BitwiseAnd", ["a", "b"], ["c"], domain="com.example")
    data = model_bytes([node], [tensor("a", U8, [4]), tensor("b", U8, [4])], [tensor("c", U8, [4])])
    refused(data, "unknown_operator", "nodes[0]")


def test_mismatched_types_by_the_family_rule() -> None:
    error = refused(binary("BitwiseAnd", U8, U16), "mixed_datatype", "nodes[0]")
    assert "onnx.BitwiseAnd-18" in error.message
    assert "(BitwiseAnd" in error.message


def test_types_the_operator_does_not_take() -> None:
    refused(
        binary("BitShift", TensorProto.INT32, TensorProto.INT32, direction="LEFT"),
        "datatype",
        "nodes[0]",
    )
    refused(binary("BitwiseOr", TensorProto.BOOL, TensorProto.BOOL), "datatype", "nodes[0]")


def test_shapes_that_do_not_broadcast() -> None:
    data = model_bytes(
        [helper.make_node("BitwiseOr", ["a", "b"], ["c"])],
        [tensor("a", U8, [3]), tensor("b", U8, [4])],
        [tensor("c", U8, None)],
    )
    refused(data, "broadcast", "nodes[0]")


A4, B4 = tensor("a", U8, [4]), tensor("b", U8, [4])


# A graph of one BitwiseNot node, wrong in one way: what the node reads and makes, the input and
# output the graph declares, and the rule and field that refuse it.
@pytest.mark.parametrize(
    ("reads", "makes", "declared_input", "declared_output", "rule", "field"),
    [
        (["a"], "b", A4, tensor("b", U16, [4]), "type_mismatch", "outputs[0]"),
        (["nowhere"], "b", A4, B4, "undefined_value", "nodes[0]"),
        (["a"], "a", A4, A4, "duplicate_name", "nodes[0]"),
        (["a"], "b", A4, tensor("c", U8, [4]), "undefined_value", "outputs[0]"),
        (["a", "a"], "b", A4, B4, "input_count", "nodes[0]"),
        (["a"], "b", tensor("a", U8, None), tensor("b", U8, None), "unknown_rank", "inputs[0]"),
    ],
    ids=[
        "output_declared_with_another_type",
        "node_reading_an_undefined_value",
        "name_defined_twice",
        "output_naming_an_undefined_value",
        "wrong_input_count",
        "input_of_unknown_rank",
    ],
)
def test_one_node_graph_wrong_in_one_way(
    reads: list[str],
    makes: str,
    declared_input: onnx.ValueInfoProto,
    declared_output: onnx.ValueInfoProto,
    rule: str,
    field: str,
) -> None:
    node = helper.make_node("BitwiseNot", reads, [makes])
    refused(model_bytes([node], [declared_input], [declared_output]), rule, field)


@pytest.mark.usefixtures("parser_unused")
def test_ten_thousand_nodes_refused_by_the_node_bound_quickly() -> None:
    data = not_chain(10_000)
    start = time.perf_counter()
    error = refused(data, "max_nodes", "nodes[1024]")
    assert time.perf_counter() - start < 0.5
    assert isinstance(error, PayloadTooLarge)


def test_a_chain_past_the_depth_bound() -> None:
    read_onnx(not_chain(256))
    refused(not_chain(257), "max_depth", "nodes[256]")


@pytest.mark.usefixtures("parser_unused")
def test_huge_initializer_refused_before_its_data_is_copied() -> None:
    big = constant("big", np.zeros(2 << 20, np.uint8))
    data = model_bytes(
        [helper.make_node("BitwiseAnd", ["x", "big"], ["y"])],
        [tensor("x", U8, [2 << 20])],
        [tensor("y", U8, [2 << 20])],
        [big],
    )
    refused(
        data, "max_initializer_bytes", "initializers[0]", GraphLimits(max_initializer_bytes=1 << 20)
    )


@pytest.mark.usefixtures("parser_unused")
def test_initializer_declaring_more_than_it_holds() -> None:
    # 2**40 elements declared, none stored: refused from its dimensions alone.
    big = raw_tensor("big", [1 << 20, 1 << 20], b"")
    data = model_bytes(
        [helper.make_node("Identity", ["big"], ["y"])], [], [tensor("y", U8, None)], [big]
    )
    refused(data, "max_initializer_bytes", "initializers[0]")


def test_initializer_data_of_the_wrong_size() -> None:
    wrong = raw_tensor("k", [4], b"\x01\x02\x03")
    data = model_bytes(
        [helper.make_node("Identity", ["k"], ["y"])], [], [tensor("y", U8, None)], [wrong]
    )
    refused(data, "initializer_size", "initializers[0]")


def test_external_data() -> None:
    outside = raw_tensor("k", [4], b"")
    outside.data_location = TensorProto.EXTERNAL
    data = model_bytes(
        [helper.make_node("Identity", ["k"], ["y"])], [], [tensor("y", U8, None)], [outside]
    )
    refused(data, "external_data", "initializers[0]")


def test_too_many_initializers_and_constants() -> None:
    nodes = [helper.make_node("Constant", [], ["c"], value=constant("c", np.ones(2, np.uint8)))]
    data = model_bytes(
        [*nodes, helper.make_node("BitwiseAnd", ["k", "c"], ["y"])],
        [],
        [tensor("y", U8, None)],
        [constant("k", np.ones(2, np.uint8))],
    )
    read_onnx(data, GraphLimits(max_initializers=2))
    refused(data, "max_initializers", "initializers[0]", GraphLimits(max_initializers=1))


def test_constant_forms_other_than_a_tensor() -> None:
    node = helper.make_node("Constant", [], ["c"], value_int=3)
    data = model_bytes([node], [], [tensor("c", TensorProto.INT64, None)])
    refused(data, "unknown_attribute", "nodes[0]")


def test_a_name_too_long_names_the_node() -> None:
    node = helper.make_node("BitwiseNot", ["a"], ["b"], name="n" * 257)
    data = model_bytes([node], [tensor("a", U8, [4])], [tensor("b", U8, [4])])
    error = refused(data, "max_name_chars", "nodes[0]")
    assert len(error.message) < 400


def test_an_opset_too_old() -> None:
    error = refused(binary("BitwiseAnd", opset=17), "opset_version", "nodes[0]")
    assert "18" in error.message


def test_an_opset_newer_than_known() -> None:
    refused(
        binary("BitwiseAnd", opset=onnx.defs.onnx_opset_version() + 1),
        "opset_version",
        "opset_import",
    )


def test_bit_shift_direction() -> None:
    refused(binary("BitShift"), "unknown_attribute", "nodes[0]")
    refused(binary("BitShift", direction="UP"), "parameter_value", "nodes[0]")
    refused(binary("BitwiseAnd", direction="LEFT"), "unknown_attribute", "nodes[0]")


def test_nested_graph_attributes_are_refused_by_the_scan() -> None:
    inner = helper.make_graph([], "inner", [], [])
    node = helper.make_node("BitwiseNot", ["a"], ["b"], body=inner)
    data = model_bytes([node], [tensor("a", U8, [4])], [tensor("b", U8, [4])])
    refused(data, "unsupported_attribute", "nodes[0]")


def test_inputs_and_outputs_bounds() -> None:
    data = binary("BitwiseAnd")
    refused(data, "max_inputs", "inputs[1]", GraphLimits(max_inputs=1))
    refused(data, "max_outputs", "outputs[0]", GraphLimits(max_outputs=0))


def test_the_field_bound_bounds_a_node_of_many_inputs() -> None:
    node = helper.make_node("BitwiseNot", ["a"] * 100_000, ["b"])
    data = model_bytes([node], [tensor("a", U8, [4])], [tensor("b", U8, [4])])
    refused(data, "max_fields", "nodes[0]")


def test_ir_version_and_opset_imports() -> None:
    model = onnx.ModelProto.FromString(binary("BitwiseAnd"))
    del model.opset_import[:]
    refused(model.SerializeToString(), "opset_import", "opset_import")
    model = onnx.ModelProto.FromString(binary("BitwiseAnd"))
    model.ir_version = 2
    refused(model.SerializeToString(), "ir_version", "model")
