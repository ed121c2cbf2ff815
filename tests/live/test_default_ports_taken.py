"""The tests pass beside a server on the default ports, as the README has it: `make serve` in one
shell (127.0.0.1:8000, gRPC on 8001), `make test` in another.

Here plain listening sockets hold the default HTTP and gRPC ports (or a server already does), and
the shell running the tests exports a gRPC and a metrics port that are taken, as a shell set up
for its own server would. The tests that start ``tensorbits serve`` (in this process, at a
terminal, through ``make serve``, as the image's command) or an app with its listeners then run
in a pytest of their own, and must all pass: each has to pick free ports or switch the listeners
off, never fall back on the defaults or the shell's. A plain socket is the stricter neighbour: a
server with several workers listens with SO_REUSEPORT, and a test server that did too could share
its port unnoticed; a plain socket shares with nothing.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from tensorbits.config.settings import Settings
from tensorbits.server.cli import _bind_problem

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = "127.0.0.1"
DEFAULT_PORTS = (
    int(Settings.model_fields["port"].default),
    int(Settings.model_fields["grpc_port"].default),
)
# The tests that start a server or serve's command, each kind once: serve's settings and its port
# checks in-process, serve at a terminal, `make serve`, the image's command and health check, a
# live server and an in-process app that inherit the tests' settings, gRPC on a port of its own.
PORT_SENSITIVE = (
    "tests/server/test_cli_settings.py",
    "tests/server/test_cli.py",
    "tests/server/test_logs.py",
    "tests/deploy/test_make_serve.py::test_make_serve_listens_on_tensorbits_port",
    "tests/deploy/test_make_serve.py::test_busy_port_is_one_line_naming_port_and_setting",
    "tests/deploy/test_make_serve.py::test_make_serve_port_variable_reaches_the_server",
    "tests/deploy/test_start.py",
    "tests/client/test_live.py",
    "tests/api/test_v2_endpoints.py",
    "tests/grpc/test_readme_example.py",
)


@contextmanager
def _held(port: int) -> Iterator[None]:
    """``LOOPBACK:port`` listened on for the duration; left as it is when something listens on
    it already (a server beside the tests: the port is taken either way). SO_REUSEADDR as servers
    set it, so a port merely in TIME_WAIT is taken here rather than mistaken for held."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            holder.bind((LOOPBACK, port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
        else:
            holder.listen()
        yield


def _listening_port(stack: ExitStack) -> int:
    """A free port, then held: what a shell's own server would listen on."""
    holder = stack.enter_context(socket.socket())
    holder.bind((LOOPBACK, 0))
    holder.listen()
    port: int = holder.getsockname()[1]
    return port


@pytest.mark.timeout(300)
def test_port_sensitive_tests_pass_while_the_default_ports_are_taken(tmp_path: Path) -> None:
    with ExitStack() as stack:
        for port in DEFAULT_PORTS:
            stack.enter_context(_held(port))
        metrics_port = _listening_port(stack)
        # The premise: serve itself would refuse the defaults now.
        for port in DEFAULT_PORTS:
            assert _bind_problem(LOOPBACK, port) is not None, f"{LOOPBACK}:{port} is not taken"
        env = {
            **os.environ,
            "TENSORBITS_GRPC_PORT": str(DEFAULT_PORTS[1]),
            "TENSORBITS_METRICS_PORT": str(metrics_port),
        }
        report = tmp_path / "report.xml"
        pytest_options = ["-q", "-p", "no:cacheprovider", f"--junitxml={report}"]
        result = subprocess.run(
            [sys.executable, "-m", "pytest", *pytest_options, *PORT_SENSITIVE],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=280,
            check=False,
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    (suite,) = ElementTree.parse(report).getroot().iter("testsuite")
    counts = {key: int(suite.get(key, "0")) for key in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0, counts
    # Each file ran tests (a file that collected none would pass without starting anything).
    modules = {case.get("classname", "").split("::")[0] for case in suite.iter("testcase")}
    for path in PORT_SENSITIVE:
        module = path.split("::")[0].removesuffix(".py").replace("/", ".")
        assert any(name.startswith(module) for name in modules), (path, sorted(modules))
    assert counts["tests"] - counts["skipped"] >= 100, counts
