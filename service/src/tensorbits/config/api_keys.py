"""What an API key may be, and reading keys from ``TENSORBITS_API_KEYS_FILE``.

The settings check every configured key with these when they are built (config.py); the
middleware that asks a request for its key is auth.py's. Kept apart from it because the
settings need these checks and the middleware needs the settings.
"""

from __future__ import annotations

from pathlib import Path

# Visible ASCII but the comma: what a header value carries unchanged, and what can move between
# the comma-separated variable and the file.
_KEY_CHARACTERS = frozenset(range(0x21, 0x7F)) - {ord(",")}


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an API key, or None. The reason never quotes the key."""
    if not key:
        return "is empty"
    if not all(ord(c) in _KEY_CHARACTERS for c in key):
        return "has a character other than visible ASCII (no spaces, no commas)"
    return None


def read_key_file(path: Path) -> list[str]:
    """The keys of ``path``: one a line, surrounding whitespace dropped, blank lines and lines
    beginning with ``#`` ignored. A file that cannot be read or holds no key is an error (a
    configured file that yields nothing would silently lock every client out, or, worse, be
    taken for "no keys" and leave the server open)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"TENSORBITS_API_KEYS_FILE {path}: cannot read it ({reason})") from None
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        problem = key_problem(key)
        if problem is not None:
            raise ValueError(f"TENSORBITS_API_KEYS_FILE {path}: the key on line {number} {problem}")
        keys.append(key)
    if not keys:
        raise ValueError(f"TENSORBITS_API_KEYS_FILE {path}: holds no key (blank or comments only)")
    return keys
