"""Logs: JSON lines for machines (one object per line, with the request id of the request in
hand and the process that wrote it), readable lines for a person at a terminal; what a call's
access-log line says of it beyond its counts (``CallNote``); and the server's start-up banner.

Which one is the ``TENSORBITS_LOG_JSON`` setting; unset, it follows stderr: a terminal gets
readable lines, anything else (a container's log driver, a file, a pipe) gets JSON."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, TextIO


@dataclass(slots=True)
class CallNote:
    """What one call's access-log line says beyond its counts, noted while the call runs by the
    part that learns it: the front end its request id, client, model and version
    (``note_model``); ``refusals.answer_for`` its refusal's class, rule and field
    (``note_refusal``), never its words, which may quote the caller's data."""

    request_id: str
    client: str
    model: str = ""
    version: str = ""
    refusal: str | None = None  # the refusal's class ("invalid_request"); None: answered
    grpc_status: str | None = None  # the refusal's gRPC code name ("INVALID_ARGUMENT")
    rule: str | None = None
    field: str | None = None


# The call in hand (HTTP: set by the middleware; gRPC: by the call, and per message of a
# stream): every log record written while it runs carries its request id.
call_var: contextvars.ContextVar[CallNote | None] = contextvars.ContextVar(
    "tensorbits_call", default=None
)

# The most characters of a caller's words (a model name, a field path) that go into a log line.
MAX_NOTED_CHARS = 100


def bounded(text: str, limit: int = MAX_NOTED_CHARS) -> str:
    """``text`` as a log line may carry it: at most ``limit`` characters, printable only (a
    name from a request is the caller's data: it must not forge or flood lines)."""
    cut = text[:limit]
    return cut if cut.isprintable() else cut.encode("unicode_escape").decode("ascii")[:limit]


def begin_call(request_id: str, client: str) -> Callable[[], None]:
    """Start noting a call (and tag every record with ``request_id`` while it runs); returns
    what ends it, restoring the context as it was."""
    token = call_var.set(CallNote(request_id, bounded(client)))
    return partial(call_var.reset, token)


def begin_part() -> Callable[[], None]:
    """A note of its own for one part of the call in hand (a message of a stream, logged on its
    own line), beginning with the call's id and client; returns what ends it."""
    note = call_var.get()
    return begin_call(note.request_id, note.client) if note is not None else begin_call("", "")


def note_request_id(request_id: str) -> None:
    """The call's own id, once read (a gRPC request's ``id``): it replaces the one it began with
    in the call's records from now on."""
    note = call_var.get()
    if note is not None and request_id:
        note.request_id = bounded(request_id, 128)


def note_model(name: str, version: str = "") -> None:
    """The model (and version, "" for the server's choice) the call names."""
    note = call_var.get()
    if note is not None:
        note.model, note.version = bounded(name), bounded(version, 40)


def note_version(version: str) -> None:
    """The version the call's model is served at, once the model is resolved: the line says it
    rather than the one the call named (the same, or none for the server's choice)."""
    note = call_var.get()
    if note is not None:
        note.version = bounded(version, 40)


def note_refusal(code: str, grpc_status: str, rule: str | None, field: str | None) -> None:
    """The call was refused: the refusal's class, gRPC code name, rule and field."""
    note = call_var.get()
    if note is not None:
        note.refusal, note.grpc_status = code, grpc_status
        note.rule = None if rule is None else bounded(rule)
        note.field = None if field is None else bounded(field)


def log_fields(
    logger: logging.Logger, level: int, fields: Mapping[str, object], message: str, *args: object
) -> None:
    """``logger.log(level, message, *args, extra=fields)``, less its look-up of the caller's
    frame and its check of each field's name: the access line (``observability.record_call``)
    is written for every request, its fields never a record's own attributes, its file and line
    shown by no line. The caller checked ``logger.isEnabledFor(level)``."""
    record = logger.makeRecord(logger.name, level, "", 0, message, args, None)
    record.__dict__.update(fields)
    logger.handle(record)


