"""A pydantic validation error in the caller's words: the field path, the message, the rule.

One formatter for both APIs (the /v2 inference document and the /v1 batch header): the path as
the caller wrote it (``dispatches[2].bindings.A.offset``), and a parameter value that matched no
member of its ``str | number | bool`` union reported once, at the parameter, rather than once
per member with pydantic's internal member tags in the path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.integers import INT64_MIN, UINT64_MAX

Location = tuple[int | str, ...]
Model = TypeVar("Model", bound=BaseModel)

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


def refusal(errors: Sequence[ErrorDetails], what: str, document: object = None) -> InvalidRequest:
    """The 400 for a document the wire model refused: ``what: <field path>: <message>``.

    Inside a v2 request's ``inputs``/``outputs`` the tensor is named too (``input 'A': ...``),
    since a position means little to a caller who wrote names."""
    loc, message, rule = first_error(errors)
    field = field_path(loc, "body")
    owner = ""
    if len(loc) >= 2 and loc[0] in ("inputs", "outputs") and isinstance(loc[1], int):
        items = document.get(loc[0]) if isinstance(document, dict) else None
        item = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = item.get("name") if isinstance(item, dict) else None
        if isinstance(name, str):
            owner = f"{str(loc[0])[:-1]} '{name[:100]}': "
    where = f"{field}: " if loc else ""
    return InvalidRequest(f"{what}: {owner}{where}{message}", field=field, rule=rule)


def validate_document(model: type[Model], document: object, what: str) -> Model:
    """``document`` (parsed by ``jsondata.parse_json``) as ``model``; pydantic's first complaint
    becomes a 400 naming the field."""
    try:
        return model.model_validate(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
    raise refusal(errors, what, document)
