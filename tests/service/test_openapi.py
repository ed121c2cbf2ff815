"""The committed openapi/openapi.json is exactly what the app generates (run ``make openapi``
after changing a route or a wire model), it documents what the v2 routes promise, and the routes
served ahead of FastAPI are documented from their one registration."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.openapi.utils import get_openapi

from tensorbits.api import routers
from tensorbits.app import create_app
from tensorbits.config import Settings

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
        (method,) = route.methods or ()
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
