"""No docstring line of the three packages' sources is longer than 100 characters, the width
ruff holds the code to (a docstring's text is left to its writer, and help() and editors show
it as written). Read from the code itself: a module, class or function docstring, or the string
that documents an attribute below it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = (
    ROOT / "service" / "src",
    ROOT / "client" / "src",
    ROOT / "protocol" / "src",
)
MAX_LINE = 100


def _long_docstring_lines(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line (length)`` for each line of a docstring in ``path`` past ``MAX_LINE``, the
    path named relative to ``root``."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found = []
    for node in ast.walk(ast.parse(text, str(path))):
        # A string standing alone as a statement: a docstring, or an attribute's below it.
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)):
            continue
        if not isinstance(node.value.value, str) or node.end_lineno is None:
            continue
        for number in range(node.lineno, node.end_lineno + 1):
            if len(lines[number - 1]) > MAX_LINE:
                where = path.relative_to(root)
                found.append(f"{where}:{number} ({len(lines[number - 1])})")
    return found


def test_no_docstring_line_is_over_100_characters() -> None:
    sources = [path for root in SOURCES for path in sorted(root.rglob("*.py"))]
    assert len(sources) > 100, "the sources were not found"
    too_long = [line for path in sources for line in _long_docstring_lines(path)]
    assert too_long == [], "docstring lines over 100 characters:\n" + "\n".join(too_long)


def test_a_long_docstring_line_is_found(tmp_path: Path) -> None:
    """The check itself: a line one character past the width is found, one at it is not."""
    module = tmp_path / "module.py"
    at_width = '"""' + "a" * (MAX_LINE - 6) + '"""'  # a module docstring of one line, 100 long
    past_width = "b" * (MAX_LINE - 2) + '"""'  # the last line of a function's, 101 long
    module.write_text(f'{at_width}\n\n\ndef f() -> None:\n    """x\n{past_width}\n')
    assert _long_docstring_lines(module, tmp_path) == [f"module.py:6 ({MAX_LINE + 1})"]
