"""Schemathesis against the app's own OpenAPI, in process: every operation whose request body is
JSON (or that has none) gets generated requests, valid and invalid, and must never answer 5xx.

``/v1/batch`` is excluded: its body is ``application/octet-stream`` (a JSON header with a length
in an HTTP header, then raw bytes), which JSON Schema cannot describe; test_fuzz_v1.py covers
it. The v2 infer routes are included through their JSON form (``application/json``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis import Case  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from support.inprocess import TestClient  # noqa: E402
from support.reliability import SMALL_LIMITS  # noqa: E402

from tensorbits.config.settings import Settings  # noqa: E402
from tensorbits.server.app import create_app  # noqa: E402

APP = create_app(Settings(backend="numpy", cpu_threads=2, **SMALL_LIMITS))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(path="/v1/batch")
EXAMPLES = int(os.environ.get("TENSORBITS_FUZZ_EXAMPLES", "25"))

pytestmark = pytest.mark.filterwarnings("ignore")


@pytest.fixture(scope="module", autouse=True)
def _lifespan() -> Iterator[None]:
    # Run the app's lifespan (backend, admission) once; schemathesis' ASGI calls then find it.
    with TestClient(APP):
        yield


@schema.parametrize()  # type: ignore[untyped-decorator]  # schemathesis types it a bare Callable
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_rel_schemathesis_no_server_error(case: Case[Any]) -> None:
    case.call_and_validate(checks=[not_a_server_error])
