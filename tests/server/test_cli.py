"""The ``tensorbits`` command: ``--version``, ``operators``, and how ``serve`` builds its server
(the server itself is tested live)."""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import sys

import pytest
import uvicorn
from support.inprocess import TestClient

from tensorbits import __version__
from tensorbits.api.guarded_protocol import GuardedHttpProtocol, linger_bounds
from tensorbits.config.settings import Settings
from tensorbits.runtime import Drain
from tensorbits.server import cli
from tensorbits.server.app import create_app
from tensorbits.server.cli import main
from tensorbits.server.serving import uvicorn_kwargs
from tensorbits_protocol.catalog import listing
from tensorbits_protocol.operators import OPERATORS, REGISTRY


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tensorbits {__version__}"


def _blocks(text: str) -> dict[str, list[str]]:
    """``operators``' text: one block of lines per operator, keyed by its first word."""
    return {
        block.splitlines()[0].split()[0]: block.splitlines() for block in text.strip().split("\n\n")
    }


def test_operators_lists_every_operator_with_its_tensors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["operators"]) == 0
    blocks = _blocks(capsys.readouterr().out)
    assert list(blocks) == [op.name for op in OPERATORS]
    assert blocks["DML_OPERATOR_ELEMENT_WISE_BIT_COUNT"][0].endswith("InputTensor -> OutputTensor")
    shift = blocks["onnx.BitShift-11"]
    assert shift[0] == "onnx.BitShift-11  X, Y -> Z"
    assert "  types: UINT8, UINT16, UINT32, UINT64 -> same (rank 0-8)" in shift
    assert "  parameter direction = LEFT | RIGHT (required): shift direction" in shift


