"""The ``tensorbits`` command: ``--version``, ``operators``, and how ``serve`` builds its server
(the server itself is tested live)."""

from __future__ import annotations

import pickle
import signal

import pytest
import uvicorn
from support.inprocess import TestClient

from tensorbits import __version__, cli
from tensorbits.cli import main
from tensorbits.config import Settings
from tensorbits.guarded_protocol import GuardedHttpProtocol
from tensorbits.runtime import Drain
from tensorbits_protocol.operators import OPERATORS


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tensorbits {__version__}"


def test_operators_lists_every_operator_with_its_tensors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["operators"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(OPERATORS)
    count = next(line for line in lines if line.startswith("DML_OPERATOR_ELEMENT_WISE_BIT_COUNT "))
    assert "InputTensor -> OutputTensor" in count
    shift = next(line for line in lines if line.startswith("onnx.BitShift-11 "))
    assert "X, Y -> Z" in shift
    assert "[UINT8, UINT16, UINT32, UINT64]" in shift


def test_unknown_command_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["frobnicate"])
    assert exited.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_invalid_settings_stop_serve_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TENSORBITS_BACKEND", "tpu")
    # serve passes its flags on through the environment: let monkeypatch restore what it writes.
    monkeypatch.setenv("TENSORBITS_PORT", "8000")
    assert main(["serve", "--port", "0"]) == 2
    assert "invalid settings" in capsys.readouterr().err


def test_sigterm_turns_readiness_false_before_the_server_stops() -> None:
    """serve's server and app as serve builds them: told to stop, the server begins the drain
    it shares with the app, so readiness is 503 (and liveness still 200) while uvicorn finishes
    the requests in flight."""
    drain = Drain()
    config = uvicorn.Config(**cli._uvicorn_kwargs(Settings(backend="numpy", cpu_threads=2), drain))
    config.load()  # uvicorn calls the factory: the app is built with the drain
    server = cli.DrainingServer(config, drain)
    with TestClient(config.loaded_app) as client:
        assert client.get("/v2/health/ready").status_code == 200
        server.handle_exit(signal.SIGTERM, None)
        assert drain.begun
        assert server.should_exit
        assert client.get("/v2/health/ready").status_code == 503
        assert client.get("/v2/health/live").status_code == 200


def test_the_protocol_gets_the_head_limits_from_the_settings() -> None:
    settings = Settings(backend="numpy", max_head_bytes=4096, timeout_header_read=2.5)
    kwargs = cli._uvicorn_kwargs(settings)
    assert kwargs["app"] == "tensorbits.app:create_app"  # workers build their own app
    # --workers N pickles uvicorn's config into each spawned worker: the protocol goes with it.
    make = pickle.loads(pickle.dumps(kwargs["http"]))
    assert make.func is GuardedHttpProtocol
    assert make.keywords == {"max_head_bytes": 4096, "header_timeout": 2.5}
