"""Write the app's OpenAPI document to openapi/openapi.json (sorted keys, stable ids), or with
``--check`` say whether the committed file is out of date. Never edit the JSON by hand.

Usage: .venv/bin/python scripts/export_openapi.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tensorbits.config.settings import Settings
from tensorbits.server.app import create_app

SPEC = Path(__file__).resolve().parent.parent / "openapi" / "openapi.json"


def render() -> str:
    """The document as committed: 2-space indent, sorted keys, UTF-8, final newline."""
    # The backend only matters once the app runs; schema generation never starts it.
    schema = create_app(Settings(backend="numpy")).openapi()
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = SPEC.read_text(encoding="utf-8") if SPEC.exists() else ""
        if current != text:
            print(f"{SPEC} is out of date: run make openapi", file=sys.stderr)
            return 1
        return 0
    SPEC.parent.mkdir(exist_ok=True)
    SPEC.write_text(text, encoding="utf-8")
    print(f"wrote {SPEC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
