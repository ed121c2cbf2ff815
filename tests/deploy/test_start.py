"""The images' start command and health check, run here without Docker.

The CMD and ENV are read from docker/Dockerfile.cpu, so this runs exactly what the container
runs (`tensorbits serve`, settings from TENSORBITS_*), from this checkout's .venv/bin, on a free
loopback port instead of 0.0.0.0:8000. Then the image's HEALTHCHECK command (docker/
healthcheck.py) has to pass against it, as Docker would run it inside the container.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from deploy.files import HEALTHCHECK_SCRIPT, REPO, copy_sources_and_dest, dockerfile
from support.live import free_port, serve

pytestmark = pytest.mark.integration

READY_TIMEOUT_S = 30.0
LOOPBACK = "127.0.0.1"


def _image_environment(kind: str, port: int) -> dict[str, str]:
    """The container's environment: the image's ENV over this process's, with the venv's bin/
    where the image has /opt/venv/bin, loopback:port in place of 0.0.0.0:8000 and a free port in
    place of gRPC's 8001 and the metrics port's 8002."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORBITS_")}
    for key, value in dockerfile(kind).final.env().items():
        if key == "PATH":
            value = value.replace("/opt/venv/bin", str(Path(sys.executable).parent))
            value = value.replace("$PATH", os.environ.get("PATH", ""))
        elif key == "VIRTUAL_ENV":
            value = sys.prefix
        env[key] = value
    env["TENSORBITS_HOST"] = LOOPBACK
    env["TENSORBITS_PORT"] = str(port)
    env["TENSORBITS_GRPC_PORT"] = str(free_port())  # in place of 8001, which may be taken here
    env["TENSORBITS_METRICS_PORT"] = str(free_port())  # and of the metrics port's 8002
    return env


def _local_command(argv: list[str]) -> list[str]:
    """An exec-form command as this checkout runs it: the program from the venv's bin/."""
    program = Path(sys.executable).parent / argv[0]
    return [str(program), *argv[1:]]


def _healthcheck_command(kind: str) -> list[str]:
    """The image's HEALTHCHECK command, its program mapped back to the file COPY installed."""
    final = dockerfile(kind).final
    healthcheck = final.last("HEALTHCHECK")
    assert healthcheck is not None
    argv = healthcheck.exec_form()
    for copy in final.all("COPY"):
        sources, dest = copy_sources_and_dest(copy)
        if "from" not in copy.flags and Path(dest).name == argv[0]:
            (source,) = sources
            return [sys.executable, str(REPO / source), *argv[1:]]
    pytest.fail(f"{argv[0]}: not installed by any COPY of the image")


def _serve_available() -> bool:
    probe = subprocess.run(
        _local_command(["tensorbits", "serve", "--help"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], subprocess.Popen[bytes]]]:
    """The CPU image's CMD, running with the image's ENV on a free loopback port."""
    cmd = dockerfile("cpu").final.last("CMD")
    assert cmd is not None
    argv = cmd.exec_form()
    if not (Path(sys.executable).parent / argv[0]).exists():
        pytest.skip(f"{argv[0]} is not installed in this environment")
    if argv[:2] == ["tensorbits", "serve"] and not _serve_available():
        pytest.skip("serve command not available")
    port = free_port()
    env = _image_environment("cpu", port)
    log_path = tmp_path / "server.log"  # a file, not a pipe: logs never block it
    with (
        log_path.open("wb") as log,
        serve(
            env,
            argv=_local_command(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            ready=None,  # the test waits, and says why when it is not ready
            port=port,
            exact_env=True,  # the image's ENV and CMD as they are: no --host/--port
            cwd=tmp_path,
        ) as server,
    ):
        server.proc.log_path = log_path  # type: ignore[attr-defined]
        yield server.base_url, env, server.proc


def _log(process: subprocess.Popen[bytes]) -> str:
    path: Path = process.log_path  # type: ignore[attr-defined]
    return path.read_text(errors="replace")[-4000:]


def _wait_ready(base: str, process: subprocess.Popen[bytes]) -> httpx.Response:
    deadline = time.monotonic() + READY_TIMEOUT_S
    last: str = "no answer"
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"the server exited with {process.returncode}:\n{_log(process)}")
            try:
                response = client.get(f"{base}/v2/health/ready")
            except httpx.TransportError as exc:
                last = repr(exc)
            else:
                if response.status_code == 200:
                    return response
                if response.status_code in (404, 405):  # no such route: waiting cannot help
                    pytest.fail(f"GET /v2/health/ready answered {response.status_code}")
                last = f"{response.status_code} {response.text[:200]}"
            time.sleep(0.2)
    pytest.fail(f"/v2/health/ready not 200 within {READY_TIMEOUT_S:.0f} s: {last}")


def test_image_start_command_serves_and_passes_its_healthcheck(
    served: tuple[str, dict[str, str], subprocess.Popen[bytes]],
) -> None:
    base, env, process = served
    _wait_ready(base, process)
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        assert client.get(f"{base}/v2/health/live").status_code == 200
    # What Docker runs every `interval` inside the container, with the container's env:
    check = subprocess.run(
        _healthcheck_command("cpu"), env=env, capture_output=True, text=True, timeout=30
    )
    assert check.returncode == 0, check.stderr
    # SIGTERM (docker stop, a pod's termination) ends it cleanly, and soon: uvicorn's shutdown
    # runs to its end and the exit status says success.
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=15) == 0
    assert "Finished server process" in _log(process), _log(process)


# ---- the health check script on its own -------------------------------------------------------------


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        code = self.status if self.path == "/v2/health/ready" else 404
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def stub_server() -> Iterator[tuple[ThreadingHTTPServer, type[_Health]]]:
    handler = type("Handler", (_Health,), {"status": 200})
    server = ThreadingHTTPServer((LOOPBACK, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server, handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _run_healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TENSORBITS_")}
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK_SCRIPT)],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False), (500, False)])
def test_healthcheck_passes_only_on_200(
    stub_server: tuple[ThreadingHTTPServer, type[_Health]], status: int, healthy: bool
) -> None:
    server, handler = stub_server
    handler.status = status
    port = str(server.server_address[1])
    # The image binds 0.0.0.0: the check dials loopback on the configured port.
    result = _run_healthcheck({"TENSORBITS_HOST": "0.0.0.0", "TENSORBITS_PORT": port})
    assert (result.returncode == 0) is healthy, result.stderr


def test_healthcheck_fails_when_nothing_listens() -> None:
    result = _run_healthcheck({"TENSORBITS_PORT": str(free_port())})
    assert result.returncode == 1
    assert "unhealthy" in result.stderr


def test_healthcheck_ignores_proxies(
    stub_server: tuple[ThreadingHTTPServer, type[_Health]],
) -> None:
    server, _ = stub_server
    dead_proxy = f"http://{LOOPBACK}:{free_port()}"
    env = {"TENSORBITS_PORT": str(server.server_address[1])}
    env |= {"HTTP_PROXY": dead_proxy, "http_proxy": dead_proxy, "NO_PROXY": "", "no_proxy": ""}
    assert _run_healthcheck(env).returncode == 0
