"""The ``tensorbits`` command: ``--version``, ``operators``, ``serve``.

Every import past the standard library happens in the command that needs it: ``--help`` and
``--version`` load no FastAPI, uvicorn, pydantic or NumPy (docs/benchmarks.md, CLI start-up).
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tensorbits import __version__

# The server process is assembled in serving.py (workers.py builds the same one); the command
# calls it through these names, which the tests use too (a stub ``serve`` included).
from tensorbits.server.serving import StopSignals, serve
from tensorbits.server.serving import draining_server as draining_server
from tensorbits.server.serving import uvicorn_kwargs as _uvicorn_kwargs

if TYPE_CHECKING:
    from tensorbits.config.settings import Settings
    from tensorbits_protocol.v1 import OperatorInfo


def _describe_operator(info: OperatorInfo) -> str:
    """One operator's rule tables in words: the same OperatorInfo GET /v1/operators sends."""
    lines = [f"{info.name}  {', '.join(info.inputs)} -> {info.output}"]
    if info.summary:
        lines.append(f"  {info.summary}")
    for row in info.support:  # newest first
        since = f"feature level {row.since}+" if row.since is not None else "types"
        types = ", ".join(str(t) for t in row.input_types)
        out = ", ".join(str(t) for t in row.output_types) if row.output_types else "same"
        lines.append(f"  {since}: {types} -> {out} (rank {row.min_rank}-{row.max_rank})")
    for param in info.parameters:
        allowed = " | ".join(param.choices) if param.choices is not None else "integer"
        extra = "required" if param.required else f"default {param.default}"
        described = f": {param.description}" if param.description else ""
        lines.append(f"  parameter {param.name} = {allowed} ({extra}){described}")
    empty = "allowed" if info.allow_empty else "refused"
    lines.append(f"  shapes: {info.shape_rule} (empty tensors {empty})")
    if info.in_place:
        lines.append(f"  in place: output may be bound to {', '.join(info.in_place)}")
    return "\n".join(lines)


def _list_operators(args: argparse.Namespace) -> int:
    from tensorbits_protocol.catalog import listing
    from tensorbits_protocol.operators import OPERATORS, REGISTRY

    unknown = [name for name in args.names if name not in REGISTRY]
    if unknown:
        for name in unknown:
            close = difflib.get_close_matches(name, list(REGISTRY), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            print(f"tensorbits: no operator {name!r}{hint}", file=sys.stderr)
        return 2
    body = listing([REGISTRY[name] for name in args.names] if args.names else OPERATORS)
    if args.json:
        text = body.model_dump_json(indent=2)  # the GET /v1/operators body, byte for byte
    else:
        text = "\n\n".join(_describe_operator(info) for info in body.operators)
    return _print_to_a_reader(text)


def _print_to_a_reader(text: str) -> int:
    """Print ``text``; a reader that stops early (``tensorbits operators | head``) is no error:
    the rest is dropped quietly, as other command-line tools drop it (exit 0)."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit: point stdout at
        # /dev/null first (the recipe of Python's signal documentation).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return 0


class _CommandParser(argparse.ArgumentParser):
    """A command's parser. With ``settings_epilog`` (``serve``) its help ends with every
    setting, read off the Settings model only when the help is shown: the model needs
    pydantic, which ``tensorbits --help`` should not load."""

    def __init__(self, *args: Any, settings_epilog: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.settings_epilog = settings_epilog

    def format_help(self) -> str:
        if self.settings_epilog:
            from tensorbits.config.settings import settings_help

            self.epilog = settings_help()
        return super().format_help()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorbits", description="Bitwise tensor-operator service (DirectML, OpenVINO, ONNX)."
    )
    parser.add_argument("--version", action="version", version=f"tensorbits {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_CommandParser)
    operators = commands.add_parser(
        "operators",
        help="every operator's rules: inputs, data types per feature level, parameters",
        description="Each operator's rule tables, as GET /v1/operators publishes them.",
    )
    operators.add_argument("names", nargs="*", metavar="NAME", help="only these operators")
    operators.add_argument(
        "--json", action="store_true", help="the GET /v1/operators JSON body instead of text"
    )
    serve = commands.add_parser(
        "serve",
        help="run the HTTP server (settings from TENSORBITS_* environment variables)",
        description="Run the HTTP server. Every setting is an environment variable (below);\n"
        "a flag overrides its variable.",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keep the settings' layout
        settings_epilog=True,
    )
    serve.add_argument("--host", help="address to bind (TENSORBITS_HOST)")
    serve.add_argument("--port", type=int, help="port (TENSORBITS_PORT)")
    serve.add_argument(
        "--workers", type=int, help="worker processes, one per GPU (TENSORBITS_WORKERS)"
    )
    serve.add_argument(
        "--backend", choices=("auto", "numpy", "cupy"), help="compute backend (TENSORBITS_BACKEND)"
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error", "critical"),
        help="least severe log record written (TENSORBITS_LOG_LEVEL)",
    )
    # Triton's flags for its model repository, under Triton's names.
    serve.add_argument(
        "--model-repository",
        metavar="DIR",
        help="folder of graph models in Triton's layout (TENSORBITS_MODEL_REPOSITORY)",
    )
    serve.add_argument(
        "--model-control-mode",
        choices=("none", "poll", "explicit"),
        help="none: the repository at start, no load API; poll: followed while serving; "
        "explicit: the load API (TENSORBITS_MODEL_CONTROL_MODE)",
    )
    serve.add_argument(
        "--repository-poll-secs",
        metavar="SECONDS",
        help="seconds between two reads of the repository in poll mode "
        "(TENSORBITS_REPOSITORY_POLL_SECS)",
    )
    return parser


# The flags of the model repository's settings: each sets its TENSORBITS_ variable.
REPOSITORY_FLAGS = ("model_repository", "model_control_mode", "repository_poll_secs")

PORT_CHOICE = "choose another port with TENSORBITS_PORT=<port> or --port <port>"
GRPC_PORT_CHOICE = "choose another port with TENSORBITS_GRPC_PORT=<port> (0 switches gRPC off)"
METRICS_PORT_CHOICE = (
    "choose another port with TENSORBITS_METRICS_PORT=<port> (0 switches the metrics port off)"
)


def _bind_problem(host: str, port: int, choice: str = PORT_CHOICE) -> str | None:
    """Why ``host:port`` cannot be listened on, as one line for stderr; None when it can.

    Checked before uvicorn starts because uvicorn reports a failed bind only after building the
    app (the backend: seconds on a GPU), as a log record among the start-up records, and then
    calls sys.exit inside its startup: catching that would depend on uvicorn's internals. The
    probe binds as asyncio's and uvloop's create_server do (each address the host resolves to,
    SO_REUSEADDR on POSIX, IPV6_V6ONLY), so a port in TIME_WAIT passes and a listening one does
    not; it never listens and closes at once. A port taken in the instant between this check
    and uvicorn's bind still fails, as uvicorn reports it."""
    if port == 0:
        return None  # the kernel picks a free port
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        for family, kind, proto, _, address in socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        ):
            with socket.socket(family, kind, proto) as probe:
                if os.name == "posix" and sys.platform != "cygwin":  # asyncio's condition
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"tensorbits: {where} is already in use; {choice}"
        return (
            f"tensorbits: cannot listen on {where}: {exc.strerror or exc};"
            " check TENSORBITS_HOST/--host and TENSORBITS_PORT/--port"
        )
    return None


