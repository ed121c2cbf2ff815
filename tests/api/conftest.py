"""Apps shared by the in-process tests of a module: one per API with the default settings."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.inprocess import TestClient
from support.v1 import v1_client
from support.v2 import v2_client


@pytest.fixture(scope="module")
def v2() -> Iterator[TestClient]:
    """The app, default settings, for v2 requests (one per test module)."""
    with v2_client() as c:
        yield c


@pytest.fixture(scope="module")
def v1() -> Iterator[TestClient]:
    """The app, default settings, for /v1 batches (one per test module)."""
    with v1_client() as c:
        yield c
