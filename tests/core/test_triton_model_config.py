"""Triton's ModelConfig as a graph model's configuration: protobuf JSON's standard spellings
taken (JSON names, 64-bit integers as strings), the configuration answered loading back
unchanged, the batch dimension as Triton means it, fields refused with why, the docs' table the
code's, and hostile JSON still refused before protobuf sees it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from core.graph_models import BATCH_LIMITS, masked_model, model_bytes, tensor
from google.protobuf import json_format
from onnx import TensorProto, helper

from tensorbits import model_info
from tensorbits.core.graphs.config_fields import MODEL_FIELDS, TENSOR_FIELDS
from tensorbits.core.graphs.limits import GraphLimits
from tensorbits.core.graphs.model_config_pb2 import ModelConfig
from tensorbits.core.graphs.models import GraphModel, build
from tensorbits.core.graphs.request import check_batch
from tensorbits.core.graphs.triton_config import MAX_CONFIG_BYTES, read_config
from tensorbits_protocol.dtypes import DataType
from tensorbits_protocol.errors import InvalidRequest, PayloadTooLarge, TensorbitsError
from tensorbits_protocol.infer import InferRequest, Tensor

ROOT = Path(__file__).resolve().parents[2]
BATCHED = {
    "name": "masked",
    "platform": "onnxruntime_onnx",
    "max_batch_size": 8,
    "input": [{"name": "x", "data_type": "TYPE_UINT8", "dims": [4]}],
    "dynamic_batching": {},
    "instance_group": [{"kind": "KIND_CPU", "count": 2}],
    "parameters": {},
}


def _build(config: object) -> GraphModel:
    text = config if isinstance(config, str) else json.dumps(config)
    return build("masked", text, masked_model(), GraphLimits(), BATCH_LIMITS)


def test_protobuf_json_s_standard_spellings_are_taken() -> None:
    camel = {
        "name": "masked",
        "backend": "onnxruntime",
        "maxBatchSize": 8,
        "versionPolicy": {"latest": {"numVersions": 1}},
        "input": [{"name": "x", "dataType": "TYPE_UINT8", "dims": ["4"]}],
        "dynamicBatching": {"maxQueueDelayMicroseconds": "100"},
    }
    assert read_config(json.dumps(camel), "masked")["input"] == BATCHED["input"]
    assert read_config(json.dumps(camel), "masked")["max_batch_size"] == 8


def test_the_configuration_answered_loads_back_unchanged_in_either_form() -> None:
    for config in (BATCHED, {"backend": "onnxruntime"}):
        model = _build(config)
        answer = model.config
        assert _build(answer).config == answer
        # gRPC's answer is the message; a client's MessageToJson of it is camelCase, int64 text
        message = json_format.ParseDict(answer, ModelConfig())
        as_grpc_json = json_format.MessageToJson(message)
        assert '"dataType"' in as_grpc_json
        assert ('"maxBatchSize": 8' in as_grpc_json) == (answer["max_batch_size"] == 8)
        assert _build(as_grpc_json).config == answer


def test_the_batch_dimension_is_left_out_of_dims_and_bounded_per_request() -> None:
    model = _build(BATCHED)
    config = model.config
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == config["output"][0]["dims"] == [4]
    metadata = model_info.graph_metadata(model)
    assert [t.shape for t in (*metadata.inputs, *metadata.outputs)] == [[-1, 4], [-1, 4]]

    def request(batch: int) -> InferRequest:
        raw = memoryview(np.zeros((batch, 4), np.uint8).tobytes())
        return InferRequest(inputs=(Tensor("x", DataType.UINT8, (batch, 4), raw),))

    check_batch(model, request(8))
    with pytest.raises(InvalidRequest) as caught:
        check_batch(model, request(9))
    assert (caught.value.field, caught.value.rule) == ("x", "max_batch_size")
    assert "max_batch_size is 8" in caught.value.message


def test_a_batched_configuration_of_a_file_with_a_fixed_first_dimension_is_refused() -> None:
    fixed = model_bytes(
        [helper.make_node("BitwiseNot", ["x"], ["z"])],
        [tensor("x", TensorProto.UINT8, [2, 4])],
        [tensor("z", TensorProto.UINT8, [2, 4])],
    )
    with pytest.raises(InvalidRequest) as caught:
        build(
            "fixed",
            '{"backend": "onnxruntime", "max_batch_size": 4}',
            fixed,
            GraphLimits(),
            BATCH_LIMITS,
        )
    assert (caught.value.field, caught.value.rule) == ("config.max_batch_size", "max_batch_size")


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        (
            {"sequence_batching": {"max_sequence_idle_microseconds": "5"}},
            "config.sequence_batching",
        ),
        ({"ensemble_scheduling": {"step": [{"model_name": "a"}]}}, "config.ensemble_scheduling"),
        ({"batch_input": [{"kind": "BATCH_ELEMENT_COUNT"}]}, "config.batch_input"),
        ({"model_transaction_policy": {"decoupled": True}}, "config.model_transaction_policy"),
        ({"input": [{"name": "x", "optional": True}]}, "config.input[0].optional"),
        ({"input": [{"name": "x", "reshape": {"shape": [4]}}]}, "config.input[0].reshape"),
    ],
)
def test_a_field_that_cannot_be_honoured_is_refused_with_why(
    setting: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        read_config(json.dumps({"backend": "onnxruntime", **setting}), "masked")
    assert (caught.value.field, caught.value.rule) == (field, "unsupported_config")
    name = field.rsplit(".", 1)[-1].split("[")[0]
    reason = (MODEL_FIELDS.get(name) or TENSOR_FIELDS["input"][name]).reason
    assert reason in caught.value.message
    # at its default it says nothing: taken
    assert read_config(
        '{"backend": "onnxruntime", "model_transaction_policy": {"decoupled": false}}', "m"
    )


def test_the_docs_table_is_the_code_s() -> None:
    docs = (ROOT / "docs" / "graph-models.md").read_text()
    for name, rule in MODEL_FIELDS.items():
        assert f"| `{name}` | {rule.treatment.value} | {rule.reason} |" in docs, name
    for kind, table in TENSOR_FIELDS.items():
        for name, rule in table.items():
            assert f"| `{kind}.{name}` | {rule.treatment.value} | {rule.reason} |" in docs, name


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ('{"parameters": ' * 40 + "{}" + "}" * 40, "json"),  # nested past the bound
        ('{"input": [' + ", ".join(["{}"] * 5000) + "]}", "json"),  # values past the bound
    ],
)
def test_hostile_json_is_refused_before_protobuf_parses_it(text: str, rule: str) -> None:
    with pytest.raises(TensorbitsError) as caught:
        read_config(text, "m")
    assert 400 <= caught.value.status_code < 500
    with pytest.raises(PayloadTooLarge):
        read_config(" " * (MAX_CONFIG_BYTES + 1), "m")
