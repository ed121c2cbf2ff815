"""Helpers of the offline client tests: a fake server over ``httpx.MockTransport``."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from tensorbits_client import AsyncClient, Client
from tensorbits_protocol.catalog import listing

OPERATORS_BODY = listing().model_dump(mode="json")


@dataclass
class FakeServer:
    """Answers GET /v1/operators itself; every other request goes to ``handler``, in order."""

    handler: Callable[[httpx.Request], httpx.Response]
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/v1/operators"):
            return httpx.Response(200, json=OPERATORS_BODY)
        request.read()
        self.requests.append(request)
        return self.handler(request)

    def client(self, **options: Any) -> Client:
        http = httpx.Client(transport=httpx.MockTransport(self))
        return Client("http://tensorbits.test", http_client=http, **options)

    def async_client(self, **options: Any) -> AsyncClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self))
        return AsyncClient("http://tensorbits.test", http_client=http, **options)


def json_error(status: int, message: str, **fields: str) -> httpx.Response:
    headers = {"Retry-After": fields.pop("retry_after")} if "retry_after" in fields else {}
    body = {"error": message, **fields}
    return httpx.Response(status, content=json.dumps(body).encode(), headers=headers)
