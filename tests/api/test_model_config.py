"""The model configuration and statistics documents (model_info.py, statistics.py): valid
protobuf JSON of Triton's messages for every operator (what the gRPC front end ParseDicts), served
as they are on the HTTP routes, and the metadata telling the operator tables' truth."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf import json_format
from support.inprocess import TestClient
from support.v2 import NOT, infer_binary
from tritonclient.grpc import model_config_pb2, service_pb2

from tensorbits import model_info
from tensorbits.core.statistics import Statistics
from tensorbits_protocol.operators import OPERATORS, OperatorSpec, get_operator
from tensorbits_protocol.v2 import ModelMetadataResponse

NAMES = [op.name for op in OPERATORS]


@pytest.mark.parametrize("op", OPERATORS, ids=NAMES)
def test_model_config_parses_as_triton_model_config(op: OperatorSpec) -> None:
    message = json_format.ParseDict(
        model_info.model_config(op), model_config_pb2.ModelConfig(), ignore_unknown_fields=False
    )
    assert message.name == op.name
    assert [i.name for i in message.input] == list(op.inputs)
    assert [o.name for o in message.output] == [op.output]
    assert message.max_batch_size == 0
    assert list(message.version_policy.specific.versions) == [1]
    config = model_info.model_config(op)
    assert [list(i.dims) for i in message.input] == [t["dims"] for t in config["input"]]
    assert {k: v.string_value for k, v in message.parameters.items()} == _config_words(config)


def test_statistics_parse_as_triton_statistics_response() -> None:
    stats = Statistics()
    stats.record(NOT, 5, 10, 20, 30, 70)
    stats.record_failure(NOT, 9)
    document = stats.response(OPERATORS)
    message = json_format.ParseDict(
        document, service_pb2.ModelStatisticsResponse(), ignore_unknown_fields=False
    )
    entry = message.model_stats[NAMES.index(NOT)]
    assert (entry.inference_count, entry.execution_count) == (1, 1)
    assert (entry.inference_stats.success.count, entry.inference_stats.success.ns) == (1, 70)
    assert (entry.inference_stats.fail.count, entry.inference_stats.fail.ns) == (1, 9)
    assert entry.inference_stats.queue.ns == 5
    assert entry.inference_stats.compute_output.ns == 30
    assert entry.last_inference > 0


def _config_words(config: dict[str, Any]) -> dict[str, str]:
    return {key: value["string_value"] for key, value in config["parameters"].items()}


@pytest.mark.parametrize("op", OPERATORS, ids=NAMES)
def test_metadata_and_config_say_the_tables(op: OperatorSpec) -> None:
    metadata = model_info.model_metadata(op)
    words = _config_words(model_info.model_config(op))
    newest = op.support[0]  # in force at every default parameter value
    for tensor in metadata.inputs:
        assert tensor.datatypes == [t.value for t in newest.input_types]
        assert tensor.datatype in tensor.datatypes
        assert (tensor.min_rank, tensor.max_rank) == (newest.min_rank, newest.max_rank)
        assert tensor.min_rank is not None
        assert tensor.max_rank is not None
        assert tensor.min_rank <= len(tensor.shape) <= tensor.max_rank
        assert words[f"input.{tensor.name}.datatypes"] == ",".join(tensor.datatypes)
        assert words[f"input.{tensor.name}.min_rank"] == str(tensor.min_rank)
    (output,) = metadata.outputs
    assert output.datatypes == [t.value for t in (newest.output_types or newest.input_types)]
    assert [p.name for p in metadata.parameters or ()] == [p.name for p in op.parameters]
    for parameter in op.parameters:
        assert words[f"parameter.{parameter.name}.required"] == str(parameter.required).lower()
        if parameter.choices is not None:
            assert words[f"parameter.{parameter.name}.choices"] == ",".join(parameter.choices)
        if parameter.default is not None:
            assert words[f"parameter.{parameter.name}.default"] == str(parameter.default)
    assert len(metadata.support or ()) == len(op.support)
    for index, row in enumerate(op.support):
        assert words[f"support.{index}.input_types"] == ",".join(row.input_types)
        assert words.get(f"support.{index}.since") == row.since
    assert words["shape_rule"] == op.shape_rule.value
    assert words.get("support_parameter") == ("feature_level" if op.spec == "dml" else None)


def test_polymorphic_metadata_is_no_longer_one_type() -> None:
    metadata = model_info.model_metadata(get_operator("DML_OPERATOR_ELEMENT_WISE_BIT_AND"))
    assert metadata.inputs[0].datatypes is not None
    assert {"FP16", "INT64", "UINT8"} <= set(metadata.inputs[0].datatypes)
    assert metadata.support_parameter == "feature_level"
    assert [row.since for row in metadata.support or ()] == ["4_1", "3_0"]
    count = model_info.model_metadata(get_operator("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT"))
    assert count.outputs[0].datatypes == ["UINT8", "UINT32"]
    shift = model_info.model_metadata(get_operator("DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT"))
    assert [(r.since, r.min_rank, r.max_rank) for r in shift.support or ()] == [
        ("4_1", 1, 8),
        ("3_0", 1, 8),
        ("2_1", 4, 4),
    ]


# --- the HTTP routes ----------------------------------------------------------------------------


def test_server_lists_the_extensions(v2: TestClient) -> None:
    extensions = v2.get("/v2").json()["extensions"]
    assert {"model_configuration", "statistics", "binary_tensor_data"} <= set(extensions)
    assert not {e for e in extensions if "shared_memory" in e or "grpc" in e}


@pytest.mark.parametrize("path", ["/v2/models/{m}", "/v2/models/{m}/versions/1"])
def test_metadata_route_serves_the_document(v2: TestClient, path: str) -> None:
    op = get_operator("openvino.BitwiseAnd-13")
    response = v2.get(path.format(m=op.name))
    assert response.status_code == 200
    assert ModelMetadataResponse.model_validate(response.json()) == model_info.model_metadata(op)


@pytest.mark.parametrize("path", ["/v2/models/{m}/config", "/v2/models/{m}/versions/1/config"])
def test_config_route_serves_the_document(v2: TestClient, path: str) -> None:
    op = get_operator("onnx.BitShift-11")
    response = v2.get(path.format(m=op.name))
    assert response.status_code == 200
    assert response.json() == model_info.model_config(op)


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/nope/config",
        f"/v2/models/{NOT}/versions/2/config",
        "/v2/models/nope/stats",
        f"/v2/models/{NOT}/versions/2/stats",
    ],
)
def test_unknown_model_or_version_is_404(v2: TestClient, path: str) -> None:
    response = v2.get(path)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_stats_routes_count_what_was_served(v2: TestClient) -> None:
    before = v2.get(f"/v2/models/{NOT}/stats").json()["model_stats"][0]
    for _ in range(2):
        assert infer_binary(v2, NOT, {"InputTensor": np.zeros(4, np.uint8)}).status_code == 200
    every = v2.get("/v2/models/stats").json()["model_stats"]
    assert [entry["name"] for entry in every] == NAMES
    one = v2.get(f"/v2/models/{NOT}/versions/1/stats").json()["model_stats"]
    assert one == [every[NAMES.index(NOT)]]
    success = one[0]["inference_stats"]["success"]["count"]
    assert success == before["inference_stats"]["success"]["count"] + 2
    assert one[0]["last_inference"] >= before["last_inference"]
