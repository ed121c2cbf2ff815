"""What a graph model's name and version may be: the one rule the load API (both protocols)
and the repository folder's reader check, before anything of the model is read.

A name is text a client will put in a URL path and a protobuf string: valid UTF-8 (a folder's
name the file system gives as bytes that are not UTF-8 arrives here with surrogates, and is
refused), 1 to ``MAX_MODEL_NAME_CHARS`` characters, no ``/``, not ``.`` or ``..``, not a
built-in model's, and none of ``RESERVED``: the fixed segments of the routes under
``/v2/models/`` (``GET /v2/models/stats`` is every model's statistics, not model ``stats``'s
metadata), so that no model can shadow a route nor be shadowed by one.

A version is Triton's: a positive int64 written in ASCII digits, without a leading zero, so
that it reads back as the same text and fits gRPC's ``int64`` fields (``version_policy``)."""

from __future__ import annotations

from collections.abc import Callable

from tensorbits.core.graphs.refusals import invalid, shown

MAX_MODEL_NAME_CHARS = 256
# The literal segments of the v2 routes under /v2/models/ (api/v2.py, api/v2_infer.py);
# tests/core/test_model_names.py holds this set to what the app routes.
RESERVED = frozenset({"stats", "ready", "config", "versions", "infer"})
MAX_VERSION = (1 << 63) - 1
ASCII_DIGITS = frozenset("0123456789")


def is_utf8(text: str) -> bool:
    """Whether ``text`` is valid Unicode text (no lone surrogates: what ``os.fsdecode`` makes of
    bytes that are not UTF-8)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def displayed(name: str) -> str:
    """``name`` as reports may carry it (the index, logs): the bytes that are not UTF-8 written
    as ``\\xNN``, so that every encoder takes it."""
    if is_utf8(name):
        return name
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def check_name(name: str, is_builtin: Callable[[str], bool]) -> None:
    """A graph model's name (see the module); refused naming ``model_name`` and the rule."""
    if (
        not name
        or len(name) > MAX_MODEL_NAME_CHARS
        or "/" in name
        or name in (".", "..")
        or not is_utf8(name)
    ):
        raise invalid(
            "model_name",
            "model_name",
            f"{shown(name)}: a graph model's name is 1 to {MAX_MODEL_NAME_CHARS} characters of "
            "UTF-8, no '/'",
        )
    if name in RESERVED:
        raise invalid(
            "model_name",
            "reserved_name",
            f"{shown(name)} is a segment of the routes under /v2/models/ "
            f"({', '.join(sorted(RESERVED))}): no model takes it",
        )
    if is_builtin(name):
        raise invalid(
            "model_name",
            "builtin_model",
            f"{shown(name)} is a built-in model (an operator): a graph model cannot take its name",
        )


def looks_like_version(text: str) -> bool:
    """Whether a folder's name is meant as a version: digits of any script (``١`` too)."""
    return text.isdigit()


def check_version(text: str, field: str = "version") -> int:
    """A version's text as its number: ASCII digits, no leading zero, 1 to int64's largest.
    The digits are counted before they are converted."""
    if (
        not text
        or not set(text) <= ASCII_DIGITS
        or text[0] == "0"
        or len(text) > len(str(MAX_VERSION))
        or int(text) > MAX_VERSION
    ):
        raise invalid(
            field,
            "version",
            f"{shown(text)}: a version is 1 to {MAX_VERSION} in ASCII digits, no leading zero",
        )
    return int(text)


__all__ = [
    "MAX_MODEL_NAME_CHARS",
    "MAX_VERSION",
    "RESERVED",
    "check_name",
    "check_version",
    "displayed",
    "is_utf8",
    "looks_like_version",
]
