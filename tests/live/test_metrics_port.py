"""The metrics port (``TENSORBITS_METRICS_PORT``) on a live server with API keys: ``/metrics``
there answers without a key, the same figures as the main port's (which wants a key), every
worker's summed with ``--workers 2``; nothing else is served on it."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import pytest
from support.live import free_port, serve, settled_metric_samples
from support.rawhttp import ask, read_response
from support.v2 import NOT

from tensorbits.api.metrics_endpoint import MAX_HEAD_BYTES

pytestmark = pytest.mark.integration

KEY = "tb-metrics-port-key-6c1e0d"


def _raw(port: int, head: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        return read_response(sock)


def _infer_request(data: np.ndarray[Any, Any]) -> bytes:
    tensor = {"name": "InputTensor", "shape": [data.size], "datatype": "UINT8"}
    body = json.dumps({"inputs": [{**tensor, "data": data.tolist()}]}).encode()
    return (
        f"POST /v2/models/{NOT}/infer HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@pytest.mark.parametrize("workers", [1, 2])
def test_metrics_port_serves_metrics_without_a_key(workers: int) -> None:
    metrics_port = free_port()
    env = {
        "TENSORBITS_API_KEYS": KEY,
        "TENSORBITS_METRICS_PORT": str(metrics_port),
        "TENSORBITS_WORKERS": str(workers),
    }
    with serve(env) as server:
        # The main port keeps its keys: /metrics and inference need one.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.base_url}/metrics", timeout=10)
        assert refused.value.code == 401
        refused.value.close()
        data = np.arange(8, dtype=np.uint8)
        for _ in range(6):  # a new connection each: with two workers, both get some
            reply = ask(server, _infer_request(data))
            assert reply.status == 200, reply.body[:300]
        key = (
            f'tensorbits_requests_total{{model="{NOT}",'
            'protocol="http",route="/v2/models/{model}/infer",status="200",version="1"}'
        )
        metrics_url = f"http://127.0.0.1:{metrics_port}"
        samples = settled_metric_samples(metrics_url, lambda s: s.get(key) == 6, 15)
        assert samples.get(key) == 6, {k: v for k, v in samples.items() if "requests" in k}
        assert samples[f'nv_inference_request_success{{model="{NOT}",version="1"}}'] == 6
        # Nothing but /metrics on that port.
        status, _, _ = _raw(metrics_port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert status == 404
        status, headers, _ = _raw(metrics_port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, headers.get("allow")) == (405, "GET, HEAD")
        status, _, _ = _raw(
            metrics_port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n"
        )
        assert status == 431


def test_metrics_port_taken_is_reported_before_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with serve({"TENSORBITS_METRICS_PORT": str(port)}, ready=None, stderr=-1) as server:
            _, stderr = server.proc.communicate(timeout=60)
    assert server.proc.returncode == 1
    assert b"TENSORBITS_METRICS_PORT" in stderr


def _status_of(port: int, head: bytes) -> int | None:
    """The status a raw ``head`` is answered with, or None when the server closed the
    connection with no answer (or gave none within the socket's timeout)."""
    try:
        status, _, _ = _raw(port, head)
    except (TimeoutError, ConnectionError, ValueError):
        return None
    return status


def test_metrics_port_reads_requests_as_the_main_port_does() -> None:
    metrics_port = free_port()
    with serve({"TENSORBITS_METRICS_PORT": str(metrics_port)}) as server:
        # Lines ended by a bare LF (curl does not send them; hand-written probes do): answered
        # at once, as the main port answers them, never left to the read timeout.
        main = _status_of(server.port, b"GET /v2/health/live HTTP/1.1\nHost: x\n\n")
        assert main is not None
        bare_lf = _status_of(metrics_port, b"GET /metrics HTTP/1.1\nHost: x\n\n")
        assert bare_lf == (400 if main == 400 else 200), (main, bare_lf)
        # A request line in absolute form (RFC 9112 3.2.2, what a proxy is sent): its path.
        host = f"127.0.0.1:{metrics_port}".encode()
        status, _, body = _raw(
            metrics_port,
            b"GET http://" + host + b"/metrics HTTP/1.1\r\nHost: " + host + b"\r\n\r\n",
        )
        assert status == 200, body[:200]
        assert b"tensorbits_" in body
        status, _, _ = _raw(metrics_port, b"GET http://" + host + b"/v2 HTTP/1.1\r\n\r\n")
        assert status == 404
        # The head bound holds over the whole head, however many short lines make it.
        status, _, _ = _raw(
            metrics_port, b"GET /metrics HTTP/1.1\r\n" + b"X: a\r\n" * (MAX_HEAD_BYTES // 6 + 8)
        )
        assert status == 431
