"""A backend failure inside a dispatch (a simulated GPU out-of-memory: ``MemoryError``, which
CuPy's OutOfMemoryError subclasses) is a 503 JSON error naming the cause; the next request runs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.framing import HEADER, framed
from support.inprocess import TestClient
from support.reliability import small_client

from tensorbits.core.backends.numpy_backend import NumpyBackend


@pytest.fixture
def client() -> Iterator[TestClient]:
    with small_client() as c:
        yield c


@pytest.fixture
def oom_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The NumPy backend's ``run`` raises MemoryError on its next call only."""
    calls: list[int] = []
    real = NumpyBackend.run

    def run(self: NumpyBackend, *args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("simulated out of memory on device 0")
        real(self, *args, **kwargs)

    monkeypatch.setattr(NumpyBackend, "run", run)
    return calls


def v2_request(client: TestClient, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> Any:
    header = {
        "inputs": [
            {
                "name": n,
                "shape": list(x.shape),
                "datatype": "UINT32",
                "parameters": {"binary_data_size": x.nbytes},
            }
            for n, x in (("A", a), ("B", b))
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = framed(header, a.tobytes(), b.tobytes())
    return client.post("/v2/models/onnx.BitwiseAnd-18/infer", content=body, headers=headers)


def v1_request(client: TestClient, a: np.ndarray[Any, Any]) -> Any:
    n = a.size
    bind = {"datatype": "UINT32", "sizes": [n]}
    header = {
        "buffers": [
            {"name": "a", "byte_size": a.nbytes},
            {"name": "o", "byte_size": a.nbytes, "init": "zeros"},
        ],
        "dispatches": [
            {
                "operator": "DML_OPERATOR_ELEMENT_WISE_BIT_NOT",
                "bindings": {
                    "InputTensor": {"buffer": "a", "desc": bind},
                    "OutputTensor": {"buffer": "o", "desc": bind},
                },
            }
        ],
        "outputs": ["o"],
    }
    body, headers = framed(header, a.tobytes())
    return client.post("/v1/batch", content=body, headers=headers)


def _assert_oom_503(response: Any) -> None:
    assert response.status_code == 503, (response.status_code, response.text)
    body = response.json()
    assert isinstance(body["error"], str)
    assert "memory" in body["error"].lower()
    assert body["code"] == "backend_failure"


def test_rel_v2_backend_oom_is_503(client: TestClient, oom_once: list[int]) -> None:
    a = np.arange(64, dtype="<u4")
    b = np.full(64, 0xF0F0F0F0, dtype="<u4")
    _assert_oom_503(v2_request(client, a, b))


def test_rel_v2_backend_oom_then_next_request_succeeds(
    client: TestClient, oom_once: list[int]
) -> None:
    """Whatever the first answer, it is an error with a JSON body, and the server recovers: the
    admission is released and the next request is correct."""
    a = np.arange(64, dtype="<u4")
    b = np.full(64, 0xF0F0F0F0, dtype="<u4")
    first = v2_request(client, a, b)
    assert first.status_code >= 500
    assert isinstance(first.json()["error"], str)
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    assert runtime.plane.admission.bytes_in_flight == 0
    assert runtime.plane.admission.requests_in_flight == 0
    second = v2_request(client, a, b)
    assert second.status_code == 200, second.text
    n = int(second.headers[HEADER])
    np.testing.assert_array_equal(np.frombuffer(second.content[n:], "<u4"), a & b)


def test_rel_v1_backend_oom_is_503_then_recovers(client: TestClient, oom_once: list[int]) -> None:
    a = np.arange(64, dtype="<u4")
    _assert_oom_503(v1_request(client, a))
    runtime = client.app.state.runtime  # type: ignore[attr-defined]
    assert runtime.plane.admission.bytes_in_flight == 0
    assert runtime.plane.admission.requests_in_flight == 0
    second = v1_request(client, a)
    assert second.status_code == 200, second.text
    n = int(second.headers[HEADER])
    np.testing.assert_array_equal(np.frombuffer(second.content[n:], "<u4"), ~a)
