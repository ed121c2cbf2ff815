"""A pydantic validation error in the caller's words: the field path, the message, the rule.

One formatter for both APIs (the /v2 inference document and the /v1 batch header): the path as
the caller wrote it (``dispatches[2].bindings.A.offset``), and a parameter value that matched no
member of its ``str | number | bool`` union reported once, at the parameter, rather than once
per member with pydantic's internal member tags in the path.

pydantic's words say the rule but not what was received, nor what was probably meant; the message
adds both: ``inputs[0].datatype: Input should be 'BOOL', ... (got 'UINT9'; did you mean
'UINT8'?)``, and for a key the model does not have, its fields and the closest one
(``paramters: Extra inputs are not permitted (got an object; allowed fields: id, parameters,
inputs, outputs; did you mean 'parameters'?)``). The value is described in bounded words: a long
string is cut, a container is named by its size, a huge integer by its number of digits.

These are the words a request's descriptors and parameter values are refused in whatever its
protocol: ``descriptors`` says them again for a request that is not this document (gRPC's), from
the same table of rules. A shape of too many dimensions is said in that table's words
(``descriptors.RANK_WORDS``), not pydantic's, which name its internals.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence
from typing import Annotated, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from tensorbits_protocol.descriptors import ANY_VALUE, RANK_RULE, RANK_WORDS, described
from tensorbits_protocol.errors import InvalidRequest
from tensorbits_protocol.operators import did_you_mean

Location = tuple[int | str, ...]
Model = TypeVar("Model", bound=BaseModel)

# The tags pydantic adds to a location for each member of a union of scalars.
_MEMBER_TAGS = frozenset({"bool", "int", "float", "str", "constrained-int"})
_RANGE_ERRORS = frozenset({"less_than_equal", "greater_than_equal"})
# Errors whose input is not the field's value: a missing field's is the object that lacks it.
_NO_VALUE_ERRORS = frozenset({"missing"})
# The choices pydantic lists in a literal or enum error's ``expected``: 'BOOL', 'UINT8' or ...
_QUOTED = re.compile(r"'([^']*)'")


def field_path(loc: Location, default: str) -> str:
    """``("dispatches", 2, "bindings", "A")`` as ``dispatches[2].bindings.A``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or default


def _member_tag(part: int | str) -> bool:
    return isinstance(part, str) and (part in _MEMBER_TAGS or part.startswith("function-"))


def _unwrapped(annotation: object) -> tuple[object, ...]:
    """The types an annotation may hold: ``Annotated`` stripped, a union split into members."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _unwrapped(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return tuple(t for arg in get_args(annotation) for t in _unwrapped(arg))
    return (annotation,)


def _step(annotation: object, part: int | str) -> object | None:
    """The annotation one location step inside ``annotation``: a model's field, a list's item,
    a dict's value; None when the step cannot be followed (the suggestion is then left out)."""
    for member in _unwrapped(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            if isinstance(part, str) and part in member.model_fields:
                return member.model_fields[part].annotation
            continue
        origin, args = get_origin(member), tuple[object, ...](get_args(member))
        if isinstance(part, int) and origin in (list, tuple, Sequence) and args:
            return args[0]
        if isinstance(part, str) and origin in (dict, Mapping) and len(args) == 2:
            return args[1]
    return None


def _field_names(model: type[BaseModel] | None, loc: Location) -> tuple[str, ...]:
    """The field names of the object at ``loc`` (a location inside ``model``), by alias."""
    annotation: object | None = model
    for part in loc:
        annotation = _step(annotation, part)
        if annotation is None:
            return ()
    for member in _unwrapped(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return tuple(field.alias or name for name, field in member.model_fields.items())
    return ()


def _received(error: ErrorDetails, loc: Location, model: type[BaseModel] | None) -> str:
    """What was received and, when a close match exists, what was probably meant."""
    kind = error["type"]
    if kind in _NO_VALUE_ERRORS:
        return ""
    value = error.get("input")
    words = f"got {described(value)}"
    if kind == "extra_forbidden" and loc and isinstance(loc[-1], str):
        fields = _field_names(model, loc[:-1])
        if fields:
            words += f"; allowed fields: {', '.join(fields)}{did_you_mean(loc[-1], fields)}"
    elif isinstance(value, str):
        expected = (error.get("ctx") or {}).get("expected")
        if isinstance(expected, str):  # a literal or enum: the choices are quoted in it
            words += did_you_mean(value, _QUOTED.findall(expected))
    return f" ({words})"


def _misspelt(errors: Sequence[ErrorDetails]) -> ErrorDetails | None:
    """The unknown key that is a required key misspelt: an ``extra_forbidden`` beside a
    ``missing`` field (the same object) that it is close to. ``{"input": [...]}`` is one mistake,
    which pydantic reports as two, the missing ``inputs`` first; the unknown key is the one that
    says what was meant."""
    missing = [tuple(e["loc"]) for e in errors if e["type"] == "missing"]
    for error in errors:
        loc = tuple(error["loc"])
        if error["type"] != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
            continue
        required = [str(m[-1]) for m in missing if m and m[:-1] == loc[:-1]]
        if did_you_mean(loc[-1], required):
            return error
    return None


def first_error(
    errors: Sequence[ErrorDetails], model: type[BaseModel] | None = None
) -> tuple[Location, str, str]:
    """The location, message and rule of the first error (a misspelt required key's before the
    required key it leaves missing). ``model``, the one validated, lets an unknown key be
    answered with the fields of the object it was found in."""
    first = _misspelt(errors) or errors[0]
    loc = tuple(first["loc"])
    siblings = [e for e in errors if tuple(e["loc"])[:-1] == loc[:-1]]
    if loc and _member_tag(loc[-1]) and len(siblings) > 1:
        # A parameter value failed every member of str | number | bool: say that once.
        message = "Input should be a string, number or boolean"
        if any(e["type"] in _RANGE_ERRORS for e in siblings):
            message = (
                "Input should be a number; an integer must lie in "
                f"{ANY_VALUE.low}..{ANY_VALUE.high}"
            )
        return loc[:-1], f"{message} (got {described(first.get('input'))})", "parameter_value_type"
    return loc, f"{first['msg']}{_received(first, loc, model)}", str(first["type"])


def at_field(
    errors: Sequence[ErrorDetails], model: type[BaseModel], default: str
) -> InvalidRequest:
    """The 400 for a document ``model`` refused, anchored at its field path: ``<path>:
    <message>`` (``default`` for the document itself), as the /v1 batch header and the files
    read by its schema say it."""
    loc, message, rule = first_error(errors, model)
    path = field_path(loc, default)
    return InvalidRequest(f"{path}: {message}", field=path, rule=rule)


def refusal(
    errors: Sequence[ErrorDetails],
    what: str,
    document: object = None,
    model: type[BaseModel] | None = None,
) -> InvalidRequest:
    """The 400 for a document the wire model refused: ``what: <field path>: <message>``.

    Inside a v2 request's ``inputs``/``outputs`` the tensor is named too (``input 'A': ...``),
    since a position means little to a caller who wrote names."""
    loc, message, rule = first_error(errors, model)
    field = field_path(loc, "body")
    if rule == "too_long" and loc and loc[-1] == "shape":
        # The shape's bound in the words the gRPC wire walk gives it (descriptors.RANK_WORDS):
        # pydantic's name its internals ("... items after validation").
        return InvalidRequest(f"{what}: {field} {RANK_WORDS}", field=field, rule=RANK_RULE)
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
    raise refusal(errors, what, document, model)
