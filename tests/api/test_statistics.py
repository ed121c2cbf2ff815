"""The statistics extension's counting (statistics.py): every request of a model moves its counts
by exactly one, successes and failures apart, on the v2 fast path (binary and JSON), and a /v1
batch counts each dispatch as an inference of its operator."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from support.inprocess import TestClient, runtime_of
from support.v1 import bind, data, post, v1_client, zeros
from support.v2 import AND, NOT, infer_binary, infer_json, statistics_counts

from tensorbits.core.statistics import Statistics
from tensorbits_protocol.operators import get_operator

XOR = "DML_OPERATOR_ELEMENT_WISE_BIT_XOR"


def _stats(client: TestClient) -> Statistics:
    return runtime_of(client).plane.statistics


def _counts(client: TestClient, model: str) -> tuple[int, int, int, int]:
    return statistics_counts(_stats(client).model_stats(model))


def test_v2_successes_and_failures_count_exactly(v2: TestClient) -> None:
    before = _counts(v2, NOT)
    other = _counts(v2, AND)
    a = np.arange(16, dtype=np.uint8)
    for _ in range(3):
        assert infer_binary(v2, NOT, {"InputTensor": a}).status_code == 200
    assert infer_json(v2, NOT, {"InputTensor": a}).status_code == 200
    # Two failures of the model: a data type it does not take, a lying binary size.
    assert infer_json(v2, NOT, {"InputTensor": a.astype(bool)}).status_code == 400
    response = v2.post(
        f"/v2/models/{NOT}/infer",
        content=b'{"inputs":[{"name":"InputTensor","shape":[4],"datatype":"UINT8",'
        b'"parameters":{"binary_data_size":4}}]}',
        headers={"Inference-Header-Content-Length": "90"},
    )
    assert response.status_code == 400
    after = _counts(v2, NOT)
    assert after == (before[0] + 4, before[1] + 2, before[2] + 4, before[3] + 4)
    assert _counts(v2, AND) == other  # no other model moved


def test_v2_durations_and_last_inference(v2: TestClient) -> None:
    a = np.arange(16, dtype=np.uint8)
    assert infer_binary(v2, AND, {"A": a, "B": a}).status_code == 200
    entry = _stats(v2).model_stats(AND)
    stats = entry["inference_stats"]
    phases = [stats[k]["ns"] for k in ("compute_input", "compute_infer", "compute_output")]
    assert all(ns > 0 for ns in phases)
    assert stats["queue"] == {"count": stats["success"]["count"], "ns": 0}
    assert stats["success"]["ns"] >= sum(phases)
    assert entry["last_inference"] > 1_700_000_000_000  # milliseconds since the epoch
    assert entry["version"] == "1"


def test_unknown_model_counts_nowhere(v2: TestClient) -> None:
    before = _stats(v2).response([get_operator(NOT), get_operator(AND)])
    assert v2.post("/v2/models/nope/infer", content=b"{}").status_code == 404
    assert _stats(v2).response([get_operator(NOT), get_operator(AND)]) == before


def _xor_then_not(repeat: int) -> tuple[dict[str, Any], bytes]:
    decl, raw = data("a", np.arange(16, dtype=np.uint8))
    t = bind("a", "UINT8", [16])
    dispatches = [
        {"operator": XOR, "bindings": {"ATensor": t, "BTensor": t, "OutputTensor": t}}
    ] * repeat + [{"operator": NOT, "bindings": {"InputTensor": t, "OutputTensor": t}}]
    return {"buffers": [decl], "dispatches": dispatches, "outputs": ["a"]}, raw


@pytest.mark.parametrize("repeat", [1, 3])
def test_v1_batch_counts_each_dispatch(v1: TestClient, repeat: int) -> None:
    before_xor, before_not = _counts(v1, XOR), _counts(v1, NOT)
    header, raw = _xor_then_not(repeat)
    assert post(v1, header, raw).status_code == 200
    assert _counts(v1, XOR)[0] == before_xor[0] + repeat
    assert _counts(v1, XOR)[2] == before_xor[2] + repeat
    assert _counts(v1, NOT)[0] == before_not[0] + 1


def test_statistics_batch_shares_time_out() -> None:
    stats = Statistics([XOR, NOT])
    stats.record_batch([XOR, XOR, XOR, NOT], 0, 400, 800, 40, 2000)
    xor, no = stats.model_stats(XOR)["inference_stats"], stats.model_stats(NOT)["inference_stats"]
    assert xor["success"] == {"count": 3, "ns": 1500}
    assert no["success"] == {"count": 1, "ns": 500}
    assert (xor["compute_infer"]["ns"], no["compute_infer"]["ns"]) == (600, 200)
    stats.record_batch_failure([XOR, NOT], 100)
    assert stats.model_stats(XOR)["inference_stats"]["fail"] == {"count": 1, "ns": 50}
    assert stats.model_stats(NOT)["last_inference"] > 0


def test_v1_batch_refused_after_planning_counts_each_dispatch_as_failed() -> None:
    # Planned fine (a 1 MiB zero-filled buffer is within the body limit), refused by the
    # admission's bound: the buffer and the response together pass it.
    size = 1 << 20
    with v1_client(max_body_bytes=size, max_inflight_bytes=size) as client:
        t = bind("z", "UINT8", [size])
        header = {
            "buffers": [zeros("z", size)],
            "dispatches": [{"operator": NOT, "bindings": {"InputTensor": t, "OutputTensor": t}}]
            * 2,
            "outputs": ["z"],
        }
        before = _counts(client, NOT)
        response = post(client, header)
        assert response.status_code == 413, response.text
        assert response.json()["rule"] == "max_inflight_bytes"
        assert _counts(client, NOT) == (before[0], before[1] + 2, before[2], before[3])


def test_other_workers_snapshots_add_up() -> None:
    mine, theirs = Statistics([NOT]), Statistics([NOT])
    mine.record(NOT, 0, 1, 2, 3, 10)
    theirs.record(NOT, 0, 10, 20, 30, 100, inferences=2)
    theirs.record_failure(NOT, 7)
    published = json.loads(json.dumps(theirs.snapshot()))  # as a worker publishes it
    (entry,) = mine.response([get_operator(NOT)], others=[published, {"unknown": [1]}])[
        "model_stats"
    ]
    stats = entry["inference_stats"]
    assert stats["success"] == {"count": 3, "ns": 110}
    assert stats["fail"] == {"count": 1, "ns": 7}
    assert stats["compute_infer"] == {"count": 3, "ns": 22}
    assert entry["inference_count"] == 3
    assert entry["last_inference"] == max(
        mine.model_stats(NOT)["last_inference"], theirs.model_stats(NOT)["last_inference"]
    )
    assert mine.response([get_operator(NOT)]) != mine.response(
        [get_operator(NOT)], others=[published]
    )
