"""API keys, in process: every route of the app refuses a request without one of the configured
keys (401, JSON, WWW-Authenticate), accepts either header form, leaves the open paths open, logs a
refusal without the key, compares in constant time, and is not there at all without keys."""

from __future__ import annotations

import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import SecretStr, ValidationError
from starlette.routing import BaseRoute, Mount
from starlette.types import Message, Scope
from support.framing import framed
from support.inprocess import TestClient
from support.v2 import NOT, binary_input, v2_client

from tensorbits import auth
from tensorbits.api import routers
from tensorbits.auth import ApiKeyMiddleware
from tensorbits.config.settings import Settings
from tensorbits.server import cli
from tensorbits.server.app import create_app

KEY = "tb-key-0123456789abcdefghijklmnop"
OTHER_KEY = "tb-other-key-ZYXWVUTSRQPONMLKJI"
WRONG_SAME_LENGTH = "tb-key-0123456789abcdefghijklmnoX"[: len(KEY)]
WRONG_OTHER_LENGTH = "nope"
OPEN = ("/v2/health/live", "/v2/health/ready")
# Values for the path parameters of the route templates.
PARAMETERS = {
    "model": NOT,
    "name": NOT,
    "version": "1",
    "path": "swagger-ui.css",
    "region_name": "r",
}


# --- the routes, from the app itself --------------------------------------------------------------
def _walk(routes: Sequence[BaseRoute], prefix: str = "") -> Iterator[tuple[str, str]]:
    for route in routes:
        original = getattr(route, "original_router", None)  # FastAPI's included routers
        if original is not None:
            yield from _walk(list(original.routes))
        elif isinstance(route, Mount):
            yield "GET", route.path + "/{path}"
        else:
            path = getattr(route, "path", None)
            for method in sorted(getattr(route, "methods", None) or ()):
                if path is not None and method != "HEAD":
                    yield method, path


def app_routes() -> list[tuple[str, str]]:
    """(method, concrete path) of every route the app serves: the framework's (included
    routers, the docs, the OpenAPI document, the static docs assets, /metrics) and the ones the
    fast path serves ahead of it."""
    app = create_app(Settings(backend="numpy"))
    templates = set(_walk(list(app.routes))) | set(_walk(routers.FAST_ROUTES))
    return sorted({(method, _concrete(path)) for method, path in templates})


def _concrete(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda name: PARAMETERS[name.group(1)], template)


ROUTES = app_routes()
PROTECTED = [(m, p) for m, p in ROUTES if p not in OPEN]


def _ids(routes: list[tuple[str, str]]) -> list[str]:
    return [f"{m} {p}" for m, p in routes]


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with v2_client(api_keys=(KEY, OTHER_KEY)) as c:
        yield c


@pytest.fixture(scope="module")
def file_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    keys = tmp_path_factory.mktemp("secret") / "api-keys"
    keys.write_text(f"# rotated 2026-11\n\n  {OTHER_KEY}  \r\n{KEY}\n")
    with v2_client(api_keys_file=keys) as c:
        yield c


def _request(client: TestClient, method: str, path: str, headers: dict[str, str]) -> Any:
    return client.request(method, path, headers=headers)


def _assert_refused(response: Any, *, presented: bool) -> None:
    assert response.status_code == 401, response.text
    challenge = response.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="tensorbits"')
    assert ('error="invalid_token"' in challenge) is presented
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error", "code", "field", "rule"}
    assert (body["code"], body["field"], body["rule"]) == (
        "unauthorized",
        "Authorization",
        "api_key",
    )


