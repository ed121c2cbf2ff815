"""The app's OpenAPI document, made to say what the app answers.

FastAPI documents its own routes only. The hot routes are plain ASGI routes (``FastRoute``,
``api/fastpath.py``) that carry their operation as data (``Operation``); each is written out here
beside FastAPI's, in the same terms (path parameters, ``responses`` with a model giving a JSON
body), and the models they name become component schemas as FastAPI's do.

FastAPI also documents a 422 "Validation Error" (with its own error schema) on every route that
has parameters, but ``api/errors.py`` answers a request that fails validation with 400 and the
protocol's error body (``ErrorResponse``), as the Open Inference Protocol says: each 422 becomes
that 400 (with the real error bodies of ``v2_openapi.ERROR_EXAMPLES`` as its examples), and
FastAPI's error schemas go.

The document is made once, when first asked for.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.openapi.models import OpenAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from tensorbits.api.fastpath import FastRoute
from tensorbits.api.v2_openapi import ERROR_DESCRIPTIONS, error_body

FASTAPI_ERROR_SCHEMAS = ("HTTPValidationError", "ValidationError")
# Where FastAPI puts the models' schemas, and how it refers to them.
REF_TEMPLATE = "#/components/schemas/{model}"


def answer_validation_with_400(document: dict[str, Any]) -> None:
    """Rewrite ``document`` in place: no 422 responses, a 400 where one stood."""
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            if responses.pop("422", None) is not None:
                responses.setdefault(
                    "400", {"description": ERROR_DESCRIPTIONS[400], "content": error_body(400)}
                )
    schemas = document.get("components", {}).get("schemas", {})
    for name in FASTAPI_ERROR_SCHEMAS:
        schemas.pop(name, None)
    text = json.dumps(document)
    missing = [n for n in FASTAPI_ERROR_SCHEMAS if f"#/components/schemas/{n}" in text]
    if missing or "ErrorResponse" not in schemas:
        raise RuntimeError(f"OpenAPI rewrite left dangling schema references: {missing}")


def _models(route: FastRoute) -> Iterable[type[BaseModel]]:
    operation = route.operation
    if operation.response_model is not None:
        yield operation.response_model
    for response in operation.responses.values():
        if "model" in response:
            yield response["model"]


def _path_parameter(name: str, description: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    # As FastAPI writes a ``str`` path parameter declared with
    # ``Path(description=..., json_schema_extra=extra)``.
    title = name.replace("_", " ").title()
    schema = {"type": "string", **copy.deepcopy(dict(extra)), "title": title}
    schema["description"] = description
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _operation(route: FastRoute, refs: dict[type[BaseModel], Any]) -> dict[str, Any]:
    operation = route.operation
    extra = copy.deepcopy(dict(operation.openapi_extra))
    parameters = [
        _path_parameter(
            n, operation.path_parameters[n], operation.path_parameter_schemas.get(n, {})
        )
        for n in route.param_convertors
    ]
    parameters += extra.pop("parameters", [])
    responses: dict[str, Any] = {}
    for status, given in operation.responses.items():
        response = copy.deepcopy({k: v for k, v in given.items() if k != "model"})
        model = given.get("model")
        if str(status) == "200" and operation.response_model is not None:
            model = operation.response_model
        if model is not None:  # the model's schema, beside what the response says of the body
            content = response.setdefault("content", {})
            content["application/json"] = {
                "schema": refs[model],
                **content.get("application/json", {}),
            }
        responses[str(status)] = response
    return {
        "tags": list(operation.tags),
        "summary": operation.summary,
        "operationId": operation.operation_id,
        **({"parameters": parameters} if parameters else {}),
        **extra,
        "responses": responses,
    }


def _as_fastapi_writes(
    paths: dict[str, Any], schemas: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``paths`` and ``schemas`` put through what FastAPI puts its document through last (its
    models of OpenAPI, then the encoder, which drops every null, a ``"default": null`` too)."""
    fragment = OpenAPI(
        openapi="3.1.0",
        info={"title": "", "version": ""},
        paths=paths,
        components={"schemas": schemas},
    )
    written = jsonable_encoder(fragment, by_alias=True, exclude_none=True)
    return written.get("paths", {}), written.get("components", {}).get("schemas", {})


def add_fast_routes(document: dict[str, Any], routes: Sequence[FastRoute]) -> None:
    """Add to ``document``, in place, the operations of ``routes`` (first: they are matched
    first) and the component schemas of the models they name, written as FastAPI writes its
    own: a schema FastAPI has under the same name must be the same."""
    models = list(dict.fromkeys(m for route in routes for m in _models(route)))
    keys, top = models_json_schema(
        [(m, "serialization") for m in models], ref_template=REF_TEMPLATE
    )
    refs = {m: keys[(m, "serialization")] for m in models}
    new_schemas: dict[str, Any] = top.get("$defs", {})
    for schema in new_schemas.values():
        if "description" in schema:  # FastAPI keeps a docstring's text up to a form feed
            schema["description"] = schema["description"].split("\f")[0]
    fast: dict[str, dict[str, Any]] = {}
    for route in routes:
        for method in sorted(route.methods or ()):
            if method != "HEAD":
                fast.setdefault(route.path, {})[method.lower()] = _operation(route, refs)
    fast, new_schemas = _as_fastapi_writes(fast, new_schemas)

    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    for name, schema in new_schemas.items():
        if schemas.setdefault(name, schema) != schema:
            raise RuntimeError(f"two different OpenAPI component schemas named {name}")
    document["components"]["schemas"] = dict(sorted(schemas.items()))
    paths: dict[str, dict[str, Any]] = {}
    for path, operations in [*fast.items(), *document.get("paths", {}).items()]:
        merged = paths.setdefault(path, {})
        if merged.keys() & operations.keys():
            raise RuntimeError(f"two OpenAPI operations for one method of {path}")
        merged.update(operations)
    document["paths"] = paths


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` (and so /openapi.json and /docs) return the whole document: FastAPI's,
    the ``FastRoute`` operations of the app's route table, every 422 a 400."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = generate()  # generate() stores it in app.openapi_schema
            add_fast_routes(document, [r for r in app.routes if isinstance(r, FastRoute)])
            answer_validation_with_400(document)
        assert app.openapi_schema is not None
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
