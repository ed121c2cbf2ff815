"""GET /v1/operators and /v1/operators/{name}: the rule tables a client rebuilds the registry from."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.inprocess import TestClient
from support.v1 import v1_client

from tensorbits_protocol import catalog
from tensorbits_protocol.operators import OPERATORS, REGISTRY


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v1_client() as c:
        yield c


def test_lists_all_eighteen_with_their_tables(client: TestClient) -> None:
    response = client.get("/v1/operators")
    assert response.status_code == 200
    body = response.json()
    assert [o["name"] for o in body["operators"]] == [op.name for op in OPERATORS]
    assert body == catalog.listing().model_dump(mode="json")
    assert catalog.registry_from_wire(body) == REGISTRY


def test_bit_count_entry(client: TestClient) -> None:
    body = client.get("/v1/operators/DML_OPERATOR_ELEMENT_WISE_BIT_COUNT").json()
    assert body["inputs"] == ["InputTensor"]
    assert body["output"] == "OutputTensor"
    assert body["shape_rule"] == "identical"
    assert body["encoding"] == "native_bits"
    assert body["in_place"] == []
    assert body["allow_empty"] is False
    assert [(r["since"], r["min_rank"], r["max_rank"]) for r in body["support"]] == [
        ("4_1", 1, 8),
        ("3_0", 1, 8),
    ]
    assert body["support"][0]["input_types"] == [
        "FP64", "FP32", "FP16", "INT64", "INT32", "INT16", "INT8", "UINT64", "UINT32", "UINT16", "UINT8",
    ]  # fmt: skip
    assert body["support"][1]["input_types"] == ["UINT8", "UINT16", "UINT32"]
    assert body["support"][0]["output_types"] == ["UINT8", "UINT32"]
    params = {p["name"]: p for p in body["parameters"]}
    assert params["feature_level"]["default"] == "6_4"
    assert params["feature_level"]["choices"][:3] == ["1_0", "2_0", "2_1"]
    assert params["output_datatype"] == {
        "name": "output_datatype",
        "type": "string",
        "choices": ["UINT8", "UINT32"],
        "default": "UINT8",
        "required": False,
        "description": "data type of BIT_COUNT's OutputTensor",
    }


def test_shift_tables_keep_the_rank_four_row(client: TestClient) -> None:
    body = client.get("/v1/operators/DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT").json()
    assert body["support"][-1] == {
        "since": "2_1", "min_rank": 4, "max_rank": 4,
        "input_types": ["UINT8", "UINT16", "UINT32"], "output_types": None,
    }  # fmt: skip
    assert body["in_place"] == ["ATensor", "BTensor"]


def test_onnx_and_openvino_parameters(client: TestClient) -> None:
    shift = client.get("/v1/operators/onnx.BitShift-11").json()
    assert shift["parameters"] == [
        {"name": "direction", "type": "string", "choices": ["LEFT", "RIGHT"], "default": None,
         "required": True, "description": "shift direction"},
    ]  # fmt: skip
    assert shift["support"] == [
        {"since": None, "min_rank": 0, "max_rank": 8,
         "input_types": ["UINT8", "UINT16", "UINT32", "UINT64"], "output_types": None},
    ]  # fmt: skip
    ov = client.get("/v1/operators/openvino.BitwiseAnd-13").json()
    assert ov["shape_rule"] == "auto_broadcast"
    assert ov["allow_empty"] is True
    axis = next(p for p in ov["parameters"] if p["name"] == "axis")
    assert (axis["type"], axis["default"], axis["choices"]) == ("integer", -1, None)


def test_unknown_operator_is_404(client: TestClient) -> None:
    response = client.get("/v1/operators/onnx.BitwiseNand-18")
    assert response.status_code == 404
    assert "unknown model or operator 'onnx.BitwiseNand-18'" in response.json()["error"]


def test_openapi_documents_the_routes(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    batch = paths["/v1/batch"]["post"]
    assert batch["operationId"] == "v1_batch"
    assert "application/octet-stream" in batch["requestBody"]["content"]
    assert paths["/v1/operators"]["get"]["operationId"] == "v1_list_operators"
