"""The ``tensorbits`` command: ``--version``, ``operators``, ``serve``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tensorbits import __version__
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "operators":
        return _list_operators()
    return 2  # argparse rejects unknown commands before this


if __name__ == "__main__":
    sys.exit(main())
