"""The status → exception mapping, the fields it carries, and ``__str__`` on odd bodies."""

from __future__ import annotations

import inspect

import httpx
import pytest
from fake_server import FakeServer, json_error

import tensorbits_client
from tensorbits_client import (
    APIConnectionError,
    APIError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    InternalServerError,
    LocalValidationError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RateLimitError,
    TensorbitsClientError,
    UnprocessableEntityError,
    _exceptions,
)
from tensorbits_client._base import status_error_class


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (403, APIStatusError),
        (404, NotFoundError),
        (409, APIStatusError),
        (413, PayloadTooLargeError),
        (422, UnprocessableEntityError),
        (429, RateLimitError),
        (500, InternalServerError),
        (502, InternalServerError),
        (503, OverloadedError),
        (599, InternalServerError),
    ],
)
def test_status_maps_to_class(status: int, cls: type[APIStatusError]) -> None:
    assert status_error_class(status) is cls


def test_tree() -> None:
    assert issubclass(OverloadedError, InternalServerError)
    assert issubclass(APITimeoutError, APIConnectionError)
    assert issubclass(APIConnectionError, APIError)
    assert issubclass(APIStatusError, APIError)
    assert issubclass(APIError, TensorbitsClientError)
    assert issubclass(LocalValidationError, TensorbitsClientError)
    assert issubclass(LocalValidationError, ValueError)
    assert not issubclass(LocalValidationError, APIError)


def test_every_exception_is_exported_and_documented() -> None:
    classes = {
        name
        for name, obj in inspect.getmembers(_exceptions, inspect.isclass)
        if issubclass(obj, TensorbitsClientError)
    }
    assert classes == set(_exceptions.__all__)
    assert classes <= set(tensorbits_client.__all__)
    for name in classes:
        cls = getattr(_exceptions, name)
        assert cls.__doc__, name
        assert name in (_exceptions.__doc__ or ""), f"{name} missing from the drawn tree"


def _error(response: httpx.Response) -> APIStatusError:
    server = FakeServer(lambda request: response)
    with (
        server.client(max_retries=0, local_validation=False) as client,
        pytest.raises(APIStatusError) as caught,
    ):
        client.infer("onnx.BitwiseNot-18", {"X": [1, 2]})
    return caught.value


def test_server_error_fields_are_kept() -> None:
    error = _error(
        json_error(
            400, "X: rank 9 is not supported", code="invalid_request", field="X", rule="rank"
        )
    )
    assert isinstance(error, BadRequestError)
    assert error.status_code == 400
    assert str(error) == error.message == "X: rank 9 is not supported"
    assert (error.code, error.field, error.rule) == ("invalid_request", "X", "rank")
    assert error.body == {
        "error": "X: rank 9 is not supported",
        "code": "invalid_request",
        "field": "X",
        "rule": "rank",
    }
    assert error.response.status_code == 400
    assert error.request.url.path == "/v2/models/onnx.BitwiseNot-18/infer"


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (httpx.Response(404), "HTTP 404 Not Found"),
        (
            httpx.Response(404, content=b"<html>gateway</html>"),
            "HTTP 404 Not Found: <html>gateway</html>",
        ),
        (httpx.Response(400, content=b"\xff\xfe\x00garbage"), "HTTP 400 Bad Request"),
        (httpx.Response(400, json=[1, 2, 3]), "HTTP 400 Bad Request"),
        (httpx.Response(400, json={"error": 5}), "HTTP 400 Bad Request"),
        (httpx.Response(400, json={"error": {"message": "nested"}}), "nested"),
        (httpx.Response(400, json={"detail": "fastapi style"}), "fastapi style"),
        (httpx.Response(400, json={"error": ""}), "HTTP 400 Bad Request"),
        (httpx.Response(422, json=None), "HTTP 422 Unprocessable Entity"),
        (
            httpx.Response(400, content=b"x", headers={"Content-Type": "text/plain; charset=nope"}),
            "HTTP 400 Bad Request",
        ),
    ],
)
def test_odd_bodies_never_break_str(response: httpx.Response, message: str) -> None:
    error = _error(response)
    text = str(error)
    assert text.startswith(message)
    assert repr(error)
    assert error.code is None or isinstance(error.code, str)


def test_str_never_raises_even_when_message_is_broken() -> None:
    class Weird:
        def __str__(self) -> str:
            raise RuntimeError("boom")

    error = TensorbitsClientError("x")
    error.message = Weird()  # type: ignore[assignment]
    assert str(error) == "TensorbitsClientError"


def test_raw_body_is_kept_when_not_json() -> None:
    error = _error(httpx.Response(502, content=b"upstream connect error"))
    assert isinstance(error, InternalServerError)
    assert error.body == "upstream connect error"


def test_timeout_becomes_api_timeout_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("too slow", request=request)

    with FakeServer(handler).client(max_retries=0) as client, pytest.raises(APITimeoutError):
        client.dml.bit_not([1, 2])


def test_connection_error_becomes_api_connection_error() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = FakeServer(handler).client(max_retries=0)
    with client, pytest.raises(APIConnectionError) as caught:
        client.dml.bit_not([1, 2])
    assert not isinstance(caught.value, APITimeoutError)
    assert "refused" in str(caught.value)


def test_real_timeout_against_a_silent_socket() -> None:
    """A socket that accepts and never answers: the read timeout fires, retries are not taken."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        client = tensorbits_client.Client(
            f"http://127.0.0.1:{port}", timeout=0.2, max_retries=0, local_validation=False
        )
        with client, pytest.raises(APITimeoutError):
            client.infer("onnx.BitwiseNot-18", {"X": [1]})
