"""`make serve` as a new user runs it: the README's TENSORBITS_* settings decide where it listens,
a busy port is one plain line on stderr, and its environment is the runtime without dev tools.

The Makefile's own recipes run here (make in a subprocess, from the repository root), with two
changes that keep them on this checkout's environment and fast: BIN= points at the interpreter
running the tests, and `-o .venv/.runtime` skips the sync (test_serve_sync_* checks that).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from importlib.metadata import distributions
from pathlib import Path

import pytest
from deploy.files import REPO
from support.live import free_port, serve

from tensorbits.server.cli import _bind_problem

pytestmark = pytest.mark.integration

MAKE = "make"
UV = REPO / ".tools" / "bin" / "uv"
BIN = Path(sys.executable).parent
START_TIMEOUT_S = 30.0
# What `make install` adds for the checks: none of it may reach the serve environment.
DEV_TOOLS = ("pytest", "mypy", "ruff", "hypothesis", "schemathesis", "tritonclient")


def _environment(**settings: str) -> dict[str, str]:
    """This process's environment without any TENSORBITS_* setting or make's own variables (a
    `make test` running these would otherwise pass its flags and overrides on to the inner
    make), plus ``settings``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TENSORBITS_")
        and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "HOST", "PORT")
    }
    # gRPC off: its default port (8001) is not what these tests are about, and may be taken.
    env.update(
        {
            "TENSORBITS_LOG_LEVEL": "warning",
            "TENSORBITS_CPU_THREADS": "2",
            "TENSORBITS_GRPC_PORT": "0",
            **settings,
        }
    )
    return env


def _make_serve(*variables: str) -> list[str]:
    return [MAKE, "--no-print-directory", "-o", ".venv/.runtime", "serve", f"BIN={BIN}", *variables]


@pytest.fixture
def make_present() -> None:
    if subprocess.run([MAKE, "--version"], capture_output=True, check=False).returncode != 0:
        pytest.skip("make is not installed")


@contextlib.contextmanager
def _listening() -> Iterator[int]:
    """A port something already listens on (127.0.0.1)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


def _server_process(group: int) -> Path:
    """The /proc folder of the ``tensorbits serve`` process in process group ``group``."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
            if (
                int(fields[2]) == group
                and b"serve" in cmdline
                and any(part.endswith(b"tensorbits") for part in cmdline)
            ):
                return stat.parent
    raise AssertionError(f"no tensorbits serve process in group {group}")


