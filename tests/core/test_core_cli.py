"""The ``tensorbits`` command: ``--version`` and ``operators`` (``serve`` is tested live)."""

from __future__ import annotations

import pytest

from tensorbits import __version__
from tensorbits.cli import main
from tensorbits_protocol.operators import OPERATORS


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tensorbits {__version__}"


def test_operators_lists_all_eighteen_with_their_tensors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["operators"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(OPERATORS) == 18
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