def test_operators_text_shows_feature_levels_parameters_and_in_place(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert (
        main(["operators", "DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT", "openvino.BitwiseAnd-13"])
        == 0
    )
    blocks = _blocks(capsys.readouterr().out)
    assert list(blocks) == ["DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT", "openvino.BitwiseAnd-13"]
    shift = blocks["DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT"]
    spec = REGISTRY["DML_OPERATOR_ELEMENT_WISE_BIT_SHIFT_LEFT"]
    # One line per support row, newest first, each with its feature level and types.
    levels = [line for line in shift if line.startswith("  feature level ")]
    assert [line.split(":")[0] for line in levels] == [
        f"  feature level {row.since}+" for row in spec.support
    ]
    assert levels[-1] == "  feature level 2_1+: UINT8, UINT16, UINT32 -> same (rank 4-4)"
    feature = next(line for line in shift if line.startswith("  parameter feature_level = "))
    assert "1_0 | 2_0 |" in feature
    assert "(default 6_4)" in feature
    assert "  in place: output may be bound to ATensor, BTensor" in shift
    broadcast = blocks["openvino.BitwiseAnd-13"]
    assert any(line.startswith("  parameter axis = integer (default -1)") for line in broadcast)
    assert any(
        line.startswith("  parameter auto_broadcast = numpy | none | pdpd (default numpy)")
        for line in broadcast
    )
    assert not any(line.startswith("  in place") for line in broadcast)


def test_operators_json_is_the_get_v1_operators_body(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["operators", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == listing().model_dump(mode="json")
    assert main(["operators", "--json", "onnx.BitShift-11"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == listing([REGISTRY["onnx.BitShift-11"]]).model_dump(mode="json")


def test_an_unknown_operator_is_refused_with_the_closest_name(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["operators", "onnx.BitShift", "nothing-like-it"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "tensorbits: no operator 'onnx.BitShift'; did you mean onnx.BitShift-11?",
        "tensorbits: no operator 'nothing-like-it'",
    ]


def _modules_after(code: str) -> set[str]:
    """The heavy modules loaded by ``code``, run in a fresh interpreter."""
    heavy = ("uvicorn", "fastapi", "pydantic", "numpy", "httpx", "tensorbits.server.app")
    probe = f"{code}\nimport sys\nprint('\\n' + ' '.join(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(done.stdout.splitlines()[-1].split())


def test_help_and_version_import_no_server_or_models() -> None:
    """`tensorbits --help` is argparse alone: no uvicorn, FastAPI, pydantic or NumPy (start-up
    time: bench/in_process.py --parts startup)."""
    for flag in ("--help", "--version"):
        code = f"from tensorbits.server.cli import main\ntry:\n    main([{flag!r}])\nexcept SystemExit:\n    pass"
        assert _modules_after(code) == set()


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
    assert capsys.readouterr().err.splitlines() == [
        "tensorbits: invalid settings: "
        "TENSORBITS_BACKEND=\"tpu\": Input should be 'auto', 'numpy' or 'cupy'"
    ]


def test_an_invalid_flag_is_named_as_the_flag_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # serve passes its flags on through the environment: let monkeypatch restore what it writes.
    monkeypatch.setenv("TENSORBITS_PORT", "8000")
    monkeypatch.setenv("TENSORBITS_WORKERS", "1")
    assert main(["serve", "--port", "99999", "--workers", "0"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        'tensorbits: invalid settings: --port="99999": Input should be less than or equal to '
        "65535 (--port sets TENSORBITS_PORT)",
        'tensorbits: invalid settings: --workers="0": Input should be greater than or equal to '
        "1 (--workers sets TENSORBITS_WORKERS)",
    ]


def test_sigterm_turns_readiness_false_before_the_server_stops() -> None:
    """serve's server and app as serve builds them: told to stop, the server begins the drain
    it shares with the app, so readiness is 503 (and liveness still 200) while uvicorn finishes
    the requests in flight."""
    drain = Drain()
    config = uvicorn.Config(**uvicorn_kwargs(Settings(backend="numpy", cpu_threads=2), drain))
    config.load()  # uvicorn calls the factory: the app is built with the drain
    server = cli.draining_server(config, drain)
    with TestClient(config.loaded_app) as client:
        assert client.get("/v2/health/ready").status_code == 200
        server.handle_exit(signal.SIGTERM, None)
        assert drain.begun
        assert server.should_exit
        assert client.get("/v2/health/ready").status_code == 503
        assert client.get("/v2/health/live").status_code == 200


def test_the_drain_stops_accepting_once_in_the_order_registered() -> None:
    """The delay's end runs the endpoints' hooks (gRPC's stop) once, however often it is told."""
    drain, calls = Drain(), []
    drain.on_stop_accepting(lambda: calls.append("grpc"))
    drain.on_stop_accepting(lambda: calls.append("other"))
    drain.begin()
    assert calls == []  # not ready is not "not accepting": the delay comes between
    drain.stop_accepting()
    drain.stop_accepting()
    assert calls == ["grpc", "other"]


@pytest.mark.parametrize("taken", ["port", "grpc_port"])
def test_the_metrics_port_needs_a_port_of_its_own(taken: str) -> None:
    ports = {"port": 9000, "grpc_port": 9001}
    with pytest.raises(ValueError, match="metrics_port 9"):
        Settings(backend="numpy", port=9000, grpc_port=9001, metrics_port=ports[taken])
    settings = Settings(backend="numpy", port=9000, grpc_port=9001, metrics_port=9002)
    assert settings.metrics_port == 9002


def test_the_protocol_gets_the_head_limits_from_the_settings() -> None:
    settings = Settings(backend="numpy", max_head_bytes=4096, timeout_header_read=2.5)
    kwargs = uvicorn_kwargs(settings)
    assert kwargs["app"].func is create_app  # each process builds its app (workers.py)
    # A picklable protocol: what a spawned worker could be handed with uvicorn's config.
    make = pickle.loads(pickle.dumps(kwargs["http"]))
    assert make.func is GuardedHttpProtocol
    assert make.keywords == {
        "max_head_bytes": 4096,
        "header_timeout": 2.5,
        "linger": linger_bounds(settings),
    }


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_operators_to_a_reader_that_stops_early_exits_quietly(json_flag: list[str]) -> None:
    """``tensorbits operators | head -1``: the reader closes the pipe after one line; the command
    exits 0 with nothing on stderr (it once ended in a BrokenPipeError traceback)."""
    command = [sys.executable, "-m", "tensorbits.server.cli", "operators", *json_flag]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as writer:
        assert writer.stdout is not None
        assert writer.stderr is not None
        first = writer.stdout.readline()
        writer.stdout.close()  # what head does once it has its line
        errors = writer.stderr.read()
        assert writer.wait(timeout=60) == 0, errors
    assert first.strip()
    assert errors == b""