def _backend_problem(settings: Settings) -> str | None:
    """Why the backend ``cupy`` cannot run, as one line; checked before uvicorn starts, where
    the failure would be a traceback inside a log record. (``auto`` falls back; ``numpy``
    always works.)"""
    if settings.backend != "cupy":
        return None
    from tensorbits.core.backends import BackendUnavailable, select_backend

    try:
        selection = select_backend(
            "cupy",
            device_id=settings.device_id,
            pinned_pool_bytes=settings.worker_pinned_pool_bytes,
        )
    except BackendUnavailable as exc:
        return f"tensorbits: {exc}"
    selection.backend.close()  # the app builds its own at start-up
    return None


def _as_flags(line: str, overrides: dict[str, Any]) -> str:
    """A settings error's ``TENSORBITS_PORT=<value>: ...`` line in the words of the flag that gave
    the value, when a flag did (``--port=<value>: ... (--port sets TENSORBITS_PORT)``): the
    caller typed the flag, and may not know the variable it sets."""
    for key in overrides:
        variable, flag = f"TENSORBITS_{key.upper()}", f"--{key.replace('_', '-')}"
        if line.startswith(f"{variable}="):
            return f"{flag}={line.removeprefix(f'{variable}=')} ({flag} sets {variable})"
    return line


def _serve(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from tensorbits.config.settings import Settings, settings_errors, unknown_variables
    from tensorbits.logs import configure_logging
    from tensorbits.runtime import Drain
    from tensorbits.server.memory import tune_allocator

    flags = ("host", "port", "workers", "backend", "log_level", *REPOSITORY_FLAGS)
    overrides = {k: v for k in flags if (v := getattr(args, k)) is not None}
    for key, value in overrides.items():
        # Worker processes build their own Settings from the environment: pass the flags on.
        os.environ[f"TENSORBITS_{key.upper()}"] = str(value)
    for warning in unknown_variables(os.environ):
        print(warning, file=sys.stderr)  # a warning, not an error: the server still starts
    try:
        settings = Settings()
    except ValidationError as exc:
        for line in settings_errors(exc):
            print(f"tensorbits: invalid settings: {_as_flags(line, overrides)}", file=sys.stderr)
        return 2
    for port, choice in (
        (settings.port, PORT_CHOICE),
        (settings.grpc_port, GRPC_PORT_CHOICE),
        (settings.metrics_port, METRICS_PORT_CHOICE),
    ):
        # One plain line, not a log record: nothing started yet. (A gRPC port of 0 is "off",
        # which the probe passes like the HTTP side's "any free port".)
        if (problem := _bind_problem(settings.host, port, choice)) is not None:
            print(problem, file=sys.stderr)
            return 1
    # Last of the checks: probing a GPU takes seconds.
    if (problem := _backend_problem(settings)) is not None:
        print(problem, file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    tune_allocator()  # before the first large buffer: RSS bounded over time (memory.py)
    if settings.workers > 1:
        # Worker processes on one port, each this same server (workers.py).
        from tensorbits.server.workers import Supervisor

        return Supervisor(settings).run()
    from tensorbits.server.app import create_app
    from tensorbits.server.assembly import StartFailure

    # A clean stop exits 0, not by the signal uvicorn raises again once it has stopped.
    with StopSignals() as stop:
        drain = Drain()
        # The process starts the runtime, then HTTP and gRPC side by side on it (assembly.py).
        app = create_app(settings, drain=drain, runtime_by_process=True)
        config = uvicorn.Config(**_uvicorn_kwargs(settings, drain, app))
        server = draining_server(config, drain, settings.drain_delay)
        if stop.hand_to(server):  # else told to stop while starting: nothing to serve
            try:
                serve(server, app, settings, drain)
            except StartFailure as failure:
                print(f"tensorbits: {failure}", file=sys.stderr)
                return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "operators":
        return _list_operators(args)
    if args.command == "serve":
        return _serve(args)
    return 2  # argparse rejects unknown commands before this


if __name__ == "__main__":
    sys.exit(main())
