"""``tensorbits_protocol`` is the one source of truth of the server and the client: it imports
neither of them, nor anything the client does not install (no FastAPI, no server settings)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import tensorbits_protocol

PACKAGE = Path(tensorbits_protocol.__file__).parent
# What the client distribution installs (client/pyproject.toml), and the package itself.
ALLOWED = {
    "tensorbits_protocol",
    "jiter",
    "numpy",
    "pydantic",
    "pydantic_core",
    "typing_extensions",
}


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_the_protocol_imports_only_what_the_client_installs(path: Path) -> None:
    foreign = _imported(path) - ALLOWED - set(sys.stdlib_module_names)
    assert not foreign, f"{path.name} imports {sorted(foreign)}"
