"""``tensorbits_protocol`` is the one source of truth of the server and the client: a
distribution of its own (``tensorbits-protocol``, protocol/) that both depend on. It imports
neither of them, nor anything its own distribution does not install (no FastAPI, no server
settings); the service depends on it and not on the client SDK."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

import tensorbits_protocol

PACKAGE = Path(tensorbits_protocol.__file__).parent
ROOT = Path(__file__).resolve().parents[2]
# What the protocol distribution installs (protocol/pyproject.toml), and the package itself.
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


def _requires(member: str) -> set[str]:
    """The names of a workspace member's runtime dependencies (its pyproject.toml)."""
    project = tomllib.loads((ROOT / member / "pyproject.toml").read_text())["project"]
    return {
        re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0].lower() for req in project["dependencies"]
    }


def test_the_protocol_distribution_installs_what_it_imports() -> None:
    # pydantic-core comes with pydantic (which pins it); the rest are named as imported.
    imported = {
        name.replace("_", "-") for name in ALLOWED - {"tensorbits_protocol", "pydantic_core"}
    }
    assert _requires("protocol") == imported


def test_service_and_client_depend_on_the_protocol_and_the_service_not_on_the_client() -> None:
    assert "tensorbits-protocol" in _requires("client")
    assert "tensorbits-protocol" in _requires("service")
    assert "tensorbits-client" not in _requires("service")
    service = ROOT / "service" / "src"
    importers = [p.name for p in service.rglob("*.py") if "tensorbits_client" in _imported(p)]
    assert not importers, f"the service imports the client SDK: {importers}"