# What a line does not show as a record's fields: LogRecord's own attributes (plumbing, not
# content) and the banner's block of lines for a person; whatever else was set on it (``extra``)
# it shows.
_NOT_FIELDS = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message", "asctime", "color_message", "banner",
}  # fmt: skip
# One encoder for every line: ``json.dumps(entry, default=str)`` would build one per line.
_ENCODER = json.JSONEncoder(default=str)


class _Seconds:
    """A record's time as a line writes it, to the second: formatted once a second, not once a
    line (an access line is written for every request). Called under its handler's lock, as a
    formatter is, so the second and its text change together."""

    __slots__ = ("clock", "form", "second", "text")

    def __init__(self, form: str, clock: Callable[[float], time.struct_time]) -> None:
        self.form, self.clock = form, clock
        self.second, self.text = -1, ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self.second:
            self.second, self.text = second, time.strftime(self.form, self.clock(created))
        return self.text


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self.seconds = _Seconds("%Y-%m-%dT%H:%M:%S", time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": f"{self.seconds(record.created)}.{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            # With --workers N every process writes to the same stream: which one wrote this.
            "pid": record.process,
        }
        note = call_var.get()
        if note is not None:
            entry["request_id"] = note.request_id
        for key, value in record.__dict__.items():
            if key not in _NOT_FIELDS:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry)


class ReadableFormatter(logging.Formatter):
    """``12:00:01 info    tensorbits.http  message  key=value ... [request id]``; a banner record
    (``banner`` set) as the block of lines it carries."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = _Seconds("%H:%M:%S", time.localtime)

    def format(self, record: logging.LogRecord) -> str:
        banner = getattr(record, "banner", None)
        if isinstance(banner, list):
            return "\n".join(str(line) for line in banner)
        clock = self.seconds(record.created)
        line = f"{clock} {record.levelname.lower():<7} {record.name}  {record.getMessage()}"
        extra = [
            f"{key}={value}" for key, value in record.__dict__.items() if key not in _NOT_FIELDS
        ]
        if extra:
            line += "  " + " ".join(extra)
        note = call_var.get()
        if note is not None:
            line += f"  [{note.request_id}]"
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
    version: str,
    backend: str,
    reason: str,
    docs_url: str,
    models: int,
    *,
    graph_models: Sequence[str] = (),
    features: Mapping[str, bool] | None = None,
    workers: int = 1,
    ports: Mapping[str, int] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The start-up record: a message and its fields (JSON), with the same facts as a short
    block of lines for a person (``banner``: the readable formatter prints just those).
    ``models``: the operators served; ``graph_models``: the graph models loaded at start;
    ``features``: which of the optional features (API keys, TLS, ...) are on; ``ports``: the
    listeners by name (0: off)."""
    features = dict(features or {})
    ports = dict(ports or {})
    fields: dict[str, Any] = {
        "version": version,
        "backend": backend,
        "backend_reason": reason,
        "docs": docs_url,
        "models": models + len(graph_models),
        "operators": models,
        "graph_models": list(graph_models),
        "workers": workers,
        "ports": ports,
        "features": features,
    }
    on = [name for name, enabled in features.items() if enabled]
    listening = [f"{name} {port}" for name, port in ports.items() if port]
    graphs = f" and {len(graph_models)} graph models ({', '.join(graph_models)})"
    fields["banner"] = [
        f"tensorbits {version}",
        f"  backend  {backend} ({reason})",
        f"  docs     {docs_url}",
        f"  models   {models} operators{graphs if graph_models else ''} "
        "(tensorbits operators lists them with their rules)",
        *([f"  ports    {', '.join(listening)}; {workers} worker processes"] if ports else []),
        *([f"  on       {', '.join(on) if on else 'no optional feature'}"] if features else []),
    ]
    return "tensorbits started", fields
