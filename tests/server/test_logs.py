"""Logs for a person at a terminal, JSON for everything else, and the start-up banner."""

from __future__ import annotations

import io
import json
import logging
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.live import free_port

from tensorbits.logs import (
    MAX_NOTED_CHARS,
    JsonFormatter,
    ReadableFormatter,
    banner,
    begin_call,
    call_var,
    configure_logging,
    json_lines_for,
    note_model,
    note_refusal,
)
from tensorbits.observability import access_fields, protocol_status
from tensorbits_protocol.operators import OPERATORS

TENSORBITS = Path(sys.executable).parent / "tensorbits"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("setting", "stream", "json_lines"),
    [
        (None, _Terminal(), False),  # a person at a terminal: readable lines
        (None, io.StringIO(), True),  # a pipe, a file, a container's log driver: JSON
        (True, _Terminal(), True),  # the setting wins either way
        (False, io.StringIO(), False),
    ],
)
def test_json_unless_a_terminal_unless_told(
    setting: bool | None, stream: io.StringIO, json_lines: bool
) -> None:
    assert json_lines_for(setting, stream) is json_lines


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.makeLogRecord({"name": "tensorbits.http", "levelname": "INFO", "msg": message})
    record.__dict__.update(extra)
    return record


def test_a_readable_line_has_time_level_logger_message_fields_and_request_id() -> None:
    end_call = begin_call("req-7", "127.0.0.1:5000")
    try:
        line = ReadableFormatter().format(_record("refused", status=413))
    finally:
        end_call()
    clock, level, logger, rest = line.split(maxsplit=3)
    assert time.strptime(clock, "%H:%M:%S")
    assert (level, logger) == ("info", "tensorbits.http")
    assert rest == "refused  status=413  [req-7]"
    assert not line.startswith("{")


def test_the_banner_is_a_block_for_a_person_and_fields_for_a_machine() -> None:
    message, fields = banner("1.2.3", "numpy on cpu (2 threads)", "numpy backend requested",
                             "http://127.0.0.1:8000/docs", 18)  # fmt: skip
    record = _record(message, **fields)
    readable = ReadableFormatter().format(record).splitlines()
    assert readable[0] == "tensorbits 1.2.3"
    assert "numpy on cpu (2 threads) (numpy backend requested)" in readable[1]
    assert readable[2].endswith("http://127.0.0.1:8000/docs")
    assert "18 operators" in readable[3]
    entry = json.loads(JsonFormatter().format(record))
    assert "banner" not in entry
    assert entry["message"] == "tensorbits started"
    assert (entry["version"], entry["models"]) == ("1.2.3", 18)
    assert entry["docs"] == "http://127.0.0.1:8000/docs"
    assert entry["backend_reason"] == "numpy backend requested"


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:], root.level = handlers, level


def test_configure_logging_follows_stderr(
    monkeypatch: pytest.MonkeyPatch, root_logger: logging.Logger
) -> None:
    monkeypatch.setattr(sys, "stderr", _Terminal())
    configure_logging("info", None)
    (handler,) = root_logger.handlers
    assert isinstance(handler.formatter, ReadableFormatter)
    configure_logging("info", True)
    (handler,) = root_logger.handlers
    assert isinstance(handler.formatter, JsonFormatter)


@pytest.fixture
def terminal_server() -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``tensorbits serve`` with its stderr on a pseudo-terminal, as a person starts it."""
    main, secondary = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSORBITS_")}
    # Free ports for HTTP and gRPC: the defaults (8000, 8001) may be held by a server running
    # beside the tests, and serve stops at once when a port of its own is taken.
    env.update(
        TENSORBITS_BACKEND="numpy",
        TENSORBITS_PORT=str(free_port()),
        TENSORBITS_GRPC_PORT=str(free_port()),
    )
    proc = subprocess.Popen([str(TENSORBITS), "serve"], env=env, stderr=secondary)
    os.close(secondary)
    try:
        yield main, proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        os.close(main)


@pytest.mark.integration
def test_at_a_terminal_the_server_starts_with_a_banner_not_json(
    terminal_server: tuple[int, subprocess.Popen[bytes]],
) -> None:
    main, _ = terminal_server
    seen = b""
    deadline = time.monotonic() + 20
    while b"models" not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                seen += os.read(main, 4096)
            except OSError:  # EIO: the server exited and closed the terminal; say what it wrote
                break
    text = seen.decode()
    assert "tensorbits " in text
    assert "  docs     http://127.0.0.1:" in text
    assert f"{len(OPERATORS)} operators" in text
    assert not any(line.lstrip().startswith("{") for line in text.splitlines()), text


@pytest.mark.parametrize("local", [False, True])
def test_each_line_has_its_own_records_time_to_the_millisecond(local: bool) -> None:
    """The clock text is made once a second, and never stale: records of one second and of the
    next, and back again, each read as their own time."""
    formatter = ReadableFormatter() if local else JsonFormatter()
    start = 1_796_270_400  # 2026-12-03 04:00:00 UTC, on the second
    for created in (start + 0.25, start + 0.999, start + 1.0, start + 61.5, start + 0.5):
        record = _record("tick")
        record.created, record.msecs = created, (created - int(created)) * 1000
        line = formatter.format(record)
        if local:
            assert line.split()[0] == time.strftime("%H:%M:%S", time.localtime(created))
        else:
            second = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            assert json.loads(line)["ts"] == f"{second}.{int(record.msecs):03d}Z"


def test_every_json_line_names_the_process_that_wrote_it() -> None:
    entry = json.loads(JsonFormatter().format(_record("anything")))
    assert entry["pid"] == os.getpid()


def test_an_access_line_says_the_refusal_noted_during_the_call_not_its_words() -> None:
    end = begin_call("req-9", "127.0.0.1:5000")
    try:
        note_model("M" * 500, "1")
        note_refusal("invalid_request", "INVALID_ARGUMENT", "datatype", "in\nputs.A")
        note = call_var.get()
        assert note is not None
        shown = protocol_status("grpc", 400, note)
        fields = access_fields("grpc", "/svc/ModelInfer", shown, 0.001, 10, 0, note)
    finally:
        end()
    assert call_var.get() is None
    assert fields["status"] == "INVALID_ARGUMENT"
    assert (fields["request_id"], fields["client"]) == ("req-9", "127.0.0.1:5000")
    assert (fields["refusal"], fields["rule"]) == ("invalid_request", "datatype")
    assert fields["field"] == "in\\nputs.A"  # a caller's name cannot break the line
    assert fields["model"] == "M" * MAX_NOTED_CHARS  # bounded
    assert protocol_status("http", 400, note) == 400


def test_the_start_line_lists_graph_models_and_the_features_on() -> None:
    message, fields = banner(
        "1.2.3", "numpy on cpu", "numpy backend requested", "http://127.0.0.1:8000/docs", 18,
        graph_models=["masked"], features={"api_keys": True, "tls": False}, workers=2,
        ports={"http": 8000, "grpc": 8001, "metrics": 0},
    )  # fmt: skip
    assert (fields["models"], fields["graph_models"], fields["workers"]) == (19, ["masked"], 2)
    readable = ReadableFormatter().format(_record(message, **fields))
    assert "18 operators and 1 graph models (masked)" in readable
    assert readable.splitlines()[-1].split() == ["on", "api_keys"]  # TLS is off: not listed
