"""A pydantic validation error in the caller's words: the field path, the message, the rule.

One formatter for both APIs (the /v2 inference document and the /v1 batch header): the path as
the caller wrote it (``dispatches[2].bindings.A.offset``), and a parameter value that matched no
member of its ``str | number | bool`` union reported once, at the parameter, rather than once
per member with pydantic's internal member tags in the path.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic_core import ErrorDetails

from tensorbits_protocol.integers import INT64_MIN, UINT64_MAX

Location = tuple[int | str, ...]

# The tags pydantic adds to a location for each member of a union of scalars.
_MEMBER_TAGS = frozenset({"bool", "int", "float", "str", "constrained-int"})
_RANGE_ERRORS = frozenset({"less_than_equal", "greater_than_equal"})


def field_path(loc: Location, default: str) -> str:
    """``("dispatches", 2, "bindings", "A")`` as ``dispatches[2].bindings.A``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or default


def _member_tag(part: int | str) -> bool:
    return isinstance(part, str) and (part in _MEMBER_TAGS or part.startswith("function-"))


def first_error(errors: Sequence[ErrorDetails]) -> tuple[Location, str, str]:
    """The location, message and rule of the first error."""
    first = errors[0]
    loc = tuple(first["loc"])
    siblings = [e for e in errors if tuple(e["loc"])[:-1] == loc[:-1]]
    if loc and _member_tag(loc[-1]) and len(siblings) > 1:
        # A parameter value failed every member of str | number | bool: say that once.
        message = "Input should be a string, number or boolean"
        if any(e["type"] in _RANGE_ERRORS for e in siblings):
            message = f"Input should be a number; an integer must lie in {INT64_MIN}..{UINT64_MAX}"
        return loc[:-1], message, "parameter_value_type"
    return loc, str(first["msg"]), str(first["type"])