def _server_environment(group: int) -> dict[str, str]:
    """The environment of the ``tensorbits serve`` process in process group ``group``."""
    raw = (_server_process(group) / "environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=2) as response:
        return response.status, response.read().decode()


@pytest.mark.usefixtures("make_present")
def test_make_serve_listens_on_tensorbits_port() -> None:
    port = free_port()
    proc = subprocess.Popen(
        _make_serve(),
        cwd=REPO,
        env=_environment(TENSORBITS_PORT=str(port)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # make and the server in one group, stopped together below
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                stderr = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"make serve exited with {proc.returncode}: {stderr}")
            with contextlib.suppress(OSError):
                if _get(f"http://127.0.0.1:{port}/v2/health/live")[0] == 200:
                    break
            assert time.monotonic() < deadline, f"nothing answered on {port} in {START_TIMEOUT_S} s"
            time.sleep(0.05)
        # make serve's backend is NumPy unless TENSORBITS_BACKEND says otherwise.
        status, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200
        assert re.search(r'^tensorbits_backend_info\{backend="numpy"', metrics, re.M), metrics
        # and malloc's mappings get huge pages, as in the images (docker/README.md).
        assert _server_environment(proc.pid).get("GLIBC_TUNABLES") == "glibc.malloc.hugetlb=1"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


def test_busy_port_is_one_line_naming_port_and_setting() -> None:
    with _listening() as port:
        started = time.monotonic()
        result = subprocess.run(
            [str(BIN / "tensorbits"), "serve"],
            env=_environment(TENSORBITS_PORT=str(port), TENSORBITS_BACKEND="numpy"),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        elapsed = time.monotonic() - started
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    assert "TENSORBITS_PORT" in lines[0]
    assert "--port" in lines[0]
    assert not lines[0].lstrip().startswith("{"), "a plain line, not a JSON log record"
    assert elapsed < 10, f"took {elapsed:.1f} s to report a busy port"


@pytest.mark.usefixtures("make_present")
def test_make_serve_port_variable_reaches_the_server() -> None:
    """`make serve PORT=...` still works: the port given to make is the one refused here, in the
    server's one line; make's own "Error" line is the only other line."""
    with _listening() as port:
        result = subprocess.run(
            _make_serve(f"PORT={port}"),
            cwd=REPO,
            env=_environment(TENSORBITS_PORT="1"),  # PORT= given to make wins over the setting
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode != 0
    server_lines = [line for line in result.stderr.splitlines() if not line.startswith("make")]
    assert server_lines == [server_lines[0]], result.stderr
    assert f"127.0.0.1:{port} is already in use" in server_lines[0]


def _serve_sync_command() -> str:
    """The sync `make serve` runs when .venv/ is missing or stale, as make would run it."""
    if not UV.exists():
        pytest.skip(f"uv is not bootstrapped at {UV} (make install does it)")
    dry = subprocess.run(
        [MAKE, "--no-print-directory", "-n", "-B", "install-serve"],
        cwd=REPO,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    syncs = [line for line in dry.stdout.splitlines() if " sync " in line]
    assert len(syncs) == 1, dry.stdout
    return syncs[0]


def _dry_run(command: str, environment: Path) -> str:
    """``command`` (a uv sync) with --dry-run against ``environment``: what it would change."""
    result = subprocess.run(
        ["bash", "-c", f"{command} --dry-run --offline"],
        cwd=REPO,
        env={**_environment(), "UV_PROJECT_ENVIRONMENT": str(environment)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stderr + result.stdout


@pytest.mark.usefixtures("make_present")
def test_serve_sync_installs_the_runtime_without_dev_tools(tmp_path: Path) -> None:
    plan = _dry_run(_serve_sync_command(), tmp_path / "venv")
    installs = set(re.findall(r"^ \+ ([A-Za-z0-9_.-]+)==", plan, re.M))
    assert {
        "tensorbits",
        "tensorbits-client",
        "tensorbits-protocol",
        "uvicorn",
        "fastapi",
        "numpy",
    } <= installs, plan
    assert not installs & set(DEV_TOOLS), plan
    assert not (tmp_path / "venv").exists()  # a dry run


@pytest.mark.usefixtures("make_present")
def test_serve_sync_keeps_the_dev_tools_of_a_full_install() -> None:
    """`make serve` after `make install` (this environment: the tests run in it) removes
    nothing: the serve sync is --inexact."""
    command = _serve_sync_command()
    assert "--no-dev" in shlex.split(command)
    plan = _dry_run(command, Path(sys.prefix))
    # A package it upgrades shows as " - old" and " + new": only a removal without its
    # replacement would be a dev tool lost.
    removed = set(re.findall(r"^ - ([A-Za-z0-9_.-]+)==", plan, re.M))
    added = set(re.findall(r"^ \+ ([A-Za-z0-9_.-]+)==", plan, re.M))
    assert not removed - added, plan
    assert all(tool in _installed() for tool in DEV_TOOLS)  # the premise: a full install


def _installed() -> set[str]:
    return {dist.metadata["Name"].lower() for dist in distributions()}


def test_an_address_not_on_this_machine_is_one_line_naming_the_host_setting() -> None:
    assert _bind_problem("127.0.0.1", free_port()) is None
    problem = _bind_problem("192.0.2.1", free_port())  # TEST-NET-1: no interface has it
    assert problem is not None
    assert problem.startswith("tensorbits: cannot listen on 192.0.2.1:"), problem
    assert "TENSORBITS_HOST" in problem
    assert "\n" not in problem


@pytest.mark.parametrize("workers", [1, 2])
def test_a_clean_sigterm_exits_0(workers: int) -> None:
    """SIGTERM is how every orchestrator stops the server: once it has drained and finished, the
    exit status says success, with one process as with several."""
    with serve({"TENSORBITS_WORKERS": str(workers), "TENSORBITS_GRPC_PORT": "0"}) as server:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0


@pytest.mark.usefixtures("make_present")
def test_make_serve_stopped_by_sigterm_reports_no_error() -> None:
    """The server stopped cleanly: make exits 0 and prints no "Error" line of its own."""
    port = free_port()
    proc = subprocess.Popen(
        _make_serve(),
        cwd=REPO,
        env=_environment(TENSORBITS_PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, f"make serve exited with {proc.returncode}"
            with contextlib.suppress(OSError):
                if _get(f"http://127.0.0.1:{port}/v2/health/live")[0] == 200:
                    break
            assert time.monotonic() < deadline, f"nothing answered on {port} in {START_TIMEOUT_S} s"
            time.sleep(0.05)
        os.kill(int(_server_process(proc.pid).name), signal.SIGTERM)  # the server alone
        output, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "Error" not in text, text
