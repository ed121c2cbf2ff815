"""The committed openapi/openapi.json is exactly what the app generates (run ``make openapi``
after changing a route or a wire model), it documents what the v2 routes promise, the routes
served ahead of FastAPI are documented from their one registration, and what /docs offers works:
the model parameter lists the operators, every request example runs, every error example is what
the server answers."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.openapi.utils import get_openapi
from support.inprocess import app_client

from tensorbits.api import routers, v1
from tensorbits.config.settings import Settings
from tensorbits.core.admission import Admission
from tensorbits.server.app import create_app
from tensorbits_protocol.errors import STATUSES, Overloaded
from tensorbits_protocol.operators import OPERATORS
from tensorbits_protocol.v1 import BatchRequest
from tensorbits_protocol.v2 import ErrorResponse

ROOT = Path(__file__).resolve().parents[2]


def _exporter() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "export_openapi", ROOT / "scripts" / "export_openapi.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated() -> str:
    text: str = _exporter().render()
    return text


def test_committed_spec_is_up_to_date(generated: str) -> None:
    committed = (ROOT / "openapi" / "openapi.json").read_text(encoding="utf-8")
    assert json.loads(committed) == json.loads(generated), (
        "openapi/openapi.json differs from create_app().openapi(): run `make openapi`"
    )
    assert committed == generated, "openapi/openapi.json is not formatted by the exporter"


def test_v2_routes_are_documented(generated: str) -> None:
    paths: dict[str, Any] = json.loads(generated)["paths"]
    for path in (
        "/v2",
        "/v2/health/live",
        "/v2/health/ready",
        "/v2/repository/index",
        "/v2/models/{model}",
        "/v2/models/{model}/ready",
        "/v2/models/{model}/infer",
        "/v2/models/{model}/versions/{version}/infer",
    ):
        assert path in paths, path
    infer = paths["/v2/models/{model}/infer"]["post"]
    body = infer["requestBody"]["content"]
    # The request schema is written out whole (no dangling $defs references).
    assert "$ref" not in json.dumps(body["application/json"]["schema"])
    assert body["application/json"]["schema"]["properties"]["inputs"]["type"] == "array"
    assert "application/octet-stream" in body
    assert set(infer["responses"]) >= {"200", "400", "404", "413", "503"}
    assert "Inference-Header-Content-Length" in infer["responses"]["200"]["headers"]
    headers = [p["name"] for p in infer["parameters"] if p["in"] == "header"]
    assert headers == ["Inference-Header-Content-Length"]


def test_the_document_lists_the_400_the_app_answers_not_fastapis_422(generated: str) -> None:
    document = json.loads(generated)
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (method, path)
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert "ValidationError" not in schemas
    metadata = document["paths"]["/v2/models/{model}"]["get"]["responses"]
    assert metadata["400"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ErrorResponse"
    }


def test_the_routes_ahead_of_the_framework_are_registered_once(generated: str) -> None:
    app = create_app(Settings(backend="numpy"))
    # FastAPI documents none of them: no FastAPI twin route declares them.
    framework = get_openapi(title="t", version="0", routes=app.routes)["paths"]
    document = json.loads(generated)
    for route in routers.FAST_ROUTES:
        assert route.path not in framework, route.path
        assert route in app.routes  # the same route object, in the framework's route table
        assert route.methods is not None, route.path
        (method,) = route.methods
        operation = document["paths"][route.path][method.lower()]
        assert operation["operationId"] == route.operation.operation_id
        parameters = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
        assert parameters == list(route.param_convertors)
    assert [r.operation.operation_id for r in routers.FAST_ROUTES] == [
        "model_infer",
        "model_version_infer",
        "v1_batch",
    ]
    ok = document["paths"]["/v2/models/{model}/infer"]["post"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/InferenceResponse"
    }
    assert {"InferenceResponse", "ErrorResponse"} <= set(document["components"]["schemas"])


# --- what /docs offers: lists, runnable examples, real error bodies ------------------------------
def _json_body(operation: dict[str, Any]) -> dict[str, Any]:
    media: dict[str, Any] = operation["requestBody"]["content"]["application/json"]
    return media


def test_the_model_parameter_lists_the_operators_on_every_route(generated: str) -> None:
    names = [op.name for op in OPERATORS]
    document = json.loads(generated)
    seen = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path" and parameter["name"] in ("model", "version"):
                    seen[(method, path, parameter["name"])] = parameter
    models = {k: p for k, p in seen.items() if k[2] == "model"}
    assert len(models) >= 6, models  # metadata, ready, both infers, load, unload ...
    # The fast routes' parameters are written as FastAPI writes its own: one schema for both.
    assert len({json.dumps(p, sort_keys=True) for p in models.values()}) == 1, models
    assert next(iter(models.values()))["schema"]["enum"] == names
    versions = [p for k, p in seen.items() if k[2] == "version"]
    assert versions
    assert all(p["schema"]["enum"] == ["1"] for p in versions)


def test_every_infer_example_runs_on_every_model_it_names(generated: str) -> None:
    document = json.loads(generated)
    examples = _json_body(document["paths"]["/v2/models/{model}/infer"]["post"])["examples"]
    fits = {name: example for example in examples.values() for name in _fits(example)}
    # Every operator has exactly one example, and the first fits the first model of the list.
    assert sorted(fits) == sorted(op.name for op in OPERATORS)
    assert sum(len(_fits(e)) for e in examples.values()) == len(OPERATORS)
    assert OPERATORS[0].name in _fits(next(iter(examples.values())))
    with app_client() as client:
        for name, example in fits.items():
            for path in (f"/v2/models/{name}/infer", f"/v2/models/{name}/versions/1/infer"):
                answer = client.post(path, json=example["value"])
                assert answer.status_code == 200, (path, answer.text)
                assert answer.json()["model_name"] == name


def _fits(example: dict[str, Any]) -> list[str]:
    names: str = example["summary"].split(": ", 1)[1]
    return names.split(", ")


def test_the_batch_json_examples_run_as_they_are(generated: str) -> None:
    operation = json.loads(generated)["paths"]["/v1/batch"]["post"]
    content = operation["requestBody"]["content"]
    assert list(content) == ["application/json", "application/octet-stream"]
    assert content["application/json"]["schema"]["title"] == "BatchRequest"
    assert "$ref" not in json.dumps(content["application/json"]["schema"])
    expected = {"bit_not": b"\xff" * 16, "not_then_count": b"\x08" * 16}
    with app_client() as client:
        for name, example in content["application/json"]["examples"].items():
            BatchRequest.model_validate(example["value"])
            answer = client.post("/v1/batch", json=example["value"])
            assert answer.status_code == 200, (name, answer.text)
            length = int(answer.headers["Inference-Header-Content-Length"])
            header = json.loads(answer.content[:length])
            assert [o["name"] for o in header["outputs"]] == example["value"]["outputs"]
            assert answer.content[length:] == expected[name]


def _error_examples(document: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    found = {}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                media = response.get("content", {}).get("application/json", {})
                if media.get("schema") == {"$ref": "#/components/schemas/ErrorResponse"}:
                    found[(method, path, status)] = media
    return found


def test_every_error_body_has_real_examples(generated: str) -> None:
    document = json.loads(generated)
    bodies = _error_examples(document)
    assert ("post", "/v1/batch", "400") in bodies
    assert ("post", "/v2/models/{model}/infer", "404") in bodies
    missing = {where for where, media in bodies.items() if not media.get("examples")}
    assert not missing, missing
    for where, media in bodies.items():
        for example in media.get("examples", {}).values():
            body = ErrorResponse.model_validate(example["value"])
            assert body.error != "string"
            assert body.code in ERROR_CODES[int(where[2])], where


# The codes each documented status may carry: those of the error classes with that status.
ERROR_CODES = {
    status: {cls.code for cls, (http, _) in STATUSES.items() if http == status}
    for status in (400, 404, 413, 503)
}
# The first documented batch (its own test runs it), without its id: the base of the refusals.
BATCH = {k: v for k, v in v1._BATCH_EXAMPLES["bit_not"]["value"].items() if k != "id"}


def _batch(*, buffer: str = "zeros", byte_size: int = 16) -> dict[str, Any]:
    """BATCH, its input bound to ``buffer``, its first buffer ``byte_size`` bytes."""
    batch: dict[str, Any] = json.loads(json.dumps(BATCH))
    batch["dispatches"][0]["bindings"]["InputTensor"]["buffer"] = buffer
    batch["buffers"][0]["byte_size"] = byte_size
    return batch


_INPUT = {"name": "A", "shape": [2], "datatype": "UINT8", "data": [1, 2]}
# The request behind each documented error example: (path, body, example's status and name).
ERROR_REQUESTS: list[tuple[str, Any, tuple[int, str]]] = [
    (
        "/v2/models/onnx.BitwiseAnd-18/infer",
        {"inputs": [{**_INPUT, "datatype": "FP32"}, {**_INPUT, "name": "B", "datatype": "FP32"}]},
        (400, "datatype"),
    ),
    (
        "/v2/models/onnx.BitwiseAnd-18/infer",
        {"inputs": [_INPUT, {**_INPUT, "name": "B", "shape": [3], "data": [1, 2, 3]}]},
        (400, "broadcast"),
    ),
    ("/v2/models/sha256/infer", {"inputs": [_INPUT]}, (404, "unknown_operator")),
    (
        "/v2/models/onnx.BitwiseAnd-18/infer",
        {
            "inputs": [
                {
                    "name": "A",
                    "shape": [2**40, 2**40],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": 1},
                }
            ]
        },
        (413, "max_tensor_elements"),
    ),
    ("/v1/batch", _batch(buffer="zz"), (400, "unknown_buffer")),
    ("/v1/batch", b"{", (400, "json")),
    ("/v1/batch", _batch(byte_size=2**62), (413, "max_temporary_bytes")),
]


def test_the_error_examples_are_what_the_server_answers(generated: str) -> None:
    bodies = _error_examples(json.loads(generated))
    with app_client() as client:
        for path, body, (status, name) in ERROR_REQUESTS:
            documented = "/v1/batch" if path == "/v1/batch" else "/v2/models/{model}/infer"
            example = bodies[("post", documented, str(status))]["examples"][name]["value"]
            if isinstance(body, bytes):
                answer = client.post(path, content=body)
            else:
                answer = client.post(path, json=body)
            assert answer.status_code == status, answer.text
            assert answer.json() == example
        # 400 of the readiness routes: what an unloaded model's readiness answers.
        name = OPERATORS[0].name
        assert client.post(f"/v2/repository/models/{name}/unload").status_code == 200
        example = bodies[("get", "/v2/models/{model}/ready", "400")]["examples"]["model_unloaded"]
        answer = client.get(f"/v2/models/{name}/ready")
        assert (answer.status_code, answer.json()) == (400, example["value"])
    # 503: what admission says when the requests in flight are at the default bound.
    bound = Settings().max_inflight_requests
    admission = Admission(max_bytes=1 << 30, max_requests=bound, requests_in_flight=bound)
    with pytest.raises(Overloaded) as refused:
        admission.acquire(1)
    example = bodies[("post", "/v2/models/{model}/infer", "503")]["examples"]["overloaded"]
    assert refused.value.to_dict() == example["value"]
