"""Triton's model control modes: the settings and flags under Triton's names, checked; and the
repository poller's rules, poll by poll: a folder is taken once it is unchanged across two
reads (a folder being written is never served half), a changed one is reloaded only when its
content changed, a new version folder is served as the new version, a removed one unloaded."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from core.graph_models import masked_model
from server import test_cli_settings as cli_settings
from support.planes import data_plane

from tensorbits.config.settings import Settings
from tensorbits.core.dataplane import DataPlane
from tensorbits.repository.poll import RepositoryPoller
from tensorbits.server.cli import main

MODEL = "masked"
# ``serve`` run up to uvicorn, in a clean environment: the CLI settings tests' fixtures.
clean_environment = cli_settings.clean_environment
started = cli_settings.started


def test_the_flags_set_the_model_control_settings_under_triton_s_names(
    tmp_path: Path, started: list[Any]
) -> None:
    argv = ["serve", "--port", "0", "--model-repository", str(tmp_path)]
    argv += ["--model-control-mode", "poll", "--repository-poll-secs", "2.5"]
    assert main(argv) == 0
    settings = cli_settings._settings(started[0])
    assert settings.model_repository == tmp_path
    assert (settings.model_control_mode, settings.repository_poll_secs) == ("poll", 2.5)


def test_explicit_is_the_default_and_the_variables_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_environment: None
) -> None:
    assert Settings().model_control_mode == "explicit"
    monkeypatch.setenv("TENSORBITS_MODEL_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("TENSORBITS_MODEL_CONTROL_MODE", "none")
    monkeypatch.setenv("TENSORBITS_REPOSITORY_POLL_SECS", "30")
    settings = Settings()
    assert (settings.model_control_mode, settings.repository_poll_secs) == ("none", 30)


@pytest.mark.parametrize(
    ("variables", "said"),
    [
        ({"MODEL_CONTROL_MODE": "polling"}, 'TENSORBITS_MODEL_CONTROL_MODE="polling"'),
        ({"MODEL_CONTROL_MODE": "poll"}, "model_control_mode poll reads a model repository"),
        ({"REPOSITORY_POLL_SECS": "0"}, 'TENSORBITS_REPOSITORY_POLL_SECS="0"'),
        ({"REPOSITORY_POLL_SECS": "1e9"}, 'TENSORBITS_REPOSITORY_POLL_SECS="1e9"'),
    ],
)
def test_a_mode_or_interval_out_of_its_rule_is_refused_naming_it(
    variables: dict[str, str],
    said: str,
    monkeypatch: pytest.MonkeyPatch,
    started: list[Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(f"TENSORBITS_{name}", value)
    assert main(["serve", "--port", "0"]) == 2
    assert said in capsys.readouterr().err
    assert started == []


# --- the poller, one poll at a time ---------------------------------------------------------


def _write_model(root: Path, version: str = "1", data: bytes | None = None) -> Path:
    folder = root / MODEL / version
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.onnx"
    path.write_bytes(masked_model() if data is None else data)
    return path


def _served(plane: DataPlane) -> str | None:
    model = plane.graphs.get(MODEL)
    return None if model is None else model.version


@pytest.fixture
def plane() -> DataPlane:
    pytest.importorskip("onnxruntime")
    return data_plane()


def test_a_folder_added_is_taken_once_unchanged_across_two_polls(
    tmp_path: Path, plane: DataPlane
) -> None:
    poller = RepositoryPoller.started(plane, tmp_path, 1.0)
    assert _served(plane) is None
    _write_model(tmp_path)
    poller.poll()
    assert _served(plane) is None  # seen once: it may still be written
    poller.poll()
    assert _served(plane) == "1"
    assert plane.statistics.model_stats(MODEL)["name"] == MODEL


def test_a_folder_written_slowly_is_never_served_half(tmp_path: Path, plane: DataPlane) -> None:
    poller = RepositoryPoller.started(plane, tmp_path, 1.0)
    whole = masked_model()
    path = _write_model(tmp_path, data=b"")
    for end in range(0, len(whole), max(1, len(whole) // 5)):
        path.write_bytes(whole[:end])  # a writer that is not done: it grows between polls
        poller.poll()
        assert _served(plane) is None
    # A writer that pauses past two polls: the part is read, refused, and not served either.
    path.write_bytes(whole[: len(whole) // 2])
    poller.poll()
    poller.poll()
    assert _served(plane) is None
    assert MODEL in plane.graphs.failed()
    path.write_bytes(whole)
    os.utime(path, ns=(1, 1))  # its fingerprint changes whatever the clock's resolution
    poller.poll()
    poller.poll()
    assert _served(plane) == "1"
    assert MODEL not in plane.graphs.failed()


def test_a_new_version_folder_is_served_as_the_new_version(
    tmp_path: Path, plane: DataPlane
) -> None:
    _write_model(tmp_path)
    poller = RepositoryPoller.started(plane, tmp_path, 1.0)
    assert _served(plane) == "1"
    before = plane.graphs.get(MODEL)
    _write_model(tmp_path, "2")
    poller.poll()
    assert plane.graphs.get(MODEL) is before  # in-flight and new requests: the old one still
    poller.poll()
    assert _served(plane) == "2"
    assert plane.statistics.model_stats(MODEL, "2")["version"] == "2"


def test_a_folder_touched_but_unchanged_is_not_reloaded(tmp_path: Path, plane: DataPlane) -> None:
    path = _write_model(tmp_path)
    poller = RepositoryPoller.started(plane, tmp_path, 1.0)
    before = plane.graphs.get(MODEL)
    os.utime(path, ns=(2, 2))
    poller.poll()
    poller.poll()
    assert plane.graphs.get(MODEL) is before  # its content hash is the one served


def test_a_folder_removed_is_unloaded_at_the_next_poll(tmp_path: Path, plane: DataPlane) -> None:
    path = _write_model(tmp_path)
    poller = RepositoryPoller.started(plane, tmp_path, 1.0)
    assert _served(plane) == "1"
    path.unlink()
    path.parent.rmdir()
    path.parent.parent.rmdir()
    poller.poll()
    assert _served(plane) is None
    assert MODEL not in plane.graphs.failed()


def test_a_hidden_folder_is_never_read(tmp_path: Path, plane: DataPlane) -> None:
    """A folder copied in under a name starting with "." (then renamed), or a ConfigMap
    volume's ``..data``: no model's, neither served nor listed."""
    (tmp_path / f".{MODEL}" / "1").mkdir(parents=True)
    (tmp_path / f".{MODEL}" / "1" / "model.onnx").write_bytes(masked_model())
    poller = RepositoryPoller.started(plane, tmp_path, 1.0)
    poller.poll()
    poller.poll()
    assert plane.graphs.models() == []
    assert plane.graphs.failed() == {}
    (tmp_path / f".{MODEL}").rename(tmp_path / MODEL)
    poller.poll()
    poller.poll()
    assert _served(plane) == "1"