def test_the_enumeration_sees_every_kind_of_route() -> None:
    """The parametrized tests below cover what the app serves, not a hand-made list."""
    app = create_app(Settings(backend="numpy"))
    documented = {
        (method.upper(), _concrete(path))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    assert documented <= set(ROUTES)
    for needed in [
        ("POST", f"/v2/models/{NOT}/infer"),
        ("POST", f"/v2/models/{NOT}/versions/1/infer"),
        ("POST", "/v1/batch"),
        ("GET", "/docs"),
        ("GET", "/openapi.json"),
        ("GET", "/metrics"),
        ("GET", "/static-offline-docs/swagger-ui.css"),
        *(("GET", p) for p in OPEN),
    ]:
        assert needed in ROUTES


@pytest.mark.parametrize(("method", "path"), PROTECTED, ids=_ids(PROTECTED))
def test_every_route_needs_a_key(client: TestClient, method: str, path: str) -> None:
    _assert_refused(_request(client, method, path, {}), presented=False)
    for wrong in (WRONG_SAME_LENGTH, WRONG_OTHER_LENGTH):
        bearer = _request(client, method, path, {"Authorization": f"Bearer {wrong}"})
        _assert_refused(bearer, presented=True)
        _assert_refused(_request(client, method, path, {"X-API-Key": wrong}), presented=True)
    # Another scheme, or none, is no key at all: the refusal says the scheme is what is missing.
    for value in (f"Basic {KEY}", KEY):
        unschemed = _request(client, method, path, {"Authorization": value})
        _assert_refused(unschemed, presented=False)
        assert unschemed.json()["error"] == auth.NO_SCHEME


@pytest.mark.parametrize(("method", "path"), PROTECTED, ids=_ids(PROTECTED))
def test_every_route_accepts_a_right_key_in_either_header(
    client: TestClient, file_client: TestClient, method: str, path: str
) -> None:
    for key in (KEY, OTHER_KEY):
        for headers in ({"Authorization": f"Bearer {key}"}, {"X-API-Key": key}):
            assert _request(client, method, path, headers).status_code != 401, headers
            assert _request(file_client, method, path, headers).status_code != 401, headers
    if path.endswith("/unload"):
        # An unload is state on these module-wide servers (the repository extension): load the
        # model again, or the module's later inferences of it are refused.
        load = path.removesuffix("unload") + "load"
        for server in (client, file_client):
            assert server.post(load, headers={"X-API-Key": KEY}).status_code == 200


@pytest.mark.parametrize("path", OPEN)
def test_the_health_routes_stay_open(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 200
    assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 200


def test_a_key_serves_real_work(client: TestClient) -> None:
    data = np.arange(16, dtype=np.uint8)
    header = {
        "inputs": [binary_input("InputTensor", data)],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, data.tobytes())
    headers["X-API-Key"] = KEY
    response = client.post(f"/v2/models/{NOT}/infer", content=body, headers=headers)
    assert response.status_code == 200
    offset = int(response.headers["inference-header-content-length"])
    np.testing.assert_array_equal(np.frombuffer(response.content[offset:], np.uint8), ~data)


def test_the_bearer_scheme_is_case_insensitive_and_bearer_wins(client: TestClient) -> None:
    for scheme in ("bearer", "BEARER", "Bearer"):
        headers = {"Authorization": f"{scheme}  {KEY} "}
        assert client.get("/v2", headers=headers).status_code == 200
    # A Bearer token is the credential when there is one: a right X-API-Key does not rescue it.
    both = {"Authorization": "Bearer wrong", "X-API-Key": KEY}
    _assert_refused(client.get("/v2", headers=both), presented=True)


def test_metrics_can_be_opened_and_the_open_list_is_exact() -> None:
    with v2_client(api_keys=KEY, auth_open_paths="/v2/health/live,/metrics") as c:
        assert c.get("/metrics").status_code == 200
        assert c.get("/v2/health/live").status_code == 200
        _assert_refused(c.get("/v2/health/ready"), presented=False)
        _assert_refused(c.get("/v2/health/live/"), presented=False)  # exact paths only
    with v2_client(api_keys=KEY, auth_open_paths="") as c:
        _assert_refused(c.get("/v2/health/live"), presented=False)


def test_refusals_are_counted_in_the_metrics(client: TestClient) -> None:
    _assert_refused(client.get("/v1/operators"), presented=False)
    text = client.get("/metrics", headers={"X-API-Key": KEY}).text
    refused = [
        line
        for line in text.splitlines()
        if line.startswith("tensorbits_requests_total{") and 'status="401"' in line
    ]
    assert refused, text
    assert float(refused[0].rsplit(" ", 1)[1]) >= 1


# --- the comparison -----------------------------------------------------------------------------
def test_every_key_is_compared_with_compare_digest_every_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    # The middleware calls compare_digest through the hmac module: patched there, it counts.
    monkeypatch.setattr(hmac, "compare_digest", counting)
    keys = [KEY, OTHER_KEY, "tb-third-key-abcdefghijklmnopqrs"]
    with v2_client(api_keys=",".join(keys)) as c:
        for presented, status in [
            (WRONG_SAME_LENGTH, 401),
            (WRONG_OTHER_LENGTH, 401),
            (KEY, 200),  # matches the first key: the other two are compared all the same
            (keys[-1], 200),
        ]:
            calls.clear()
            assert c.get("/v2", headers={"X-API-Key": presented}).status_code == status
            assert len(calls) == len(keys), presented
            # Digests of one length, whatever the key's length: the time says nothing of it.
            assert {len(a) for a, _ in calls} == {len(b) for _, b in calls} == {32}
            assert len({b for _, b in calls}) == len(keys)


# --- logs ---------------------------------------------------------------------------------------
def test_a_refused_key_is_logged_without_the_key(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "tb-leaked-if-you-see-this-0123456789"
    with caplog.at_level(logging.DEBUG):
        _assert_refused(client.get("/v2", headers={"X-API-Key": secret}), presented=True)
        bearer = {"Authorization": f"Bearer {secret}"}
        _assert_refused(client.post("/v1/batch", headers=bearer), presented=True)
        assert client.get("/v2", headers={"X-API-Key": KEY}).status_code == 200
    refusals = [r for r in caplog.records if r.name == "tensorbits.auth"]
    assert len(refusals) == 2
    assert refusals[0].levelno == logging.WARNING
    assert getattr(refusals[0], "credential_header", None) == "X-API-Key"
    assert getattr(refusals[1], "credential_header", None) == "Authorization"
    for record in caplog.records:
        everything = record.getMessage() + json.dumps(record.__dict__, default=str)
        for key in (secret, KEY, secret[:12], secret[-12:]):
            assert key not in everything, record


def test_a_missing_key_is_logged_too(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tensorbits.auth"):
        _assert_refused(client.get("/v1/operators"), presented=False)
    (record,) = [r for r in caplog.records if r.name == "tensorbits.auth"]
    assert "no API key" in record.getMessage()
    assert "/v1/operators" in record.getMessage()


# --- the middleware as ASGI ---------------------------------------------------------------------
def _middleware(calls: list[Scope]) -> ApiKeyMiddleware:
    async def inner(scope: Scope, receive: Any, send: Any) -> None:
        calls.append(scope)

    return ApiKeyMiddleware(inner, keys=[SecretStr(KEY)], open_paths=OPEN)


async def _never_receive() -> Message:
    raise AssertionError("the body of a refused request was read")


def _recorded_sends() -> tuple[list[Message], Callable[[Message], Awaitable[None]]]:
    """An ASGI ``send`` that keeps every message, and the list it keeps them in."""
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    return sent, send


@pytest.mark.anyio
async def test_a_refusal_reads_no_body_and_reaches_nothing_behind_it() -> None:
    calls: list[Scope] = []
    sent, send = _recorded_sends()
    scope = {"type": "http", "method": "POST", "path": "/v1/batch", "headers": []}
    await _middleware(calls)(scope, _never_receive, send)
    assert calls == []
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 401
    headers = dict(sent[0]["headers"])
    assert int(headers[b"content-length"]) == len(sent[1]["body"])
    assert json.loads(sent[1]["body"])["code"] == "unauthorized"


@pytest.mark.anyio
async def test_a_websocket_without_a_key_is_closed_and_lifespan_passes() -> None:
    calls: list[Scope] = []
    sent, send = _recorded_sends()
    middleware = _middleware(calls)
    await middleware({"type": "websocket", "path": "/ws", "headers": []}, _never_receive, send)
    assert sent == [{"type": "websocket.close", "code": 1008}]
    assert calls == []
    await middleware({"type": "lifespan"}, _never_receive, send)
    assert len(calls) == 1


def test_the_middleware_needs_a_key() -> None:
    with pytest.raises(ValueError, match="at least one key"):
        ApiKeyMiddleware(lambda *a: None, keys=[], open_paths=())  # type: ignore[arg-type]


# --- without keys -------------------------------------------------------------------------------
def test_without_keys_nothing_is_installed_and_nothing_changes() -> None:
    app = create_app(Settings(backend="numpy"))
    # Middleware.cls is typed as a factory protocol, which mypy does not match to a class:
    # the classes are compared as objects.
    installed: list[object] = [m.cls for m in app.user_middleware]
    assert ApiKeyMiddleware not in installed
    keyed = create_app(Settings(backend="numpy", api_keys=KEY))
    classes: list[object] = [m.cls for m in keyed.user_middleware]
    # Outermost first: observability, then the keys, then everything that reads a request.
    assert classes.index(ApiKeyMiddleware) == 1
    with v2_client() as c:
        for method, path in ROUTES:
            response = c.request(method, path, headers={"Authorization": "Bearer anything"})
            assert response.status_code != 401, (method, path)
            assert "www-authenticate" not in response.headers


# --- settings -----------------------------------------------------------------------------------
def _keys(settings: Settings) -> list[str]:
    return [k.get_secret_value() for k in settings.accepted_api_keys]


def test_keys_come_from_the_variable_and_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TENSORBITS_API_KEYS", f" {KEY} , {OTHER_KEY},,")
    assert _keys(Settings()) == [KEY, OTHER_KEY]
    keys = tmp_path / "keys"
    keys.write_text(f"# a comment\n{OTHER_KEY}\n\n   \nfile-only-key\n")
    monkeypatch.setenv("TENSORBITS_API_KEYS_FILE", str(keys))
    assert _keys(Settings()) == [KEY, OTHER_KEY, "file-only-key"]  # both sources, once each
    monkeypatch.setenv("TENSORBITS_API_KEYS", "")
    assert _keys(Settings()) == [OTHER_KEY, "file-only-key"]
    monkeypatch.setenv("TENSORBITS_API_KEYS_FILE", "")
    assert _keys(Settings()) == []  # empty variables: no keys, no access control
    assert Settings().api_keys_file is None


def test_keys_stay_out_of_the_settings_repr() -> None:
    settings = Settings(api_keys=KEY, tls_key_password=None)
    assert KEY not in repr(settings)
    assert KEY not in str(settings.model_dump())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("", "holds no key"),
        ("# only a comment\n\n", "holds no key"),
        ("good-key\nbad key with spaces\n", "line 2 has a character"),
        ("good-key\nnon-ascii-ké\n", "line 2 has a character"),
    ],
)
def test_a_bad_key_file_is_a_start_up_error(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "keys"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValidationError, match=message) as caught:
        Settings(api_keys_file=path)
    assert str(path) in str(caught.value)
    assert "bad key" not in str(caught.value)
    assert "ké" not in str(caught.value)


def test_bad_keys_and_open_paths_are_refused() -> None:
    with pytest.raises(ValidationError, match="API key number 2 has a character") as caught:
        Settings(api_keys="good-key,bad\tkey")
    assert "bad\tkey" not in str(caught.value)
    with pytest.raises(ValidationError, match="does not begin with '/'"):
        Settings(auth_open_paths="/v2/health/live,metrics")


def test_serve_refuses_to_start_with_a_missing_key_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-file"
    monkeypatch.setenv("TENSORBITS_API_KEYS_FILE", str(missing))
    assert cli.main(["serve"]) == 2
    error = capsys.readouterr().err
    assert "invalid settings" in error
    assert f"TENSORBITS_API_KEYS_FILE {missing}: cannot read it" in error
