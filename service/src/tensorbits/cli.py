"""The ``tensorbits`` command: ``--version``, ``operators``, ``serve``."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

import uvicorn
from pydantic import ValidationError

from tensorbits import __version__, tls
from tensorbits.config import Settings
from tensorbits.guarded_protocol import guarded_protocol
from tensorbits.logs import configure_logging
from tensorbits.memory import tune_allocator
from tensorbits.runtime import Drain
from tensorbits_protocol.operators import OPERATORS


def _list_operators() -> int:
    width = max(len(op.name) for op in OPERATORS)
    for op in OPERATORS:
        types = ", ".join(str(t) for t in op.support[0].input_types)
        print(f"{op.name:<{width}}  {', '.join(op.inputs)} -> {op.output}  [{types}]")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorbits", description="Bitwise tensor-operator service (DirectML, OpenVINO, ONNX)."
    )
    parser.add_argument("--version", action="version", version=f"tensorbits {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("operators", help="list every operator with its inputs and data types")
    serve = commands.add_parser(
        "serve", help="run the HTTP server (settings from TENSORBITS_* environment variables)"
    )
    serve.add_argument("--host", help="address to bind (default: TENSORBITS_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: TENSORBITS_PORT or 8000)")
    serve.add_argument("--workers", type=int, help="worker processes (default: 1; one per GPU)")
    return parser


def _uvicorn_kwargs(settings: Settings, drain: Drain | None = None) -> dict[str, Any]:
    """uvicorn's arguments for ``settings``. With ``drain``: one process, whose app is built
    from these settings and reports not ready once ``drain`` begins. Without: the app is built
    by each worker process (an import string; it reads its settings from the environment)."""
    app: Any = "tensorbits.app:create_app"
    if drain is not None:
        from tensorbits.app import create_app  # here: `tensorbits operators` needs no FastAPI

        app = functools.partial(create_app, settings, drain=drain)
    return {
        "app": app,
        "factory": True,  # either way, so uvicorn builds the app as it loads (and reports failure)
        "host": settings.host,
        "port": settings.port,
        "workers": settings.workers,
        "loop": "uvloop",
        "http": guarded_protocol(settings),  # httptools, the request head bounded (its module)
        "ws": "none",  # no WebSocket routes: an upgrade request is an ordinary HTTP request
        "log_config": None,  # configure_logging did it: JSON lines through one handler
        "log_level": settings.log_level,
        "access_log": False,  # the middleware logs each request, with its request id
        "timeout_keep_alive": settings.timeout_keep_alive,
        "timeout_graceful_shutdown": settings.timeout_graceful_shutdown,
        **tls.uvicorn_options(settings),  # HTTPS when a certificate and key are configured
    }


def _serve(args: argparse.Namespace) -> int:
    overrides = {k: v for k in ("host", "port", "workers") if (v := getattr(args, k)) is not None}
    for key, value in overrides.items():
        # Worker processes build their own Settings from the environment: pass the flags on.
        os.environ[f"TENSORBITS_{key.upper()}"] = str(value)
    try:
        settings = Settings()
    except ValidationError as exc:
        print(f"tensorbits: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, settings.log_json)
    tune_allocator()  # before the first large buffer: RSS bounded over time (memory.py)
    if settings.workers > 1:
        # uvicorn's supervisor spawns the workers and forwards the signal; each worker finishes
        # its in-flight requests. (Readiness-first draining below is the single-worker path,
        # the one the images use: one worker per GPU, scale out with replicas.)
        uvicorn.run(**_uvicorn_kwargs(settings))
    else:
        drain = Drain()
        DrainingServer(uvicorn.Config(**_uvicorn_kwargs(settings, drain)), drain).run()
    return 0


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: turn readiness false first (``drain``, which the app's runtime was
    given), then let uvicorn finish in-flight requests."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.drain.begin()
        super().handle_exit(sig, frame)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "operators":
        return _list_operators()
    if args.command == "serve":
        return _serve(args)
    return 2  # argparse rejects unknown commands before this


if __name__ == "__main__":
    sys.exit(main())
