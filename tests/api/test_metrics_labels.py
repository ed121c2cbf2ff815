"""The route label of /metrics for what a mount serves: the docs page's static files (mounted by
fastapi-offline) are counted under the mount's template, not as "unmatched"."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.inprocess import TestClient
from support.v2 import v2_client

STATIC = "/static-offline-docs/{path}"


@pytest.fixture
def client() -> Iterator[TestClient]:
    with v2_client() as c:
        yield c


def _requests(client: TestClient) -> dict[tuple[str, str], float]:
    """tensorbits_requests_total by (route, status)."""
    text = client.get("/metrics").text
    return {
        (sample.labels["route"], sample.labels["status"]): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "tensorbits_requests_total"
    }


def test_docs_page_and_its_static_files_have_their_own_route_label(client: TestClient) -> None:
    page = client.get("/docs")
    assert page.status_code == 200
    # The assets the page itself links to, so the test follows fastapi-offline's mount path.
    assets = re.findall(r"""["'](/[^"']+\.(?:js|css))["']""", page.text)
    assert assets, page.text
    assert all(a.startswith("/static-offline-docs/") for a in assets)
    for asset in assets:
        assert client.get(asset).status_code == 200, asset
    assert client.get("/static-offline-docs/no-such-file.js").status_code == 404

    counts = _requests(client)
    assert counts[("/docs", "200")] == 1
    assert counts[(STATIC, "200")] == len(assets)
    assert counts[(STATIC, "404")] == 1  # a missing file under the mount is still the mount's
    assert not [key for key in counts if key[0] == "unmatched"]


def test_unmatched_paths_stay_unmatched(client: TestClient) -> None:
    assert client.get("/no/such/path").status_code == 404
    assert client.get("/static-offline-docsX/swagger-ui.css").status_code == 404
    counts = _requests(client)
    assert counts[("unmatched", "404")] == 2
    assert not [key for key in counts if key[0] == STATIC]
