"""``tensorbits serve``'s settings as a user meets them: every one listed in ``serve --help``,
flags over environment variables, one line per invalid value naming the variable, a warning
for a misspelt variable, and CuPy's absence told before the server starts."""

from __future__ import annotations

import os
import sys
import types
from typing import Any

import pytest

from tensorbits import logs
from tensorbits.config.settings import Settings, unknown_variables
from tensorbits.core.backends import BackendUnavailable, select_backend
from tensorbits.server import cli, memory
from tensorbits.server.cli import main

SECRET = "s3cret-key"


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TENSORBITS_* variable from the shell running the tests; and each variable `serve`
    writes (it passes its flags on through the environment) restored afterwards."""
    for name in list(os.environ):
        if name.upper().startswith("TENSORBITS_"):
            monkeypatch.delenv(name)
    for field in Settings.model_fields:
        # Set and unset: monkeypatch records each as absent, and removes what serve writes.
        monkeypatch.setenv(f"TENSORBITS_{field.upper()}", "")
        monkeypatch.delenv(f"TENSORBITS_{field.upper()}")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, clean_environment: None) -> list[Any]:
    """``serve`` up to the point where the process would serve: the uvicorn config and the
    settings it would serve with, collected instead of served. Logging and the allocator are
    left as the test process has them."""
    configs: list[tuple[Any, Settings]] = []

    def not_serving(server: Any, app: Any, settings: Settings, drain: Any) -> None:
        configs.append((server.config, settings))

    monkeypatch.setattr(cli, "serve", not_serving)
    monkeypatch.setattr(logs, "configure_logging", lambda level, json_lines: None)
    monkeypatch.setattr(memory, "tune_allocator", lambda: None)
    # serve checks that its ports are free before it starts: gRPC's default (8001) may be held
    # by a server running beside the tests, and these tests are not about gRPC.
    monkeypatch.setenv("TENSORBITS_GRPC_PORT", "0")
    return configs


def _settings(served: tuple[Any, Settings]) -> Settings:
    """The settings ``serve`` would have served with (one entry of ``started``)."""
    return served[1]


def test_serve_help_lists_every_setting_with_default_and_description(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--help"])
    assert exited.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    listed = [line.strip() for line in lines if line.startswith("  TENSORBITS_")]
    assert [line.split("=")[0] for line in listed] == [
        f"TENSORBITS_{name.upper()}" for name in Settings.model_fields
    ]
    for name, info in Settings.model_fields.items():
        at = lines.index(
            next(line for line in lines if line.startswith(f"  TENSORBITS_{name.upper()}="))
        )
        assert info.description, f"{name} has no description for serve --help"
        assert lines[at + 1].strip() == info.description
    assert "  TENSORBITS_BACKEND=auto" in lines
    assert "  TENSORBITS_PORT=8000" in lines
    assert "  TENSORBITS_CPU_THREADS=(none)" in lines
    assert "  TENSORBITS_LOG_JSON=(none)" in lines
    assert "  TENSORBITS_AUTH_OPEN_PATHS=/v2/health/live,/v2/health/ready" in lines
    assert any("--backend {auto,numpy,cupy}" in line for line in lines)
    assert any("--log-level {debug,info,warning,error,critical}" in line for line in lines)


def _environment(monkeypatch: pytest.MonkeyPatch, **settings: str) -> None:
    for name, value in settings.items():
        monkeypatch.setenv(f"TENSORBITS_{name}", value)


def test_flags_override_the_environment(
    monkeypatch: pytest.MonkeyPatch, started: list[Any]
) -> None:
    _environment(monkeypatch, BACKEND="cupy", LOG_LEVEL="debug", HOST="0.0.0.0", CPU_THREADS="2")
    argv = ["serve", "--backend", "numpy", "--log-level", "warning", "--host", "127.0.0.1"]
    assert main([*argv, "--port", "0"]) == 0
    ((config, settings),) = started
    assert (settings.backend, settings.log_level, settings.host, settings.port) == (
        "numpy",
        "warning",
        "127.0.0.1",
        0,
    )
    assert config.log_level == "warning"  # uvicorn's own, from the same flag
    assert settings.cpu_threads == 2  # no flag: the environment's
    # Passed on to worker processes through the environment.
    assert os.environ["TENSORBITS_BACKEND"] == "numpy"
    assert os.environ["TENSORBITS_LOG_LEVEL"] == "warning"


def test_the_environment_applies_without_flags(
    monkeypatch: pytest.MonkeyPatch, started: list[Any]
) -> None:
    _environment(monkeypatch, BACKEND="numpy", LOG_LEVEL="error", PORT="0")
    assert main(["serve"]) == 0
    settings = _settings(started[0])
    assert (settings.backend, settings.log_level) == ("numpy", "error")


def test_a_flag_outside_its_choices_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--backend", "tpu"])
    assert exited.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        ("BACKEND", "tpu", "TENSORBITS_BACKEND=\"tpu\": Input should be 'auto', 'numpy' or 'cupy'"),
        (
            "LOG_LEVEL",
            "loud",
            "TENSORBITS_LOG_LEVEL=\"loud\": Input should be 'debug', 'info', 'warning', 'error'"
            " or 'critical'",
        ),
        (
            "PORT",
            "eighty",
            'TENSORBITS_PORT="eighty": Input should be a valid integer, unable to parse string'
            " as an integer",
        ),
        ("PORT", "70000", 'TENSORBITS_PORT="70000": Input should be less than or equal to 65535'),
        ("WORKERS", "0", 'TENSORBITS_WORKERS="0": Input should be greater than or equal to 1'),
        (
            "TIMEOUT_BODY_READ",
            "-1",
            'TENSORBITS_TIMEOUT_BODY_READ="-1": Input should be greater than 0',
        ),
        (
            "LOG_JSON",
            "maybe",
            'TENSORBITS_LOG_JSON="maybe": Input should be a valid boolean, unable to interpret'
            " input",
        ),
    ],
)
def test_an_invalid_setting_is_one_line_naming_variable_value_and_what_is_allowed(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clean_environment: None,
    variable: str,
    value: str,
    line: str,
) -> None:
    monkeypatch.setenv(f"TENSORBITS_{variable}", value)
    assert main(["serve"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"tensorbits: invalid settings: {line}"]


@pytest.mark.parametrize("value", ["-" + "9" * 4000, "x" * 4000])
def test_an_invalid_setting_is_shown_in_at_most_80_characters(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    clean_environment: None,
    value: str,
) -> None:
    # A value is the operator's, of any length: the line shows its start and its length, as a
    # refused request's value is shown (never 4,000 digits).
    monkeypatch.setenv("TENSORBITS_MAX_TENSORS", value)
    assert main(["serve"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f'tensorbits: invalid settings: TENSORBITS_MAX_TENSORS="{value[:80]}"')
    assert f"(a string of {len(value)} characters)" in line
    assert len(line) < 400, line


def test_each_invalid_setting_gets_its_own_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_environment: None
) -> None:
    monkeypatch.setenv("TENSORBITS_BACKEND", "tpu")
    monkeypatch.setenv("TENSORBITS_MAX_TENSORS", "0")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith('tensorbits: invalid settings: TENSORBITS_BACKEND="tpu": ')
    assert err[1].startswith('tensorbits: invalid settings: TENSORBITS_MAX_TENSORS="0": ')


def test_settings_checked_together_name_their_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_environment: None
) -> None:
    monkeypatch.setenv("TENSORBITS_TLS_KEY_PASSWORD", SECRET)
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "tensorbits: invalid settings: tls_key_password is set but no tls_key_file is "
        "(TENSORBITS_TLS_KEY_PASSWORD, TENSORBITS_TLS_KEY_FILE)"
    ]


def test_a_secret_setting_is_never_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], clean_environment: None
) -> None:
    monkeypatch.setenv("TENSORBITS_API_KEYS", f"{SECRET},bad\tkey")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "tensorbits: invalid settings: TENSORBITS_API_KEYS=(secret, not shown): API key number 2"
        " has a character other than visible ASCII (no spaces, no commas)"
    ]
    assert SECRET not in err


def test_a_misspelt_variable_is_warned_about_with_the_closest_setting() -> None:
    environ = {
        "TENSORBITS_PROT": "8001",
        "tensorbits_bakend": "numpy",  # read case-insensitively, like the settings themselves
        "TENSORBITS_ZQXW": "1",
        "TENSORBITS_PORT": "8000",  # a setting
        "TENSORBITS_MALLOC_TUNING": "0",  # read by memory.py, not a setting, no typo
        "TENSORBITS_URL": "http://x",  # the client's
        "TENSORBITS_PROBE_OUT": "x",  # bench and test scripts'
        "OTHER_PROT": "1",
    }
    assert unknown_variables(environ) == [
        "tensorbits: warning: TENSORBITS_PROT is not a setting, ignored;"
        " did you mean TENSORBITS_PORT?",
        "tensorbits: warning: TENSORBITS_ZQXW is not a setting, ignored",
        "tensorbits: warning: tensorbits_bakend is not a setting, ignored;"
        " did you mean TENSORBITS_BACKEND?",
    ]


def test_serve_warns_about_a_misspelt_variable_and_still_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], started: list[Any]
) -> None:
    monkeypatch.setenv("TENSORBITS_PROT", "8001")
    assert main(["serve", "--backend", "numpy", "--port", "0"]) == 0
    assert len(started) == 1
    assert capsys.readouterr().err.splitlines() == [
        "tensorbits: warning: TENSORBITS_PROT is not a setting, ignored;"
        " did you mean TENSORBITS_PORT?"
    ]


def test_cupy_without_cupy_stops_serve_with_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], started: list[Any]
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    monkeypatch.setenv("TENSORBITS_BACKEND", "cupy")
    assert main(["serve", "--port", "0"]) == 2
    assert started == []  # uvicorn never ran
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("tensorbits: TENSORBITS_BACKEND=cupy: CuPy could not be imported")
    assert "pip install './service[gpu]'" in line
    assert "GPU image" in line


def test_cupy_without_a_device_stops_serve_pointing_at_the_driver(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], started: list[Any]
) -> None:
    def no_device() -> int:
        raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        runtime=types.SimpleNamespace(getDeviceCount=no_device)
    )
    monkeypatch.setitem(sys.modules, "cupy", module)
    assert main(["serve", "--backend", "cupy", "--port", "0"]) == 2
    assert started == []
    (line,) = capsys.readouterr().err.splitlines()
    assert "cudaErrorNoDevice" in line
    assert "check the NVIDIA driver and TENSORBITS_DEVICE_ID" in line
    assert "pip install" not in line  # CuPy is installed: the extra is not what is missing


def test_select_backend_says_how_to_get_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(BackendUnavailable) as caught:
        select_backend("cupy")
    assert str(caught.value).startswith("TENSORBITS_BACKEND=cupy: CuPy could not be imported")
    assert "pip install './service[gpu]' from the repository" in str(caught.value)
    assert isinstance(caught.value.__cause__, BackendUnavailable)  # the original, chained
