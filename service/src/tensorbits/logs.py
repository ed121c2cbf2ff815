"""Logs: JSON lines for machines (one object per line, with the request id of the request in
hand), readable lines for a person at a terminal; and the server's start-up banner.

Which one is the ``TENSORBITS_LOG_JSON`` setting; unset, it follows stderr: a terminal gets
readable lines, anything else (a container's log driver, a file, a pipe) gets JSON."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from typing import Any, TextIO

# Set by the HTTP middleware for the duration of a request; read by every log record.
request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "tensorbits_request_id", default=None
)

# LogRecord attributes that are plumbing, not content.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = request_id_var.get()
        if request_id is not None:
            entry["request_id"] = request_id
        entry.update(
            (key, value)
            for key, value in record.__dict__.items()
            if key not in _STANDARD and key != "banner"
        )
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class ReadableFormatter(logging.Formatter):
    """``12:00:01 info    tensorbits.http  message  key=value ... [request id]``; a banner record
    (``banner`` set) as the block of lines it carries."""

    def format(self, record: logging.LogRecord) -> str:
        banner = getattr(record, "banner", None)
        if isinstance(banner, list):
            return "\n".join(str(line) for line in banner)
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{clock} {record.levelname.lower():<7} {record.name}  {record.getMessage()}"
        extra = [
            f"{key}={value}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and key != "banner"
        ]
        if extra:
            line += "  " + " ".join(extra)
        request_id = request_id_var.get()
        if request_id is not None:
            line += f"  [{request_id}]"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def json_lines_for(setting: bool | None, stream: TextIO) -> bool:
    """The setting when given; unset, JSON unless ``stream`` is a terminal."""
    if setting is not None:
        return setting
    isatty = getattr(stream, "isatty", None)
    return not (callable(isatty) and isatty())


def configure_logging(level: str, json_lines: bool | None) -> None:
    """Route our loggers and uvicorn's through one handler on stderr, in JSON or readable lines
    (``json_lines`` None: by whether stderr is a terminal)."""
    handler = logging.StreamHandler()
    readable = not json_lines_for(json_lines, sys.stderr)
    handler.setFormatter(ReadableFormatter() if readable else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True


def banner(
    version: str, backend: str, reason: str, docs_url: str, models: int
) -> tuple[str, dict[str, Any]]:
    """The start-up record: a message and its fields (JSON), with the same facts as a short
    block of lines for a person (``banner``: the readable formatter prints just those)."""
    fields: dict[str, Any] = {
        "version": version,
        "backend": backend,
        "backend_reason": reason,
        "docs": docs_url,
        "models": models,
    }
    fields["banner"] = [
        f"tensorbits {version}",
        f"  backend  {backend} ({reason})",
        f"  docs     {docs_url}",
        f"  models   {models} operators (tensorbits operators lists them with their rules)",
    ]
    return "tensorbits started", fields
