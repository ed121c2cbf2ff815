"""The app's OpenAPI document, made to say what the app answers.

FastAPI documents a 422 "Validation Error" (with its own error schema) on every route that has
parameters, but ``api/errors.py`` answers a request that fails validation with 400 and the
protocol's error body (``ErrorResponse``), as the Open Inference Protocol says. The document is
rewritten once, when first generated: each 422 becomes that 400, and FastAPI's error schemas go.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI

from tensorbits.api.v2_openapi import ERROR_DESCRIPTIONS

FASTAPI_ERROR_SCHEMAS = ("HTTPValidationError", "ValidationError")
_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}


def answer_validation_with_400(document: dict[str, Any]) -> None:
    """Rewrite ``document`` in place: no 422 responses, a 400 where one stood."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault(
                    "400", {"description": ERROR_DESCRIPTIONS[400], "content": _ERROR_BODY}
                )
    schemas = document.get("components", {}).get("schemas", {})
    for name in FASTAPI_ERROR_SCHEMAS:
        schemas.pop(name, None)
    text = json.dumps(document)
    missing = [n for n in FASTAPI_ERROR_SCHEMAS if f"#/components/schemas/{n}" in text]
    if missing or "ErrorResponse" not in schemas:
        raise RuntimeError(f"OpenAPI rewrite left dangling schema references: {missing}")


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and so /openapi.json and /docs) return the rewritten document."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            answer_validation_with_400(generate())  # generate() stores it in app.openapi_schema
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
